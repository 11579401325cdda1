"""What the operator does when the world moves under a pool: a child deleted by hand (of every kind) comes
back, and a spec the API server accepts but cannot apply to children is Degraded, naming the field."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from tests.cluster.kube_helpers import (
    children_of,
    condition,
    event_reasons,
    example,
    get_pool,
    kubectl_ok,
    patch_spec,
    wait_condition,
)
from tests.support.cluster import eventually

from inferencepool.builders import CHILD_KINDS
from inferencepool.controller.context import OperatorContext
from inferencepool.kube import Kube

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster


def simulated_pool(namespace: str, name: str) -> dict[str, Any]:
    """demo-cpu with engines and router left to kwok (no local processes): these tests are about objects."""
    document = example("demo-cpu.yaml")
    document["metadata"] = {"name": name, "namespace": namespace}
    document["spec"]["engine"]["image"] = "vllm/vllm-openai:v0.33.0"
    document["spec"]["router"]["image"] = "registry.invalid/router-simulated:0"
    return document


def test_every_kind_of_child_deleted_by_hand_comes_back(
    cluster: TestCluster, operator: OperatorContext, admin_kube: Kube, namespace: str
) -> None:
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(simulated_pool(namespace, "demo")))
    kinds = {kind for _, kind in CHILD_KINDS}
    children = eventually(
        lambda: (
            (found := children_of(admin_kube, namespace, "demo"))
            and {c["kind"] for c in found} == kinds
            and found
        ),
        60,
        f"a child of every kind ({', '.join(sorted(kinds))})",
    )
    first_of_kind: dict[str, dict[str, Any]] = {}
    for child in sorted(children, key=lambda c: c["metadata"]["name"]):
        first_of_kind.setdefault(child["kind"], child)
    api_versions = {kind: api_version for api_version, kind in CHILD_KINDS}
    for kind, child in sorted(first_of_kind.items()):
        name, uid = child["metadata"]["name"], child["metadata"]["uid"]
        kubectl_ok(cluster, "-n", namespace, "delete", kind.lower(), name, "--wait=true")
        eventually(
            lambda kind=kind, name=name, uid=uid: (
                (found := admin_kube.get(api_versions[kind], kind, namespace, name)) is not None
                and found["metadata"]["uid"] != uid
            ),
            30,
            f"{kind} {name} to be applied again",
        )
    # kopf posts events from a queue, a moment after the handler asks.
    eventually(lambda: "Applied" in event_reasons(admin_kube, namespace, "demo"), 10, "an Applied event")


def degraded_stays(kube: Kube, namespace: str, name: str, reason: str, seconds: float) -> None:
    """Retries (every 2 s here) keep failing, and the pool never reads as healthy meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition(get_pool(kube, namespace, name), "Degraded") or {}
        assert (found.get("status"), found.get("reason")) == ("True", reason), found
        time.sleep(0.5)


def test_a_spec_the_children_cannot_take_is_degraded_naming_the_field_until_fixed(
    cluster: TestCluster, operator: OperatorContext, admin_kube: Kube, namespace: str
) -> None:
    document = simulated_pool(namespace, "bad")
    # Tolerations pass through to the pod template unchecked by the CRD; the StatefulSet then refuses them.
    document["spec"]["decode"]["scheduling"] = {"tolerations": [{"key": "gpu", "operator": "Sideways"}]}
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(document))

    degraded = wait_condition(admin_kube, namespace, "bad", "Degraded", "True", timeout=60)
    assert degraded["reason"] == "ApplyFailed"
    assert "StatefulSet 'bad-decode' (from spec.decode) was refused" in degraded["message"]
    assert "tolerations[0].operator" in degraded["message"] and "Sideways" in degraded["message"]
    # The status is written although the apply failed: the conditions and the figures are all there.
    status = (get_pool(admin_kube, namespace, "bad") or {}).get("status", {})
    assert status["observedGeneration"] == 1 and {"Ready", "Progressing"} <= {
        c["type"] for c in status["conditions"]
    }
    eventually(
        lambda: "ApplyFailed" in event_reasons(admin_kube, namespace, "bad"), 10, "an ApplyFailed event"
    )
    degraded_stays(admin_kube, namespace, "bad", "ApplyFailed", 5)

    # A quantity the API server would refuse only inside the StatefulSet is named in the pool's own terms.
    patch_spec(
        cluster,
        namespace,
        "bad",
        {"decode": {"scheduling": {"tolerations": []}, "resources": {"requests": {"cpu": "lots"}}}},
    )
    eventually(
        lambda: (
            (condition(get_pool(admin_kube, namespace, "bad"), "Degraded") or {}).get("reason")
            == "InvalidSpec"
        ),
        30,
        "Degraded=True InvalidSpec",
    )
    invalid = condition(get_pool(admin_kube, namespace, "bad"), "Degraded") or {}
    assert invalid["status"] == "True"
    assert "spec.decode.resources.requests.cpu: 'lots' is not a Kubernetes quantity" in invalid["message"]

    patch_spec(cluster, namespace, "bad", {"decode": {"resources": {"requests": {"cpu": "100m"}}}})
    recovered = wait_condition(admin_kube, namespace, "bad", "Degraded", "False", timeout=60)
    assert recovered["reason"] == "AsExpected"
    assert admin_kube.get("apps/v1", "StatefulSet", namespace, "bad-decode") is not None
