"""What every child manifest shares: names, labels, metadata, owner references, canonical serialisation.

Manifests are plain dicts in the shape the API server stores them, with every field the operator means to own
and nothing else: server-side apply then treats a re-render of the same spec as a no-op (no resourceVersion
bump). That is why lists are written in a fixed order, ports carry their protocol (part of their merge key)
and quantities are strings in canonical form.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import API_VERSION, InferencePool

Manifest = dict[str, Any]

CHECKSUM_ANNOTATION = f"{labels.GROUP}/config-checksum"


@dataclass(frozen=True)
class PoolRef:
    """The pool a child belongs to: its identity (for owner references) and where its children live."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def of(cls, pool: InferencePool) -> PoolRef:
        name, uid = pool.name(), str(pool.metadata.get("uid", ""))
        if not name:
            raise ValueError("InferencePool metadata.name is empty; children cannot be named")
        if not uid:
            raise ValueError(f"InferencePool {name} has no metadata.uid; owner references need it")
        return cls(name=name, namespace=pool.namespace(), uid=uid)


def engine_name(pool: PoolRef, role: str) -> str:
    return f"{pool.name}-{role}"


def router_name(pool: PoolRef) -> str:
    return f"{pool.name}-router"


def router_service_name(pool: PoolRef) -> str:
    """The pool's single entry point carries the pool's own name."""
    return pool.name


def lmcache_config_name(pool: PoolRef, role: str) -> str:
    return f"{pool.name}-{role}-lmcache"


def lmcache_controller_name(pool: PoolRef) -> str:
    return f"{pool.name}-lmcache-controller"


def service_host(pool: PoolRef, service: str) -> str:
    """Cluster DNS name of a Service in the pool's namespace (without the cluster domain, which varies)."""
    return f"{service}.{pool.namespace}.svc"


def selector_labels(pool: PoolRef, role: labels.Role) -> dict[str, str]:
    """Immutable selector of a workload: only the labels that identify the pool and role."""
    return {labels.LABEL_POOL: pool.name, labels.LABEL_ROLE: role}


def owner_reference(pool: PoolRef) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": labels.KIND,
        "name": pool.name,
        "uid": pool.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(
    pool: PoolRef, name: str, role: labels.Role, annotations: dict[str, str] | None = None
) -> Manifest:
    meta: Manifest = {
        "name": name,
        "namespace": pool.namespace,
        "labels": labels.standard_labels(pool.name, role),
        "ownerReferences": [owner_reference(pool)],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def checksum(*documents: Any) -> str:
    """Stable digest of configuration a pod reads at start; put on a pod template so changing it rolls the
    pods."""
    text = json.dumps(documents, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def python_hash_seed(pool: PoolRef) -> str:
    """One PYTHONHASHSEED for every LMCache process of a pool (its prefix hashes use hash()), stable across
    reconciles and operator restarts."""
    digest = hashlib.sha256(f"{pool.namespace}/{pool.name}".encode()).digest()
    return str(int.from_bytes(digest[:4], "big"))


def field_env(name: str, field_path: str) -> Manifest:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


def tcp_port(name: str, port: int) -> Manifest:
    return {"name": name, "containerPort": port, "protocol": "TCP"}


def merge_env(base: list[Manifest], overrides: list[Manifest]) -> list[Manifest]:
    """Env list with `overrides` replacing same-named entries (env is keyed by name under server-side
    apply)."""
    merged = {item["name"]: item for item in base}
    for item in overrides:
        if "name" not in item:
            raise ValueError(f"engine.extraEnv entry without a name: {item!r}")
        merged[item["name"]] = item
    return list(merged.values())


# --- Pod Security
# The router and the LMCache controller meet the Pod Security Standard "restricted": non-root, read-only root
# filesystem (an emptyDir at /tmp for scratch), no privilege escalation, every capability dropped, the
# runtime's default seccomp profile. Engines run the upstream vLLM image, which runs as root and writes caches
# under its home: they keep those, and otherwise get what "restricted" asks of capabilities, privilege
# escalation and seccomp. A pool's own securityContext settings are merged over these, key by key (and one
# level down, so `capabilities: {add: [IPC_LOCK]}` for RDMA keeps `drop: [ALL]`).
NON_ROOT_UID = 10001  # the router image's user (images/router/Dockerfile)
SCRATCH_VOLUME = "tmp"
SCRATCH_PATH = "/tmp"
_RUNTIME_DEFAULT_SECCOMP: Manifest = {"type": "RuntimeDefault"}
_NO_ESCALATION: Manifest = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def overlay(defaults: Manifest, user: Manifest) -> Manifest:
    """`user` over `defaults`: a key the user sets wins; where both are objects, merged one level down."""
    merged = copy.deepcopy(defaults)
    for key, value in copy.deepcopy(user).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def restricted_pod_security(user: Manifest | None = None) -> Manifest:
    defaults: Manifest = {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "seccompProfile": _RUNTIME_DEFAULT_SECCOMP,
    }
    return overlay(defaults, user or {})


def restricted_container_security(user: Manifest | None = None) -> Manifest:
    return overlay({**_NO_ESCALATION, "readOnlyRootFilesystem": True}, user or {})


def engine_pod_security(user: Manifest | None = None) -> Manifest:
    return overlay({"seccompProfile": _RUNTIME_DEFAULT_SECCOMP}, user or {})


def engine_container_security(user: Manifest | None = None) -> Manifest:
    return overlay(_NO_ESCALATION, user or {})


def scratch_volume() -> Manifest:
    """Writable scratch space for a container whose root filesystem is read-only."""
    return {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": "1Gi"}}


def scratch_mount() -> Manifest:
    return {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_PATH}
