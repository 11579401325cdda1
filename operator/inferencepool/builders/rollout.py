"""The coordinated rollout of both engine pools when the KV-compatibility revision changes (pure).

A prefill pod's KV is only valid on a decode pod of the same revision (builders/kvcompat.py), and the router
pairs only pods of equal revision. Two StatefulSets rolling on their own would leave, for a while, new prefill
pods with no new decode pod to pair with, and each pool one pod short. Instead, each pool:

1. surges: spec.replicas is the wanted count plus one, and updateStrategy.rollingUpdate.partition the wanted
   count, so the StatefulSet controller creates one pod at the new revision (the highest ordinal) and leaves
   the others alone;
2. steps: once every pod above the highest old one runs the new revision and is Ready, and the other pool
   has a Ready new pod (so a new pair exists before any old pod goes), the partition moves down onto the
   highest old pod, which the controller replaces; one pod per pool at a time, so each pool keeps its
   wanted count of Ready pods and old pods keep pairing with old pods;
3. settles: when no old pod is left and all are Ready, the surge goes (the highest ordinal, a new pod, is
   drained like any scale-down) and the partition with it.

The plan is a function of what is observed (pods, their revision label and readiness, the stored partition),
never of remembered progress, so an operator restart resumes where the cluster is. spec.scaling.gpuBudget
bounds the surge: decode surges first (it also serves prompts directly), then prefill, each only if its GPUs
fit under the budget beside the wanted replicas. A pool without room rolls in place, one pod at a time,
behind the other pool's new pod; when neither has room, prefill goes first (its pods stop pairing until the
first new decode pod is Ready, and the router serves those prompts on decode pods directly).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import POOL_ROLES, InferencePool, PoolRole


@dataclass(frozen=True)
class PodView:
    """One engine pod as the rollout sees it."""

    ordinal: int
    kv_compat: str  # "" for a pod without the label (made before the operator wrote it)
    ready: bool  # Ready and not terminating
    model_revision: str | None = None

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodView | None:
        """None for a pod whose name does not end in a StatefulSet ordinal."""
        meta = pod.get("metadata", {})
        ordinal = str(meta.get("name", "")).rsplit("-", 1)[-1]
        if not ordinal.isdigit():
            return None
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return cls(
            ordinal=int(ordinal),
            kv_compat=str((meta.get("labels") or {}).get(labels.LABEL_KV_COMPAT, "")),
            ready=ready and not meta.get("deletionTimestamp"),
            model_revision=(meta.get("annotations") or {}).get(labels.ANNOTATION_MODEL_REVISION),
        )


@dataclass(frozen=True)
class RoleView:
    """One engine pool as stored: the replicas wanted (without any surge), its pods, its partition."""

    wanted: int
    pods: tuple[PodView, ...] = ()
    partition: int | None = None


@dataclass(frozen=True)
class RoleStep:
    """What one pool's StatefulSet is rendered with: `surge` extra replicas and the partition (None: none)."""

    surge: int = 0
    partition: int | None = None
    updated: int = 0  # pods at the new revision
    ready_updated: int = 0
    replicas: int = 0  # pods wanted now, the surge included

    @property
    def rolling(self) -> bool:
        return self.partition is not None


@dataclass(frozen=True)
class RolloutPlan:
    target: str  # the revision being rolled out
    roles: dict[PoolRole, RoleStep] = field(default_factory=dict)
    previous: tuple[str, ...] = ()  # revisions still running, oldest pods' first
    previous_model_revisions: tuple[str, ...] = ()
    no_room: tuple[PoolRole, ...] = ()  # pools that roll in place: the GPU budget leaves no surge

    @property
    def active(self) -> bool:
        return any(step.rolling for step in self.roles.values())

    def step(self, role: PoolRole) -> RoleStep:
        return self.roles.get(role, RoleStep())

    def summary(self) -> str:
        counts = ", ".join(
            f"{role} {step.updated}/{step.replicas} pods at the new revision"
            + (f" ({step.surge} surge)" if step.surge else " (no surge: in place)")
            for role, step in self.roles.items()
            if step.rolling
        )
        before = ",".join(self.previous) or "unlabelled pods"
        return f"kv-compat {before} -> {self.target}: {counts}"


