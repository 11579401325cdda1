"""The autoscaler shell's feed: real metrics pages (the fake engine's vLLM collector, the router's own
registry) read into the planner's inputs, table by table, and a pool's spec as the planner's settings."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferencepool.api.v1alpha1 import InferencePool, InferencePoolSpec
from inferencepool.autoscaler import planner as planner_module
from inferencepool.autoscaler.capacity import from_profile
from inferencepool.autoscaler.feed import (
    Deltas,
    EngineGauges,
    EngineSample,
    RoleReading,
    RouterReading,
    RouterSample,
    observation,
    read_engine,
    read_router,
)
from inferencepool.autoscaler.histogram import (
    ITL_METRIC,
    TPOT_METRIC,
    TTFT_METRIC,
    Counts,
    Histogram,
    parse_page,
    read_histogram,
)
from inferencepool.autoscaler.planner import MISSING_METRICS, PREFILL_BACK, Planner, RouteLoad
from inferencepool.autoscaler.planner_spec import capacity_seed, planner_settings
from inferencepool.builders.common import PoolRef, engine_name
from inferencepool.engine_sim.core import EngineCore
from inferencepool.engine_sim.metrics import EngineMetrics
from inferencepool.observability.metrics import (
    DECISION_REASONS,
    OBSERVED_LATENCY,
    RECOMMENDED_REPLICAS,
    SCALING_DECISION,
    TARGET_LATENCY,
    OperatorMetrics,
    record_status,
)
from inferencepool.perf.profiles import get_profile
from inferencepool.router.metrics import LiveState, RouterMetrics
from inferencepool.router.pods import PodSet
from inferencepool.scheduling.decider import Route, RouteReason


class Engine:
    """The fake engine's real collector over a real (idle) core; served requests are counted by hand."""

    def __init__(self) -> None:
        self.core = EngineCore(get_profile("cpu-demo"), "e0")
        self.metrics = EngineMetrics(self.core, "m")

    def serve(self, prompt: int, output: int, ttft: float, gaps: list[float]) -> None:
        self.metrics.ttft.observe(ttft)
        for gap in gaps:
            self.metrics.itl.observe(gap)
        self.core.stats.prompt_tokens += prompt
        self.core.stats.generation_tokens += output

    def page(self, metric: str) -> tuple[EngineSample | None, EngineGauges | None]:
        return read_engine(parse_page(generate_latest(self.metrics.registry).decode()), metric)


class Router:
    def __init__(self) -> None:
        state = LiveState(PodSet(), lambda: 2048, lambda: "estimate", lambda: "", lambda: 4.0, dict)
        self.now = 0.0
        self.metrics = RouterMetrics(state, lambda: self.now)

    def route(self, route: Route, prompt: int, ttft: float, reason: RouteReason = RouteReason.LONG) -> None:
        self.metrics.requests_by_route[route].inc()
        self.metrics.prompt_tokens_by_route[route].inc(prompt)
        self.metrics.ttft_by_route[route].observe(ttft)
        self.metrics.arrived(route, reason, prompt)

    def page(self) -> tuple[RouterSample | None, Histogram | None]:
        return read_router(parse_page(generate_latest(self.metrics.registry).decode()))


def test_engine_pages_give_the_interval_s_tokens_and_latency_per_pod_summed() -> None:
    a, b = Engine(), Engine()
    a.serve(1000, 10, 0.2, [0.02] * 9)  # before the interval: not counted
    deltas: Deltas[EngineSample] = Deltas()
    assert deltas.step({"a": a.page(ITL_METRIC)[0], "b": b.page(ITL_METRIC)[0]}) is None  # type: ignore[dict-item]
    a.serve(300, 5, 0.1, [0.03] * 4)
    b.serve(200, 7, 0.1, [0.05] * 6)
    change = deltas.step({"a": a.page(ITL_METRIC)[0], "b": b.page(ITL_METRIC)[0]})  # type: ignore[dict-item]
    assert change is not None
    assert (change.prompt_tokens, change.generation_tokens) == (500, 12)
    assert change.latency is not None and change.latency.count == 10
    assert change.latency.sum == pytest.approx(4 * 0.03 + 6 * 0.05)
    sample, gauges = a.page(TTFT_METRIC)
    assert sample is not None and sample.latency is not None and sample.latency.count == 2
    assert gauges == EngineGauges(running=0, waiting=0, kv_usage=0)


