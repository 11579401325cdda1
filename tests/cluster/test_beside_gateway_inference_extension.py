"""Beside the Gateway API Inference Extension: its InferencePool CRD (inference.networking.k8s.io, short name
infpool) installed on the same API server as ours. Ours still answers to its short name `pdpool` and its fully
qualified name, the operator still reconciles, and the extension's own resource is untouched.

The extension's CRD is read from the shared reference folder beside the repository (../shared/reference/gie/,
as CI lays it out; INFERENCEPOOL_SHARED_DIR names another), never copied into the repository.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from tests.cluster.kube_helpers import example, get_pool, kubectl_ok
from tests.support.cluster import eventually

from inferencepool.api import labels
from inferencepool.controller.context import OperatorContext
from inferencepool.kube import Kube

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

ROOT = Path(__file__).resolve().parents[2]
GIE_CRD = Path("reference/gie/inference.networking.k8s.io_inferencepools.yaml")
GIE_RESOURCE = "inferencepools.inference.networking.k8s.io"


def shared_dir() -> Path:
    return Path(os.environ.get("INFERENCEPOOL_SHARED_DIR", ROOT.parent / "shared"))


@pytest.fixture(scope="module")
def gie_installed(cluster: TestCluster, crd_installed: None) -> Iterator[None]:
    path = shared_dir() / GIE_CRD
    assert path.exists(), (
        f"{path} is missing: the shared reference folder lies beside the repository (../shared), or set "
        "INFERENCEPOOL_SHARED_DIR"
    )
    crd = yaml.safe_load(path.read_text())
    assert crd["spec"]["names"]["plural"] == labels.PLURAL  # the premise: one plural, two groups
    kubectl_ok(cluster, "apply", "--server-side", "-f", str(path))
    jsonpath = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
    eventually(
        lambda: cluster.kubectl("get", f"crd/{GIE_RESOURCE}", "-o", jsonpath).stdout.strip() == "True",
        60,
        f"{GIE_RESOURCE} Established",
    )
    try:
        yield
    finally:
        kubectl_ok(cluster, "delete", f"crd/{GIE_RESOURCE}", "--wait=false")


def test_ours_answers_to_pdpool_and_its_full_name_beside_the_extensions(
    cluster: TestCluster, gie_installed: None, operator: OperatorContext, admin_kube: Kube, namespace: str
) -> None:
    document = example("demo-cpu.yaml")
    document["metadata"] = {"name": "beside", "namespace": namespace}
    for role in ("prefill", "decode"):
        document["spec"][role].pop("autoscaling")
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(document))
    # the operator reconciles as before
    eventually(
        lambda: ((get_pool(admin_kube, namespace, "beside") or {}).get("status") or {}).get(
            "observedGeneration"
        ),
        60,
        "the operator's status",
    )
    for resource in (labels.SHORT_NAME, labels.RESOURCE):
        listed = json.loads(kubectl_ok(cluster, "get", resource, "-n", namespace, "-o", "json"))
        assert [i["metadata"]["name"] for i in listed["items"]] == ["beside"], resource
        assert listed["items"][0]["apiVersion"] == f"{labels.GROUP}/{labels.VERSION}"
    explained = kubectl_ok(cluster, "explain", f"{labels.SHORT_NAME}.spec.model.revision")
    assert "Hugging Face revision" in explained
    # the extension's resource is its own: empty here, and served by its group
    theirs = json.loads(kubectl_ok(cluster, "get", "infpool", "-n", namespace, "-o", "json"))
    assert theirs["items"] == []
    # the printer columns of ours, by its short name
    table = kubectl_ok(cluster, "get", labels.SHORT_NAME, "-n", namespace, "-o", "wide")
    assert "REVISION" in table.splitlines()[0] and "PREFILL" in table.splitlines()[0]