def surge_room(pool: InferencePool, wanted: Mapping[PoolRole, int], rolling: set[PoolRole]) -> set[PoolRole]:
    """The rolling pools whose surge pod fits spec.scaling.gpuBudget beside the wanted replicas (decode
    first)."""
    spec = pool.spec
    budget = spec.scaling.gpu_budget if spec.scaling is not None else None
    if budget is None:
        return set(rolling)
    free = budget - sum(wanted[role] * spec.gpus_per_replica(role) for role in POOL_ROLES)
    room = set()
    for role in ("decode", "prefill"):
        if role in rolling and spec.gpus_per_replica(role) <= free:
            room.add(role)
            free -= spec.gpus_per_replica(role)
    return room


def plan_rollout(pool: InferencePool, target: str, views: Mapping[PoolRole, RoleView]) -> RolloutPlan:
    """Each pool's surge and partition for this moment of the rollout to `target` (see the module)."""
    rolling = {
        role
        for role, view in views.items()
        if view.wanted > 0
        and (
            any(p.kv_compat != target for p in view.pods if p.ordinal < view.wanted + 1)
            # a rollout under way (its partition still set) ends when its pods are all Ready
            or (view.partition is not None and not all(p.ready for p in view.pods))
        )
    }
    if not rolling:
        return RolloutPlan(target)
    wanted = {role: views[role].wanted if role in views else 0 for role in POOL_ROLES}
    room = surge_room(pool, wanted, rolling)
    new_ready = {
        role: sum(1 for p in views[role].pods if p.kv_compat == target and p.ready) if role in views else 0
        for role in POOL_ROLES
    }
    serves_disaggregated = pool.spec.router.policy != "Colocated"

    def partner_ready(role: PoolRole) -> bool:
        partner: PoolRole = "decode" if role == "prefill" else "prefill"
        if not serves_disaggregated or wanted[partner] == 0 or new_ready[partner] > 0:
            return True
        # neither pool has room to surge: prefill goes first, decode follows its first new pod
        return role == "prefill" and role not in room and partner not in room

    roles: dict[PoolRole, RoleStep] = {}
    for role in POOL_ROLES:
        view = views.get(role)
        if view is None:
            continue
        surge = 1 if role in room else 0
        count = view.wanted + surge
        pods = {p.ordinal: p for p in view.pods if p.ordinal < count}
        updated = sum(1 for p in pods.values() if p.kv_compat == target)
        ready_updated = sum(1 for p in pods.values() if p.kv_compat == target and p.ready)
        old = [ordinal for ordinal, p in pods.items() if p.kv_compat != target]
        if role not in rolling or (not old and ready_updated == count):
            roles[role] = RoleStep(updated=updated, ready_updated=ready_updated, replicas=view.wanted)
            continue
        if not old:  # every pod is new, some not Ready yet: keep the surge until they are
            partition = 0
        else:
            highest_old = max(old)
            above_ready = all(
                ordinal in pods and pods[ordinal].kv_compat == target and pods[ordinal].ready
                for ordinal in range(highest_old + 1, count)
            )
            held = max(view.partition if view.partition is not None else view.wanted, highest_old + 1)
            partition = highest_old if above_ready and partner_ready(role) else held
            # the surge ordinals always run the new revision
            partition = min(partition, view.wanted)
        roles[role] = RoleStep(surge, partition, updated, ready_updated, count)
    old_pods = [p for role in POOL_ROLES if role in views for p in views[role].pods if p.kv_compat != target]
    previous = tuple(sorted({p.kv_compat for p in old_pods if p.kv_compat}))
    model_revisions = tuple(sorted({p.model_revision for p in old_pods if p.model_revision}))
    no_room = tuple(role for role in POOL_ROLES if role in rolling and role not in room)
    return RolloutPlan(target, roles, previous, model_revisions, no_room)
