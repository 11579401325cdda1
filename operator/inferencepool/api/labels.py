"""Label and annotation keys shared by the operator, the router and the local pod runner.

Every object and pod the operator writes carries the standard app.kubernetes.io labels plus the pool and role
labels below; the router discovers engine pods with `pool_selector(name)` and reads each pod's role label.
"""

from __future__ import annotations

from typing import Final, Literal

GROUP: Final = "serving.inferencepool.dev"
VERSION: Final = "v1alpha1"
KIND: Final = "InferencePool"
PLURAL: Final = "inferencepools"
SINGULAR: Final = "inferencepool"
SHORT_NAME: Final = "pdpool"
# The fully qualified resource: what `kubectl get` resolves without doubt when the Gateway API Inference
# Extension's InferencePool (inference.networking.k8s.io, short name infpool) is installed too, where
# the plain plural `inferencepools` resolves to one of the two by discovery order.
RESOURCE: Final = f"{PLURAL}.{GROUP}"
CATEGORY: Final = "inference"
FIELD_MANAGER: Final = "inferencepool-operator"
AUTOSCALER_FIELD_MANAGER: Final = "inferencepool-autoscaler"

LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_POOL: Final = f"{GROUP}/pool"
LABEL_ROLE: Final = f"{GROUP}/role"
# On every engine pod: a hash of everything that must match for a prefill pod's KV to be valid on a decode
# pod (model, revision, dtypes, block size, image, parallel layout, connector; builders/kvcompat.py). The
# router pairs only equal values.
LABEL_KV_COMPAT: Final = f"{GROUP}/kv-compat"
# On every engine pod: the model revision it serves (an annotation: a git ref may not be a valid label value).
ANNOTATION_MODEL_REVISION: Final = f"{GROUP}/model-revision"
# On an engine StatefulSet during a coordinated rollout: how many of its spec.replicas are surge pods,
# written by whoever owns spec.replicas (the operator, or the autoscaler's field manager), in one apply.
ANNOTATION_SURGE: Final = f"{GROUP}/surge"

APP_NAME: Final = "inferencepool"
MANAGED_BY: Final = "inferencepool-operator"

Role = Literal["prefill", "decode", "router", "lmcache-controller"]
ENGINE_ROLES: Final[tuple[Role, ...]] = ("prefill", "decode")

# Set by the local pod runner (inferencepool.cluster) once a pod's process listens; kwok then marks it Ready.
ANNOTATION_PROCESS_READY: Final = "inferencepool.dev/process-ready"


def standard_labels(pool: str, role: Role) -> dict[str, str]:
    """Labels for every object and pod that belongs to `pool` in `role`."""
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: pool,
        LABEL_COMPONENT: role,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_PART_OF: APP_NAME,
        LABEL_POOL: pool,
        LABEL_ROLE: role,
    }


def pool_selector(pool: str) -> str:
    """Label selector (string form) matching every engine pod of `pool`."""
    return f"{LABEL_POOL}={pool},{LABEL_ROLE} in (prefill,decode)"
