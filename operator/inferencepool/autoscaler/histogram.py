"""Latency histograms read from engines' Prometheus pages, differenced over time, and their quantiles (pure).

vLLM exports cumulative histograms (vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds) per
engine, labelled by model_name and engine. What happened in a window is the difference of two scrapes; a
pool's figure is the sum over its pods; its percentile is read the way Prometheus' histogram_quantile()
does it (linear interpolation inside the bucket that holds the rank), so the autoscaler and a Prometheus
dashboard agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

from prometheus_client.parser import text_string_to_metric_families

TTFT_METRIC = "vllm:time_to_first_token_seconds"
ITL_METRIC = "vllm:inter_token_latency_seconds"
# one observation per finished request: its mean time per output token (decode time / (output tokens - 1))
TPOT_METRIC = "vllm:request_time_per_output_token_seconds"


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

    def bucket_top(self, q: float) -> float | None:
        """The upper bound of the bucket holding the q-quantile's rank (how far `quantile`'s interpolation
        may be off: the true quantile lies in that bucket); None without observations."""
        total = self.count
        if total <= 0:
            return None
        rank = q * total
        for bound, cumulative in zip(self.bounds, self.counts, strict=True):
            if cumulative >= rank:
                return bound
        return self.bounds[-1]


# A parsed metrics page: family name -> its samples (name, labels, value).
Page = dict[str, list[tuple[str, dict[str, str], float]]]
# One pod's page as a round of the autoscaler parsed it, (role, pod, page); a reading is the round's time and
# all of them (what the bottleneck diagnosis reads).
PageReading = tuple[str, str, Page]
Reading = tuple[float, Sequence[PageReading]]


def parse_page(text: str) -> Page:
    """A Prometheus text page, parsed once for every reading below; MetricsError when it does not parse."""
    try:
        return {
            family.name: [(sample.name, sample.labels, sample.value) for sample in family.samples]
            for family in text_string_to_metric_families(text)
        }
    except ValueError as error:
        raise MetricsError(f"metrics page does not parse: {error}") from error


def read_histogram(page: Page, name: str) -> Histogram | None:
    """The histogram `name`, summed over its label sets; None when absent.

    Raises MetricsError for a histogram without a +Inf bucket.
    """
    samples = page.get(name)
    if samples is None:
        return None
    buckets: dict[float, float] = {}
    total_sum = 0.0
    for sample_name, labels, value in samples:
        if sample_name == f"{name}_bucket":
            bound = float(labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + value
        elif sample_name == f"{name}_sum":
            total_sum += value
    if not buckets:
        return None
    if math.inf not in buckets:
        raise MetricsError(f"{name} has no +Inf bucket")
    bounds = tuple(sorted(buckets))
    return Histogram(bounds, tuple(buckets[b] for b in bounds), total_sum)


@dataclass(frozen=True, slots=True)
class Counts:
    """Counters read together (requests per route, say), differenced like a histogram."""

    values: tuple[float, ...]

    def minus(self, earlier: Counts) -> Counts:
        if len(earlier.values) != len(self.values) or any(
            e > n for e, n in zip(earlier.values, self.values, strict=True)
        ):
            return self  # a counter went down: the process restarted
        return Counts(tuple(n - e for n, e in zip(self.values, earlier.values, strict=True)))

    def plus(self, other: Counts) -> Counts:
        return Counts(tuple(a + b for a, b in zip(self.values, other.values, strict=True)))


def read_counts(page: Page, name: str, label: str, keys: tuple[str, ...]) -> Counts | None:
    """The counter `name` per value of `label`, in the order of `keys` (absent values count 0); None when the
    page has no such counter."""
    # prometheus_client's text format names the family `<name>_total`; OpenMetrics names it `<name>`.
    samples = page.get(name, page.get(f"{name}_total"))
    if samples is None:
        return None
    values = dict.fromkeys(keys, 0.0)
    for sample_name, labels, value in samples:
        key = labels.get(label)
        if sample_name in (name, f"{name}_total") and key in values:
            values[key] += value
    return Counts(tuple(values[key] for key in keys))


def read_gauge(page: Page, name: str) -> float | None:
    samples = page.get(name)
    return samples[0][2] if samples else None


class Differenced(Protocol):
    def minus(self, earlier: Self) -> Self: ...

    def plus(self, other: Self) -> Self: ...


Sample = TypeVar("Sample", bound=Differenced)


class Window(Generic[Sample]):
    """Per-pod scrapes of one cumulative metric, kept long enough to difference over a time window."""

    def __init__(self) -> None:
        self._scrapes: dict[str, list[tuple[float, Sample]]] = {}

    def add(self, pod: str, at: float, sample: Sample) -> None:
        self._scrapes.setdefault(pod, []).append((at, sample))

    def keep_only(self, pods: set[str]) -> None:
        """Forget pods that are gone (their observations leave the window with them)."""
        for pod in list(self._scrapes):
            if pod not in pods:
                del self._scrapes[pod]

    def delta(self, now: float, seconds: float) -> Sample | None:
        """What the last `seconds` added, summed over pods; None when no pod has two scrapes in it.

        Per pod: the newest scrape minus the newest one at least `seconds` old (or the oldest kept, for a pod
        younger than the window). Older scrapes are dropped.
        """
        total: Sample | None = None
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
