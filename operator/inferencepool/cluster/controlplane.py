"""Start, check and stop the local control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok and the pod runner, each a background process recorded by PID in the state directory.

`up` is idempotent: it starts only what is not running (reusing the recorded ports while any component is
still alive, choosing fresh free ports otherwise), then waits until the API server is ready, the nodes are
Ready and the `default` ServiceAccount exists. `down` stops every recorded process, pod processes included.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferencepool.cluster import build, components, pki, procs, stages
from inferencepool.cluster.components import COMPONENTS, ClusterConfig, Layout

Progress = Callable[[str], None]
POD_OCTETS = range(20, 255)
STOP_GRACE_SECONDS = {"pod-runner": 20.0}
DEFAULT_STOP_GRACE = 10.0


class ClusterError(RuntimeError):
    """The cluster did not come up; `component` names the culprit and `log` its log file."""

    def __init__(self, message: str, component: str | None = None, log: Path | None = None) -> None:
        super().__init__(message)
        self.component = component
        self.log = log

    def log_tail(self, lines: int = 30) -> str:
        if self.log is None or not self.log.is_file():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    alive: bool
    healthy: bool | None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _records(layout: Layout) -> dict[str, procs.ProcessRecord | None]:
    return {name: procs.read_record(layout.pid_file(name)) for name in COMPONENTS}


def _alive(record: procs.ProcessRecord | None) -> bool:
    return record is not None and procs.is_alive(record)


def running_components(layout: Layout) -> dict[str, bool]:
    return {name: _alive(record) for name, record in _records(layout).items()}


# --- pod ranges: one 127.<octet>.0.0/16 per state directory, so two clusters never hand out the same pod IP
def _leases_dir() -> Path:
    # One place per machine, whatever cache directory each cluster uses: 127.0.0.0/8 is shared by all.
    return Path(tempfile.gettempdir()) / "inferencepool-pod-ranges"


def _lease_holder_running(holder: Path) -> bool:
    """Running, or starting: `up` holds the state directory's lock from claiming the range until its
    components run, so clusters started at once (say, all waiting on one build) never share a range."""
    layout = Layout(holder)
    return any(running_components(layout).values()) or _lock_held(layout.lock)


def _lock_held(path: Path) -> bool:
    try:
        handle = path.open("r")
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def claim_pod_octet(layout: Layout, preferred: int | None) -> int:
    leases = _leases_dir()
    leases.mkdir(parents=True, exist_ok=True)
    with _locked(leases / ".lock"):
        candidates = [preferred] if preferred is not None else list(POD_OCTETS)
        for octet in candidates:
            lease = leases / str(octet)
            holder = Path(lease.read_text().strip()) if lease.is_file() else None
            if holder is None or holder == layout.root or not _lease_holder_running(holder):
                lease.write_text(f"{layout.root}\n")
                return octet
            if preferred is not None:
                raise ClusterError(
                    f"pod range 127.{octet}.0.0/16 of {layout.root} is in use by the running cluster in "
                    f"{holder}; "
                    f"stop it (inferencepool cluster down --state-dir {holder}) or purge this one"
                )
    raise ClusterError(
        f"every pod range 127.{POD_OCTETS.start}-{POD_OCTETS.stop - 1}.0.0/16 is taken ({leases})"
    )


def release_pod_octet(layout: Layout, octet: int) -> None:
    lease = _leases_dir() / str(octet)
    with _locked(_leases_dir() / ".lock"):
        if lease.is_file() and Path(lease.read_text().strip()) == layout.root:
            lease.unlink()


# --- health checks
def _https_ok(url: str, layout: Layout, timeout: float = 2.0) -> bool:
    try:
        context = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
        context.load_cert_chain(str(layout.pki / "admin.crt"), str(layout.pki / "admin.key"))
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return int(response.status) == 200
    except (OSError, urllib.error.URLError, ssl.SSLError):
        return False


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status) == 200 and json.loads(response.read()).get("health") == "true"
    except (OSError, urllib.error.URLError, ValueError):
        return False


def component_healthy(name: str, layout: Layout, config: ClusterConfig) -> bool | None:
    """None for components without a health endpoint (kwok is judged by its nodes)."""
    if name == "etcd":
        return _http_ok(f"http://127.0.0.1:{config.etcd_client_port}/health")
    if name == "kube-apiserver":
        return _https_ok(f"{config.server}/readyz", layout)
    if name == "kube-controller-manager":
        return _https_ok(f"https://127.0.0.1:{config.controller_manager_port}/healthz", layout)
    if name == "kube-scheduler":
        return _https_ok(f"https://127.0.0.1:{config.scheduler_port}/healthz", layout)
    if name == "pod-runner":
        record = procs.read_record(layout.pid_file(name))
        marker = layout.runner / "ready"
        return record is not None and marker.is_file() and marker.read_text().strip() == str(record.pid)
    return None


def _wait(
    what: str, check: Callable[[], bool], timeout: float, layout: Layout, component: str | None = None
) -> None:
    deadline = time.monotonic() + timeout
    record = procs.read_record(layout.pid_file(component)) if component else None
    while time.monotonic() < deadline:
        if check():
            return
        if record is not None and not procs.is_alive(record):
            raise ClusterError(
                f"{component} exited while waiting for {what}", component, layout.log(str(component))
            )
        time.sleep(0.2)
    raise ClusterError(
        f"timed out after {timeout:.0f}s waiting for {what}",
        component,
        layout.log(component) if component else None,
    )


# --- up
def _fresh_config(layout: Layout) -> ClusterConfig:
    previous = ClusterConfig.from_json(layout.config.read_text()) if layout.config.is_file() else None
    # A node's podCIDR is immutable, so a state directory keeps its pod range for as long as its etcd data
    # lives.
    preferred = previous.pod_octet if previous is not None and layout.etcd_data.exists() else None
    return ClusterConfig(
        etcd_client_port=free_port(),
        etcd_peer_port=free_port(),
        apiserver_port=free_port(),
        controller_manager_port=free_port(),
        scheduler_port=free_port(),
        pod_octet=claim_pod_octet(layout, preferred),
    )


def _start_component(name: str, bin_dir: Path, layout: Layout, config: ClusterConfig) -> None:
    argv = components.component_argv(name, bin_dir, layout, config, sys.executable)
    env = dict(os.environ)
    if name == "kwok":
        layout.kwok_home.mkdir(parents=True, exist_ok=True)
        env["HOME"] = str(layout.kwok_home)
    log = layout.log(name)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n")
    record = procs.spawn(argv, log, env=env, cwd=layout.root)
    procs.write_atomically(layout.pid_file(name), record.to_json())


def _wait_component(name: str, layout: Layout, config: ClusterConfig) -> None:
    timeouts = {"etcd": 60.0, "kube-apiserver": 180.0, "pod-runner": 60.0}
    if name == "kwok":
        time.sleep(0.5)
        if not _alive(procs.read_record(layout.pid_file(name))):
            raise ClusterError("kwok exited at start", name, layout.log(name))
        return
    _wait(
        f"{name} to report healthy",
        lambda: bool(component_healthy(name, layout, config)),
        timeouts.get(name, 90.0),
        layout,
        name,
    )


def _api(layout: Layout) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=str(layout.kubeconfig)))


def ensure_nodes(api: Any, pod_octet: int, count: int, gpus: int) -> list[str]:
    """Create the fake nodes that do not exist yet (existing ones are left as they are)."""
    from kubernetes.client.exceptions import ApiException

    names = []
    for index in range(count):
        manifest = components.node_manifest(index, pod_octet, gpus)
        names.append(manifest["metadata"]["name"])
        try:
            api.create_node(manifest)
        except ApiException as error:
            if error.status != 409:
                raise
    return names


def _nodes_ready(api: Any, names: list[str]) -> bool:
    ready = set()
    for node in api.list_node().items:
        if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []):
            ready.add(node.metadata.name)
    return set(names) <= ready


def _default_service_account(api: Any) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        api.read_namespaced_service_account("default", "default")
        return True
    except ApiException as error:
        if error.status == 404:
            return False
        raise


def _wait_until_usable(layout: Layout, config: ClusterConfig, nodes: int, gpus_per_node: int) -> None:
    api = _api(layout)
    names = ensure_nodes(api, config.pod_octet, nodes, gpus_per_node)
    _wait(
        f"node(s) {', '.join(names)} to be Ready (kwok)",
        lambda: _nodes_ready(api, names),
        60.0,
        layout,
        "kwok",
    )
    _wait(
        "the default ServiceAccount (kube-controller-manager)",
        lambda: _default_service_account(api),
        90.0,
        layout,
        "kube-controller-manager",
    )


def up(
    state_dir: Path, nodes: int = 1, gpus_per_node: int = 8, progress: Progress = build.stderr_progress
) -> Path:
    """Make sure the cluster in `state_dir` runs and is ready; return its kubeconfig path."""
    layout = Layout(state_dir)
    layout.root.mkdir(parents=True, exist_ok=True)
    with _locked(layout.lock):
        started = time.monotonic()
        bin_dir = build.ensure_binaries(progress)
        running = running_components(layout)
        if any(running.values()) and layout.config.is_file():
            config = ClusterConfig.from_json(layout.config.read_text())
        else:
            config = _fresh_config(layout)
            procs.write_atomically(layout.config, config.to_json())
        if not pki.Pki(layout.pki).complete():
            pki.generate(layout.pki, components.service_ip())
        procs.write_atomically(layout.kubeconfig, components.kubeconfig_text(config.server, layout))
        node_stages = (bin_dir / "kwok-node-stages.yaml").read_text()
        procs.write_atomically(layout.kwok_config, stages.kwok_config_yaml(node_stages))
        if layout.bin_link.is_symlink() or layout.bin_link.exists():
            layout.bin_link.unlink()
        layout.bin_link.symlink_to(bin_dir)
        started_now: list[str] = []
        try:
            for name in COMPONENTS:
                if running[name]:
                    continue
                progress(f"starting {name}")
                started_now.append(name)
                _start_component(name, bin_dir, layout, config)
                _wait_component(name, layout, config)
            _wait_until_usable(layout, config, nodes, gpus_per_node)
        except BaseException:
            # Leave nothing half-started behind; what was already running before this call stays.
            for name in reversed(started_now):
                record = procs.read_record(layout.pid_file(name))
                if record is not None:
                    procs.terminate([record], STOP_GRACE_SECONDS.get(name, DEFAULT_STOP_GRACE))
                layout.pid_file(name).unlink(missing_ok=True)
            raise
        if not all(running.values()):
            progress(f"cluster ready in {time.monotonic() - started:.1f}s (state {layout.root})")
        return layout.kubeconfig


# --- down / status
def _pod_process_records(layout: Layout) -> list[procs.ProcessRecord]:
    records = []
    for path in (layout.runner / "pods").glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        records += [
            procs.ProcessRecord.from_json(json.dumps(raw)) for raw in data.get("containers", {}).values()
        ]
    return records


def down(state_dir: Path, purge: bool = False, progress: Progress = build.stderr_progress) -> None:
    """Stop every process this state directory recorded (pod processes too) and delete the cluster's data.

    The logs stay for a post-mortem unless `purge`. Data is not kept across down/up on purpose: kwok forgets
    which pod IPs it handed out when it stops, so pods surviving in etcd could share an IP with new ones.
    """
    layout = Layout(state_dir)
    if not layout.root.exists():
        return
    with _locked(layout.lock):
        records = _records(layout)
        for name in reversed(COMPONENTS):
            record = records[name]
            if record is not None and procs.is_alive(record):
                progress(f"stopping {name} (pid {record.pid})")
                procs.terminate([record], STOP_GRACE_SECONDS.get(name, DEFAULT_STOP_GRACE))
        # Whatever the runner could not stop itself (it was killed, say) is stopped here.
        leftovers = [record for record in _pod_process_records(layout) if procs.is_alive(record)]
        if leftovers:
            progress(f"stopping {len(leftovers)} pod process(es) the runner left behind")
            procs.terminate(leftovers, DEFAULT_STOP_GRACE)
        if layout.config.is_file():
            release_pod_octet(layout, ClusterConfig.from_json(layout.config.read_text()).pod_octet)
        keep = {layout.lock} if purge else {layout.lock, layout.logs}
        for child in layout.root.iterdir():
            if child in keep:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    if purge:
        shutil.rmtree(layout.root, ignore_errors=True)


def status(state_dir: Path) -> list[ComponentStatus]:
    layout = Layout(state_dir)
    config = ClusterConfig.from_json(layout.config.read_text()) if layout.config.is_file() else None
    result = []
    for name, record in _records(layout).items():
        alive = _alive(record)
        healthy = component_healthy(name, layout, config) if alive and config is not None else None
        result.append(ComponentStatus(name, record.pid if record else None, alive, healthy))
    return result
