"""A Prometheus server on this machine (Debian's `prometheus` package; never a service): started with a
generated config that scrapes a local cluster's pools the way the chart's PodMonitors do, plus the alert
rules, so the dashboard's queries can be run against it (the e2e scenario, `inferencepool demo`)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferencepool.observability import alerts, scrape

INSTALL_HINT = "Prometheus is not installed: apt-get install -y prometheus (Debian/Ubuntu)"


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError(INSTALL_HINT)
    return binary


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def cluster_scrape_configs(
    pods_file: Path | None, interval: str = "5s", operator_target: str | None = None
) -> list[dict[str, Any]]:
    """Engines and routers relabelled as the PodMonitors do, found in `pods_file` (written by PodDiscovery)
    or, when None, by in-cluster Kubernetes discovery; the operator at `operator_target` (host:port) too."""
    configs = [
        scrape.scrape_config(
            target,
            f"inferencepool-{target.name}",
            interval,
            kubernetes_sd={} if pods_file is None else None,
            file_sd=None if pods_file is None else str(pods_file),
        )
        for target in scrape.POOL_TARGETS
    ]
    if operator_target is not None:
        configs.append(
            scrape.scrape_config(
                scrape.OPERATOR,
                "inferencepool-operator",
                interval,
                static_targets=[{"targets": [operator_target]}],
            )
        )
    return configs


@dataclass
class LocalPrometheus:
    url: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def _get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=30) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/query", query=expr)["result"])

    def wait_for(self, expr: str, timeout: float) -> list[dict[str, Any]]:
        """The query's result once non-empty; [] after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(2)

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self._get("/api/v1/rules")["groups"] for rule in group["rules"]]

    def targets(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/targets")["activeTargets"])

    def log_tail(self, lines: int = 20) -> str:
        log = self.workdir / "prometheus.log"
        return "\n".join(log.read_text().splitlines()[-lines:]) if log.exists() else ""

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start(
    workdir: Path,
    scrape_configs: list[dict[str, Any]],
    thresholds: alerts.Thresholds | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    ready_timeout: float = 30.0,
) -> LocalPrometheus:
    """Start Prometheus on `host` with these scrape configs and the alert rules; returns once it is ready."""
    binary = prometheus_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    rules = workdir / "rules.yaml"
    rules.write_text(yaml.safe_dump(alerts.rule_groups(thresholds or alerts.Thresholds()), sort_keys=False))
    config = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": [str(rules)],
        "scrape_configs": scrape_configs,
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = port or free_port(host)
    log = (workdir / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={host}:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    prometheus = LocalPrometheus(f"http://{host}:{port}", process, workdir)
    deadline = time.monotonic() + ready_timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited {process.returncode}:\n{prometheus.log_tail()}")
        try:
            with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return prometheus
        except OSError:
            pass
        if time.monotonic() > deadline:
            prometheus.stop()
            raise RuntimeError(f"prometheus not ready in {ready_timeout:.0f} s:\n{prometheus.log_tail()}")
        time.sleep(0.3)


def panel_expr(
    expr: str, namespace: str, pool: str, rate_interval: str = "1m", percentile: str = "0.9"
) -> str:
    """A dashboard query with Grafana's template variables filled in as Grafana would."""
    return (
        expr.replace("$namespace", namespace)
        .replace("$pool", pool)
        .replace("$percentile", percentile)
        .replace("$__rate_interval", rate_interval)
    )


def dashboard_problems(
    prometheus: LocalPrometheus, namespace: str, pool: str, exempt: frozenset[str], timeout: float
) -> list[str]:
    """The dashboard's queries (and annotations) that return no data for this pool within `timeout`, and
    legends naming labels the series lack; queries reading an `exempt` metric are skipped."""
    from inferencepool.observability import dashboard

    problems: list[str] = []
    deadline = time.monotonic() + timeout
    # Annotations first: they look back a short window for changes (a scaling decision) just made.
    checks = [(f"annotation {a.name}", a.expr, "") for a in dashboard.ANNOTATIONS]
    checks += [(panel.title, query.expr, query.legend) for panel, query in dashboard.queries()]
    for title, expr, legend in checks:
        if any(name in expr for name in exempt):
            continue
        filled = panel_expr(expr, namespace, pool)
        result = prometheus.wait_for(filled, max(0.0, deadline - time.monotonic()))
        if not result:
            problems.append(f"{title}: no data for {filled}")
        for label in re.findall(r"\{\{(\w+)\}\}", legend):
            if any(label not in series["metric"] for series in result):
                problems.append(f"{title}: legend label {label!r} missing in {filled}")
    return problems


class PodDiscovery:
    """Kubernetes pod discovery for a Prometheus built without it: lists the pods every `interval` seconds
    (through `list_pods`) and writes them, labelled as Kubernetes discovery labels them, to `path`."""

    def __init__(
        self, path: Path, list_pods: Callable[[], list[dict[str, Any]]], interval: float = 2.0
    ) -> None:
        self.path, self._list, self._interval = path, list_pods, interval
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="pod-discovery", daemon=True)
        self._thread.start()

    def refresh(self) -> None:
        groups = scrape.pod_targets(self._list())
        staging = self.path.with_suffix(".tmp")
        staging.write_text(json.dumps(groups))
        staging.replace(self.path)  # Prometheus never reads a half-written file

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.refresh()
            except Exception:  # a failed listing keeps the last targets
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def start_for_cluster(
    workdir: Path,
    list_pods: Callable[[], list[dict[str, Any]]],
    operator_target: str | None = None,
    interval: str = "5s",
    port: int | None = None,
) -> tuple[LocalPrometheus, PodDiscovery]:
    """Prometheus on loopback scraping a cluster's pools (pods listed by `list_pods`, every 2 s) and the
    operator at `operator_target`, with the alert rules; stop both with `.stop()`. For `inferencepool demo`
    and the e2e scenario on the local control plane."""
    workdir.mkdir(parents=True, exist_ok=True)
    discovery = PodDiscovery(workdir / "pods.json", list_pods)
    try:
        prometheus = start(
            workdir, cluster_scrape_configs(workdir / "pods.json", interval, operator_target), port=port
        )
    except BaseException:
        discovery.stop()
        raise
    return prometheus, discovery
