"""Role lending through the real router and fake engines: a request is served whole on the prefill pod
(route `lent`, reason `decode_saturated`) when the decode pod queues requests (the router reads it off the
engine's /metrics) and the prefill pod has room; not while the decode pod has room, and not with lending
off. The lent request reaches the prefill engine without kv_transfer_params, which vLLM serves colocated
whatever the engine's kv_role (tests/http/test_engine_roles.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from tests.http.router_harness import (
    MODEL,
    complete,
    config_for,
    engine_requests,
    metric_sum,
    running_router,
)
from tests.http.test_router_prefix_routing import DECISIONS, ROUTE, words
from tests.support.engines import RunningEngine, running_engine

from inferencepool.perf.profiles import get_profile

# one sequence at a time: a second request waits in the engine (vllm:num_requests_waiting 1)
ONE_AT_A_TIME = get_profile("cpu-demo").with_overrides(max_num_seqs=1)


@contextlib.asynccontextmanager
async def pool(lending: bool) -> AsyncIterator[tuple[str, RunningEngine, RunningEngine]]:
    async with (
        running_engine("zero", MODEL, nixl=True, role="prefill") as prefill,
        running_engine(ONE_AT_A_TIME, MODEL, nixl=True, role="decode") as decode,
    ):
        config = config_for(
            [prefill], [decode], prefillThresholdTokens=100, roleLending=lending,
            engineMetricsIntervalMilliseconds=20,
        )  # fmt: skip
        async with running_router(config) as router:
            yield router.url, prefill, decode


async def hog(engine: RunningEngine, tag: str) -> None:
    """A long generation straight to the engine (not through the router), cancelled by the caller."""
    body = {"model": MODEL, "prompt": words(tag, 20), "max_tokens": 5000, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine.url}/v1/completions", json=body) as r,
    ):
        async for _ in r.content:
            pass


@contextlib.asynccontextmanager
async def saturated(url: str, decode: RunningEngine) -> AsyncIterator[None]:
    """Two long generations on the one-sequence decode engine, so one waits; returns once the router has
    read the waiting request off the engine's /metrics."""
    hogs = [asyncio.create_task(hog(decode, tag)) for tag in ("hog-a", "hog-b")]
    try:
        for _ in range(500):
            if await metric_sum(decode.url, "vllm:num_requests_waiting") >= 1:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # a few of the router's reads
        yield
    finally:
        for task in hogs:
            task.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)


async def test_a_request_is_lent_to_the_prefill_pod_while_the_decode_pod_queues() -> None:
    async with pool(lending=True) as (url, prefill, decode):
        async with saturated(url, decode):
            served_before = await engine_requests(prefill)
            for prompt in (words("long", 300), words("short", 10)):  # over and under the threshold
                status, body, headers = await complete(url, prompt, max_tokens=8)
                assert status == 200, body
                assert headers[ROUTE] == "lent"
            assert await engine_requests(prefill) == served_before + 2  # served whole there
            assert await metric_sum(url, DECISIONS, reason="decode_saturated") == 2
            assert await metric_sum(url, "inferencepool_router_requests", route="lent") == 2
        # the decode pod has room again: the ordinary routes
        for _ in range(200):
            if await metric_sum(decode.url, "vllm:num_requests_waiting") == 0:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        _, _, headers = await complete(url, words("after", 300), max_tokens=8)
        assert headers[ROUTE] == "disaggregated"
        _, _, headers = await complete(url, words("tiny", 10), max_tokens=8)
        assert headers[ROUTE] == "direct"
        assert await metric_sum(url, DECISIONS, reason="decode_saturated") == 2


async def test_nothing_is_lent_with_lending_off() -> None:
    async with pool(lending=False) as (url, prefill, decode):
        before = await engine_requests(prefill)
        async with saturated(url, decode):
            # its decode leg waits behind the decode engine's queue: look at the decision meanwhile
            request = asyncio.create_task(complete(url, words("long", 300), max_tokens=1))
            for _ in range(500):
                if await metric_sum(url, DECISIONS, reason="long") >= 1:
                    break
                await asyncio.sleep(0.01)
            assert await metric_sum(url, DECISIONS, reason="long") == 1
            assert await metric_sum(url, DECISIONS, reason="decode_saturated") == 0
        status, _, headers = await request
        assert status == 200 and headers[ROUTE] == "disaggregated"
        assert await engine_requests(prefill) == before + 1  # its prefill leg only
