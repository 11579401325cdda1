"""The pool's status as a pure function of what the operator observed (no I/O, no kopf).

`compose_status(StatusInputs)` is the one place a status is made, whole, each section once by what owns it:
- observedGeneration, the Ready/Progressing/Degraded (and kstatus Stalled/Reconciling) conditions, per-pool
  replica figures and the router's endpoint: from the last reconcile's outcome and the workloads;
- each role's observed latency, last scaling decision and recommendation, the router's split and live
  threshold, and the ScalingLimited condition: the autoscaler's (autoscaler.figures.AutoscalerFigures);
- status.bottleneck and the Bottleneck condition: `bottleneck_of`, the diagnosis (inferencepool.bottleneck)
  of the pages the autoscaler read over its window; the last one stands until a new window is read;
- the strings `kubectl get` shows, formatted last.
The pool's daemon writes it (one writer, one field manager).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from inferencepool.api.v1alpha1 import (
    CONDITION_BOTTLENECK,
    CONDITION_DEGRADED,
    CONDITION_PROGRESSING,
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_SCALING_LIMITED,
    CONDITION_STALLED,
    POOL_ROLES,
    BottleneckStatus,
    InferencePool,
    InferencePoolStatus,
    PoolRole,
    PoolStatus,
    RolloutRoleStatus,
    RolloutStatus,
    RouterStatus,
)
from inferencepool.autoscaler.figures import AutoscalerFigures, RoleFigures
from inferencepool.autoscaler.histogram import Reading
from inferencepool.bottleneck.core import diagnose
from inferencepool.bottleneck.settings import settings_from_pool
from inferencepool.bottleneck.sizing import size
from inferencepool.bottleneck.status import bottleneck_condition, bottleneck_status
from inferencepool.bottleneck.window import PodPage, PodRole, Snapshot, WindowError, window
from inferencepool.builders.rollout import RolloutPlan

WorkloadKey = Literal["prefill", "decode", "router", "lmcache-controller"]


@dataclass(frozen=True)
class MissingReference:
    kind: str  # Secret, PersistentVolumeClaim
    name: str
    field: str  # where the spec names it, e.g. spec.model.tokenSecret
    problem: str = "does not exist"

    def describe(self) -> str:
        return f"{self.kind} {self.name!r} (named in {self.field}) {self.problem}"


@dataclass(frozen=True)
class SpecProblem:
    """Why a spec the API server accepted cannot be applied, as a Degraded reason and a message naming the
    field (e.g. InvalidSpec, SpecTooLarge)."""

    reason: str
    message: str


@dataclass(frozen=True)
class ReconcileOutcome:
    """What the last reconcile of a generation learnt that the workloads alone do not show."""

    generation: int
    missing: tuple[MissingReference, ...] = ()
    apply_error: str | None = None
    problem: SpecProblem | None = None


@dataclass(frozen=True)
class WorkloadState:
    """A StatefulSet or Deployment as far as readiness and rollout are concerned."""

    kind: str
    name: str
    generation: int = 0
    observed_generation: int = 0
    desired: int = 0
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    current_revision: str | None = None
    update_revision: str | None = None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> WorkloadState:
        meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status") or {}
        return cls(
            kind=str(obj.get("kind", "")),
            name=str(meta.get("name", "")),
            generation=int(meta.get("generation", 0)),
            observed_generation=int(status.get("observedGeneration", 0)),
            # The API server defaults replicas to 1; a missing value means the object is not fully formed yet.
            desired=int(spec.get("replicas", 1)),
            replicas=int(status.get("replicas", 0)),
            ready=int(status.get("readyReplicas", 0)),
            updated=int(status.get("updatedReplicas", 0)),
            current_revision=status.get("currentRevision"),
            update_revision=status.get("updateRevision"),
        )

    def rolled_out(self) -> bool:
        """The controller has seen the latest spec and every pod runs the latest template."""
        if self.observed_generation < self.generation:
            return False
        if self.updated < self.desired or self.replicas > self.desired:
            return False
        # A StatefulSet reports its old revision as current until the last pod runs the new one.
        return (
            self.kind != "StatefulSet"
            or not self.update_revision
            or self.current_revision == self.update_revision
        )

    def all_ready(self) -> bool:
        return self.ready >= self.desired


@dataclass(frozen=True)
class Observed:
    """The workloads of one pool, by what they are for; None where the object does not exist (yet)."""

    workloads: dict[WorkloadKey, WorkloadState | None] = field(default_factory=dict)

    def get(self, key: WorkloadKey) -> WorkloadState | None:
        return self.workloads.get(key)


@dataclass(frozen=True)
class ConditionValue:
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str


def expected_workloads(pool: InferencePool) -> tuple[WorkloadKey, ...]:
    keys: tuple[WorkloadKey, ...] = ("prefill", "decode", "router")
    return (*keys, "lmcache-controller") if pool.spec.p2p_enabled() else keys


def _count(state: WorkloadState | None) -> str:
    return "missing" if state is None else f"{state.ready}/{state.desired}"


def ready_condition(pool: InferencePool, observed: Observed) -> ConditionValue:
    """Ready: the pool can serve requests, i.e. the router and decode have a ready pod, and so has prefill
    where the policy sends requests through it; the per-pool figures say how far from the desired counts."""
    needed: list[tuple[WorkloadKey, str]] = [("router", "RouterUnavailable"), ("decode", "DecodeUnavailable")]
    if pool.spec.router.policy != "Colocated":
        needed.append(("prefill", "PrefillUnavailable"))
    if pool.spec.p2p_enabled():
        needed.append(("lmcache-controller", "LMCacheControllerUnavailable"))
    summary = ", ".join(f"{key} {_count(observed.get(key))}" for key in expected_workloads(pool))
    for key, reason in needed:
        state = observed.get(key)
        if state is not None and key == "prefill" and state.desired == 0:
            continue  # a prefill pool scaled to zero is a choice, not an outage: the router serves colocated
        if state is None or state.ready < 1:
            return ConditionValue("False", reason, f"no ready {key} pod ({summary})")
    return ConditionValue("True", "Serving", f"ready: {summary}")


def progressing_condition(
    pool: InferencePool, observed: Observed, generation: int, rollout: RolloutPlan | None = None
) -> ConditionValue:
    """Progressing: the operator or a workload controller is still moving towards the latest spec."""
    missing = [key for key in expected_workloads(pool) if observed.get(key) is None]
    if missing:
        return ConditionValue("True", "CreatingChildren", f"waiting for {', '.join(missing)} to be created")
    if rollout is not None and rollout.active:
        return ConditionValue("True", "RollingOutRevision", f"generation {generation}: {rollout.summary()}")
    rolling = [key for key in expected_workloads(pool) if not _state(observed, key).rolled_out()]
    if rolling:
        return ConditionValue(
            "True", "RollingOut", f"rolling out generation {generation} to {', '.join(rolling)}"
        )
    waiting = [key for key in expected_workloads(pool) if not _state(observed, key).all_ready()]
    if waiting:
        detail = ", ".join(f"{key} {_count(observed.get(key))}" for key in waiting)
        return ConditionValue("True", "WaitingForReplicas", f"pods not ready yet: {detail}")
    return ConditionValue("False", "RolloutComplete", f"generation {generation} is rolled out and ready")


def _state(observed: Observed, key: WorkloadKey) -> WorkloadState:
    state = observed.get(key)
    assert state is not None
    return state


def degraded_condition(outcome: ReconcileOutcome | None) -> ConditionValue:
    """Degraded: something only the user can fix, named so they can fix it."""
    if outcome is None:
        return ConditionValue("Unknown", "NotReconciled", "the operator has not reconciled this pool yet")
    # What stops every child from being applied comes first; missing references only stop pods starting.
    if outcome.problem is not None:
        return ConditionValue("True", outcome.problem.reason, outcome.problem.message)
    if outcome.apply_error is not None:
        return ConditionValue("True", "ApplyFailed", outcome.apply_error)
    if outcome.missing:
        kinds = {m.kind for m in outcome.missing}
        reason = (
            "MissingSecret"
            if kinds == {"Secret"}
            else "MissingPersistentVolumeClaim"
            if kinds == {"PersistentVolumeClaim"}
            else "MissingReferences"
        )
        named = "; ".join(m.describe() for m in outcome.missing)
        return ConditionValue("True", reason, f"{named}; engine pods cannot start until that is fixed")
    return ConditionValue("False", "AsExpected", "all references resolve and every child was applied")


def stalled_condition(degraded: ConditionValue) -> ConditionValue:
    """Stalled (kstatus): True exactly while Degraded is, with its reason, so GitOps tools fail the sync."""
    if degraded.status == "True":
        return degraded
    return ConditionValue("False", degraded.reason, degraded.message)


def reconciling_condition(progressing: ConditionValue, ready: ConditionValue) -> ConditionValue:
    """Reconciling (kstatus): the pool is moving to its latest spec. Waiting for new replicas of a pool that
    already serves (a scale-up) is not reconciling, so a GitOps tool keeps it Current."""
    if progressing.status != "True" or (
        progressing.reason == "WaitingForReplicas" and ready.status == "True"
    ):
        return ConditionValue("False", progressing.reason, progressing.message)
    return progressing


@dataclass(frozen=True)
class Bottleneck:
    """What the diagnosis writes: status.bottleneck (as stored) and the Bottleneck condition."""

    document: dict[str, Any]
    condition: ConditionValue


@dataclass(frozen=True)
class StatusInputs:
    """Everything the status says, as observed: the reconcile's outcome and the workloads (the operator's),
    the autoscaler's figures, a new diagnosis (None: no new window was read, the last one stands) and the
    previous status (for the conditions' transition times and that last diagnosis)."""

    pool: InferencePool
    generation: int
    outcome: ReconcileOutcome | None
    observed: Observed
    endpoint: str
    now: datetime
    figures: AutoscalerFigures = field(default_factory=AutoscalerFigures)
    bottleneck: Bottleneck | None = None
    previous: InferencePoolStatus | None = None
    # the last plan of the coordinated rollout (None: not planned since the operator started)
    rollout: RolloutPlan | None = None
    rollout_progress_at: datetime | None = None


def compose_status(inputs: StatusInputs) -> InferencePoolStatus:
    """The whole status, each section built once by what owns it, the conditions set in one pass and the
    `kubectl get` strings formatted last. Pure."""
    pool, observed, figures, now = inputs.pool, inputs.observed, inputs.figures, inputs.now
    previous = inputs.previous or InferencePoolStatus()
    generation = inputs.generation
    ready = ready_condition(pool, observed)
    rollout = inputs.rollout
    settled = rollout is not None and not rollout.active
    progressing = progressing_condition(pool, observed, generation, rollout)
    degraded = degraded_condition(inputs.outcome)
    conditions: list[tuple[str, ConditionValue, int | None]] = [
        (CONDITION_READY, ready, generation),
        (CONDITION_PROGRESSING, progressing, generation),
        (CONDITION_DEGRADED, degraded, generation),
        (CONDITION_STALLED, stalled_condition(degraded), generation),
        (CONDITION_RECONCILING, reconciling_condition(progressing, ready), generation),
    ]
    if figures.limits is not None:
        limits = figures.limits
        limited = ConditionValue("True" if limits.limited else "False", limits.reason, limits.message)
        conditions.append((CONDITION_SCALING_LIMITED, limited, None))
    bottleneck = previous.bottleneck
    if inputs.bottleneck is not None:
        bottleneck = BottleneckStatus.model_validate(inputs.bottleneck.document)
        conditions.append((CONDITION_BOTTLENECK, inputs.bottleneck.condition, None))
    setting = {condition_type for condition_type, _, _ in conditions}
    # the last diagnosis stands, with its condition, until a new window is read
    kept = setting | ({CONDITION_BOTTLENECK} if bottleneck is not None else set())
    status = InferencePoolStatus(
        observed_generation=(
            inputs.outcome.generation if inputs.outcome is not None else previous.observed_generation
        ),
        conditions=[c for c in previous.conditions if c.type in kept],
        prefill=_pool_status(pool, "prefill", observed.get("prefill"), figures.roles.get("prefill")),
        decode=_pool_status(pool, "decode", observed.get("decode"), figures.roles.get("decode")),
        router=_router_status(pool, observed.get("router"), figures, inputs.endpoint),
        bottleneck=bottleneck,
        # what every engine pod runs: known once a rollout has nothing left to do
        kv_compat=rollout.target if rollout is not None and settled else previous.kv_compat,
        model_revision=pool.spec.model.revision if settled else previous.model_revision,
        rollout=(rollout_status(pool, rollout, inputs.rollout_progress_at) if rollout is not None else None),
    )
    for condition_type, value, observed_generation in conditions:
        status.set_condition(
            condition_type, value.status, value.reason, value.message, now, observed_generation
        )
    return status.with_display()


def status_document(inputs: StatusInputs) -> dict[str, Any]:
    """The status as written (camelCase, no empty fields)."""
    document: dict[str, Any] = compose_status(inputs).model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    return document


def _pool_status(
    pool: InferencePool, role: PoolRole, state: WorkloadState | None, figures: RoleFigures | None
) -> PoolStatus:
    autoscaling = pool.spec.pool(role).autoscaling
    figures = figures or RoleFigures()
    return PoolStatus(
        replicas=state.replicas if state else 0,
        ready_replicas=state.ready if state else 0,
        desired_replicas=state.desired if state else pool.spec.pool(role).initial_replicas(),
        target_milliseconds=pool.spec.target_milliseconds(role),
        percentile=autoscaling.target.percentile if autoscaling is not None and autoscaling.enabled else None,
        observed_milliseconds=figures.observed_milliseconds,
        last_scaling=figures.last_scaling,
        recommended_replicas=figures.recommended_replicas,
    )


def rollout_status(
    pool: InferencePool, plan: RolloutPlan, progress_at: datetime | None
) -> RolloutStatus | None:
    if not plan.active:
        return None
    roles = {
        role: RolloutRoleStatus(
            updated_replicas=step.updated,
            ready_updated_replicas=step.ready_updated,
            replicas=step.replicas,
            surge=step.surge,
            partition=step.partition,
        )
        for role, step in plan.roles.items()
    }
    return RolloutStatus(
        from_revision=",".join(plan.previous),
        to_revision=plan.target,
        from_model_revision=",".join(plan.previous_model_revisions) or None,
        to_model_revision=pool.spec.model.revision,
        prefill=roles.get("prefill"),
        decode=roles.get("decode"),
        last_progress_time=progress_at,
    )


def _router_status(
    pool: InferencePool, state: WorkloadState | None, figures: AutoscalerFigures, endpoint: str
) -> RouterStatus:
    """The router's pods and endpoint; the threshold in force is the spec's, or, while it adapts, the one the
    routers report (none until they have)."""
    adaptive = pool.spec.router.adaptive_threshold.enabled
    return RouterStatus(
        endpoint=endpoint,
        replicas=state.replicas if state else 0,
        ready_replicas=state.ready if state else 0,
        prefill_threshold_tokens=figures.threshold_tokens
        if adaptive
        else pool.spec.router.prefill_threshold_tokens,
        disaggregated_percent=figures.disaggregated_percent,
        lent_percent=figures.lent_percent,
        peer_prefill_percent=figures.peer_prefill_percent,
    )


def status_differs(current: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    """Whether applying `wanted` would change anything in `current` (the live status), ignoring fields it
    omits."""
    return not _contains(current or {}, wanted)


def _contains(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(_contains(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        if not isinstance(actual, list):
            return False
        if all(isinstance(item, dict) and "type" in item for item in wanted):
            by_type = {item.get("type"): item for item in actual if isinstance(item, dict)}
            return all(_contains(by_type.get(item["type"]), item) for item in wanted)
        return len(actual) == len(wanted) and all(
            _contains(a, w) for a, w in zip(actual, wanted, strict=True)
        )
    return bool(actual == wanted)


def bottleneck_of(
    pool: InferencePool, readings: Sequence[Reading], window_seconds: float = math.inf
) -> Bottleneck | None:
    """The diagnosis of the longest stretch of `readings` (oldest first) within `window_seconds`: the first
    and last make the window, those between give the gauges (queue, batch, KV cache). None until two
    readings span a window; Unknown (NoMetrics) when no pod's page was read. Pure."""
    if len(readings) < 2:
        return None
    end = readings[-1][0]
    span = [reading for reading in readings if reading[0] >= end - window_seconds]
    if len(span) < 2:
        return None
    snapshots = [
        Snapshot(at, tuple(PodPage(pod, _pod_role(role), page) for role, pod, page in pages))
        for at, pages in span
    ]
    try:
        measured = window(snapshots[0], snapshots[-1], snapshots[1:-1])
    except WindowError as error:
        message = f"no pod's metrics could be read over the last {end - span[0][0]:.0f} s ({error})"
        document = {"phase": "Unknown", "reason": "NoMetrics", "summary": message, "advice": []}
        return Bottleneck(document, ConditionValue("Unknown", "NoMetrics", message))
    found = {role: sum(p.role == role for p in snapshots[-1].pages) for role in POOL_ROLES}
    settings = settings_from_pool(pool, {role: count for role, count in found.items() if count})
    diagnosis = diagnose(measured, settings, size(snapshots[0], snapshots[-1], settings))
    _, status, reason, message = bottleneck_condition(diagnosis)
    condition = ConditionValue(status, reason, message)
    return Bottleneck(bottleneck_status(diagnosis, measured.seconds), condition)


def _pod_role(role: str) -> PodRole:
    roles: dict[str, PodRole] = {"prefill": "prefill", "decode": "decode", "router": "router"}
    if role not in roles:
        raise ValueError(f"a reading's role must be prefill, decode or router, not {role!r}")
    return roles[role]


def invalid_status_document(
    previous: InferencePoolStatus | None, generation: int, message: str, now: datetime
) -> dict[str, Any]:
    """The status of a pool whose stored spec the models refuse: only that, as Degraded with the reason."""
    status = InferencePoolStatus(
        observed_generation=generation,
        conditions=[
            c
            for c in (previous.conditions if previous else [])
            if c.type in (CONDITION_DEGRADED, CONDITION_STALLED)
        ],
    )
    for condition_type in (CONDITION_DEGRADED, CONDITION_STALLED):
        status.set_condition(condition_type, "True", "InvalidSpec", message, now, generation)
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclass(frozen=True)
class StatusEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def status_events(previous: InferencePoolStatus | None, current: InferencePoolStatus) -> list[StatusEvent]:
    """What a user should hear about when the status moves: Ready turning True or False, ScalingLimited
    turning True."""
    events = []
    was = previous.condition(CONDITION_READY) if previous is not None else None
    ready = current.condition(CONDITION_READY)
    if ready is not None and (was is None or was.status != ready.status):
        if ready.status == "True":
            events.append(StatusEvent("Normal", "Ready", ready.message))
        elif was is not None:
            events.append(StatusEvent("Warning", "NotReady", f"{ready.reason}: {ready.message}"))
    was = previous.condition(CONDITION_SCALING_LIMITED) if previous is not None else None
    limited = current.condition(CONDITION_SCALING_LIMITED)
    if limited is not None and limited.status == "True" and (was is None or was.status != "True"):
        events.append(StatusEvent("Warning", "ScalingLimited", limited.message))
    return events
