"""kopf indices: each pool's memory and body by (namespace, name), and the pools' workloads by
(namespace, pool, role).

kopf keeps them in step with the watch streams and drops an object's entries when it is deleted, so a child
event finds its pool's memory while the pool lives, and nothing once it is gone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import kopf

from inferencepool.api import labels
from inferencepool.controller.context import PoolMemory, pool_memory
from inferencepool.controller.status import WorkloadState

PoolKey = tuple[str, str]  # namespace, name
WORKLOAD_ROLES = ("prefill", "decode", "router", "lmcache-controller")


@dataclass(frozen=True)
class PoolEntry:
    memory: PoolMemory
    body: dict[str, Any]  # the pool as last seen, without managedFields (the largest part, read by nothing)


def pools(namespace: str | None, name: str, body: kopf.Body, memo: Any, **_: Any) -> dict[Any, PoolEntry]:
    """A pool being deleted is left out: its children are being collected, not repaired."""
    if body.metadata.get("deletionTimestamp"):
        return {}
    snapshot = copy.deepcopy(dict(body))
    snapshot["metadata"].pop("managedFields", None)
    return {(namespace or "", name): PoolEntry(pool_memory(memo), snapshot)}


def workload_states(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    pool, role = body.metadata.labels.get(labels.LABEL_POOL), body.metadata.labels.get(labels.LABEL_ROLE)
    if not pool or role not in WORKLOAD_ROLES:
        return {}
    return {(namespace, pool, role): WorkloadState.from_object(dict(body))}
