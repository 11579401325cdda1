"""vLLM's Prometheus metrics for the fake engine: names, labels and histogram buckets as vLLM 0.33 has them.

Latency histograms are observed by the server as tokens leave (wall clock, like vLLM's output processor);
gauges and counters are read from the engine core at scrape time, so they can never drift from the core's own
state. Each engine gets its own registry, so several engines can live in one process (tests).
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from inferencepool.engine_sim.core import FINISH_REASONS, EngineCore

LABELS = ("model_name", "engine")
# vLLM's latency histograms: (name, documentation) as vLLM 0.33's loggers.py registers them
TTFT = ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.")
ITL = ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.")
TPOT = (
    "vllm:request_time_per_output_token_seconds",
    "Histogram of time_per_output_token_seconds per request.",
)
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# vllm:request_time_per_output_token_seconds has the ITL buckets (loggers.py: inter_token_latency_buckets)
TPOT_BUCKETS = ITL_BUCKETS
# vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py, NixlPromMetrics: the transfer-time buckets
# without their first (0.001), and bytes in powers of two from 2 KiB to 8 GiB.
NIXL_XFER_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))


# LMCache's labels (lmcache/observability.py PrometheusLogger._metadata_to_labels)
LMCACHE_LABELS = ("model_name", "worker_id", "role", "served_model_name")


def request_tpot(first_token: float, last_token: float, generated: int) -> float:
    """A finished request's mean time per output token as vLLM 0.33 computes it
    (stats.py:update_from_finished_request): decode time, first to last token, over the tokens after the first
    (the prefill's token does not count); 0 for a request of one token."""
    return (last_token - first_token) / (generated - 1) if generated - 1 > 0 else 0.0


def _counters(specs: Iterable[tuple[str, str, float]], labels: Sequence[str]) -> Iterator[Metric]:
    """One counter family per (name, documentation, value), with one sample under `labels`."""
    for name, doc, value in specs:
        counter = CounterMetricFamily(name, doc, labels=LABELS)
        counter.add_metric(labels, value)
        yield counter


class _CoreCollector(Collector):
    def __init__(self, core: EngineCore, labels: tuple[str, str], model: str) -> None:
        self._core = core
        self._labels = list(labels)
        self._model = model

    def collect(self) -> Iterator[Metric]:
        core, values = self._core, self._labels
        stats = core.stats
        gauges = (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", core.num_running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", core.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", core.kv_usage),
        )
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=LABELS)
            gauge.add_metric(values, value)
            yield gauge
        counters = (
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens),
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             stats.prefix_cache_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             stats.prefix_cache_hits),
            ("vllm:external_prefix_cache_queries",
             "External prefix cache queries from KV connector cross-instance cache sharing, in terms of "
             "number of queried tokens.", stats.external_prefix_cache_queries),
            ("vllm:external_prefix_cache_hits",
             "External prefix cache hits from KV connector cross-instance cache sharing, in terms of "
             "number of cached tokens.", stats.external_prefix_cache_hits),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats.preemptions),
        )  # fmt: skip
        yield from _counters(counters, values)
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*LABELS, "finished_reason"],
        )
        for reason in FINISH_REASONS:
            success.add_metric([*values, reason], stats.request_success.get(reason, 0))
        yield success
        if core.nixl:
            yield from self._nixl_counters()
        if core.lmcache is not None and core.lmcache.pd_role is not None:
            yield from self._pd_counters()
        elif core.lmcache is not None:
            yield from self._lmcache_counters()

    def _lmcache_counters(self) -> Iterator[Metric]:
        """LMCache's retrieve counters, one series per TP rank (each rank's LMCache worker counts the tokens
        of its own shard), on the engine's page as when LMCache shares vLLM's Prometheus directory; and, not
        LMCache's, the tokens p2p moved in and out (LMCache only times p2p transfers, on the serving side)."""
        stats = self._core.stats
        counters = (
            ("lmcache:num_requested_tokens", "Total number of tokens requested from lmcache",
             stats.lmcache_requested_tokens),
            ("lmcache:num_hit_tokens", "Total number of tokens hit in lmcache", stats.lmcache_hit_tokens),
        )  # fmt: skip
        served = self._labels[0]
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=LMCACHE_LABELS)
            for rank in range(self._core.profile.tensor_parallel):
                counter.add_metric([self._model, str(rank), "worker", served], value)
            yield counter
        if not self._core.lmcache or not self._core.lmcache.p2p:
            return
        p2p = (
            ("fake_engine:lmcache_p2p_hit_tokens", "Prompt tokens LMCache fetched from a peer engine (p2p).",
             stats.lmcache_p2p_hit_tokens),
            ("fake_engine:lmcache_p2p_served_tokens",
             "Tokens of this engine's LMCache CPU tier sent to peer engines (p2p).",
             stats.lmcache_p2p_served_tokens),
        )  # fmt: skip
        yield from _counters(p2p, self._labels)

    def _nixl_counters(self) -> Iterator[Metric]:
        # NixlPromMetrics' counters (nixl/stats.py), exported from start as vLLM's per-engine children are.
        stats = self._core.stats
        counters = (
            ("vllm:nixl_num_failed_transfers",
             "Number of failed NIXL KV Cache transfers, including handshake and notification failures. "
             "NOTE: KV expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.",
             stats.nixl_failed_transfers),
            ("vllm:nixl_num_kv_expired_reqs",
             "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.",
             stats.nixl_kv_expired_reqs),
        )  # fmt: skip
        yield from _counters(counters, self._labels)

    def _pd_counters(self) -> Iterator[Metric]:
        # Not vLLM metrics: what the fake's LMCache PD emulation did (LMCache has its own, on another port).
        stats = self._core.stats
        counters = (
            ("fake_engine:lmcache_pd_pushes", "PD pushes every TP rank completed and notified.",
             stats.pd_pushes),
            ("fake_engine:lmcache_pd_push_failures", "PD pushes a TP rank failed (no notification).",
             stats.pd_push_failures),
            ("fake_engine:lmcache_pd_rejected_chunks", "Chunks the PD receiver refused (buffer full).",
             stats.pd_rejected_chunks),
            ("fake_engine:lmcache_pd_loaded_tokens", "Prompt tokens loaded from the PD buffer.",
             stats.pd_loaded_tokens),
        )  # fmt: skip
        yield from _counters(counters, self._labels)
        buffer = self._core.pd_buffer
        if buffer is None:
            return
        gauges = (
            ("fake_engine:lmcache_pd_buffer_used_chunks",
             "PD receiver: chunk slots in use on the fullest TP rank (freed only when retrieved).",
             buffer.used_chunks),
            ("fake_engine:lmcache_pd_buffer_capacity_chunks", "PD receiver: chunk slots per TP rank.",
             buffer.capacity_chunks),
        )  # fmt: skip
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=LABELS)
            gauge.add_metric(self._labels, value)
            yield gauge
        retrieved = CounterMetricFamily(
            "fake_engine:lmcache_pd_retrieved_chunks",
            "PD receiver: chunks retrieved by requests (and so freed).",
            labels=LABELS,
        )
        retrieved.add_metric(self._labels, buffer.retrieved_chunks)
        yield retrieved


