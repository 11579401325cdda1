"""A client that goes away between the legs of a disaggregated request leaves no KV held on the prefill
pod until its lease ends: the router sends the decode leg anyway (one token, its answer dropped), so the
decode engine reads the KV now (vLLM frees a prefill's blocks once read, else at kv_lease_duration)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from tests.http.router_harness import LONG_PROMPT, MODEL, config_for, engines, metric_sum, running_router
from tests.support.engines import RunningEngine

LEASE_S = 120.0  # far longer than the test waits: a KV freed only by the lease fails it


@contextlib.asynccontextmanager
async def unanswering_first(decode: RunningEngine, received: asyncio.Event) -> AsyncIterator[str]:
    """A decode pod address whose first request is accepted but never handed to the engine (an API server
    that had not submitted it when the client went away); later requests go to the engine."""
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
            aiohttp.ClientSession() as http,
            http.post(
                decode.url + request.path, data=payload, headers={"Content-Type": "application/json"}
            ) as r,
        ):
            return web.Response(status=r.status, body=await r.read(), content_type="application/json")

    app = web.Application()
    app.router.add_post("/{path:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        done.set()
        await runner.cleanup()


async def kv_usage(engine: RunningEngine) -> float:
    return await metric_sum(engine.url, "vllm:kv_cache_usage_perc")


async def test_a_client_gone_between_the_legs_frees_the_prefill_pods_kv_before_the_lease() -> None:
    received = asyncio.Event()
    async with (
        engines(["prefill", "decode"], kv_lease_s=LEASE_S) as (prefill, decode),
        unanswering_first(decode, received) as decode_front,
    ):
        config = config_for([prefill], [], policy="AlwaysDisaggregate")
        config = config.model_copy(
            update={"static": config.static.model_copy(update={"decode": [decode_front]})}  # type: ignore[union-attr]
        )
        async with running_router(config) as router, aiohttp.ClientSession() as http:
            body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 8, "stream": True}
            client = asyncio.create_task(http.post(router.url + "/v1/completions", json=body))
            await asyncio.wait_for(received.wait(), 30)  # the prefill leg answered, the decode leg is out
            assert await kv_usage(prefill) > 0  # the prompt's KV, held for the decode engine
            client.cancel()  # the client goes away
            with contextlib.suppress(asyncio.CancelledError):
                await client
            loop = asyncio.get_running_loop()
            deadline = loop.time() + LEASE_S / 4
            while await kv_usage(prefill) > 0:
                assert loop.time() < deadline, "the prefill pod still holds the KV of a client that went away"
                await asyncio.sleep(0.1)
            assert await metric_sum(router.url, "inferencepool_router_kv_releases", outcome="read") == 1
            assert await metric_sum(prefill.url, "vllm:nixl_num_kv_expired_reqs") == 0
