"""Latency histograms read from engines' Prometheus pages, differenced over time, and their quantiles (pure).

vLLM exports cumulative histograms (vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds) per
engine, labelled by model_name and engine. What happened in a window is the difference of two scrapes; a
pool's figure is the sum over its pods; its percentile is read the way Prometheus' histogram_quantile()
does it (linear interpolation inside the bucket that holds the rank), so the autoscaler and a Prometheus
dashboard agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

TTFT_METRIC = "vllm:time_to_first_token_seconds"
ITL_METRIC = "vllm:inter_token_latency_seconds"


class MetricsError(ValueError):
    """An engine's metrics page that cannot be read (named in the message)."""


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: `counts[i]` observations were <= `bounds[i]`; the last bound is +Inf."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def minus(self, earlier: Histogram) -> Histogram:
        """What was observed since `earlier`. A counter that went down means the engine restarted: then
        everything it reports now is new."""
        if earlier.bounds != self.bounds or any(
            e > n for e, n in zip(earlier.counts, self.counts, strict=True)
        ):
            return self
        return Histogram(
            self.bounds,
            tuple(n - e for n, e in zip(self.counts, earlier.counts, strict=True)),
            max(0.0, self.sum - earlier.sum),
        )

    def plus(self, other: Histogram) -> Histogram:
        if other.bounds != self.bounds:
            raise MetricsError(f"histogram buckets differ between engines: {self.bounds} vs {other.bounds}")
        return Histogram(
            self.bounds,
            tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)),
            self.sum + other.sum,
        )

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 < q < 1) in the histogram's unit, None without observations.

        As Prometheus: the rank q*count falls in a bucket; interpolate linearly between its lower and upper
        bound; a rank in the +Inf bucket answers the highest finite bound.
        """
        total = self.count
        if total <= 0:
            return None
        rank = q * total
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in zip(self.bounds, self.counts, strict=True):
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower_bound
                inside = cumulative - lower_count
                if inside <= 0:
                    return bound
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / inside
            lower_bound, lower_count = bound, cumulative
        return lower_bound


def read_histogram(text: str, name: str) -> Histogram | None:
    """The histogram `name` from a Prometheus text page, summed over its label sets; None when absent.

    Raises MetricsError for a page that does not parse or a histogram without a +Inf bucket.
    """
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as error:
        raise MetricsError(f"metrics page does not parse: {error}") from error
    family = next((f for f in families if f.name == name), None)
    if family is None:
        return None
    buckets: dict[float, float] = {}
    total_sum = 0.0
    for sample in family.samples:
        if sample.name == f"{name}_bucket":
            bound = float(sample.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
        elif sample.name == f"{name}_sum":
            total_sum += sample.value
    if not buckets:
        return None
    if math.inf not in buckets:
        raise MetricsError(f"{name} has no +Inf bucket")
    bounds = tuple(sorted(buckets))
    return Histogram(bounds, tuple(buckets[b] for b in bounds), total_sum)


class Window:
    """Per-pod scrapes of one histogram, kept long enough to difference over a time window."""

    def __init__(self) -> None:
        self._scrapes: dict[str, list[tuple[float, Histogram]]] = {}

    def add(self, pod: str, at: float, histogram: Histogram) -> None:
        self._scrapes.setdefault(pod, []).append((at, histogram))

    def keep_only(self, pods: set[str]) -> None:
        """Forget pods that are gone (their observations leave the window with them)."""
        for pod in list(self._scrapes):
            if pod not in pods:
                del self._scrapes[pod]

    def delta(self, now: float, seconds: float) -> Histogram | None:
        """Observations of the last `seconds`, summed over pods; None when no pod has two scrapes in it.

        Per pod: the newest scrape minus the newest one at least `seconds` old (or the oldest kept, for a pod
        younger than the window). Older scrapes are dropped.
        """
        total: Histogram | None = None
        horizon = now - seconds
        for pod, scrapes in self._scrapes.items():
            base = 0
            for index, (at, _) in enumerate(scrapes):
                if at <= horizon:
                    base = index
            del scrapes[:base]
            self._scrapes[pod] = scrapes
            if len(scrapes) < 2:
                continue
            change = scrapes[-1][1].minus(scrapes[0][1])
            total = change if total is None else total.plus(change)
        return total
