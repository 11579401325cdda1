"""`inferencepool demo` end to end on the session's control plane: the README's first command, as a test;
and the Prometheus that `demo --keep` leaves scraping the pool."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from tests.support.cluster import eventually

from inferencepool.demo import run as demo
from inferencepool.observability import localprom

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

ROOT = Path(__file__).resolve().parents[2]


def test_demo_routes_short_prompts_direct_and_long_ones_through_prefill(
    cluster: TestCluster, namespace: str, tmp_path: Path
) -> None:
    pool = yaml.safe_load((ROOT / "examples" / "demo-cpu.yaml").read_text())
    pool["metadata"]["namespace"] = namespace
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(yaml.safe_dump(pool))

    out = tmp_path / "out"
    command = [sys.executable, "-m", "inferencepool", "demo", "--state-dir", str(cluster.state_dir)]
    result = subprocess.run(
        [*command, "--pool-file", str(pool_file), "--timeout", "180", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=ROOT,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    short = next(line for line in output.splitlines() if "short prompt" in line)
    long = next(line for line in output.splitlines() if "long prompt" in line)
    assert "route=direct" in short, output
    assert "route=disaggregated" in long, output
    # The autoscaler read each pool's latency from the engines' own histograms.
    readings = [line for line in output.splitlines() if "autoscaler:" in line]
    assert any("prefill p90 TTFT" in line and "vs target 800 ms" in line for line in readings), output
    assert any("decode p90 ITL" in line and "vs target 40 ms" in line for line in readings), output
    # Half the demo's load is long prompts: the router's split, read from its metrics, lands in status.
    split = next(line for line in output.splitlines() if "went through the prefill pool" in line)
    assert 20 <= int(split.split("router: ")[1].split("%")[0]) <= 80, split
    # The operator diagnosed the bottleneck of that traffic, and the demo ends with `inferencepool diagnose`.
    assert any(line.startswith("    operator: bottleneck ") for line in output.splitlines()), output
    report = output[output.index(f"pool {namespace}/demo: bottleneck ") :]
    assert "what-if: this window's traffic replayed in the simulator" in report, output
    # The load step: the planner scaled a pool up, said why with its figures (status and event), and the new
    # pod became Ready; the plot and its samples show it.
    lines = output.splitlines()
    decision = next(line for line in lines if re.search(r"planner: (prefill|decode) \d+ -> \d+ \(", line))
    role, before, after, reason = re.findall(r"planner: (\w+) (\d+) -> (\d+) \((\w+);", decision)[0]
    assert int(after) > int(before) and reason in ("ForecastUp", "LatencyGuard", "ScalingLimited"), decision
    target = "800ms" if role == "prefill" else "40ms"
    assert "demand" in decision and "engine-s/s" in decision and f"vs target {target}" in decision, decision
    assert any(f"status.{role}.lastScaling: reason {reason}" in line for line in lines), output
    assert any(f"ScaledUp on pool demo: {role}: {before} -> {after} ({reason}" in line for line in lines), (
        output
    )
    assert any(f"pod demo-{role}-{before} Ready" in line for line in lines), output
    plot = out / "load-step.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"the load step's plot (TTFT and ITL against their targets, replicas over time): {plot}" in output
    recorded = json.loads((out / "load-step.json").read_text())
    series = recorded["roles"][role]
    assert max(series["desired"]) > series["desired"][0] and max(series["ready"]) > series["ready"][0], series
    assert series["decisions"] and series["decisions"][0]["text"].startswith(f"{role} {before} -> "), series
    assert [recorded["roles"][r]["target_ms"] for r in ("prefill", "decode")] == [800, 40], recorded
    assert any(v is not None for v in recorded["roles"]["prefill"]["observed_ms"]), recorded
    assert sum(recorded["clients"]["counts"]) > 0, recorded
    # The demo leaves a running cluster up, but removes its pool and stops its operator.
    assert cluster.kubectl("get", "pdpool", "-n", namespace, "-o", "name").stdout.strip() == ""
    assert cluster.kubectl("get", "--raw", "/readyz").returncode == 0


def prometheus_query(url: str, expr: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as response:
        return list(json.loads(response.read())["data"]["result"])


def test_demo_keep_leaves_a_prometheus_scraping_the_namespaces_pods_and_the_operator(
    cluster: TestCluster, namespace: str, tmp_path: Path
) -> None:
    try:
        localprom.prometheus_binary()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    # The operator's metrics endpoint, as `inferencepool operator --metrics-port` serves it.
    registry = CollectorRegistry()
    Gauge("inferencepool_demo_test", "a gauge the test serves", registry=registry).set(1)
    port = demo.free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "scraped", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "example/none:1", "ports": [{"containerPort": 9}]}]},
    }
    kubectl = demo.Kubectl(cluster.kubectl_binary, cluster.kubeconfig)
    process = None
    try:
        process = demo.start_prometheus(kubectl, cluster.kubeconfig, namespace, tmp_path, port)
        assert process is not None
        url = (tmp_path / "demo-prometheus" / "url").read_text().strip()
        eventually(
            lambda: prometheus_query(url, 'inferencepool_demo_test{job="inferencepool-operator"}'),
            60,
            "Prometheus scraping the operator's address",
        )
        # Its discovery follows the namespace's pods (listed every 2 s into the file Prometheus reads).
        kubectl("apply", "-f", "-", input_text=json.dumps(pod))
        pods_file = tmp_path / "demo-prometheus" / "pods.json"
        eventually(lambda: "scraped" in pods_file.read_text(), 60, "the new pod in the discovery file")
        # It outlives the demo until it is stopped; SIGTERM stops Prometheus with it.
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        process = None
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/-/ready", timeout=5)
    finally:
        if process is not None:
            demo.stop_process(process, grace_seconds=10)
        server.shutdown()
        thread.join(10)
