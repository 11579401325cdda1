"""What the planner is fed, read from the engines' and routers' own metrics pages (pure: pages in, an
`Observation` out; the runner does the scraping).

Per engine pod, each decision interval:
- counters `vllm:prompt_tokens` and `vllm:generation_tokens`, and the role's latency histogram (TTFT on
  prefill, ITL on decode), differenced against the pod's previous reading (`Deltas`): the load of the
  interval, and on decode the mean ITL (histogram sum / count) that corrects the capacity model;
- on decode, `vllm:request_time_per_output_token_seconds` (each finished request's mean time per output
  token, the SLO's own figure) over the percentile window, where the engines export it (vLLM >= 0.33):
  the planner holds its percentile against the ITL target, and the gaps' percentile only without it;
- gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`: the decode
  pool's KV in use, and its mean context (KV in use over running sequences).
Per router pod: requests and prompt tokens by route (`inferencepool_router_requests`,
`inferencepool_router_routed_prompt_tokens`), differenced the same way, and the TTFT of direct prompts
(route="direct") over the percentile window; and the prompts the router sent direct only because the prefill
pool was busy (`inferencepool_router_disaggregation_decisions{reason="prefill_busy"}` and
`..._decision_prompt_tokens`): they count as demand for the prefill pool, not for decode (the policy wanted
them prefilled there), and as work the decode pods did; so do the prompts a peer decode pod prefilled for
another because the prefill pool queued (role lending, reason `prefill_saturated`, on the disaggregated route:
the prefill engines' own count does not hold them). And, per pool, the most prompt tokens that arrived in
one of the router's fixed windows over the interval (`inferencepool_router_window_prompt_tokens`, a histogram
of each window's total by pool): the bursts the planner holds capacity for.

The prefill engines' own count of the prompt tokens they computed (prompt tokens less prefix-cache hits, local
or external) stands for the disaggregated route's tokens where they were read: the engines tokenize, the
router may only estimate, and a cached prefix costs no prefill. Prompts on the fallback route were meant for
the prefill pool (none was ready, or its leg failed): they count as demand for it, so a prefill pool at zero
comes back when they make it pay. Prompts on the lent route (role lending: served whole on a prefill pod
because every decode pod queued) belong to the decode pool: they count as its demand, prompt and output,
and as work the prefill pods did (taken out of the prefill engines' own prompt count, which includes them,
and out of the decode pods' predicted utilisation, which they did not load).

A router that does not count prompt tokens by route (an older one) is read from the engines instead: the
prefill engines' prompt tokens are the disaggregated route's, the decode engines' beyond those are the direct
route's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic

from inferencepool.autoscaler.histogram import (
    ITL_METRIC,
    TPOT_METRIC,
    TTFT_METRIC,
    Counts,
    Histogram,
    MetricsError,
    Page,
    Sample,
    Window,
    read_counts,
    read_histogram,
)
from inferencepool.autoscaler.planner import Observation, PoolSignals, RouteLoad

PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
CACHE_HITS = ("vllm:prefix_cache_hits", "vllm:external_prefix_cache_hits")
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
ROUTER_REQUESTS = "inferencepool_router_requests"
ROUTER_PROMPT_TOKENS = "inferencepool_router_routed_prompt_tokens"
ROUTER_TTFT = "inferencepool_router_time_to_first_token_seconds"
ROUTER_DECISIONS = "inferencepool_router_disaggregation_decisions"
ROUTER_DECISION_TOKENS = "inferencepool_router_disaggregation_decision_prompt_tokens"
ROUTER_WINDOW_TOKENS = "inferencepool_router_window_prompt_tokens"
ROUTER_SHED_REQUESTS = "inferencepool_router_shed_demand_requests"
ROUTER_SHED_TOKENS = "inferencepool_router_shed_demand_prompt_tokens"
WINDOW_POOLS = ("prefill", "direct")  # the pool label, in RouteLoad order: (to the prefill pool, direct)
BYPASS_REASON = "prefill_busy"  # long prompts sent direct because the prefill pool's queue was too long
PEER_REASON = "prefill_saturated"  # long prompts prefilled on a peer decode pod (role lending)
BYPASS_REASONS = (BYPASS_REASON, PEER_REASON)
ROUTES = ("direct", "disaggregated", "fallback", "lent")


def _counter(page: Page, name: str) -> float | None:
    """A counter summed over its label sets (None when the page has none)."""
    samples = page.get(name, page.get(f"{name}_total"))
    if samples is None:
        return None
    return sum(value for sample, _, value in samples if sample in (name, f"{name}_total"))


def _gauge_sum(page: Page, name: str) -> float | None:
    samples = page.get(name)
    return None if samples is None else sum(value for _, _, value in samples)


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One engine pod's cumulative counters and latency histogram (TTFT or ITL, by role)."""

    prompt_tokens: float
    generation_tokens: float
    latency: Histogram | None
    cached_tokens: float = 0.0  # prompt tokens found in the prefix cache (local or external): not computed

    @property
    def computed_tokens(self) -> float:
        return max(0.0, self.prompt_tokens - self.cached_tokens)

    def minus(self, earlier: EngineSample) -> EngineSample:
        if self.prompt_tokens < earlier.prompt_tokens or self.generation_tokens < earlier.generation_tokens:
            return self  # the engine restarted: everything it reports is new
        latency = self.latency
        if latency is not None and earlier.latency is not None:
            latency = latency.minus(earlier.latency)
        return EngineSample(
            self.prompt_tokens - earlier.prompt_tokens,
            self.generation_tokens - earlier.generation_tokens,
            latency,
            max(0.0, self.cached_tokens - earlier.cached_tokens),
        )

    def plus(self, other: EngineSample) -> EngineSample:
        latency = self.latency
        if latency is None or other.latency is None:
            latency = latency or other.latency
        elif latency.bounds == other.latency.bounds:
            latency = latency.plus(other.latency)
        return EngineSample(
            self.prompt_tokens + other.prompt_tokens,
            self.generation_tokens + other.generation_tokens,
            latency,
            self.cached_tokens + other.cached_tokens,
        )


