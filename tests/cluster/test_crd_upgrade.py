"""The README's CRD upgrade after a Helm install: Helm installs `crds/` once and owns the CRD's fields, so a
newer CRD goes in with `kubectl apply --server-side --force-conflicts -f crds/`, which takes them over.

On the shared test cluster the real CRD serves every other test, so this one installs a copy of it under a
group, kind and names of its own (the real CRD's schema, Helm's own crds/ handling, the real API server).
"""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from tests.cluster.test_chart_render import CHART, Helm
from tests.support.cluster import eventually

from inferencepool.cluster import build

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

CRD_FILE = CHART / "crds" / "inferencepools.serving.inferencepool.dev.yaml"


def renamed_crd(suffix: str) -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    group = f"u{suffix}.upgrade.inferencepool.dev"
    plural = f"upgradeprobes{suffix}"
    crd["metadata"] = {"name": f"{plural}.{group}"}
    crd["spec"]["group"] = group
    crd["spec"]["names"] = {
        "kind": f"UpgradeProbe{suffix}",
        "listKind": f"UpgradeProbe{suffix}List",
        "plural": plural,
        "singular": f"upgradeprobe{suffix}",
    }
    return crd


def older(crd: dict[str, Any]) -> dict[str, Any]:
    """The same CRD as an earlier release had it: one spec field fewer, another description."""
    old = copy.deepcopy(crd)
    schema = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    dropped = list(spec["properties"])[-1]
    del spec["properties"][dropped]
    schema["description"] = "an older release's description"
    return old


def served_schema(cluster: TestCluster, name: str) -> dict[str, Any]:
    result = cluster.kubectl("get", "crd", name, "-o", "json")
    assert result.returncode == 0, result.stderr
    crd: dict[str, Any] = json.loads(result.stdout)
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_a_newer_crd_replaces_the_one_helm_installed(
    cluster: TestCluster, namespace: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    new = renamed_crd(suffix)
    old = older(new)
    name = new["metadata"]["name"]
    chart = tmp_path / "chart"
    (chart / "crds").mkdir(parents=True)
    (chart / "templates").mkdir()
    (chart / "Chart.yaml").write_text(f"apiVersion: v2\nname: crd-upgrade-{suffix}\nversion: 0.1.0\n")
    (chart / "crds" / "crd.yaml").write_text(yaml.safe_dump(old))
    newer = tmp_path / "crds"
    newer.mkdir()
    (newer / "crd.yaml").write_text(yaml.safe_dump(new))
    helm = Helm(build.ensure_binaries() / "helm", tmp_path / "helm")
    kube = ("--namespace", namespace, "--kubeconfig", str(cluster.kubeconfig))
    try:
        installed = helm.run("install", f"crd-{suffix}", str(chart), *kube, "--wait", "--timeout", "60s")
        assert installed.returncode == 0, installed.stderr
        assert served_schema(cluster, name)["description"] == "an older release's description"

        # Without --force-conflicts the apply is refused: Helm owns the fields it set.
        plain = cluster.kubectl("apply", "--server-side", "-f", str(newer))
        assert plain.returncode != 0 and "conflict" in plain.stderr.lower(), (plain.stdout, plain.stderr)

        forced = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(newer))
        assert forced.returncode == 0, forced.stderr
        schema = served_schema(cluster, name)
        assert schema == new["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        eventually(
            lambda: cluster.kubectl("get", f"upgradeprobes{suffix}", "-A").returncode == 0 or None,
            30,
            "the upgraded CRD served",
        )
        # The next upgrade runs the same command, and `helm upgrade` leaves the CRD alone.
        again = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(newer))
        assert again.returncode == 0, again.stderr
        upgraded = helm.run("upgrade", f"crd-{suffix}", str(chart), *kube, "--wait", "--timeout", "60s")
        assert upgraded.returncode == 0, upgraded.stderr
        assert served_schema(cluster, name) == new["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    finally:
        helm.run("uninstall", f"crd-{suffix}", *kube, "--ignore-not-found")
        cluster.kubectl("delete", "crd", name, "--ignore-not-found", "--wait=false")
