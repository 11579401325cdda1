"""`inferencepool demo --keep`'s Prometheus: a process of its own, so it outlives the demo with the pool.

Debian's Prometheus has no Kubernetes discovery: this process lists the namespace's pods every 2 s into the
file Prometheus reads (observability.localprom.start_for_cluster, relabelled as the chart's PodMonitors do),
scrapes the operator's /metrics, and writes Prometheus' URL to <workdir>/url once it is ready. SIGTERM stops
both. Started by the demo as `python -m inferencepool.demo.prometheus ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

URL_FILE = "url"


def list_pods(kubectl: str, kubeconfig: str, namespace: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [kubectl, "get", "pods", "-n", namespace, "-o", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": kubeconfig},
        check=True,
        timeout=30,
    )
    return list(json.loads(result.stdout)["items"])


def main(argv: list[str] | None = None) -> int:
    from inferencepool.observability import localprom

    parser = argparse.ArgumentParser(prog="python -m inferencepool.demo.prometheus")
    parser.add_argument("--kubectl", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--operator", default=None, help="the operator's metrics address, host:port")
    args = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    (args.workdir / URL_FILE).unlink(missing_ok=True)
    prometheus, discovery = localprom.start_for_cluster(
        args.workdir, lambda: list_pods(args.kubectl, args.kubeconfig, args.namespace), args.operator
    )
    try:
        staging = args.workdir / f"{URL_FILE}.tmp"
        staging.write_text(prometheus.url + "\n")
        staging.replace(args.workdir / URL_FILE)
        while not stop.wait(1.0):
            if prometheus.process.poll() is not None:
                print(f"prometheus exited:\n{prometheus.log_tail()}", file=sys.stderr)
                return 1
    finally:
        discovery.stop()
        prometheus.stop()
        (args.workdir / URL_FILE).unlink(missing_ok=True)
    return 0


def wait_for_url(workdir: Path, process: subprocess.Popen[bytes], timeout: float) -> str:
    """The URL the process wrote once its Prometheus was ready; RuntimeError if it exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        url_file = workdir / URL_FILE
        if url_file.exists():
            return url_file.read_text().strip()
        if process.poll() is not None:
            raise RuntimeError(f"the demo's Prometheus exited {process.returncode}; see {workdir}/log")
        time.sleep(0.3)
    raise RuntimeError(f"the demo's Prometheus was not ready within {timeout:.0f} s; see {workdir}/log")


if __name__ == "__main__":
    sys.exit(main())