def test_a_restarted_engine_counts_from_zero_and_a_new_pod_adds_nothing_yet() -> None:
    deltas: Deltas[EngineSample] = Deltas()
    deltas.step({"a": EngineSample(5000, 500, None)})
    change = deltas.step({"a": EngineSample(100, 10, None), "new": EngineSample(900, 90, None)})
    assert change == EngineSample(100, 10, None)


def test_a_page_without_vllm_counters_reads_as_unknown() -> None:
    assert read_engine(parse_page("# TYPE other gauge\nother 1\n"), ITL_METRIC) == (None, None)
    assert read_router(parse_page("# TYPE other gauge\nother 1\n")) == (None, None)


def test_router_pages_give_requests_and_tokens_by_route_and_the_direct_ttft() -> None:
    router = Router()
    deltas: Deltas[RouterSample] = Deltas()
    first, _ = router.page()
    deltas.step({"r": first})  # type: ignore[dict-item]
    router.route(Route.DIRECT, 100, 0.05)
    router.route(Route.DIRECT, 300, 0.07)
    router.route(Route.DISAGGREGATED, 8000, 0.6)
    router.route(Route.FALLBACK, 6000, 1.5)
    router.route(Route.LENT, 700, 0.1)
    sample, direct = router.page()
    change = deltas.step({"r": sample})  # type: ignore[dict-item]
    assert change == RouterSample(Counts((2, 1, 1, 1)), Counts((400, 8000, 6000, 700)))
    assert direct is not None and direct.count == 2  # only route="direct"


def test_the_router_s_largest_arrival_window_reaches_the_planner_s_observation() -> None:
    """The burst the planner holds for: the most prompt tokens that arrived in one of the router's windows
    over the interval, per pool, read from the router's page."""
    router = Router()
    deltas: Deltas[RouterSample] = Deltas()
    first, _ = router.page()
    deltas.step({"r": first})  # type: ignore[dict-item]
    for at, route, tokens, reason in (
        (0.5, Route.DISAGGREGATED, 8000, RouteReason.LONG),
        (1.0, Route.DIRECT, 6000, RouteReason.PREFILL_BUSY),  # prefill demand: the same window's burst
        (1.5, Route.DIRECT, 400, RouteReason.SHORT),
        (7.0, Route.DISAGGREGATED, 3000, RouteReason.LONG),
        (9.0, Route.DIRECT, 100, RouteReason.SHORT),
    ):
        router.now = at
        router.route(route, tokens, 0.1, reason)
    router.now = 15.0  # the scrape: windows [0, 2) .. [12, 14) ended, idle ones among them
    sample, _ = router.page()
    change = deltas.step({"r": sample})  # type: ignore[dict-item]
    assert change is not None and change.burst_tokens is not None
    prefill_burst, direct_burst = change.burst_tokens
    # 14,000 in one window, read as the top of its bucket (under 19% over); one 400 and one 100 direct
    assert prefill_burst is not None and 14_000 <= prefill_burst <= 14_000 * 2**0.25
    assert direct_burst is not None and 400 <= direct_burst <= 400 * 2**0.25
    obs = observation(15.0, 15.0, reading(None), reading(None), RouterReading(change, None), 10_000)
    assert obs.to_prefill is not None and obs.to_prefill.burst_prompt_tokens == prefill_burst
    assert obs.direct is not None and obs.direct.burst_prompt_tokens == direct_burst
    router.now = 17.0  # one idle window since
    idle = deltas.step({"r": router.page()[0]})  # type: ignore[dict-item]
    assert idle is not None and idle.burst_tokens == (0.0, 0.0)


def test_routers_that_share_the_arrivals_add_their_largest_windows() -> None:
    routers, deltas = (Router(), Router()), Deltas[RouterSample]()
    deltas.step({str(i): r.page()[0] for i, r in enumerate(routers)})  # type: ignore[misc]
    for router, tokens in zip(routers, (200, 100), strict=True):
        router.now = 1.0
        router.route(Route.DIRECT, tokens, 0.1, RouteReason.SHORT)
        router.now = 4.0
    change = deltas.step({str(i): r.page()[0] for i, r in enumerate(routers)})  # type: ignore[misc]
    assert change is not None and change.burst_tokens == (0.0, 300.0)  # no prefill arrivals: idle windows


