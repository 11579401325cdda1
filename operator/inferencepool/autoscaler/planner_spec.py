"""A pool's spec as the planner's settings and capacity seed (pure).

The planner plans both roles at once. A role that autoscales is bounded by its own min/max; a role that does
not is pinned at its current count, so the planner only accounts for it. Targets: each role's own; a role
without one borrows a loose stand-in, since the planner needs both to size the other (the decode pods' TTFT
cap on direct prompts, say).

The capacity table is seeded from the engine profile the pool runs (the fake engine's FAKE_ENGINE_PROFILE
and FAKE_ENGINE_TIME_SCALE; else llama-3.1-8b-h100, the same default as `inferencepool diagnose`), at the
engines' --max-num-batched-tokens when the spec sets it; the planner corrects it online from the observed
utilisation. spec.scaling gives the bounds across both roles: the prefill:decode ratio (percent, no upper
bound when maxPercent is unset) and the GPU budget.
"""

from __future__ import annotations

import math
from dataclasses import replace

from inferencepool.api.v1alpha1 import POOL_ROLES, Autoscaling, InferencePoolSpec, PoolRole
from inferencepool.autoscaler.capacity import CapacityModel, from_profile
from inferencepool.autoscaler.planner import PlannerSettings, RoleBounds
from inferencepool.perf.profiles import get_profile

DEFAULT_PROFILE = "llama-3.1-8b-h100"
# Stand-ins for a role without a target of its own (it does not autoscale on the planner).
LOOSE_TTFT_SECONDS = 2.0
LOOSE_ITL_SECONDS = 0.1


def planned(spec: InferencePoolSpec, role: PoolRole) -> Autoscaling | None:
    """The role's autoscaling settings when it autoscales (the planner decides its replicas)."""
    autoscaling = spec.pool(role).autoscaling
    return autoscaling if autoscaling is not None and autoscaling.enabled else None


def planner_settings(spec: InferencePoolSpec, current: dict[PoolRole, int]) -> PlannerSettings | None:
    """The planner's settings for the pool (None when no role autoscales); roles it
    does not decide are pinned at `current`."""
    scaled = {role: a for role in POOL_ROLES if (a := planned(spec, role)) is not None}
    if not scaled:
        return None

    def bounds(role: PoolRole) -> RoleBounds:
        gpus = spec.gpus_per_replica(role)
        autoscaling = scaled.get(role)
        if autoscaling is None:
            pinned = current[role]
            # the decode pool always has a pod to plan for; a pinned prefill pool of 0 stays at 0
            floor = max(pinned, 1) if role == "decode" else pinned
            return RoleBounds(floor, max(floor, 1), gpus)
        return RoleBounds(autoscaling.min_replicas, autoscaling.max_replicas, gpus)

    ttft = spec.target_milliseconds("prefill")
    itl = spec.target_milliseconds("decode")
    every = list(scaled.values())
    down_delay = float(max(a.scale_down_stabilization_seconds for a in every))
    ratio_bounds, gpu_budget = None, None
    if spec.scaling is not None:
        gpu_budget = spec.scaling.gpu_budget
        ratio = spec.scaling.prefill_decode_ratio
        if ratio is not None:
            high = math.inf if ratio.max_percent is None else ratio.max_percent / 100
            ratio_bounds = (ratio.min_percent / 100, high)
    return PlannerSettings(
        ttft_target_seconds=ttft / 1000 if ttft is not None else LOOSE_TTFT_SECONDS,
        itl_target_seconds=itl / 1000 if itl is not None else LOOSE_ITL_SECONDS,
        prefill=bounds("prefill"),
        decode=bounds("decode"),
        model_load_seconds=float(max(a.model_load_seconds for a in every)),
        interval_seconds=float(min(a.interval_seconds for a in every)),
        latency_tolerance=min(a.tolerance_percent for a in every) / 100,
        # scaleDownStabilizationSeconds: the evidence a scale-down waits for, after a scale-up and at start
        scale_down_delay_seconds=down_delay,
        warmup_seconds=down_delay,
        ratio_bounds=ratio_bounds,
        gpu_budget=gpu_budget,
    )


def _env(spec: InferencePoolSpec, name: str) -> str | None:
    for variable in spec.engine.extra_env:
        if variable.get("name") == name and variable.get("value"):
            return str(variable["value"])
    return None


def _flag(spec: InferencePoolSpec, name: str) -> int | None:
    args = list(spec.engine.extra_args)
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
        else:
            continue
        try:
            return int(value)
        except ValueError:
            return None
    return None


def capacity_seed(spec: InferencePoolSpec) -> CapacityModel:
    """The capacity table of the engines the pool runs, as far as the spec tells (see the module doc)."""
    try:
        profile = get_profile(_env(spec, "FAKE_ENGINE_PROFILE") or DEFAULT_PROFILE)
    except ValueError:
        profile = get_profile(DEFAULT_PROFILE)
    model = from_profile(profile, _flag(spec, "--max-num-batched-tokens"))
    try:
        scale = float(_env(spec, "FAKE_ENGINE_TIME_SCALE") or 1.0)
    except ValueError:
        scale = 1.0
    if scale <= 0 or scale == 1.0:
        return model
    return replace(
        model,
        chunk_seconds=model.chunk_seconds * scale,
        prefill_points=tuple((n, t * scale) for n, t in model.prefill_points),
        decode_points=tuple((c, t0 * scale, d * scale) for c, t0, d in model.decode_points),
    )
