"""A long prompt the router sends direct because the prefill pool is busy (reason prefill_busy) is prefill
demand for the autoscaler: the router counts its prompt tokens by decision reason, and the feed moves them
from the direct route (decode demand) to the prefill pool's demand."""

from __future__ import annotations

import asyncio

import aiohttp
from tests.http.router_harness import complete, metric_sum
from tests.http.test_router_prefix_routing import (
    DECISIONS,
    ROUTE,
    keep_the_prefill_pod_busy,
    slow_prefill_router,
    words,
)
from tests.unit.test_autoscaler_runner_feed import reading

from inferencepool.autoscaler.feed import Deltas, RouterReading, RouterSample, observation, read_router
from inferencepool.autoscaler.histogram import parse_page
from inferencepool.router.metrics import ARRIVAL_WINDOW_SECONDS

TOKENS = "inferencepool_router_disaggregation_decision_prompt_tokens"
ROUTED = "inferencepool_router_routed_prompt_tokens"


async def router_sample(url: str) -> RouterSample:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        sample, _ = read_router(parse_page(await response.text()))
    assert sample is not None
    return sample


async def test_a_prompt_bypassing_a_busy_prefill_pool_counts_as_prefill_demand() -> None:
    async with slow_prefill_router() as (router, _, _):
        deltas: Deltas[RouterSample] = Deltas()
        deltas.step({"r": await router_sample(router.url)})
        bulk = await keep_the_prefill_pod_busy(router)
        try:
            _, _, headers = await complete(router.url, words("probe", 300))
            assert headers[ROUTE] == "direct"
        finally:
            status, _, _ = await bulk
        assert status == 200
        assert await metric_sum(router.url, DECISIONS, reason="prefill_busy") == 1
        probe = await metric_sum(router.url, ROUTED, route="direct")
        assert probe > 0 and await metric_sum(router.url, TOKENS, reason="prefill_busy") == probe
        long = await metric_sum(router.url, TOKENS, reason="long")
        assert long == await metric_sum(router.url, ROUTED, route="disaggregated")
        await asyncio.sleep(ARRIVAL_WINDOW_SECONDS)  # the arrival windows the prompts came in have ended
        sample = await router_sample(router.url)
        change = deltas.step({"r": sample})
    assert change is not None and change.bypassed is not None
    assert change.bypassed.values == (1, 0, probe, 0)  # (prefill_busy, prefill_saturated) prompts, tokens
    # both prompts are the prefill pool's demand in its arrival windows too; none direct
    assert sample.windows is not None and (sample.windows[0].sum, sample.windows[1].sum) == (long + probe, 0)
    assert change.burst_tokens is not None and change.burst_tokens[0] is not None
    assert max(long, probe) <= change.burst_tokens[0] <= long + probe
    obs = observation(0.0, 10.0, reading(None), reading(None), RouterReading(change, None), 10_000)
    assert obs.direct is not None and (obs.direct.prompts, obs.direct.prompt_tokens) == (0, 0)
    assert obs.to_prefill is not None and obs.to_prefill.prompts == 2  # the bulk prompt and the probe
    assert obs.bypassed is not None and (obs.bypassed.prompts, obs.bypassed.prompt_tokens) == (1, probe)
