"""Field ownership shared by the operator and the autoscaler: who owns a StatefulSet's `replicas`, and the
smallest apply that sets it.

The operator renders an autoscaled StatefulSet without `replicas`; the autoscaler's field manager
(labels.AUTOSCALER_FIELD_MANAGER) owns that field, so the two never fight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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


def replicas_document(workload: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    """The smallest apply that sets only spec.replicas of `workload` (a rendered or a stored StatefulSet)."""
    meta = workload["metadata"]
    return {
        "apiVersion": workload["apiVersion"],
        "kind": workload["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {"replicas": replicas},
    }
