"""The router's hot-path counters and histograms (plain fields behind a collector) expose the same page as
prometheus_client's own Counter and Histogram given the same observations, so every reader (the autoscaler's
feed, dashboards, alerts) sees no difference."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from inferencepool.router.metrics import ITL_BUCKETS, PROMPT_BUCKETS, HotCounter, HotHistogram

CREATED = re.compile(rb"^(\S+_created(?:\{[^}]*\})?) \S+$", re.MULTILINE)


def page(registry: CollectorRegistry) -> bytes:
    """The registry's exposition, creation timestamps blanked (they differ by when each was made)."""
    return CREATED.sub(rb"\1 T", generate_latest(registry))


@pytest.mark.parametrize("labelnames", [("route",), ()])
@pytest.mark.parametrize("buckets", [ITL_BUCKETS, PROMPT_BUCKETS])
def test_a_hot_histogram_exposes_what_prometheus_clients_histogram_does(
    labelnames: tuple[str, ...], buckets: tuple[float, ...]
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hot = HotHistogram("h_seconds", "a histogram", labelnames, buckets, ours)
    reference = Histogram("h_seconds", "a histogram", labelnames, buckets=buckets, registry=theirs)
    values = [0.0, 0.01, 0.012, 0.3, 7.0, buckets[-1], buckets[-1] * 2, 1e9]
    for k, value in enumerate(values):
        label = ("direct", "disaggregated")[k % 2]
        (hot.labels(label) if labelnames else hot.labels()).observe(value)
        (reference.labels(label) if labelnames else reference).observe(value)
    assert page(ours) == page(theirs)


def test_a_hot_counter_exposes_what_prometheus_clients_counter_does() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hot = HotCounter("requests", "requests by route", ("route",), ours)
    reference = Counter("requests", "requests by route", ["route"], registry=theirs)
    for route, amount in (("direct", 1.0), ("disaggregated", 2.5), ("direct", 3.0)):
        hot.labels(route).inc(amount)
        reference.labels(route).inc(amount)
    hot.labels("lent")
    reference.labels("lent")
    assert page(ours) == page(theirs)