@dataclass(frozen=True, slots=True)
class EngineGauges:
    running: float
    waiting: float
    kv_usage: float  # 0..1


def read_engine(page: Page, latency_metric: str) -> tuple[EngineSample | None, EngineGauges | None]:
    """An engine page's counters (None without vLLM's token counters) and gauges (None without them).
    Raises MetricsError for a malformed histogram."""
    prompt, generated = _counter(page, PROMPT_TOKENS), _counter(page, GENERATION_TOKENS)
    sample = (
        None
        if prompt is None or generated is None
        else EngineSample(
            prompt,
            generated,
            read_histogram(page, latency_metric),
            sum(_counter(page, name) or 0.0 for name in CACHE_HITS),
        )
    )
    running, waiting, kv = (_gauge_sum(page, n) for n in (RUNNING, WAITING, KV_USAGE))
    gauges = (
        None
        if running is None or kv is None
        else EngineGauges(running, waiting or 0.0, min(1.0, max(0.0, kv)))
    )
    return sample, gauges


def largest_window(windows: Histogram) -> float | None:
    """The largest window total a histogram of window totals holds (None without windows): the top of
    the highest bucket with a window in it, or the windows' sum when that is less (one busy window among idle
    ones reads exactly)."""
    if windows.count <= 0:
        return None
    for bound, cumulative in zip(windows.bounds, windows.counts, strict=True):
        if cumulative >= windows.count:
            return min(bound, windows.sum)
    return windows.sum


