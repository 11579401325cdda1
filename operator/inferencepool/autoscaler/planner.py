"""How many prefill and decode replicas a pool wants, from measured demand, forecast and capacity (pure).

An SLA planner in the manner of NVIDIA Dynamo's: it sizes each role from the load it will carry one model
load ahead and what one replica carries at the latency target, and uses the observed latency against the
target as feedback, not as the signal to size from (latency is flat until a pool saturates, then rises like a
hockey stick, so a latency ratio says nothing about how many replicas a load needs).

Every interval the caller passes an `Observation` (what the router and the engines' metrics said over it);
`Planner.decide` returns a `Plan`: replicas per role, each with the figures behind it, a pure data record for
status, events and logs. Time is passed in; nothing here reads a clock or does I/O.

Demand, in engine-seconds of work per second (`capacity.CapacityModel`):
- W_p: the prefill work of the prompts the routing policy sends, or wanted to send, to the prefill pool
  (prompts it sent direct only because the prefill pool was busy count here, and in the decode pods'
  predicted utilisation, not in decode's demand);
- W_d: the prefill work of the prompts prefilled on decode pods (short prompts, routed direct);
- G: generated tokens per second, each costing delta (the per-sequence step cost at the mean context);
- KV: the decode pool's KV in use, which must fit in kv_fill of its capacity.

Forecast: the prefill pool's and the decode pool's demand one model load plus one interval ahead
(`forecast.Forecaster`: trend and recent level), times the correction, the latency factor and the headroom.
Bursts shorter than a model load cannot be followed, so each role also holds enough to drain the q-quantile
burst of the last half hour (a burst: the most prefill work that arrived within one of the router's
`burst_window_seconds` arrival windows, above the route's load level when it came) on top of today's level
within the TTFT target.

Capacity of one replica at the target:
- prefill: a utilisation cap from the TTFT target, M/D/1 style. With S the service time of the mean prompt,
  the mean queueing wait is rho S / (2 (1 - rho)); keeping S + k x wait under the target gives
  rho <= x / (1 + x), x = 2 (target / S - 1) / k;
- decode: the share of each second beyond the base steps, delta G + W_d, must stay under 1 - t0 / ITL target
  (so a step, t0 / (1 - share), stays under the target), and under the TTFT cap of the direct prompts.

Decode's latency signal is the SLO's own: the percentile of each request's mean time per output token
(TPOT, vLLM's request_time_per_output_token histogram: "p90 of requests have a mean ITL under the target"),
or, from engines without that histogram, the percentile of the token gaps (inter_token_latency), a
stricter contract: gaps include every step that carries a prefill chunk, so their percentile sits near twice
the mean where the requests' TPOT percentile does not. The plan says which (`RolePlan.signal`).

Corrections: kappa = observed / predicted utilisation (prefill: the engines' busy share; decode: 1 - t0 /
observed mean ITL), smoothed and clamped, multiplies the demand; decode's spread (the observed percentile of
that signal over the mean ITL, learnt while the pool is loaded) shrinks a replica's room, 1 - t0 x spread /
target, since steps that carry a prefill chunk put the percentile above the mean step the model sizes; the
latency factor phi grows while the pool's own percentile (prefill: TTFT; decode: TPOT or ITL, and the TTFT
of direct prompts) is over target with every replica ready, and relaxes back to 1 when it is under. Over
target with every replica ready and no more planned, one replica is added (a guard against model error).

Decision: replicas = ceil(demand / capacity) per role; scale up at once (replicas still loading count, since
the number is a target), scale down one replica per decision when the forecast allows, not within
`scale_down_delay_seconds` of a scale-up nor within `warmup_seconds` of the first decision. Bounds:
min/max per role, prefill:decode ratio bounds while prefill runs, an optional GPU budget across both.
Prefill may go to zero (its minReplicas 0): the prefill pool goes and the decode pods prefill everything
(colocated) when that needs fewer replicas in all than keeping it (prefill work on
a decode pod costs that pod's ITL-bound capacity, on a prefill pod the TTFT-bound one), or when its load is
below `zero_prefill_below` of a replica; it comes back when keeping it is strictly cheaper; while it is
gone, its demand counts on decode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from inferencepool.autoscaler.capacity import CapacityModel
from inferencepool.autoscaler.forecast import BurstMemory, Forecaster

# Reasons (CamelCase, as in Kubernetes conditions and events).
FORECAST_UP = "ForecastUp"
FORECAST_DOWN = "ForecastDown"
STEADY = "Steady"
LATENCY_GUARD = "LatencyGuard"
PREFILL_TO_ZERO = "PrefillToZero"
PREFILL_BACK = "PrefillBack"
RATIO_BOUND = "RatioBound"
BUDGET_LIMITED = "BudgetLimited"
SCALING_LIMITED = "ScalingLimited"
SCALE_DOWN_DELAY = "ScaleDownDelay"
MISSING_METRICS = "MissingMetrics"


@dataclass(frozen=True)
class RoleBounds:
    min_replicas: int
    max_replicas: int
    gpus_per_replica: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError(
                f"replica bounds must satisfy 0 <= min <= max and max >= 1, got "
                f"{self.min_replicas}..{self.max_replicas}"
            )
        if self.gpus_per_replica < 0:
            raise ValueError("gpus_per_replica must be >= 0")


@dataclass(frozen=True)
class PlannerSettings:
    ttft_target_seconds: float
    itl_target_seconds: float
    prefill: RoleBounds
    decode: RoleBounds
    model_load_seconds: float = 120.0
    interval_seconds: float = 15.0
    headroom: float = 1.0  # on the forecast; each role's capacity is already its capacity at the target
    max_utilisation: float = 0.9
    wait_factor: float = 1.0  # k: how many mean waits the TTFT target must leave room for
    kv_fill: float = 0.8
    ratio_bounds: tuple[float, float] | None = None  # prefill / decode replicas while prefill runs
    gpu_budget: int | None = None  # across both roles
    zero_prefill_below: float = 0.05  # of one prefill replica's capacity: always colocate (minReplicas 0)
    latency_tolerance: float = 0.1
    correction_weight: float = 0.3
    correction_bounds: tuple[float, float] = (0.5, 2.0)
    latency_factor_max: float = 3.0
    scale_down_delay_seconds: float = 120.0
    warmup_seconds: float = 300.0  # no scale-down this long after the first decision (no burst history yet)
    scale_down_margin: float = 0.1  # scale down only if the pool would still fit this much more demand
    itl_fill: float = 1.0  # size decode for this share of the ITL target (< 1: room for the TPOT spread)
    spread_min_load: float = 0.3  # learn the ITL spread only above this predicted busy share per replica
    spread_max: float = 3.0
    spread_weight: float = 0.15  # smoothing of the spread (a 60 s percentile over a 15 s mean is noisy)
    trend_seconds: float = 300.0
    min_trend_samples: int = 4  # no trend read from fewer samples (a line through 2 or 3 extrapolates noise)
    recent_seconds: float = 60.0  # the forecast's floor: the mean of the last samples (bursts held apart)
    burst_window_seconds: float = 2.0  # the router's arrival window (router.metrics.ARRIVAL_WINDOW_SECONDS)
    burst_memory_seconds: float = 1800.0
    # how big a burst of the memory the pools stand ready for. Not the SLO's percentile: a burst packs many
    # requests into one interval, so holding for the p90 interval misses far more than 10% of requests (an
    # hour of azure-code at 2x: 87% within the SLO at q 0.9 and at 0.95, 96.6% at 0.99)
    burst_quantile: float = 0.99

    def __post_init__(self) -> None:
        if self.ttft_target_seconds <= 0 or self.itl_target_seconds <= 0:
            raise ValueError("latency targets must be > 0")
        if self.decode.min_replicas < 1:
            raise ValueError("decode minReplicas must be >= 1 (decode scale-to-zero is not supported)")
        if self.headroom < 1 or not 0 < self.max_utilisation <= 1 or not 0 < self.kv_fill <= 1:
            raise ValueError("headroom must be >= 1, max_utilisation and kv_fill within (0, 1]")
        if self.ratio_bounds is not None and not 0 <= self.ratio_bounds[0] <= self.ratio_bounds[1]:
            raise ValueError(f"ratio bounds must satisfy 0 <= low <= high, got {self.ratio_bounds}")
        if self.gpu_budget is not None and self.gpu_budget < self.decode.min_replicas * max(
            1, self.decode.gpus_per_replica
        ):
            raise ValueError(f"a GPU budget of {self.gpu_budget} cannot hold the decode pool's minimum")


@dataclass(frozen=True)
class RouteLoad:
    """Prompts on one route over the interval (the router's counters)."""

    prompts: int
    prompt_tokens: int
    work_seconds: float | None = None  # sum of the capacity model's prefill cost per prompt, if counted
    # the most prompt tokens that arrived in one of the router's burst windows over the interval
    burst_prompt_tokens: float | None = None

    def work(self, model: CapacityModel) -> float:
        if self.work_seconds is not None:
            return self.work_seconds
        if self.prompts <= 0:
            return 0.0
        return self.prompts * model.prefill_seconds(self.prompt_tokens / self.prompts)

    def burst_work(self, model: CapacityModel) -> float | None:
        """The prefill work of the burst window: its tokens at the interval's work per token (the window's
        prompts are the interval's mix), or as one prompt when the interval counted none (its windows may
        close after their prompts were counted)."""
        tokens = self.burst_prompt_tokens
        if tokens is None:
            return None
        if self.prompt_tokens > 0:
            return tokens * self.work(model) / self.prompt_tokens
        return model.prefill_seconds(tokens)


@dataclass(frozen=True)
class PoolSignals:
    """One role's pods over the interval (the engines' metrics); None where a figure is unknown."""

    replicas: int  # desired (spec), loading pods included
    ready: int
    observed_seconds: float | None = None  # its target percentile: TTFT (prefill) or ITL (decode)
    busy_fraction: float | None = None  # prefill: mean share of time the ready engines computed
    mean_itl_seconds: float | None = None  # decode: mean inter-token latency (histogram sum / count)
    direct_ttft_seconds: float | None = None  # decode: TTFT percentile of prompts prefilled on decode pods
    kv_usage: float | None = None  # decode: mean KV cache usage of ready engines, 0..1
    mean_context_tokens: float | None = None  # decode: mean context of running sequences
    # decode: the percentile of the requests' mean time per output token (vLLM's
    # request_time_per_output_token histogram), the SLO's own figure; held against the ITL target instead of
    # the gaps' percentile (observed_seconds) when the engines export it
    tpot_seconds: float | None = None
    # the upper bound of the histogram bucket that holds that percentile: below the target, the reading is
    # interpolated inside a bucket wholly under it (vLLM's ITL buckets are 10, 25, 50 ms...), so it says only
    # that the pool meets the target, not by how much
    tpot_bucket_top_seconds: float | None = None


@dataclass(frozen=True)
class Observation:
    now: float
    interval_seconds: float
    to_prefill: RouteLoad | None  # prompts the policy sent, or wanted to send, to the prefill pool
    direct: RouteLoad | None  # prompts the policy routed direct (prefilled on decode pods)
    generated_tokens: int | None
    prefill: PoolSignals
    decode: PoolSignals
    # of to_prefill, the prompts the router sent direct because the prefill pool was busy: prefill demand,
    # but work the decode pods did (their predicted utilisation, for the correction, counts it)
    bypassed: RouteLoad | None = None
    # of direct, the prompts served whole on prefill pods (role lending), and the tokens they generated
    # there (in generated_tokens): decode demand, but work the prefill pods did
    lent: RouteLoad | None = None
    lent_generated_tokens: int | None = None


@dataclass(frozen=True)
class RolePlan:
    """One role's decision and every figure behind it."""

    role: str
    current: int
    ready: int
    replicas: int  # what the pool should have now
    wanted: int  # before the one-step scale-down, the delay and the bounds
    reason: str
    message: str
    demand: float  # engine-seconds per second, measured over the interval (kappa applied)
    forecast: float  # ... one model load ahead, headroom and latency factor applied
    capacity_per_replica: float  # engine-seconds per second one replica carries at the target
    correction: float  # kappa, observed / predicted utilisation
    latency_factor: float  # phi
    observed_seconds: float | None
    target_seconds: float
    signal: str = ""  # the latency held against the target: TTFT (prefill), TPOT or ITL (decode)


@dataclass(frozen=True)
class Plan:
    now: float
    prefill: RolePlan
    decode: RolePlan

    def summary(self) -> str:
        return "; ".join(f"{p.role}: {p.message}" for p in (self.prefill, self.decode))


@dataclass
class _RoleState:
    forecasters: dict[str, Forecaster] = field(default_factory=dict)
    spread: float = 1.0  # decode: observed percentile ITL / mean ITL (the tail the mean-step model misses)
    correction: float = 1.0
    latency_factor: float = 1.0
    last_scale_up: float | None = None
    bursts: BurstMemory | None = None


@dataclass(frozen=True)
class _RoleSeen:
    """Observe: one role's interval, as the planner read it (work in engine-seconds per second)."""

    role: str
    signals: PoolSignals
    work: float  # what the role's replicas compute: prefill, or decode's direct prefill plus generation
    prefill_work: float  # of it, prefill of the role's own route (bursts are counted on it)
    over: bool  # over target with every replica up
    observed: float | None  # the latency held against the target
    target: float
    signal: str  # TTFT, TPOT or ITL
    generating: float = 0.0  # decode: delta x generated tokens per second


@dataclass(frozen=True)
class _Seen:
    prefill: _RoleSeen
    decode: _RoleSeen
    t0: float  # decode's base step at the mean context


@dataclass(frozen=True)
class _RoleAhead:
    """Forecast: one role's load, corrected."""

    demand: float  # the interval's work, kappa applied
    forecast: float  # one model load ahead, headroom and latency factor applied
    burst: float  # replicas' worth of the q-quantile burst and today's level


@dataclass(frozen=True)
class _Ahead:
    prefill: _RoleAhead
    decode: _RoleAhead


@dataclass(frozen=True)
class _RoleNeed:
    """Size: what one role wants before the step and bounds."""

    current: int
    wanted: int
    reason: str
    capacity: float  # engine-seconds per second one replica carries at the target
    forecast: float  # the work it is sized for (decode: with prefill's while that pool is at zero)
    share: float  # replicas' worth of it
    kv_replicas: int = 0


@dataclass(frozen=True)
class _Need:
    prefill: _RoleNeed
    decode: _RoleNeed


@dataclass(frozen=True)
class _Bounded:
    """Bound: the replicas one role gets now, and what it wanted after the scale-down hysteresis."""

    replicas: int
    wanted: int
    reason: str


def _utilisation_cap(target: float, service: float, wait_factor: float, ceiling: float) -> float:
    """The highest utilisation at which service + wait_factor x the M/D/1 mean wait stays under target."""
    if service <= 0:
        return ceiling
    slack = target / service - 1
    if slack <= 0:
        return 0.05  # the target is below one prompt's service time: size generously, the guard does the rest
    x = 2 * slack / wait_factor
    return max(0.05, min(ceiling, x / (1 + x)))


class Planner:
    def __init__(self, settings: PlannerSettings, model: CapacityModel) -> None:
        self.settings = settings
        self.model = model
        self._now = 0.0
        self._first: float | None = None
        self._state = {"prefill": _RoleState(), "decode": _RoleState()}
        self._tpot_seen = False  # the decode engines export the requests' TPOT: hold it, not the gaps

    def _decode_signal(self, signals: PoolSignals) -> tuple[str, float | None]:
        """Which decode latency is held against the ITL target: the requests' TPOT once the engines have
        given one (an interval in which no request finished then has no figure: no feedback, rather than
        the stricter gaps' for a moment), else the token gaps' (engines without the per-request histogram)."""
        self._tpot_seen = self._tpot_seen or signals.tpot_seconds is not None
        if self._tpot_seen:
            return "TPOT", signals.tpot_seconds
        return "ITL", signals.observed_seconds

    def _forecast(self, role: str, signal: str, now: float, value: float) -> float:
        state = self._state[role]
        forecaster = state.forecasters.get(signal)
        if forecaster is None:
            forecaster = state.forecasters[signal] = Forecaster(
                self.settings.trend_seconds, self.settings.recent_seconds, self.settings.min_trend_samples
            )
        forecaster.observe(now, value)
        # While warming up the samples are the pool filling up from empty, no trend to extrapolate.
        warming = self._first is not None and now - self._first < self.settings.warmup_seconds
        result = forecaster.forecast(now, self.settings.model_load_seconds + self.settings.interval_seconds)
        assert result is not None
        return max(result.latest, result.recent) if warming else result.value

    def _burst(self, role: str, load: RouteLoad, work: float) -> float:
        """Engine-seconds per second that drain the q-quantile burst of recent memory within the TTFT
        target: bursts shorter than a model load are held for, not followed. A burst is remembered as its
        excess, the work that arrived within one burst window above the route's level then (its mean work
        over `trend_seconds`), and held on top of today's level: a pool is ready for the bursts of its
        traffic without holding the level of half an hour ago (a diurnal load's peak)."""
        s = self.settings
        state = self._state[role]
        if state.bursts is None:
            state.bursts = BurstMemory(s.burst_memory_seconds, s.burst_quantile)
        levels = state.forecasters.get("level")
        if levels is None:
            levels = state.forecasters["level"] = Forecaster(s.trend_seconds, 0.0)
        levels.observe(self._now, work)
        level = levels.mean(self._now, s.trend_seconds) or 0.0
        burst = load.burst_work(self.model)
        if burst is not None:
            state.bursts.observe(self._now, max(0.0, burst - level * s.burst_window_seconds))
        held = level * s.burst_window_seconds + state.bursts.level()
        return held / (s.burst_window_seconds + s.ttft_target_seconds)

    def _correct(self, role: str, observed: float | None, predicted: float) -> None:
        state = self._state[role]
        if observed is None or predicted < 0.05:
            return  # too little load to tell the model's error from noise
        low, high = self.settings.correction_bounds
        ratio = min(high, max(low, observed / predicted))
        weight = self.settings.correction_weight
        state.correction = (1 - weight) * state.correction + weight * ratio

    def _learn_spread(self, observed: float | None, signals: PoolSignals, predicted_u: float) -> None:
        """Decode's capacity correction from the observed latency: a step of the continuous batch that
        carries a prefill chunk is long, so the target percentile of ITL sits above its mean (the mean-step
        model's figure). The spread, percentile / mean, learnt while the pool is loaded enough for it to
        mean something (`spread_min_load`), divides the room a replica has under the target. A TPOT
        percentile read inside a histogram bucket wholly under the target is not learnt from: linear
        interpolation inside a wide bucket (10-25 ms) puts a clustered distribution's percentile near the
        bucket's top, a spread the pool does not have; the spread is learnt where the bucket reaches the
        target and the pool is within it. Over the target the latency factor corrects: a saturated pool's
        requests queue behind each other, which is not the spread of a loaded one, and learning both would
        count the miss twice."""
        s = self.settings
        mean = signals.mean_itl_seconds
        if observed is None or mean is None or mean <= 0 or predicted_u < s.spread_min_load:
            return
        if observed == signals.tpot_seconds:
            top = signals.tpot_bucket_top_seconds
            if top is not None and top < s.itl_target_seconds:
                return  # read inside a bucket wholly under the target: the percentile is not resolved there
            if observed > s.itl_target_seconds * (1 + s.latency_tolerance):
                return  # over the target the latency factor corrects (a saturated pool queues: no spread)
        state = self._state["decode"]
        ratio = min(s.spread_max, max(1.0, observed / mean))
        state.spread = (1 - s.spread_weight) * state.spread + s.spread_weight * ratio

    def _feedback(self, role: str, ratio: float | None, all_ready: bool, gone: bool = False) -> bool:
        """Update phi from observed / target; True when the pool is over target with every replica up. A pool
        that has gone (prefill at zero) relaxes its phi as one under target does: the factor corrected its
        replicas' capacity, and while there are none it would only inflate the work the decode pods take
        over (and, stuck, the cost of bringing the pool back)."""
        state = self._state[role]
        tolerance = self.settings.latency_tolerance
        if gone or (ratio is not None and ratio <= 1):
            state.latency_factor = max(1.0, 1 + (state.latency_factor - 1) * 0.8)
            return False
        if ratio is not None and ratio > 1 + tolerance and all_ready:
            state.latency_factor = min(
                self.settings.latency_factor_max, state.latency_factor * min(ratio, 1.5)
            )
            return True
        return False

    def decide(self, obs: Observation) -> Plan:
        """One decision, in the phases of Dynamo's planner: observe (the interval's demand, and the
        corrections and latency feedback it teaches), forecast (one model load ahead, and the bursts to stand
        ready for), size (replicas per role at the target, prefill at zero weighed), bound (hysteresis, one
        step down, the replica, ratio and GPU bounds). Acting on the plan is the runner's (its actuator)."""
        if self._first is None:
            self._first = obs.now
        if obs.to_prefill is None or obs.direct is None or obs.generated_tokens is None:
            return self._keep(obs, "router or engine counters missing for this interval")
        self._now = obs.now
        seen = self._observe(obs, obs.to_prefill, obs.direct, obs.generated_tokens)
        ahead = _Ahead(
            self._forecast_role("prefill", seen.prefill, obs.to_prefill),
            self._forecast_role("decode", seen.decode, obs.direct),
        )
        need = self._size(obs, obs.to_prefill, obs.direct, seen, ahead)
        prefill, decode = self._bound(obs.now, need)
        return Plan(
            obs.now,
            self._explain(seen.prefill, ahead.prefill, need.prefill, prefill),
            self._explain(seen.decode, ahead.decode, need.decode, decode),
        )

    # ----- observe -----

    def _observe(self, obs: Observation, to_prefill: RouteLoad, direct: RouteLoad, generated: int) -> _Seen:
        """Each role's demand over the interval, in engine-seconds per second, and what it teaches: the
        correction (observed over predicted utilisation), the latency factor, and decode's spread."""
        interval = max(obs.interval_seconds, 1e-9)
        model = self.model
        w_p = to_prefill.work(model) / interval
        context = obs.decode.mean_context_tokens
        if context is None:
            total = direct.prompts + to_prefill.prompts
            tokens = direct.prompt_tokens + to_prefill.prompt_tokens
            context = tokens / total if total else 1024.0
        t0, delta = model.decode_step(context)
        w_d = direct.work(model) / interval
        generating = delta * (generated / interval)
        w_bypassed = 0.0 if obs.bypassed is None else obs.bypassed.work(model) / interval
        on_decode = w_p if obs.prefill.ready == 0 else w_bypassed  # prefill work the decode pods did
        # lent work: decode demand the prefill pods carried (their utilisation, not the decode pods')
        w_lent = 0.0 if obs.lent is None else obs.lent.work(model) / interval
        lent_generating = delta * ((obs.lent_generated_tokens or 0) / interval)
        on_decode -= w_lent + lent_generating
        prefill = self._observe_prefill(obs.prefill, w_p, w_lent + lent_generating)
        return _Seen(prefill, self._observe_decode(obs.decode, w_d, generating, on_decode, t0), t0)

    def _observe_prefill(self, signals: PoolSignals, w_p: float, lent: float = 0.0) -> _RoleSeen:
        """`lent`: the decode pool's work the prefill pods did (role lending), in their utilisation only."""
        s = self.settings
        if signals.ready > 0:
            self._correct("prefill", signals.busy_fraction, (w_p + lent) / signals.ready)
        observed = signals.observed_seconds
        over = self._feedback(
            "prefill",
            None if observed is None else observed / s.ttft_target_seconds,
            signals.ready >= signals.replicas > 0,
            gone=signals.replicas == 0 and signals.ready == 0,
        )
        return _RoleSeen("prefill", signals, w_p, w_p, over, observed, s.ttft_target_seconds, "TTFT")

    def _observe_decode(
        self, signals: PoolSignals, w_d: float, generating: float, on_decode: float, t0: float
    ) -> _RoleSeen:
        """Decode's latency is held as the worse of its signal (TPOT or the gaps) over the ITL target and
        the direct prompts' TTFT over the TTFT target."""
        s = self.settings
        work = w_d + generating
        predicted_u = (work + on_decode) / max(signals.ready, 1)
        mean_itl = signals.mean_itl_seconds
        observed_u = None if mean_itl is None or mean_itl <= 0 else max(0.0, 1 - t0 / mean_itl)
        if signals.ready > 0:
            self._correct("decode", observed_u, predicted_u)
        signal, observed = self._decode_signal(signals)
        direct_ttft = signals.direct_ttft_seconds
        ratios = [
            r
            for r in (
                None if observed is None else observed / s.itl_target_seconds,
                None if direct_ttft is None else direct_ttft / s.ttft_target_seconds,
            )
            if r is not None
        ]
        over = self._feedback(
            "decode", max(ratios) if ratios else None, signals.ready >= signals.replicas > 0
        )
        self._learn_spread(observed, signals, predicted_u if signals.ready > 0 else 0.0)
        return _RoleSeen(
            "decode", signals, work, w_d, over, observed, s.itl_target_seconds, signal, generating
        )

    # ----- forecast -----

    def _forecast_role(self, role: str, seen: _RoleSeen, load: RouteLoad) -> _RoleAhead:
        """The role's work one model load ahead (correction, headroom and latency factor applied), and the
        burst it stands ready for, in replicas' worth of work (its generation on top, for decode)."""
        state = self._state[role]
        forecast = self._forecast(role, "work", self._now, seen.work)
        burst = self._burst(role, load, seen.prefill_work) + seen.generating
        return _RoleAhead(
            demand=state.correction * seen.work,
            forecast=forecast * state.correction * self.settings.headroom * state.latency_factor,
            burst=burst * state.correction,
        )

    # ----- size -----

    def _size(
        self, obs: Observation, to_prefill: RouteLoad, direct: RouteLoad, seen: _Seen, ahead: _Ahead
    ) -> _Need:
        """Replicas per role at the target: prefill first (with its pool; zero is weighed), then decode,
        which takes the prefill pool's work while that is at zero and holds its KV; each with a guard of
        one more replica when the pool is over its target with every replica up."""
        s, model = self.settings, self.model
        mean_prompt = (
            to_prefill.prompt_tokens / to_prefill.prompts if to_prefill.prompts else model.chunk_tokens
        )
        p_cap = _utilisation_cap(
            s.ttft_target_seconds, model.idle_prefill_seconds(mean_prompt), s.wait_factor, s.max_utilisation
        )
        p_share = max(ahead.prefill.forecast / p_cap, ahead.prefill.burst)  # replicas' worth of prefill load
        current_p, current_d = obs.prefill.replicas, obs.decode.replicas
        wanted_p, p_reason = max(1, math.ceil(p_share - 1e-9)), ""
        if seen.prefill.over and wanted_p <= current_p and current_p > 0:
            wanted_p, p_reason = current_p + 1, LATENCY_GUARD
        d_cap = self._decode_capacity(direct, seen.t0)
        d_forecast, d_burst = ahead.decode.forecast, ahead.decode.burst
        if s.prefill.min_replicas == 0 and p_reason != LATENCY_GUARD:
            wanted_p, p_reason = self._weigh_prefill_zero(current_p, wanted_p, p_share, ahead, d_cap)
        if wanted_p == 0:
            d_forecast += (
                ahead.prefill.forecast
            )  # no prefill pool: the decode pods prefill what it would have
            d_burst += ahead.prefill.burst
        kv_tokens = (obs.decode.kv_usage or 0.0) * model.kv_capacity_tokens * max(obs.decode.ready, 0)
        kv_replicas = math.ceil(kv_tokens / (s.kv_fill * model.kv_capacity_tokens) - 1e-9)
        wanted_d = max(1, math.ceil(d_forecast / d_cap - 1e-9), math.ceil(d_burst - 1e-9), kv_replicas)
        d_reason = ""
        if wanted_p > 0 and obs.prefill.ready == 0 and wanted_d < current_d:
            wanted_d = current_d  # the decode pods prefill everything until a prefill pod is up
        if seen.decode.over and wanted_d <= current_d:
            wanted_d, d_reason = current_d + 1, LATENCY_GUARD
        return _Need(
            _RoleNeed(current_p, wanted_p, p_reason, p_cap, ahead.prefill.forecast, p_share),
            _RoleNeed(current_d, wanted_d, d_reason, d_cap, d_forecast, d_forecast / d_cap, kv_replicas),
        )

    def _decode_capacity(self, direct: RouteLoad, t0: float) -> float:
        """The share of each second one decode replica has for work beyond its base steps: the mean step
        must leave the percentile (spread x the mean) under the ITL target, and the direct prompts' TTFT
        under its own."""
        s = self.settings
        itl_cap = 1 - t0 * self._state["decode"].spread / (s.itl_fill * s.itl_target_seconds)
        mean_direct = direct.prompt_tokens / direct.prompts if direct.prompts else 256.0
        ttft_cap = _utilisation_cap(
            s.ttft_target_seconds,
            self.model.idle_prefill_seconds(mean_direct),
            s.wait_factor,
            s.max_utilisation,
        )
        return max(0.05, min(itl_cap, ttft_cap))

    def _weigh_prefill_zero(
        self, current_p: int, wanted_p: int, p_share: float, ahead: _Ahead, d_cap: float
    ) -> tuple[int, str]:
        """Without a prefill pool the decode pods prefill its prompts too, at the decode pods' capacity (held
        down by the ITL target): keep the pool only where that costs more replicas in all. Hysteresis: the
        pool goes only when zero is strictly cheaper, and comes back only when keeping it is."""
        p, d = ahead.prefill, ahead.decode
        with_pool = wanted_p + max(1, math.ceil(d.forecast / d_cap - 1e-9), math.ceil(d.burst - 1e-9))
        without = max(
            1, math.ceil((d.forecast + p.forecast) / d_cap - 1e-9), math.ceil(d.burst + p.burst - 1e-9)
        )
        cheaper = without < with_pool or (current_p == 0 and without <= with_pool)
        if cheaper or p_share < self.settings.zero_prefill_below:
            return 0, PREFILL_TO_ZERO if current_p > 0 else STEADY
        return wanted_p, PREFILL_BACK if current_p == 0 else ""

    # ----- bound -----

    def _bound(self, now: float, need: _Need) -> tuple[_Bounded, _Bounded]:
        """From what each role wants to what it gets now: a pool shrinks only when one replica fewer would
        still carry the demand plus a margin, then one step and not right after a scale-up; then the min/max
        bounds, the prefill:decode ratio and the GPU budget."""
        s, p, d = self.settings, need.prefill, need.decode
        margin = 1 + s.scale_down_margin
        wanted_p, wanted_d = p.wanted, d.wanted
        if 0 < wanted_p < p.current and math.ceil(p.share * margin - 1e-9) >= p.current:
            wanted_p = p.current
        if (
            wanted_d < d.current
            and max(math.ceil(d.forecast * margin / d.capacity - 1e-9), d.kv_replicas) >= d.current
        ):
            wanted_d = d.current
        replicas_p, p_reason = self._step_toward("prefill", now, p.current, wanted_p, p.reason, s.prefill)
        replicas_d, d_reason = self._step_toward("decode", now, d.current, wanted_d, d.reason, s.decode)
        if s.ratio_bounds is not None and replicas_p > 0:
            bounded = self._ratio_bound(replicas_p, replicas_d)
            if bounded != replicas_p:
                replicas_p, p_reason = bounded, RATIO_BOUND
        if s.gpu_budget is not None:
            replicas_p, replicas_d, limited = self._fit_budget(replicas_p, replicas_d, p.share, d.share)
            if limited:
                p_reason = BUDGET_LIMITED if limited in ("prefill", "both") else p_reason
                d_reason = BUDGET_LIMITED if limited in ("decode", "both") else d_reason
        for role, before, after in (("prefill", p.current, replicas_p), ("decode", d.current, replicas_d)):
            if after > before:
                self._state[role].last_scale_up = now
        return _Bounded(replicas_p, wanted_p, p_reason), _Bounded(replicas_d, wanted_d, d_reason)

    def _ratio_bound(self, prefill: int, decode: int) -> int:
        """Prefill replicas within the prefill:decode ratio bounds (and the prefill pool's own bounds)."""
        s = self.settings
        assert s.ratio_bounds is not None
        low, high = s.ratio_bounds
        most = s.prefill.max_replicas if math.isinf(high) else max(1, math.floor(high * decode + 1e-9))
        bounded = min(max(prefill, math.ceil(low * decode - 1e-9)), most)
        return min(max(bounded, max(1, s.prefill.min_replicas)), s.prefill.max_replicas)

    def _step_toward(
        self, role: str, now: float, current: int, wanted: int, reason: str, bounds: RoleBounds
    ) -> tuple[int, str]:
        """Scale up at once, down one step when no scale-up happened lately; then the min/max bounds."""
        if wanted > current:
            replicas = wanted
            reason = reason or FORECAST_UP
        elif wanted < current:
            last_up = self._state[role].last_scale_up
            warming = self._first is not None and now - self._first < self.settings.warmup_seconds
            if warming or (last_up is not None and now - last_up < self.settings.scale_down_delay_seconds):
                replicas, reason = current, SCALE_DOWN_DELAY
            else:
                replicas = current - 1
                reason = reason or FORECAST_DOWN
        else:
            replicas, reason = current, reason or STEADY
        bounded = min(max(replicas, bounds.min_replicas), bounds.max_replicas)
        if wanted > bounds.max_replicas and bounded == bounds.max_replicas:
            reason = SCALING_LIMITED
        return bounded, reason

    # ----- explain -----

    def _explain(self, seen: _RoleSeen, ahead: _RoleAhead, need: _RoleNeed, bounded: _Bounded) -> RolePlan:
        state = self._state[seen.role]
        message = self._message(
            need.current,
            bounded.replicas,
            bounded.wanted,
            bounded.reason,
            ahead.demand,
            need.forecast,
            need.capacity,
            state,
            seen.observed,
            seen.target,
            seen.signal,
        )
        if seen.role == "decode":
            message += f", {seen.signal} spread {state.spread:.2f}" if state.spread > 1.005 else ""
            message += f", KV needs {need.kv_replicas}" if need.kv_replicas > 1 else ""
        return RolePlan(
            seen.role,
            need.current,
            seen.signals.ready,
            bounded.replicas,
            bounded.wanted,
            bounded.reason,
            message,
            ahead.demand,
            need.forecast,
            need.capacity,
            state.correction,
            state.latency_factor,
            seen.observed,
            seen.target,
            seen.signal,
        )

    def _fit_budget(
        self, prefill: int, decode: int, prefill_need: float, decode_need: float
    ) -> tuple[int, int, str]:
        """Cut the role most over its need until both pools fit the GPU budget; which role(s) were cut."""
        s = self.settings
        assert s.gpu_budget is not None
        gp, gd = s.prefill.gpus_per_replica, s.decode.gpus_per_replica
        cut: set[str] = set()
        while prefill * gp + decode * gd > s.gpu_budget:
            can_p = prefill > s.prefill.min_replicas and gp > 0
            can_d = decode > s.decode.min_replicas and gd > 0
            if not (can_p or can_d):
                break
            over_p = prefill / max(prefill_need, 1e-9)
            over_d = decode / max(decode_need, 1e-9)
            if can_p and (not can_d or over_p >= over_d):
                prefill -= 1
                cut.add("prefill")
            else:
                decode -= 1
                cut.add("decode")
        return prefill, decode, "both" if len(cut) == 2 else next(iter(cut), "")

    def _message(
        self,
        current: int,
        replicas: int,
        wanted: int,
        reason: str,
        demand: float,
        forecast: float,
        capacity: float,
        state: _RoleState,
        observed: float | None,
        target: float,
        metric: str,
    ) -> str:
        seen = "no traffic" if observed is None else f"{observed * 1000:.0f}ms"
        if metric == "TPOT":
            metric = "TPOT (requests' mean ITL)"
        return (
            f"{current} -> {replicas} ({reason}; wants {wanted}): demand {demand:.2f}, forecast "
            f"{forecast:.2f} engine-s/s at {capacity:.2f} per replica, correction {state.correction:.2f}, "
            f"latency factor {state.latency_factor:.2f}, {metric} {seen} vs target {target * 1000:.0f}ms"
        )

    def _keep(self, obs: Observation, why: str) -> Plan:
        s = self.settings
        plans = []
        for role, signals, bounds, target, (signal, observed) in (
            (
                "prefill",
                obs.prefill,
                s.prefill,
                s.ttft_target_seconds,
                ("TTFT", obs.prefill.observed_seconds),
            ),
            ("decode", obs.decode, s.decode, s.itl_target_seconds, self._decode_signal(obs.decode)),
        ):
            state = self._state[role]
            replicas = min(max(signals.replicas, bounds.min_replicas), bounds.max_replicas)
            plans.append(
                RolePlan(
                    role,
                    signals.replicas,
                    signals.ready,
                    replicas,
                    replicas,
                    MISSING_METRICS,
                    f"keeping {replicas}: {why}",
                    0.0,
                    0.0,
                    0.0,
                    state.correction,
                    state.latency_factor,
                    observed,
                    target,
                    signal,
                )
            )
        return Plan(obs.now, plans[0], plans[1])
