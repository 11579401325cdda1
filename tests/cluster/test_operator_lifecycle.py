"""The operator (kopf, in-process, with the RBAC an install grants) against the local control plane."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.cluster.kube_helpers import (
    EXAMPLES,
    children_of,
    condition,
    event_reasons,
    example,
    get_pool,
    kubectl_ok,
    patch_spec,
    settled_versions,
    wait_condition,
)
from tests.support.cluster import eventually

from inferencepool.api import labels
from inferencepool.controller.context import OperatorContext
from inferencepool.controller.runtime import operator_in_thread
from inferencepool.kube import Kube
from inferencepool.kube.fields import replicas_managers

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster


EXPECTED_CHILDREN = {
    "StatefulSet/llama-8b-prefill",
    "StatefulSet/llama-8b-decode",
    "Service/llama-8b-prefill",
    "Service/llama-8b-decode",
    "ConfigMap/llama-8b-prefill-lmcache",
    "ConfigMap/llama-8b-decode-lmcache",
    "Deployment/llama-8b-router",
    "Service/llama-8b",
    "ConfigMap/llama-8b-router",
    "ServiceAccount/llama-8b-router",
    "Role/llama-8b-router",
    "RoleBinding/llama-8b-router",
    "Deployment/llama-8b-lmcache-controller",
    "Service/llama-8b-lmcache-controller",
    "PodDisruptionBudget/llama-8b-prefill",
    "PodDisruptionBudget/llama-8b-decode",
    "PodDisruptionBudget/llama-8b-router",
}


def install_references(cluster: TestCluster, namespace: str) -> None:
    """What the GPU example needs besides itself: the HF token Secret and a bound model-cache PVC."""
    kubectl_ok(
        cluster, "-n", namespace, "create", "secret", "generic", "hf-token", "--from-literal=HF_TOKEN=hf_test"
    )
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"model-cache-{namespace}"},
        "spec": {
            "capacity": {"storage": "100Gi"},
            "accessModes": ["ReadWriteMany"],
            "hostPath": {"path": f"/tmp/{namespace}"},
            "storageClassName": "",
            "claimRef": {"namespace": namespace, "name": "model-cache"},
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "model-cache", "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": f"model-cache-{namespace}",
            "resources": {"requests": {"storage": "100Gi"}},
        },
    }
    kubectl_ok(
        cluster,
        "apply",
        "-f",
        "-",
        input_text=json.dumps({"kind": "List", "apiVersion": "v1", "items": [volume, claim]}),
    )


def kinds_and_names(children: list[dict[str, Any]]) -> set[str]:
    return {f"{c['kind']}/{c['metadata']['name']}" for c in children}


def printed_columns(cluster: TestCluster, namespace: str) -> dict[str, str]:
    table = kubectl_ok(cluster, "-n", namespace, "get", "pdpool")
    header, row = table.splitlines()[:2]
    return dict(zip(header.split(), row.split(), strict=True))


def test_gpu_example_becomes_ready_is_idempotent_rolls_and_is_collected(
    cluster: TestCluster,
    gpu_nodes_labelled: None,
    crd_installed: None,
    operator_kubeconfig: Path,
    admin_kube: Kube,
    namespace: str,
) -> None:
    install_references(cluster, namespace)
    try:
        run_gpu_example(cluster, operator_kubeconfig, admin_kube, namespace)
    finally:
        kubectl_ok(cluster, "delete", "pv", f"model-cache-{namespace}", "--wait=false")


def run_gpu_example(
    cluster: TestCluster, operator_kubeconfig: Path, admin_kube: Kube, namespace: str
) -> None:
    with operator_in_thread(str(operator_kubeconfig), [namespace], retry_seconds=2.0) as state:
        kubectl_ok(cluster, "-n", namespace, "apply", "-f", str(EXAMPLES / "llama-3.1-8b.yaml"))
        pool = get_pool(admin_kube, namespace, "llama-8b")
        assert pool is not None
        uid = pool["metadata"]["uid"]

        # Every child exists, owned by the pool.
        children = eventually(
            lambda: (
                (found := children_of(admin_kube, namespace, "llama-8b"))
                and kinds_and_names(found) == EXPECTED_CHILDREN
                and found
            ),
            60,
            "every child of llama-8b",
        )
        for c in children:
            (owner,) = c["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
                "InferencePool",
                "llama-8b",
                uid,
                True,
            )
            assert c["metadata"]["labels"][labels.LABEL_MANAGED_BY] == labels.MANAGED_BY

        # Autoscaled pools: replicas seeded for the autoscaler, which alone owns the field.
        for role, initial in (("prefill", 2), ("decode", 4)):
            sts = admin_kube.get("apps/v1", "StatefulSet", namespace, f"llama-8b-{role}")
            assert sts is not None and sts["spec"]["replicas"] == initial
            assert replicas_managers(sts) == {labels.AUTOSCALER_FIELD_MANAGER}

        # Pods come up (kwok; the router runs as a local process) and the pool says so.
        ready = wait_condition(admin_kube, namespace, "llama-8b", "Ready", "True", timeout=120)
        assert ready["reason"] == "Serving"
        wait_condition(admin_kube, namespace, "llama-8b", "Progressing", "False", timeout=60)
        degraded = condition(get_pool(admin_kube, namespace, "llama-8b"), "Degraded")
        assert degraded is not None and (degraded["status"], degraded["reason"]) == ("False", "AsExpected")
        columns = printed_columns(cluster, namespace)
        assert columns["READY"] == "True"
        assert (columns["PREFILL"], columns["DECODE"]) == ("2/2", "4/4")
        assert (columns["TTFT"], columns["ITL"]) == ("-/800ms", "-/40ms")
        status = get_pool(admin_kube, namespace, "llama-8b")["status"]  # type: ignore[index]
        assert status["observedGeneration"] == pool["metadata"]["generation"]
        assert status["router"]["endpoint"] == f"http://llama-8b.{namespace}.svc"
        eventually(
            lambda: {"Created", "Ready"} <= set(event_reasons(admin_kube, namespace, "llama-8b")),
            10,
            "Created and Ready events",
        )
        # The operator never writes the spec.
        assert get_pool(admin_kube, namespace, "llama-8b")["metadata"]["generation"] == 1  # type: ignore[index]
        assert not get_pool(admin_kube, namespace, "llama-8b")["metadata"].get("finalizers")  # type: ignore[index]
        settled = settled_versions(admin_kube, namespace, "llama-8b")
        reconciles = state.reconciles

    # A restarted operator resumes (a second reconcile of the same spec) and writes nothing.
    with operator_in_thread(str(operator_kubeconfig), [namespace], retry_seconds=2.0) as state:
        eventually(lambda: state.reconciles >= 1, 60, "the resumed reconcile")
        assert settled_versions(admin_kube, namespace, "llama-8b") == settled
        assert reconciles >= 1

        # A new engine image rolls both StatefulSets.
        patch_spec(cluster, namespace, "llama-8b", {"engine": {"image": "vllm/vllm-openai:v0.34.0"}})

        def rolled(role: str) -> bool:
            sts = admin_kube.get("apps/v1", "StatefulSet", namespace, f"llama-8b-{role}")
            if sts is None:
                return False
            image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
            status = sts.get("status", {})
            return (
                image == "vllm/vllm-openai:v0.34.0"
                and status.get("updateRevision") is not None
                and status.get("currentRevision") == status.get("updateRevision")
                and status.get("updatedReplicas") == sts["spec"]["replicas"]
            )

        # A rolling update replaces pods one by one, each after its successor is Ready: minutes under load.
        eventually(lambda: rolled("prefill") and rolled("decode"), 300, "both pools rolled to the new image")
        selector = f"{labels.LABEL_POOL}=llama-8b,{labels.LABEL_ROLE} in (prefill,decode)"

        seen: list[dict[str, str]] = []

        def all_on_new_image() -> bool:
            listing = kubectl_ok(cluster, "-n", namespace, "get", "pods", "-l", selector, "-o", "json")
            pods = {
                p["metadata"]["name"]: f"{p['spec']['containers'][0]['image']} {p['status'].get('phase')}"
                + (" deleting" if p["metadata"].get("deletionTimestamp") else "")
                for p in json.loads(listing)["items"]
            }
            seen[:] = [pods]
            return len(pods) == 6 and all(v == "vllm/vllm-openai:v0.34.0 Running" for v in pods.values())

        try:
            eventually(all_on_new_image, 60, "6 engine pods on the new image")
        except AssertionError as error:
            raise AssertionError(f"{error}; pods: {seen}") from None
        eventually(
            lambda: (
                (p := get_pool(admin_kube, namespace, "llama-8b")) is not None
                and p["status"]["observedGeneration"] == 2
            ),
            30,
            "observedGeneration 2",
        )
        wait_condition(admin_kube, namespace, "llama-8b", "Ready", "True", timeout=60)

        # Deleting the pool removes every child (garbage collection; no finalizer involved).
        kubectl_ok(cluster, "-n", namespace, "delete", "pdpool", "llama-8b", "--wait=true")
        eventually(lambda: not children_of(admin_kube, namespace, "llama-8b"), 90, "garbage collection")


def test_missing_secret_is_degraded_by_name_then_recovers(
    cluster: TestCluster, operator: OperatorContext, admin_kube: Kube, namespace: str
) -> None:
    document = example("demo-cpu.yaml")
    document["spec"]["model"]["tokenSecret"] = {"name": "hf-token", "key": "HF_TOKEN"}
    document["spec"]["engine"]["image"] = "vllm/vllm-openai:v0.33.0"  # kwok-simulated engines
    document["spec"]["router"]["image"] = "registry.invalid/router-simulated:0"
    document["metadata"]["namespace"] = namespace
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(document))

    degraded = wait_condition(admin_kube, namespace, "demo", "Degraded", "True", timeout=60)
    assert degraded["reason"] == "MissingSecret"
    assert "'hf-token'" in degraded["message"] and "spec.model.tokenSecret" in degraded["message"]
    eventually(
        lambda: "MissingSecret" in event_reasons(admin_kube, namespace, "demo"), 10, "a MissingSecret event"
    )
    # The children are applied anyway; pods wait for the Secret as they would on any cluster.
    assert admin_kube.get("apps/v1", "StatefulSet", namespace, "demo-decode") is not None

    kubectl_ok(cluster, "-n", namespace, "create", "secret", "generic", "hf-token", "--from-literal=WRONG=x")
    eventually(
        lambda: (
            "has no key 'HF_TOKEN'"
            in (condition(get_pool(admin_kube, namespace, "demo"), "Degraded") or {}).get("message", "")
        ),
        30,
        "Degraded to name the missing key",
    )
    kubectl_ok(cluster, "-n", namespace, "delete", "secret", "hf-token")
    kubectl_ok(
        cluster, "-n", namespace, "create", "secret", "generic", "hf-token", "--from-literal=HF_TOKEN=x"
    )
    recovered = wait_condition(admin_kube, namespace, "demo", "Degraded", "False", timeout=30)
    assert recovered["reason"] == "AsExpected"


def test_a_child_deleted_by_hand_comes_back(
    cluster: TestCluster, operator: OperatorContext, admin_kube: Kube, namespace: str
) -> None:
    document = example("demo-cpu.yaml")
    document["spec"]["engine"]["image"] = "vllm/vllm-openai:v0.33.0"
    document["spec"]["router"]["image"] = "registry.invalid/router-simulated:0"
    document["metadata"]["namespace"] = namespace
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(document))
    first = eventually(
        lambda: admin_kube.get("apps/v1", "Deployment", namespace, "demo-router"), 60, "the router Deployment"
    )
    kubectl_ok(cluster, "-n", namespace, "delete", "deployment", "demo-router")
    eventually(
        lambda: (
            (d := admin_kube.get("apps/v1", "Deployment", namespace, "demo-router")) is not None
            and d["metadata"]["uid"] != first["metadata"]["uid"]
        ),
        60,
        "the router Deployment to be applied again",
    )
    # kopf posts events from a queue, a moment after the handler asks.
    eventually(lambda: "Applied" in event_reasons(admin_kube, namespace, "demo"), 10, "an Applied event")
