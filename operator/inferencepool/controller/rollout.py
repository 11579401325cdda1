"""Glue for the coordinated rollout (the plan itself is pure: builders/rollout.py): read what it is planned
from, sync the surge of autoscaled pools under the autoscaler's field manager, and say what changed.

Who writes what: the operator's apply writes the template, the partition and (for pools that do not
autoscale) replicas with the surge annotation; for an autoscaled pool, replicas and the surge annotation are
the autoscaler's field manager's, written together here and by the autoscaler, which keeps the surge it
finds. Both run in the pool's daemon, one after the other, so neither writes over the other's read.
"""

from __future__ import annotations

from typing import Any

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import POOL_ROLES, InferencePool, PoolRole
from inferencepool.builders import PoolRef
from inferencepool.builders.common import engine_name, selector_labels
from inferencepool.builders.kvcompat import kv_compat_hash
from inferencepool.builders.rollout import PodView, RoleView, RolloutPlan, plan_rollout
from inferencepool.controller.status import StatusEvent
from inferencepool.kube import Kube
from inferencepool.kube.fields import replicas_document, surge_of, wanted_replicas
from inferencepool.kube.objects import label_selector


def partition_of(workload: dict[str, Any]) -> int | None:
    update = workload.get("spec", {}).get("updateStrategy") or {}
    partition = (update.get("rollingUpdate") or {}).get("partition")
    return int(partition) if partition is not None else None


def observe(
    kube: Kube, pool: InferencePool
) -> tuple[dict[PoolRole, RoleView], dict[PoolRole, dict[str, Any]]]:
    """Each engine pool as the rollout sees it, and its StatefulSet as stored (pools not created yet are
    left out)."""
    ref = PoolRef.of(pool)
    views: dict[PoolRole, RoleView] = {}
    stored: dict[PoolRole, dict[str, Any]] = {}
    for role in POOL_ROLES:
        workload = kube.get("apps/v1", "StatefulSet", ref.namespace, engine_name(ref, role))
        if workload is None:
            continue
        stored[role] = workload
        pool_spec = pool.spec.pool(role)
        wanted = wanted_replicas(workload) if pool_spec.autoscales() else pool_spec.initial_replicas()
        selector = label_selector(selector_labels(ref, role))
        pods = [view for pod in kube.list("v1", "Pod", ref.namespace, selector) if (view := PodView.of(pod))]
        views[role] = RoleView(wanted, tuple(sorted(pods, key=lambda p: p.ordinal)), partition_of(workload))
    return views, stored


def current_plan(kube: Kube, pool: InferencePool) -> tuple[RolloutPlan, dict[PoolRole, dict[str, Any]]]:
    views, stored = observe(kube, pool)
    return plan_rollout(pool, kv_compat_hash(pool), views), stored


def sync_autoscaled_surge(
    kube: Kube, pool: InferencePool, plan: RolloutPlan, stored: dict[PoolRole, dict[str, Any]]
) -> list[PoolRole]:
    """Write the plan's surge into autoscaled pools' replicas (with its annotation); the roles written."""
    written: list[PoolRole] = []
    for role, workload in stored.items():
        if not pool.spec.pool(role).autoscales():
            continue
        surge = plan.step(role).surge
        if surge_of(workload) != surge:
            document = replicas_document(workload, wanted_replicas(workload), surge)
            kube.apply(document, labels.AUTOSCALER_FIELD_MANAGER)
            written.append(role)
    return written


def applied_shape(plan: RolloutPlan | None) -> tuple[Any, ...]:
    """What of a plan the StatefulSets are rendered from: a new plan of another shape needs an apply."""
    if plan is None:
        return ()
    return tuple((role, step.surge, step.partition) for role, step in sorted(plan.roles.items()))


def progress_of(plan: RolloutPlan) -> tuple[Any, ...]:
    """What moves when a rollout makes progress: its shape, and how many pods run the new revision."""
    return (
        plan.target,
        applied_shape(plan),
        tuple((r, s.updated, s.ready_updated) for r, s in plan.roles.items()),
    )


def rollout_events(
    previous: RolloutPlan | None, plan: RolloutPlan, model_revision: str | None
) -> list[StatusEvent]:
    """What a user should hear about as a rollout moves: its start, each pod moved, pools without room to
    surge, its end."""
    was_active = previous is not None and previous.active
    events: list[StatusEvent] = []
    if plan.active and not was_active:
        revision = (
            f" (model revision {', '.join(plan.previous_model_revisions) or 'default'} -> "
            f"{model_revision or 'default'})"
        )
        events.append(StatusEvent("Normal", "RolloutStarted", f"rolling out {plan.summary()}{revision}"))
        for role in plan.no_room:
            events.append(
                StatusEvent(
                    "Warning",
                    "RolloutInPlace",
                    f"spec.scaling.gpuBudget leaves no room for a {role} surge pod: {role} pods are replaced "
                    "in place, one at a time",
                )
            )
    elif plan.active and was_active and applied_shape(previous) != applied_shape(plan):
        events.append(StatusEvent("Normal", "RolloutProgressing", plan.summary()))
    elif was_active and not plan.active:
        events.append(
            StatusEvent("Normal", "RolloutComplete", f"every engine pod runs kv-compat {plan.target}")
        )
    return events
