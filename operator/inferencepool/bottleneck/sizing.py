"""How many replicas of each role the window's load needs, as the autoscaler sizes them (pure).

There is one sizing rule in the project, the SLA planner's (`autoscaler.planner`). The diagnosis asks it: the
window's first and last snapshots go through the operator's own feed (`autoscaler.feed`, the pages the runner
reads every interval) into a planner that has seen nothing before, over one interval as long as the window;
what it wants per role (demand one model load ahead over what a replica carries at the target, the latency
guard when a role misses its target with every pod up) is the replica count the advice names. No rule of its
own, so what `kubectl describe` and `inferencepool diagnose` advise is what the autoscaler would do with the
same pages (bounded by maxReplicas, which the diagnosis applies itself and says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from inferencepool.api.v1alpha1 import MAX_REPLICAS, POOL_ROLES, PoolRole
from inferencepool.autoscaler.capacity import CapacityModel, from_profile
from inferencepool.autoscaler.feed import PoolFeed, RolePages, RoleReading, RouterReading, observation
from inferencepool.autoscaler.planner import MISSING_METRICS, Planner, PlannerSettings, RoleBounds, RolePlan
from inferencepool.autoscaler.planner_spec import DEFAULT_PROFILE
from inferencepool.bottleneck.settings import PoolSettings
from inferencepool.bottleneck.window import Snapshot
from inferencepool.perf.profiles import get_profile

# The stand-in for a pool without a model load time of its own (the API's default, modelLoadSeconds).
MODEL_LOAD_SECONDS: Final = 120.0


@dataclass(frozen=True)
class Sizing:
    """The planner's replicas per role for the window's load, and its figures (the decision's message)."""

    prefill: RolePlan
    decode: RolePlan

    def role(self, role: PoolRole) -> RolePlan:
        return self.prefill if role == "prefill" else self.decode


def default_capacity() -> CapacityModel:
    """The capacity table when nothing says what the engines are (the planner's default profile)."""
    return from_profile(get_profile(DEFAULT_PROFILE))


def size(earlier: Snapshot, later: Snapshot, settings: PoolSettings) -> Sizing | None:
    """The planner's sizing of the window between two snapshots; None when the pages do not say the load
    (no router counts, or no engine read in both snapshots)."""
    seconds = later.at - earlier.at
    if seconds <= 0:
        return None
    model = settings.capacity or default_capacity()
    pods = {role: sum(p.role == role for p in later.pages) for role in POOL_ROLES}
    # a disaggregated pool keeps its prefill pool; a colocated one has none to plan (it may stay at zero)
    prefill = RoleBounds(1, MAX_REPLICAS) if settings.disaggregated else RoleBounds(0, 1)
    planner = Planner(
        PlannerSettings(
            ttft_target_seconds=settings.ttft_target_ms / 1000,
            itl_target_seconds=settings.itl_target_ms / 1000,
            prefill=prefill,
            decode=RoleBounds(1, MAX_REPLICAS),
            model_load_seconds=settings.model_load_seconds or MODEL_LOAD_SECONDS,
            interval_seconds=seconds,
            warmup_seconds=0.0,
            scale_down_delay_seconds=0.0,
        ),
        model,
    )
    feed = PoolFeed()
    readings: dict[PoolRole, RoleReading] = {}
    router: RouterReading | None = None
    for snapshot in (earlier, later):
        for role in POOL_ROLES:
            pages = tuple((p.pod, p.page) for p in snapshot.pages if p.role == role)
            readings[role], _ = feed.role(
                role,
                snapshot.at,
                RolePages(
                    replicas=pods[role],
                    ready=pods[role],
                    ready_pods=frozenset(name for name, _ in pages),
                    pages=pages,
                    window_seconds=seconds,
                    percentile=settings.percentile,
                ),
            )
        routers = [(p.pod, p.page) for p in snapshot.pages if p.role == "router"]
        router, _ = feed.routers(snapshot.at, frozenset(name for name, _ in routers), routers, seconds)
    assert router is not None
    plan = planner.decide(
        observation(
            later.at, seconds, readings["prefill"], readings["decode"], router, model.kv_capacity_tokens
        )
    )
    if plan.decode.reason == MISSING_METRICS:
        return None
    return Sizing(plan.prefill, plan.decode)
