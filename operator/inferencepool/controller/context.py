"""What the operator keeps in memory, in kopf's memo: operator-wide resources, and what each pool's handlers
share. All of it can be rebuilt from the cluster after a restart.

kopf gives every object a shallow copy of the operator's memo, so `memo.operator` is the one OperatorContext
and `memo.pool` belongs to one pool; kopf drops a pool's memo when the pool is deleted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from inferencepool.builders.rollout import RolloutPlan
from inferencepool.controller.status import MissingReference, ReconcileOutcome, WorkloadState
from inferencepool.kube import Kube
from inferencepool.observability.metrics import OperatorMetrics


@dataclass
class OperatorContext:
    """Operator-wide: the API server door, the threads applies run in, timings, and a reconcile counter."""

    kube: Kube
    # One pool of threads for all applies (each apply is a blocking round trip); reused, not per reconcile.
    appliers: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=16, thread_name_prefix="apply")
    )
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    # A reference that does not resolve is looked up again this often (the user may create it any time).
    retry_missing_seconds: float = 30.0
    retry_apply_seconds: float = 15.0
    # Workload events are coalesced per pool for this long before the status is recomputed and written.
    status_delay_seconds: float = 0.5
    reconciles: int = 0  # reconciles finished, for tests and the benchmark
    # The autoscalers' scrapes (made on the operator's loop at startup, closed at cleanup).
    session: aiohttp.ClientSession | None = None
    # The operator's own Prometheus metrics (served by `inferencepool operator --metrics-port`).
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)


@dataclass
class PoolMemory:
    """One pool's shared state: the reconcile handler writes the outcome, the pool's daemon composes and
    writes the status from it; child events wake the daemon."""

    outcome: ReconcileOutcome | None = None
    announced_missing: tuple[MissingReference, ...] = ()
    # Per child, when the operator's own apply last changed it (see apply.applied_at).
    apply_stamps: dict[str, str] = field(default_factory=dict)
    # Reconciles of one pool (its own handler, a repair after a child was deleted) run one at a time.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The workloads as the last apply stored them, by role: the status uses them until the indices have them.
    applied_workloads: dict[str, WorkloadState] = field(default_factory=dict)
    # The coordinated rollout's last plan (builders/rollout.py), and when a pod last moved to its revision.
    rollout: RolloutPlan | None = None
    rollout_progress_at: datetime | None = None
    deleted: bool = False
    written: dict[str, Any] | None = None  # the status document last written
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _urgent: bool = False

    def request_status(self, urgent: bool = False) -> None:
        """Ask the daemon to compose the status again: at once when `urgent` (a reconcile finished), else
        after a short delay that coalesces a burst of workload events."""
        self._urgent = self._urgent or urgent
        self._wake.set()

    async def wait(self, timeout: float, coalesce_seconds: float) -> bool:
        """Until a status request (then the coalescing delay unless urgent) or `timeout`; whether a request
        came."""
        try:
            async with asyncio.timeout(timeout):  # not wait_for, which can swallow a cancellation on 3.11
                await self._wake.wait()
        except TimeoutError:
            return False
        if not self._urgent:
            await asyncio.sleep(coalesce_seconds)
        self._wake.clear()
        self._urgent = False
        return True


def operator_context(memo: Any) -> OperatorContext:
    context = memo["operator"]
    assert isinstance(context, OperatorContext)
    return context


def pool_memory(memo: Any) -> PoolMemory:
    """The pool's memory in its kopf memo, made on first use."""
    memory = memo.get("pool")
    if memory is None:
        memory = memo["pool"] = PoolMemory()
    assert isinstance(memory, PoolMemory)
    return memory
