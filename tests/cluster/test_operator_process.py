"""`inferencepool operator` as a process, the way its Deployment runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.cluster import eventually

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster


def test_operator_stops_on_sigterm(cluster: TestCluster, namespace: str, tmp_path: Path) -> None:
    log = tmp_path / "operator.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "inferencepool", "operator", "--namespace", namespace],
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        eventually(
            lambda: "Initial authentication has finished" in log.read_text(), 60, "the operator to start"
        )
        process.send_signal(signal.SIGTERM)
        # A Deployment allows terminationGracePeriodSeconds (30 s by default) before SIGKILL. It used to
        # hang until SIGKILL: a stop flag nobody set kept a thread waiting after kopf had stopped.
        started = time.monotonic()
        returncode = process.wait(timeout=30)
        assert returncode == 0, log.read_text()
        assert "Operator is stopping" in log.read_text()
        assert time.monotonic() - started < 30
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
