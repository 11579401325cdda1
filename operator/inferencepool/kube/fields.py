"""Field ownership shared by the operator and the autoscaler: who owns a StatefulSet's `replicas`, and the
smallest apply that sets it.

The operator renders an autoscaled StatefulSet without `replicas`; the autoscaler's field manager
(labels.AUTOSCALER_FIELD_MANAGER) owns that field, so the two never fight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferencepool.api import labels


def replicas_managers(obj: Mapping[str, Any] | None) -> set[str]:
    """Field managers that own spec.replicas of a stored object (including writes through the scale
    subresource)."""
    if obj is None:
        return set()
    owners = set()
    for entry in obj.get("metadata", {}).get("managedFields") or []:
        spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:replicas" in spec:
            owners.add(str(entry.get("manager", "")))
    return owners


def surge_of(workload: Mapping[str, Any] | None) -> int:
    """Surge pods of a coordinated rollout counted in the stored spec.replicas (labels.ANNOTATION_SURGE)."""
    if workload is None:
        return 0
    value = (workload.get("metadata", {}).get("annotations") or {}).get(labels.ANNOTATION_SURGE, "0")
    return int(value) if str(value).isdigit() else 0


def wanted_replicas(workload: Mapping[str, Any]) -> int:
    """The stored spec.replicas without a rollout's surge: what the autoscaler or the spec asked for."""
    return max(0, int(workload.get("spec", {}).get("replicas", 0)) - surge_of(workload))


def replicas_document(workload: Mapping[str, Any], replicas: int, surge: int | None = None) -> dict[str, Any]:
    """The smallest apply that sets only spec.replicas of `workload` (a rendered or a stored StatefulSet):
    `replicas` wanted, plus the rollout's surge (by default the one `workload` records), with the surge
    annotation that says so. Both go in one apply, by one field manager, so they never disagree."""
    meta = workload["metadata"]
    surge = surge_of(workload) if surge is None else surge
    metadata: dict[str, Any] = {"name": meta["name"], "namespace": meta["namespace"]}
    if surge:
        metadata["annotations"] = {labels.ANNOTATION_SURGE: str(surge)}
    return {
        "apiVersion": workload["apiVersion"],
        "kind": workload["kind"],
        "metadata": metadata,
        "spec": {"replicas": replicas + surge},
    }