def test_a_router_without_arrival_windows_gives_the_planner_no_burst() -> None:
    sample, _ = Router().page()
    assert sample is not None and sample.windows is not None
    bare = RouterSample(sample.requests, sample.prompt_tokens)
    change = bare.minus(bare)
    assert change.burst_tokens is None
    obs = observation(15.0, 15.0, reading(None), reading(None), RouterReading(change, None), 10_000)
    assert obs.to_prefill is not None and obs.to_prefill.burst_prompt_tokens is None


def reading(load: EngineSample | None, **fields: Any) -> RoleReading:
    defaults: dict[str, Any] = {"replicas": 2, "ready": 2, "latency_window": None, "percentile": 90}
    return RoleReading(load=load, **{**defaults, **fields})


ITL = Histogram((0.02, 0.04, 0.08, math.inf), (5, 80, 100, 100), 3.5)
TTFT = Histogram((0.5, 1.0, 2.0, math.inf), (50, 90, 100, 100), 60.0)


@pytest.mark.parametrize(
    ("case", "router", "prefill", "decode", "expected"),
    [
        (
            "router counts tokens by route; fallback counts for the prefill pool",
            RouterSample(Counts((10, 3, 1, 0)), Counts((2000, 24000, 9000, 0))),
            None,
            EngineSample(35000, 900, ITL),
            {"to_prefill": RouteLoad(4, 33000), "direct": RouteLoad(10, 2000), "generated": 900},
        ),
        (
            "the prefill engines' own token count over the router's estimate",
            RouterSample(Counts((10, 3, 1, 0)), Counts((2000, 30000, 9000, 0))),
            EngineSample(24000, 3, TTFT),
            EngineSample(35000, 900, ITL),
            {"to_prefill": RouteLoad(4, 33000), "direct": RouteLoad(10, 2000), "generated": 900},
        ),
        (
            "lent prompts are the decode pool's demand, prompt and output, and not the prefill engines' own",
            # 2 lent prompts of 1500 tokens generated 200 tokens on the prefill pods, beside 3 prefill legs
            RouterSample(Counts((10, 3, 1, 2)), Counts((2000, 30000, 9000, 3000))),
            EngineSample(27000, 203, TTFT),
            EngineSample(35000, 900, ITL),
            {"to_prefill": RouteLoad(4, 33000), "direct": RouteLoad(12, 5000), "generated": 1100},
        ),
        (
            "a prompt a peer decode pod prefilled is prefill demand the prefill engines did not count",
            # 3 disaggregated prompts, one of 6000 tokens prefilled on a peer decode pod (prefill_saturated)
            RouterSample(
                Counts((10, 3, 1, 0)), Counts((2000, 30000, 9000, 0)), bypassed=Counts((0, 1, 0, 6000))
            ),
            EngineSample(24000, 2, TTFT),
            EngineSample(41000, 900, ITL),
            {
                "to_prefill": RouteLoad(4, 39000),
                "direct": RouteLoad(10, 2000),
                "generated": 900,
                "bypassed": RouteLoad(1, 6000),
            },
        ),
        (
            "requests shed by overload are demand of the route they would have taken, which no engine saw",
            # 2 disaggregated prompts of 8000 tokens and 5 direct of 100 answered 429
            RouterSample(
                Counts((10, 3, 1, 0)),
                Counts((2000, 30000, 9000, 0)),
                shed=Counts((5, 2, 0, 0, 500, 16000, 0, 0)),
            ),
            EngineSample(24000, 3, TTFT),
            EngineSample(35000, 900, ITL),
            {"to_prefill": RouteLoad(6, 49000), "direct": RouteLoad(15, 2500), "generated": 900},
        ),
        (
            "an older router: tokens from the engines, fallback at the disaggregated mean",
            RouterSample(Counts((10, 3, 1, 0)), None),
            EngineSample(24000, 3, TTFT),
            EngineSample(36000, 900, ITL),
            {"to_prefill": RouteLoad(4, 32000), "direct": RouteLoad(10, 4000), "generated": 900},
        ),
        (
            "no router read twice yet: the load is unknown",
            None,
            EngineSample(24000, 3, TTFT),
            EngineSample(36000, 900, ITL),
            {"to_prefill": None, "direct": None, "generated": 900},
        ),
        (
            "no decode pod read twice: generated tokens unknown",
            RouterSample(Counts((0, 0, 0, 0)), Counts((0, 0, 0, 0))),
            None,
            None,
            {"to_prefill": RouteLoad(0, 0), "direct": RouteLoad(0, 0), "generated": None},
        ),
    ],
)
def test_observation_from_the_readings(
    case: str,
    router: RouterSample | None,
    prefill: EngineSample | None,
    decode: EngineSample | None,
    expected: dict[str, Any],
) -> None:
    obs = observation(
        100.0,
        15.0,
        reading(prefill, latency_window=TTFT),
        reading(decode, latency_window=ITL, ready=1),
        RouterReading(router, None),
        10_000,
    )
    assert (obs.to_prefill, obs.direct, obs.generated_tokens) == (
        expected["to_prefill"],
        expected["direct"],
        expected["generated"],
    ), case
    if "bypassed" in expected:
        assert obs.bypassed == expected["bypassed"], case
    assert (obs.now, obs.interval_seconds) == (100.0, 15.0)
    assert (obs.prefill.replicas, obs.prefill.ready, obs.decode.ready) == (2, 2, 1)