class EngineMetrics:
    def __init__(
        self, core: EngineCore, model_name: str, engine_index: str = "0", model: str | None = None
    ) -> None:
        self.registry = CollectorRegistry()
        labels = (model_name, engine_index)
        self.registry.register(_CoreCollector(core, labels, model or model_name))
        self.ttft = Histogram(
            *TTFT,
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        ).labels(*labels)
        self.itl = Histogram(
            *ITL,
            LABELS,
            buckets=ITL_BUCKETS,
            registry=self.registry,
        ).labels(*labels)
        # observed once per finished request with request_tpot (loggers.py: record of each finished request)
        self.tpot = Histogram(
            *TPOT,
            LABELS,
            buckets=TPOT_BUCKETS,
            registry=self.registry,
        ).labels(*labels)
        # Not a vLLM metric: wall seconds by which steps started late because this process lacked CPU, i.e.
        # how far the fake's timings fall behind its own model on a busy machine.
        self.schedule_lag = Counter(
            "fake_engine:schedule_lag_seconds",
            "Wall seconds engine steps started behind the timing model (CPU starvation of the fake engine).",
            registry=self.registry,
        )
        self.nixl = (
            _NixlHistograms(self.registry, labels, core.profile.tensor_parallel) if core.nixl else None
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LABELS,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=self.registry,
        ).labels(*labels)


class _NixlHistograms:
    """NixlPromMetrics' transfer histograms, observed once per TP worker as each of vLLM's workers records its
    own transfer (its shard of the KV) and the engine sums their stats."""

    def __init__(self, registry: CollectorRegistry, labels: tuple[str, str], tensor_parallel: int) -> None:
        self._workers = tensor_parallel
        self.xfer_time = Histogram(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            LABELS,
            buckets=NIXL_XFER_TIME_BUCKETS,
            registry=registry,
        ).labels(*labels)
        self.bytes_transferred = Histogram(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            LABELS,
            buckets=NIXL_BYTES_BUCKETS,
            registry=registry,
        ).labels(*labels)

    def observe_read(self, seconds: float, total_bytes: int) -> None:
        """One KV read: each worker moves its 1/TP shard in `seconds` (the shards move in parallel)."""
        for _ in range(self._workers):
            self.xfer_time.observe(seconds)
            self.bytes_transferred.observe(total_bytes / self._workers)


class LatencyCounts:
    """One of vLLM's latency histograms kept as plain per-bucket counts (not cumulative): what the simulator's
    engines observe (cheap, and many gaps at once for a steady decode batch); rendered on the page with the
    same name, buckets and labels as the fake engine's prometheus-client histogram."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, finite_bounds: Sequence[float]) -> None:
        self.bounds = (*finite_bounds, math.inf)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_many(self, value: float, times: int) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times

    def family(self, name: str, documentation: str, labels: Sequence[str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, documentation, labels=LABELS)
        cumulative = itertools.accumulate(self.counts)
        family.add_metric(
            list(labels),
            [
                (_bucket_label(bound), float(count))
                for bound, count in zip(self.bounds, cumulative, strict=True)
            ],
            self.sum,
        )
        return family


def _bucket_label(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class _CountsCollector(Collector):
    def __init__(
        self, histograms: Sequence[tuple[tuple[str, str], LatencyCounts]], labels: Sequence[str]
    ) -> None:
        self._histograms = histograms
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        for (name, documentation), counts in self._histograms:
            yield counts.family(name, documentation, self._labels)


class EnginePage:
    """An engine's /metrics page without a server: the core's gauges and counters, as the fake engine serves
    them, and its TTFT, ITL and TPOT histograms from `LatencyCounts` (the simulator's engines)."""

    def __init__(
        self,
        core: EngineCore,
        model_name: str,
        engine_index: str,
        ttft: LatencyCounts,
        itl: LatencyCounts,
        tpot: LatencyCounts,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = (model_name, engine_index)
        self.registry.register(_CoreCollector(core, labels, model_name))
        self.registry.register(_CountsCollector(((TTFT, ttft), (ITL, itl), (TPOT, tpot)), labels))

    def text(self) -> str:
        return generate_latest(self.registry).decode()
