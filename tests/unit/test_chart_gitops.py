"""The Argo CD and Flux manifests in deploy/gitops/: structure, and that what they point at exists here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from inferencepool.api import labels

ROOT = Path(__file__).resolve().parents[2]
GITOPS = ROOT / "deploy" / "gitops"
CHART = ROOT / "charts" / "inferencepool-operator"
REPOSITORY = "https://github.com/OWNER/inferencepool"
RELEASE = "inferencepool-operator"
NAMESPACE = "inferencepool-system"


def documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def by_kind(folder: Path) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.yaml")):
        if path.name == "kustomization.yaml":  # kustomize's own file, not an object it applies
            continue
        for document in documents(path):
            assert {"apiVersion", "kind", "metadata"} <= set(document), f"{path}: not a Kubernetes object"
            kinds.setdefault(document["kind"], []).append(document)
    return kinds


@pytest.mark.parametrize("tool", ["argocd", "flux"])
def test_kustomization_lists_every_manifest_in_its_folder(tool: str) -> None:
    folder = GITOPS / tool
    kustomization = documents(folder / "kustomization.yaml")[0]
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    others = {path.name for path in folder.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == others


def test_argocd_applies_the_crd_first_then_the_chart_without_its_crds() -> None:
    applications = {app["metadata"]["name"]: app for app in by_kind(GITOPS / "argocd")["Application"]}
    assert set(applications) == {"inferencepool-crds", RELEASE}
    for app in applications.values():
        assert app["apiVersion"] == "argoproj.io/v1alpha1"
        spec = app["spec"]
        assert spec["project"] and spec["destination"]["server"]
        assert spec["source"]["repoURL"] == REPOSITORY
        assert (ROOT / spec["source"]["path"]).is_dir(), spec["source"]["path"]
        # The CRD is too large for client-side apply's last-applied-configuration annotation.
        assert "ServerSideApply=true" in spec["syncPolicy"]["syncOptions"]

    crds, operator = applications["inferencepool-crds"], applications[RELEASE]
    wave = "argocd.argoproj.io/sync-wave"
    assert int(crds["metadata"]["annotations"][wave]) < int(operator["metadata"]["annotations"][wave])
    assert (ROOT / crds["spec"]["source"]["path"] / f"{labels.PLURAL}.{labels.GROUP}.yaml").is_file()
    # Pruning or cascading deletion of the CRD would delete every InferencePool in the cluster.
    assert crds["spec"]["syncPolicy"]["automated"]["prune"] is False
    assert "finalizers" not in crds["metadata"]

    source = operator["spec"]["source"]
    assert Path(source["path"]) == CHART.relative_to(ROOT)
    assert source["helm"]["skipCrds"] is True
    assert source["helm"]["releaseName"] == RELEASE
    assert operator["spec"]["destination"]["namespace"] == NAMESPACE
    assert "CreateNamespace=true" in operator["spec"]["syncPolicy"]["syncOptions"]
    assert_known_values(source["helm"]["valuesObject"])


def test_flux_helm_release_uses_the_chart_from_the_git_repository_and_replaces_crds() -> None:
    kinds = by_kind(GITOPS / "flux")
    assert set(kinds) == {"GitRepository", "HelmRelease"}
    (repository,) = kinds["GitRepository"]
    (release,) = kinds["HelmRelease"]
    assert repository["apiVersion"] == "source.toolkit.fluxcd.io/v1"
    assert repository["spec"]["url"] == REPOSITORY
    assert repository["spec"]["interval"] and repository["spec"]["ref"]["branch"]

    assert release["apiVersion"] == "helm.toolkit.fluxcd.io/v2"
    spec = release["spec"]
    chart = spec["chart"]["spec"]
    assert (ROOT / chart["chart"]).resolve() == CHART
    assert chart["sourceRef"] == {
        "kind": "GitRepository",
        "name": repository["metadata"]["name"],
        "namespace": repository["metadata"]["namespace"],
    }
    # The GitRepository's ignore rules must not filter the chart out of the artifact.
    assert "!/charts/" in repository["spec"]["ignore"].split()
    # Plain Helm never upgrades crds/; Flux does with CreateReplace.
    assert spec["install"]["crds"] == spec["upgrade"]["crds"] == "CreateReplace"
    assert spec["releaseName"] == RELEASE
    assert spec["targetNamespace"] == NAMESPACE
    assert spec["install"]["createNamespace"] is True
    assert spec["interval"]
    assert_known_values(spec["values"])


def assert_known_values(overrides: dict[str, Any]) -> None:
    """Example overrides in the GitOps files must be values the chart has (the schema rejects others)."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    for key, value in overrides.items():
        assert key in defaults, f"{key} is not a value of the chart"
        if isinstance(value, dict):
            assert set(value) <= set(defaults[key]), f"{key}: {set(value) - set(defaults[key])}"


def test_no_registry_host_or_real_repository_is_named() -> None:
    for path in GITOPS.rglob("*.yaml"):
        text = path.read_text()
        for line in text.splitlines():
            if "://" in line and not line.lstrip().startswith("#"):
                url = line.split(":", 1)[1].strip()
                assert url in (REPOSITORY, "https://kubernetes.default.svc"), f"{path}: {url}"
