"""A window of one pool's measurements, from two snapshots of its pods' metrics pages (pure).

A snapshot is every engine's and router's Prometheus page at one moment, parsed once with the autoscaler's
`parse_page`. What happened between two snapshots is the difference of the cumulative histograms and counters
(`Histogram.minus`, `Counts.minus`: a counter that went down means the process restarted, and then what it
reports now is new), summed over the pods of a role. Gauges (queue depth, running batch, KV-cache usage) are
instantaneous: the window keeps their mean and maximum over the pods and both snapshots.

The same function serves the `inferencepool diagnose` command (pages it scraped or read from files) and the
operator (pages the autoscaler already scraped: nothing is scraped twice).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from inferencepool.autoscaler.histogram import (
    ITL_METRIC,
    TTFT_METRIC,
    Counts,
    Histogram,
    Page,
    read_histogram,
)

PodRole = Literal["prefill", "decode", "router"]
POD_ROLES: Final[tuple[PodRole, ...]] = ("prefill", "decode", "router")

# vLLM's engine-side names (vLLM 0.33; the fake engine exports the same).
WAITING: Final = "vllm:num_requests_waiting"
RUNNING: Final = "vllm:num_requests_running"
KV_USAGE: Final = "vllm:kv_cache_usage_perc"
NIXL_TRANSFER: Final = "vllm:nixl_xfer_time_seconds"  # decode side, NixlConnector (the fake exports it too)
E2E: Final = "vllm:e2e_request_latency_seconds"
ENGINE_COUNTERS: Final = (
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    # KV connector (LMCache, NIXL) cross-instance hits as vLLM counts them
    "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits",
    # LMCache's own counters, on the engine's page when LMCache shares vLLM's Prometheus directory
    "lmcache:num_requested_tokens",
    "lmcache:num_hit_tokens",
    "vllm:num_preemptions",
    "vllm:nixl_num_failed_transfers",
)
# The router's (router/metrics.py).
ROUTER_PREFIX: Final = "inferencepool_router"
ROUTER_REQUESTS: Final = f"{ROUTER_PREFIX}_requests"
ROUTER_TTFT: Final = f"{ROUTER_PREFIX}_time_to_first_token_seconds"
ROUTER_ITL: Final = f"{ROUTER_PREFIX}_inter_token_latency_seconds"
ROUTER_PREFILL_LEG: Final = f"{ROUTER_PREFIX}_prefill_leg_seconds"
ROUTER_PROMPT_TOKENS: Final = f"{ROUTER_PREFIX}_prompt_tokens"
ROUTER_FALLBACKS: Final = f"{ROUTER_PREFIX}_fallbacks"
ROUTER_DECISIONS: Final = f"{ROUTER_PREFIX}_disaggregation_decisions"
PEER_PREFILL_REASON: Final = "prefill_saturated"  # prefilled on an idle peer decode pod (role lending)
ROUTER_THRESHOLD: Final = f"{ROUTER_PREFIX}_prefill_threshold_tokens"
ROUTER_IN_FLIGHT: Final = f"{ROUTER_PREFIX}_in_flight_requests"
ROUTES: Final = ("direct", "disaggregated", "fallback", "lent")
FALLBACK_REASONS: Final = ("no_prefill_pod", "prefill_failed", "kv_push_timeout")


class WindowError(ValueError):
    """Snapshots that cannot make a window (named in the message)."""


@dataclass(frozen=True, slots=True)
class PodPage:
    pod: str
    role: PodRole
    page: Page


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float  # seconds (any clock, the same for both snapshots of a window)
    pages: tuple[PodPage, ...]


@dataclass(frozen=True, slots=True)
class Gauge:
    """An instantaneous figure over the pods of a role and both snapshots."""

    mean: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Gauge | None:
        return Gauge(sum(values) / len(values), max(values)) if values else None


@dataclass(frozen=True)
class EngineWindow:
    """One role's engines over the window, summed over its pods."""

    pods: int
    ttft: Histogram | None = None
    itl: Histogram | None = None
    counters: Mapping[str, float] = field(default_factory=dict)  # ENGINE_COUNTERS present on the pages
    waiting: Gauge | None = None  # per pod
    running: Gauge | None = None  # per pod
    kv_usage: Gauge | None = None  # 0..1, per pod
    nixl_transfer: Histogram | None = None
    e2e: Histogram | None = None  # request latency on this engine, arrival to last token

    def counter(self, name: str) -> float | None:
        return self.counters.get(name)

    @property
    def requests(self) -> float:
        return self.counters.get("vllm:request_success", 0.0)

    def in_flight(self, seconds: float) -> float | None:
        """Requests in flight per pod on average over the window, by Little's law: the seconds requests
        spent on these engines divided by the window (robust where two gauge readings are not)."""
        if self.e2e is None or self.e2e.count <= 0 or seconds <= 0 or self.pods <= 0:
            return None
        return self.e2e.sum / seconds / self.pods

    @property
    def computed_prompt_tokens(self) -> float:
        """Prompt tokens this role actually prefilled (not found in its prefix cache or fetched from a
        peer, CPU tier or prefill pod)."""
        total = self.counters.get("vllm:prompt_tokens", 0.0)
        cached = self.counters.get("vllm:prefix_cache_hits", 0.0)
        external = self.counters.get("vllm:external_prefix_cache_hits", 0.0)
        return max(0.0, total - cached - external)