@dataclass(frozen=True, slots=True)
class RouterSample:
    """One router pod's cumulative requests and prompt tokens by route (tokens None on a router without
    the counter)."""

    requests: Counts
    prompt_tokens: Counts | None
    # requests by BYPASS_REASONS, then their prompt tokens: sent direct because the prefill pool was busy, and
    # prefilled on a peer decode pod because it queued (role lending); a detail of `requests`
    bypassed: Counts | None = field(default=None, compare=False)
    # requests shed (429) by the route they would have taken, then their prompt tokens: demand no engine saw
    shed: Counts | None = field(default=None, compare=False)
    # the arrival windows' totals by pool (prefill, direct), cumulative as read
    windows: tuple[Histogram, Histogram] | None = field(default=None, compare=False)
    # after `minus`: the largest window of the interval by pool; summed over routers (each saw a share of
    # the same arrivals, so the sum of their largest windows bounds the pool's largest from above)
    burst_tokens: tuple[float | None, float | None] | None = field(default=None, compare=False)

    def minus(self, earlier: RouterSample) -> RouterSample:
        tokens = self.prompt_tokens
        if tokens is not None and earlier.prompt_tokens is not None:
            tokens = tokens.minus(earlier.prompt_tokens)
        bypassed = self.bypassed
        if bypassed is not None and earlier.bypassed is not None:
            bypassed = bypassed.minus(earlier.bypassed)
        shed = self.shed
        if shed is not None and earlier.shed is not None:
            shed = shed.minus(earlier.shed)
        windows, burst = self.windows, None
        if windows is not None and earlier.windows is not None:
            prefill, direct = (now.minus(then) for now, then in zip(windows, earlier.windows, strict=True))
            windows, burst = (prefill, direct), (largest_window(prefill), largest_window(direct))
        return RouterSample(self.requests.minus(earlier.requests), tokens, bypassed, shed, windows, burst)

    def plus(self, other: RouterSample) -> RouterSample:
        tokens = (
            None
            if self.prompt_tokens is None or other.prompt_tokens is None
            else self.prompt_tokens.plus(other.prompt_tokens)
        )
        bypassed = (
            None if self.bypassed is None or other.bypassed is None else self.bypassed.plus(other.bypassed)
        )
        shed = None if self.shed is None or other.shed is None else self.shed.plus(other.shed)
        burst = None
        if self.burst_tokens is not None and other.burst_tokens is not None:
            prefill, direct = (
                None if a is None and b is None else (a or 0.0) + (b or 0.0)
                for a, b in zip(self.burst_tokens, other.burst_tokens, strict=True)
            )
            burst = (prefill, direct)
        return RouterSample(self.requests.plus(other.requests), tokens, bypassed, shed, None, burst)


def read_router(page: Page) -> tuple[RouterSample | None, Histogram | None]:
    """A router page's counts by route (None without the request counter) and the TTFT histogram of its
    direct route (None without it)."""
    requests = read_counts(page, ROUTER_REQUESTS, "route", ROUTES)
    tokens = read_counts(page, ROUTER_PROMPT_TOKENS, "route", ROUTES)
    decisions = read_counts(page, ROUTER_DECISIONS, "reason", BYPASS_REASONS)
    decision_tokens = read_counts(page, ROUTER_DECISION_TOKENS, "reason", BYPASS_REASONS)
    bypassed = (
        None
        if decisions is None or decision_tokens is None
        else Counts((*decisions.values, *decision_tokens.values))
    )
    shed_requests = read_counts(page, ROUTER_SHED_REQUESTS, "route", ROUTES)
    shed_tokens = read_counts(page, ROUTER_SHED_TOKENS, "route", ROUTES)
    shed = (
        None
        if shed_requests is None or shed_tokens is None
        else Counts((*shed_requests.values, *shed_tokens.values))
    )
    windows = page.get(ROUTER_WINDOW_TOKENS)
    prefill_windows, direct_windows = (
        (None, None)
        if windows is None
        else (
            read_histogram(
                {ROUTER_WINDOW_TOKENS: [s for s in windows if s[1].get("pool") == pool]}, ROUTER_WINDOW_TOKENS
            )
            for pool in WINDOW_POOLS
        )
    )
    ttft = page.get(ROUTER_TTFT)
    direct = (
        None
        if ttft is None
        else read_histogram({ROUTER_TTFT: [s for s in ttft if s[1].get("route") == "direct"]}, ROUTER_TTFT)
    )
    sample = None
    if requests is not None:
        both = (
            None if prefill_windows is None or direct_windows is None else (prefill_windows, direct_windows)
        )
        sample = RouterSample(requests, tokens, bypassed, shed, both)
    return sample, direct


