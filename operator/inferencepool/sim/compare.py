"""The standard comparison: the same trace and GPU budget through colocated, static P/D, LengthAware with a
fixed and with an adaptive threshold, and LengthAware P/D with per-pool autoscaling (its GPU time varies)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferencepool.api.v1alpha1 import Autoscaling, LatencyTarget
from inferencepool.engine_sim.profiles import EngineProfile
from inferencepool.router.config import AdaptiveThresholdConfig
from inferencepool.sim.cluster import PoolAutoscaling, Progress, Scenario, ScenarioResult, simulate
from inferencepool.sim.report import Slo, Summary, summarize, with_ratios
from inferencepool.sim.workload import TraceRequest

BASELINE = "colocated"
SCENARIO_NAMES = ("colocated", "static-pd", "length-aware", "adaptive", "autoscaled")


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

    def __post_init__(self) -> None:
        if self.replicas < 2:
            raise ValueError("the P/D scenarios need at least 2 replicas (one per pool)")
        if not 1 <= self.prefill_replicas < self.replicas:
            raise ValueError(
                f"prefill replicas must be within 1..{self.replicas - 1}, got {self.prefill_replicas}"
            )


def build_scenarios(budget: Budget, slo: Slo, names: Sequence[str] = SCENARIO_NAMES) -> list[Scenario]:
    unknown = [n for n in names if n not in SCENARIO_NAMES]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIO_NAMES)}")
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
    every = {
        "colocated": Scenario("colocated", "Colocated", 0, budget.replicas),
        "static-pd": Scenario("static-pd", "AlwaysDisaggregate", prefill, decode),
        "length-aware": Scenario("length-aware", "LengthAware", prefill, decode, threshold),
        "adaptive": Scenario("adaptive", "LengthAware", prefill, decode, threshold, adaptive=adaptive),
        "autoscaled": Scenario(
            "autoscaled", "LengthAware", prefill, decode, threshold, autoscaling=autoscaling
        ),
    }
    return [every[name] for name in names]


def compare(
    scenarios: Sequence[Scenario],
    profile: EngineProfile,
    trace: Sequence[TraceRequest],
    slo: Slo,
    *,
    progress: Progress | None = None,
    progress_every: float = 60.0,
) -> tuple[list[ScenarioResult], list[Summary]]:
    """Run every scenario on the same trace; summaries carry ratios against the colocated one when present."""
    results = [
        simulate(scenario, profile, trace, progress=progress, progress_every=progress_every)
        for scenario in scenarios
    ]
    return results, with_ratios([summarize(r, slo) for r in results], BASELINE)
