"""The simulator's shortcuts change no result: decode runs (many steps of a steady batch timed at once) and
prompts hashed once per trace give exactly the figures of the engine stepped one step at a time."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from inferencepool.engine_sim.core import EngineCore, EngineRequest, TokenEvent
from inferencepool.engine_sim.kv import chunk_hashes
from inferencepool.perf.profiles import get_profile
from inferencepool.sim.cluster import ClusterSim, ScenarioResult, _prompt_work
from inferencepool.sim.compare import Budget, build_scenarios
from inferencepool.sim.pool import deployed_scenario, load_pool
from inferencepool.sim.report import Slo, summarize
from inferencepool.sim.workload import TraceRequest, load, prompt_ids, shape

H100 = get_profile("llama-3.1-8b-h100")
SLO = Slo(0.8, 0.04)
EXAMPLE = Path(__file__).parents[2] / "examples" / "llama-3.1-8b.yaml"


def seen(result: ScenarioResult) -> list[tuple[object, ...]]:
    return [
        (r.route, r.first_token, r.last_token, r.itl_sum, r.tokens_received, r.prefill_pod, r.decode_pod)
        for r in result.records
    ]


@pytest.mark.parametrize(
    ("trace", "name"),
    [
        ("azure-conv", "colocated"),
        ("azure-conv", "static-pd"),
        ("azure-conv", "colocated-tuned"),
        ("azure-conv", "planner"),
        ("azure-conv", "deployed"),
        ("mooncake-conv", "static-pd"),
        ("mooncake-conv", "colocated-tuned"),
    ],
)
def test_decode_runs_give_the_figures_of_single_steps(trace: str, name: str) -> None:
    requests = shape(load(trace), duration=90, rate=2.0)
    if name == "deployed":  # the example spec: planner, adaptive threshold, LMCache p2p
        scenario = deployed_scenario(load_pool(EXAMPLE), model_load_seconds=30)
    else:
        [scenario] = build_scenarios(Budget(replicas=4, prefill_replicas=2), SLO, [name])
    stepped = ClusterSim(scenario, H100, requests, decode_runs=False)
    batched = ClusterSim(scenario, H100, requests)
    one, many = stepped.run(), batched.run()
    assert batched.steps_in_runs > many.engine_steps / 2  # the shortcut did most of the work
    assert stepped.steps_in_runs == 0
    assert seen(many) == seen(one)
    assert many.engine_steps == one.engine_steps
    assert sorted(many.itl_gaps) == sorted(one.itl_gaps)
    assert [(e.time, e.role, e.replicas) for e in many.scaling] == [
        (e.time, e.role, e.replicas) for e in one.scaling
    ]
    assert many.thresholds == one.thresholds
    # what the planner read and decided (its sums of gaps may differ in the last bit: other order)
    for batched_plan, stepped_plan in zip(many.plans, one.plans, strict=True):
        for a, b in (
            (batched_plan.prefill, stepped_plan.prefill),
            (batched_plan.decode, stepped_plan.decode),
        ):
            assert (a.replicas, a.wanted, a.reason, a.observed_seconds) == (
                b.replicas,
                b.wanted,
                b.reason,
                b.observed_seconds,
            )
            figures = (a.demand, a.forecast, a.capacity_per_replica, a.correction, a.latency_factor)
            expected = (b.demand, b.forecast, b.capacity_per_replica, b.correction, b.latency_factor)
            assert figures == pytest.approx(expected, rel=1e-9)
    assert summarize(many, SLO) == summarize(one, SLO)


def test_a_decode_run_is_the_steps_the_engine_would_schedule() -> None:
    def engine() -> EngineCore:
        core = EngineCore(H100, "e0")
        for i in range(3):
            core.add_request(EngineRequest(f"r{i}", list(range(i * 10_000, i * 10_000 + 700)), 40 + i), 0.0)
        return core

    stepped, batched = engine(), engine()
    now = 0.0
    while batched.decode_run(now) is None:  # the prefill step first, on both
        steps = [core.schedule(now) for core in (stepped, batched)]
        for core, scheduled in zip((stepped, batched), steps, strict=True):
            assert scheduled is not None
            core.complete(scheduled)
            now = scheduled.end
    run = batched.decode_run(now)
    assert run is not None
    assert run.request_ids == ("r0", "r1", "r2")
    assert len(run.ends) == 40 - 1 and run.finishing  # up to the step that gives r0 its 40th token
    ends, last = [], []
    for _ in run.ends:
        step = stepped.schedule(now)
        assert step is not None and step.decode_requests == 3 and step.prefill_tokens == 0
        last = [e for e in stepped.complete(step) if isinstance(e, TokenEvent) and e.finish_reason]
        now = step.end
        ends.append(now)
    assert run.ends == ends
    assert batched.commit_decode_run(run, len(run.ends)) == last
    assert [e.request_id for e in last] == ["r0"]
    assert dataclasses.asdict(batched.stats) == dataclasses.asdict(stepped.stats)
    assert batched.kv_usage == stepped.kv_usage and batched.num_running == stepped.num_running == 2
    assert batched.decode_run(now) is None  # r1 finishes in the next step: a one-step run is a plain step


def test_a_cut_run_keeps_the_step_in_flight() -> None:
    core = EngineCore(H100, "e0")
    core.add_request(EngineRequest("a", list(range(300)), 200), 0.0)
    step = core.schedule(0.0)
    assert step is not None
    core.complete(step)
    run = core.decode_run(step.end)
    assert run is not None and len(run.ends) == 64
    middle = (run.ends[9] + run.ends[10]) / 2
    assert not run.finishing  # 199 tokens to go, 64 steps at most
    assert run.cut(middle)
    assert len(run.ends) == 11  # steps 0..10, step 10 in flight at the cut
    assert not run.cut(run.ends[-1])
    assert run.cut(run.ends[5]) and len(run.ends) == 6  # an arrival at a step's end waits for the next step
    core.commit_decode_run(run, 3)
    assert run.cut(run.ends[2]) and len(run.ends) == 4  # committed steps stay, and the one after them
    with pytest.raises(ValueError, match="steps left"):
        core.commit_decode_run(run, 4)


def test_prompts_are_hashed_once_and_as_the_engine_hashes_them() -> None:
    azure = TraceRequest(0.0, 1000, 5)
    mooncake = TraceRequest(0.0, 1100, 5, (7, 8, 9))
    for request, number in ((azure, 12), (mooncake, 3)):
        work = _prompt_work(request, number)
        assert work.chunk_hashes() == tuple(chunk_hashes(prompt_ids(request, number)))
        assert _prompt_work(dataclasses.replace(request, arrival=5.0), number) is work  # a faster replay
    assert _prompt_work(mooncake, 4) is _prompt_work(mooncake, 3)  # Mooncake ids follow from the blocks
    assert _prompt_work(azure, 13) is not _prompt_work(azure, 12)  # an Azure prompt's own ids


def test_the_engine_refuses_hashes_of_another_prompt() -> None:
    core = EngineCore(H100, "e0")
    with pytest.raises(ValueError, match="2 chunk hashes for a prompt of 1000 tokens"):
        core.add_request(EngineRequest("a", list(range(1000)), 5, chunk_hashes=[b"x"] * 2), 0.0)


def test_a_started_step_holds_its_kv_and_counts_as_busy_as_a_scheduled_one() -> None:
    def engine() -> EngineCore:
        core = EngineCore(H100, "e0")
        core.add_request(EngineRequest("a", list(range(300)), 200), 0.0)
        core.add_request(EngineRequest("b", list(range(10_000, 10_255)), 200), 0.0)  # grows a block at once
        step = core.schedule(0.0)
        assert step is not None
        core.complete(step)
        return core

    stepped, batched = engine(), engine()
    run = batched.decode_run(0.5)
    assert run is not None
    assert stepped.schedule(0.5) is not None  # the first decode step, scheduled: its KV taken
    batched.start_decode_steps(run, 1)
    assert batched.kv_usage == stepped.kv_usage > 0
    assert (
        batched.stats.steps == stepped.stats.steps
        and batched.stats.busy_seconds == stepped.stats.busy_seconds
    )
    assert run.cut(0.5) and len(run.ends) == 1  # the started step stays, the rest go
    batched.commit_decode_run(run, 1)  # its KV is not taken twice
    assert batched.kv_usage == stepped.kv_usage
