"""Which phase limits the pool, the evidence, and the fix that fits (pure): a window of measurements in, a
verdict with evidence and advice out.

The rules are the ones practitioners state:
- first token slow, streaming fast: prefill is the bottleneck; prompt lengths and queue depth come first, and
  when prompts are long and repetitive, prefix reuse pays better than more compute;
- first token fast, streaming stutters: decode is the bottleneck; batch size and KV-cache usage say whether it
  is bandwidth (more replicas) or cache capacity (preemptions);
- fine at p50, falling apart at p99, with prefills landing in decode batches: interference before capacity;
  chunked prefill is the cheap fix (on by default in vLLM V1: check it is on), disaggregation the structural
  one;
- disaggregated requests slow while their prefill leg is fast: the KV transfer between the pools;
- disaggregation pays when prompts are long, concurrency is high and TTFT and ITL are missed in different
  directions; for short prompts or low concurrency, colocation is right.

ITL is the gap between consecutive output tokens after the first, as vLLM's inter_token_latency_seconds
defines it (it excludes the first token; TTFT covers that); the router measures the same gaps where it relays
them. Both are per-token histograms, so long answers weigh more than short ones. The what-if's goodput uses
each request's mean gap (TPOT, as DistServe does), a different definition: compare within one of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from inferencepool.autoscaler.histogram import Histogram
from inferencepool.bottleneck.settings import PoolSettings
from inferencepool.bottleneck.sizing import Sizing
from inferencepool.bottleneck.window import EngineWindow, PoolWindow

Verdict = Literal["Prefill", "Decode", "Interference", "KVTransfer", "None"]
VERDICTS: Final[tuple[Verdict, ...]] = ("Prefill", "Decode", "Interference", "KVTransfer", "None")

ITL_DEFINITION: Final = (
    "ITL = gap between consecutive output tokens after the first (vLLM's inter_token_latency_seconds, "
    "which excludes the first token; the router's histogram measures the same gaps as it relays them)"
)
MIN_REQUESTS: Final = 20  # fewer requests in the window say nothing about percentiles
AIM: Final = 0.8  # a recommendation aims the limiting figure at 80% of its target
HEADROOM: Final = 0.7  # a pool at or under 70% of its target can take more load
SHORT_PROMPT_TOKENS: Final = 1024  # prompts this short gain nothing from a KV transfer
LOW_CONCURRENCY: Final = 2.0  # requests in flight per decode engine
LENT_SPLIT_SHARE: Final = 0.2  # a split that lends a fifth of its requests to the prefill pool should change
REPETITIVE_HIT_RATE: Final = 0.3  # share of prompt tokens found in a prefix cache
TAIL_FACTOR: Final = 2.0  # p99 this many times the target while p50 meets it: a tail, not capacity
SMALL_TOKEN_BUDGET: Final = 2048  # vLLM's budget on smaller GPUs; a chunk this size stalls decodes briefly
COLOCATION_MARGIN: Final = 1.1  # the what-if must predict 10% more goodput colocated to advise it unasked
STALLING_PREFILL: Final = 256  # prompt tokens per prefill (one LMCache chunk) from which a decode step stalls
MAX_STEP: Final = 0.5  # one recommendation at most halves the prefill pool's share of prompt tokens


@dataclass(frozen=True)
class Percentiles:
    """A latency histogram's p50/p90/p99 (seconds), read as Prometheus' histogram_quantile() does."""

    histogram: Histogram

    @staticmethod
    def of(histogram: Histogram | None) -> Percentiles | None:
        return Percentiles(histogram) if histogram is not None and histogram.count > 0 else None

    @property
    def count(self) -> float:
        return self.histogram.count

    def at(self, percentile: float) -> float | None:
        return self.histogram.quantile(percentile / 100)

    @property
    def p50(self) -> float | None:
        return self.at(50)

    @property
    def p90(self) -> float | None:
        return self.at(90)

    @property
    def p99(self) -> float | None:
        return self.at(99)


@dataclass(frozen=True)
class Latency:
    """One labelled latency line: what, measured where, its percentiles and target (seconds)."""

    metric: Literal["TTFT", "ITL", "prefill leg", "KV transfer"]
    where: str  # "router, end to end", "prefill engines", ...
    figures: Percentiles
    target: float | None


@dataclass(frozen=True)
class Advice:
    kind: Literal[
        "Threshold",
        "AddPrefillReplicas",
        "AddDecodeReplicas",
        "PrefixReuse",
        "ChunkedPrefill",
        "SmallerChunks",
        "Colocate",
        "Disaggregate",
        "KVNetwork",
        "NoChange",
    ]
    text: str
    threshold_tokens: int | None = None
    replicas: int | None = None  # the replica count advised (AddPrefillReplicas, AddDecodeReplicas)
    # Threshold: the steps towards threshold_tokens (a third, two thirds, all of the move in prompt-token
    # share); the what-if replays each and keeps the best.
    candidates: tuple[int, ...] = ()


@dataclass(frozen=True)
class Traffic:
    requests: float
    rate: float  # requests per second
    prompt: Histogram | None  # router-counted prompt tokens
    prompt_p50: float | None
    prompt_p90: float | None
    disaggregated_share: float | None  # of routed requests
    lent_share: float | None  # of routed requests: served whole on prefill pods (role lending)
    peer_prefill_share: float | None  # of routed requests: prefilled on a peer decode pod (role lending)
    prefix_hit_rate: float | None  # vLLM's GPU prefix cache, every engine
    external_hit_rate: float | None  # KV connector hits (LMCache CPU tier, p2p) where prompts are prefilled
    lmcache_hit_rate: float | None  # LMCache's own counters, when on the page
    reuse_rate: float | None  # share of arriving prompt tokens no engine had to compute
    mean_output_tokens: float | None
    decode_prefill_share: float | None  # share of computed prompt tokens the decode engines prefilled


@dataclass(frozen=True)
class Diagnosis:
    verdict: Verdict
    reason: str  # CamelCase, for a status condition
    summary: str
    evidence: tuple[str, ...]
    advice: tuple[Advice, ...]
    latencies: tuple[Latency, ...]
    traffic: Traffic
    enough_data: bool
    recommended_threshold: int | None = None
    itl_definition: str = ITL_DEFINITION
    notes: tuple[str, ...] = field(default_factory=tuple)

    def advice_of(self, kind: str) -> Advice | None:
        return next((a for a in self.advice if a.kind == kind), None)


@dataclass(frozen=True)
class WhatIfRow:
    """One scenario of the what-if replay (whatif/replay.py), as the report shows it."""

    scenario: str  # "colocated", "current", "recommended"
    policy: str
    prefill_replicas: int
    decode_replicas: int
    threshold_tokens: int | None
    goodput_rps: float
    slo_attainment_percent: float
    ttft_p90_ms: float | None
    itl_p90_ms: float | None
    disaggregated_percent: float


# --- figures


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _hit_rate(engines: list[EngineWindow], hits: str, queries: str) -> float | None:
    total_queries = sum(e.counter(queries) or 0.0 for e in engines)
    if total_queries <= 0:
        return None
    return sum(e.counter(hits) or 0.0 for e in engines) / total_queries


def traffic(window: PoolWindow) -> Traffic:
    engines = [e for e in (window.prefill, window.decode) if e is not None]
    router = window.router
    if router is not None and router.total_requests > 0:
        requests = router.total_requests
        routed = router.requests.get("direct", 0.0) + router.requests.get("disaggregated", 0.0)
        share = _ratio(router.requests.get("disaggregated", 0.0), routed + router.requests.get("fallback", 0))
        lent = _ratio(router.requests.get("lent", 0.0), requests)
        peer = _ratio(router.peer_prefills, requests)
    else:
        requests = window.decode.requests if window.decode is not None else 0.0
        share = lent = peer = None
    prompt = router.prompt_tokens if router is not None else None
    decode = window.decode
    mean_output = None
    if decode is not None and decode.requests > 0:
        mean_output = (decode.counter("vllm:generation_tokens") or 0.0) / decode.requests
    computed = sum(e.computed_prompt_tokens for e in engines)
    # Every request reaches a decode engine (its prompt counted there once); in P/D the KV a decode engine
    # reads from the prefill pool counts as an external hit there, which is a hand-over, not reuse.
    arriving = decode.counter("vllm:prompt_tokens") if decode is not None else None
    with_prefill_pool = window.prefill is not None and window.prefill.requests > 0
    prefilling = [window.prefill] if with_prefill_pool else [decode]
    return Traffic(
        requests=requests,
        rate=requests / window.seconds,
        prompt=prompt,
        prompt_p50=prompt.quantile(0.5) if prompt is not None and prompt.count else None,
        prompt_p90=prompt.quantile(0.9) if prompt is not None and prompt.count else None,
        disaggregated_share=share,
        lent_share=lent,
        peer_prefill_share=peer,
        prefix_hit_rate=_hit_rate(engines, "vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
        external_hit_rate=_hit_rate(
            [e for e in prefilling if e is not None],
            "vllm:external_prefix_cache_hits",
            "vllm:external_prefix_cache_queries",
        ),
        lmcache_hit_rate=_hit_rate(engines, "lmcache:num_hit_tokens", "lmcache:num_requested_tokens"),
        mean_output_tokens=mean_output,
        decode_prefill_share=_ratio(decode.computed_prompt_tokens, computed) if decode is not None else None,
        reuse_rate=max(0.0, min(1.0, 1 - computed / arriving)) if arriving else None,
    )


def token_share_above(prompt: Histogram, threshold: float) -> float:
    """Share of prompt tokens in prompts of at least `threshold` tokens (what LengthAware sends to the prefill
    pool), read from the prompt-length histogram: prompts spread evenly inside a bucket, each weighing its
    length (the +Inf bucket is taken as twice the last finite bound wide)."""
    rows: list[tuple[float, float, float]] = []  # lower, upper, count
    lower, previous = 0.0, 0.0
    for bound, cumulative in zip(prompt.bounds, prompt.counts, strict=True):
        upper = bound if not math.isinf(bound) else max(lower * 2, 1.0)
        rows.append((lower, upper, cumulative - previous))
        lower, previous = upper, cumulative
    total = sum(count * (lo + hi) / 2 for lo, hi, count in rows)
    if total <= 0:
        return 0.0
    above = 0.0
    for lo, hi, count in rows:
        if count <= 0 or hi <= threshold:
            continue
        if lo >= threshold:
            above += count * (lo + hi) / 2
        else:  # the part of the bucket at or above the threshold
            above += count * (hi - threshold) / (hi - lo) * (threshold + hi) / 2
    return min(1.0, above / total)


def threshold_for_share(prompt: Histogram, share: float, bounds: tuple[int, int]) -> int:
    """The lowest threshold (within bounds) that sends at most `share` of the prompt tokens to the prefill
    pool, rounded to 256 tokens (LMCache's default chunk, so whole chunks move)."""
    low, high = float(bounds[0]), float(bounds[1])
    if token_share_above(prompt, low) <= share:
        return bounds[0]
    for _ in range(60):
        middle = (low + high) / 2
        if token_share_above(prompt, middle) <= share:
            high = middle
        else:
            low = middle
    rounded = max(256, round(high / 256) * 256)
    return int(min(max(rounded, bounds[0]), bounds[1]))


def _fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


# --- the rules


@dataclass
class _Case:
    """Everything the rules read, computed once."""

    window: PoolWindow
    settings: PoolSettings
    traffic: Traffic
    ttft: Percentiles | None  # what clients see (router), else the engines'
    itl: Percentiles | None
    prefill_ttft: Percentiles | None  # prefill engines (the prefill leg's TTFT)
    decode_itl: Percentiles | None
    ttft_target: float
    itl_target: float
    sizing: Sizing | None = None  # the planner's replicas for the window's load (None: it could not say)
    evidence: list[str] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    threshold: int | None = None

    def q(self, figures: Percentiles | None) -> float | None:
        return figures.at(self.settings.percentile) if figures is not None else None

    @property
    def ttft_load(self) -> float | None:
        return _ratio(self.q(self.ttft), self.ttft_target)

    @property
    def itl_load(self) -> float | None:
        return _ratio(self.q(self.itl), self.itl_target)

    def prefill_pool_load(self) -> float | None:
        """The prefill pool's TTFT against the target (engine side; None without prefill traffic)."""
        return _ratio(self.q(self.prefill_ttft), self.ttft_target)

    def decode_pool_load(self) -> float | None:
        return _ratio(self.q(self.decode_itl), self.itl_target)

    def waiting(self, role: Literal["prefill", "decode"]) -> float | None:
        engines = self.window.engines(role)
        return engines.waiting.mean if engines is not None and engines.waiting is not None else None


def _latencies(window: PoolWindow, settings: PoolSettings) -> list[Latency]:
    ttft, itl = settings.ttft_target_ms / 1000, settings.itl_target_ms / 1000
    lines: list[Latency] = []
    router = window.router
    if router is not None:
        for metric, histogram, target in (("TTFT", router.ttft_all(), ttft), ("ITL", router.itl_all(), itl)):
            if (figures := Percentiles.of(histogram)) is not None:
                lines.append(Latency(metric, "router, end to end", figures, target))  # type: ignore[arg-type]
        for route in ("direct", "disaggregated"):
            if (figures := Percentiles.of(router.ttft.get(route))) is not None:
                lines.append(Latency("TTFT", f"router, {route} requests", figures, ttft))
        if (figures := Percentiles.of(router.prefill_leg)) is not None:
            lines.append(Latency("prefill leg", "router, prefill pool round trip", figures, None))
    for role in ("prefill", "decode"):
        engines = window.engines(role)
        if engines is None:
            continue
        where = f"{role} engines" if settings.disaggregated else "engines"
        if (figures := Percentiles.of(engines.ttft)) is not None:
            lines.append(Latency("TTFT", where, figures, ttft))
        if role == "decode" and (figures := Percentiles.of(engines.itl)) is not None:
            lines.append(Latency("ITL", where, figures, itl))
        if (figures := Percentiles.of(engines.nixl_transfer)) is not None:
            lines.append(Latency("KV transfer", f"{where} (vllm:nixl_xfer_time_seconds)", figures, None))
    return lines


def _case(window: PoolWindow, settings: PoolSettings, sizing: Sizing | None = None) -> _Case:
    router = window.router
    decode = window.decode
    router_ttft = Percentiles.of(router.ttft_all()) if router is not None else None
    router_itl = Percentiles.of(router.itl_all()) if router is not None else None
    decode_ttft = Percentiles.of(decode.ttft) if decode is not None else None
    decode_itl = Percentiles.of(decode.itl) if decode is not None else None
    prefill_ttft = (
        Percentiles.of(window.prefill.ttft) if window.prefill is not None and settings.disaggregated else None
    )
    return _Case(
        window=window,
        settings=settings,
        traffic=traffic(window),
        ttft=router_ttft or decode_ttft,
        itl=router_itl or decode_itl,
        prefill_ttft=prefill_ttft,
        decode_itl=decode_itl,
        ttft_target=settings.ttft_target_ms / 1000,
        itl_target=settings.itl_target_ms / 1000,
        sizing=sizing,
    )


def _advise_replicas(
    case: _Case,
    kind: Literal["AddPrefillReplicas", "AddDecodeReplicas"],
    role: Literal["prefill", "decode"],
    why: str,
    prefix: str = "",
) -> None:
    """More replicas of a role that misses its target: as many as the autoscaler's planner sizes the window's
    load at (`sizing.py`; at least one more, since the role misses its target), within the role's autoscaling
    ceiling; a role already at its ceiling is told to raise it."""
    s = case.settings
    current = s.prefill_replicas if role == "prefill" else s.decode_replicas
    what = f"{role} replicas" if s.disaggregated else "replicas"
    sized = case.sizing.role(role) if case.sizing is not None else None
    wanted = current + 1 if sized is None else max(current + 1, sized.wanted)
    if sized is None:
        why += "; the planner could not size the load from these pages, so one more at a time"
    else:
        why += (
            f"; the planner sizes this load at {sized.wanted}: {sized.forecast:.2f} engine-s/s forecast at "
            f"{sized.capacity_per_replica:.2f} per replica"
        )
    ceiling = s.max_replicas.get(role)
    if ceiling is not None and current >= ceiling:
        text = (
            f"{prefix}{what} are at spec.{role}.autoscaling.maxReplicas ({ceiling}) and miss the target: "
            f"raise it to {wanted} ({why})"
        )
    elif ceiling is not None and wanted > ceiling:
        text = f"{prefix}{what} {current} -> {ceiling} (autoscaling.maxReplicas; {wanted} would be needed: "
        text += f"{why})"
        wanted = ceiling
    else:
        text = f"{prefix}{what} {current} -> {wanted} ({why})"
    case.advice.append(Advice(kind, text, replicas=wanted))


def _evidence_common(case: _Case) -> None:
    t, s = case.traffic, case.settings
    if t.prompt is not None and t.prompt_p50 is not None:
        line = f"prompts: p50 {t.prompt_p50:.0f}, p90 {t.prompt_p90:.0f} tokens"
        if s.disaggregated:
            above = token_share_above(t.prompt, s.threshold_tokens)
            line += f"; {100 * above:.0f}% of prompt tokens are in prompts >= the threshold "
            line += f"({s.threshold_tokens})"
        case.evidence.append(line)
    if t.disaggregated_share is not None and s.disaggregated:
        case.evidence.append(
            f"routing: {_pct(t.disaggregated_share)} of requests went through the prefill pool"
        )
    if t.lent_share:
        case.evidence.append(
            f"role lending: {_pct(t.lent_share)} of requests were served whole on prefill engines while "
            "every decode engine queued"
        )
    if t.peer_prefill_share:
        case.evidence.append(
            f"role lending: {_pct(t.peer_prefill_share)} of requests were prefilled on a peer decode engine "
            "while every prefill engine queued"
        )
    for role in ("prefill", "decode"):
        engines = case.window.engines(role)
        if engines is None or engines.pods == 0:
            continue
        parts = []
        in_flight = engines.in_flight(case.window.seconds)
        if in_flight is not None:
            parts.append(f"{in_flight:.1f} requests in flight/pod on average")
        if engines.waiting is not None:
            parts.append(f"queue {engines.waiting.mean:.1f} waiting/pod (max {engines.waiting.max:.0f})")
        if engines.running is not None:
            parts.append(f"batch {engines.running.mean:.1f} running/pod (max {engines.running.max:.0f})")
        if engines.kv_usage is not None:
            parts.append(f"KV cache {_pct(engines.kv_usage.mean)} used (max {_pct(engines.kv_usage.max)})")
        preemptions = engines.counter("vllm:num_preemptions")
        if preemptions:
            parts.append(f"{preemptions:.0f} preemptions")
        if parts:
            label = f"{role} engines ({engines.pods})" if s.disaggregated else f"engines ({engines.pods})"
            case.evidence.append(f"{label}: " + ", ".join(parts))
    if s.disaggregated and s.prefill_engine != s.decode_engine:
        case.evidence.append(
            f"engine settings (generated vllm args): prefill {s.prefill_engine.describe()}; decode "
            f"{s.decode_engine.describe()}"
        )
    else:
        case.evidence.append(f"engine settings (generated vllm args): {s.decode_engine.describe()}")
    rates = []
    if t.prefix_hit_rate is not None:
        rates.append(f"vLLM prefix cache {_pct(t.prefix_hit_rate)}")
    if t.external_hit_rate is not None:
        rates.append(f"KV connector (LMCache/p2p) {_pct(t.external_hit_rate)}")
    if t.lmcache_hit_rate is not None:
        rates.append(f"LMCache {_pct(t.lmcache_hit_rate)}")
    if t.reuse_rate is not None:
        rates.append(f"in all {_pct(t.reuse_rate)} of arriving prompt tokens were not computed")
    if rates:
        case.evidence.append("prefix-cache hit rate (prompt tokens): " + ", ".join(rates))


def _reuse_hit_rate(case: _Case) -> float:
    t = case.traffic
    return (
        t.reuse_rate if t.reuse_rate is not None else max(t.prefix_hit_rate or 0.0, t.lmcache_hit_rate or 0.0)
    )


def _advise_reuse(case: _Case) -> bool:
    """Long, repetitive prompts: reuse pays better than compute. True when reuse advice was given."""
    s, t = case.settings, case.traffic
    hit = _reuse_hit_rate(case)
    if hit < REPETITIVE_HIT_RATE or (t.prompt_p50 or 0) < SHORT_PROMPT_TOKENS:
        return False
    given = False
    if not s.prefix_affinity:
        case.advice.append(
            Advice("PrefixReuse", "turn on router.prefixAffinity: requests sharing a prefix go to the engine "
                   "that holds it")
        )  # fmt: skip
        given = True
    decode = case.window.decode
    kv_full = decode is not None and decode.kv_usage is not None and decode.kv_usage.max >= 0.9
    engines = s.prefill_replicas + s.decode_replicas if s.disaggregated else s.decode_replicas
    if not s.lmcache:
        case.advice.append(
            Advice(
                "PrefixReuse",
                f"prompts are long and repetitive ({_pct(hit)} of prompt tokens were already cached): "
                "turn on LMCache, kvCache: {cpuOffloadGiB: 20, p2p: {enabled: true}}, so prefixes "
                "evicted from GPU memory or computed on another engine are loaded instead of recomputed; "
                "this pays better than more prefill compute",
            )
        )
        given = True
    else:
        if not s.p2p and engines > 1 and s.connector == "Nixl":
            case.advice.append(
                Advice(
                    "PrefixReuse",
                    f"prompts are long and repetitive ({_pct(hit)} cached): turn on kvCache.p2p.enabled, "
                    f"so a prefix computed on one of the {engines} engines is fetched by the others",
                )
            )
            given = True
        if kv_full or s.cpu_offload_gib < 20:
            size = max(20, 2 * s.cpu_offload_gib)
            case.advice.append(
                Advice(
                    "PrefixReuse",
                    f"size LMCache's CPU tier up: kvCache.cpuOffloadGiB {s.cpu_offload_gib} -> {size}, "
                    "so more of the repeated prefixes stay loadable",
                )
            )
            given = True
    return given


def _advise_threshold(case: _Case, towards: Literal["decode", "prefill"], share_factor: float) -> None:
    """Move the LengthAware threshold so the pools' prefill work matches their headroom.

    `towards` is the pool that takes work over; `share_factor` scales the prefill pool's share of prompt
    tokens (under 1: raise the threshold, more prompts prefilled on decode engines; over 1: lower it)."""
    s, t = case.settings, case.traffic
    if s.policy != "LengthAware" or t.prompt is None or not t.prompt.count:
        return
    current = token_share_above(t.prompt, s.threshold_tokens)
    wanted = min(1.0, max(0.0, current * share_factor))
    if towards == "prefill" and current <= 0:
        wanted = min(1.0, 1.0 - share_factor) if share_factor < 1 else 0.5
    steps = []
    for fraction in (1 / 3, 2 / 3, 1.0):
        step = threshold_for_share(t.prompt, current + (wanted - current) * fraction, s.threshold_bounds)
        if step != s.threshold_tokens and step not in steps:
            steps.append(step)
    threshold = steps[-1] if steps else s.threshold_tokens
    moved = threshold > s.threshold_tokens if towards == "decode" else threshold < s.threshold_tokens
    if not moved:
        return
    case.threshold = threshold
    pool = "decode" if towards == "decode" else "prefill"
    case.advice.append(
        Advice(
            "Threshold",
            threshold_text(s, t.prompt, threshold, pool),
            threshold_tokens=threshold,
            candidates=tuple(steps),
        )
    )


def threshold_text(settings: PoolSettings, prompt: Histogram, threshold: int, pool: str) -> str:
    current = token_share_above(prompt, settings.threshold_tokens)
    new_share = token_share_above(prompt, threshold)
    bound = " (adaptive bounds)" if settings.adaptive_threshold else ""
    return (
        f"change router.prefillThresholdTokens {settings.threshold_tokens} -> {threshold}{bound}: "
        f"the prefill pool's share of prompt tokens goes {100 * current:.0f}% -> {100 * new_share:.0f}% "
        f"(measured prompt lengths), moving prefill work to the {pool} pool, which has headroom"
    )


def _decode_concurrency(case: _Case) -> float | None:
    """Requests per decode engine: Little's law over the window, else the running gauge."""
    decode = case.window.decode
    if decode is None:
        return None
    in_flight = decode.in_flight(case.window.seconds)
    if in_flight is not None:
        return in_flight
    return decode.running.mean if decode.running is not None else None


def _advise_split(case: _Case) -> None:
    """A pool that lends much of its work to the other pool has too few pods of the lending role for its
    load: move one replica across (lending is the answer to a burst, the split to a steady share). Decode
    work lent to the prefill pods asks for one more decode pod, prompts prefilled on peer decode pods for
    one more prefill pod."""
    s, t = case.settings, case.traffic
    peer = t.peer_prefill_share
    if peer is not None and peer >= LENT_SPLIT_SHARE and s.decode_replicas >= 2:
        case.advice.append(
            Advice(
                "AddPrefillReplicas",
                f"split {s.prefill_replicas}P:{s.decode_replicas}D -> {s.prefill_replicas + 1}P:"
                f"{s.decode_replicas - 1}D: {_pct(peer)} of requests were prefilled on a peer decode engine "
                f"(while every prefill engine queued), more than {_pct(LENT_SPLIT_SHARE)}",
                replicas=s.prefill_replicas + 1,
            )
        )
    if t.lent_share is None or t.lent_share < LENT_SPLIT_SHARE or s.prefill_replicas < 2:
        return
    case.advice.append(
        Advice(
            "AddDecodeReplicas",
            f"split {s.prefill_replicas}P:{s.decode_replicas}D -> {s.prefill_replicas - 1}P:"
            f"{s.decode_replicas + 1}D: {_pct(t.lent_share)} of requests were lent to the prefill pool "
            f"(served whole there while every decode engine queued), more than {_pct(LENT_SPLIT_SHARE)}",
            replicas=s.decode_replicas + 1,
        )
    )


def _advise_colocation(case: _Case) -> None:
    """Disaggregation does not pay for short prompts or low concurrency."""
    s, t = case.settings, case.traffic
    if not s.disaggregated:
        return
    running = _decode_concurrency(case)
    reasons = []
    if t.prompt_p90 is not None and t.prompt_p90 < SHORT_PROMPT_TOKENS:
        reasons.append(f"prompts are short (p90 {t.prompt_p90:.0f} tokens)")
    if t.disaggregated_share is not None and t.disaggregated_share < 0.05:
        share = t.disaggregated_share
        reasons.append(
            f"only {_pct(share)} of requests use the prefill pool"
            if share
            else "no request uses the prefill pool"
        )
    if running is not None and running < LOW_CONCURRENCY:
        reasons.append(f"concurrency is low ({running:.1f} requests in flight per decode engine)")
    if not reasons:
        return
    gpus = s.prefill_replicas * s.gpus_per_replica
    case.advice.append(
        Advice(
            "Colocate",
            f"serve the pool Colocated (router.policy: Colocated, prefill replicas moved to decode): "
            f"{'; '.join(reasons)}, so disaggregation does not pay, and the prefill pool's {gpus} GPU(s) "
            "would add capacity as colocated engines",
            replicas=s.decode_replicas + s.prefill_replicas,
        )
    )


def _interference(case: _Case) -> bool:
    itl = case.itl
    if itl is None or itl.p50 is None or itl.p99 is None:
        return False
    share = case.traffic.decode_prefill_share
    per_prompt = _decode_prefill_per_request(case)
    # Prefills that stall a decode step are long ones: a few tokens of a chat turn cost nothing.
    prefilling = (
        share is not None and share > 0.05 and per_prompt is not None and per_prompt >= STALLING_PREFILL
    )
    return prefilling and itl.p50 <= 0.75 * case.itl_target and itl.p99 > TAIL_FACTOR * case.itl_target


def _decode_prefill_per_request(case: _Case) -> float | None:
    """Prompt tokens the decode engines computed per request they prefilled themselves."""
    decode, router = case.window.decode, case.window.router
    if decode is None:
        return None
    if router is not None and router.total_requests > 0 and case.settings.disaggregated:
        prefilled = router.requests.get("direct", 0.0) + router.requests.get("fallback", 0.0)
    else:
        prefilled = decode.requests
    return decode.computed_prompt_tokens / prefilled if prefilled > 0 else None


def _kv_transfer(case: _Case) -> bool:
    s, router = case.settings, case.window.router
    if not s.disaggregated or router is None:
        return False
    disaggregated = router.requests.get("disaggregated", 0.0)
    failed = router.fallbacks.get("prefill_failed", 0.0) + router.fallbacks.get("kv_push_timeout", 0.0)
    meant = disaggregated + router.requests.get("fallback", 0.0)
    found = False
    if meant >= 5 and failed / meant >= 0.05:
        case.evidence.append(
            f"KV hand-over: {failed:.0f} of {meant:.0f} requests meant for P/D fell back to colocated "
            f"(prefill failed or KV push timed out)"
        )
        found = True
    engines = [e for e in (case.window.prefill, case.window.decode) if e is not None]
    nixl_failures = sum(e.counter("vllm:nixl_num_failed_transfers") or 0.0 for e in engines)
    if nixl_failures > 0:
        case.evidence.append(f"NIXL reported {nixl_failures:.0f} failed KV transfers")
        found = True
    disagg_ttft = Percentiles.of(router.ttft.get("disaggregated"))
    leg = Percentiles.of(router.prefill_leg)
    if disagg_ttft is not None and leg is not None and disagg_ttft.p50 is not None and leg.p50 is not None:
        overhead = disagg_ttft.p50 - leg.p50
        decode_queue = case.waiting("decode") or 0.0
        slow = (case.q(disagg_ttft) or 0.0) > case.ttft_target
        if slow and overhead > max(leg.p50, 0.25 * case.ttft_target) and decode_queue < 1.0:
            case.evidence.append(
                f"disaggregated TTFT p50 {_fmt_ms(disagg_ttft.p50)} vs prefill leg p50 {_fmt_ms(leg.p50)}: "
                f"{_fmt_ms(overhead)} between the prefill pool's answer and the first token, with no decode "
                f"queue ({decode_queue:.1f} waiting/pod), is the KV transfer"
            )
            found = True
    return found


def _latency_evidence(case: _Case) -> None:
    p = case.settings.percentile
    for metric, figures, target in (
        ("TTFT", case.ttft, case.ttft_target),
        ("ITL", case.itl, case.itl_target),
    ):
        if figures is None:
            case.evidence.append(f"{metric}: no streamed tokens observed in the window")
            continue
        observed = figures.at(p)
        state = "MISSED" if observed is not None and observed > target else "met"
        case.evidence.append(
            f"{metric} p50/p90/p99 {_fmt_ms(figures.p50)}/{_fmt_ms(figures.p90)}/{_fmt_ms(figures.p99)} vs "
            f"target {_fmt_ms(target)} at p{p}: {state}"
        )


def diagnose(window: PoolWindow, settings: PoolSettings, sizing: Sizing | None = None) -> Diagnosis:
    """The verdict, evidence and advice for the window; `sizing` (the planner's, `sizing.size`, over the
    same window) gives the replica counts a role that misses its target is advised."""
    case = _case(window, settings, sizing)
    t = case.traffic
    latencies = tuple(_latencies(window, settings))
    if t.requests < MIN_REQUESTS:
        return Diagnosis(
            verdict="None",
            reason="NotEnoughTraffic",
            summary=f"only {t.requests:.0f} requests in {window.seconds:.0f} s: too few to judge",
            evidence=(f"{t.requests:.0f} requests in the window (at least {MIN_REQUESTS} are needed)",),
            advice=(Advice("NoChange", "measure over a longer window or under real traffic"),),
            latencies=latencies,
            traffic=t,
            enough_data=False,
        )
    _latency_evidence(case)
    verdict: Verdict
    ttft_load, itl_load = case.ttft_load or 0.0, case.itl_load or 0.0
    if _kv_transfer(case):
        verdict = "KVTransfer"
    elif _interference(case):
        verdict = "Interference"
    elif ttft_load > 1.0 and ttft_load >= itl_load:
        verdict = "Prefill"
    elif itl_load > 1.0:
        verdict = "Decode"
    else:
        verdict = "None"
    _evidence_common(case)
    _ADVISERS[verdict](case)
    _advise_split(case)
    if verdict in ("Decode", "None"):
        _advise_colocation(case)
    if not case.advice:
        case.advice.append(Advice("NoChange", "no change: every target is met"))
    summary = {
        "Prefill": "first token slow, streaming fast: prefill limits the pool",
        "Decode": "first token fast, streaming slow: decode limits the pool",
        "Interference": "fine at p50, falling apart at p99: prefills land in decode batches",
        "KVTransfer": "disaggregated requests wait on the KV transfer between the pools",
        "None": "every target is met",
    }[verdict]
    reason = {
        "Prefill": "PrefillBound",
        "Decode": "DecodeBound",
        "Interference": "PrefillDecodeInterference",
        "KVTransfer": "KVTransferBound",
        "None": "WithinTargets",
    }[verdict]
    return Diagnosis(
        verdict=verdict,
        reason=reason,
        summary=summary,
        evidence=tuple(case.evidence),
        advice=tuple(case.advice),
        latencies=latencies,
        traffic=t,
        enough_data=True,
        recommended_threshold=case.threshold,
        notes=tuple(case.notes),
    )


def _advise_prefill(case: _Case) -> None:
    s = case.settings
    reuse = _advise_reuse(case)
    decode_load = case.decode_pool_load()
    decode_free = decode_load is not None and decode_load <= HEADROOM and (case.waiting("decode") or 0) < 1
    pool_load = case.prefill_pool_load() or case.ttft_load or 1.0
    if s.disaggregated and decode_free and decode_load is not None:
        # Aim the prefill pool under its target, but move no more than the decode pool's headroom allows:
        # at half its target it may take up to ~40% of the prefill pool's share, at 70% only ~10%.
        _advise_threshold(case, "decode", max(AIM / max(pool_load, 1e-9), decode_load / AIM, MAX_STEP))
    _advise_replicas(
        case,
        "AddPrefillReplicas",
        "prefill" if s.disaggregated else "decode",
        f"TTFT at p{s.percentile} is {case.ttft_load or 0:.1f}x the target",
        "after reuse, if TTFT still misses: " if reuse else "",
    )


def _advise_decode(case: _Case) -> None:
    s, t = case.settings, case.traffic
    decode = case.window.decode
    if decode is not None and decode.kv_usage is not None and decode.kv_usage.max >= 0.9:
        case.evidence.append(
            f"decode KV cache up to {_pct(decode.kv_usage.max)} full: cache capacity, not only bandwidth, "
            "limits the batch"
        )
    prefill_load = case.prefill_pool_load()
    prefill_free = prefill_load is not None and prefill_load <= HEADROOM
    share = t.decode_prefill_share or 0.0
    if s.disaggregated and prefill_free and share > 0.1:
        # Take prefills out of decode batches: the prefill pool's share of prompt tokens grows.
        current = token_share_above(t.prompt, s.threshold_tokens) if t.prompt is not None else 0.0
        target = current + (1 - current) * (1 - AIM / max(case.itl_load or 1.0, 1e-9))
        cap = current * AIM / max(prefill_load or 1e-9, 1e-9) if current > 0 else 1.0
        wanted = min(target, cap)
        _advise_threshold(case, "prefill", wanted / current if current > 0 else 1 - wanted)
    _advise_replicas(
        case,
        "AddDecodeReplicas",
        "decode",
        f"ITL at p{s.percentile} is {case.itl_load or 0:.1f}x the target: decode steps are bound by memory "
        "bandwidth and KV capacity",
    )


def _advise_interference(case: _Case) -> None:
    s, t = case.settings, case.traffic
    engine = s.decode_engine
    case.evidence.append(
        f"decode engines prefilled {_pct(t.decode_prefill_share)} of the computed prompt tokens, "
        f"{_decode_prefill_per_request(case) or 0:.0f} tokens per prompt they prefilled, inside decode "
        "batches"
    )
    if not engine.chunked_prefill:
        case.advice.append(
            Advice(
                "ChunkedPrefill",
                "enable chunked prefill on the decode engines (drop --no-enable-chunked-prefill from "
                "engine.extraArgs; vLLM V1 has it on by default): a long prompt then shares steps with "
                "decodes in chunks instead of stalling them",
            )
        )
    elif engine.token_budget > SMALL_TOKEN_BUDGET:
        case.advice.append(
            Advice(
                "SmallerChunks",
                f"chunked prefill is on; a smaller step budget (engine.extraArgs --max-num-batched-tokens "
                f"{SMALL_TOKEN_BUDGET}, now {engine.token_budget}) cuts the stall each chunk adds to the "
                "decodes beside it, at some TTFT cost",
            )
        )
    if not s.disaggregated:
        if t.prompt is not None and t.prompt.count:
            threshold = threshold_for_share(t.prompt, 0.5, (1, s.max_model_len or 131072))
            case.threshold = threshold
            prefill = max(1, round((s.decode_replicas) / 3))
            case.advice.append(
                Advice(
                    "Disaggregate",
                    f"the structural fix: disaggregate (router.policy: LengthAware, prefillThresholdTokens "
                    f"{threshold}, half the prompt tokens; {prefill} prefill replica(s)), so long prefills "
                    "leave the decode batches",
                    threshold_tokens=threshold,
                    replicas=prefill,
                )
            )
        return
    prefill_load = case.prefill_pool_load()
    if prefill_load is None or prefill_load <= HEADROOM:
        _advise_threshold(case, "prefill", 1.5)
    else:
        case.advice.append(
            Advice(
                "AddPrefillReplicas",
                f"prefill replicas {s.prefill_replicas} -> {s.prefill_replicas + 1}, then lower the "
                "threshold so long prompts leave the decode batches",
                replicas=s.prefill_replicas + 1,
            )
        )


def _advise_kv_transfer(case: _Case) -> None:
    s = case.settings
    case.advice.append(
        Advice(
            "KVNetwork",
            "check the KV path between the pools: NIXL needs an RDMA (or fast TCP) transport between GPU "
            "nodes (UCX picks it; see the engines' UCX_TLS), and LMCachePD a PD buffer large enough for "
            "the prompts",
        )
    )
    _advise_threshold(case, "decode", 0.5)
    if s.disaggregated:
        _advise_colocation(case)


def _advise_none(case: _Case) -> None:
    ttft_load, itl_load = case.ttft_load or 0.0, case.itl_load or 0.0
    if ttft_load < 0.5 and itl_load < 0.5:
        case.notes.append(
            f"both targets are met with room to spare (TTFT {ttft_load:.1f}x, ITL {itl_load:.1f}x the "
            "target): fewer replicas would do (the autoscaler scales down when it is on)"
        )


_ADVISERS = {
    "Prefill": _advise_prefill,
    "Decode": _advise_decode,
    "Interference": _advise_interference,
    "KVTransfer": _advise_kv_transfer,
    "None": _advise_none,
}


def with_what_if(diagnosis: Diagnosis, table: Sequence[WhatIfRow], settings: PoolSettings) -> Diagnosis:
    """The diagnosis checked against the what-if (whatif/replay.py): of the threshold candidates, the one
    with the best predicted goodput is recommended if it beats the current threshold, else the threshold
    advice is withdrawn; colocation advice the replay contradicts is withdrawn too. Each with a note."""
    notes = list(diagnosis.notes)
    advice = list(diagnosis.advice)
    goodput = {row.scenario: row.goodput_rps for row in table}
    current = goodput.get("current")
    colocated = goodput.get("colocated")
    recommended = diagnosis.recommended_threshold
    threshold = diagnosis.advice_of("Threshold")
    tried = [row for row in table if row.scenario == "threshold"]
    if threshold is not None and current is not None and tried:
        best = max(tried, key=lambda row: row.goodput_rps)
        searched = ", ".join(f"{row.threshold_tokens}: {row.goodput_rps:.2f}" for row in tried)
        if best.goodput_rps <= current:
            advice.remove(threshold)
            recommended = None
            notes.append(
                f"threshold change withdrawn: the what-if predicts no gain over {current:.2f} good "
                f"requests/s at {settings.threshold_tokens} (tried {searched})"
            )
        else:
            recommended = best.threshold_tokens
            text = threshold.text
            prompt = diagnosis.traffic.prompt
            if recommended is not None and recommended != threshold.threshold_tokens and prompt is not None:
                pool = "decode" if recommended > settings.threshold_tokens else "prefill"
                text = threshold_text(settings, prompt, recommended, pool)
            chosen = replace(
                threshold,
                threshold_tokens=recommended,
                text=f"{text} (the what-if's best: {best.goodput_rps:.2f} vs {current:.2f} good requests/s)",
            )
            advice[advice.index(threshold)] = chosen
            notes.append(f"thresholds replayed (good requests/s): {searched}")
    colocate = diagnosis.advice_of("Colocate")
    if colocate is not None and colocated is not None and current is not None and colocated < current:
        advice.remove(colocate)
        notes.append(
            f"colocation withdrawn: the what-if predicts {colocated:.2f} good requests/s colocated vs "
            f"{current:.2f} as deployed"
        )
    layouts = [row.goodput_rps for row in table if row.scenario in ("current", "threshold")]
    if (
        settings.disaggregated
        and colocate is None
        and colocated is not None
        and layouts
        and colocated > COLOCATION_MARGIN * max(layouts)
    ):
        advice.append(
            Advice(
                "Colocate",
                f"serve the pool Colocated (router.policy: Colocated, prefill replicas moved to decode): the "
                f"what-if predicts {colocated:.2f} good requests/s colocated vs at best {max(layouts):.2f} "
                "disaggregated for this traffic",
                replicas=settings.prefill_replicas + settings.decode_replicas,
            )
        )
    disaggregate = diagnosis.advice_of("Disaggregate")
    split = goodput.get("disaggregated")
    if disaggregate is not None and split is not None and colocated is not None and split <= colocated:
        advice.remove(disaggregate)
        recommended = None
        notes.append(
            f"disaggregation withdrawn: the what-if predicts {split:.2f} good requests/s disaggregated vs "
            f"{colocated:.2f} colocated"
        )
    if not advice:
        advice.append(Advice("NoChange", "no change that the what-if confirms"))
    return replace(diagnosis, advice=tuple(advice), notes=tuple(notes), recommended_threshold=recommended)
