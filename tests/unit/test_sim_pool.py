"""The `deployed` scenario is the pool spec as the operator maps it: the router's config the operator renders,
the engine flags it passes, the replicas it creates and the planner settings it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders.common import PoolRef
from inferencepool.builders.router import router_config
from inferencepool.perf.profiles import get_profile
from inferencepool.sim.cluster import ClusterSim
from inferencepool.sim.pool import deployed_profile, deployed_scenario, load_pool
from inferencepool.sim.workload import TraceRequest

EXAMPLE = Path(__file__).parents[2] / "examples" / "llama-3.1-8b.yaml"
H100 = get_profile("llama-3.1-8b-h100")


def test_the_example_spec_maps_as_the_operator_maps_it() -> None:
    pool = load_pool(EXAMPLE)
    scenario = deployed_scenario(pool)
    assert scenario.router == router_config(pool, PoolRef("llama-8b", "default", "simulated"))
    assert (scenario.policy, scenario.threshold_tokens) == ("LengthAware", 4096)
    assert scenario.adaptive is not None and scenario.adaptive.enabled
    assert (scenario.ttft_target_seconds, scenario.itl_target_seconds) == (0.8, 0.04)
    assert (scenario.prefill_replicas, scenario.decode_replicas) == (2, 4)
    # vLLM flags per role: the prefill pool keeps vLLM's chunk, the decode pool the one for a 40 ms target
    assert (scenario.prefill_chunk_tokens, scenario.decode_chunk_tokens) == (None, 1024)
    assert (scenario.prefill_max_num_seqs, scenario.decode_max_num_seqs) == (None, None)
    assert (scenario.lmcache_cpu_gib, scenario.lmcache_p2p) == (20.0, True)
    assert scenario.planner is not None
    settings = scenario.planner.settings
    assert (settings.prefill.min_replicas, settings.prefill.max_replicas) == (1, 8)
    assert (settings.decode.min_replicas, settings.decode.max_replicas) == (2, 16)
    assert settings.gpu_budget == 24 and settings.ratio_bounds is not None
    sim = ClusterSim(scenario, deployed_profile(pool, H100), [TraceRequest(0.0, 100, 2)])
    assert sim.profiles["decode"].max_num_batched_tokens == 1024
    assert sim.router.scheduler.config.block_tokens == 256  # the pool's LMCache chunk


def test_a_tight_itl_target_and_a_colocated_policy_map_too() -> None:
    document = load_pool(EXAMPLE).model_dump(by_alias=True, exclude_none=True)
    document["spec"]["decode"]["autoscaling"]["target"]["itlMilliseconds"] = 25
    document["spec"]["engine"]["tensorParallelSize"] = 2
    for role in ("prefill", "decode"):
        document["spec"][role]["gpusPerReplica"] = 2
    pool = InferencePool.model_validate(document)
    scenario = deployed_scenario(pool, replicas={"prefill": 1, "decode": 3}, autoscale=False)
    assert (scenario.decode_chunk_tokens, scenario.decode_max_num_seqs) == (512, 512)
    assert (scenario.prefill_replicas, scenario.decode_replicas) == (1, 3) and scenario.planner is None
    assert deployed_profile(pool, H100).tensor_parallel == 2
    document["spec"]["router"]["policy"] = "Colocated"
    colocated = deployed_scenario(InferencePool.model_validate(document))
    assert (colocated.policy, colocated.prefill_replicas, colocated.planner) == ("Colocated", 0, None)


def test_a_spec_with_two_tensor_parallel_sizes_is_refused_by_name() -> None:
    document = load_pool(EXAMPLE).model_dump(by_alias=True, exclude_none=True)
    document["spec"]["prefill"]["tensorParallelSize"] = 2
    document["spec"]["prefill"]["gpusPerReplica"] = 2
    with pytest.raises(ValueError, match="one tensor-parallel size"):
        deployed_profile(InferencePool.model_validate(document), H100)


@pytest.mark.parametrize("lending", [True, False])
def test_the_deployed_scenario_lends_to_the_prefill_pod_when_the_spec_allows_it(lending: bool) -> None:
    """A burst the one decode pod cannot batch (64 sequences): with roleLending the prefill pod serves some
    requests whole, through the same scheduling core as the router, and every request still finishes once
    with all its tokens; without it none is lent."""
    from inferencepool.sim.cluster import simulate

    document = load_pool(EXAMPLE).model_dump(by_alias=True, exclude_none=True)
    document["spec"]["router"]["roleLending"] = lending
    document["spec"]["decode"]["maxNumBatchedTokens"] = 64
    document["spec"].pop("kvCache")
    pool = InferencePool.model_validate(document)
    scenario = deployed_scenario(pool, replicas={"prefill": 1, "decode": 1}, autoscale=False)
    assert scenario.router is not None and scenario.router.role_lending is lending
    # a lending prefill pool prefills in the decode pool's chunk (its lent decodes keep the ITL target)
    assert scenario.prefill_chunk_tokens == (64 if lending else None)
    trace = [TraceRequest(i * 0.005, 600 + 10 * i, 300) for i in range(200)]
    result = simulate(scenario, deployed_profile(pool, H100), trace)
    for record in result.records:
        assert record.finishes == 1 and record.completed and record.tokens_received == record.output_tokens
    lent = [r for r in result.records if r.route == "lent"]
    assert bool(lent) is lending
    assert all(r.reason == "decode_saturated" for r in lent)
    assert all(r.decode_pod is not None and "prefill" in r.decode_pod for r in lent)


def test_the_simulator_prefills_on_an_idle_decode_pod_for_a_busy_one_while_the_prefill_pod_queues() -> None:
    """Long prompts sharing a 12288-token prefix (their decodes go to the pod holding it) faster than the one
    prefill pod takes them: with roleLending the other, idle decode pod prefills one for the busy one (reason
    prefill_saturated), which loads its KV; every request finishes once with all its tokens."""
    from inferencepool.sim.cluster import simulate

    document = load_pool(EXAMPLE).model_dump(by_alias=True, exclude_none=True)
    document["spec"]["router"]["roleLending"] = True
    document["spec"].pop("kvCache")
    pool = InferencePool.model_validate(document)
    scenario = deployed_scenario(pool, replicas={"prefill": 1, "decode": 2}, autoscale=False)
    shared = tuple(range(1, 25))  # 24 Mooncake blocks of 512 tokens: more than the pod holding it queues
    trace = [
        TraceRequest(i * 0.05, 34 * 512, 300, shared + tuple(range(100 + 10 * i, 110 + 10 * i)))
        for i in range(40)
    ]
    result = simulate(scenario, deployed_profile(pool, H100), trace)
    for record in result.records:
        assert record.finishes == 1 and record.completed and record.tokens_received == record.output_tokens
    peer = [r for r in result.records if r.reason == "prefill_saturated"]
    assert peer and all(r.route == "disaggregated" for r in peer)
    for record in peer:
        assert record.prefill_pod is not None and "decode" in record.prefill_pod
        assert record.decode_pod is not None and record.decode_pod != record.prefill_pod
