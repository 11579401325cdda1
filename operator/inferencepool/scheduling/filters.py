"""Filters: the pods that may take a request. Each keeps the input when it would leave nothing (a request is
better served by a loaded or full pod than refused), except the KV-compatibility filter: a prefill pod whose
KV a decode pod cannot read is no prefill pod for it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from inferencepool.scheduling.endpoint import E


def load_bound(loads: Sequence[int], load_factor: float, min_load_bound: int) -> int:
    """Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018), with a floor: a pod
    below this load may take one more request, so one hot prefix cannot pile onto one pod. The floor: an
    engine batching a few requests is far from saturated, and below it a prefix hit beats balance."""
    return max(math.ceil(load_factor * (sum(loads) + 1) / max(1, len(loads))), min_load_bound)


def under_load_bound(pods: Sequence[E], load_factor: float, min_load_bound: int) -> Sequence[E]:
    bound = load_bound([pod.load for pod in pods], load_factor, min_load_bound)
    return [pod for pod in pods if pod.load < bound] or pods


def with_kv_room(pods: Sequence[E]) -> Sequence[E]:
    """An engine whose KV is full with requests waiting preempts or queues whatever it gets next: it takes new
    requests only when no other pod can."""
    return [pod for pod in pods if not pod.kv_full] or pods


def kv_compatible(pods: Sequence[E], kv_compat: str | None) -> Sequence[E]:
    """Prefill pods whose KV the decode pod can load: the same `LABEL_KV_COMPAT` value (model, revision,
    dtypes, block size, parallel layout, connector). Possibly none."""
    return [pod for pod in pods if pod.kv_compat == kv_compat]
