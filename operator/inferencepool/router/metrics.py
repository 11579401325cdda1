"""The router's Prometheus metrics (prometheus-client), one registry per router so tests can run several.

Counters and histograms are updated on the hot path through pre-bound children; gauges that mirror live state
(in-flight per pod, known pods, the current threshold, which token counter is in use) are read at scrape time
by a collector, so they cost nothing per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from inferencepool.router.pods import PodSet
from inferencepool.scheduling.decider import Route, RouteReason

PREFIX = "inferencepool_router"
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
            state = "serving" if pod.accepts_new else ("terminating" if pod.terminating else "not_ready")
            tally[(pod.role, state)] = tally.get((pod.role, state), 0) + 1
        for role in ("prefill", "decode"):
            for state in ("serving", "not_ready", "terminating"):
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
    def __init__(self, state: LiveState) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Requests by route (direct, disaggregated, fallback, lent: served whole on a prefill pod)",
            ["route"],
            registry=registry,
        )
        self.routed_prompt_tokens = Counter(
            f"{PREFIX}_routed_prompt_tokens",
            "Prompt tokens of requests by the route that served them (the autoscaler's load by route)",
            ["route"],
            registry=registry,
        )
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Router-observed time to first streamed token, by route",
            ["route"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Router-observed gap between streamed tokens, by route",
            ["route"],
            buckets=ITL_BUCKETS,
            registry=registry,
        )
        self.prefill_leg = Histogram(
            f"{PREFIX}_prefill_leg_seconds",
            "Duration of the prefill leg of disaggregated requests",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Histogram(
            f"{PREFIX}_prompt_tokens",
            "Prompt tokens as counted by the router",
            buckets=PROMPT_BUCKETS,
            registry=registry,
        )
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
        self.decisions = Counter(
            f"{PREFIX}_disaggregation_decisions",
            "Route decisions by reason: policy, short, cached (long but the decode pod holds its prefix), "
            "long, prefill_busy, decode_busy, prefill_idle, decode_saturated (lent to a prefill pod while "
            "every decode pod queued), no_prefill_pod, kv_incompatible (no prefill pod whose KV the decode "
            "pod can load)",
            ["reason"],
            registry=registry,
        )
        self.decision_prompt_tokens = Counter(
            f"{PREFIX}_disaggregation_decision_prompt_tokens",
            "Prompt tokens of the route decisions, by reason (prefill_busy: prompts the prefill pool should "
            "have taken, prefilled on decode pods; the autoscaler counts them as prefill demand)",
            ["reason"],
            registry=registry,
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
        self.decisions_by_reason = {reason: self.decisions.labels(reason.value) for reason in RouteReason}
        self.decision_tokens_by_reason = {
            reason: self.decision_prompt_tokens.labels(reason.value) for reason in RouteReason
        }
        self.ttft_by_route = {route: self.ttft.labels(route.value) for route in Route}
        self.itl_by_route = {route: self.itl.labels(route.value) for route in Route}
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
