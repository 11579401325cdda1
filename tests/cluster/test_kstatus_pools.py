"""kstatus (sigs.k8s.io/cli-utils, what Flux and kpt wait with) on InferencePools: recorded objects in each
state, and a live pool of the local cluster from creation until it serves.

tests/kstatus/ is a tiny Go program over the library (its go.mod/go.sum pin the version), built here on first
use with the Go toolchain the control plane is built with.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.cluster.kube_helpers import (
    example,
    get_pool,
    kubectl_ok,
)
from tests.unit import recorded_pools
from tests.unit.test_observability_argocd_health import run_health

from inferencepool.cluster import build
from inferencepool.controller.context import OperatorContext
from inferencepool.kube import Kube

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster


SOURCE = Path(__file__).resolve().parents[1] / "kstatus"
POOL = "gitops"


@pytest.fixture(scope="session")
def kstatus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build.go_environment()  # a clear error when Go is missing or too old
    binary = tmp_path_factory.mktemp("kstatus") / "kstatus-check"
    env = {**os.environ, "CGO_ENABLED": "0"}
    result = subprocess.run(
        ["go", "build", "-trimpath", "-buildvcs=false", "-o", str(binary), "."],
        cwd=SOURCE, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return binary


def compute(binary: Path, *objects: dict[str, Any]) -> list[tuple[str, str]]:
    result = subprocess.run(
        [str(binary)], input=json.dumps(objects), capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    return [(r["status"], r["message"]) for r in map(json.loads, result.stdout.splitlines())]


@pytest.mark.parametrize(
    ("state", "expected"),
    [("loading", "InProgress"), ("ready", "Current"), ("limited", "Current"), ("spec_changed", "InProgress")],
)
def test_kstatus_reads_recorded_pools(kstatus: Path, state: str, expected: str) -> None:
    ((status, message),) = compute(kstatus, recorded_pools.STATES[state]())
    assert status == expected, message


def test_kstatus_fails_a_degraded_pool(kstatus: Path) -> None:
    ((status, message),) = compute(kstatus, recorded_pools.degraded())
    assert status == "Failed", message


def test_kstatus_waits_for_a_rollout_of_a_serving_pool(kstatus: Path) -> None:
    obj = recorded_pools.rolling_out()
    ready = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert ready["Ready"] == "True" and ready["Progressing"] == "True"
    ((status, message),) = compute(kstatus, obj)
    assert status == "InProgress", message


def test_kstatus_waits_for_a_revision_rollout_and_then_reads_current(kstatus: Path) -> None:
    rolling = recorded_pools.revision_rollout()
    conditions = {c["type"]: c for c in rolling["status"]["conditions"]}
    assert conditions["Progressing"]["reason"] == "RollingOutRevision"
    assert "decode 1/3 pods at the new revision (1 surge)" in conditions["Progressing"]["message"]
    assert rolling["status"]["rollout"]["toModelRevision"] == "v2"
    ((status, message),) = compute(kstatus, rolling)
    assert status == "InProgress", message
    done = recorded_pools.revision_rollout(done=True)
    assert "rollout" not in done["status"] and done["status"]["modelRevision"] == "v2"
    ((status, message),) = compute(kstatus, done)
    assert status == "Current", message


def test_kstatus_and_argocd_health_on_a_live_pool_from_creation_until_it_serves(
    cluster: TestCluster,
    operator: OperatorContext,
    admin_kube: Kube,
    namespace: str,
    kstatus: Path,
    tmp_path: Path,
) -> None:
    document = example("demo-cpu.yaml")
    document["metadata"] = {"name": POOL, "namespace": namespace}
    for role in ("prefill", "decode"):
        document["spec"][role].pop("autoscaling")
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(document))
    seen: list[tuple[str, str]] = []
    health: list[str] = []  # the Argo CD health check's verdicts on the same objects
    lua = shutil.which("lua5.1")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pool = get_pool(admin_kube, namespace, POOL)
        assert pool is not None
        ((status, message),) = compute(kstatus, pool)
        if not seen or seen[-1][0] != status:
            seen.append((status, message))
        if lua is not None:
            verdict = run_health(lua, pool, tmp_path)[0]
            if not health or health[-1] != verdict:
                health.append(verdict)
        ready = [c for c in (pool.get("status") or {}).get("conditions", []) if c["type"] == "Ready"]
        if ready and ready[0]["status"] == "True":
            break
        time.sleep(0.5)
    assert seen and seen[-1][0] == "Current", seen
    # While the engines started kstatus waited (it reads Reconciling, which mirrors Progressing then).
    assert any(status == "InProgress" for status, _ in seen), seen
    if lua is not None:
        assert health[-1] == "Healthy" and "Progressing" in health, health
        assert "Degraded" not in health, health
