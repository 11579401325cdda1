"""Server-side apply semantics against the real API server: no-op re-apply, replica ownership hand-over."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.cluster.kube_helpers import (
    ROOT,
    create_pool,
    example,
    get_pool,
    kubectl_ok,
    resource_versions,
    settled_versions,
)

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import pool_children
from inferencepool.controller.apply import apply_children
from inferencepool.kube import Kube
from inferencepool.kube.fields import replicas_document, replicas_managers

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster


# Not one of this project's images: the pod runner leaves these pods to kwok (no local router process).
SIMULATED_ROUTER_IMAGE = "registry.invalid/router-simulated:0"


def create_example_pool(kube: Kube, namespace: str) -> dict[str, Any]:
    """The GPU example, stored; returns its document. These tests are about apply semantics: its pods hold no
    GPUs of the fake nodes and its router is left to kwok."""
    document = example("llama-3.1-8b.yaml")
    document["spec"]["router"]["image"] = SIMULATED_ROUTER_IMAGE
    for role in ("prefill", "decode"):
        document["spec"][role]["gpusPerReplica"] = 0
        document["spec"][role]["scheduling"] = {}
    create_pool(kube, namespace, document)
    return document


def pool_model(kube: Kube, namespace: str, spec_changes: dict[str, Any] | None = None) -> InferencePool:
    stored = get_pool(kube, namespace, "llama-8b")
    assert stored is not None
    if spec_changes:
        stored["spec"] = {**stored["spec"], **spec_changes}
    return InferencePool.model_validate(stored)


def statefulset(kube: Kube, namespace: str, role: str) -> dict[str, Any]:
    found = kube.get("apps/v1", "StatefulSet", namespace, f"llama-8b-{role}")
    assert found is not None
    return found


def test_reapply_is_a_noop_and_autoscaler_keeps_replicas(
    crd_installed: None, admin_kube: Kube, namespace: str
) -> None:
    create_example_pool(admin_kube, namespace)
    pool = pool_model(admin_kube, namespace)
    stamps: dict[str, str] = {}

    report = apply_children(admin_kube, pool, pool_children(pool), stamps)
    assert len(report.changed) == len(pool_children(pool)) == 17
    for role, initial in (("prefill", 2), ("decode", 4)):
        sts = statefulset(admin_kube, namespace, role)
        assert sts["spec"]["replicas"] == initial
        assert replicas_managers(sts) == {labels.AUTOSCALER_FIELD_MANAGER}

    # Same spec again: the API server stores nothing new.
    before = settled_versions(admin_kube, namespace, "llama-8b")
    again = apply_children(admin_kube, pool, pool_children(pool), stamps)
    assert resource_versions(admin_kube, namespace, "llama-8b") == before
    assert again.changed == []

    # The autoscaler moves decode to 6; the operator's next apply leaves that alone.
    decode_manifest = next(
        c
        for c in pool_children(pool)
        if c["metadata"]["name"] == "llama-8b-decode" and c["kind"] == "StatefulSet"
    )
    admin_kube.apply(replicas_document(decode_manifest, 6), labels.AUTOSCALER_FIELD_MANAGER)
    apply_children(admin_kube, pool, pool_children(pool), stamps)
    assert statefulset(admin_kube, namespace, "decode")["spec"]["replicas"] == 6


def test_switching_autoscaling_off_and_on_hands_replicas_over_without_a_dip(
    crd_installed: None, admin_kube: Kube, namespace: str
) -> None:
    document = create_example_pool(admin_kube, namespace)
    stamps: dict[str, str] = {}
    autoscaled = pool_model(admin_kube, namespace)
    apply_children(admin_kube, autoscaled, pool_children(autoscaled), stamps)

    decode = dict(document["spec"]["decode"])
    pinned = pool_model(
        admin_kube,
        namespace,
        {"decode": {**decode, "replicas": 3, "autoscaling": {**decode["autoscaling"], "enabled": False}}},
    )
    apply_children(admin_kube, pinned, pool_children(pinned), stamps)
    sts = statefulset(admin_kube, namespace, "decode")
    assert sts["spec"]["replicas"] == 3
    assert replicas_managers(sts) == {labels.FIELD_MANAGER}

    generation = sts["metadata"]["generation"]
    back_on = pool_model(admin_kube, namespace, {"decode": {**decode, "replicas": 3}})
    apply_children(admin_kube, back_on, pool_children(back_on), stamps)
    sts = statefulset(admin_kube, namespace, "decode")
    assert sts["spec"]["replicas"] == 3
    assert replicas_managers(sts) == {labels.AUTOSCALER_FIELD_MANAGER}
    # Had the count been dropped and re-seeded, spec.replicas would have changed twice (3 -> 1 -> 3).
    assert sts["metadata"]["generation"] == generation


def test_new_engine_image_changes_both_templates(
    crd_installed: None, admin_kube: Kube, namespace: str
) -> None:
    document = create_example_pool(admin_kube, namespace)
    stamps: dict[str, str] = {}
    pool = pool_model(admin_kube, namespace)
    apply_children(admin_kube, pool, pool_children(pool), stamps)
    generations = {
        r: statefulset(admin_kube, namespace, r)["metadata"]["generation"] for r in ("prefill", "decode")
    }

    newer = pool_model(
        admin_kube, namespace, {"engine": {**document["spec"]["engine"], "image": "vllm/vllm-openai:v0.34.0"}}
    )
    report = apply_children(admin_kube, newer, pool_children(newer), stamps)
    assert {"StatefulSet/llama-8b-prefill", "StatefulSet/llama-8b-decode"} <= set(report.changed)
    for role in ("prefill", "decode"):
        sts = statefulset(admin_kube, namespace, role)
        assert sts["metadata"]["generation"] == generations[role] + 1
        assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.34.0"


def test_install_manifests_are_accepted_by_the_api_server(cluster: TestCluster, crd_installed: None) -> None:
    deploy = ROOT / "deploy" / "operator"
    kubectl_ok(cluster, "apply", "--server-side", "-f", str(deploy / "rbac.yaml"))
    result = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", str(deploy / "deployment.yaml")
    )
    assert result.returncode == 0, result.stderr
    assert "inferencepool-operator" in result.stdout
