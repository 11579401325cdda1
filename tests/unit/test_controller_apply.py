"""Server-side apply plumbing without a server: who owns replicas, the seed apply, REST paths."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders_examples import child, load_pool

from inferencepool.api import labels
from inferencepool.builders import pool_children
from inferencepool.builders.rollout import RoleStep, RolloutPlan
from inferencepool.controller.apply import autoscaled_role
from inferencepool.controller.references import pool_references
from inferencepool.controller.rollout import sync_autoscaled_surge
from inferencepool.kube import resource_of
from inferencepool.kube.fields import replicas_document, replicas_managers, surge_of, wanted_replicas


def managed(*entries: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {
            "managedFields": [
                {"manager": manager, "operation": "Apply", "fieldsV1": fields} for manager, fields in entries
            ]
        }
    }


def test_replicas_owners_are_read_from_managed_fields() -> None:
    template_only = {"f:spec": {"f:template": {}, "f:selector": {}}}
    assert replicas_managers(None) == set()
    assert replicas_managers(managed((labels.FIELD_MANAGER, template_only))) == set()
    both = managed(
        (labels.FIELD_MANAGER, template_only),
        (labels.AUTOSCALER_FIELD_MANAGER, {"f:spec": {"f:replicas": {}}}),
        ("kubectl", {"f:metadata": {"f:labels": {}}}),
    )
    assert replicas_managers(both) == {labels.AUTOSCALER_FIELD_MANAGER}


def test_seed_apply_touches_replicas_only() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    statefulset = child(pool, "StatefulSet", "llama-8b-decode")
    assert replicas_document(statefulset, 4) == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "llama-8b-decode", "namespace": "prod"},
        "spec": {"replicas": 4},
    }


def test_only_autoscaled_statefulsets_hand_replicas_over() -> None:
    pool = load_pool("llama-3.1-8b.yaml", decode__autoscaling=None)
    roles = {autoscaled_role(pool, c) for c in pool_children(pool)}
    assert roles == {None, "prefill"}


def test_every_rendered_kind_has_a_rest_path() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    for c in pool_children(pool):
        path = resource_of(c["apiVersion"], c["kind"]).path("prod", c["metadata"]["name"])
        assert path.endswith(f"/namespaces/prod/{path.split('/')[-2]}/{c['metadata']['name']}")
    assert (
        resource_of("apps/v1", "StatefulSet").path("ns", "x") == "/apis/apps/v1/namespaces/ns/statefulsets/x"
    )
    assert resource_of("v1", "Secret").path("ns", "s") == "/api/v1/namespaces/ns/secrets/s"
    pools = resource_of("serving.inferencepool.dev/v1alpha1", "InferencePool")
    assert pools.path("ns", "p", "status") == (
        "/apis/serving.inferencepool.dev/v1alpha1/namespaces/ns/inferencepools/p/status"
    )
    with pytest.raises(ValueError, match="no REST mapping"):
        resource_of("v1", "Node")


def test_references_a_pool_depends_on() -> None:
    refs = pool_references(load_pool("llama-3.1-8b.yaml"))
    assert [(r.kind, r.name, r.key) for r in refs] == [
        ("Secret", "hf-token", "HF_TOKEN"),
        ("PersistentVolumeClaim", "model-cache", None),
    ]
    assert pool_references(load_pool("demo-cpu.yaml")) == []


def test_a_rollouts_surge_travels_with_replicas_and_is_not_the_autoscalers() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    statefulset = child(pool, "StatefulSet", "llama-8b-decode")
    surged = replicas_document(statefulset, 4, surge=1)
    assert surged["spec"] == {"replicas": 5}
    assert surged["metadata"]["annotations"] == {labels.ANNOTATION_SURGE: "1"}
    stored = {
        **statefulset,
        "metadata": {**statefulset["metadata"], **surged["metadata"]},
        "spec": {"replicas": 5},
    }
    assert surge_of(stored) == 1 and wanted_replicas(stored) == 4
    # the autoscaler's next write of its own count keeps the surge it finds
    assert replicas_document(stored, 6)["spec"] == {"replicas": 7}
    assert replicas_document(stored, 6, surge=0)["spec"] == {"replicas": 6}
    assert "annotations" not in replicas_document(stored, 6, surge=0)["metadata"]


class RecordingKube:
    def __init__(self) -> None:
        self.applied: list[tuple[dict[str, Any], str]] = []

    def apply(self, manifest: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        self.applied.append((manifest, field_manager))
        return manifest


def test_an_autoscaled_pools_surge_is_written_under_the_autoscalers_manager() -> None:
    pool = load_pool("llama-3.1-8b.yaml", decode__autoscaling=None)  # prefill autoscales, decode does not
    stored = {
        role: {**child(pool, "StatefulSet", f"llama-8b-{role}"), "spec": {"replicas": 2}}
        for role in ("prefill", "decode")
    }
    plan = RolloutPlan("new", {"prefill": RoleStep(1, 2), "decode": RoleStep(1, 2)})
    kube = RecordingKube()
    assert sync_autoscaled_surge(kube, pool, plan, stored) == ["prefill"]  # type: ignore[arg-type]
    ((document, manager),) = kube.applied
    assert manager == labels.AUTOSCALER_FIELD_MANAGER
    assert (
        document["spec"] == {"replicas": 3}
        and document["metadata"]["annotations"][labels.ANNOTATION_SURGE] == "1"
    )
    # once written, nothing more to do; when the rollout ends the surge goes the same way
    stored["prefill"] = {
        **stored["prefill"],
        "metadata": {**stored["prefill"]["metadata"], **document["metadata"]},
        "spec": {"replicas": 3},
    }
    assert sync_autoscaled_surge(kube, pool, plan, stored) == []  # type: ignore[arg-type]
    assert sync_autoscaled_surge(kube, pool, RolloutPlan("new"), stored) == ["prefill"]  # type: ignore[arg-type]
    assert kube.applied[-1][0]["spec"] == {"replicas": 2}