@dataclass(frozen=True)
class RouterWindow:
    pods: int
    requests: Mapping[str, float] = field(default_factory=dict)  # by route
    ttft: Mapping[str, Histogram] = field(default_factory=dict)  # by route
    itl: Mapping[str, Histogram] = field(default_factory=dict)  # by route
    prefill_leg: Histogram | None = None
    prompt_tokens: Histogram | None = None
    fallbacks: Mapping[str, float] = field(default_factory=dict)  # by reason
    peer_prefills: float = 0.0  # disaggregated requests prefilled on a peer decode pod (role lending)
    threshold_tokens: float | None = None
    in_flight: Mapping[str, Gauge] = field(default_factory=dict)  # per engine pod, by role

    @property
    def total_requests(self) -> float:
        return sum(self.requests.values())

    def ttft_all(self) -> Histogram | None:
        return _sum_histograms(self.ttft.values())

    def itl_all(self) -> Histogram | None:
        return _sum_histograms(self.itl.values())


@dataclass(frozen=True)
class PoolWindow:
    seconds: float
    prefill: EngineWindow | None = None
    decode: EngineWindow | None = None
    router: RouterWindow | None = None

    def engines(self, role: Literal["prefill", "decode"]) -> EngineWindow | None:
        return self.prefill if role == "prefill" else self.decode


def _sum_histograms(histograms: Iterable[Histogram | None]) -> Histogram | None:
    total: Histogram | None = None
    for histogram in histograms:
        if histogram is not None and histogram.count > 0:
            total = histogram if total is None else total.plus(histogram)
    return total


def _where(page: Page, name: str, label: str, value: str) -> Page:
    """The page reduced to the samples of `name` whose `label` is `value` (to read one route's histogram)."""
    return {name: [sample for sample in page.get(name, []) if sample[1].get(label) == value]}


def _counter(page: Page, name: str, label: str | None = None, value: str | None = None) -> float | None:
    """A counter summed over its label sets (or those with `label` == `value`); None when absent."""
    samples = page.get(name, page.get(f"{name}_total"))
    if samples is None:
        return None
    return sum(
        sample_value
        for sample_name, labels, sample_value in samples
        if sample_name in (name, f"{name}_total") and (label is None or labels.get(label) == value)
    )


def _gauges(page: Page, name: str) -> list[float]:
    return [value for sample_name, _, value in page.get(name, []) if sample_name == name]


class _Summer:
    """Per-pod differences of histograms and counters, summed over pods."""

    def __init__(self) -> None:
        self.histograms: dict[str, Histogram] = {}
        self.counts: dict[str, Counts] = {}

    def histogram(self, key: str, earlier: Histogram | None, later: Histogram | None) -> None:
        if later is None:
            return
        change = later if earlier is None else later.minus(earlier)
        previous = self.histograms.get(key)
        if previous is None or previous.bounds == change.bounds:
            self.histograms[key] = change if previous is None else previous.plus(change)

    def counters(self, key: str, earlier: Counts | None, later: Counts) -> None:
        change = later if earlier is None else later.minus(earlier)
        previous = self.counts.get(key)
        self.counts[key] = change if previous is None else previous.plus(change)


def _engine_counts(page: Page) -> tuple[tuple[str, ...], Counts]:
    present = [(name, value) for name in ENGINE_COUNTERS if (value := _counter(page, name)) is not None]
    return tuple(n for n, _ in present), Counts(tuple(v for _, v in present))


def _engine_window(pairs: Sequence[tuple[Page | None, Page]], gauge_pages: Sequence[Page]) -> EngineWindow:
    summer = _Summer()
    counter_totals: dict[str, float] = {}
    for earlier, later in pairs:
        for key, metric in (
            ("ttft", TTFT_METRIC),
            ("itl", ITL_METRIC),
            ("nixl", NIXL_TRANSFER),
            ("e2e", E2E),
        ):
            summer.histogram(
                key,
                read_histogram(earlier, metric) if earlier is not None else None,
                read_histogram(later, metric),
            )
        names, later_counts = _engine_counts(later)
        earlier_counts: Counts | None = None
        if earlier is not None:
            earlier_names, counts = _engine_counts(earlier)
            earlier_counts = counts if earlier_names == names else None
        change = later_counts if earlier_counts is None else later_counts.minus(earlier_counts)
        for name, value in zip(names, change.values, strict=True):
            counter_totals[name] = counter_totals.get(name, 0.0) + value
    return EngineWindow(
        pods=len(pairs),
        ttft=summer.histograms.get("ttft"),
        itl=summer.histograms.get("itl"),
        counters=counter_totals,
        waiting=Gauge.of([v for p in gauge_pages for v in _gauges(p, WAITING)]),
        running=Gauge.of([v for p in gauge_pages for v in _gauges(p, RUNNING)]),
        kv_usage=Gauge.of([v for p in gauge_pages for v in _gauges(p, KV_USAGE)]),
        nixl_transfer=summer.histograms.get("nixl"),
        e2e=summer.histograms.get("e2e"),
    )


