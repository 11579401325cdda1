"""The end-to-end scenario (e2e/run.py) on the session's local cluster: chart install with monitoring,
examples/demo-cpu.yaml, routing, scaling, and every dashboard query on a real Prometheus. kind users run the
same script with --cluster kind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

ROOT = Path(__file__).resolve().parents[2]


def test_e2e_scenario_on_the_local_cluster(cluster: TestCluster) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("Prometheus is not installed: apt-get install -y prometheus (Debian/Ubuntu)")
    script = ROOT / "e2e" / "run.py"
    argv = [sys.executable, str(script), "--cluster", "local", "--kubeconfig", str(cluster.kubeconfig)]
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=900, check=False, env={**os.environ}
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "done: routing, scaling, dashboard queries and alerts checked" in result.stdout
