"""Objects a pool names but does not own (the HF token Secret, the model cache PVC), and whether they
exist."""

from __future__ import annotations

from dataclasses import dataclass

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.controller.status import MissingReference
from inferencepool.kube import Kube, KubeError


@dataclass(frozen=True)
class Reference:
    kind: str
    name: str
    field: str
    key: str | None = None  # a Secret key the pods read


def pool_references(pool: InferencePool) -> list[Reference]:
    references = []
    model = pool.spec.model
    if model.token_secret is not None:
        references.append(
            Reference("Secret", model.token_secret.name, "spec.model.tokenSecret", model.token_secret.key)
        )
    if model.cache is not None:
        references.append(
            Reference(
                "PersistentVolumeClaim",
                model.cache.persistent_volume_claim,
                "spec.model.cache.persistentVolumeClaim",
            )
        )
    return references


def find_missing(kube: Kube, pool: InferencePool) -> tuple[MissingReference, ...]:
    """References that do not resolve: absent objects, or a Secret without the named key."""
    missing = []
    for ref in pool_references(pool):
        try:
            obj = kube.get("v1", ref.kind, pool.namespace(), ref.name)
        except KubeError as error:
            # The install may deny reading it (the chart's rbac.readSecrets / rbac.secretNames): then it is
            # not checked here, and a missing one shows on the pods that need it.
            if error.status == 403:
                continue
            raise
        if obj is None:
            missing.append(MissingReference(ref.kind, ref.name, ref.field))
        elif ref.key is not None and ref.key not in (obj.get("data") or {}):
            missing.append(MissingReference(ref.kind, ref.name, ref.field, f"has no key {ref.key!r}"))
    return tuple(missing)
