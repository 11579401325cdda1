"""Fixtures of the tier against the local control plane (the `cluster` fixture itself is tests/conftest.py's):
the CRD installed, an admin client, the operator's own ServiceAccount, the operator run in a thread, and the
long-prompt clients the planner's tests switch on."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from tests.cluster.kube_helpers import (
    GPU_PRODUCT,
    OPERATOR_ACCOUNT,
    ROOT,
    background_load,
    kubectl_ok,
    ready_urls,
)
from tests.support.cluster import eventually

from inferencepool.api import labels
from inferencepool.controller.context import OperatorContext
from inferencepool.controller.runtime import operator_in_thread
from inferencepool.kube import Kube, load_configuration

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

# A prompt well past the router's 4,096-token threshold: it goes through the prefill pool. At the H100
# profile slowed 10x one takes ~1.7 s to prefill, so two clients keep one prefill pod about busy.
LONG_PROMPT = "word " * 6000


@pytest.fixture(scope="session")
def crd_installed(cluster: TestCluster) -> None:
    kubectl_ok(cluster, "apply", "--server-side", "-f", str(ROOT / "crds"))
    # `kubectl wait` fails at once (accessor error) on a CRD that has no condition yet: poll instead.
    crd = f"crd/{labels.PLURAL}.{labels.GROUP}"
    jsonpath = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
    eventually(
        lambda: cluster.kubectl("get", crd, "-o", jsonpath).stdout.strip() == "True", 60, f"{crd} Established"
    )


@pytest.fixture(scope="session")
def admin_kube(cluster: TestCluster) -> Iterator[Kube]:
    kube = Kube(load_configuration(str(cluster.kubeconfig)))
    yield kube
    kube.close()


@pytest.fixture(scope="session")
def operator_kubeconfig(cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig for the operator's own ServiceAccount, bound by deploy/operator/rbac.yaml: every operator
    test runs with exactly the permissions an installed operator gets."""
    kubectl_ok(cluster, "apply", "--server-side", "-f", str(ROOT / "deploy" / "operator" / "rbac.yaml"))
    namespace, account = OPERATOR_ACCOUNT
    token = kubectl_ok(cluster, "create", "token", account, "-n", namespace, "--duration=6h").strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": server}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": account}}],
        "current-context": "c",
    }
    path = tmp_path_factory.mktemp("operator") / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="session")
def gpu_nodes_labelled(cluster: TestCluster) -> None:
    """Label the fake GPU nodes as GPU feature discovery labels real ones (the GPU example selects on it)."""
    nodes = json.loads(kubectl_ok(cluster, "get", "nodes", "-o", "json"))["items"]
    for node in nodes:
        if node["status"].get("allocatable", {}).get("nvidia.com/gpu", "0") != "0":
            name = node["metadata"]["name"]
            kubectl_ok(cluster, "label", "--overwrite", "node", name, f"nvidia.com/gpu.product={GPU_PRODUCT}")


@pytest.fixture
def operator(crd_installed: None, operator_kubeconfig: Path, namespace: str) -> Iterator[OperatorContext]:
    with operator_in_thread(str(operator_kubeconfig), [namespace], retry_seconds=2.0) as state:
        yield state


@pytest.fixture
def long_prompts(
    request: pytest.FixtureRequest, admin_kube: Kube, namespace: str
) -> Iterator[threading.Event]:
    """Two clients send long prompts through the router of the requesting module's POOL, one after another,
    while the event is set."""
    pool = str(request.module.POOL)

    def body() -> dict[str, Any]:
        # a distinct first word: no prompt is a prefix-cache hit of another
        return {"model": "llama-8b", "prompt": f"{uuid.uuid4().hex} {LONG_PROMPT}", "max_tokens": 4}

    with background_load(lambda: ready_urls(admin_kube, namespace, pool, "router")[:1], body, 2) as on:
        yield on
