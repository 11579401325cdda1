"""The standard comparison: the pool spec as deployed (`deployed`, with `--pool`: `sim/pool.py`) beside what a
user would run instead, on the same trace and GPU budget: `colocated` (vLLM's defaults behind a load
balancer), `colocated-tuned` (the chunk for the ITL target and the router's prefix-aware pod choice),
`static-pd` (always disaggregate, at its best P:D split) and `static-peak` (the smallest static layout that
holds the targets in every window, `search.static_sizes`).

More on request: `planner` (a LengthAware P/D pool from the budget's split, sized by the SLA planner) and
`static-min`. Every scenario routes through the live router's
scheduling core (`inferencepool.scheduling`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from inferencepool.autoscaler.planner import PlannerSettings, RoleBounds
from inferencepool.perf.profiles import EngineProfile
from inferencepool.sim.cluster import (
    PlannerScaling,
    Progress,
    Scenario,
    ScenarioResult,
    simulate,
)
from inferencepool.sim.report import Slo, Summary, summarize, with_ratios
from inferencepool.sim.workload import TraceRequest

BASELINE = "colocated"
DEPLOYED = "deployed"  # the pool spec given with --pool (`sim/pool.py`)
SCENARIO_NAMES = ("colocated", "colocated-tuned", "static-pd", "static-peak")
EXTRA_SCENARIOS = ("planner", "static-min")
SEARCHED = ("static-peak", "static-min")


@dataclass(frozen=True)
class Budget:
    replicas: int  # engines in every static scenario (GPUs = replicas x tensor parallel)
    prefill_replicas: int  # of those, the prefill pool of the P/D scenarios (also where autoscaling starts)
    threshold_tokens: int = 4096
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
    known = (*SCENARIO_NAMES, *EXTRA_SCENARIOS, DEPLOYED)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    names = [n for n in names if n not in (*SEARCHED, DEPLOYED)]  # built by the search, and from the spec
    prefill, decode = budget.prefill_replicas, budget.replicas - budget.prefill_replicas
    ceiling = budget.max_replicas_per_pool or budget.replicas
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
        # what a user runs without this project: vLLM's defaults behind a load balancer (no prefix affinity)
        "colocated": Scenario("colocated", "Colocated", 0, budget.replicas, prefix_affinity=False),
        # ... given the same care: the chunk for the ITL target and the router's prefix-aware pod choice
        "colocated-tuned": Scenario(
            "colocated-tuned",
            "Colocated",
            0,
            budget.replicas,
            decode_chunk_tokens=budget.decode_chunk_tokens,
            chunk_itl_seconds=slo.itl_seconds,
        ),
        # always disaggregate; `inferencepool sim` tries every P:D split of the budget and keeps the best
        "static-pd": tuned(Scenario("static-pd", "AlwaysDisaggregate", prefill, decode)),
        # the SLA planner on a LengthAware P/D pool starting from the budget's split
        "planner": tuned(Scenario("planner", "LengthAware", prefill, decode, threshold, planner=planner)),
    }
    # the router's load-aware bypass weighs routes against the pool's targets, as the operator configures it
    every = {
        name: replace(scenario, ttft_target_seconds=slo.ttft_seconds, itl_target_seconds=slo.itl_seconds)
        for name, scenario in every.items()
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
