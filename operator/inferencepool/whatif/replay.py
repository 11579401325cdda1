"""What-if on the pool's own traffic: its sketch replayed through the simulator (the same code as
`inferencepool sim`) as colocated, as deployed, and with each candidate threshold (or, for a colocated pool,
disaggregated as advised), on the pool's engines.

The sketch comes from what the router and the engines export today: the arrival rate (router requests), the
prompt-length histogram (router), the mean output length (decode engines' generation tokens per request) and
the prefix-reuse rate (the engines' prefix-cache hit rate). Prompt and output lengths are drawn independently
(the router exports no joint histogram yet); arrivals are Poisson; prompts that reuse share leading 512-token
blocks with one of a few documents, so the simulated engines' prefix caches see that reuse. Every draw comes
from one seeded generator: the same window gives the same table.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, replace
from typing import Final

from inferencepool.api.v1alpha1 import InferencePool, RoutingPolicy
from inferencepool.autoscaler.histogram import Histogram
from inferencepool.bottleneck.core import Diagnosis, WhatIfRow
from inferencepool.bottleneck.settings import PoolSettings
from inferencepool.perf.profiles import EngineProfile
from inferencepool.sim.cluster import Scenario, simulate
from inferencepool.sim.pool import deployed_scenario
from inferencepool.sim.report import Slo, summarize
from inferencepool.sim.workload import MOONCAKE_BLOCK_TOKENS, TraceRequest

SEED: Final = 13
SHARED_DOCUMENTS: Final = 4  # distinct shared prefixes the reused part of prompts is drawn from
DEFAULT_SECONDS: Final = 120.0
DEFAULT_MAX_REQUESTS: Final = 1200


@dataclass(frozen=True)
class TrafficSketch:
    rate: float  # requests per second
    prompt: Histogram  # prompt tokens (router)
    mean_output_tokens: float
    reuse: float  # share of prompt tokens found in a prefix cache


def sketch(diagnosis: Diagnosis) -> TrafficSketch | None:
    """The traffic sketch of a diagnosed window; None without a prompt histogram or output lengths."""
    t = diagnosis.traffic
    if t.prompt is None or t.prompt.count <= 0 or not t.mean_output_tokens or t.rate <= 0:
        return None
    reuse = t.reuse_rate if t.reuse_rate is not None else (t.prefix_hit_rate or 0.0)
    return TrafficSketch(t.rate, t.prompt, t.mean_output_tokens, min(reuse, 0.95))


def _draw_prompt(prompt: Histogram, rng: random.Random) -> int:
    rank = rng.random() * prompt.count
    lower, previous = 0.0, 0.0
    for bound, cumulative in zip(prompt.bounds, prompt.counts, strict=True):
        upper = bound if not math.isinf(bound) else max(2 * lower, 1.0)
        if cumulative > rank and cumulative > previous:
            return max(1, round(lower + (upper - lower) * rng.random()))
        lower, previous = upper, cumulative
    return max(1, round(lower))


def synthetic_trace(
    traffic: TrafficSketch,
    *,
    seconds: float = DEFAULT_SECONDS,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    max_model_len: int = 32768,
    seed: int = SEED,
) -> list[TraceRequest]:
    """Requests drawn from the sketch: Poisson arrivals over `seconds` (fewer seconds when that would exceed
    `max_requests`), prompts from the histogram, exponential output lengths around the mean."""
    rng = random.Random(seed)
    span = min(seconds, max_requests / traffic.rate)
    requests: list[TraceRequest] = []
    at = 0.0
    unique = itertools.count(1 << 24)  # block ids no document uses
    while len(requests) < max_requests:
        at += rng.expovariate(traffic.rate)
        if at > span:
            break
        output = max(1, round(rng.expovariate(1 / traffic.mean_output_tokens)))
        output = min(output, max_model_len // 2)
        prompt = min(_draw_prompt(traffic.prompt, rng), max_model_len - output)
        blocks: tuple[int, ...] = ()
        if traffic.reuse > 0:
            count = math.ceil(prompt / MOONCAKE_BLOCK_TOKENS)
            shared = min(count, int(traffic.reuse * prompt / MOONCAKE_BLOCK_TOKENS + rng.random()))
            document = rng.randrange(SHARED_DOCUMENTS)
            blocks = tuple((document + 1) * 100_000 + i if i < shared else next(unique) for i in range(count))
        requests.append(TraceRequest(at, prompt, output, blocks))
    if not requests:
        requests.append(TraceRequest(0.0, _draw_prompt(traffic.prompt, rng), 1))
    return requests


def _with_threshold(scenario: Scenario, name: str, threshold: int) -> Scenario:
    """The same pool with a fixed threshold (the adaptive threshold off)."""
    router = scenario.router_config()
    fixed = router.adaptive_threshold.model_copy(update={"enabled": False})
    return replace(
        scenario,
        name=name,
        policy="LengthAware",
        threshold_tokens=threshold,
        adaptive=None,
        router=router.model_copy(
            update={
                "policy": "LengthAware",
                "prefill_threshold_tokens": threshold,
                "adaptive_threshold": fixed,
            }
        ),
    )


def scenarios(
    settings: PoolSettings, diagnosis: Diagnosis, pool: InferencePool | None = None
) -> list[tuple[str, Scenario]]:
    """Colocated on every engine; as deployed; each threshold candidate (or the advised disaggregation), on
    the same engines. With the pool's spec, "as deployed" is the simulator's `deployed` scenario (the spec as
    the operator maps it: router, engine flags, LMCache) on the engines found, its autoscaling off."""
    engines = (
        settings.prefill_replicas + settings.decode_replicas
        if settings.disaggregated
        else settings.decode_replicas
    )
    rows: list[tuple[str, Scenario]] = [("colocated", Scenario("colocated", "Colocated", 0, engines))]
    if engines < 2:
        return rows
    if settings.disaggregated:
        prefill = settings.prefill_replicas
        policy: RoutingPolicy = (
            "AlwaysDisaggregate" if settings.policy == "AlwaysDisaggregate" else "LengthAware"
        )
        current = (
            deployed_scenario(
                pool,
                name="current",
                replicas={"prefill": prefill, "decode": engines - prefill},
                autoscale=False,
            )
            if pool is not None
            else Scenario("current", policy, prefill, engines - prefill, settings.threshold_tokens)
        )
        rows.append(("current", current))
        threshold = diagnosis.advice_of("Threshold")
        for candidate in threshold.candidates if threshold is not None else ():
            rows.append(("threshold", _with_threshold(current, f"threshold {candidate}", candidate)))
        return rows
    disaggregate = diagnosis.advice_of("Disaggregate")
    if disaggregate is not None and disaggregate.threshold_tokens is not None:
        prefill = min(engines - 1, max(1, disaggregate.replicas or 1))
        scenario = Scenario(
            "disaggregated", "LengthAware", prefill, engines - prefill, disaggregate.threshold_tokens
        )
        rows.append(("disaggregated", scenario))
    return rows


def what_if(
    diagnosis: Diagnosis,
    settings: PoolSettings,
    profile: EngineProfile,
    *,
    seconds: float = DEFAULT_SECONDS,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    pool: InferencePool | None = None,
) -> list[WhatIfRow]:
    """The table; empty when the window holds no sketch (no prompt histogram, no output lengths)."""
    traffic = sketch(diagnosis)
    if traffic is None:
        return []
    trace = synthetic_trace(
        traffic, seconds=seconds, max_requests=max_requests, max_model_len=profile.max_model_len
    )
    slo = Slo(settings.ttft_target_ms / 1000, settings.itl_target_ms / 1000)
    table = []
    for name, scenario in scenarios(settings, diagnosis, pool):
        summary = summarize(simulate(scenario, profile, trace), slo)
        table.append(
            WhatIfRow(
                scenario=name,
                policy=scenario.policy,
                prefill_replicas=scenario.prefill_replicas,
                decode_replicas=scenario.decode_replicas,
                threshold_tokens=scenario.threshold_tokens if scenario.policy == "LengthAware" else None,
                goodput_rps=summary.goodput_rps,
                slo_attainment_percent=summary.slo_attainment_percent,
                ttft_p90_ms=summary.ttft_ms.get("p90"),
                itl_p90_ms=summary.itl_ms.get("p90"),
                disaggregated_percent=summary.disaggregated_percent,
            )
        )
    return table
