"""A request is served whenever a decode pod could serve it: a failure before its first token reaches the
client is retried colocated (counted as a fallback with its reason), whatever broke the KV hand-off."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from tests.http.router_harness import (
    LONG_PROMPT,
    complete,
    config_for,
    engine_requests,
    engines,
    metric_sum,
    running_router,
)
from tests.support.engines import RunningEngine

from inferencepool.engine_sim.server import FakeEngine


@contextlib.asynccontextmanager
async def prefill_front(
    prefill: RunningEngine, after_answer: Callable[[], Awaitable[None]]
) -> AsyncIterator[str]:
    """A pod address in front of a prefill engine: forwards each prefill leg and, once the engine answered
    the first one, runs `after_answer` (kill or restart the engine) before the router gets the answer, so
    the decode engine finds the KV's source gone when it goes to read it."""
    done = False

    async def forward(request: web.Request) -> web.Response:
        nonlocal done
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                prefill.url + request.path,
                data=await request.read(),
                headers={"Content-Type": "application/json"},
            ) as answer,
        ):
            status, payload = answer.status, await answer.read()
        if not done:
            done = True
            await after_answer()
        return web.Response(status=status, body=payload, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{path:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("stream", [False, True])
async def test_prefill_pod_dying_after_its_answer_is_served_colocated(stream: bool) -> None:
    """Streaming, the decode engine's error event comes before any token; not streaming, it answers 500.
    Either way nothing reached the client, so a decode pod serves the request by itself."""
    async with (
        engines(["prefill", "decode"]) as (prefill, decode),
        prefill_front(prefill, prefill.engine.stop) as front,
    ):
        config = config_for([], [decode], policy="AlwaysDisaggregate")
        config = config.model_copy(
            update={"static": config.static.model_copy(update={"prefill": [front]})}  # type: ignore[union-attr]
        )
        async with running_router(config) as router:
            status, body, headers = await complete(router.url, LONG_PROMPT, stream=stream, max_tokens=8)
            assert status == 200, body
            assert headers["X-Inferencepool-Route"] == "fallback"
            if stream:
                assert '"error"' not in body and body.rstrip().endswith("data: [DONE]")
            reason = "decode_leg_failed"
            assert await metric_sum(router.url, "inferencepool_router_fallbacks", reason=reason) == 1
            assert await metric_sum(router.url, "inferencepool_router_requests", route="fallback") == 1
            assert await metric_sum(router.url, "inferencepool_router_requests") == 1
            # The decode engine failed the first try (the KV was gone) and served the second.
            assert await metric_sum(decode.url, "vllm:request_success", finished_reason="error") == 1
            assert await engine_requests(decode) == 2
            pods = router.router.pods.pods.values()
            assert all(pod.outstanding == 0 for pod in pods)


async def test_prefill_pod_restarted_with_a_new_nixl_engine_id_mid_hand_off() -> None:
    """vLLM's fleet failure: a prefill pod restarts (a new NIXL engine id on the same address) while a decode
    engine still has a request naming the old one. That request is retried colocated; the next ones go
    through the new engine (the decode engine reads from whatever engine id the prefill leg names)."""
    async with engines(["prefill", "decode"]) as (prefill, decode):
        old = prefill.engine
        restarted: list[FakeEngine] = []

        async def restart() -> None:
            await old.stop()
            assert old.port is not None and old.side_channel_port is not None
            config = dataclasses.replace(
                old.config,
                port=old.port,
                side_channel_port=old.side_channel_port,
                engine_id=f"{old.config.engine_id}-restarted",
            )
            engine = FakeEngine(config)
            await engine.start()
            restarted.append(engine)

        try:
            async with prefill_front(prefill, restart) as front:
                config = config_for([], [decode], policy="AlwaysDisaggregate")
                config = config.model_copy(
                    update={"static": config.static.model_copy(update={"prefill": [front]})}  # type: ignore[union-attr]
                )
                async with running_router(config) as router:
                    status, body, headers = await complete(router.url, LONG_PROMPT, stream=True)
                    assert status == 200 and headers["X-Inferencepool-Route"] == "fallback", body
                    assert '"error"' not in body
                    for _ in range(3):
                        status, body, headers = await complete(router.url, LONG_PROMPT + "again", stream=True)
                        assert status == 200 and headers["X-Inferencepool-Route"] == "disaggregated", body
                    reason = "decode_leg_failed"
                    assert await metric_sum(router.url, "inferencepool_router_fallbacks", reason=reason) == 1
                    assert await engine_requests(RunningEngine(restarted[0])) == 3
        finally:
            for engine in restarted:
                await engine.stop()
