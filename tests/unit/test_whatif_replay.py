"""The what-if: a window's traffic sketch replayed in the simulator, and the threshold it recommends checked
on the vendored traces themselves (applying it must not lower goodput)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest
from tests.support.histograms import histogram

from inferencepool.bottleneck.core import diagnose, with_what_if
from inferencepool.bottleneck.settings import PoolSettings, settings_from_pool
from inferencepool.bottleneck.window import EngineWindow, PoolWindow, RouterWindow
from inferencepool.engine_sim.metrics import ITL_BUCKETS, TTFT_BUCKETS
from inferencepool.perf.profiles import get_profile
from inferencepool.router.metrics import PROMPT_BUCKETS
from inferencepool.sim import workload
from inferencepool.sim.cluster import ClusterSim, Scenario, ScenarioResult, simulate
from inferencepool.sim.pool import deployed_scenario, load_pool
from inferencepool.sim.report import Slo, summarize
from inferencepool.sim.scrape import histogram_of
from inferencepool.whatif.replay import TrafficSketch, scenarios, synthetic_trace, what_if

pytestmark = pytest.mark.sim  # the what-if replays traces through the simulator

PROFILE = get_profile("llama-3.1-8b-h100")
SLO = Slo(0.8, 0.04)


def test_the_synthetic_trace_follows_the_sketch() -> None:
    prompt = histogram([300.0] * 50 + [6000.0] * 50, PROMPT_BUCKETS)
    sketch = TrafficSketch(rate=5.0, prompt=prompt, mean_output_tokens=100, reuse=0.0)
    trace = synthetic_trace(sketch, seconds=200, max_requests=5000)
    assert trace == synthetic_trace(sketch, seconds=200, max_requests=5000)  # seeded: the same table twice
    assert len(trace) / 200 == pytest.approx(5.0, rel=0.1)
    short = sum(256 < r.prompt_tokens <= 512 for r in trace) / len(trace)
    long = sum(4096 < r.prompt_tokens <= 8192 for r in trace) / len(trace)
    assert short == pytest.approx(0.5, abs=0.07) and long == pytest.approx(0.5, abs=0.07)
    assert sum(r.output_tokens for r in trace) / len(trace) == pytest.approx(100, rel=0.15)
    assert all(not r.block_ids for r in trace)  # no reuse: every prompt its own
    assert len(synthetic_trace(sketch, seconds=200, max_requests=50)) == 50
    reused = synthetic_trace(TrafficSketch(5.0, prompt, 100, reuse=0.6), seconds=60)
    long_ones = [r for r in reused if r.prompt_tokens > 4096]
    firsts = {r.block_ids[0] for r in long_ones}
    assert len(firsts) <= 4  # their leading blocks come from a few shared documents
    assert all(len(r.block_ids) == math.ceil(r.prompt_tokens / 512) for r in reused)


def sim_window(
    scenario: Scenario, trace: Sequence[workload.TraceRequest]
) -> tuple[PoolWindow, ScenarioResult]:
    """What the router and the engines would have exported over the run: the engines' own vLLM histograms
    and counters (the simulator keeps them per replica), the router's per-route TTFT, ITL and prompts."""
    sim = ClusterSim(scenario, PROFILE, trace)
    result = sim.run()
    roles: dict[str, EngineWindow] = {}
    for role in ("prefill", "decode"):
        replicas = [r for r in sim.replicas if r.role == role]
        if not replicas:
            continue
        ttft = itl = None
        counters: dict[str, float] = {}
        for replica in replicas:
            a, b = histogram_of(replica.ttft), histogram_of(replica.itl)
            ttft, itl = (a, b) if ttft is None or itl is None else (ttft.plus(a), itl.plus(b))
            stats = replica.core.stats
            for name, value in (
                ("vllm:request_success", sum(stats.request_success.values())),
                ("vllm:prompt_tokens", stats.prompt_tokens),
                ("vllm:generation_tokens", stats.generation_tokens),
                ("vllm:prefix_cache_queries", stats.prefix_cache_queries),
                ("vllm:prefix_cache_hits", stats.prefix_cache_hits),
                ("vllm:external_prefix_cache_queries", stats.external_prefix_cache_queries),
                ("vllm:external_prefix_cache_hits", stats.external_prefix_cache_hits),
            ):
                counters[name] = counters.get(name, 0.0) + value
        roles[role] = EngineWindow(pods=len(replicas), ttft=ttft, itl=itl, counters=counters)
    records = result.records
    first_tokens: dict[str, list[float]] = {}
    for record in records:
        if record.ttft is not None and record.route in ("direct", "disaggregated"):
            first_tokens.setdefault(record.route, []).append(record.ttft)
    router = RouterWindow(
        pods=1,
        requests={
            r: float(sum(x.route == r for x in records)) for r in ("direct", "disaggregated", "fallback")
        },
        ttft={route: histogram(values, TTFT_BUCKETS) for route, values in first_tokens.items()},
        itl={"direct": histogram(list(result.itl_gaps), ITL_BUCKETS)},
        prompt_tokens=histogram([r.prompt_tokens for r in records], PROMPT_BUCKETS),
    )
    window = PoolWindow(
        result.trace_span, prefill=roles.get("prefill"), decode=roles.get("decode"), router=router
    )
    return window, result


