"""`inferencepool cluster up|status|down` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.cluster import TestCluster, eventually

from inferencepool.cluster import procs
from inferencepool.cluster.components import COMPONENTS, Layout


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferencepool", "cluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def pids(state_dir: Path) -> dict[str, int]:
    layout = Layout(state_dir)
    records = {name: procs.read_record(layout.pid_file(name)) for name in COMPONENTS}
    return {name: record.pid for name, record in records.items() if record is not None}


def processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return [pid for pid in found if procs.pid_running(pid)]


def test_up_on_a_running_cluster_changes_nothing_and_prints_the_kubeconfig_last(cluster: TestCluster) -> None:
    before = pids(cluster.state_dir)
    result = cli("up", "--state-dir", str(cluster.state_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(cluster.kubeconfig)
    assert pids(cluster.state_dir) == before


def test_status_lists_every_component_healthy(cluster: TestCluster) -> None:
    result = cli("status", "--state-dir", str(cluster.state_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    for name in COMPONENTS:
        line = next(line for line in result.stdout.splitlines() if line.startswith(name + " "))
        assert "healthy" in line or "running" in line, line
    assert f"kubeconfig: {cluster.kubeconfig}" in result.stdout


def test_down_stops_every_process_it_started_including_pod_processes(
    cluster: TestCluster, tmp_path: Path
) -> None:
    state = tmp_path / "second"
    up = cli("up", "--state-dir", str(state))
    assert up.returncode == 0, up.stderr
    kubeconfig = up.stdout.strip().splitlines()[-1]
    router = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "router"},
        "spec": {"containers": [{"name": "router", "image": "inferencepool/router:0.1.0"}]},
    }
    applied = subprocess.run(
        [cluster.kubectl_binary, "--kubeconfig", kubeconfig, "apply", "-f", "-"],
        input=json.dumps(router),
        capture_output=True,
        text=True,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    pod_records = Layout(state).runner / "pods"
    eventually(lambda: list(pod_records.glob("*.json")), 120, "the router pod's process to start")
    (record_file,) = pod_records.glob("*.json")
    pod_pid = json.loads(record_file.read_text())["containers"]["router"]["pid"]
    started = pids(state)
    assert set(started) == set(COMPONENTS)

    down = cli("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    for name, pid in {**started, "router pod": pod_pid}.items():
        assert not procs.pid_running(pid), f"{name} (pid {pid}) still runs after down"
    # The data is gone, the logs stay for a post-mortem.
    assert sorted(path.name for path in state.iterdir()) == ["lock", "logs"]
    assert (state / "logs" / "kube-apiserver.log").is_file()
    assert list((state / "logs" / "pods").glob("*_router_router.log"))
    assert cli("down", "--state-dir", str(state), "--purge").returncode == 0
    assert not state.exists()


def test_a_component_that_fails_to_start_is_named_with_its_log_tail(
    cluster: TestCluster, tmp_path: Path
) -> None:
    state = tmp_path / "broken"
    # A serving certificate the API server cannot read: it exits at start.
    pki_dir = state / "pki"
    pki_dir.mkdir(parents=True)
    for name in ("ca.crt", "ca.key", "admin.crt", "admin.key"):
        (pki_dir / name).write_text("not a PEM file\n")
    try:
        result = cli("up", "--state-dir", str(state))
        assert result.returncode == 1
        assert "error: kube-apiserver exited" in result.stderr
        assert f"--- last lines of {state / 'logs' / 'kube-apiserver.log'} ---" in result.stderr
        assert "admin.key" in result.stderr.split("--- last lines of", 1)[1]
        # etcd, started by this failed `up`, was stopped again.
        assert pids(state) == {}
        assert not processes_mentioning(str(state))
    finally:
        assert cli("down", "--state-dir", str(state), "--purge").returncode == 0
    assert not state.exists()
