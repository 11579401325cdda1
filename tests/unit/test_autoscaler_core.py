"""The autoscaler's pure core: histograms from engine metrics pages, windows and quantiles (the planner's
decisions: test_autoscaler_planner.py)."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from inferencepool.autoscaler.histogram import (
    ITL_METRIC,
    TTFT_METRIC,
    Counts,
    Histogram,
    MetricsError,
    Window,
    parse_page,
    read_counts,
    read_gauge,
    read_histogram,
)

BOUNDS = (0.1, 0.5, 1.0, math.inf)


def page(name: str, counts: dict[str, tuple[float, ...]], total: float = 1.0) -> str:
    """A vLLM-shaped Prometheus page: one histogram per model label, cumulative counts per BOUNDS."""
    lines = [f"# HELP {name} latency", f"# TYPE {name} histogram"]
    for model, cumulative in counts.items():
        for bound, count in zip(BOUNDS, cumulative, strict=True):
            le = "+Inf" if math.isinf(bound) else str(bound)
            lines.append(f'{name}_bucket{{engine="0",le="{le}",model_name="{model}"}} {count}')
        lines.append(f'{name}_count{{engine="0",model_name="{model}"}} {cumulative[-1]}')
        lines.append(f'{name}_sum{{engine="0",model_name="{model}"}} {total}')
    return "\n".join(lines) + "\n"


def hist(*counts: float, total: float = 0.0) -> Histogram:
    return Histogram(BOUNDS, counts, total)


def test_histogram_is_summed_over_label_sets_and_absent_is_none() -> None:
    text = page(TTFT_METRIC, {"a": (1, 2, 3, 3), "b": (0, 5, 5, 6)}, total=2.0)
    assert read_histogram(parse_page(text), TTFT_METRIC) == Histogram(BOUNDS, (1, 7, 8, 9), 4.0)
    assert read_histogram(parse_page(text), ITL_METRIC) is None


def test_unreadable_pages_are_named_errors() -> None:
    with pytest.raises(MetricsError, match="does not parse"):
        parse_page('vllm:x_bucket{le="0.1" 3\n')
    no_inf = f'# TYPE {ITL_METRIC} histogram\n{ITL_METRIC}_bucket{{le="0.1"}} 3\n'
    with pytest.raises(MetricsError, match="no \\+Inf bucket"):
        read_histogram(parse_page(no_inf), ITL_METRIC)


@pytest.mark.parametrize(
    ("counts", "q", "expected"),
    [
        ((10, 60, 100, 100), 0.5, 0.1 + 0.4 * 40 / 50),  # interpolated inside (0.1, 0.5]
        ((10, 60, 100, 100), 0.05, 0.05),  # first bucket starts at 0
        ((10, 60, 100, 100), 1.0, 1.0),
        ((0, 0, 50, 100), 0.9, 1.0),  # rank in +Inf: the highest finite bound, as Prometheus
        ((0, 0, 0, 0), 0.9, None),
    ],
)
def test_quantile_follows_prometheus_histogram_quantile(
    counts: tuple[float, ...], q: float, expected: float | None
) -> None:
    got = hist(*counts).quantile(q)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_delta_and_engine_restart() -> None:
    earlier, later = hist(1, 2, 3, 3, total=1.0), hist(2, 6, 9, 10, total=3.0)
    assert later.minus(earlier) == hist(1, 4, 6, 7, total=2.0)
    restarted = hist(0, 1, 1, 1, total=0.2)
    assert restarted.minus(later) == restarted  # counters went down: everything reported is new
    with pytest.raises(MetricsError, match="buckets differ"):
        later.plus(Histogram((0.5, math.inf), (1, 1), 0.0))


def test_window_differences_each_pod_over_the_window_only() -> None:
    window = Window()
    window.add("a", 0.0, hist(0, 0, 0, 0))
    window.add("a", 50.0, hist(0, 100, 100, 100))  # 100 fast requests, 60+ s before "now"
    window.add("a", 100.0, hist(0, 100, 110, 110))  # then 10 slow ones
    window.add("b", 90.0, hist(1, 1, 1, 1))  # a new pod: its first scrape is its baseline
    window.add("b", 100.0, hist(1, 1, 5, 5))
    assert window.delta(110.0, 60.0) == hist(0, 0, 14, 14)
    window.keep_only({"b"})
    assert window.delta(110.0, 60.0) == hist(0, 0, 4, 4)
    assert Window().delta(1.0, 60.0) is None


def router_page() -> str:
    """What the router's /metrics serves (the same prometheus_client types and names)."""
    registry = CollectorRegistry()
    requests = Counter("inferencepool_router_requests", "Requests by route", ["route"], registry=registry)
    requests.labels("direct").inc(30)
    requests.labels("disaggregated").inc(10)
    threshold = Gauge("inferencepool_router_prefill_threshold_tokens", "Threshold", registry=registry)
    threshold.set(2048)
    return generate_latest(registry).decode()


def test_router_counters_by_route_and_gauge() -> None:
    page_text = parse_page(router_page())
    routes = ("direct", "disaggregated", "fallback")
    counts = read_counts(page_text, "inferencepool_router_requests", "route", routes)
    assert counts == Counts((30.0, 10.0, 0.0))  # a route not served yet counts 0
    assert read_gauge(page_text, "inferencepool_router_prefill_threshold_tokens") == 2048.0
    assert read_counts(page_text, "missing", "route", routes) is None
    assert read_gauge(page_text, "missing") is None
    window: Window[Counts] = Window()
    window.add("router-a", 0.0, Counts((30.0, 10.0, 0.0)))
    window.add("router-a", 10.0, Counts((40.0, 30.0, 2.0)))
    window.add("router-b", 0.0, Counts((5.0, 5.0, 0.0)))
    window.add("router-b", 10.0, Counts((1.0, 1.0, 0.0)))  # restarted: all of it is new
    assert window.delta(10.0, 60.0) == Counts((11.0, 21.0, 2.0))


@pytest.mark.parametrize("adaptive", [True, False])
def test_the_figures_carry_the_router_figures(
    adaptive: bool,
) -> None:
    from tests.unit.builders_examples import load_pool

    from inferencepool.autoscaler.runner import PoolAutoscaler

    events: list[tuple[str, str]] = []
    pool = load_pool("demo-cpu.yaml", router__adaptiveThreshold={"enabled": adaptive})
    scaler = PoolAutoscaler(
        cast(Any, None), pool, cast(Any, None), lambda _r, kind, reason, _m: events.append((kind, reason))
    )
    scaler.disaggregated_percent, scaler.threshold_tokens, scaler.lent_percent = 42, 2048, 7
    scaler.peer_prefill_percent = 3
    scaler.pool = load_pool(
        "demo-cpu.yaml",
        router__adaptiveThreshold={"enabled": adaptive},
        prefill__autoscaling={"enabled": False, "maxReplicas": 3, "target": {"ttftMilliseconds": 800}},
        decode__autoscaling={"enabled": False, "maxReplicas": 4, "target": {"itlMilliseconds": 40}},
    )
    figures = scaler.figures()
    assert (figures.disaggregated_percent, figures.threshold_tokens) == (42, 2048 if adaptive else None)
    assert (figures.lent_percent, figures.peer_prefill_percent) == (7, 3)
    assert not figures.roles and figures.limits is None  # no decision yet: no ScalingLimited either
    assert events == []
