"""The router's Prometheus metrics (prometheus-client), one registry per router so tests can run several.

Counters and histograms are updated on the hot path through pre-bound children; the ones every request
updates (per route and reason, and the latency histograms: one observation per streamed token) are HotCounter
and HotHistogram, plain fields exposed by a collector; gauges that mirror live state (in-flight per pod, known
pods, the current threshold, which token counter is in use) are read at scrape time by a collector, so they
cost nothing per request.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from inferencepool.router.pods import PodSet
from inferencepool.scheduling.decider import Route, RouteReason

PREFIX = "inferencepool_router"
ARRIVAL_WINDOW = f"{PREFIX}_window_prompt_tokens"
# The planner's burst window (PlannerSettings.burst_window_seconds): it holds what drains a window's work
# within the window plus the TTFT target, so the window is of the target's order. Much shorter counts one
# long prompt as a burst; much longer averages a burst into the level. Fixed windows, not sliding: a burst
# of a few seconds or more fills one whole window at its rate, as a sliding window would read it.
ARRIVAL_WINDOW_SECONDS = 2.0
# 0 (an idle window), then four buckets an octave from 128 tokens to 2M: the largest window of an
# interval is read as the top of its bucket (at most 19% over), capped by the interval's sum.
ARRIVAL_BUCKETS = (0.0, *(round(128 * 2 ** (i / 4)) for i in range(4 * 14 + 1)))
ARRIVAL_POOLS = ("prefill", "direct")
# vLLM's own TTFT and ITL buckets, so router-observed and engine-observed figures line up bucket for bucket.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    2.5,
    5,
    7.5,
    10,
    20,
    40,
    80,
    160,
)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
PROMPT_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def _created_series() -> bool:
    """Whether prometheus_client exports _created series (off with PROMETHEUS_DISABLE_CREATED_SERIES)."""
    return bool(getattr(prometheus_metrics, "_use_created", True))


class HistogramChild:
    """One label set's histogram: per-bucket counts (not cumulative; the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class CounterChild:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HotHistogram(Collector):
    """A histogram for the hot path: an observation is a bisect, a list increment and a float add, where
    prometheus_client's Histogram takes a lock for each of its two increments (0.5 us against 3.4 us here;
    a streamed request observes one gap per token). Exposed as prometheus_client exposes its own: cumulative
    buckets, count, sum, created. The router runs on one thread, so there is no lock."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        buckets: tuple[float, ...],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.bounds = tuple(float(bound) for bound in buckets)
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = HistogramChild(self.bounds)
        return child

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        created = _created_series()
        les = [floatToGoString(bound) for bound in (*self.bounds, math.inf)]
        for values, child in self._children.items():
            buckets, total = [], 0
            for le, count in zip(les, child.counts, strict=True):
                total += count
                buckets.append((le, float(total)))
            family.add_metric(list(values), buckets, child.sum)
            if created:
                labels = dict(zip(self.labelnames, values, strict=True))
                family.add_sample(f"{self.name}_created", labels, child.created)
        yield family


class HotCounter(Collector):
    """A counter for the hot path (a float add; prometheus_client's takes a lock), exposed as its own."""

    def __init__(
        self, name: str, documentation: str, labelnames: tuple[str, ...], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self._children: dict[tuple[str, ...], CounterChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> CounterChild:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = CounterChild()
        return child

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        created = _created_series()
        for values, child in self._children.items():
            family.add_metric(list(values), child.value, created=child.created if created else None)
        yield family


@dataclass
class LiveState:
    """What the scrape-time collector reads."""

    pods: PodSet
    threshold: Callable[[], int]
    counter_kind: Callable[[], str]
    counter_source: Callable[[], str]
    chars_per_token: Callable[[], float]
    # LMCache PD mode: ProxyNotif messages by outcome (received, malformed, unclaimed); empty otherwise.
    kv_push_notifications: Callable[[], dict[str, int]]
    # router.overload: per pool, (requests queued in the router, slots its engines run: None while unknown);
    # empty when shedding is off
    overload: Callable[[], dict[str, tuple[int, int | None]]] = dict


def arrival_pool(route: Route, reason: RouteReason) -> str:
    """Which pool a prompt's prefill is demand for: the prefill pool's when the router sent it there, or
    meant to (fallback, and prompts sent direct only because the prefill pool was busy, as the autoscaler's
    feed counts them), else the decode pods' (direct), lent prompts included: the feed counts them as decode
    demand that a prefill pod served."""
    if route is Route.LENT or (route is Route.DIRECT and reason is not RouteReason.PREFILL_BUSY):
        return "direct"
    return "prefill"


class WindowTotals:
    """Prompt tokens that arrived in each fixed window of `seconds` (aligned to the clock's multiples of it),
    as a histogram of the windows' totals: a window is observed once it has ended, idle ones as 0, so the
    count grows by one per window whatever the traffic and a reader that differences two scrapes sees every
    window that ended between them. Closed lazily (on the next arrival or scrape): the hot path adds a float.
    """

    def __init__(self, seconds: float, bounds: tuple[float, ...], clock: Callable[[], float]) -> None:
        self.seconds = seconds
        self.bounds = bounds
        self._clock = clock
        self._window = math.floor(clock() / seconds)
        self._open = 0.0
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0

    def _close_before(self, window: int) -> None:
        if window <= self._window:
            return
        self.counts[bisect_left(self.bounds, self._open)] += 1
        self.sum += self._open
        self.counts[0] += window - self._window - 1  # the idle windows in between
        self._window, self._open = window, 0.0

    def add(self, amount: float) -> None:
        self._close_before(math.floor(self._clock() / self.seconds))
        self._open += amount

    def closed(self) -> tuple[list[tuple[str, float]], float]:
        """The windows ended by now: cumulative (le, count) buckets, +Inf last, and their sum."""
        self._close_before(math.floor(self._clock() / self.seconds))
        buckets, total = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += count
            buckets.append(("+Inf" if math.isinf(bound) else repr(float(bound)), float(total)))
        return buckets, self.sum


class _ArrivalCollector(Collector):
    def __init__(self, windows: dict[str, WindowTotals]) -> None:
        self._windows = windows

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            ARRIVAL_WINDOW,
            f"Prompt tokens that arrived in each {ARRIVAL_WINDOW_SECONDS:g} s window (idle windows as 0), by "
            "the pool whose prefill they are demand for: prefill (sent or meant for the prefill pool) or "
            "direct (prefilled on decode pods). The autoscaler holds capacity for the largest (bursts)",
            labels=["pool"],
        )
        for pool, windows in self._windows.items():
            buckets, total = windows.closed()
            family.add_metric([pool], buckets, total)
        yield family


class _LiveCollector(Collector):
    def __init__(self, state: LiveState) -> None:
        self._state = state

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | InfoMetricFamily]:
        in_flight = GaugeMetricFamily(
            f"{PREFIX}_in_flight_requests",
            "Requests the router has open on each engine pod",
            labels=["pod", "role"],
        )
        pods = GaugeMetricFamily(
            f"{PREFIX}_pods", "Engine pods known to the router by role and state", labels=["role", "state"]
        )
        tally: dict[tuple[str, str], int] = {}
        for pod in self._state.pods.pods.values():
            in_flight.add_metric([pod.name, pod.role], pod.outstanding)
            state = (
                ("unresponsive" if pod.unresponsive else "serving")
                if pod.accepts_new
                else ("terminating" if pod.terminating else "not_ready")
            )
            tally[(pod.role, state)] = tally.get((pod.role, state), 0) + 1
        for role in ("prefill", "decode"):
            for state in ("serving", "unresponsive", "not_ready", "terminating"):
                pods.add_metric([role, state], tally.get((role, state), 0))
        yield in_flight
        yield pods
        threshold = GaugeMetricFamily(
            f"{PREFIX}_prefill_threshold_tokens",
            "Current LengthAware threshold in prompt tokens (adaptive or fixed)",
        )
        threshold.add_metric([], self._state.threshold())
        yield threshold
        counter = InfoMetricFamily(f"{PREFIX}_token_counter", "How the router counts prompt tokens")
        counter.add_metric([], {"kind": self._state.counter_kind(), "source": self._state.counter_source()})
        yield counter
        ratio = GaugeMetricFamily(
            f"{PREFIX}_estimate_chars_per_token",
            "Calibrated characters per token used by the estimate counter",
        )
        ratio.add_metric([], self._state.chars_per_token())
        yield ratio
        pools = self._state.overload()
        if pools:
            queued = GaugeMetricFamily(
                f"{PREFIX}_queued_requests",
                "router.overload: requests waiting in the router for a slot of the pool (role)",
                labels=["role"],
            )
            slots = GaugeMetricFamily(
                f"{PREFIX}_pool_slots",
                "router.overload: requests the pool's engines run without queueing, as the router learned "
                "them from their metrics (absent until every pod of the pool has queued once)",
                labels=["role"],
            )
            for role, (waiting, known) in pools.items():
                queued.add_metric([role], waiting)
                if known is not None:
                    slots.add_metric([role], known)
            yield queued
            yield slots
        notifications = self._state.kv_push_notifications()
        if notifications:
            family = CounterMetricFamily(
                f"{PREFIX}_kv_push_notifications",
                "LMCache PD mode: ProxyNotif messages from prefill engines, by outcome",
                labels=["outcome"],
            )
            for outcome, count in notifications.items():
                family.add_metric([outcome], count)
            yield family


class RouterMetrics:
    def __init__(self, state: LiveState, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.arrivals = {
            pool: WindowTotals(ARRIVAL_WINDOW_SECONDS, ARRIVAL_BUCKETS, clock) for pool in ARRIVAL_POOLS
        }
        registry.register(_ArrivalCollector(self.arrivals))
        self.requests = HotCounter(
            f"{PREFIX}_requests",
            "Requests by route (direct, disaggregated, fallback, lent: served whole on a prefill pod)",
            ("route",),
            registry,
        )
        self.routed_prompt_tokens = HotCounter(
            f"{PREFIX}_routed_prompt_tokens",
            "Prompt tokens of requests by the route that served them (the autoscaler's load by route)",
            ("route",),
            registry,
        )
        self.shed_demand_requests = Counter(
            f"{PREFIX}_shed_demand_requests",
            "Requests answered 429 by router.overload, by the route they would have taken: demand the "
            "engines never saw, which the autoscaler adds to that route's load (a client that retries counts "
            "again)",
            ["route"],
            registry=registry,
        )
        self.shed_demand_prompt_tokens = Counter(
            f"{PREFIX}_shed_demand_prompt_tokens",
            "Prompt tokens of the requests in inferencepool_router_shed_demand_requests, by the same route",
            ["route"],
            registry=registry,
        )
        self.ttft = HotHistogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Router-observed time to first streamed token, by route",
            ("route",),
            TTFT_BUCKETS,
            registry,
        )
        self.itl = HotHistogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Router-observed gap between streamed tokens, by route",
            ("route",),
            ITL_BUCKETS,
            registry,
        )
        self.prefill_leg = HotHistogram(
            f"{PREFIX}_prefill_leg_seconds",
            "Duration of the prefill leg of disaggregated requests",
            (),
            TTFT_BUCKETS,
            registry,
        ).labels()
        self.prompt_tokens = HotHistogram(
            f"{PREFIX}_prompt_tokens", "Prompt tokens as counted by the router", (), PROMPT_BUCKETS, registry
        ).labels()
        self.upstream_errors = Counter(
            f"{PREFIX}_upstream_errors",
            "Failed calls to engine pods, by pod and kind (connect, status, timeout, protocol)",
            ["pod", "role", "kind"],
            registry=registry,
        )
        self.fallbacks = Counter(
            f"{PREFIX}_fallbacks",
            "Requests meant for the prefill pool but served colocated, by reason",
            ["reason"],
            registry=registry,
        )
        self.decisions = HotCounter(
            f"{PREFIX}_disaggregation_decisions",
            "Route decisions by reason: policy, short, cached (long but the decode pod holds its prefix), "
            "long, prefill_busy, decode_busy, prefill_idle, decode_saturated (lent to a prefill pod while "
            "every decode pod queued), prefill_saturated (prefilled on an idle decode pod for a busy one "
            "while every prefill pod queued), no_prefill_pod, kv_incompatible (no prefill pod whose KV the "
            "decode pod can load)",
            ("reason",),
            registry,
        )
        self.decision_prompt_tokens = HotCounter(
            f"{PREFIX}_disaggregation_decision_prompt_tokens",
            "Prompt tokens of the route decisions, by reason (prefill_busy: prompts the prefill pool should "
            "have taken, prefilled on decode pods; the autoscaler counts them as prefill demand)",
            ("reason",),
            registry,
        )
        self.retries = Counter(
            f"{PREFIX}_retries",
            "Legs retried on another pod after a connection failure",
            ["role"],
            registry=registry,
        )
        self.rejected = Counter(
            f"{PREFIX}_rejected_requests",
            "Requests answered by the router itself with an error",
            ["status"],
            registry=registry,
        )
        self.shed = Counter(
            f"{PREFIX}_shed_requests",
            "Requests answered 429 because a pool they would run on had no free slot and its queue in the "
            "router was full, or they waited there too long, by that pool (role: decode, or prefill for a "
            "request going through the prefill pool) and the request's priority",
            ["role", "priority"],
            registry=registry,
        )
        self.kv_releases = Counter(
            f"{PREFIX}_kv_releases",
            "Decode legs sent for clients that went away between the legs, so that the prefill pod's KV is "
            "read now rather than held until its lease ends, by outcome (read, failed)",
            ["outcome"],
            registry=registry,
        )
        self.stale_peer_failures = Counter(
            f"{PREFIX}_stale_peer_failures",
            "Requests that failed against a restarted pod's engines (same name, another incarnation): a "
            "decode leg whose KV load failed from a prefill pod restarted since its prefill leg or before "
            "(role prefill), a decode leg that failed before its first event on a decode pod restarted under "
            "it or before (role decode); each is served elsewhere, but a count that keeps rising says a "
            "decode engine kept the previous engine's NIXL state",
            ["role"],
            registry=registry,
        )
        self.client_disconnects = Counter(
            f"{PREFIX}_client_disconnects",
            "Requests whose client went away before the end",
            registry=registry,
        )
        self.streams_resumed = Counter(
            f"{PREFIX}_streams_resumed",
            "Streams whose decode pod died mid-answer, by outcome (resumed on another pod, or broken)",
            ["outcome"],
            registry=registry,
        )
        self.threshold_changes = Counter(
            f"{PREFIX}_threshold_changes",
            "Adaptive threshold moves, by direction",
            ["direction"],
            registry=registry,
        )
        registry.register(_LiveCollector(state))
        self.requests_by_route = {route: self.requests.labels(route.value) for route in Route}
        self.prompt_tokens_by_route = {
            route: self.routed_prompt_tokens.labels(route.value) for route in Route
        }
        self.shed_demand_by_route = {
            route: (
                self.shed_demand_requests.labels(route.value),
                self.shed_demand_prompt_tokens.labels(route.value),
            )
            for route in Route
        }
        self.decisions_by_reason = {reason: self.decisions.labels(reason.value) for reason in RouteReason}
        self.decision_tokens_by_reason = {
            reason: self.decision_prompt_tokens.labels(reason.value) for reason in RouteReason
        }
        self.ttft_by_route = {route: self.ttft.labels(route.value) for route in Route}
        self.itl_by_route = {route: self.itl.labels(route.value) for route in Route}
        for outcome in ("read", "failed"):
            self.kv_releases.labels(outcome)
        for reason in (
            "no_prefill_pod",
            "kv_incompatible",
            "prefill_failed",
            "kv_push_timeout",
            "decode_leg_failed",
            "tokenize_failed",
            "lmcache_pd_unsupported",
        ):
            self.fallbacks.labels(reason)
        for outcome in ("resumed", "broken"):
            self.streams_resumed.labels(outcome)
        for role in ("prefill", "decode"):
            self.stale_peer_failures.labels(role)

    def shed_demand(self, route: Route, reason: RouteReason, prompt_tokens: float) -> None:
        """A prompt shed (429) before it reached an engine: demand for its route's pool, and an arrival."""
        requests, tokens = self.shed_demand_by_route[route]
        requests.inc()
        tokens.inc(prompt_tokens)
        self.arrived(route, reason, prompt_tokens)

    def arrived(self, route: Route, reason: RouteReason, prompt_tokens: float) -> None:
        """A prompt routed now: its tokens join its pool's arrival window."""
        self.arrivals[arrival_pool(route, reason)].add(prompt_tokens)
