"""The operator's Prometheus metrics (prometheus-client), on their own registry so tests can run several.

Per pool and role: the observed latency at the target percentile and the target itself (prefill: TTFT, decode:
ITL), current/desired/ready replicas, the autoscaler's recommended replicas (what an HPA or KEDA acts on in
autoscaling mode External), the autoscaler's last decision as a one-hot gauge over a fixed set of
reasons, and ScalingLimited/Degraded as 0/1 gauges. Per pool: the diagnosed bottleneck (status.bottleneck) as
a one-hot gauge over its phases and the prefill threshold it recommends; reconciles by result; for the
operator: reconcile duration. Labels are namespace, pool, role, reason and phase only (never request ids or
prompts), and a deleted pool's series are removed with `forget_pool`, so cardinality is bounded by the pools
that exist.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX: Final = "inferencepool"
ROLES: Final = ("prefill", "decode")
# The autoscaler's decision reasons (inferencepool.autoscaler.planner); anything else is
# reported as Other, so a new reason can never add unbounded series.
DECISION_REASONS: Final = (
    "ForecastUp",
    "ForecastDown",
    "LatencyGuard",
    "PrefillToZero",
    "PrefillBack",
    "RatioBound",
    "BudgetLimited",
    "ScalingLimited",
    "ScaleDownDelay",
    "Steady",
    "MissingMetrics",
    "Other",
)
# status.bottleneck.phase (inferencepool.bottleneck); anything else is reported as Unknown.
BOTTLENECK_PHASES: Final = ("Prefill", "Decode", "Interference", "KVTransfer", "None", "Unknown")
RESULTS: Final = ("ok", "error")
RECONCILE_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# Metric names (without the _total suffix prometheus-client adds to counters), for dashboards and alerts.
OBSERVED_LATENCY: Final = f"{PREFIX}_pool_observed_latency_seconds"
TARGET_LATENCY: Final = f"{PREFIX}_pool_target_latency_seconds"
REPLICAS: Final = f"{PREFIX}_pool_replicas"
DESIRED_REPLICAS: Final = f"{PREFIX}_pool_desired_replicas"
RECOMMENDED_REPLICAS: Final = f"{PREFIX}_pool_recommended_replicas"
READY_REPLICAS: Final = f"{PREFIX}_pool_ready_replicas"
SCALING_DECISION: Final = f"{PREFIX}_pool_scaling_decision"
SCALING_LIMITED: Final = f"{PREFIX}_pool_scaling_limited"
DEGRADED: Final = f"{PREFIX}_pool_degraded"
BOTTLENECK: Final = f"{PREFIX}_pool_bottleneck"
RECOMMENDED_THRESHOLD: Final = f"{PREFIX}_pool_recommended_threshold_tokens"
ROLLOUT_IN_PROGRESS: Final = f"{PREFIX}_pool_rollout_in_progress"
ROLLOUT_UPDATED_REPLICAS: Final = f"{PREFIX}_pool_rollout_updated_replicas"
ROLLOUT_LAST_PROGRESS: Final = f"{PREFIX}_pool_rollout_last_progress_timestamp_seconds"
RECONCILES: Final = f"{PREFIX}_operator_reconciles"
RECONCILE_DURATION: Final = f"{PREFIX}_operator_reconcile_duration_seconds"

POOL_LABELS: Final = ("namespace", "pool")
ROLE_LABELS: Final = ("namespace", "pool", "role")


def decision_label(reason: str | None) -> str | None:
    """The bounded label value for an autoscaler reason (None: no decision yet)."""
    if reason is None:
        return None
    return reason if reason in DECISION_REASONS else "Other"


class OperatorMetrics:
    """The operator's metrics; the operator keeps one and calls these methods, a scrape reads `registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.observed = Gauge(
            OBSERVED_LATENCY,
            "Latency at the target percentile over the autoscaler's window (prefill: TTFT, decode: ITL)",
            ROLE_LABELS,
            registry=r,
        )
        self.target = Gauge(
            TARGET_LATENCY, "The pool's latency target (prefill: TTFT, decode: ITL)", ROLE_LABELS, registry=r
        )
        self.replicas = Gauge(REPLICAS, "Engine pods that exist", ROLE_LABELS, registry=r)
        self.desired = Gauge(
            DESIRED_REPLICAS, "Engine pods wanted, by the spec or the autoscaler", ROLE_LABELS, registry=r
        )
        self.ready = Gauge(READY_REPLICAS, "Engine pods that are ready", ROLE_LABELS, registry=r)
        self.recommended = Gauge(
            RECOMMENDED_REPLICAS,
            "Replicas the operator's autoscaler recommends (written in mode Operator; for an HPA or KEDA to "
            "act on in mode External)",
            ROLE_LABELS,
            registry=r,
        )
        self.decision = Gauge(
            SCALING_DECISION,
            "The autoscaler's last decision: 1 for its reason, 0 for the others",
            (*ROLE_LABELS, "reason"),
            registry=r,
        )
        self.limited = Gauge(
            SCALING_LIMITED,
            "1 while the autoscaler wants more replicas than it may have (condition ScalingLimited)",
            ROLE_LABELS,
            registry=r,
        )
        self.degraded = Gauge(
            DEGRADED, "1 while the pool's Degraded condition is True", POOL_LABELS, registry=r
        )
        self.bottleneck = Gauge(
            BOTTLENECK,
            "The phase that limits the pool over the last window (status.bottleneck.phase): 1 for it, 0 for "
            "the others",
            (*POOL_LABELS, "phase"),
            registry=r,
        )
        self.recommended_threshold = Gauge(
            RECOMMENDED_THRESHOLD,
            "The prefill threshold the diagnosis recommends (status.bottleneck.recommendedThresholdTokens)",
            POOL_LABELS,
            registry=r,
        )
        self.rollout = Gauge(
            ROLLOUT_IN_PROGRESS,
            "1 while a coordinated rollout of both engine pools to a new KV-compatibility revision runs",
            POOL_LABELS,
            registry=r,
        )
        self.rollout_updated = Gauge(
            ROLLOUT_UPDATED_REPLICAS,
            "Engine pods at the revision being rolled out (status.rollout.<role>.updatedReplicas)",
            ROLE_LABELS,
            registry=r,
        )
        self.rollout_progress = Gauge(
            ROLLOUT_LAST_PROGRESS,
            "When the rollout last moved a pod to its revision, or began (status.rollout.lastProgressTime)",
            POOL_LABELS,
            registry=r,
        )
        self.reconciles = Counter(
            RECONCILES, "Reconciles of a pool, by result", (*POOL_LABELS, "result"), registry=r
        )
        self.reconcile_duration = Histogram(
            RECONCILE_DURATION, "Duration of one reconcile of a pool", buckets=RECONCILE_BUCKETS, registry=r
        )

    def record_pool(
        self,
        namespace: str,
        pool: str,
        role: str,
        *,
        observed_ms: int | None,
        target_ms: int | None,
        current: int,
        desired: int,
        ready: int,
        decision_reason: str | None,
        scaling_limited: bool,
        degraded: bool,
        recommended: int | None = None,
    ) -> None:
        """What one role of one pool looks like now. None: not measured yet / no target / no decision (the
        series is removed, so a dashboard shows a gap rather than a stale figure)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        labels = (namespace, pool, role)
        for gauge, milliseconds in ((self.observed, observed_ms), (self.target, target_ms)):
            if milliseconds is None:
                gauge.remove(*labels)
            else:
                gauge.labels(*labels).set(milliseconds / 1000)
        self.replicas.labels(*labels).set(current)
        self.desired.labels(*labels).set(desired)
        self.ready.labels(*labels).set(ready)
        if recommended is None:
            self.recommended.remove(*labels)
        else:
            self.recommended.labels(*labels).set(recommended)
        chosen = decision_label(decision_reason)
        for reason in DECISION_REASONS:
            if chosen is None:
                self.decision.remove(*labels, reason)
            else:
                self.decision.labels(*labels, reason).set(1 if reason == chosen else 0)
        self.limited.labels(*labels).set(1 if scaling_limited else 0)
        self.degraded.labels(namespace, pool).set(1 if degraded else 0)

    def record_bottleneck(
        self, namespace: str, pool: str, phase: str | None, recommended_threshold_tokens: int | None
    ) -> None:
        """The pool's diagnosed bottleneck (None: not diagnosed yet, the series are removed)."""
        chosen = None if phase is None else phase if phase in BOTTLENECK_PHASES else "Unknown"
        for candidate in BOTTLENECK_PHASES:
            if chosen is None:
                self.bottleneck.remove(namespace, pool, candidate)
            else:
                self.bottleneck.labels(namespace, pool, candidate).set(1 if candidate == chosen else 0)
        if recommended_threshold_tokens is None:
            self.recommended_threshold.remove(namespace, pool)
        else:
            self.recommended_threshold.labels(namespace, pool).set(recommended_threshold_tokens)

    @contextmanager
    def reconcile(self, namespace: str, pool: str) -> Iterator[None]:
        """Count and time one reconcile; an exception counts as an error and propagates."""
        started = time.perf_counter()
        result = "error"
        try:
            yield
            result = "ok"
        finally:
            self.reconcile_duration.observe(time.perf_counter() - started)
            self.reconciles.labels(namespace, pool, result).inc()

    def forget_pool(self, namespace: str, pool: str) -> None:
        """Drop every series of a deleted pool."""
        for metric in (
            self.observed, self.target, self.replicas, self.desired, self.ready, self.recommended,
            self.decision, self.limited, self.degraded, self.bottleneck, self.recommended_threshold,
            self.reconciles, self.rollout, self.rollout_updated, self.rollout_progress,
        ):  # fmt: skip
            metric.remove_by_labels({"namespace": namespace, "pool": pool})