def _router_window(pairs: Sequence[tuple[Page | None, Page]], gauge_pages: Sequence[Page]) -> RouterWindow:
    summer = _Summer()
    thresholds: list[float] = []
    for earlier, later in pairs:
        for route in ROUTES:
            for key, metric in ((f"ttft/{route}", ROUTER_TTFT), (f"itl/{route}", ROUTER_ITL)):
                summer.histogram(
                    key,
                    read_histogram(_where(earlier, metric, "route", route), metric) if earlier else None,
                    read_histogram(_where(later, metric, "route", route), metric),
                )
        for key, metric in (("leg", ROUTER_PREFILL_LEG), ("prompt", ROUTER_PROMPT_TOKENS)):
            summer.histogram(
                key,
                read_histogram(earlier, metric) if earlier is not None else None,
                read_histogram(later, metric),
            )

        def counts(page: Page) -> Counts:
            routes = [_counter(page, ROUTER_REQUESTS, "route", r) or 0.0 for r in ROUTES]
            reasons = [_counter(page, ROUTER_FALLBACKS, "reason", r) or 0.0 for r in FALLBACK_REASONS]
            peer = _counter(page, ROUTER_DECISIONS, "reason", PEER_PREFILL_REASON) or 0.0
            return Counts((*routes, *reasons, peer))

        summer.counters("router", counts(earlier) if earlier is not None else None, counts(later))
        thresholds += _gauges(later, ROUTER_THRESHOLD)
    totals = summer.counts.get("router", Counts((0.0,) * (len(ROUTES) + len(FALLBACK_REASONS) + 1))).values
    in_flight: dict[str, list[float]] = {}
    for page in gauge_pages:
        for sample_name, labels, value in page.get(ROUTER_IN_FLIGHT, []):
            if sample_name == ROUTER_IN_FLIGHT:
                in_flight.setdefault(labels.get("role", ""), []).append(value)
    return RouterWindow(
        pods=len(pairs),
        requests=dict(zip(ROUTES, totals[: len(ROUTES)], strict=True)),
        ttft={r: h for r in ROUTES if (h := summer.histograms.get(f"ttft/{r}")) is not None and h.count},
        itl={r: h for r in ROUTES if (h := summer.histograms.get(f"itl/{r}")) is not None and h.count},
        prefill_leg=summer.histograms.get("leg"),
        prompt_tokens=summer.histograms.get("prompt"),
        fallbacks=dict(zip(FALLBACK_REASONS, totals[len(ROUTES) : -1], strict=True)),
        peer_prefills=totals[-1],
        threshold_tokens=sum(thresholds) / len(thresholds) if thresholds else None,
        in_flight={role: g for role, values in in_flight.items() if (g := Gauge.of(values)) is not None},
    )


def window(earlier: Snapshot, later: Snapshot, during: Sequence[Snapshot] = ()) -> PoolWindow:
    """What the pool did between two snapshots.

    A pod in both snapshots contributes its differences; a pod that appeared in between contributes all it
    reports (it started inside the window); a pod gone by the later snapshot contributes nothing. Gauges are
    read from the snapshots `during` the window when there are any (the ends of a window are often idle
    moments), else from both ends.
    """
    seconds = later.at - earlier.at
    if seconds <= 0:
        raise WindowError(f"the later snapshot must be taken after the earlier one (got {seconds:g} s apart)")
    before = {(p.role, p.pod): p.page for p in earlier.pages}
    roles: dict[PodRole, list[tuple[Page | None, Page]]] = {}
    for pod in later.pages:
        roles.setdefault(pod.role, []).append((before.get((pod.role, pod.pod)), pod.page))
    gauges: dict[PodRole, list[Page]] = {}
    for snapshot in during or (earlier, later):
        for pod in snapshot.pages:
            gauges.setdefault(pod.role, []).append(pod.page)
    if not roles:
        raise WindowError("the later snapshot holds no metrics page")
    return PoolWindow(
        seconds=seconds,
        prefill=_engine_window(roles["prefill"], gauges.get("prefill", [])) if "prefill" in roles else None,
        decode=_engine_window(roles["decode"], gauges.get("decode", [])) if "decode" in roles else None,
        router=_router_window(roles["router"], gauges.get("router", [])) if "router" in roles else None,
    )
