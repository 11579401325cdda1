"""The standard comparison: the same trace and GPU budget through colocated, static P/D, LengthAware with a
fixed and with an adaptive threshold, and LengthAware P/D with per-pool autoscaling (its GPU time varies).

More scenarios on request: `colocated-tuned` (colocated engines with the decode pods' small prefill chunk,
so the comparison with P/D is fair), `colocated-prefix` (colocated, each request to the pod holding its
longest prefix under the load bound), `cost-aware` (LengthAware on the chosen decode pod's uncached tokens,
with load-aware bypass both ways and longest-prefix pod choice), `planner` (LengthAware P/D sized by the
SLA planner), and the searched static baselines `static-peak` and `static-min` (see `search.static_sizes`).
`autoscaled` is the project's first rule (HPA on latency), kept for comparison."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from inferencepool.api.v1alpha1 import Autoscaling, LatencyTarget
from inferencepool.autoscaler.planner import PlannerSettings, RoleBounds
from inferencepool.engine_sim.profiles import EngineProfile
from inferencepool.router.config import AdaptiveThresholdConfig
from inferencepool.sim.cluster import (
    PlannerScaling,
    PoolAutoscaling,
    Progress,
    Scenario,
    ScenarioResult,
    simulate,
)
from inferencepool.sim.report import Slo, Summary, summarize, with_ratios
from inferencepool.sim.workload import TraceRequest

BASELINE = "colocated"
SCENARIO_NAMES = ("colocated", "static-pd", "length-aware", "adaptive", "autoscaled")
EXTRA_SCENARIOS = (
    "colocated-tuned",
    "colocated-prefix",
    "cost-aware",
    "planner",
    "static-peak",
    "static-min",
)
SEARCHED = ("static-peak", "static-min")


@dataclass(frozen=True)
class Budget:
    replicas: int  # engines in every static scenario (GPUs = replicas x tensor parallel)
    prefill_replicas: int  # of those, the prefill pool of the P/D scenarios (also where autoscaling starts)
    threshold_tokens: int = 4096
    adaptive_min_tokens: int = 1024
    adaptive_max_tokens: int = 16384
    max_replicas_per_pool: int | None = None  # autoscaling bound; defaults to `replicas`
    model_load_seconds: float = 120.0
    interval_seconds: int = 15
    window_seconds: int = 60
    scale_down_stabilization_seconds: int = 300
    percentile: int = 90
    prefill_chunk_tokens: int | None = None  # per-role engine tuning of the P/D scenarios
    decode_chunk_tokens: int | None = None  # ... and of colocated-tuned
    planner_headroom: float | None = None  # None: the planner's own default
    planner_prefill_min: int = 0  # the planner may take the prefill pool to zero
    planner_recent_seconds: float | None = None  # None: the planner's own default
    gpu_budget: int | None = None
    lmcache_cpu_gib: float = 0.0  # LMCache on every engine of every scenario: CPU tier per replica
    lmcache_p2p: bool = False  # ... sharing prefixes between engines

    def __post_init__(self) -> None:
        if self.replicas < 2:
            raise ValueError("the P/D scenarios need at least 2 replicas (one per pool)")
        if not 1 <= self.prefill_replicas < self.replicas:
            raise ValueError(
                f"prefill replicas must be within 1..{self.replicas - 1}, got {self.prefill_replicas}"
            )


def build_scenarios(budget: Budget, slo: Slo, names: Sequence[str] = SCENARIO_NAMES) -> list[Scenario]:
    known = (*SCENARIO_NAMES, *EXTRA_SCENARIOS)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    names = [n for n in names if n not in SEARCHED]  # built by the search (static_layout)
    prefill, decode = budget.prefill_replicas, budget.replicas - budget.prefill_replicas
    ttft_ms, itl_ms = round(slo.ttft_seconds * 1000), round(slo.itl_seconds * 1000)
    adaptive = AdaptiveThresholdConfig(
        enabled=True,
        min_tokens=budget.adaptive_min_tokens,
        max_tokens=budget.adaptive_max_tokens,
        ttft_target_milliseconds=ttft_ms,
        itl_target_milliseconds=itl_ms,
        percentile=budget.percentile,
    )
    ceiling = budget.max_replicas_per_pool or budget.replicas

    def pool(target: LatencyTarget) -> Autoscaling:
        return Autoscaling(
            min_replicas=1,
            max_replicas=ceiling,
            target=target,
            window_seconds=budget.window_seconds,
            interval_seconds=budget.interval_seconds,
            scale_down_stabilization_seconds=budget.scale_down_stabilization_seconds,
        )

    autoscaling = PoolAutoscaling(
        prefill=pool(LatencyTarget(ttft_milliseconds=ttft_ms, percentile=budget.percentile)),
        decode=pool(LatencyTarget(itl_milliseconds=itl_ms, percentile=budget.percentile)),
        model_load_seconds=budget.model_load_seconds,
    )
    threshold = budget.threshold_tokens

    def tuned(scenario: Scenario) -> Scenario:
        """Engines tuned per role: prefill pods as given (the profile's chunk by default), decode pods, which
        also prefill the prompts that go direct, with the chunk that fits the ITL target (`chunk_for_itl`)
        unless one is given."""
        return replace(
            scenario,
            prefill_chunk_tokens=budget.prefill_chunk_tokens,
            decode_chunk_tokens=budget.decode_chunk_tokens,
            chunk_itl_seconds=slo.itl_seconds,
        )

    planner = PlannerScaling(
        PlannerSettings(
            ttft_target_seconds=slo.ttft_seconds,
            itl_target_seconds=slo.itl_seconds,
            prefill=RoleBounds(budget.planner_prefill_min, ceiling),
            decode=RoleBounds(1, ceiling),
            model_load_seconds=budget.model_load_seconds,
            interval_seconds=budget.interval_seconds,
            gpu_budget=budget.gpu_budget,
            # as the operator maps a spec (autoscaler.planner_spec): the stabilization is the evidence a
            # scale-down waits for, after a scale-up and at start
            scale_down_delay_seconds=budget.scale_down_stabilization_seconds,
            warmup_seconds=budget.scale_down_stabilization_seconds,
        ),
        window_seconds=budget.window_seconds,
        percentile=budget.percentile,
    )
    tuned_settings = planner.settings  # the planner's own defaults, unless the budget names a figure
    if budget.planner_headroom is not None:
        tuned_settings = replace(tuned_settings, headroom=budget.planner_headroom)
    if budget.planner_recent_seconds is not None:
        tuned_settings = replace(tuned_settings, recent_seconds=budget.planner_recent_seconds)
    planner = replace(planner, settings=tuned_settings)
    every = {
        "colocated": Scenario("colocated", "Colocated", 0, budget.replicas),
        "colocated-tuned": Scenario(
            "colocated-tuned",
            "Colocated",
            0,
            budget.replicas,
            decode_chunk_tokens=budget.decode_chunk_tokens,
            chunk_itl_seconds=slo.itl_seconds,
        ),
        "static-pd": tuned(Scenario("static-pd", "AlwaysDisaggregate", prefill, decode)),
        "length-aware": tuned(Scenario("length-aware", "LengthAware", prefill, decode, threshold)),
        "adaptive": tuned(Scenario("adaptive", "LengthAware", prefill, decode, threshold, adaptive=adaptive)),
        "autoscaled": tuned(
            Scenario("autoscaled", "LengthAware", prefill, decode, threshold, autoscaling=autoscaling)
        ),
        "planner": tuned(Scenario("planner", "LengthAware", prefill, decode, threshold, planner=planner)),
        "colocated-prefix": Scenario(
            "colocated-prefix",
            "Colocated",
            0,
            budget.replicas,
            decode_chunk_tokens=budget.decode_chunk_tokens,
            chunk_itl_seconds=slo.itl_seconds,
            longest_prefix=True,
        ),
        "cost-aware": tuned(
            Scenario(
                "cost-aware",
                "LengthAware",
                prefill,
                decode,
                threshold,
                cost_aware=True,
                longest_prefix=True,
                cost_ttft_target_seconds=slo.ttft_seconds,
                threshold_from_chunk=True,
            )
        ),
    }
    return [with_lmcache(budget, every[name]) for name in names]


def with_lmcache(budget: Budget, scenario: Scenario) -> Scenario:
    if budget.lmcache_cpu_gib <= 0 and not budget.lmcache_p2p:
        return scenario
    return replace(scenario, lmcache_cpu_gib=budget.lmcache_cpu_gib, lmcache_p2p=budget.lmcache_p2p)


def static_layout(budget: Budget, name: str = "static") -> Callable[[int, int], Scenario]:
    """The static layouts the static-peak search tries: LengthAware P/D at the budget's threshold and engine
    tuning, or a colocated pool (with the decode pods' tuning) when prefill is 0."""

    def layout(prefill: int, decode: int) -> Scenario:
        if prefill == 0:
            return with_lmcache(
                budget,
                Scenario(
                    f"{name} {decode}co",
                    "Colocated",
                    0,
                    decode,
                    decode_chunk_tokens=budget.decode_chunk_tokens,
                ),
            )
        return with_lmcache(
            budget,
            Scenario(
                f"{name} {prefill}P+{decode}D",
                "LengthAware",
                prefill,
                decode,
                budget.threshold_tokens,
                prefill_chunk_tokens=budget.prefill_chunk_tokens,
                decode_chunk_tokens=budget.decode_chunk_tokens,
            ),
        )

    return layout


def compare(
    scenarios: Sequence[Scenario],
    profile: EngineProfile,
    trace: Sequence[TraceRequest],
    slo: Slo,
    *,
    progress: Progress | None = None,
    progress_every: float = 60.0,
    kv_link_bytes_per_s: float | None = None,
) -> tuple[list[ScenarioResult], list[Summary]]:
    """Run every scenario on the same trace; summaries carry ratios against the colocated one when present."""
    results = [
        simulate(
            scenario,
            profile,
            trace,
            progress=progress,
            progress_every=progress_every,
            kv_link_bytes_per_s=kv_link_bytes_per_s,
        )
        for scenario in scenarios
    ]
    return results, with_ratios([summarize(r, slo) for r in results], BASELINE)
