"""The operator's metrics module: what a scrape shows after each call, and that labels stay bounded."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferencepool.autoscaler import planner
from inferencepool.observability import metrics
from inferencepool.observability.metrics import OperatorMetrics


def samples(m: OperatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(m: OperatorMetrics, name: str, **labels: str) -> float | None:
    return samples(m).get((name, tuple(sorted(labels.items()))))


def record(m: OperatorMetrics, **overrides: object) -> None:
    figures: dict[str, object] = {
        "observed_ms": 950,
        "target_ms": 800,
        "current": 2,
        "desired": 3,
        "ready": 1,
        "decision_reason": "ForecastUp",
        "scaling_limited": True,
        "degraded": False,
    }
    figures.update(overrides)
    m.record_pool("default", "demo", "prefill", **figures)  # type: ignore[arg-type]


def test_record_pool_exports_every_figure_in_base_units() -> None:
    m = OperatorMetrics()
    record(m)
    pool = {"namespace": "default", "pool": "demo", "role": "prefill"}
    assert value(m, metrics.OBSERVED_LATENCY, **pool) == pytest.approx(0.95)
    assert value(m, metrics.TARGET_LATENCY, **pool) == pytest.approx(0.8)
    assert value(m, metrics.REPLICAS, **pool) == 2
    assert value(m, metrics.DESIRED_REPLICAS, **pool) == 3
    assert value(m, metrics.READY_REPLICAS, **pool) == 1
    assert value(m, metrics.SCALING_LIMITED, **pool) == 1
    assert value(m, metrics.DEGRADED, namespace="default", pool="demo") == 0
    # One-hot over the fixed reason set.
    assert value(m, metrics.SCALING_DECISION, **pool, reason="ForecastUp") == 1
    others = [r for r in metrics.DECISION_REASONS if r != "ForecastUp"]
    assert all(value(m, metrics.SCALING_DECISION, **pool, reason=r) == 0 for r in others)


def test_unknown_figures_remove_their_series_instead_of_keeping_a_stale_one() -> None:
    m = OperatorMetrics()
    record(m)
    record(m, observed_ms=None, target_ms=None, decision_reason=None, scaling_limited=False)
    pool = {"namespace": "default", "pool": "demo", "role": "prefill"}
    assert value(m, metrics.OBSERVED_LATENCY, **pool) is None
    assert value(m, metrics.TARGET_LATENCY, **pool) is None
    assert not [k for k in samples(m) if k[0] == metrics.SCALING_DECISION]
    assert value(m, metrics.SCALING_LIMITED, **pool) == 0


def test_decision_reasons_are_the_planner_s_and_a_bounded_set() -> None:
    reasons = {
        getattr(planner, name)
        for name in dir(planner)
        if name.isupper() and isinstance(getattr(planner, name), str) and getattr(planner, name).isalpha()
    }
    assert reasons == set(metrics.DECISION_REASONS) - {"Other"}
    m = OperatorMetrics()
    record(m, decision_reason="SomethingNew")
    series = {dict(k[1])["reason"] for k in samples(m) if k[0] == metrics.SCALING_DECISION}
    assert series == set(metrics.DECISION_REASONS)
    assert (
        value(m, metrics.SCALING_DECISION, namespace="default", pool="demo", role="prefill", reason="Other")
        == 1
    )


def test_role_must_be_an_engine_role() -> None:
    with pytest.raises(ValueError, match="role must be one of"):
        OperatorMetrics().record_pool(
            "default", "demo", "router", observed_ms=None, target_ms=None, current=1, desired=1, ready=1,
            decision_reason=None, scaling_limited=False, degraded=False,
        )  # fmt: skip


def test_reconcile_counts_results_and_times_every_run() -> None:
    m = OperatorMetrics()
    with m.reconcile("default", "demo"):
        pass
    with pytest.raises(RuntimeError), m.reconcile("default", "demo"):
        raise RuntimeError("apply failed")
    total = f"{metrics.RECONCILES}_total"
    assert value(m, total, namespace="default", pool="demo", result="ok") == 1
    assert value(m, total, namespace="default", pool="demo", result="error") == 1
    assert value(m, f"{metrics.RECONCILE_DURATION}_count") == 2


def test_forget_pool_drops_every_series_of_that_pool_only() -> None:
    m = OperatorMetrics()
    record(m)
    m.record_pool(
        "default", "other", "decode", observed_ms=30, target_ms=40, current=1, desired=1, ready=1,
        decision_reason="Steady", scaling_limited=False, degraded=True,
    )  # fmt: skip
    with m.reconcile("default", "demo"):
        pass
    m.forget_pool("default", "demo")
    pools = {dict(labels).get("pool") for _, labels in samples(m)}
    assert pools == {None, "other"}  # None: the unlabelled reconcile histogram


def test_record_status_reads_the_status_document_the_operator_writes() -> None:
    from tests.unit import recorded_pools

    m = OperatorMetrics()
    limited = recorded_pools.limited()["status"]
    limited["decode"]["lastScaling"] = {
        "fromReplicas": 1, "replicas": 2, "reason": "ForecastUp", "time": "2026-12-01T10:00:00Z",
    }  # fmt: skip
    for condition in limited["conditions"]:
        if condition["type"] == "ScalingLimited":
            condition["message"] = "decode: wants 5 replicas, maxReplicas is 4"
    metrics.record_status(m, "default", "demo", limited)
    decode = {"namespace": "default", "pool": "demo", "role": "decode"}
    assert value(m, metrics.READY_REPLICAS, **decode) == 2
    assert value(m, metrics.DESIRED_REPLICAS, **decode) == 2
    assert value(m, metrics.SCALING_LIMITED, **decode) == 1
    assert value(m, metrics.SCALING_LIMITED, namespace="default", pool="demo", role="prefill") == 0
    assert value(m, metrics.SCALING_DECISION, **decode, reason="ForecastUp") == 1
    assert value(m, metrics.DEGRADED, namespace="default", pool="demo") == 0
    metrics.record_status(m, "default", "demo", recorded_pools.degraded()["status"])
    assert value(m, metrics.DEGRADED, namespace="default", pool="demo") == 1
    assert value(m, metrics.READY_REPLICAS, **decode) == 0


def test_record_status_of_an_invalid_spec_reports_degraded() -> None:
    m = OperatorMetrics()
    status = {
        "observedGeneration": 1,
        "conditions": [{"type": "Degraded", "status": "True", "reason": "InvalidSpec"}],
    }
    metrics.record_status(m, "default", "bad", status)
    assert value(m, metrics.DEGRADED, namespace="default", pool="bad") == 1


def test_the_bottleneck_is_one_hot_over_its_phases_with_the_recommended_threshold() -> None:
    m = OperatorMetrics()
    pool = {"namespace": "default", "pool": "demo"}
    bottleneck = {"phase": "Prefill", "reason": "PrefillBound", "recommendedThresholdTokens": 6144}
    metrics.record_status(m, "default", "demo", {"bottleneck": bottleneck})
    assert value(m, metrics.BOTTLENECK, **pool, phase="Prefill") == 1
    others = [p for p in metrics.BOTTLENECK_PHASES if p != "Prefill"]
    assert all(value(m, metrics.BOTTLENECK, **pool, phase=p) == 0 for p in others)
    assert value(m, metrics.RECOMMENDED_THRESHOLD, **pool) == 6144
    metrics.record_status(m, "default", "demo", {"bottleneck": {"phase": "Decode", "reason": "DecodeBound"}})
    assert value(m, metrics.BOTTLENECK, **pool, phase="Decode") == 1
    assert value(m, metrics.BOTTLENECK, **pool, phase="Prefill") == 0
    assert value(m, metrics.RECOMMENDED_THRESHOLD, **pool) is None  # no recommendation: no stale figure
    metrics.record_status(m, "default", "demo", {"bottleneck": {"phase": "Sideways", "reason": "New"}})
    assert value(m, metrics.BOTTLENECK, **pool, phase="Unknown") == 1  # a phase outside the set: bounded
    metrics.record_status(m, "default", "demo", {})  # not diagnosed (yet): no series
    assert not [key for key in samples(m) if key[0] == metrics.BOTTLENECK]
    metrics.record_status(m, "default", "demo", {"bottleneck": bottleneck})
    m.forget_pool("default", "demo")
    assert not [key for key in samples(m) if key[0] in (metrics.BOTTLENECK, metrics.RECOMMENDED_THRESHOLD)]
