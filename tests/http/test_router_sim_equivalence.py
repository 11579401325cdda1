"""The live router and the simulator decide alike: the same request sequence, through the real router over
HTTP to fake engines and through the simulator's virtual-time pool, takes the same route for the same reason
to the same pods, request by request. Both drive `inferencepool.scheduling.Scheduler`; what this holds is
everything around it (prompt hashing, token counting, the prefix index, queue accounting, the decode leg's
pod).

Requests go one at a time (each answered before the next), so no decision depends on how fast this machine
runs: the load-aware bypass only acts on queued work, and there is none. The router's scrape of engine load
is off (the simulator's router has only its own in-flight counts, `sim/router.py`)."""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp
from tests.http.router_harness import MODEL, config_for, engine_requests, engines, metric_sum, running_router
from tests.support.engines import RunningEngine

from inferencepool.perf.profiles import get_profile
from inferencepool.router.pods import PodSpec
from inferencepool.scheduling.decider import RouteReason
from inferencepool.sim.cluster import Scenario, simulate
from inferencepool.sim.workload import TraceRequest, prompt_ids

ROUTE = "X-Inferencepool-Route"
DECISIONS = "inferencepool_router_disaggregation_decisions"
OUTPUT_TOKENS = 3
# (prompt tokens, Mooncake block ids: 512 tokens each). Conversations A and B come back with longer prompts
# (their earlier turns cached on one decode pod), and a few unrelated prompts, long and short, come between.
REQUESTS: tuple[tuple[int, tuple[int, ...]], ...] = (
    (1024, (1, 2)),  # A: long, nothing cached -> prefill pool
    (1536, (1, 2, 3)),  # A again: 1024 cached on its decode pod -> direct
    (300, (7,)),  # short
    (1536, (4, 5, 6)),  # B: long
    (2048, (4, 5, 6, 8)),  # B again: cached
    (40, (9,)),  # under one prefix block: no keys, the least loaded pod
    (2000, (1, 2, 3, 10)),  # A a third time
    (1100, (11, 12, 13)),  # unrelated, just over the threshold
    (900, (1, 14)),  # shares A's first block only: below the threshold anyway
    (1500, (15, 16, 17)),
    (60, (18,)),
    (2048, (15, 16, 17, 19)),
)
CONFIG = {
    "policy": "LengthAware",
    "prefillThresholdTokens": 1024,
    "prefixAffinity": {"blockTokens": 64, "sharedPrefixBlocks": 4},
    "engineMetricsIntervalMilliseconds": 0,
}


def trace() -> list[TraceRequest]:
    return [
        TraceRequest(10.0 * i, tokens, OUTPUT_TOKENS, blocks) for i, (tokens, blocks) in enumerate(REQUESTS)
    ]


async def served_by(pods: Sequence[RunningEngine]) -> list[float]:
    return [await engine_requests(engine) for engine in pods]


def which(before: list[float], after: list[float], names: Sequence[str]) -> str | None:
    moved = [name for name, b, a in zip(names, before, after, strict=True) if a > b]
    assert len(moved) <= 1, moved
    return moved[0] if moved else None


async def reasons(url: str) -> dict[str, float]:
    return {reason.value: await metric_sum(url, DECISIONS, reason=reason.value) for reason in RouteReason}


async def test_the_router_and_the_simulator_take_the_same_decisions_request_by_request() -> None:
    requests = trace()
    async with engines(["prefill", "decode", "decode", "decode"]) as (prefill, *decodes):
        config = config_for([prefill], decodes, **CONFIG)
        # the simulator's pod names, so that rendezvous ranks the pods alike
        names = {"prefill": ["prefill-0"], "decode": [f"decode-{i}" for i in range(len(decodes))]}
        live: list[tuple[str, str, str | None, str | None]] = []
        async with running_router(config) as router, aiohttp.ClientSession() as session:
            router.router.pods.apply(
                [PodSpec("prefill-0", prefill.url, "prefill")]
                + [
                    PodSpec(name, engine.url, "decode")
                    for name, engine in zip(names["decode"], decodes, strict=True)
                ]
            )
            for number, request in enumerate(requests):
                ids = list(prompt_ids(request, number))
                before = (await served_by([prefill]), await served_by(decodes), await reasons(router.url))
                body = {"model": MODEL, "prompt": ids, "max_tokens": OUTPUT_TOKENS}
                async with session.post(router.url + "/v1/completions", json=body) as response:
                    assert response.status == 200, await response.text()
                    route = response.headers[ROUTE]
                    await response.read()
                after = (await served_by([prefill]), await served_by(decodes), await reasons(router.url))
                (reason,) = [r for r in after[2] if after[2][r] > before[2][r]]
                live.append(
                    (
                        route,
                        reason,
                        which(before[0], after[0], names["prefill"]),
                        which(before[1], after[1], names["decode"]),
                    )
                )

    scenario = Scenario(
        "same",
        "LengthAware",
        1,
        3,
        threshold_tokens=1024,
        router=config,
    )
    result = simulate(scenario, get_profile("llama-3.1-8b-h100"), requests)
    simulated = [(r.route, r.reason, r.prefill_pod, r.decode_pod) for r in result.records]
    assert simulated == live
    # the sequence exercises what it is meant to: both routes, a prefix kept, a keyless prompt
    assert {reason for _, reason, _, _ in live} >= {"long", "cached", "short"}
    assert len({decode for *_, decode in live}) > 1
