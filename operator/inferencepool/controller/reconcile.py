"""One reconcile of a pool: validate, check, build (pure), apply (server-side), record the outcome, announce.

Run for create/update(spec)/resume of a pool and to repair a deleted child, one at a time per pool. The
outcome goes to the pool's memory, and the pool's daemon writes the status from it, in every case: a spec that
cannot be applied is Degraded with a reason naming the field, never a crash loop. The spec is never written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import API_VERSION, InferencePool
from inferencepool.builders import Manifest
from inferencepool.builders.rollout import RolloutPlan
from inferencepool.controller.apply import ApplyReport, apply_children
from inferencepool.controller.checks import rendered_children, resources_problem, size_problem
from inferencepool.controller.context import OperatorContext, PoolMemory
from inferencepool.controller.events import post_event
from inferencepool.controller.references import find_missing
from inferencepool.controller.rollout import current_plan, progress_of, rollout_events
from inferencepool.controller.status import MissingReference, ReconcileOutcome, SpecProblem, WorkloadState

Logger = logging.Logger | kopf.Logger


async def reconcile(
    context: OperatorContext, memory: PoolMemory, body: Mapping[str, Any], reason: str, logger: Logger
) -> None:
    """Raises kopf.PermanentError for a spec only the user can fix, kopf.TemporaryError to be retried."""
    meta = body["metadata"]
    with context.metrics.reconcile(meta.get("namespace", ""), meta.get("name", "")):
        async with memory.lock:
            await _reconcile(context, memory, body, reason, logger)


async def _reconcile(
    context: OperatorContext, memory: PoolMemory, body: Mapping[str, Any], reason: str, logger: Logger
) -> None:
    generation = int(body["metadata"].get("generation", 0))
    pool = _validated(memory, body, generation)
    if not await _alive(context, body):
        # kopf may still work through an event queued before the pool was deleted; applying would re-create
        # children for an owner that no longer exists.
        logger.info("pool %s/%s is gone or going; nothing to apply", pool.namespace(), pool.name())
        return
    plan, _ = await asyncio.to_thread(current_plan, context.kube, pool)
    children = _checked_children(memory, body, pool, generation, plan)
    missing = await asyncio.to_thread(find_missing, context.kube, pool)
    report = await _applied(context, memory, body, pool, children, missing, generation)
    memory.outcome = ReconcileOutcome(generation, missing)
    memory.applied_workloads = _workloads(report)
    _remember_rollout(context, memory, body, pool, plan)
    context.reconciles += 1
    _announce(body, reason, generation, len(children), report)
    _announce_missing(memory, body, missing)
    memory.request_status(urgent=True)
    logger.info("reconciled generation %d (%s): %d changed", generation, reason, len(report.changed))
    if missing:
        names = ", ".join(m.describe() for m in missing)
        raise kopf.TemporaryError(f"waiting: {names}", delay=context.retry_missing_seconds)


def _validated(memory: PoolMemory, body: Mapping[str, Any], generation: int) -> InferencePool:
    try:
        return InferencePool.model_validate(dict(body))
    except ValidationError as error:
        problem = SpecProblem("InvalidSpec", f"spec rejected: {error.errors()[0]['msg']}")
        _record_problem(memory, body, generation, problem)
        raise kopf.PermanentError(problem.message) from error


def _remember_rollout(
    context: OperatorContext,
    memory: PoolMemory,
    body: Mapping[str, Any],
    pool: InferencePool,
    plan: RolloutPlan,
) -> None:
    """Keep the plan just applied for the status and the daemon's next step; announce what moved."""
    for event in rollout_events(memory.rollout, plan, pool.spec.model.revision):
        post_event(body, event.type, event.reason, event.message)
    previous = memory.rollout
    if plan.active and (previous is None or progress_of(previous) != progress_of(plan)):
        memory.rollout_progress_at = context.clock()
    memory.rollout = plan


def _checked_children(
    memory: PoolMemory, body: Mapping[str, Any], pool: InferencePool, generation: int, plan: RolloutPlan
) -> list[Manifest]:
    """Every child, unless the spec cannot be applied: then Degraded and kopf.PermanentError."""
    children = rendered_children(pool, plan)
    problem = (
        children
        if isinstance(children, SpecProblem)
        else resources_problem(pool) or size_problem(body.get("spec") or {})
    )
    if problem is not None:
        _record_problem(memory, body, generation, problem)
        raise kopf.PermanentError(problem.message)
    assert not isinstance(children, SpecProblem)
    return children


def _record_problem(
    memory: PoolMemory, body: Mapping[str, Any], generation: int, problem: SpecProblem
) -> None:
    previous = memory.outcome
    memory.outcome = ReconcileOutcome(generation, problem=problem)
    if previous is None or previous.problem != problem:
        post_event(body, "Warning", problem.reason, problem.message)
    memory.request_status(urgent=True)


async def _applied(
    context: OperatorContext,
    memory: PoolMemory,
    body: Mapping[str, Any],
    pool: InferencePool,
    children: list[Manifest],
    missing: tuple[MissingReference, ...],
    generation: int,
) -> ApplyReport:
    """Apply every child; on failure, Degraded (ApplyFailed, naming the child) and kopf.TemporaryError."""
    try:
        return await asyncio.to_thread(
            apply_children, context.kube, pool, children, memory.apply_stamps, context.appliers
        )
    except Exception as error:  # the API server's refusal, or anything else: reported, then retried
        message = f"applying children failed: {error}"
        previous = memory.outcome
        memory.outcome = ReconcileOutcome(generation, missing, apply_error=message)
        if previous is None or previous.apply_error != message:
            post_event(body, "Warning", "ApplyFailed", message)
        memory.request_status(urgent=True)
        raise kopf.TemporaryError(message, delay=context.retry_apply_seconds) from error


async def _alive(context: OperatorContext, body: Mapping[str, Any]) -> bool:
    """Whether the pool this body describes still exists and is not being deleted."""
    meta = body["metadata"]
    live = await asyncio.to_thread(
        context.kube.get, API_VERSION, labels.KIND, meta["namespace"], meta["name"]
    )
    return (
        live is not None
        and live["metadata"].get("uid") == meta.get("uid")
        and not live["metadata"].get("deletionTimestamp")
    )


def _workloads(report: ApplyReport) -> dict[str, WorkloadState]:
    """The workloads as the apply stored them, by role (the indices may not have seen them yet)."""
    found = {}
    for (kind, _name), stored in report.stored.items():
        role = stored.get("metadata", {}).get("labels", {}).get(labels.LABEL_ROLE)
        if kind in ("StatefulSet", "Deployment") and role:
            found[str(role)] = WorkloadState.from_object(stored)
    return found


def _announce(body: Mapping[str, Any], reason: str, generation: int, count: int, report: ApplyReport) -> None:
    if reason == "create":
        post_event(body, "Normal", "Created", f"created {count} children")
    elif report.changed and reason in ("update", "repair"):
        post_event(body, "Normal", "Applied", f"generation {generation}: {', '.join(report.changed)}")


def _announce_missing(
    memory: PoolMemory, body: Mapping[str, Any], missing: tuple[MissingReference, ...]
) -> None:
    """One event per reference that does not resolve, when the set of them changes."""
    if missing and memory.announced_missing != missing:
        for reference in missing:
            kind = "MissingSecret" if reference.kind == "Secret" else "MissingPersistentVolumeClaim"
            post_event(body, "Warning", kind, reference.describe())
    memory.announced_missing = missing
