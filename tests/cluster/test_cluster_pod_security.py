"""The API server's own PodSecurity admission judges the pods a pool runs.

Router and LMCache controller pods are admitted in a namespace that enforces "restricted"; engine pods (the
upstream vLLM image runs as root) are refused there, naming what restricted wants, and admitted under
"baseline".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from tests.support.cluster import TestCluster, eventually

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import pool_children
from inferencepool.controller.context import OperatorContext

REPO = Path(__file__).resolve().parents[2]


def pool_in(namespace: str) -> InferencePool:
    document = yaml.safe_load((REPO / "examples" / "llama-3.1-8b.yaml").read_text())
    document["metadata"].update(namespace=namespace, uid="1f0c7a52-0000-4000-8000-000000000001")
    return InferencePool.model_validate(document)


def pods_by_role(pool: InferencePool) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """A Pod from each workload's template (what its controller would create), and the ServiceAccounts."""
    pods, accounts = {}, []
    for manifest in pool_children(pool):
        meta = {"name": manifest["metadata"]["name"], "namespace": manifest["metadata"]["namespace"]}
        if manifest["kind"] in ("Deployment", "StatefulSet"):
            template = manifest["spec"]["template"]
            role = template["metadata"]["labels"][labels.LABEL_ROLE]
            pods[role] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}
        elif manifest["kind"] == "ServiceAccount":
            accounts.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta})
    return pods, accounts


def enforce(cluster: TestCluster, namespace: str, level: str) -> None:
    result = cluster.kubectl(
        "label",
        "--overwrite",
        "namespace",
        namespace,
        f"pod-security.kubernetes.io/enforce={level}",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    assert result.returncode == 0, result.stderr


def admit(cluster: TestCluster, pod: dict[str, Any]) -> tuple[int, str]:
    result = cluster.kubectl("create", "--dry-run=server", "-f", "-", input_text=yaml.safe_dump(pod))
    return result.returncode, result.stderr


def test_router_and_controller_are_admitted_under_restricted(cluster: TestCluster, namespace: str) -> None:
    pods, accounts = pods_by_role(pool_in(namespace))
    for account in accounts:
        created = cluster.kubectl("create", "-f", "-", input_text=yaml.safe_dump(account))
        assert created.returncode == 0, created.stderr
    enforce(cluster, namespace, "restricted")
    for role in ("router", "lmcache-controller"):
        code, stderr = admit(cluster, pods[role])
        assert code == 0, f"{role}: {stderr}"
        assert "violate" not in stderr, f"{role}: {stderr}"
    # The check is real: an engine pod, which runs as root, is refused, naming what restricted wants.
    code, stderr = admit(cluster, pods["decode"])
    assert code != 0
    assert 'violates PodSecurity "restricted:latest"' in stderr and "runAsNonRoot" in stderr, stderr


def test_engines_are_admitted_under_baseline(cluster: TestCluster, namespace: str) -> None:
    pods, _ = pods_by_role(pool_in(namespace))
    enforce(cluster, namespace, "baseline")
    for role in labels.ENGINE_ROLES:
        code, stderr = admit(cluster, pods[role])
        assert code == 0, f"{role}: {stderr}"
    # What restricted asks beyond runAsNonRoot is met: only the non-root rule names the engine pod.
    enforce(cluster, namespace, "restricted")
    code, stderr = admit(cluster, pods["prefill"])
    assert code != 0
    assert "allowPrivilegeEscalation" not in stderr and "capabilities" not in stderr, stderr
    assert "seccompProfile" not in stderr, stderr


def test_in_a_restricted_namespace_the_operator_gets_router_and_controller_pods(
    cluster: TestCluster, namespace: str, operator: OperatorContext
) -> None:
    """What the operator applies, the controllers turn into pods the restricted profile admits (engines run
    the upstream vLLM image as root: their pods need a baseline namespace)."""
    enforce(cluster, namespace, "restricted")
    document = yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    document["spec"]["kvCache"]["p2p"] = {"enabled": True}
    created = cluster.kubectl("create", "-n", namespace, "-f", "-", input_text=yaml.safe_dump(document))
    assert created.returncode == 0, created.stderr
    name = document["metadata"]["name"]

    def pod_roles() -> set[str] | None:
        listed = cluster.kubectl("get", "pods", "-n", namespace, "-o", "json")
        assert listed.returncode == 0, listed.stderr
        roles = {p["metadata"]["labels"].get(labels.LABEL_ROLE) for p in json.loads(listed.stdout)["items"]}
        return roles if {"router", "lmcache-controller"} <= roles else None

    roles = eventually(pod_roles, 90, "router and LMCache controller pods in the restricted namespace")
    assert not roles & set(labels.ENGINE_ROLES)
    # The StatefulSet controller says why the engines have none.
    events = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", "reason=FailedCreate")
    assert f"{name}-decode" in events.stdout and "violates PodSecurity" in events.stdout, events.stdout