# Loaded layouts where the diagnosis has something to recommend, one per vendored trace.
CASES = [
    # long, partly shared conversation prompts; the prefill pool queues, decode has headroom: raise it
    pytest.param("mooncake-conv", 300, 1.0, 2, 2, 4096, "Threshold", id="mooncake-conv-2p2d"),
    # code completion on colocated engines: long prefills stall decode batches: disaggregate
    pytest.param("azure-code", 300, 3.0, 0, 4, 4096, "Disaggregate", id="azure-code-colocated"),
    # chat at 13x its rate on 2+2: prefills on the decode engines stall them: lower the threshold (at 8-12x
    # the router's load-aware bypass and its pod choice, which weighs the prefill queued on each pod, leave
    # only the chunk's own stall: smaller chunks are advised there)
    pytest.param("azure-conv", 300, 13.0, 2, 2, 4096, "Threshold", id="azure-conv-2p2d"),
]


@pytest.mark.parametrize(("trace", "seconds", "rate", "prefill", "decode", "threshold", "kind"), CASES)
def test_the_recommended_threshold_does_not_lower_goodput_on_the_trace(
    trace: str, seconds: float, rate: float, prefill: int, decode: int, threshold: int, kind: str
) -> None:
    requests = workload.shape(workload.load(trace), duration=seconds, rate=rate)
    policy = "LengthAware" if prefill else "Colocated"
    deployed = (
        Scenario("deployed", "LengthAware", prefill, decode, threshold)
        if prefill
        else Scenario("deployed", "Colocated", 0, decode)
    )
    settings = PoolSettings(
        policy=policy, prefill_replicas=prefill, decode_replicas=decode, threshold_tokens=threshold
    )
    window, result = sim_window(deployed, requests)
    diagnosis = diagnose(window, settings)
    table = what_if(diagnosis, settings, PROFILE, seconds=60, max_requests=600)
    checked = with_what_if(diagnosis, table, settings)
    advice = checked.advice_of(kind)
    assert advice is not None and advice.threshold_tokens is not None, checked.advice
    engines = prefill + decode
    prefill_after = prefill or min(engines - 1, advice.replicas or 1)
    applied = simulate(
        Scenario("applied", "LengthAware", prefill_after, engines - prefill_after, advice.threshold_tokens),
        PROFILE,
        requests,
    )
    before, after = summarize(result, SLO).goodput_rps, summarize(applied, SLO).goodput_rps
    assert after >= before, f"{advice.text}: {after:.3f} < {before:.3f} good requests/s"


def test_with_the_pool_spec_the_current_row_is_the_deployed_scenario() -> None:
    pool = load_pool(Path(__file__).parents[2] / "examples" / "llama-3.1-8b.yaml")
    requests = workload.shape(workload.load("azure-conv"), duration=300, rate=12.0)
    window, _ = sim_window(Scenario("deployed", "LengthAware", 2, 2, 4096), requests)
    settings = settings_from_pool(pool, {"prefill": 2, "decode": 2})
    rows = dict(scenarios(settings, diagnose(window, settings), pool))
    assert rows["current"] == deployed_scenario(
        pool, name="current", replicas={"prefill": 2, "decode": 2}, autoscale=False
    )
    threshold = rows.get("threshold")
    if threshold is not None:  # a candidate is the same pool at a fixed threshold
        assert threshold.router is not None and not threshold.router.adaptive_threshold.enabled
        assert threshold.lmcache_p2p and threshold.decode_chunk_tokens == 1024
