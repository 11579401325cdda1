"""`helm install`, `helm upgrade` and `helm uninstall` of the chart on the local control plane.

The operator's pod is simulated by kwok (its image is never run here); what is checked is what Helm puts in
the cluster. The release name is unique, so its ClusterRole and ClusterRoleBinding never collide with other
tests'; the CRD is shared with them and stays (as Helm leaves it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from tests.cluster.test_chart_render import CHART, DEPLOY, Helm, documents, one
from tests.support.cluster import eventually

from inferencepool.api import labels
from inferencepool.cluster import build

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

CRD_NAME = f"{labels.PLURAL}.{labels.GROUP}"


class Release:
    def __init__(self, helm: Helm, cluster: TestCluster, namespace: str) -> None:
        self.helm = helm
        self.cluster = cluster
        self.namespace = namespace
        self.name = f"chart-{uuid.uuid4().hex[:8]}"
        self.fullname = f"{self.name}-inferencepool-operator"

    def helm_ok(self, *args: str) -> str:
        result = self.helm.run(
            *args, "--namespace", self.namespace, "--kubeconfig", str(self.cluster.kubeconfig)
        )
        assert result.returncode == 0, f"helm {' '.join(args)} failed: {result.stderr}"
        return result.stdout

    def get(self, kind: str, name: str, *, namespaced: bool = True) -> dict[str, Any] | None:
        scope = ["-n", self.namespace] if namespaced else []
        result = self.cluster.kubectl("get", kind, name, *scope, "-o", "json")
        if result.returncode != 0:
            assert "NotFound" in result.stderr, result.stderr
            return None
        found: dict[str, Any] = json.loads(result.stdout)
        return found

    def deployment(self) -> dict[str, Any]:
        found = self.get("deployment", self.fullname)
        assert found is not None
        return found


@pytest.fixture
def release(
    cluster: TestCluster, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    helm = Helm(build.ensure_binaries() / "helm", tmp_path_factory.mktemp("helm"))
    created = Release(helm, cluster, namespace)
    yield created
    # The namespace fixture deletes the namespaced objects; the cluster-scoped ones are the release's.
    helm.run(
        "uninstall",
        created.name,
        "--namespace",
        namespace,
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--ignore-not-found",
    )


def rolled_out(release: Release, image: str) -> dict[str, Any] | None:
    deployment = release.deployment()
    status = deployment.get("status", {})
    current = (
        deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image
        and status.get("observedGeneration") == deployment["metadata"]["generation"]
        and status.get("updatedReplicas") == 1
        and status.get("availableReplicas") == 1
        and status.get("replicas") == 1
    )
    return deployment if current else None


def test_helm_install_upgrade_uninstall(cluster: TestCluster, release: Release) -> None:
    install_values = ",".join(
        [
            "image.tag=0.1.0-chart-test",
            "resources.requests.cpu=50m",
            "resources.limits.memory=256Mi",
            f"watchNamespaces={{{release.namespace}}}",
        ]
    )
    notes = release.helm_ok(
        "install", release.name, str(CHART), "--set", install_values, "--wait", "--timeout", "60s"
    )
    assert "kubectl apply --server-side -f crds/" in notes

    crd = release.get("crd", CRD_NAME, namespaced=False)
    assert crd is not None
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established.get("Established") == "True"

    account = release.get("serviceaccount", release.fullname)
    assert account is not None
    role = release.get("clusterrole", release.fullname, namespaced=False)
    assert role is not None
    # Watching one namespace, the operator's RBAC is a Role there; its ClusterRole only reads the CRD.
    rendered = release.helm.template(
        "--set", install_values, release=release.name, namespace=release.namespace
    )
    assert role["rules"] == one(rendered, "ClusterRole")["rules"]
    namespaced_role = release.get("role", release.fullname)
    assert namespaced_role is not None
    assert namespaced_role["rules"] == one(rendered, "Role")["rules"]
    # ... and holds what deploy/operator/'s ClusterRole holds for namespaced resources.
    deployed_role = one(documents((DEPLOY / "rbac.yaml").read_text()), "ClusterRole")
    cluster_wide = {"customresourcedefinitions", "namespaces"}
    assert namespaced_role["rules"] == [
        rule for rule in deployed_role["rules"] if not set(rule["resources"]) & cluster_wide
    ]
    binding = release.get("clusterrolebinding", release.fullname, namespaced=False)
    assert binding is not None
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": release.fullname, "namespace": release.namespace}
    ]

    deployment = eventually(
        lambda: rolled_out(release, "inferencepool/operator:0.1.0-chart-test"), 30, "rollout"
    )
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "50m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }
    assert container["args"] == [f"--namespace={release.namespace}"]
    assert pod["serviceAccountName"] == release.fullname
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    first_generation = deployment["metadata"]["generation"]

    release.helm_ok(
        "upgrade",
        release.name,
        str(CHART),
        "--reuse-values",
        "--set",
        "image.tag=0.1.1-chart-test",
        "--wait",
        "--timeout",
        "60s",
    )
    upgraded = eventually(
        lambda: rolled_out(release, "inferencepool/operator:0.1.1-chart-test"), 30, "the upgrade"
    )
    assert upgraded["metadata"]["generation"] == first_generation + 1
    # --reuse-values kept what the install set.
    assert upgraded["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "256Mi"}
    replica_sets = json.loads(
        cluster.kubectl(
            "get",
            "replicasets",
            "-n",
            release.namespace,
            "-l",
            f"app.kubernetes.io/instance={release.name}",
            "-o",
            "json",
        ).stdout
    )["items"]
    images = {
        rs["spec"]["template"]["spec"]["containers"][0]["image"]: rs["spec"]["replicas"]
        for rs in replica_sets
    }
    assert images == {
        "inferencepool/operator:0.1.0-chart-test": 0,
        "inferencepool/operator:0.1.1-chart-test": 1,
    }

    release.helm_ok("uninstall", release.name, "--wait", "--timeout", "60s")
    assert release.get("deployment", release.fullname) is None
    assert release.get("serviceaccount", release.fullname) is None
    assert release.get("clusterrole", release.fullname, namespaced=False) is None
    assert release.get("clusterrolebinding", release.fullname, namespaced=False) is None
    # Helm never deletes what it installed from crds/ (that would delete every InferencePool).
    assert release.get("crd", CRD_NAME, namespaced=False) is not None
