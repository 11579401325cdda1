"""Routing on uncached tokens and both pools' load, and prefix affinity on the longest shared prefix, through
the real router and fake engines (what the engines served is read from their own vLLM metrics)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from tests.http.router_harness import (
    RunningRouter,
    complete,
    config_for,
    engine_requests,
    engines,
    metric_sum,
    running_router,
)
from tests.support.engines import RunningEngine

ROUTE = "X-Inferencepool-Route"
DECISIONS = "inferencepool_router_disaggregation_decisions"
# Small blocks keep prompts short: 32 tokens (128 characters for the router's estimate) a block, and a
# shared prefix counts from 4 blocks (512 characters) on.
AFFINITY = {"blockTokens": 32, "sharedPrefixBlocks": 4}


def words(tag: str, count: int) -> str:
    return " ".join(f"{tag}{i % 97}" for i in range(count))


async def served_by(decodes: Sequence[RunningEngine]) -> list[float]:
    return [await engine_requests(engine) for engine in decodes]


async def one_request(url: str, prompt: str, decodes: Sequence[RunningEngine]) -> tuple[str, int]:
    """The route the request took and the index of the decode engine that served it."""
    before = await served_by(decodes)
    status, body, headers = await complete(url, prompt)
    assert status == 200, body
    after = await served_by(decodes)
    (index,) = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a > b]
    return headers[ROUTE], index


async def test_a_long_prompt_whose_prefix_the_decode_pod_holds_goes_direct() -> None:
    document = words("doc", 400)  # ~2000 characters: ~500 tokens, the first 15 blocks cached after turn one
    async with engines(["prefill", "decode"]) as (prefill, decode):
        config = config_for([prefill], [decode], prefillThresholdTokens=200, prefixAffinity=AFFINITY)
        async with running_router(config) as router:
            _, _, headers = await complete(router.url, document + " first question?")
            assert headers[ROUTE] == "disaggregated"
            hits_before = await metric_sum(decode.url, "vllm:prefix_cache_hits")
            _, _, headers = await complete(router.url, document + " and a second question, please?")
            assert headers[ROUTE] == "direct"
            # The decode engine found the prompt's KV (it received it with the first turn's transfer).
            assert await metric_sum(decode.url, "vllm:prefix_cache_hits") > hits_before
            _, _, headers = await complete(router.url, words("other", 400))
            assert headers[ROUTE] == "disaggregated"  # an unrelated long prompt is not cached
            assert await engine_requests(prefill) == 2
            assert await metric_sum(router.url, DECISIONS, reason="cached") == 1
            assert await metric_sum(router.url, DECISIONS, reason="long") == 2


@contextlib.asynccontextmanager
async def slow_prefill_router() -> AsyncIterator[tuple[RunningRouter, RunningEngine, RunningEngine]]:
    """A slow prefill engine (the CPU demo's timing model) and an idle decode engine behind a router whose
    threshold sends 300-word prompts to prefill; one such prompt alone (~80 ms of prefill) has taught the
    router the prefill pod's speed."""
    async with (
        engines(["prefill"], profile="cpu-demo") as (prefill,),
        engines(["decode"]) as (decode,),
    ):
        config = config_for(
            [prefill],
            [decode],
            prefillThresholdTokens=100,
            prefixAffinity=AFFINITY,
            adaptiveThreshold={"ttftTargetMilliseconds": 400},
        )
        async with running_router(config) as router:
            _, _, headers = await complete(router.url, words("alone", 300))
            assert headers[ROUTE] == "disaggregated"
            yield router, prefill, decode


async def keep_the_prefill_pod_busy(router: RunningRouter) -> asyncio.Task[tuple[int, str, dict[str, str]]]:
    """A prompt ten times longer sent in the background (the prefill pod is busy for ~0.8 s); returns once the
    router has it queued on the prefill pod. The caller awaits the task."""
    prefill_pod = router.router.pods.by_role("prefill")[0]
    bulk = asyncio.create_task(complete(router.url, words("bulk", 3000)))
    for _ in range(200):
        if prefill_pod.queued_tokens:
            break
        await asyncio.sleep(0.002)
    return bulk


async def test_a_busy_prefill_pool_sends_a_long_prompt_direct() -> None:
    """A long prompt that would wait past the TTFT target in the busy prefill pool is prefilled on the decode
    pod, and the next one, once the prefill pool is free again, goes through it."""
    async with slow_prefill_router() as (router, _, decode):
        bulk = await keep_the_prefill_pod_busy(router)
        try:
            decode_before = await engine_requests(decode)
            _, _, headers = await complete(router.url, words("probe", 300))
            assert headers[ROUTE] == "direct"
            assert await engine_requests(decode) == decode_before + 1
        finally:
            status, _, headers = await bulk
        assert status == 200 and headers[ROUTE] == "disaggregated"
        assert await metric_sum(router.url, DECISIONS, reason="prefill_busy") == 1
        _, _, headers = await complete(router.url, words("after", 300))
        assert headers[ROUTE] == "disaggregated"
        assert await metric_sum(router.url, DECISIONS, reason="long") == 3


@contextlib.asynccontextmanager
async def four_decodes_two_routers() -> AsyncIterator[
    tuple[list[RunningEngine], RunningRouter, RunningRouter]
]:
    async with engines(["decode"] * 4) as decodes:
        config = config_for([], decodes, policy="Colocated", prefixAffinity=AFFINITY)
        async with running_router(config) as first, running_router(config) as second:
            yield decodes, first, second


async def test_two_router_replicas_choose_the_same_decode_pod_for_a_prefix() -> None:
    async with four_decodes_two_routers() as (decodes, first, second):
        prefixes = [words(f"conversation{c}x", 120) for c in range(8)]  # ~700 characters: 5 blocks
        on_first = [(await one_request(first.url, p + " turn one", decodes))[1] for p in prefixes]
        # the other replica gets the second turns in the other order (so no rotation or history helps)
        on_second = [
            (await one_request(second.url, p + " turn two, another replica", decodes))[1]
            for p in reversed(prefixes)
        ]
        assert on_first == on_second[::-1]
        assert len(set(on_first)) > 1  # and the prefixes did not all land on one pod


async def test_a_shared_system_prompt_spreads_and_a_long_shared_prefix_stays_together() -> None:
    system = words("system", 30)  # ~250 characters: under 2 blocks
    document = words("document", 150)  # ~1300 characters: 10 blocks
    async with four_decodes_two_routers() as (decodes, router, _):
        spread = {
            (await one_request(router.url, f"{system} user {n} asks: {words(f'u{n}x', 60)}", decodes))[1]
            for n in range(16)
        }
        assert len(spread) >= 3, spread
        together = {
            (await one_request(router.url, f"{document} question {n}: {words(f'v{n}x', 20)}", decodes))[1]
            for n in range(16)
        }
        assert len(together) == 1, together
        assert await metric_sum(router.url, DECISIONS, reason="policy") == 32


async def test_the_router_reads_each_engines_load_in_the_background() -> None:
    """The engines' own running and waiting counts reach the endpoint table (what the load bound and the
    route costs weigh besides the router's own requests), and drop back when the engine is idle."""
    async with engines(["decode"], profile="cpu-demo") as (decode,):
        config = config_for([], [decode], policy="Colocated", engineMetricsIntervalMilliseconds=50)
        async with running_router(config) as router:
            pod = router.router.pods.by_role("decode")[0]
            answer = asyncio.create_task(
                complete(router.url, words("stream", 50), stream=True, max_tokens=400)
            )
            try:
                for _ in range(400):
                    if pod.engine_running == 1:
                        break
                    await asyncio.sleep(0.01)
                assert (pod.engine_running, pod.load) == (1, 1)
            finally:
                status, _, _ = await answer
            assert status == 200
            for _ in range(400):
                if pod.engine_running == 0:
                    break
                await asyncio.sleep(0.01)
            assert pod.load == 0
