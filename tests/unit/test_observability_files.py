"""The dashboard, alert rules and scrape definitions: generated copies in sync, metric names that exist,
panels that fit, and rules promtool accepts (tests/http runs them on live data in a real Prometheus)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from inferencepool.engine_sim.core import EngineCore
from inferencepool.engine_sim.metrics import EngineMetrics
from inferencepool.observability import alerts, chart, dashboard, scrape
from inferencepool.observability.metrics import OperatorMetrics
from inferencepool.perf.profiles import get_profile
from inferencepool.router.metrics import LiveState, RouterMetrics
from inferencepool.router.pods import PodSet

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / chart.CHART_DIR
NAME = re.compile(r"\b(?:inferencepool_[a-z_]+|vllm:[a-z_]+|fake_engine:[a-z_]+)")


def exported_sample_names() -> set[str]:
    state = LiveState(
        pods=PodSet(),
        threshold=lambda: 4096,
        counter_kind=lambda: "estimate",
        counter_source=lambda: "chars",
        chars_per_token=lambda: 4.0,
        kv_push_notifications=lambda: {"received": 1},
    )
    registries = [
        RouterMetrics(state).registry,
        EngineMetrics(EngineCore(get_profile("zero"), "e0", nixl=True), "m").registry,
        OperatorMetrics().registry,
    ]
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.add(family.name)
            kinds = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ())
            names.update(family.name + suffix for suffix in kinds)
    return names


def all_expressions() -> list[str]:
    exprs = [query.expr for _, query in dashboard.queries()]
    exprs += [annotation.expr for annotation in dashboard.ANNOTATIONS]
    exprs += [
        rule["expr"] for group in alerts.rule_groups(alerts.Thresholds())["groups"] for rule in group["rules"]
    ]
    return exprs


def test_generated_files_are_what_the_package_renders() -> None:
    for path, text in chart.rendered().items():
        assert (ROOT / path).read_text() == text, f"{path} drifted: run `make observability`"


def test_every_metric_a_query_or_rule_reads_is_exported_by_the_router_engine_or_operator() -> None:
    exported = exported_sample_names()
    used = {name for expr in all_expressions() for name in NAME.findall(expr)}
    missing = used - exported - alerts.PENDING_ROUTER_METRICS
    assert not missing, f"unknown metric names: {missing}"
    # a pending name the router now exports leaves the list; one no rule reads has no reason to be on it
    assert not alerts.PENDING_ROUTER_METRICS & exported
    assert used >= alerts.PENDING_ROUTER_METRICS


def test_every_query_is_filtered_to_the_chosen_pool() -> None:
    for panel, query in dashboard.queries():
        for name in NAME.findall(query.expr):
            selector = query.expr[query.expr.index(name) + len(name) :]
            assert selector.startswith("{" + dashboard.POOL), f"{panel.title}: {name} is not filtered by pool"


def test_legends_name_only_labels_the_query_keeps() -> None:
    for panel, query in dashboard.queries():
        kept: set[str] = set()
        for grouping in re.findall(r"by \(([^)]*)\)", query.expr):
            kept |= {label.strip() for label in grouping.split(",")}
        legend = set(re.findall(r"\{\{(\w+)\}\}", query.legend))
        if panel.kind == "heatmap":
            kept.add("le")
        assert legend <= kept, f"{panel.title}: legend {legend - kept} is summed away"


def test_panels_are_laid_out_without_overlap_and_ids_are_unique() -> None:
    model = dashboard.dashboard()
    ids = [panel["id"] for panel in model["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in model["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        area = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
    variables = [v["name"] for v in model["templating"]["list"]]
    assert variables == ["datasource", "namespace", "pool", "percentile"]


def test_the_dashboard_covers_what_a_pool_owner_asks() -> None:
    titles = [panel.title for panel in dashboard.panels()]
    for wanted in (
        "Prefill: TTFT against target", "Decode: ITL against target", "Replicas", "Routing split",
        "Fallbacks by reason", "Prefill threshold in force", "Prompt length distribution",
        "Prefix-cache hit rate", "LMCache hit rate", "Queue depth", "Running batch", "KV-cache usage",
        "KV transfer time",
    ):  # fmt: skip
        assert wanted in titles
    ttft = next(p for p in dashboard.panels() if p.title == "Prefill: TTFT against target")
    legends = {q.legend for q in ttft.queries}
    assert {"router-side, {{route}}", "engine-side, prefill", "target"} <= legends


def test_chart_alert_values_are_the_rule_defaults() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["alerts"]
    defaults = {alerts.camel(k): int(v) for k, v in alerts.Thresholds().values().items()}
    assert {k: v for k, v in values.items() if k != "enabled"} == defaults


def test_every_alert_says_what_to_do_and_has_a_severity() -> None:
    (group,) = alerts.rule_groups(alerts.Thresholds())["groups"]
    names = [rule["alert"] for rule in group["rules"]]
    assert len(names) == len(set(names))
    for rule in group["rules"]:
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert "{{ $labels.pool }}" in rule["annotations"]["summary"]
        assert len(rule["annotations"]["description"]) > 80
        # Every alert keeps namespace and pool, so it can be routed and acted on per pool.
        assert "by (namespace, pool" in rule["expr"]


def test_helm_escaping_keeps_prometheus_templates_literal() -> None:
    assert chart.helm_escape("a {{ $labels.pool }} b") == "a {{`{{ $labels.pool }}`}} b"
    with pytest.raises(ValueError):
        chart.helm_escape("{{ open")


def test_pod_label_meta_names_follow_kubernetes_service_discovery() -> None:
    assert scrape.pod_label_meta("serving.inferencepool.dev/pool") == (
        "__meta_kubernetes_pod_label_serving_inferencepool_dev_pool"
    )
    # Routers' own `role` label names an engine role: a `role` target label would rename it.
    assert "role" not in {r.target for r in scrape.ROUTERS.relabelings}
    assert {r.target for r in scrape.ENGINES.relabelings} == {"pool", "role"}
    assert scrape.OPERATOR.honor_labels


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install -y prometheus)")
    for path in (ROOT / "deploy" / "monitoring" / "prometheus-rules.yaml",):
        result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    # A zero-minute variant (what the live test stages) is valid too.
    zero = {name: "0" for name in alerts.threshold_names()} | {"fallback_percent": "5"}
    staged = tmp_path / "staged.yaml"
    staged.write_text(yaml.safe_dump(alerts.rule_groups(zero)))
    result = subprocess.run([promtool, "check", "rules", str(staged)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pod_targets_carry_the_labels_kubernetes_discovery_gives() -> None:
    pod = {
        "metadata": {
            "name": "demo-decode-0",
            "namespace": "default",
            "labels": {"serving.inferencepool.dev/pool": "demo"},
        },
        "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {
            "podIP": "127.20.0.3",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    (group,) = scrape.pod_targets([pod, {"metadata": {"name": "pending"}, "spec": {}, "status": {}}])
    assert group["targets"] == ["127.20.0.3:8000"]
    labels = group["labels"]
    assert labels["__meta_kubernetes_pod_label_serving_inferencepool_dev_pool"] == "demo"
    assert labels["__meta_kubernetes_pod_labelpresent_serving_inferencepool_dev_pool"] == "true"
    assert labels["__meta_kubernetes_pod_container_port_name"] == "http"
    assert labels["__meta_kubernetes_pod_ready"] == "true"
    # File discovery lists every pod, so its config keeps the PodMonitor's selector rules.
    config = scrape.scrape_config(scrape.ENGINES, "engines", "5s", file_sd="/tmp/pods.json")
    assert config["relabel_configs"][: len(scrape.selector_relabelings(scrape.ENGINES))] == (
        scrape.selector_relabelings(scrape.ENGINES)
    )
