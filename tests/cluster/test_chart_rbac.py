"""The chart's RBAC: cluster-wide when the operator watches every namespace, a Role per namespace when it
watches some, and Secret access narrowed by rbac.readSecrets / rbac.secretNames.

The render tests need only helm; the last test has the real API server judge what the namespaced RBAC allows,
and runs the operator with exactly it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.cluster.kube_helpers import (
    example,
)
from tests.cluster.test_chart_render import CHART, RELEASE, Helm, one
from tests.support.cluster import TestCluster, eventually

from inferencepool.builders import CHILD_KINDS
from inferencepool.cluster import build
from inferencepool.controller.runtime import operator_in_thread
from inferencepool.kube import Kube, resource_of

CLUSTER_SCOPED = ({"apiextensions.k8s.io"}, {"customresourcedefinitions"})


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(build.ensure_binaries() / "helm", tmp_path_factory.mktemp("helm"))


def of_kind(rendered: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [document for document in rendered if document["kind"] == kind]


def resources(rules: list[dict[str, Any]]) -> set[str]:
    return {resource for rule in rules for resource in rule["resources"]}


def secret_rules(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for rule in rules if "secrets" in rule["resources"]]


def test_watching_every_namespace_keeps_one_cluster_role(helm: Helm) -> None:
    rendered = helm.template()
    assert of_kind(rendered, "Role") == of_kind(rendered, "RoleBinding") == []
    rules = one(rendered, "ClusterRole")["rules"]
    assert {"customresourcedefinitions", "namespaces", "statefulsets", "inferencepools"} <= resources(rules)
    (secrets,) = secret_rules(rules)
    assert secrets["verbs"] == ["get"] and "resourceNames" not in secrets


def test_watched_namespaces_get_roles_and_the_cluster_role_keeps_only_the_crd(helm: Helm) -> None:
    everywhere = one(helm.template(), "ClusterRole")["rules"]
    rendered = helm.template("--set", "watchNamespaces={team-a,team-b}")
    (cluster_rule,) = one(rendered, "ClusterRole")["rules"]
    assert set(cluster_rule["apiGroups"]) == CLUSTER_SCOPED[0]
    assert set(cluster_rule["resources"]) == CLUSTER_SCOPED[1]
    assert cluster_rule["verbs"] == ["get", "list", "watch"]
    roles, bindings = of_kind(rendered, "Role"), of_kind(rendered, "RoleBinding")
    assert [r["metadata"]["namespace"] for r in roles] == ["team-a", "team-b"]
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b"]
    # Each Role holds what the ClusterRole held for namespaced resources, and nothing cluster-scoped.
    namespaced = [
        r for r in everywhere if not set(r["resources"]) & {"customresourcedefinitions", "namespaces"}
    ]
    for role, binding in zip(roles, bindings, strict=True):
        assert role["rules"] == namespaced
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": RELEASE,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": RELEASE, "namespace": "inferencepool-system"}
        ]


def test_secret_access_is_narrowed_or_dropped(helm: Helm) -> None:
    named = helm.template("--set", "watchNamespaces={team-a},rbac.secretNames={hf-token,hf-token-b}")
    (secrets,) = secret_rules(one(named, "Role")["rules"])
    assert secrets == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "verbs": ["get"],
        "resourceNames": ["hf-token", "hf-token-b"],
    }
    for values in ("rbac.readSecrets=false", "watchNamespaces={team-a},rbac.readSecrets=false"):
        rendered = helm.template("--set", values)
        for document in of_kind(rendered, "ClusterRole") + of_kind(rendered, "Role"):
            assert secret_rules(document["rules"]) == [], values


def test_bad_secret_names_are_refused(helm: Helm) -> None:
    result = helm.run("template", RELEASE, str(CHART), "--set", "rbac.secretNames={Not_A_Name}")
    assert result.returncode != 0
    assert "secretNames" in result.stderr, result.stderr


def service_account_kubeconfig(cluster: TestCluster, namespace: str, account: str, path: Path) -> Path:
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h")
    assert token.returncode == 0, token.stderr
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": account, "user": {"token": token.stdout.strip()}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": account}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def can_i(cluster: TestCluster, subject: str, verb: str, resource: str, namespace: str) -> bool:
    result = cluster.kubectl("auth", "can-i", verb, resource, "-n", namespace, f"--as={subject}")
    return result.stdout.strip() == "yes"


def test_the_operator_runs_on_namespaced_rbac_and_reads_only_named_secrets(
    cluster: TestCluster,
    helm: Helm,
    crd_installed: None,
    admin_kube: Kube,
    namespace: str,
    tmp_path: Path,
) -> None:
    # The release lives in the test namespace and watches it alone; a unique release name keeps its
    # ClusterRole apart from other tests'.
    release = f"rbac-{namespace[-8:]}"
    rendered = helm.template(
        "--set",
        f"watchNamespaces={{{namespace}}},rbac.secretNames={{hf-token}}",
        "-s",
        "templates/serviceaccount.yaml",
        "-s",
        "templates/rbac.yaml",
        release=release,
        namespace=namespace,
    )
    applied = cluster.kubectl(
        "apply", "--server-side", "-f", "-", input_text="\n---\n".join(yaml.safe_dump(d) for d in rendered)
    )
    assert applied.returncode == 0, applied.stderr
    account = one(rendered, "ServiceAccount")["metadata"]["name"]
    subject = f"system:serviceaccount:{namespace}:{account}"
    try:
        assert can_i(cluster, subject, "get", "secrets/hf-token", namespace)
        assert not can_i(cluster, subject, "get", "secrets/other", namespace)
        assert not can_i(cluster, subject, "list", "secrets", namespace)
        assert not can_i(cluster, subject, "get", "statefulsets", "default")
        assert not can_i(cluster, subject, "list", "inferencepools.serving.inferencepool.dev", "default")
        assert can_i(cluster, subject, "patch", "statefulsets", namespace)

        # The operator reconciles a pool with only these permissions; the Secret it names is not among
        # those it may read, so it is not checked (and no error loops).
        kubeconfig = service_account_kubeconfig(cluster, namespace, account, tmp_path / "kubeconfig")
        document = example("demo-cpu.yaml")
        document["spec"]["model"]["tokenSecret"] = {"name": "other", "key": "HF_TOKEN"}
        with operator_in_thread(str(kubeconfig), [namespace], retry_seconds=2.0):
            created = cluster.kubectl(
                "create", "-n", namespace, "-f", "-", input_text=yaml.safe_dump(document)
            )
            assert created.returncode == 0, created.stderr
            name = document["metadata"]["name"]

            def reconciled() -> dict[str, Any] | None:
                pool = admin_kube.get("serving.inferencepool.dev/v1alpha1", "InferencePool", namespace, name)
                status = (pool or {}).get("status") or {}
                return status if status.get("observedGeneration") else None

            status = eventually(reconciled, 60, "the pool's status written by the namespaced operator")
            assert admin_kube.get("apps/v1", "StatefulSet", namespace, f"{name}-decode") is not None
            degraded = {c["type"]: c for c in status.get("conditions", [])}.get("Degraded")
            assert degraded is None or "other" not in json.dumps(degraded), degraded
    finally:
        for kind in ("clusterrole", "clusterrolebinding"):
            cluster.kubectl("delete", kind, release + "-inferencepool-operator", "--ignore-not-found")


def test_the_operator_may_write_every_child_kind_it_builds(helm: Helm) -> None:
    rules = one(helm.template("--set", "watchNamespaces={team-a}"), "Role")["rules"]
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    for api_version, kind in CHILD_KINDS:
        resource = resource_of(api_version, kind)
        group, plural = resource.group, resource.plural
        for verb in ("get", "create", "patch", "list", "watch"):
            assert (group, plural, verb) in granted, f"{kind}: {verb}"
