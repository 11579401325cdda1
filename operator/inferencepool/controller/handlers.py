"""Thin kopf handlers: build (pure) -> apply (server-side) -> status (pure) -> events.

- create/update(spec)/resume of an InferencePool: render every child and apply it under the operator's field
  manager with an owner reference to the pool (garbage collection deletes them with it: no finalizer).
- events of the pool's StatefulSets and Deployments: recompute the pool's status from in-memory indices of
  those workloads; a child deleted by hand is applied again.
- a Secret or PVC the spec names that does not resolve: Degraded with its name, an event, and a retry later
  (kopf's TemporaryError), never a crash loop. The spec is never written.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from pydantic import ValidationError

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import API_VERSION, CONDITION_READY, InferencePool, InferencePoolStatus
from inferencepool.autoscaler.runner import Autoscalers
from inferencepool.builders import Manifest, PoolRef, pool_children, router_endpoint
from inferencepool.controller.apply import apply_children
from inferencepool.controller.references import find_missing
from inferencepool.controller.status import (
    MissingReference,
    Observed,
    ReconcileOutcome,
    WorkloadKey,
    WorkloadState,
    compute_status,
    operator_status_document,
    status_differs,
)
from inferencepool.kube import Kube, KubeError

CHILD_FILTER = {labels.LABEL_MANAGED_BY: labels.MANAGED_BY, labels.LABEL_PART_OF: labels.APP_NAME}
WORKLOAD_KEYS: tuple[WorkloadKey, ...] = ("prefill", "decode", "router", "lmcache-controller")

PoolKey = tuple[str, str]  # namespace, name
log = logging.getLogger(__name__)


@dataclass
class OperatorState:
    """What the operator keeps in memory; all of it can be rebuilt from the cluster after a restart."""

    kube: Kube
    # One pool of threads for all applies (each apply is a blocking round trip); threads are reused, not
    # started per reconcile.
    appliers: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=16, thread_name_prefix="apply")
    )
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    outcomes: dict[PoolKey, ReconcileOutcome] = field(default_factory=dict)
    announced_missing: dict[PoolKey, tuple[MissingReference, ...]] = field(default_factory=dict)
    apply_stamps: dict[PoolKey, dict[str, str]] = field(default_factory=dict)
    locks: dict[PoolKey, asyncio.Lock] = field(default_factory=dict)
    reconciles: int = 0  # reconciles finished, for tests and the benchmark
    # Workload events are coalesced per pool for this long before the status is recomputed and written.
    status_delay_seconds: float = 0.5
    pending_refresh: set[PoolKey] = field(default_factory=set)
    background: set[asyncio.Task[None]] = field(default_factory=set)
    # uids of pools that are gone: late events about them (and their children) must not write anything.
    gone: set[str] = field(default_factory=set)
    # A reference that does not resolve is looked up again this often (the user may create it any time).
    retry_missing_seconds: float = 30.0
    retry_apply_seconds: float = 15.0
    # Made on the operator's event loop by the first reconcile of an autoscaled pool.
    autoscalers: Autoscalers | None = None

    def scalers(self) -> Autoscalers:
        if self.autoscalers is None:
            self.autoscalers = Autoscalers(self.kube, post_ref_event)
        return self.autoscalers

    def lock(self, key: PoolKey) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def forget(self, key: PoolKey, uid: str) -> None:
        """A pool was deleted: drop what is kept about it, and ignore anything still in flight for it."""
        self.outcomes.pop(key, None)
        self.announced_missing.pop(key, None)
        self.locks.pop(key, None)
        self.apply_stamps.pop(key, None)
        self.gone.add(uid)


def pool_object_ref(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
    }


def post_event(body: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
    post_ref_event(pool_object_ref(body), event_type, reason, message)


def post_ref_event(ref: dict[str, Any], event_type: str, reason: str, message: str) -> None:
    kopf.event(kopf.Body(cast(kopf.RawBody, ref)), type=event_type, reason=reason, message=message)


def display_is_stale(body: Mapping[str, Any]) -> bool:
    """Whether the kubectl columns lag the figures (the autoscaler wrote a new latency, say)."""
    try:
        status = InferencePoolStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return False
    return status.display is not None and status.with_display().display != status.display


def observed_from(
    states: Mapping[Any, Any],
    namespace: str,
    pool: str,
    fresh: Mapping[WorkloadKey, WorkloadState] | None = None,
) -> Observed:
    """Workloads of one pool from the kopf indices, overridden by states just returned by an apply."""
    workloads: dict[WorkloadKey, WorkloadState | None] = {}
    for key in WORKLOAD_KEYS:
        store = states.get((namespace, pool, key))
        workloads[key] = next(iter(store), None) if store is not None else None
    if fresh:
        workloads.update(fresh)
    return Observed(workloads)


def register(registry: kopf.OperatorRegistry, state: OperatorState) -> None:
    """Attach every handler to `registry` (no global registry, so tests and the CLI can run several)."""
    group, version, plural = labels.GROUP, labels.VERSION, labels.PLURAL

    # Handlers defined in this function get qualified names; kopf passes an index to handlers under its id.
    @kopf.index(group, version, plural, id="pool_bodies", registry=registry)
    def pool_bodies(
        namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> dict[PoolKey, dict[str, Any]]:
        snapshot = copy.deepcopy(dict(body))
        snapshot["metadata"].pop("managedFields", None)  # the largest part, and nothing here reads it
        return {(namespace or "", name): snapshot}

    def workload_index(namespace: str | None, body: kopf.Body) -> dict[Any, WorkloadState]:
        pool, role = body.metadata.labels.get(labels.LABEL_POOL), body.metadata.labels.get(labels.LABEL_ROLE)
        if not pool or role not in WORKLOAD_KEYS:
            return {}
        return {(namespace, pool, role): WorkloadState.from_object(dict(body))}

    @kopf.index("apps", "v1", "statefulsets", labels=CHILD_FILTER, id="statefulset_states", registry=registry)
    def statefulset_states(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, WorkloadState]:
        return workload_index(namespace, body)

    @kopf.index("apps", "v1", "deployments", labels=CHILD_FILTER, id="deployment_states", registry=registry)
    def deployment_states(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, WorkloadState]:
        return workload_index(namespace, body)

    async def refresh_status(
        body: Mapping[str, Any], observed: Observed, logger: logging.Logger | kopf.Logger
    ) -> None:
        meta = body["metadata"]
        key: PoolKey = (meta["namespace"], meta["name"])
        if meta.get("uid") in state.gone:
            return
        try:
            pool = InferencePool.model_validate(dict(body))
        except ValidationError:
            return  # reported by the reconcile handler as Degraded/InvalidSpec
        async with state.lock(key):
            previous = pool.status
            status = compute_status(
                pool,
                int(meta.get("generation", 0)),
                state.outcomes.get(key),
                observed,
                router_endpoint(PoolRef(meta["name"], meta["namespace"], str(meta.get("uid", "")))),
                state.clock(),
            )
            document = operator_status_document(pool, status)
            if not status_differs(body.get("status"), document):
                return
            # metadata.uid makes the write conditional: it fails rather than land on a new pool of that name.
            manifest = {**pool_object_ref(body), "status": document}
            try:
                await asyncio.to_thread(state.kube.apply_status, manifest, labels.FIELD_MANAGER)
            except KubeError as error:
                if error.status in (404, 409):
                    logger.info("pool %s/%s is gone; status not written", *key)
                    state.gone.add(str(meta.get("uid")))
                    return
                raise
        was_ready = previous.condition(CONDITION_READY) if previous is not None else None
        now_ready = status.condition(CONDITION_READY)
        if now_ready is not None and (was_ready is None or was_ready.status != now_ready.status):
            if now_ready.status == "True":
                post_event(body, "Normal", "Ready", now_ready.message)
            elif was_ready is not None:
                post_event(body, "Warning", "NotReady", f"{now_ready.reason}: {now_ready.message}")
        logger.debug("status applied: %s", document.get("display"))

    async def reconcile(
        body: kopf.Body,
        reason: str,
        logger: kopf.Logger,
        statefulset_states: kopf.Index[Any, WorkloadState],
        deployment_states: kopf.Index[Any, WorkloadState],
    ) -> None:
        meta = body["metadata"]
        key: PoolKey = (meta["namespace"], meta["name"])
        generation = int(meta.get("generation", 0))
        previous_outcome = state.outcomes.get(key)
        try:
            pool = InferencePool.model_validate(dict(body))
        except ValidationError as error:
            message = f"spec rejected: {error.errors()[0]['msg']}"
            state.outcomes[key] = ReconcileOutcome(generation, apply_error=message)
            post_event(body, "Warning", "InvalidSpec", message)
            raise kopf.PermanentError(message) from error
        # kopf may still work through an event queued before the pool was deleted; applying would re-create
        # children for an owner that no longer exists.
        live = await asyncio.to_thread(state.kube.get, API_VERSION, labels.KIND, key[0], key[1])
        if live is None or live["metadata"].get("uid") != meta.get("uid"):
            logger.info("pool %s/%s is gone; nothing to apply", *key)
            state.gone.add(str(meta.get("uid")))
            return
        children: list[Manifest] = pool_children(pool)
        missing = await asyncio.to_thread(find_missing, state.kube, pool)
        try:
            report = await asyncio.to_thread(
                apply_children,
                state.kube,
                pool,
                children,
                state.apply_stamps.setdefault(key, {}),
                state.appliers,
            )
        except KubeError as error:
            message = f"applying children failed: {error}"
            state.outcomes[key] = ReconcileOutcome(generation, missing, apply_error=message)
            if previous_outcome is None or previous_outcome.apply_error != message:
                post_event(body, "Warning", "ApplyFailed", message)
            raise kopf.TemporaryError(message, delay=state.retry_apply_seconds) from error
        outcome = ReconcileOutcome(generation, missing)
        state.outcomes[key] = outcome
        state.scalers().sync(pool)
        state.reconciles += 1
        if reason == "create":
            post_event(body, "Normal", "Created", f"created {len(children)} children")
        elif report.changed and reason in ("update", "repair"):
            post_event(body, "Normal", "Applied", f"generation {generation}: {', '.join(report.changed)}")
        if not missing:
            state.announced_missing.pop(key, None)
        elif state.announced_missing.get(key) != missing:
            state.announced_missing[key] = missing
            for reference in missing:
                kind = "MissingSecret" if reference.kind == "Secret" else "MissingPersistentVolumeClaim"
                post_event(body, "Warning", kind, reference.describe())
        fresh: dict[WorkloadKey, WorkloadState] = {}
        for (kind, _name), stored in report.stored.items():
            role = stored.get("metadata", {}).get("labels", {}).get(labels.LABEL_ROLE)
            if kind in ("StatefulSet", "Deployment") and role in WORKLOAD_KEYS:
                fresh[role] = WorkloadState.from_object(stored)
        states = {**dict(statefulset_states), **dict(deployment_states)}
        await refresh_status(body, observed_from(states, key[0], key[1], fresh), logger)
        logger.info("reconciled generation %d (%s): %d changed", generation, reason, len(report.changed))
        if missing:
            names = ", ".join(m.describe() for m in missing)
            raise kopf.TemporaryError(f"waiting: {names}", delay=state.retry_missing_seconds)

    @kopf.on.resume(group, version, plural, id="reconcile", registry=registry)
    @kopf.on.create(group, version, plural, id="reconcile", registry=registry)
    @kopf.on.update(group, version, plural, field="spec", id="reconcile", registry=registry)
    async def pool_changed(body: kopf.Body, reason: str, logger: kopf.Logger, **kwargs: Any) -> None:
        # kopf passes every index as a keyword argument named after its function.
        await reconcile(body, str(reason), logger, kwargs["statefulset_states"], kwargs["deployment_states"])

    async def child_changed(
        event: kopf.RawEvent,
        namespace: str,
        child: kopf.Body,
        logger: kopf.Logger,
        pool_bodies: kopf.Index[PoolKey, dict[str, Any]],
        statefulset_states: kopf.Index[Any, WorkloadState],
        deployment_states: kopf.Index[Any, WorkloadState],
    ) -> None:
        pool_name = child.metadata.labels.get(labels.LABEL_POOL)
        if not pool_name:
            return
        pool_store = pool_bodies.get((namespace, pool_name))
        body = next(iter(pool_store), None) if pool_store is not None else None
        if (
            body is None
            or body["metadata"].get("deletionTimestamp")
            or body["metadata"].get("uid") in state.gone
        ):
            return  # the pool is gone or going: garbage collection is removing its children
        if event.get("type") == "DELETED":
            live = await asyncio.to_thread(state.kube.get, API_VERSION, labels.KIND, namespace, pool_name)
            if live is not None and not live["metadata"].get("deletionTimestamp"):
                logger.info("a child of %s was deleted; applying the pool again", pool_name)
                try:
                    await reconcile(
                        kopf.Body(cast(kopf.RawBody, live)),
                        "repair",
                        logger,
                        statefulset_states,
                        deployment_states,
                    )
                except (kopf.TemporaryError, kopf.PermanentError) as error:
                    logger.warning("repair of %s incomplete: %s", pool_name, error)
                return
        schedule_refresh((namespace, pool_name), pool_bodies, statefulset_states, deployment_states)

    def schedule_refresh(
        key: PoolKey,
        pool_bodies: kopf.Index[PoolKey, dict[str, Any]],
        statefulset_states: kopf.Index[Any, WorkloadState],
        deployment_states: kopf.Index[Any, WorkloadState],
    ) -> None:
        """Refresh a pool's status shortly, once for a burst of workload events (a rollout of N pods sends
        several per pod); the indices are live, so the refresh sees the state at the time it runs."""
        if key in state.pending_refresh:
            return
        state.pending_refresh.add(key)

        async def refresh_later() -> None:
            await asyncio.sleep(state.status_delay_seconds)
            state.pending_refresh.discard(key)  # events from now on need a refresh after this one
            store = pool_bodies.get(key)
            body = next(iter(store), None) if store is not None else None
            if body is None or body["metadata"].get("uid") in state.gone:
                return
            states = {**dict(statefulset_states), **dict(deployment_states)}
            await refresh_status(body, observed_from(states, *key), log)

        task = asyncio.create_task(refresh_later(), name=f"status {key[0]}/{key[1]}")
        state.background.add(task)
        task.add_done_callback(finished)

    def finished(task: asyncio.Task[None]) -> None:
        state.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("status refresh %s failed", task.get_name(), exc_info=task.exception())

    @kopf.on.event(group, version, plural, id="pool_event", registry=registry)
    async def pool_event(
        event: kopf.RawEvent, namespace: str | None, name: str, uid: str, body: kopf.Body, **kwargs: Any
    ) -> None:
        key = (namespace or "", name)
        if event.get("type") == "DELETED":
            state.forget(key, uid)
            if state.autoscalers is not None:
                state.autoscalers.stop(*key)
        elif display_is_stale(body):
            indices = (kwargs["pool_bodies"], kwargs["statefulset_states"], kwargs["deployment_states"])
            schedule_refresh(key, *indices)

    @kopf.on.event("apps", "v1", "statefulsets", labels=CHILD_FILTER, id="workload", registry=registry)
    @kopf.on.event("apps", "v1", "deployments", labels=CHILD_FILTER, id="workload", registry=registry)
    async def workload_changed(
        event: kopf.RawEvent, namespace: str | None, body: kopf.Body, logger: kopf.Logger, **kwargs: Any
    ) -> None:
        indices = (kwargs["pool_bodies"], kwargs["statefulset_states"], kwargs["deployment_states"])
        await child_changed(event, namespace or "", body, logger, *indices)

    # Keep references so linters see the handlers as used (kopf holds them through the registry).
    _ = (pool_bodies, statefulset_states, deployment_states, pool_changed, pool_event, workload_changed)
