"""Role lending through the real router and fake engines, both ways.

A request is served whole on the prefill pod (route `lent`, reason `decode_saturated`) when the decode pod
queues requests (the router reads it off the engine's /metrics) and the prefill pod has room; not while the
decode pod has room, and not with lending off. The lent request reaches the prefill engine without
kv_transfer_params, which vLLM serves colocated whatever the engine's kv_role.

A long prompt is prefilled on an idle decode pod for the busy one its prefix is cached on (route
`disaggregated`, reason `prefill_saturated`) when the prefill pod queues; not while the prefill pod has room,
not when no other decode pod is idle, and not with lending off. The peer gets the prefill leg a prefill pod
would (`do_remote_decode`), which vLLM serves on a kv_consumer as on a producer (tests/http/
test_engine_roles.py)."""

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
    eventually,
    metric_sum,
    running_router,
)
from tests.http.test_router_prefix_routing import AFFINITY, DECISIONS, ROUTE, one_request, words
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


async def reached(url: str, name: str, count: float, **labels: str) -> None:
    """Wait until the sum of `name` on `url`'s /metrics is `count` or more."""

    async def held() -> bool:
        return await metric_sum(url, name, **labels) >= count

    await eventually(held, what=f"{name} {labels} stayed under {count}")


async def decided(url: str, reason: str, count: int) -> None:
    """Wait until the router has made `count` decisions for `reason`, and no more."""
    await reached(url, DECISIONS, count, reason=reason)
    assert await metric_sum(url, DECISIONS, reason=reason) == count


@contextlib.asynccontextmanager
async def saturated(url: str, decode: RunningEngine) -> AsyncIterator[None]:
    """Two long generations on the one-sequence decode engine, so one waits; returns once the router has
    read the waiting request off the engine's /metrics."""
    hogs = [asyncio.create_task(hog(decode, tag)) for tag in ("hog-a", "hog-b")]
    try:
        await reached(decode.url, "vllm:num_requests_waiting", 1)
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
            await decided(url, "long", 1)
            assert await metric_sum(url, DECISIONS, reason="decode_saturated") == 0
        status, _, headers = await request
        assert status == 200 and headers[ROUTE] == "disaggregated"
        assert await engine_requests(prefill) == before + 1  # its prefill leg only


@contextlib.asynccontextmanager
async def peer_pool(lending: bool) -> AsyncIterator[tuple[str, RunningEngine, tuple[RunningEngine, ...]]]:
    """A one-sequence prefill engine (two hogs make one wait) and two decode engines."""
    async with (
        running_engine(ONE_AT_A_TIME, MODEL, nixl=True, role="prefill") as prefill,
        running_engine("cpu-demo", MODEL, nixl=True, role="decode") as d0,
        running_engine("cpu-demo", MODEL, nixl=True, role="decode") as d1,
    ):
        config = config_for(
            [prefill], [d0, d1], prefillThresholdTokens=100, roleLending=lending, prefixAffinity=AFFINITY,
            engineMetricsIntervalMilliseconds=20, adaptiveThreshold={"ttftTargetMilliseconds": 5000},
        )  # fmt: skip
        async with running_router(config) as router:
            yield router.url, prefill, (d0, d1)


@contextlib.asynccontextmanager
async def running(engine: RunningEngine) -> AsyncIterator[None]:
    """A long generation on the engine, running; returns once the router has read it off its /metrics."""
    task = asyncio.create_task(hog(engine, "busy"))
    try:
        await reached(engine.url, "vllm:num_requests_running", 1)
        await asyncio.sleep(0.2)
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


DOC = words("doc", 200)  # ~300 tokens: 9 of AFFINITY's 32-token blocks, so a repeat goes to its decode pod


async def finished(engine: RunningEngine) -> float:
    """Requests the engine finished at their length (the router's legs; a cancelled hog is an abort)."""
    return await metric_sum(engine.url, "vllm:request_success", finished_reason="length")


async def test_an_idle_decode_pod_prefills_for_a_busy_one_while_the_prefill_pod_queues() -> None:
    async with peer_pool(lending=True) as (url, prefill, decodes):
        route, index = await one_request(url, DOC + words("q1", 200), decodes)
        assert route == "disaggregated"
        busy, peer = decodes[index], decodes[1 - index]  # the prompt's prefix is cached on `busy`
        async with running(busy):
            # the prefill pod has room: the ordinary route
            _, _, headers = await complete(url, DOC + words("q2", 200), max_tokens=8)
            assert headers[ROUTE] == "disaggregated"
            assert await metric_sum(url, DECISIONS, reason="long") == 2
            async with saturated(url, prefill):
                before = [await finished(e) for e in (prefill, busy, peer)]
                hits = await metric_sum(busy.url, "vllm:external_prefix_cache_hits")
                status, body, headers = await complete(url, DOC + words("q3", 200), max_tokens=8)
                assert status == 200, body
                assert headers[ROUTE] == "disaggregated"
                assert await metric_sum(url, DECISIONS, reason="prefill_saturated") == 1
                # the peer ran the prefill leg, the busy pod loaded its KV and decoded; the prefill pod: none
                after = [await finished(e) for e in (prefill, busy, peer)]
                assert [a - b for a, b in zip(after, before, strict=True)] == [0, 1, 1]
                assert await metric_sum(busy.url, "vllm:external_prefix_cache_hits") > hits
                # no idle decode pod left: it waits for the prefill pod (look at the decision meanwhile)
                async with running(peer):
                    request = asyncio.create_task(complete(url, DOC + words("q4", 200), max_tokens=8))
                    await decided(url, "long", 3)
                    assert await metric_sum(url, DECISIONS, reason="prefill_saturated") == 1
            status, _, headers = await request
            assert status == 200 and headers[ROUTE] == "disaggregated"


async def test_no_decode_pod_prefills_for_another_with_lending_off() -> None:
    async with peer_pool(lending=False) as (url, prefill, decodes):
        _, index = await one_request(url, DOC + words("q1", 200), decodes)
        async with running(decodes[index]), saturated(url, prefill):
            request = asyncio.create_task(complete(url, DOC + words("q2", 200), max_tokens=8))
            await decided(url, "long", 2)
            assert await metric_sum(url, DECISIONS, reason="prefill_saturated") == 0
        status, _, headers = await request
        assert status == 200 and headers[ROUTE] == "disaggregated"