class Deltas(Generic[Sample]):
    """Per pod, what a cumulative reading added since the pod's previous one; summed over the pods read
    both times. A pod read this time only (new, or it missed the last round) adds nothing yet."""

    def __init__(self) -> None:
        self._last: dict[str, Sample] = {}

    def step(self, readings: dict[str, Sample]) -> Sample | None:
        total: Sample | None = None
        for pod, reading in readings.items():
            earlier = self._last.get(pod)
            if earlier is None:
                continue
            change = reading.minus(earlier)
            total = change if total is None else total.plus(change)
        self._last = dict(readings)
        return total


@dataclass(frozen=True)
class RoleReading:
    """One role over the interval, as the runner read it."""

    replicas: int  # the StatefulSet's spec.replicas
    ready: int
    load: EngineSample | None  # the interval's counts, summed over the pods read twice
    latency_window: Histogram | None  # the latency histogram over the percentile window
    percentile: int
    gauges: tuple[EngineGauges, ...] = ()  # one per ready pod that answered
    tpot_window: Histogram | None = None  # decode: the requests' TPOT histogram over the percentile window


@dataclass(frozen=True)
class RouterReading:
    load: RouterSample | None  # the interval's counts, summed over the routers read twice
    direct_ttft_window: Histogram | None  # TTFT of direct prompts over the prefill percentile window


@dataclass(frozen=True)
class RolePages:
    """One role's round of scrapes: its StatefulSet's replicas, its ready pods, the parsed pages of those that
    answered."""

    replicas: int  # spec.replicas
    ready: int  # status.readyReplicas
    ready_pods: frozenset[str]
    pages: tuple[tuple[str, Page], ...]
    window_seconds: float  # the percentile window
    percentile: int


LATENCY_METRIC = {"prefill": TTFT_METRIC, "decode": ITL_METRIC}


@dataclass
class _RoleFeed:
    load: Deltas[EngineSample] = field(default_factory=Deltas)
    latency: Window[Histogram] = field(default_factory=Window)
    tpot: Window[Histogram] = field(default_factory=Window)


