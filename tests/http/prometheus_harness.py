"""A real Prometheus server (Debian's `prometheus` package) on loopback, for tests that run the dashboard's
queries and the alert rules on live data. Started per test module with a generated config; never a service."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from inferencepool.observability import dashboard

INSTALL_HINT = "Prometheus is not installed: apt-get install -y prometheus (Debian/Ubuntu)"


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip(INSTALL_HINT)
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def panel_expr(
    expr: str, namespace: str, pool: str, rate_interval: str = "10s", percentile: str = "0.9"
) -> str:
    """A dashboard query with Grafana's template variables filled in as Grafana would."""
    return (
        expr.replace("$namespace", namespace)
        .replace("$pool", pool)
        .replace("$percentile", percentile)
        .replace("$__rate_interval", rate_interval)
    )


@dataclass
class Prometheus:
    url: str
    session: aiohttp.ClientSession
    log: Path

    async def query(self, expr: str) -> list[dict[str, Any]]:
        async with self.session.get(f"{self.url}/api/v1/query", params={"query": expr}) as response:
            body = await response.json()
        if body.get("status") != "success":
            raise AssertionError(f"query failed: {expr}: {body.get('error')}")
        return list(body["data"]["result"])

    async def alerts(self) -> list[dict[str, Any]]:
        async with self.session.get(f"{self.url}/api/v1/alerts") as response:
            body = await response.json()
        return list(body["data"]["alerts"])

    async def targets(self) -> list[dict[str, Any]]:
        async with self.session.get(f"{self.url}/api/v1/targets") as response:
            body = await response.json()
        return list(body["data"]["activeTargets"])

    async def wait_for(self, expr: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        """The query's result once it is non-empty; [] after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            result = await self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            await asyncio.sleep(1)

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text().splitlines()[-20:]) if self.log.exists() else ""


@contextlib.asynccontextmanager
async def running_prometheus(
    workdir: Path, scrape_configs: list[dict[str, Any]], rules: Mapping[str, Any] | None = None
) -> AsyncIterator[Prometheus]:
    binary = prometheus_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": scrape_configs,
    }
    if rules is not None:
        (workdir / "rules.yaml").write_text(yaml.safe_dump(dict(rules), sort_keys=False))
        config["rule_files"] = [str(workdir / "rules.yaml")]
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            prometheus = Prometheus(url, session, log)
            deadline = time.monotonic() + 30
            while True:
                if process.poll() is not None:
                    raise AssertionError(f"prometheus exited {process.returncode}:\n{prometheus.log_tail()}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{url}/-/ready") as response:
                        if response.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise AssertionError(f"prometheus not ready in 30 s:\n{prometheus.log_tail()}")
                await asyncio.sleep(0.2)
            yield prometheus
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def check_dashboard(
    prometheus: Prometheus,
    namespace: str,
    pools: list[str],
    exempt: set[str],
    timeout: float = 60.0,
    queries: list[tuple[dashboard.Panel, dashboard.Query]] | None = None,
    annotations: tuple[dashboard.Annotation, ...] = dashboard.ANNOTATIONS,
) -> list[str]:
    """Problems with the dashboard's queries (or `queries`) on live data: a query no pool gets data for, a
    legend naming a label the series lack, or an exempt query (a metric the fake engine lacks) that
    unexpectedly has data."""
    problems: list[str] = []
    deadline = time.monotonic() + timeout
    for panel, query in dashboard.queries() if queries is None else queries:
        results: list[dict[str, Any]] = []
        while True:
            for pool in pools:
                results += await prometheus.query(panel_expr(query.expr, namespace, pool))
            if results or any(name in query.expr for name in exempt) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        if any(name in query.expr for name in exempt):
            if results:
                problems.append(f"{panel.title}: {query.expr} has data now: drop its exemption")
            continue
        if not results:
            problems.append(f"{panel.title} / {query.legend}: no data for {query.expr}")
        for label in dashboard_legend_labels(query.legend):
            lacking = [r["metric"] for r in results if label not in r["metric"]]
            if lacking:
                problems.append(f"{panel.title}: legend label {label!r} missing from {lacking[0]}")
    for annotation in annotations:
        while True:
            found = [
                r
                for pool in pools
                for r in await prometheus.query(panel_expr(annotation.expr, namespace, pool))
            ]
            if found or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        if not found:
            problems.append(f"annotation {annotation.name}: no data for {annotation.expr}")
    return problems


def dashboard_legend_labels(legend: str) -> list[str]:
    return re.findall(r"\{\{(\w+)\}\}", legend)
