"""When a pool has no free slot (its engines run all they can), the router holds a bounded queue per pool and
answers the rest 429 with Retry-After, shedding the lowest priority (X-Inferencepool-Priority) first; counted
by pool and priority. A saturated prefill pool sheds what would go through it while direct requests to a
decode pool with room are served. Verdicts are queue counts and statuses, never times."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json

import aiohttp
from tests.http.router_harness import (
    LONG_PROMPT,
    MODEL,
    SHORT_PROMPT,
    config_for,
    engines,
    eventually,
    metric_sum,
    running_router,
)
from tests.support.engines import running_engine

from inferencepool.perf.profiles import get_profile


async def post(
    http: aiohttp.ClientSession,
    url: str,
    max_tokens: int,
    priority: str | None = None,
    prompt: str = SHORT_PROMPT,
) -> tuple[int, str, dict[str, str]]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    headers = {} if priority is None else {"X-Inferencepool-Priority": priority}
    async with http.post(url + "/v1/completions", json=body, headers=headers) as response:
        return response.status, await response.text(), dict(response.headers)


async def test_a_full_pool_sheds_with_429_lowest_priority_first_and_admits_once_there_is_room() -> None:
    profile = dataclasses.replace(get_profile("cpu-demo"), max_num_seqs=2)  # a third request waits
    async with running_engine(profile, MODEL, time_scale=10.0) as decode:
        config = config_for(
            [],
            [decode],
            policy="Colocated",
            engineMetricsIntervalMilliseconds=100,
            overload={
                "enabled": True,
                "maxQueuedRequests": 1,
                "maxQueueMilliseconds": 60_000,
                "retryAfterSeconds": 3,
            },
        )
        async with running_router(config) as router, aiohttp.ClientSession() as http:
            admission = router.router.admission
            assert admission is not None
            pool = admission.pool("decode")
            # long streams, let in before the pool's capacity is known: two run, the rest wait in the engine
            load = [asyncio.create_task(post(http, router.url, 2000)) for _ in range(4)]
            await eventually(lambda: pool.slots() == 2 and pool.held == 4)  # learned off the scrape
            low = asyncio.create_task(post(http, router.url, 4, "0"))
            await eventually(lambda: pool.queued == 1)
            status, body, headers = await post(http, router.url, 4)  # priority 0 by default: queue full
            assert status == 429, body
            assert headers["Retry-After"] == "3"
            assert headers["Content-Type"].startswith("application/json")
            error = json.loads(body)["error"]
            assert error["type"] == "RateLimitError" and error["code"] == 429
            assert "decode pool" in error["message"]
            high = asyncio.create_task(post(http, router.url, 4, "5"))
            status, body, _ = await asyncio.wait_for(low, 30)  # shed for the higher priority
            assert status == 429, body
            assert pool.queued == 1 and not high.done()
            shed = await metric_sum(
                router.url, "inferencepool_router_shed_requests", role="decode", priority="0"
            )
            assert shed == 2
            status, body, _ = await post(http, router.url, 4, "high")
            assert status == 400 and "X-Inferencepool-Priority".lower() in body.lower()
            for task in load:  # the clients go away: the engine frees their slots
                task.cancel()
            for task in load:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            status, body, _ = await asyncio.wait_for(high, 60)
            assert status == 200 and "[DONE]" in body
            assert await metric_sum(router.url, "inferencepool_router_shed_requests", priority="5") == 0


async def test_a_saturated_prefill_pool_sheds_what_goes_through_it_while_direct_requests_are_served() -> None:
    """One prefill engine that prefills one prompt at a time, slowly; a decode engine with room. Long prompts
    go through the prefill pool and queue for it, then are shed; short ones go straight to decode."""
    slow = dataclasses.replace(get_profile("cpu-demo"), max_num_seqs=1)
    async with (
        engines(["prefill"], slow, time_scale=2000.0) as (prefill,),
        engines(["decode"], "zero") as (decode,),
    ):
        config = config_for(
            [prefill],
            [decode],
            policy="LengthAware",
            prefillThresholdTokens=64,
            engineMetricsIntervalMilliseconds=100,
            # a target no queue misses: the scheduler never moves a long prompt off the prefill pool
            adaptiveThreshold={"ttftTargetMilliseconds": 600_000},
            overload={"enabled": True, "maxQueuedRequests": 1, "maxQueueMilliseconds": 60_000},
        )
        async with running_router(config) as router, aiohttp.ClientSession() as http:
            admission = router.router.admission
            assert admission is not None
            prefill_pool, decode_pool = admission.pool("prefill"), admission.pool("decode")
            long = (f"request {n}: {LONG_PROMPT}" for n in range(5))  # no shared prefix: none is cached
            load = [asyncio.create_task(post(http, router.url, 4, prompt=next(long))) for _ in range(3)]
            await eventually(lambda: prefill_pool.slots() == 1 and prefill_pool.held == 3)
            queued = asyncio.create_task(post(http, router.url, 4, prompt=next(long)))
            await eventually(lambda: prefill_pool.queued == 1)
            status, body, headers = await post(http, router.url, 4, prompt=next(long))
            assert status == 429, body
            assert "prefill pool" in json.loads(body)["error"]["message"] and "Retry-After" in headers
            for _ in range(6):  # the decode pool has room: direct requests pass the queued one
                status, body, _ = await asyncio.wait_for(post(http, router.url, 4), 30)
                assert status == 200 and "[DONE]" in body
            assert prefill_pool.queued == 1 and not queued.done()
            # each disaggregated request holds a decode slot from its admission (the shed one gave its back)
            assert decode_pool.queued == 0 and decode_pool.held == 4
            url = router.url
            assert await metric_sum(url, "inferencepool_router_shed_requests", role="prefill") == 1
            assert await metric_sum(url, "inferencepool_router_shed_requests", role="decode") == 0
            assert await metric_sum(url, "inferencepool_router_queued_requests", role="prefill") == 1
            assert await metric_sum(url, "inferencepool_router_pool_slots", role="prefill") == 1
            # the shed prompt is still demand of the route it would have taken, for the autoscaler's feed
            shed = "inferencepool_router_shed_demand_requests"
            assert await metric_sum(url, shed, route="disaggregated") == 1
            assert await metric_sum(url, shed, route="direct") == 0
            shed_tokens = "inferencepool_router_shed_demand_prompt_tokens"
            assert await metric_sum(url, shed_tokens, route="disaggregated") > 64
            for task in (*load, queued):
                task.cancel()
            for task in (*load, queued):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
