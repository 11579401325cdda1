"""The chart's monitoring: off by default; when on, PodMonitors, a PrometheusRule and the Grafana dashboard
exactly as inferencepool.observability defines them, tuned by the chart's values (helm template)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.cluster.test_chart_render import CHART, Helm

from inferencepool.cluster import build
from inferencepool.observability import alerts, dashboard, scrape

MONITORING_KINDS = {"PodMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(build.ensure_binaries() / "helm", tmp_path_factory.mktemp("helm"))


def monitoring(rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in rendered
        if d["kind"] in MONITORING_KINDS
        or (d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    ]


def by_name(rendered: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in rendered if d["kind"] == kind}


def test_monitoring_is_off_by_default_and_off_renders_nothing(helm: Helm) -> None:
    assert monitoring(helm.template()) == []
    # The parts' switches do nothing without the main one.
    assert monitoring(helm.template("--set", "monitoring.podMonitors.enabled=true")) == []


def test_monitoring_on_renders_monitors_rules_and_dashboard(helm: Helm) -> None:
    rendered = helm.template("--set", "monitoring.enabled=true")
    monitors = by_name(rendered, "PodMonitor")
    assert set(monitors) == {
        f"inferencepool-operator-{t.name}" for t in (*scrape.POOL_TARGETS, scrape.OPERATOR)
    }
    for target in scrape.POOL_TARGETS:
        spec = monitors[f"inferencepool-operator-{target.name}"]["spec"]
        assert spec["selector"] == target.selector()
        assert spec["namespaceSelector"] == {"any": True}
        assert spec["podMetricsEndpoints"] == [target.endpoint("15s")]
    operator = monitors["inferencepool-operator-operator"]["spec"]
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    assert operator["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert operator["namespaceSelector"] == {"matchNames": ["inferencepool-system"]}
    assert operator["podMetricsEndpoints"][0]["honorLabels"] is True

    (rule,) = by_name(rendered, "PrometheusRule").values()
    assert rule["spec"] == alerts.rule_groups(alerts.Thresholds())

    (configmap,) = [d for d in monitoring(rendered) if d["kind"] == "ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["inferencepool.json"]) == dashboard.dashboard()


def test_values_tune_thresholds_namespaces_labels_and_parts(helm: Helm) -> None:
    rendered = helm.template(
        "--set", "monitoring.enabled=true",
        "--set", "monitoring.alerts.fallbackPercent=20",
        "--set", "monitoring.alerts.latencyMissedMinutes=3",
        "--set", "monitoring.interval=30s",
        "--set", "monitoring.namespaces={team-a,team-b}",
        "--set", "monitoring.labels.release=kube-prometheus-stack",
        "--set", "monitoring.dashboard.namespace=grafana",
        "--set", "monitoring.dashboard.annotations.grafana_folder=Inference",
    )  # fmt: skip
    (rule,) = by_name(rendered, "PrometheusRule").values()
    tuned = {"fallback_percent": "20", "latency_missed_minutes": "3"}
    assert rule["spec"] == alerts.rule_groups(alerts.Thresholds().values() | tuned)
    for monitor in by_name(rendered, "PodMonitor").values():
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "30s"
    assert by_name(rendered, "PodMonitor")["inferencepool-operator-engines"]["spec"]["namespaceSelector"] == {
        "matchNames": ["team-a", "team-b"]
    }
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (configmap,) = [d for d in monitoring(rendered) if d["kind"] == "ConfigMap"]
    assert configmap["metadata"]["namespace"] == "grafana"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Inference"}

    only_rules = helm.template(
        "--set", "monitoring.enabled=true",
        "--set", "monitoring.podMonitors.enabled=false",
        "--set", "monitoring.dashboard.enabled=false",
    )  # fmt: skip
    assert {d["kind"] for d in monitoring(only_rules)} == {"PrometheusRule"}


def test_lint_is_clean_with_monitoring_on(helm: Helm) -> None:
    result = helm.run("lint", "--strict", str(CHART), "--set", "monitoring.enabled=true")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout, result.stdout


def test_schema_refuses_bad_thresholds(helm: Helm) -> None:
    result = helm.run("template", "x", str(CHART), "--set", "monitoring.alerts.fallbackPercent=200")
    assert result.returncode != 0
    assert "fallbackPercent" in result.stderr


def test_the_operator_serves_metrics_on_the_port_its_pod_monitor_scrapes(helm: Helm) -> None:
    import argparse

    from inferencepool.controller import cli as operator_cli

    rendered = helm.template("--set", "monitoring.enabled=true")
    (container,) = next(d for d in rendered if d["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    parser = argparse.ArgumentParser()
    operator_cli.configure(parser)
    args = parser.parse_args(container["args"])
    assert args.metrics_port == ports[scrape.OPERATOR_PORT]
    monitor = by_name(rendered, "PodMonitor")["inferencepool-operator-operator"]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == scrape.OPERATOR_PORT
