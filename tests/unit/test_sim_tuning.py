"""Engines tuned per role in the simulator: decode pods' prefill chunk from the ITL target, and the router's
threshold on uncached tokens."""

from __future__ import annotations

from dataclasses import replace

from inferencepool.perf import timing
from inferencepool.perf.profiles import get_profile
from inferencepool.sim.cluster import CHUNK_CONTEXT_TOKENS, ClusterSim, chunk_for_itl
from inferencepool.sim.compare import Budget, build_scenarios
from inferencepool.sim.report import Slo
from inferencepool.sim.workload import TraceRequest

H100 = get_profile("llama-3.1-8b-h100")


def test_the_decode_chunk_is_the_largest_whose_step_fits_the_itl_target() -> None:
    assert chunk_for_itl(H100, 0.025) == 512
    assert chunk_for_itl(H100, 0.040) == 1024
    assert chunk_for_itl(H100, 0.001) == 256  # never below 256 (LMCache's chunk)
    assert chunk_for_itl(H100, 10.0) == H100.max_num_batched_tokens  # never above the profile's budget
    for target in (0.02, 0.03, 0.05, 0.08):
        chunk = chunk_for_itl(H100, target)
        step = timing.step_time(H100, [timing.PrefillChunk(chunk, CHUNK_CONTEXT_TOKENS)], ())
        bigger = timing.step_time(H100, [timing.PrefillChunk(2 * chunk, CHUNK_CONTEXT_TOKENS)], ())
        assert step <= target < bigger or chunk == 256


def test_tuned_scenarios_take_the_chunk_of_their_itl_target() -> None:
    trace = [TraceRequest(0.0, 100, 2)]
    for itl, chunk in ((0.025, 512), (0.040, 1024)):
        for name in ("colocated-tuned", "static-pd", "planner"):
            [scenario] = build_scenarios(Budget(4, 1), Slo(0.8, itl), [name])
            assert ClusterSim(scenario, H100, trace).profiles["decode"].max_num_batched_tokens == chunk
        [default] = build_scenarios(Budget(4, 1), Slo(0.8, itl), ["colocated"])
        assert ClusterSim(default, H100, trace).profiles["decode"].max_num_batched_tokens == 8192
    [given] = build_scenarios(Budget(4, 1, decode_chunk_tokens=2048), Slo(0.8, 0.025), ["static-pd"])
    assert ClusterSim(given, H100, trace).profiles["decode"].max_num_batched_tokens == 2048


def test_the_router_disaggregates_prompts_of_the_threshold_in_uncached_tokens_and_over() -> None:
    [planner] = build_scenarios(Budget(4, 1, threshold_tokens=512), Slo(0.8, 0.025), ["planner"])
    scenario = replace(planner, planner=None)
    # far apart, each on idle pods: the route follows the uncached tokens against the threshold
    trace = [TraceRequest(10.0 * i, prompt, 4) for i, prompt in enumerate((400, 511, 512, 3000))]
    result = ClusterSim(scenario, H100, trace).run()
    assert [r.route for r in result.records] == ["direct", "direct", "disaggregated", "disaggregated"]
    assert [r.reason for r in result.records] == ["short", "short", "long", "long"]