def test_observation_signals_percentiles_mean_itl_kv_and_context() -> None:
    gauges = (EngineGauges(4, 0, 0.5), EngineGauges(12, 1, 0.3))
    direct = Histogram((0.1, 0.2, math.inf), (0, 10, 10), 1.5)
    obs = observation(
        0.0,
        10.0,
        reading(None, latency_window=TTFT),
        reading(EngineSample(0, 100, ITL), latency_window=ITL, gauges=gauges, percentile=50),
        RouterReading(None, direct),
        10_000,
    )
    assert obs.prefill.observed_seconds == pytest.approx(TTFT.quantile(0.9))
    assert obs.decode.observed_seconds == pytest.approx(ITL.quantile(0.5))
    assert obs.decode.mean_itl_seconds == pytest.approx(3.5 / 100)
    assert obs.decode.direct_ttft_seconds == pytest.approx(direct.quantile(0.9))  # the TTFT percentile
    assert obs.decode.kv_usage == pytest.approx(0.4)
    # KV in use over running sequences: (0.5 + 0.3) x 10,000 tokens / 16 sequences
    assert obs.decode.mean_context_tokens == pytest.approx(500)
    idle = observation(0.0, 10.0, reading(None), reading(None), RouterReading(None, None), 10_000)
    assert (idle.decode.kv_usage, idle.decode.mean_context_tokens, idle.decode.mean_itl_seconds) == (
        None,
        None,
        None,
    )


def test_the_requests_tpot_reaches_the_planner_from_the_engines_page() -> None:
    """The fake engine's vllm:request_time_per_output_token_seconds, read off its page and differenced
    over the window, is the decode signal's percentile; a page without it leaves the gaps' (older
    engines)."""
    engine = Engine()
    page = parse_page(generate_latest(engine.metrics.registry).decode())
    before = read_histogram(page, TPOT_METRIC)
    assert before is not None and before.count == 0
    for tpot in [0.02] * 8 + [0.045, 0.06]:
        engine.metrics.tpot.observe(tpot)
    after = read_histogram(parse_page(generate_latest(engine.metrics.registry).decode()), TPOT_METRIC)
    assert after is not None
    window = after.minus(before)
    assert window.count == 10 and window.sum == pytest.approx(0.265)
    decode = reading(EngineSample(0, 100, ITL), latency_window=ITL, tpot_window=window)
    obs = observation(0.0, 10.0, reading(None), decode, RouterReading(None, None), 10_000)
    assert obs.decode.tpot_seconds == pytest.approx(window.quantile(0.9))
    assert obs.decode.tpot_seconds < obs.decode.observed_seconds  # type: ignore[operator]
    older = observation(
        0.0, 10.0, reading(None), reading(None, latency_window=ITL), RouterReading(None, None), 10
    )
    assert older.decode.tpot_seconds is None and older.decode.observed_seconds == pytest.approx(
        ITL.quantile(0.9)
    )


