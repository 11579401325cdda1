"""The real API server takes the project's CRD and examples and enforces the CRD's CEL rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.cluster import TestCluster, eventually

from inferencepool.api import labels

REPO = Path(__file__).resolve().parents[2]
CRD_NAME = f"{labels.PLURAL}.{labels.GROUP}"


def _apply_crds(cluster: TestCluster) -> None:
    result = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    assert result.returncode == 0, result.stderr
    assert CRD_NAME in result.stdout
    established = cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    assert established.returncode == 0, established.stderr


def test_crds_apply_server_side_and_are_served(cluster: TestCluster) -> None:
    _apply_crds(cluster)
    # Applying the same file again is a no-op for server-side apply: no conflict, same field manager.
    again = cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    assert again.returncode == 0, again.stderr
    resources = eventually(
        lambda: (
            (r := cluster.kubectl("api-resources", f"--api-group={labels.GROUP}", "-o", "name")).returncode
            == 0
            and CRD_NAME in r.stdout
            and r.stdout
        ),
        60,
        "the InferencePool resource in discovery",
    )
    assert CRD_NAME in resources


def test_examples_pass_server_side_dry_run(cluster: TestCluster, namespace: str) -> None:
    _apply_crds(cluster)
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert {path.name for path in examples} >= {"llama-3.1-8b.yaml", "demo-cpu.yaml"}
    result = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(REPO / "examples"))
    assert result.returncode == 0, result.stderr
    for path in examples:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        assert f"inferencepool.{labels.GROUP}/{name} created (server dry run)" in result.stdout


def _inverted_bounds(spec: dict[str, Any]) -> None:
    spec["decode"]["autoscaling"].update({"minReplicas": 5, "maxReplicas": 2})


def _pd_with_two_routers(spec: dict[str, Any]) -> None:
    spec["kvTransfer"] = {"connector": "LMCachePD"}
    spec["router"]["replicas"] = 2


def _no_cpu_tier_with_p2p(spec: dict[str, Any]) -> None:
    spec["kvCache"] = {"cpuOffloadGiB": 0, "p2p": {"enabled": True}}


def _no_cpu_tier_with_disk(spec: dict[str, Any]) -> None:
    spec["kvCache"] = {"cpuOffloadGiB": 0, "disk": {"sizeGiB": 10}}


def _tp_not_dividing(spec: dict[str, Any]) -> None:
    spec["prefill"]["tensorParallelSize"] = 2
    spec["decode"]["tensorParallelSize"] = 3


def _pd_unequal_tp(spec: dict[str, Any]) -> None:
    spec["kvTransfer"] = {"connector": "LMCachePD"}
    spec["kvCache"] = {"chunkSize": 256}
    spec["decode"]["tensorParallelSize"] = 2


def _pd_unknown_model_size(spec: dict[str, Any]) -> None:
    spec["kvTransfer"] = {"connector": "LMCachePD"}
    spec["kvCache"] = {"chunkSize": 256}
    spec["model"]["name"] = "example/unknown-model"


def _pd_small_buffer(spec: dict[str, Any]) -> None:
    spec["kvTransfer"] = {"connector": "LMCachePD"}
    spec["kvCache"] = {"chunkSize": 256, "pdBufferGiB": 3}  # a 32768-token prompt of Llama-3.1-8B is 4 GiB


@pytest.mark.parametrize(
    ("name", "mutate", "message"),
    [
        ("inverted-bounds", _inverted_bounds, "spec.decode.autoscaling.minReplicas must be <= maxReplicas"),
        (
            "no-cpu-p2p",
            _no_cpu_tier_with_p2p,
            "spec.kvCache.cpuOffloadGiB must be at least 1 when spec.kvCache.p2p.enabled is true",
        ),
        (
            "no-cpu-disk",
            _no_cpu_tier_with_disk,
            "spec.kvCache.cpuOffloadGiB must be at least 1 when spec.kvCache.disk is set",
        ),
        (
            "tp-ratio",
            _tp_not_dividing,
            "spec.prefill.tensorParallelSize and spec.decode.tensorParallelSize must divide one another",
        ),
        ("pd-tp", _pd_unequal_tp, "must be equal with the LMCachePD connector"),
        ("pd-buffer", _pd_unknown_model_size, "spec.kvCache.pdBufferGiB must be set"),
        ("pd-small-buffer", _pd_small_buffer, "spec.kvCache.pdBufferGiB must hold one prompt"),
        (
            "pd-two-routers",
            _pd_with_two_routers,
            "spec.router.replicas must be 1 when spec.kvTransfer.connector is LMCachePD",
        ),
    ],
)
def test_invalid_pool_is_rejected_with_the_cel_message(
    cluster: TestCluster, namespace: str, name: str, mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    _apply_crds(cluster)
    pool = yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    pool["metadata"]["name"] = name
    mutate(pool["spec"])
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input_text=yaml.safe_dump(pool))
    assert result.returncode != 0
    assert message in result.stderr
    assert name in result.stderr
    # Nothing was stored.
    listed = cluster.kubectl("get", CRD_NAME, "-n", namespace, "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert name not in listed.stdout