class PoolFeed:
    """The planner's input over successive rounds of metric pages (pure: pages in, readings out; no clock, no
    I/O). Per role, the interval's counts (`Deltas`) and the latency histograms over the percentile window;
    per router, its counts by route and the direct route's TTFT window. The operator's runner feeds it the
    pages it scraped, the simulator the pages its engines and router render: both plan on what this reads."""

    def __init__(self) -> None:
        self._roles: dict[str, _RoleFeed] = {}
        self._router_load: Deltas[RouterSample] = Deltas()
        self._direct_ttft: Window[Histogram] = Window()

    def role(self, role: str, now: float, round_: RolePages) -> tuple[RoleReading, list[tuple[str, str]]]:
        """One role's reading, and the pods whose page could not be read, with why."""
        feed = self._roles.setdefault(role, _RoleFeed())
        samples: dict[str, EngineSample] = {}
        gauges: list[EngineGauges] = []
        failed: list[tuple[str, str]] = []
        for name, page in round_.pages:
            try:
                sample, gauge = read_engine(page, LATENCY_METRIC[role])
                tpot = read_histogram(page, TPOT_METRIC) if role == "decode" else None
            except MetricsError as error:
                failed.append((name, str(error)))
                continue
            if sample is not None:
                samples[name] = sample
                if sample.latency is not None:
                    feed.latency.add(name, now, sample.latency)
            if tpot is not None:
                feed.tpot.add(name, now, tpot)
            if gauge is not None:
                gauges.append(gauge)
        feed.latency.keep_only(set(round_.ready_pods))
        feed.tpot.keep_only(set(round_.ready_pods))
        reading = RoleReading(
            replicas=round_.replicas,
            ready=round_.ready,
            load=feed.load.step(samples),
            latency_window=feed.latency.delta(now, round_.window_seconds),
            percentile=round_.percentile,
            gauges=tuple(gauges),
            tpot_window=feed.tpot.delta(now, round_.window_seconds),
        )
        return reading, failed

    def routers(
        self, now: float, ready_pods: frozenset[str], pages: list[tuple[str, Page]], window_seconds: float
    ) -> tuple[RouterReading, list[tuple[str, str]]]:
        """The routers' counts by route over the interval and the direct route's TTFT over the window, and the
        pods whose page could not be read, with why."""
        loads: dict[str, RouterSample] = {}
        failed: list[tuple[str, str]] = []
        for name, page in pages:
            try:
                load, direct = read_router(page)
            except MetricsError as error:
                failed.append((name, str(error)))
                continue
            if load is not None:
                loads[name] = load
            if direct is not None:
                self._direct_ttft.add(name, now, direct)
        self._direct_ttft.keep_only(set(ready_pods))
        reading = RouterReading(self._router_load.step(loads), self._direct_ttft.delta(now, window_seconds))
        return reading, failed


def observation(
    now: float,
    interval_seconds: float,
    prefill: RoleReading,
    decode: RoleReading,
    router: RouterReading,
    kv_capacity_tokens: int,
) -> Observation:
    """The planner's input. What is not known stays None (the planner keeps the replicas when the load is
    unknown, and skips a correction it has no figure for)."""
    to_prefill, direct, bypassed, lent = _routes(router.load, prefill.load, decode.load)
    generated = None if decode.load is None else round(decode.load.generation_tokens)
    lent_generated = None
    if lent is not None and lent.prompts and prefill.load is not None:
        # a prefill leg generates its one token; what the prefill engines generated beyond those was lent
        lent_generated = max(0, round(prefill.load.generation_tokens) - _prefill_legs(router.load))
        generated = None if generated is None else generated + lent_generated
    kv_usage = mean_context = None
    if decode.gauges:
        kv_usage = sum(g.kv_usage for g in decode.gauges) / len(decode.gauges)
        running = sum(g.running for g in decode.gauges)
        if running > 0:
            mean_context = sum(g.kv_usage for g in decode.gauges) * kv_capacity_tokens / running
    itl = decode.load.latency if decode.load is not None else None
    return Observation(
        now=now,
        interval_seconds=interval_seconds,
        to_prefill=to_prefill,
        direct=direct,
        bypassed=bypassed,
        lent=lent,
        lent_generated_tokens=lent_generated,
        generated_tokens=generated,
        prefill=PoolSignals(
            prefill.replicas,
            prefill.ready,
            observed_seconds=_quantile(prefill.latency_window, prefill.percentile),
        ),
        decode=PoolSignals(
            decode.replicas,
            decode.ready,
            observed_seconds=_quantile(decode.latency_window, decode.percentile),
            tpot_seconds=_quantile(decode.tpot_window, decode.percentile),
            tpot_bucket_top_seconds=None
            if decode.tpot_window is None
            else decode.tpot_window.bucket_top(decode.percentile / 100),
            mean_itl_seconds=itl.sum / itl.count if itl is not None and itl.count > 0 else None,
            direct_ttft_seconds=_quantile(router.direct_ttft_window, prefill.percentile),
            kv_usage=kv_usage,
            mean_context_tokens=mean_context,
        ),
    )


def _quantile(histogram: Histogram | None, percentile: int) -> float | None:
    return None if histogram is None else histogram.quantile(percentile / 100)


