"""LMCache in the simulated pool: a CPU tier that serves prefixes the GPU cache evicted (loaded over the host
link), and p2p sharing (a prefix another engine's CPU tier holds is fetched over the KV link), each checked
against the timing formulas."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from inferencepool.cli import main
from inferencepool.perf import timing
from inferencepool.perf.profiles import EngineProfile, get_profile
from inferencepool.sim.cluster import ClusterSim, Scenario
from inferencepool.sim.workload import TraceRequest

H100 = get_profile("llama-3.1-8b-h100")
PROMPT = 8192  # 16 Mooncake blocks; the engine looks up (8192 - 1) // 256 = 31 chunks
CACHED = 31 * 256


def small_kv(tokens: int) -> EngineProfile:
    """H100 timings with a GPU KV cache of about `tokens` tokens, so a few long prompts evict the rest."""
    kv = tokens * H100.model.kv_bytes_per_token
    weights = H100.model.weight_bytes + H100.activation_reserve_bytes
    hardware = dataclasses.replace(H100.hardware, hbm_bytes=(weights + kv) / 0.9)
    return dataclasses.replace(H100, hardware=hardware, max_model_len=16384)


def blocks(first: int) -> tuple[int, ...]:
    return tuple(range(first, first + PROMPT // 512))


def prefill_after(profile: EngineProfile, cached: int) -> float:
    """The last prompt chunk on an idle engine once `cached` tokens are in place."""
    return timing.step_time(profile, [timing.PrefillChunk(PROMPT - cached, cached)], ())


@pytest.mark.parametrize("cpu_gib", [0.0, 8.0])
def test_the_cpu_tier_serves_a_prefix_the_gpu_cache_evicted(cpu_gib: float) -> None:
    profile = small_kv(20_000)
    again = TraceRequest(20.0, PROMPT, 2, blocks(0))
    trace = [TraceRequest(0.0, PROMPT, 2, blocks(0))]
    trace += [TraceRequest(2.0 + 2 * i, PROMPT, 2, blocks(1000 * (i + 1))) for i in range(4)]  # evict it
    scenario = Scenario("one", "Colocated", 0, 1, lmcache_cpu_gib=cpu_gib)
    sim = ClusterSim(scenario, profile, [*trace, again])
    result = sim.run()
    [engine] = [r.core for r in sim.replicas]
    assert engine.pool.evictions > 0
    ttft = result.records[-1].ttft
    assert ttft is not None
    if cpu_gib == 0:
        assert engine.lmcache is None
        assert ttft == pytest.approx(timing.ideal_prefill_time(profile, PROMPT))
        return
    assert engine.stats.lmcache_hit_tokens == CACHED and engine.stats.lmcache_p2p_hit_tokens == 0
    # 8 GiB holds 8 GiB / (256 tokens x 128 KiB) = 256 chunks, all five prompts
    assert engine.lmcache is not None and engine.lmcache.cpu_capacity_chunks == 256
    assert ttft == pytest.approx(timing.host_load_time(profile, CACHED) + prefill_after(profile, CACHED))
    assert ttft < timing.ideal_prefill_time(profile, PROMPT) / 3


@pytest.mark.parametrize(("p2p", "link"), [(False, None), (True, None), (True, 2e9)])
def test_p2p_fetches_a_prefix_another_engine_holds(p2p: bool, link: float | None) -> None:
    # the first request keeps its engine busy, so the same prompt goes to the other engine
    trace = [TraceRequest(0.0, PROMPT, 2000, blocks(0)), TraceRequest(2.0, PROMPT, 2, blocks(0))]
    scenario = Scenario("two", "Colocated", 0, 2, prefix_affinity=False, lmcache_cpu_gib=8.0, lmcache_p2p=p2p)
    sim = ClusterSim(scenario, H100, trace, kv_link_bytes_per_s=link)
    result = sim.run()
    first, second = result.records
    assert first.decode_pod != second.decode_pod
    fetcher = sim.by_engine[second.decode_pod or ""].core
    if not p2p:
        assert fetcher.stats.lmcache_hit_tokens == 0
        assert second.ttft == pytest.approx(timing.ideal_prefill_time(H100, PROMPT))
        return
    assert fetcher.stats.lmcache_p2p_hit_tokens == CACHED
    fetch = timing.kv_transfer_time(H100, CACHED, link or H100.hardware.kv_link_bytes_per_s)
    assert second.ttft == pytest.approx(fetch + prefill_after(H100, CACHED))


def test_a_removed_engine_is_no_peer() -> None:
    trace = [TraceRequest(0.0, PROMPT, 2, blocks(0))]
    scenario = Scenario("one", "Colocated", 0, 1, lmcache_cpu_gib=8.0, lmcache_p2p=True)
    sim = ClusterSim(scenario, H100, trace)
    sim.run()
    [replica] = sim.replicas
    assert sim._peers is not None
    key = replica.core.cpu_chunks()[0]
    assert sim._peers.holder(key, "another") == replica.name
    replica.terminating = True
    sim._maybe_remove(replica)
    assert sim._peers.holder(key, "another") is None


def test_scenarios_refuse_p2p_without_a_cpu_tier() -> None:
    with pytest.raises(ValueError, match="p2p shares the CPU tier"):
        Scenario("x", "Colocated", 0, 1, lmcache_p2p=True)


def test_cli_runs_with_lmcache_and_names_a_bad_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path)
    args = ["sim", "--trace", "mooncake-conv", "--duration", "20", "--scenarios", "colocated,colocated-tuned"]
    assert main([*args, "--lmcache-cpu-gib", "16", "--p2p", "--no-plots", "--out", out]) == 0
    assert main([*args, "--p2p", "--no-plots", "--out", out]) == 2
    assert "p2p shares the CPU tier" in capsys.readouterr().err
