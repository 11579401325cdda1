"""The `deployed` scenario: a pool spec, defaulted and mapped as the operator maps it.

Every setting comes from the operator's own mapping, not a second reading of the spec:

- the router: `builders.router.router_config` (policy, threshold, adaptive threshold and its targets, prefix
  affinity and its block size), run verbatim by the simulated router;
- the engines: `InferencePoolSpec.batch_args` per role (the prefill chunk, and --max-num-seqs where vLLM's
  default would exceed it), the tensor-parallel size, `max_model_len()`;
- the replicas: `PoolSpec.initial_replicas` (what the operator creates the pool with), a Colocated pool
  serving from its decode pool alone;
- autoscaling: `autoscaler.planner_spec.planner_settings` (bounds, targets, ratio, GPU budget);
- LMCache: the kvCache block (the CPU tier per pod, p2p).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from inferencepool.api.v1alpha1 import InferencePool, PoolRole
from inferencepool.autoscaler.planner_spec import planned, planner_settings
from inferencepool.builders.common import PoolRef
from inferencepool.builders.router import router_config
from inferencepool.perf.profiles import EngineProfile
from inferencepool.sim.cluster import PlannerScaling, Scenario

DEPLOYED = "deployed"


def load_pool(path: Path) -> InferencePool:
    """An InferencePool manifest (YAML), validated and defaulted by the API models."""
    return InferencePool.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))


def _flag(args: list[str], name: str) -> int | None:
    return int(args[args.index(name) + 1]) if name in args else None


def deployed_profile(pool: InferencePool, profile: EngineProfile) -> EngineProfile:
    """The GPU profile under the spec's engine shape: tensor parallelism and context length."""
    spec = pool.spec
    tp = {spec.tensor_parallel_size(role) for role in ("prefill", "decode")}
    if len(tp) != 1:
        raise ValueError("the simulator runs one tensor-parallel size for both pools; the spec gives two")
    return profile.with_overrides(tensor_parallel=tp.pop(), max_model_len=spec.max_model_len())


def deployed_scenario(
    pool: InferencePool,
    *,
    name: str = DEPLOYED,
    replicas: dict[PoolRole, int] | None = None,
    autoscale: bool = True,
    model_load_seconds: float | None = None,
) -> Scenario:
    """The pool as the operator would run it. `replicas` replaces the initial counts (the pods a running
    pool has); without `autoscale` the pool stays at them (a what-if on a fixed layout)."""
    spec = pool.spec
    ref = PoolRef(pool.name() or "pool", pool.namespace(), "simulated")
    router = router_config(pool, ref)
    colocated = router.policy == "Colocated"
    counts: dict[PoolRole, int] = {
        "prefill": 0 if colocated else spec.prefill.initial_replicas(),
        "decode": spec.decode.initial_replicas(),
    }
    counts.update(replicas or {})
    chunks = {
        role: _flag(spec.batch_args(role), "--max-num-batched-tokens") for role in ("prefill", "decode")
    }
    seqs = {role: _flag(spec.batch_args(role), "--max-num-seqs") for role in ("prefill", "decode")}
    kv_cache = spec.kv_cache
    adaptive = router.adaptive_threshold
    scenario = Scenario(
        name,
        router.policy,
        counts["prefill"],
        counts["decode"],
        threshold_tokens=router.prefill_threshold_tokens,
        adaptive=adaptive if adaptive.enabled and router.policy == "LengthAware" else None,
        prefix_affinity=router.prefix_affinity.enabled,
        prefill_chunk_tokens=chunks["prefill"],
        decode_chunk_tokens=chunks["decode"],
        prefill_max_num_seqs=seqs["prefill"],
        decode_max_num_seqs=seqs["decode"],
        ttft_target_seconds=adaptive.ttft_target_milliseconds / 1000,
        itl_target_seconds=adaptive.itl_target_milliseconds / 1000,
        router=router,
        # LMCache's CPU tier per pod (the spec's figure is per pod, split over its ranks)
        lmcache_cpu_gib=float(kv_cache.cpu_offload_gib) if kv_cache is not None else 0.0,
        lmcache_p2p=spec.p2p_enabled(),
    )
    if not autoscale or colocated:
        return scenario
    settings = planner_settings(spec, counts)
    if settings is None:
        return scenario
    if model_load_seconds is not None:
        settings = replace(settings, model_load_seconds=model_load_seconds)
    scaled = [a for role in ("prefill", "decode") if (a := planned(spec, role)) is not None]
    return replace(
        scenario,
        planner=PlannerScaling(
            settings,
            window_seconds=float(max(a.window_seconds for a in scaled)),
            percentile=max(a.target.percentile for a in scaled),
        ),
    )
