"""Apply a pool's children with server-side apply, and hand `replicas` to the autoscaler where it scales.

One field manager (labels.FIELD_MANAGER) writes every child, with force: the operator is the only writer of
what it renders, so a conflict means someone edited a child by hand and the spec wins. An apply whose content
matches what is stored is a no-op for the API server (no resourceVersion bump), which makes a repeated
reconcile, or an operator restart, write nothing.

Replicas of an autoscaled StatefulSet belong to labels.AUTOSCALER_FIELD_MANAGER. The rendered StatefulSet then
has no `replicas`; the operator seeds the count once, under the autoscaler's manager, only while nobody owns
the field (a new StatefulSet). When a pool switches autoscaling on, the current count is first claimed for the
autoscaler, because a field its last owner drops is reset by the API server to the default of 1.
"""

from __future__ import annotations

from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, cast

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import InferencePool, PoolRole
from inferencepool.builders import Manifest
from inferencepool.kube import Kube, KubeError
from inferencepool.kube.fields import replicas_document, replicas_managers, surge_of, wanted_replicas

SPEC_ORIGIN = {
    "prefill": "spec.prefill",
    "decode": "spec.decode",
    "router": "spec.router",
    "lmcache-controller": "spec.kvCache.p2p",
}


class ChildApplyError(KubeError):
    """The API server refused one child: which one, and its answer (which names the child's field)."""

    def __init__(self, manifest: Manifest, error: KubeError) -> None:
        super().__init__(error.status, error.reason, error.message)
        self.kind, self.name = key(manifest)
        role = manifest["metadata"].get("labels", {}).get(labels.LABEL_ROLE)
        self.origin = SPEC_ORIGIN.get(role, "spec")  # where in the pool's spec the refused child comes from

    def __str__(self) -> str:
        return (
            f"{self.kind} {self.name!r} (from {self.origin}) was refused: "
            f"{self.status} {self.reason}: {self.message}"
        )


@dataclass
class ApplyReport:
    """What a reconcile did: objects whose stored state changed, and the stored objects by (kind, name)."""

    changed: list[str] = field(default_factory=list)
    stored: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


def key(manifest: Manifest) -> tuple[str, str]:
    return manifest["kind"], manifest["metadata"]["name"]


def autoscaled_role(pool: InferencePool, manifest: Manifest) -> PoolRole | None:
    """The pool role whose replicas the autoscaler owns, when `manifest` is that role's StatefulSet."""
    if manifest["kind"] != "StatefulSet":
        return None
    role = manifest["metadata"]["labels"].get(labels.LABEL_ROLE)
    if role in ("prefill", "decode") and pool.spec.pool(role).autoscales():
        return cast(PoolRole, role)
    return None


def applied_at(obj: dict[str, Any]) -> str:
    """A stamp that changes when the operator's apply changes `obj`, not when a controller writes its status.

    The object's uid (re-created?), the time of the operator's managedFields entry (whole seconds), and its
    generation, which counts spec changes, where it has one (elsewhere the resourceVersion: objects without a
    status are only written by their appliers).
    """
    meta = obj.get("metadata", {})
    version = meta.get("generation") or meta.get("resourceVersion", "")
    for entry in meta.get("managedFields") or []:
        if (
            entry.get("manager") == labels.FIELD_MANAGER
            and entry.get("operation") == "Apply"
            and not entry.get("subresource")
        ):
            return f"{meta.get('uid', '')}@{entry.get('time', '')}#{version}"
    return ""


def _cache_key(manifest: Manifest) -> str:
    meta = manifest["metadata"]
    return f"{meta['namespace']}/{manifest['kind']}/{meta['name']}"


WORKLOAD_KINDS = ("StatefulSet", "Deployment")


def apply_one(kube: Kube, pool: InferencePool, manifest: Manifest) -> dict[str, Any]:
    """Apply one child (with the replica hand-over for an autoscaled StatefulSet); returns it as stored.
    Raises ChildApplyError naming the child."""
    try:
        return _apply_one(kube, pool, manifest)
    except ChildApplyError:
        raise
    except KubeError as error:
        raise ChildApplyError(manifest, error) from error


def _apply_one(kube: Kube, pool: InferencePool, manifest: Manifest) -> dict[str, Any]:
    role = autoscaled_role(pool, manifest)
    if role is not None:
        meta = manifest["metadata"]
        before = kube.get("apps/v1", "StatefulSet", meta["namespace"], meta["name"])
        if before is not None and replicas_managers(before) <= {labels.FIELD_MANAGER}:
            # Autoscaling was just switched on: keep today's count by giving it to the autoscaler first.
            current = wanted_replicas(before) if "replicas" in before.get("spec", {}) else 1
            surge = surge_of(before)
            kube.apply(replicas_document(manifest, current, surge), labels.AUTOSCALER_FIELD_MANAGER)
    stored = kube.apply(manifest, labels.FIELD_MANAGER)
    if role is not None and not replicas_managers(stored) - {labels.FIELD_MANAGER}:
        # A new StatefulSet: nobody owns replicas yet, so seed the starting count for the autoscaler.
        seed = replicas_document(manifest, pool.spec.pool(role).initial_replicas(), 0)
        stored = kube.apply(seed, labels.AUTOSCALER_FIELD_MANAGER)
    return stored


def apply_children(
    kube: Kube,
    pool: InferencePool,
    children: list[Manifest],
    stamps: dict[str, str],
    executor: Executor | None = None,
) -> ApplyReport:
    """Apply every child; raises ChildApplyError on the first failure (the caller reports it).

    Waves, each applied concurrently (one apply is a round trip to the API server): first what the
    workloads read (ConfigMaps, Services, the Role, budgets), then the RoleBinding (RBAC checks that the Role
    it grants exists and holds no more than its creator does), then the StatefulSets and Deployments.

    `stamps` remembers, per child, when the operator's own apply last changed it (the time of its entry in
    managedFields; controllers writing status do not touch it), so the report can say which children an apply
    actually changed. A child first seen since the operator started counts as changed.
    """
    report = ApplyReport()
    waves = [
        [m for m in children if m["kind"] not in (*WORKLOAD_KINDS, "RoleBinding")],
        [m for m in children if m["kind"] == "RoleBinding"],
        [m for m in children if m["kind"] in WORKLOAD_KINDS],
    ]
    with ExitStack() as stack:
        if executor is None:
            executor = stack.enter_context(ThreadPoolExecutor(max_workers=8, thread_name_prefix="apply"))
        for wave in waves:
            for manifest, stored in zip(
                wave, executor.map(lambda m: apply_one(kube, pool, m), wave), strict=True
            ):
                report.stored[key(manifest)] = stored
                stamp = applied_at(stored)
                if stamps.get(_cache_key(manifest)) != stamp:
                    report.changed.append(f"{manifest['kind']}/{manifest['metadata']['name']}")
                    stamps[_cache_key(manifest)] = stamp
    return report
