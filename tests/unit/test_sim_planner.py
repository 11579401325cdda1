"""The planner in the simulator: what the runner would feed it, read from simulated router and engines; a
load step scales the pool up ahead of its target, prefill goes to zero when nothing needs it and comes back
when long prompts arrive, and every decision is kept with its figures."""

from __future__ import annotations

import pytest

from inferencepool.autoscaler.planner import PREFILL_BACK, PREFILL_TO_ZERO, PlannerSettings, RoleBounds
from inferencepool.perf.profiles import get_profile
from inferencepool.sim.cluster import PlannerScaling, Scenario, simulate
from inferencepool.sim.workload import TraceRequest

H100 = get_profile("llama-3.1-8b-h100")


def planned(prefill_min: int, load: float = 20.0, itl: float = 0.04) -> PlannerScaling:
    return PlannerScaling(
        PlannerSettings(
            ttft_target_seconds=0.8,
            itl_target_seconds=itl,
            prefill=RoleBounds(prefill_min, 4),
            decode=RoleBounds(1, 4),
            model_load_seconds=load,
            interval_seconds=5,
            scale_down_delay_seconds=10,
            warmup_seconds=10,
            recent_seconds=20,
            trend_seconds=30,
            burst_memory_seconds=30,
        ),
        window_seconds=10,
    )


def test_a_load_step_scales_decode_up_and_back_down() -> None:
    quiet = [TraceRequest(i * 1.0, 500, 50) for i in range(30)]
    busy = [TraceRequest(30 + i * 0.02, 1500, 300) for i in range(1500)]
    after = [TraceRequest(70 + i * 2.0, 500, 20) for i in range(60)]
    scenario = Scenario("plan", "LengthAware", 1, 1, 4096, planner=planned(1))
    result = simulate(scenario, H100, quiet + busy + after)
    assert all(r.completed and r.finishes == 1 for r in result.records)
    ups = [e for e in result.scaling if e.role == "decode" and e.replicas > e.from_replicas]
    downs = [e for e in result.scaling if e.role == "decode" and e.replicas < e.from_replicas]
    assert ups and 30 <= ups[0].time <= 45  # within the first intervals of the step
    assert downs and downs[-1].time > ups[-1].time
    assert all(e.from_replicas - e.replicas == 1 for e in downs)  # one step at a time
    assert result.plans and "engine-s/s" in result.plans[-1].decode.message
    first = next(p for p in result.plans if p.now == ups[0].time)
    assert first.decode.forecast > first.decode.capacity_per_replica  # sized from demand, not latency


def test_prefill_goes_to_zero_and_comes_back_for_long_prompts() -> None:
    short = [TraceRequest(i * 0.5, 600, 30) for i in range(120)]
    long = [TraceRequest(60 + i * 0.25, 12000, 10) for i in range(240)]
    # at a 12 ms ITL target a decode pod has little room for prefill work: long prompts make the pool pay
    scenario = Scenario("plan", "LengthAware", 1, 2, 4096, planner=planned(0, itl=0.012))
    result = simulate(scenario, H100, short + long)
    assert all(r.completed and r.finishes == 1 for r in result.records)
    prefill = [e for e in result.scaling if e.role == "prefill"]
    assert prefill[0].reason == PREFILL_TO_ZERO and prefill[0].replicas == 0
    back = next(e for e in prefill if e.reason == PREFILL_BACK)
    assert back.time > 60
    # while the prefill pool was gone, long prompts fell back to the decode pods; once back they disaggregate
    routes = {r.route for r in result.records[120:]}
    assert {"fallback", "disaggregated"} <= routes
    assert result.records[-1].route == "disaggregated"


def test_a_pool_starts_without_prefill_only_where_the_planner_may_take_it_to_zero() -> None:
    with pytest.raises(ValueError, match="needs at least one prefill replica"):
        Scenario("zero", "LengthAware", 0, 1, planner=planned(1))
    assert Scenario("zero", "LengthAware", 0, 1, planner=planned(0)).prefill_replicas == 0


def test_the_planner_holds_the_decode_requests_tpot_read_from_vllm_s_histogram() -> None:
    """The simulated decode engines observe each finished request's mean time per output token into
    vllm:request_time_per_output_token_seconds; the planner's decode signal is that histogram's p90 over
    the window, in the bucket of the exact p90 of the requests that finished in it."""
    from dataclasses import replace

    from inferencepool.engine_sim.metrics import TPOT_BUCKETS
    from inferencepool.router.threshold import percentile

    scaling = planned(1)
    fixed = replace(scaling.settings, prefill=RoleBounds(1, 1), decode=RoleBounds(1, 1))
    trace = [TraceRequest(i * 0.1, 600 + 37 * (i % 9), 40 + 13 * (i % 7)) for i in range(600)]
    scenario = Scenario("plan", "LengthAware", 1, 1, 4096, planner=replace(scaling, settings=fixed))
    result = simulate(scenario, H100, trace)
    first = next(i for i, plan in enumerate(result.plans) if plan.decode.signal == "TPOT")
    assert first <= 1  # from the second scrape of the engines on
    assert all(plan.decode.signal == "TPOT" for plan in result.plans[first:])
    held = [plan for plan in result.plans[first:] if plan.decode.observed_seconds is not None]
    assert len(held) >= 8
    bounds = (0.0, *TPOT_BUCKETS, float("inf"))
    for plan in held[2:]:
        finished = [
            r.mean_itl
            for r in result.records
            if r.finish is not None and plan.now - 10 < r.finish <= plan.now
        ]
        exact = percentile(finished, 90)
        upper = next(i for i, b in enumerate(bounds) if b >= exact)
        assert bounds[upper - 1] <= plan.decode.observed_seconds <= bounds[upper]  # type: ignore[operator]
        assert "TPOT (requests' mean ITL)" in plan.decode.message
