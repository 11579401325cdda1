"""`helm lint` and `helm template` of charts/inferencepool-operator with the helm the control plane builds.

Only the helm binary is needed (no API server); it lives here because getting it may need the Go build.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferencepool.cluster import build
from inferencepool.controller import cli as operator_cli

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "inferencepool-operator"
DEPLOY = ROOT / "deploy" / "operator"
# What deploy/operator/ is rendered with (`make deploy-manifests`).
RELEASE = "inferencepool-operator"
NAMESPACE = "inferencepool-system"


class Helm:
    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        # Helm's own cache/config/data under the test's temporary directory, not the user's home.
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=self.env, timeout=60, check=False
        )

    def template(
        self, *args: str, release: str = RELEASE, namespace: str = NAMESPACE
    ) -> list[dict[str, Any]]:
        result = self.run("template", release, str(CHART), "--namespace", namespace, *args)
        assert result.returncode == 0, result.stderr
        return documents(result.stdout)


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(build.ensure_binaries() / "helm", tmp_path_factory.mktemp("helm"))


def documents(text: str) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(text) if document]


def one(rendered: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [document for document in rendered if document["kind"] == kind]
    return found


def test_lint_is_clean(helm: Helm) -> None:
    result = helm.run("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_deploy_operator_is_the_default_render(helm: Helm) -> None:
    rendered = helm.template()
    rbac = documents((DEPLOY / "rbac.yaml").read_text())
    namespace = documents((DEPLOY / "00-namespace.yaml").read_text())
    message = "deploy/operator/ drifted from the chart: run `make deploy-manifests`"
    assert rbac[0] == namespace[0] == {**namespace[0], "kind": "Namespace"}, message
    assert namespace[0]["metadata"]["name"] == NAMESPACE
    expected_rbac = [d for d in rendered if d["kind"] != "Deployment"]
    assert rbac[1:] == expected_rbac, message
    assert documents((DEPLOY / "deployment.yaml").read_text()) == [one(rendered, "Deployment")], message
    assert [d["kind"] for d in expected_rbac] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]


def test_default_render_keeps_the_operator_constraints(helm: Helm) -> None:
    deployment = one(helm.template(), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "inferencepool/operator:0.1.0"
    assert "args" not in container  # the image's entrypoint alone: all namespaces, info logging
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == RELEASE
    # Every selector label is on the pods, and the selector names the release (two releases never share pods).
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    assert selector["app.kubernetes.io/instance"] == RELEASE


def test_values_reach_the_deployment_and_its_flags_parse(helm: Helm) -> None:
    rendered = helm.template(
        "--set",
        "image.repository=example.invalid/ops/operator,image.tag=1.2.3,image.pullPolicy=Always",
        "--set",
        "watchNamespaces={team-a,team-b},logLevel=debug,extraArgs={--kubeconfig=/etc/kube/config}",
        "--set",
        "resources.requests.cpu=250m,nodeSelector.pool=system,priorityClassName=system-cluster-critical",
        "--set",
        "tolerations[0].key=dedicated,tolerations[0].operator=Exists,podAnnotations.team=ml",
    )
    pod = one(rendered, "Deployment")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "example.invalid/ops/operator:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"]["requests"]["cpu"] == "250m"
    assert pod["spec"]["nodeSelector"] == {"pool": "system"}
    assert pod["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pod["metadata"]["annotations"] == {"team": "ml"}
    # The args go after the image's entrypoint: parse them the way the operator will.
    parser = argparse.ArgumentParser()
    operator_cli.configure(parser)
    args = parser.parse_args(["--liveness", "http://0.0.0.0:8080/healthz", *container["args"]])
    assert args.namespaces == ["team-a", "team-b"]
    assert args.verbose is True
    assert args.kubeconfig == "/etc/kube/config"


def test_names_follow_the_release_and_bind_its_namespace(helm: Helm) -> None:
    rendered = helm.template(release="edge", namespace="ml-ops")
    names = {document["kind"]: document["metadata"]["name"] for document in rendered}
    assert set(names.values()) == {"edge-inferencepool-operator"}
    binding = one(rendered, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "edge-inferencepool-operator", "namespace": "ml-ops"}
    ]
    assert binding["roleRef"]["name"] == one(rendered, "ClusterRole")["metadata"]["name"]
    assert one(rendered, "Deployment")["metadata"]["namespace"] == "ml-ops"


def test_an_existing_service_account_is_bound_instead_of_creating_one(helm: Helm) -> None:
    rendered = helm.template("--set", "serviceAccount.create=false,serviceAccount.name=platform-operator")
    assert "ServiceAccount" not in {document["kind"] for document in rendered}
    assert one(rendered, "ClusterRoleBinding")["subjects"][0]["name"] == "platform-operator"
    pod = one(rendered, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-operator"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("logLevel=trace", "logLevel"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("watchNamespaces={Not_A_Namespace}", "watchNamespaces"),
        ("replicas=2", "replicas"),
        ("serviceAccount.create=false", "serviceAccount.name is required"),
    ],
)
def test_bad_values_are_refused_naming_the_value(helm: Helm, values: str, message: str) -> None:
    result = helm.run("template", RELEASE, str(CHART), "--set", values)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_include_crds_renders_the_repository_crd(helm: Helm) -> None:
    rendered = helm.template("--include-crds")
    (crd,) = [document for document in rendered if document["kind"] == "CustomResourceDefinition"]
    (committed,) = documents(next((ROOT / "crds").glob("*.yaml")).read_text())
    assert crd == committed
