"""When every pool is saturated (its engines queueing), the router holds a bounded queue and answers the rest
429 with Retry-After, shedding the lowest priority (X-Inferencepool-Priority) first; counted by priority."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable

import aiohttp
from tests.http.router_harness import MODEL, config_for, metric_sum, running_router
from tests.support.engines import running_engine

from inferencepool.perf.profiles import get_profile


async def eventually(check: Callable[[], bool | Awaitable[bool]], seconds: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        held = check()
        if not isinstance(held, bool):
            held = await held
        if held:
            return
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def post(
    http: aiohttp.ClientSession, url: str, max_tokens: int, priority: str | None = None
) -> tuple[int, str, dict[str, str]]:
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": max_tokens, "stream": True}
    headers = {} if priority is None else {"X-Inferencepool-Priority": priority}
    async with http.post(url + "/v1/completions", json=body, headers=headers) as response:
        return response.status, await response.text(), dict(response.headers)


async def test_saturated_pools_shed_with_429_lowest_priority_first_and_admit_once_there_is_room() -> None:
    profile = dataclasses.replace(get_profile("cpu-demo"), max_num_seqs=2)  # a third request waits
    async with running_engine(profile, MODEL, time_scale=10.0) as decode:
        config = config_for(
            [],
            [decode],
            policy="Colocated",
            engineMetricsIntervalMilliseconds=100,
            overload={
                "enabled": True,
                "queueRequests": 1,
                "queueMilliseconds": 60_000,
                "retryAfterSeconds": 3,
            },
        )
        async with running_router(config) as router, aiohttp.ClientSession() as http:
            admission = router.router.admission
            assert admission is not None
            # long streams: two run, the rest wait inside the engine
            load = [asyncio.create_task(post(http, router.url, 2000)) for _ in range(4)]
            await eventually(lambda: admission.saturated)
            low = asyncio.create_task(post(http, router.url, 4, "0"))
            await eventually(lambda: admission.queued == 1)
            status, body, headers = await post(http, router.url, 4)  # priority 0 by default: queue full
            assert status == 429, body
            assert headers["Retry-After"] == "3"
            error = json.loads(body)["error"]
            assert error["type"] == "RateLimitError" and error["code"] == 429
            high = asyncio.create_task(post(http, router.url, 4, "5"))
            status, body, _ = await asyncio.wait_for(low, 30)  # shed for the higher priority
            assert status == 429, body
            assert admission.queued == 1 and not high.done()
            assert await metric_sum(router.url, "inferencepool_router_shed_requests", priority="0") == 2
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
