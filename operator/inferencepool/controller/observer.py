"""The per-pool loop, run as a kopf daemon: the autoscaler's steps, and the pool's status, composed in one
place (status.status_document) and written by one writer, under the operator's field manager.

It wakes when the autoscaler is due (at most every second), when a reconcile finished (at once) and when a
workload changed (after a short delay that coalesces a rollout's burst of events). It writes only what
changed; kopf keeps `body` up to date, so a spec change is picked up on the next round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import kopf
from pydantic import ValidationError

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import InferencePool, InferencePoolStatus
from inferencepool.autoscaler.runner import PoolAutoscaler, scrape_session
from inferencepool.builders import PoolRef, router_endpoint
from inferencepool.controller.context import OperatorContext, PoolMemory
from inferencepool.controller.events import post_event, post_ref_event
from inferencepool.controller.reconcile import reconcile
from inferencepool.controller.rollout import applied_shape, current_plan, progress_of, sync_autoscaled_surge
from inferencepool.controller.status import (
    Bottleneck,
    Observed,
    StatusInputs,
    WorkloadKey,
    WorkloadState,
    bottleneck_of,
    invalid_status_document,
    status_differs,
    status_document,
    status_events,
)
from inferencepool.kube import KubeError
from inferencepool.kube.objects import pool_reference
from inferencepool.observability.metrics import record_status

WORKLOAD_KEYS: tuple[WorkloadKey, ...] = ("prefill", "decode", "router", "lmcache-controller")
# The longest wait between rounds (when nothing is due: a spec that does not validate); `stopped` is checked
# between rounds.
IDLE_SECONDS = 1.0
# While a coordinated rollout runs, its next step is looked for at least this often (pod readiness reaches the
# daemon through its StatefulSet's status, which can lag the pod).
ROLLOUT_POLL_SECONDS = 2.0
log = logging.getLogger("inferencepool.observer")

States = Mapping[Any, Any]  # a kopf index of WorkloadState by (namespace, pool, role)


class PoolObserver:
    def __init__(
        self, context: OperatorContext, memory: PoolMemory, body: kopf.Body, workloads: list[States]
    ) -> None:
        self.context, self.memory, self.body = context, memory, body
        self._workloads = workloads
        self._scaler: PoolAutoscaler | None = None
        self._version: str | None = None  # the resourceVersion `_pool` was validated from
        self._pool: InferencePool | None = None
        self._retry = False  # the last status write failed: write again next round

    async def run(self, stopped: kopf.DaemonStopped) -> None:
        """Until kopf stops the daemon, the pool is deleted or its status can no longer be written."""
        gone, requested = False, True
        while not stopped and not self.memory.deleted:
            pool = self._current_pool()
            stepped = pool is not None and await self._step_autoscaler()
            stepped = (pool is not None and await self._step_rollout(pool)) or stepped
            # The status changes only with what it is composed from: a reconcile, a workload, a reading.
            if (requested or stepped or self._retry) and not await self._write_status(pool):
                gone = True
                break
            timeout = self._scaler.seconds_to_next() if self._scaler is not None else IDLE_SECONDS
            if self._rolling():
                timeout = min(timeout, ROLLOUT_POLL_SECONDS)
            requested = await self.memory.wait(timeout, self.context.status_delay_seconds)
        if gone or self.memory.deleted:
            meta = self.body.metadata
            self.context.metrics.forget_pool(meta.get("namespace", ""), meta.get("name", ""))

    def _current_pool(self) -> InferencePool | None:
        """The pool as kopf last saw it, validated (None if the models refuse it: reconcile reports that)."""
        version = self.body.metadata.get("resourceVersion")
        if version == self._version:
            return self._pool
        self._version = version
        try:
            self._pool = InferencePool.model_validate(dict(self.body))
        except ValidationError:
            self._pool = None
            return None
        if self._scaler is None:
            if self.context.session is None:
                self.context.session = scrape_session()
            self._scaler = PoolAutoscaler(self.context.kube, self._pool, self.context.session, post_ref_event)
        else:
            self._scaler.update(self._pool)
        return self._pool

    async def _step_autoscaler(self) -> bool:
        """Whatever of the autoscaler is due; whether anything was."""
        assert self._scaler is not None
        try:
            return await self._scaler.tick()
        except KubeError as error:
            log.warning("autoscaler %s/%s: %s", self._scaler.namespace, self._scaler.name, error)
        except Exception:  # one bad round must not stop autoscaling this pool
            log.exception("autoscaler %s/%s: round failed", self._scaler.namespace, self._scaler.name)
        return True  # it may have scaled before failing

    def _rolling(self) -> bool:
        return self.memory.rollout is not None and self.memory.rollout.active

    async def _step_rollout(self, pool: InferencePool) -> bool:
        """The coordinated rollout's next step, if one is due: a reconcile when the StatefulSets must be
        rendered anew (a partition moved, a surge came or went), the autoscaled pools' surge, and the figures
        for the status; whether anything changed."""
        if not self._rolling():
            return False
        kube = self.context.kube
        try:
            plan, stored = await asyncio.to_thread(current_plan, kube, pool)
            previous = self.memory.rollout
            changed = previous is None or progress_of(previous) != progress_of(plan)
            if previous is None or applied_shape(previous) != applied_shape(plan):
                await reconcile(self.context, self.memory, self.body, "rollout", log)
                plan, stored = await asyncio.to_thread(current_plan, kube, pool)
            elif changed:
                self.memory.rollout_progress_at = self.context.clock()
                self.memory.rollout = plan
            written = await asyncio.to_thread(
                sync_autoscaled_surge, kube, pool, self.memory.rollout or plan, stored
            )
        except (kopf.TemporaryError, kopf.PermanentError) as error:
            log.warning("rollout of %s/%s: %s", pool.namespace(), pool.name(), error)
            return True
        except KubeError as error:
            log.warning("rollout of %s/%s: %s", pool.namespace(), pool.name(), error)
            return False
        return changed or bool(written)

    async def _write_status(self, pool: InferencePool | None) -> bool:
        """Compose and write the status if it changed; False when the pool is gone."""
        meta = self.body.metadata
        if self.memory.outcome is None or meta.get("deletionTimestamp"):
            return True  # nothing reconciled yet (the status already there stands), or going away
        previous = self._previous()
        document = self._compose(pool, previous, self.context.clock())
        record_status(self.context.metrics, meta.get("namespace", ""), meta.get("name", ""), document)
        # a rollout that ended leaves the status (a write without it drops the field), which status_differs,
        # blind to fields a document omits, cannot see
        ended = "rollout" in (self.body.get("status") or {}) and "rollout" not in document
        if document == self.memory.written or (
            not ended and not status_differs(self.body.get("status"), document)
        ):
            return True
        try:
            # metadata.uid makes the write conditional: it fails rather than land on a new pool of that name.
            manifest = {**pool_reference(meta), "status": document}
            await asyncio.to_thread(self.context.kube.apply_status, manifest, labels.FIELD_MANAGER)
        except KubeError as error:
            if error.status in (404, 409):
                log.info("pool %s/%s is gone; status not written", meta.get("namespace"), meta.get("name"))
                return False
            log.warning("status of %s/%s not written: %s", meta.get("namespace"), meta.get("name"), error)
            self._retry = True
            return True
        self._retry = False
        self.memory.written = document
        for event in status_events(previous, InferencePoolStatus.model_validate(document)):
            post_event(self.body, event.type, event.reason, event.message)
        return True

    def _previous(self) -> InferencePoolStatus | None:
        """The status last written (the body may not show it yet), else the one stored."""
        try:
            return InferencePoolStatus.model_validate(self.memory.written or self.body.get("status") or {})
        except ValidationError:
            return None

    def _compose(
        self, pool: InferencePool | None, previous: InferencePoolStatus | None, now: datetime
    ) -> dict[str, Any]:
        outcome = self.memory.outcome
        assert outcome is not None
        generation = int(self.body.metadata.get("generation", 0))
        if pool is None or self._scaler is None:
            message = outcome.problem.message if outcome.problem is not None else "spec rejected"
            return invalid_status_document(previous, generation, message, now)
        inputs = StatusInputs(
            pool=pool,
            generation=generation,
            outcome=outcome,
            observed=self._observed(pool),
            endpoint=router_endpoint(PoolRef.of(pool)),
            now=now,
            figures=self._scaler.figures(),
            bottleneck=self._bottleneck(pool),
            previous=previous,
            rollout=self.memory.rollout,
            rollout_progress_at=self.memory.rollout_progress_at,
        )
        return status_document(inputs)

    def _bottleneck(self, pool: InferencePool) -> Bottleneck | None:
        """The diagnosis of the pages the autoscaler kept over its window (None: the last one stands)."""
        assert self._scaler is not None
        try:
            return bottleneck_of(pool, self._scaler.readings())
        except Exception:  # a diagnosis that fails must not stop the status being written
            log.exception("bottleneck diagnosis of %s/%s failed", pool.namespace(), pool.name())
            return None

    def _observed(self, pool: InferencePool) -> Observed:
        """The pool's workloads from the kopf indices; those the last apply stored where the indices have
        none yet."""
        workloads: dict[WorkloadKey, WorkloadState | None] = {}
        for key in WORKLOAD_KEYS:
            found = None
            for states in self._workloads:
                store = states.get((pool.namespace(), pool.name(), key))
                found = found or (next(iter(store), None) if store is not None else None)
            workloads[key] = found or self.memory.applied_workloads.get(key)
        return Observed(workloads)
