"""PodDisruptionBudgets: a voluntary disruption (node drain, cluster upgrade) takes one pod of a pool at a
time.

maxUnavailable rather than minAvailable: a pool scaled to one replica (or an autoscaler at minReplicas 1)
must not block a node drain forever.
"""

from __future__ import annotations

from inferencepool.api import labels
from inferencepool.builders.common import (
    Manifest,
    PoolRef,
    engine_name,
    metadata,
    router_name,
    selector_labels,
)


def disruption_budget(ref: PoolRef, name: str, role: labels.Role) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(ref, name, role),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(ref, role)}},
    }


def disruption_budgets(ref: PoolRef) -> list[Manifest]:
    return [
        disruption_budget(ref, engine_name(ref, "prefill"), "prefill"),
        disruption_budget(ref, engine_name(ref, "decode"), "decode"),
        disruption_budget(ref, router_name(ref), "router"),
    ]
