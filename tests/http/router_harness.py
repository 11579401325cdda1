"""Run the router and fake engines inside a test's event loop, on loopback with ephemeral ports."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from tests.support.engines import RunningEngine, running_engine

from inferencepool.router.config import RouterConfig
from inferencepool.router.discovery import static_pods
from inferencepool.router.server import Router, serve
from inferencepool.router.tokens import EstimateCounter, TokenCounter

MODEL = "fake-model"
SHORT_PROMPT = "hello there"  # a handful of tokens
LONG_PROMPT = "the pool keeps shared prefixes warm " * 60  # ~500 tokens however it is counted


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], seconds: float = 30.0, what: str = "condition not reached"
) -> None:
    """Poll `check()` (a plain or an async predicate) until it holds; fail with `what` after `seconds`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        held = check()
        if not isinstance(held, bool):
            held = await held
        if held:
            return
        assert loop.time() < deadline, what
        await asyncio.sleep(0.02)


@dataclass
class RunningRouter:
    router: Router
    url: str


@contextlib.asynccontextmanager
async def running_router(
    config: RouterConfig, counter: TokenCounter | None = None
) -> AsyncIterator[RunningRouter]:
    """The real `serve()` (drain included) in a task; stopped like SIGTERM does when the block ends."""
    router = Router(config, counter or EstimateCounter())
    if config.static is not None:
        router.pods.apply(static_pods(config.static))
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(serve(router, "127.0.0.1", 0, on_listening=bound.set_result, stop=stop))
    try:
        port = await asyncio.wait_for(asyncio.shield(bound), 10)
        yield RunningRouter(router, f"http://127.0.0.1:{port}")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@contextlib.asynccontextmanager
async def engines(
    roles: Sequence[str], profile: str = "zero", **overrides: Any
) -> AsyncIterator[list[RunningEngine]]:
    """Fake engines with the NIXL connector on, one per role given."""
    async with contextlib.AsyncExitStack() as stack:
        started = [
            await stack.enter_async_context(running_engine(profile, MODEL, nixl=True, role=role, **overrides))
            for role in roles
        ]
        yield started


def config_for(
    prefill: Sequence[RunningEngine], decode: Sequence[RunningEngine], **fields: Any
) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "static": {"prefill": [e.url for e in prefill], "decode": [e.url for e in decode]},
            "servedModelName": MODEL,
            **fields,
        }
    )


def with_addresses(
    config: RouterConfig, *, prefill: Sequence[str] | None = None, decode: Sequence[str] | None = None
) -> RouterConfig:
    """`config` with the static prefill or decode addresses replaced (a front in place of an engine)."""
    assert config.static is not None
    update = {
        role: list(urls) for role, urls in (("prefill", prefill), ("decode", decode)) if urls is not None
    }
    return config.model_copy(update={"static": config.static.model_copy(update=update)})


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` on a loopback ephemeral port; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def front(
    target: str,
    after_first_answer: Callable[[], Awaitable[None]],
    timeout: aiohttp.ClientTimeout | None = None,
) -> AsyncIterator[str]:
    """A pod address in front of an engine at `target`: forwards each request and, once the engine answered
    the first one, runs `after_first_answer` (kill, restart or drain the engine) before the router gets that
    answer, so the decode engine finds the KV's source changed when it goes to read it."""
    done = False

    async def forward(request: web.Request) -> web.Response:
        nonlocal done
        async with (
            aiohttp.ClientSession(timeout=timeout or aiohttp.ClientTimeout(total=300)) as http,
            http.post(
                target + request.path,
                data=await request.read(),
                headers={"Content-Type": "application/json"},
            ) as answer,
        ):
            status, payload = answer.status, await answer.read()
        if not done:
            done = True
            await after_first_answer()
        return web.Response(status=status, body=payload, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{path:.*}", forward)
    async with serving(app) as url:
        yield url


@contextlib.asynccontextmanager
async def unanswering_first(target: str, received: asyncio.Event) -> AsyncIterator[str]:
    """A pod address in front of an engine at `target` whose first request is accepted but never handed to
    the engine (an API server that had not submitted it when the client went away: `received` is set then);
    later requests go to the engine, whole (not streamed)."""
    first = True
    done = asyncio.Event()

    async def forward(request: web.Request) -> web.StreamResponse:
        nonlocal first
        payload = await request.read()
        if first:
            first = False
            received.set()
            await done.wait()  # never answered (aiohttp does not cancel a handler whose client left)
            return web.Response(status=503)
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http,
            http.post(target + request.path, data=payload, headers={"Content-Type": "application/json"}) as r,
        ):
            return web.Response(status=r.status, body=await r.read(), content_type="application/json")

    app = web.Application()
    app.router.add_post("/{path:.*}", forward)
    async with serving(app) as url:
        try:
            yield url
        finally:
            done.set()  # before the server's cleanup, which waits for its handlers


async def metric_sum(url: str, name: str, **labels: str) -> float:
    """Sum of the samples named `name` (or `name`_total) on a /metrics page, filtered by labels."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        text = await response.text()
    wanted = (name, f"{name}_total")
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in wanted and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def engine_requests(engine: RunningEngine) -> float:
    """Requests an engine finished, as it reports them (vllm:request_success)."""
    return await metric_sum(engine.url, "vllm:request_success")


async def complete(
    url: str, prompt: str = SHORT_PROMPT, *, stream: bool = False, max_tokens: int = 4, **extra: Any
) -> tuple[int, str, dict[str, str]]:
    """POST /v1/completions; returns status, body text and response headers."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, **extra}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/completions", json=body) as response,
    ):
        return response.status, await response.text(), dict(response.headers)