def _prefill_legs(router: RouterSample | None) -> int:
    """Prefill legs the router sent over the interval: one per disaggregated request."""
    return 0 if router is None else round(router.requests.values[1])


def _routes(
    router: RouterSample | None, prefill: EngineSample | None, decode: EngineSample | None
) -> tuple[RouteLoad | None, RouteLoad | None, RouteLoad | None, RouteLoad | None]:
    """(to the prefill pool, direct, bypassed, lent) prompts and their tokens over the interval. Bypassed
    prompts (sent direct because the prefill pool was busy, or prefilled on a peer decode pod because it
    queued: prefill demand, work the decode pods did) are in the first, not the second; lent prompts (served
    whole on a prefill pod because the decodes queued) in the second, not the first."""
    if router is None:
        return None, None, None, None
    n_direct, n_disaggregated, n_fallback, n_lent = (round(v) for v in router.requests.values)
    if router.prompt_tokens is not None:
        t_direct, t_disaggregated, t_fallback, t_lent = (round(v) for v in router.prompt_tokens.values)
        n_peer = t_peer = 0
        if router.bypassed is not None:
            # counted at the decision, the route at its decode leg: never more than the route's
            n_peer = min(n_disaggregated, round(router.bypassed.values[1]))
            t_peer = min(t_disaggregated, round(router.bypassed.values[3]))
        if prefill is not None and n_disaggregated:
            # the prefill engines' own count: exact, where the router may only estimate; it includes the
            # lent prompts they computed (at most their routed size), not those peer decode pods computed
            t_disaggregated = max(0, round(prefill.computed_tokens) - t_lent) + t_peer
        bypassed = None
        if router.bypassed is not None:
            n_bypassed = min(n_direct, round(router.bypassed.values[0]))
            t_bypassed = min(t_direct, round(router.bypassed.values[2]))
            bypassed = RouteLoad(n_bypassed + n_peer, t_bypassed + t_peer)
            n_direct, t_direct = n_direct - n_bypassed, t_direct - t_bypassed
            n_fallback, t_fallback = n_fallback + n_bypassed, t_fallback + t_bypassed
        if router.shed is not None:
            # shed before any engine saw them: demand of the pool each would have run on
            s_direct, s_disaggregated, s_fallback, s_lent, u_direct, u_disaggregated, u_fallback, u_lent = (
                round(v) for v in router.shed.values
            )
            n_disaggregated, t_disaggregated = (
                n_disaggregated + s_disaggregated,
                t_disaggregated + u_disaggregated,
            )
            n_fallback, t_fallback = n_fallback + s_fallback, t_fallback + u_fallback
            n_direct, t_direct = n_direct + s_direct, t_direct + u_direct
            n_lent, t_lent = n_lent + s_lent, t_lent + u_lent
        b_prefill, b_direct = router.burst_tokens or (None, None)
        return (
            RouteLoad(
                n_disaggregated + n_fallback, t_disaggregated + t_fallback, burst_prompt_tokens=b_prefill
            ),
            RouteLoad(n_direct + n_lent, t_direct + t_lent, burst_prompt_tokens=b_direct),
            bypassed,
            RouteLoad(n_lent, t_lent),
        )
    # An older router: the tokens from the engines (a prefill pod prefills only disaggregated prompts, a
    # decode pod counts every prompt it serves); fallback prompts at the disaggregated mean.
    if decode is None or (n_disaggregated and prefill is None):
        return None, None, None, None
    disaggregated = prefill.computed_tokens if prefill is not None and n_disaggregated else 0.0
    mean = disaggregated / n_disaggregated if n_disaggregated else 0.0
    fallback = mean * n_fallback
    remaining = max(0.0, decode.prompt_tokens - disaggregated - fallback)
    return (
        RouteLoad(n_disaggregated + n_fallback, round(disaggregated + fallback)),
        RouteLoad(n_direct, round(remaining)),
        None,
        None,
    )
