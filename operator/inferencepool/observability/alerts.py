"""Alert rules a person can act on, as Prometheus rule groups (the one source of the chart's PrometheusRule).

Thresholds are parameters (`${name}` in expressions and texts): `rule_groups(Thresholds())` gives plain
rules (promtool, tests, people without the Prometheus Operator); the chart's template is rendered from the
same rules with Helm expressions in their place (inferencepool.observability.chart), so the chart's values
tune them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from string import Template
from typing import Any, Final

from inferencepool.observability import metrics as op

ROUTER: Final = "inferencepool_router"
GROUP: Final = "inferencepool"
RUNBOOK_HINT: Final = "kubectl describe pdpool -n {{ $labels.namespace }} {{ $labels.pool }}"


@dataclass(frozen=True)
class Thresholds:
    """Alert thresholds; the chart's values under monitoring.alerts, in camelCase."""

    latency_missed_minutes: int | str = 10
    scaling_limited_minutes: int | str = 15
    fallback_percent: int | str = 5
    fallback_minutes: int | str = 10
    kv_transfer_failure_minutes: int | str = 5
    not_ready_minutes: int | str = 15
    degraded_minutes: int | str = 5

    def values(self) -> dict[str, str]:
        return {key: str(value) for key, value in asdict(self).items()}


def threshold_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Thresholds))


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str  # a string.Template over Thresholds' fields
    for_minutes: str  # the Thresholds field that says how long
    severity: str
    summary: str
    description: str


ALERTS: Final = (
    Alert(
        "InferencePoolLatencyTargetMissed",
        f"max by (namespace, pool, role) ({op.OBSERVED_LATENCY})\n"
        f"  > on (namespace, pool, role)\n"
        f"max by (namespace, pool, role) ({op.TARGET_LATENCY})",
        "latency_missed_minutes",
        "warning",
        "{{ $labels.namespace }}/{{ $labels.pool }}: {{ $labels.role }} latency above its target",
        "The {{ $labels.role }} pool has been above its latency target (prefill: TTFT, decode: ITL) for "
        "${latency_missed_minutes} minutes; observed {{ $value | humanizeDuration }} at the target "
        "percentile. If InferencePoolScalingLimited fires too, raise maxReplicas or add GPU nodes; otherwise "
        "the dashboard's Scaling row shows why the autoscaler has not caught up (WaitingForReplicas: pods "
        "still loading the model). " + RUNBOOK_HINT,
    ),
    Alert(
        "InferencePoolScalingLimited",
        f"max by (namespace, pool, role) ({op.SCALING_LIMITED}) == 1",
        "scaling_limited_minutes",
        "warning",
        "{{ $labels.namespace }}/{{ $labels.pool }}: {{ $labels.role }} cannot scale as far as it needs",
        "The autoscaler has wanted more {{ $labels.role }} replicas than it may have for "
        "${scaling_limited_minutes} minutes (condition ScalingLimited: AtMaxReplicas, or PodsUnschedulable "
        "with the scheduler's reason), so the latency target is at risk. Raise maxReplicas or add capacity. "
        + RUNBOOK_HINT,
    ),
    Alert(
        "InferencePoolFallbackRateHigh",
        f"100 * sum by (namespace, pool, reason) (rate({ROUTER}_fallbacks_total[5m]))\n"
        f"  / on (namespace, pool) group_left\n"
        f'sum by (namespace, pool) (rate({ROUTER}_requests_total{{route=~"disaggregated|fallback"}}[5m]))\n'
        "  > ${fallback_percent}",
        "fallback_minutes",
        "warning",
        "{{ $labels.namespace }}/{{ $labels.pool }}: {{ $value | humanize }}% of prefill-bound requests fall "
        "back ({{ $labels.reason }})",
        "More than ${fallback_percent}% of the requests meant for the prefill pool were served colocated on "
        "a decode pod, for ${fallback_minutes} minutes, with reason {{ $labels.reason }}: no_prefill_pod (no "
        "ready prefill pod: check the prefill pool's pods), prefill_failed (prefill engines erroring: their "
        "logs), kv_push_timeout (LMCache PD pushes not reported: the network between prefill and decode).",
    ),
    Alert(
        "InferencePoolKVTransferFailures",
        "sum by (namespace, pool, role) (increase(vllm:nixl_num_failed_transfers_total[5m])) > 0",
        "kv_transfer_failure_minutes",
        "warning",
        "{{ $labels.namespace }}/{{ $labels.pool }}: KV transfers from prefill to decode fail",
        "{{ $labels.role }} engines report failed NIXL KV transfers ({{ $value | humanize }} in 5 minutes), "
        "for ${kv_transfer_failure_minutes} minutes. Those requests fail or are prefilled again on decode. "
        "Check the network (UCX transport, RDMA) between prefill and decode nodes and the engines' logs.",
    ),
    Alert(
        "InferencePoolEnginesNotReady",
        f"max by (namespace, pool, role) ({op.DESIRED_REPLICAS})\n"
        f"  - on (namespace, pool, role)\n"
        f"max by (namespace, pool, role) ({op.READY_REPLICAS}) > 0",
        "not_ready_minutes",
        "warning",
        "{{ $labels.namespace }}/{{ $labels.pool }}: {{ $value }} {{ $labels.role }} engine pods not ready",
        "{{ $value }} {{ $labels.role }} engine pods have been wanted but not ready for "
        "${not_ready_minutes} minutes, longer than a model load should take. Look at the pods' events "
        "(image pull, scheduling, GPU) and logs (model download, out of memory). " + RUNBOOK_HINT,
    ),
    Alert(
        "InferencePoolDegraded",
        f"max by (namespace, pool) ({op.DEGRADED}) == 1",
        "degraded_minutes",
        "critical",
        "{{ $labels.namespace }}/{{ $labels.pool }} is Degraded",
        "The pool's Degraded condition has been True for ${degraded_minutes} minutes: something only you "
        "can fix (a missing Secret or PVC, a child the API server refused). The condition's message names "
        "it: " + RUNBOOK_HINT,
    ),
)


def _fill(text: str, values: Mapping[str, str]) -> str:
    # Only ${name} is ours: Prometheus' own templates ({{ $labels.pool }}, {{ $value }}) stay as they are.
    filled = Template(text).safe_substitute(values)
    if "${" in filled:
        raise KeyError(f"unknown threshold in {text!r}")
    return filled


def rule_groups(thresholds: Thresholds | Mapping[str, str]) -> dict[str, Any]:
    """The rules file: {groups: [...]}, as `promtool check rules` and PrometheusRule's spec take it."""
    values = thresholds.values() if isinstance(thresholds, Thresholds) else dict(thresholds)
    rules = [
        {
            "alert": alert.name,
            "expr": _fill(alert.expr, values),
            "for": f"{values[alert.for_minutes]}m",
            "labels": {"severity": alert.severity},
            "annotations": {
                "summary": _fill(alert.summary, values),
                "description": _fill(alert.description, values),
            },
        }
        for alert in ALERTS
    ]
    return {"groups": [{"name": GROUP, "rules": rules}]}