def spec(**pools: Any) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate({"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, **pools})


def scaling(target: dict[str, int], **fields: Any) -> dict[str, Any]:
    return {"minReplicas": 1, "maxReplicas": 6, "target": target, **fields}


def test_planner_settings_from_the_spec() -> None:
    both = spec(
        prefill={
            "autoscaling": scaling({"ttftMilliseconds": 800}, minReplicas=0, intervalSeconds=20),
            "gpusPerReplica": 2,
        },
        decode={"autoscaling": scaling({"itlMilliseconds": 40}, modelLoadSeconds=300, intervalSeconds=10)},
    )
    settings = planner_settings(both, {"prefill": 1, "decode": 2})
    assert settings is not None
    assert (settings.ttft_target_seconds, settings.itl_target_seconds) == (0.8, 0.04)
    assert (
        settings.prefill.min_replicas,
        settings.prefill.max_replicas,
        settings.prefill.gpus_per_replica,
    ) == (
        0,
        6,
        2,
    )
    assert (settings.model_load_seconds, settings.interval_seconds) == (300, 10)
    assert settings.scale_down_delay_seconds == settings.warmup_seconds == 300  # the spec's default
    # A role that does not autoscale is pinned where it is; a pool where none does has no settings.
    decode_only = spec(
        prefill={"autoscaling": scaling({"ttftMilliseconds": 800}, enabled=False)},
        decode={"autoscaling": scaling({"itlMilliseconds": 40})},
    )
    settings = planner_settings(decode_only, {"prefill": 3, "decode": 2})
    assert settings is not None and (settings.prefill.min_replicas, settings.prefill.max_replicas) == (3, 3)
    assert planner_settings(spec(decode={"replicas": 2}), {"prefill": 1, "decode": 2}) is None


def test_the_capacity_seed_follows_the_fake_engine_s_profile_time_scale_and_chunk() -> None:
    plain = capacity_seed(spec())
    assert plain == from_profile(get_profile("llama-3.1-8b-h100"))
    slowed = capacity_seed(
        spec(
            engine={
                "extraEnv": [
                    {"name": "FAKE_ENGINE_PROFILE", "value": "cpu-demo"},
                    {"name": "FAKE_ENGINE_TIME_SCALE", "value": "10"},
                ],
                "extraArgs": ["--max-num-batched-tokens", "1024"],
            }
        )
    )
    base = from_profile(get_profile("cpu-demo"), 1024)
    assert slowed.chunk_tokens == 1024
    assert slowed.chunk_seconds == pytest.approx(10 * base.chunk_seconds)
    assert slowed.decode_step(1024)[0] == pytest.approx(10 * base.decode_step(1024)[0])


def test_the_feed_drives_the_planner_prefill_back_from_zero_when_long_prompts_come() -> None:
    """End to end through the pure parts: a prefill pool at zero, the router's fallbacks (no prefill pod)
    carrying long prompts, and the plan asks for prefill again."""
    pool = spec(
        prefill={"replicas": 0, "autoscaling": scaling({"ttftMilliseconds": 800}, minReplicas=0)},
        # a tight ITL target: prefill work on the decode pods would cost more replicas than a prefill pool
        decode={"autoscaling": scaling({"itlMilliseconds": 12})},
    )
    settings = planner_settings(pool, {"prefill": 0, "decode": 2})
    assert settings is not None
    planner = Planner(settings, capacity_seed(pool))
    quiet = observation(
        0.0,
        15.0,
        reading(None, replicas=0, ready=0),
        reading(None),
        RouterReading(None, None),
        capacity_seed(pool).kv_capacity_tokens,
    )
    assert planner.decide(quiet).prefill.reason == MISSING_METRICS
    prompts = 24  # in 15 s, 16k tokens each
    busy = observation(
        15.0,
        15.0,
        reading(None, replicas=0, ready=0),
        reading(EngineSample(prompts * 16384, prompts * 100, ITL), gauges=(EngineGauges(8, 0, 0.4),) * 2),
        RouterReading(RouterSample(Counts((0, 0, prompts, 0)), Counts((0, 0, prompts * 16384, 0))), None),
        capacity_seed(pool).kv_capacity_tokens,
    )
    plan = planner.decide(busy)
    assert plan.prefill.current == 0 and plan.prefill.replicas >= 1
    assert plan.prefill.reason == PREFILL_BACK
    assert "TTFT" in plan.prefill.message and "forecast" in plan.prefill.message


def test_the_keda_example_follows_the_exported_recommendation_of_its_pool() -> None:
    path = Path(__file__).parents[2] / "examples" / "keda" / "decode-external.yaml"
    pool_document, scaled = list(yaml.safe_load_all(path.read_text()))
    pool_document["metadata"].update(namespace="default", uid="example")
    pool = InferencePool.model_validate(pool_document)
    decode = pool.spec.decode.autoscaling
    assert decode is not None and decode.mode == "External"
    assert scaled["spec"]["scaleTargetRef"]["name"] == engine_name(PoolRef.of(pool), "decode")
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (
        decode.min_replicas,
        decode.max_replicas,
    )
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert query.startswith(f"max({RECOMMENDED_REPLICAS}{{")
    assert f'pool="{pool.name()}"' in query and 'role="decode"' in query


def test_the_recommendation_is_a_metric_per_role_read_from_status() -> None:
    """Mode External: what an HPA or KEDA acts on (inferencepool_pool_recommended_replicas), beside the
    observed and target latency; the planner's reasons are bounded label values of the decision gauge."""
    registry = OperatorMetrics()
    status = {
        "decode": {
            "replicas": 2,
            "readyReplicas": 2,
            "desiredReplicas": 2,
            "observedMilliseconds": 55,
            "targetMilliseconds": 40,
            "recommendedReplicas": 3,
            "lastScaling": {"reason": "ForecastUp"},
        }
    }
    record_status(registry, "ns", "pool", status)
    text = generate_latest(registry.registry).decode()
    found = {
        (s.name, s.labels.get("reason")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("role") == "decode" and s.labels.get("reason") in (None, "ForecastUp")
    }
    assert found[(RECOMMENDED_REPLICAS, None)] == 3
    assert found[(OBSERVED_LATENCY, None)] == pytest.approx(0.055)
    assert found[(TARGET_LATENCY, None)] == pytest.approx(0.04)
    assert found[(SCALING_DECISION, "ForecastUp")] == 1
    del status["decode"]["recommendedReplicas"]
    record_status(registry, "ns", "pool", status)
    text = generate_latest(registry.registry).decode()
    assert not [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == RECOMMENDED_REPLICAS
    ]
    planner_reasons = {
        value for name, value in vars(planner_module).items() if name.isupper() and isinstance(value, str)
    }
    assert planner_reasons <= set(DECISION_REASONS)


def test_a_bound_across_both_pools_holding_a_role_below_its_need_is_scaling_limited() -> None:
    """The GPU budget cuts decode from 5 to 3: the role's plan says BudgetLimited and the pool's
    ScalingLimited condition is True with reason AtGpuBudget (AtRatioBound for the ratio) until it lifts."""
    import asyncio
    from typing import cast

    from tests.unit.builders_examples import load_pool

    from inferencepool.api.v1alpha1 import Autoscaling
    from inferencepool.autoscaler.planner import BUDGET_LIMITED, RATIO_BOUND, RolePlan
    from inferencepool.autoscaler.runner import PoolAutoscaler, _Role

    events: list[str] = []
    scaler = PoolAutoscaler(
        cast(Any, None), load_pool("demo-cpu.yaml"), cast(Any, None), lambda _r, _t, m, _s: events.append(m)
    )
    external = Autoscaling.model_validate(
        {"maxReplicas": 8, "target": {"itlMilliseconds": 40}, "mode": "External"}
    )

    def plan(reason: str, replicas: int, wanted: int) -> RolePlan:
        return RolePlan("decode", 3, 3, replicas, wanted, reason, f"3 -> {replicas} ({reason})", 2.0, 4.0,
                        0.8, 1.0, 1.0, 0.05, 0.04)  # fmt: skip

    state = scaler._roles.setdefault("decode", _Role())
    asyncio.run(scaler._act("decode", state, external, {}, plan(BUDGET_LIMITED, 3, 5)))
    limits = scaler.figures().limits
    assert limits is not None and (limits.limited, limits.reason) == (True, "AtGpuBudget")
    assert "decode: 3 -> 3 (BudgetLimited)" in limits.message
    asyncio.run(scaler._act("decode", state, external, {}, plan(RATIO_BOUND, 3, 4)))
    limits = scaler.figures().limits
    assert limits is not None and limits.reason == "AtRatioBound"
    asyncio.run(scaler._act("decode", state, external, {}, plan("Steady", 3, 3)))
    limits = scaler.figures().limits
    assert limits is not None and not limits.limited
