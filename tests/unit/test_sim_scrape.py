"""The simulator's planner is fed as the operator's is: its engines and router render their metric pages (the
fake engine's vLLM collector, the router's own registry), the operator's feed reads them, and what the feed
reads is what the planner gets. A metric the pages lose, or one the feed stops finding, leaves the planner
without its input here as it would in a deployed pool."""

from __future__ import annotations

from typing import Any

from tests.unit.test_sim_planner import planned

from inferencepool.autoscaler.planner import MISSING_METRICS, Observation
from inferencepool.perf.profiles import get_profile
from inferencepool.sim.cluster import ClusterSim, Scenario
from inferencepool.sim.workload import TraceRequest

H100 = get_profile("llama-3.1-8b-h100")


def observed_run() -> tuple[ClusterSim, list[Observation], Any]:
    """A steady minute of short and long prompts on 1 prefill + 1 decode replica, with every observation
    the planner was given."""
    requests = [
        TraceRequest(i * 0.1, 6000 if i % 5 == 0 else 300, 40) for i in range(600)
    ]  # 10 req/s: every 5th prompt long enough for the prefill pool
    sim = ClusterSim(Scenario("plan", "LengthAware", 1, 1, 4096, planner=planned(1)), H100, requests)
    assert sim._planner is not None
    decide, seen = sim._planner.decide, []

    def recording(observation: Observation) -> Any:
        seen.append(observation)
        return decide(observation)

    sim._planner.decide = recording  # type: ignore[method-assign]
    return sim, seen, sim.run()


def test_the_simulators_pages_read_by_the_operators_feed_give_the_planner_its_inputs() -> None:
    _, seen, result = observed_run()
    assert all(r.completed for r in result.records)
    steady = [o for o in seen if 10 <= o.now <= 55]  # loaded intervals, each pod read twice
    assert steady and all(p.prefill.reason != MISSING_METRICS for p in result.plans[1:])
    for obs in steady:
        assert obs.to_prefill is not None and obs.direct is not None and obs.generated_tokens is not None
        # 10 req/s, one in 5 long: the router's counts by route, over a 5 s interval
        assert 7 <= obs.to_prefill.prompts <= 13 and 30 <= obs.direct.prompts <= 50, obs
        assert obs.direct.prompt_tokens == 300 * obs.direct.prompts
        # the router's arrival windows (2 s, the sim's clock): 20 prompts each, 4 (or 5, a prompt on the
        # edge) long for the prefill pool, the rest direct; read as the top of the largest one's bucket
        burst, direct_burst = obs.to_prefill.burst_prompt_tokens, obs.direct.burst_prompt_tokens
        assert burst is not None and 4 * 6000 <= burst <= 5 * 6000 * 2**0.25, obs
        assert direct_burst is not None and 15 * 300 <= direct_burst <= 17 * 300 * 2**0.25, obs
        # the prefill engines' own count of the prompt tokens they computed stands for the route's tokens
        assert 5000 * obs.to_prefill.prompts <= obs.to_prefill.prompt_tokens <= 6000 * obs.to_prefill.prompts
        # the decode engines' generation counter: 40 tokens a request
        assert 40 * 40 * 0.7 <= obs.generated_tokens <= 40 * 50 * 1.3
        assert obs.prefill.replicas == obs.prefill.ready == 1 and obs.decode.replicas == obs.decode.ready == 1
        # the latency histograms (TTFT on prefill; ITL, TPOT on decode), the router's direct TTFT, the gauges
        assert obs.prefill.observed_seconds is not None and 0 < obs.prefill.observed_seconds < 2
        assert obs.decode.observed_seconds is not None and obs.decode.tpot_seconds is not None
        assert obs.decode.mean_itl_seconds is not None and 0.005 < obs.decode.mean_itl_seconds < 0.1
        assert obs.decode.direct_ttft_seconds is not None
        assert obs.decode.kv_usage is not None and obs.decode.kv_usage > 0
        assert obs.decode.mean_context_tokens is not None and obs.decode.mean_context_tokens > 300
    total = sum(o.generated_tokens or 0 for o in seen)
    assert total <= sum(r.output_tokens for r in result.records)


def test_the_first_round_reads_no_interval_and_the_planner_keeps_the_pool() -> None:
    """As in the operator: a pod read once has no interval yet (the feed differences two readings)."""
    _, seen, result = observed_run()
    assert seen[0].generated_tokens is None and seen[0].to_prefill is None
    assert result.plans[0].prefill.reason == MISSING_METRICS