def record_status(metrics: OperatorMetrics, namespace: str, pool: str, status: Mapping[str, Any]) -> None:
    """Record a pool's status document (as the operator writes it) into `metrics`: per role the figures of
    status.prefill / status.decode, the reason of the last scaling decision, the ScalingLimited and
    Degraded conditions, and status.bottleneck."""
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}

    def true(kind: str) -> bool:
        return bool((conditions.get(kind) or {}).get("status") == "True")

    # ScalingLimited is one condition per pool; its message names the roles ("prefill: ...; decode: ...").
    limited_message = str((conditions.get("ScalingLimited") or {}).get("message", ""))
    named = {part.split(":", 1)[0].strip() for part in limited_message.split(";")} & set(ROLES)

    def limited(role: str) -> bool:
        return true("ScalingLimited") and (role in named or not named)

    metrics.degraded.labels(namespace, pool).set(1 if true("Degraded") else 0)
    record_rollout(metrics, namespace, pool, status.get("rollout"))
    bottleneck = status.get("bottleneck")
    if isinstance(bottleneck, Mapping):
        threshold = bottleneck.get("recommendedThresholdTokens")
        metrics.record_bottleneck(
            namespace, pool, str(bottleneck.get("phase")), int(threshold) if threshold is not None else None
        )
    else:
        metrics.record_bottleneck(namespace, pool, None, None)
    for role in ROLES:
        figures = status.get(role)
        if not isinstance(figures, Mapping):
            continue  # e.g. a spec the models refuse: its status is only Degraded
        last = figures.get("lastScaling")
        metrics.record_pool(
            namespace,
            pool,
            role,
            observed_ms=figures.get("observedMilliseconds"),
            target_ms=figures.get("targetMilliseconds"),
            current=int(figures.get("replicas", 0)),
            desired=int(figures.get("desiredReplicas", 0)),
            ready=int(figures.get("readyReplicas", 0)),
            decision_reason=last.get("reason") if isinstance(last, Mapping) else None,
            scaling_limited=limited(role),
            degraded=true("Degraded"),
            recommended=figures.get("recommendedReplicas"),
        )


def record_rollout(metrics: OperatorMetrics, namespace: str, pool: str, rollout: Any) -> None:
    """status.rollout: in progress or not, pods moved per role, and when it last moved (series removed when
    none runs, so an alert on a stalled rollout cannot fire on a stale figure)."""
    if not isinstance(rollout, Mapping):
        metrics.rollout.labels(namespace, pool).set(0)
        metrics.rollout_progress.remove_by_labels({"namespace": namespace, "pool": pool})
        metrics.rollout_updated.remove_by_labels({"namespace": namespace, "pool": pool})
        return
    metrics.rollout.labels(namespace, pool).set(1)
    for role in ROLES:
        figures = rollout.get(role)
        if isinstance(figures, Mapping):
            metrics.rollout_updated.labels(namespace, pool, role).set(int(figures.get("updatedReplicas", 0)))
    progressed = rollout.get("lastProgressTime")
    if isinstance(progressed, str):
        moment = datetime.strptime(progressed, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        metrics.rollout_progress.labels(namespace, pool).set(moment.timestamp())
