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

from inferencepool.api import labels
from inferencepool.observability import metrics as op

ROUTER: Final = "inferencepool_router"
GROUP: Final = "inferencepool"
# The short name: unambiguous beside the Gateway API Inference Extension's InferencePool (its own: infpool).
RUNBOOK_HINT: Final = (
    f"kubectl describe {labels.SHORT_NAME} -n {{{{ $labels.namespace }}}} {{{{ $labels.pool }}}}"
)
# Router metrics the alerts below read that the router does not export yet: agreed names, for the router to
# export exactly (a test fails once one is exported, so that it leaves this list).
PENDING_ROUTER_METRICS: Final[frozenset[str]] = frozenset()


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
    kv_expiry_minutes: int | str = 10
    stale_peer_minutes: int | str = 2
    unresponsive_minutes: int | str = 2
    shed_percent: int | str = 1
    shed_minutes: int | str = 10
    rollout_stalled_minutes: int | str = 30

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
        "the dashboard's Scaling row shows why the autoscaler has not caught up (pods still loading the "
        "model: the Progressing condition, WaitingForReplicas). " + RUNBOOK_HINT,
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
        "InferencePoolKVLeaseExpiries",
        "sum by (namespace, pool) (increase(vllm:nixl_num_kv_expired_reqs_total[10m])) > 0",
        "kv_expiry_minutes",
        "warning",
        "{{ $labels.namespace }}/{{ $labels.pool }}: prefill pods hold KV that no decode pod reads",
        "Prefill engines have freed KV blocks only when their lease ran out ({{ $value | humanize }} "
        "requests in 10 minutes), for ${kv_expiry_minutes} minutes: the decode leg never came (a client "
        "that went away, a decode pod that failed or hung, a router that lost the pair). Those blocks were "
        "unusable for the lease's length. Check the router's client disconnects and the decode pods' health.",
    ),
    Alert(
        "InferencePoolStalePeers",
        f"sum by (namespace, pool, role) (increase({ROUTER}_stale_peer_failures_total[1m])) > 0",
        "stale_peer_minutes",
        "warning",
        "{{ $labels.namespace }}/{{ $labels.pool }}: requests fail against restarted {{ $labels.role }} pods",
        "Requests have failed against restarted {{ $labels.role }} pods (same name and IP, a new engine) in "
        "every minute for ${stale_peer_minutes} minutes. A restart with hand-offs in flight costs a few "
        "once (the router serves them elsewhere); failures that go on mean a decode engine kept the previous "
        "engine's NIXL handshake or KV state. Restarting the decode pods clears it; report it with the "
        "router's log.",
    ),
    Alert(
        "InferencePoolEngineUnresponsive",
        f'max by (namespace, pool, role) ({ROUTER}_pods{{state="unresponsive"}}) > 0',
        "unresponsive_minutes",
        "warning",
        "{{ $labels.namespace }}/{{ $labels.pool }}: {{ $value }} {{ $labels.role }} engine pods hang",
        "The router took {{ $value }} {{ $labels.role }} pods out of its table for ${unresponsive_minutes} "
        "minutes because they answer neither requests nor /metrics (a hung engine, a stopped process, a "
        "saturated node). The pool serves on the others; the liveness probe restarts a pod whose /health "
        "fails. Look at the pods' logs and node. " + RUNBOOK_HINT,
    ),
    Alert(
        "InferencePoolShedding",
        f"100 * sum by (namespace, pool) (rate({ROUTER}_shed_requests_total[5m]))\n"
        f"  / on (namespace, pool)\n"
        f"sum by (namespace, pool) (rate({ROUTER}_requests_total[5m]))\n"
        "  > ${shed_percent}",
        "shed_minutes",
        "warning",
        "{{ $labels.namespace }}/{{ $labels.pool }}: {{ $value | humanize }}% of requests shed (429)",
        "The router answered more than ${shed_percent}% of requests with 429 for ${shed_minutes} minutes: "
        "a pool runs all its engines take without queueing and its queue in the router is full "
        "(inferencepool_router_shed_requests_total by role says which pool). Raise its maxReplicas or the "
        "GPU budget (InferencePoolScalingLimited says which), or send less load. " + RUNBOOK_HINT,
    ),
    Alert(
        "InferencePoolRolloutStalled",
        f"max by (namespace, pool) ({op.ROLLOUT_IN_PROGRESS}) == 1\n"
        f"  and on (namespace, pool)\n"
        f"time() - max by (namespace, pool) ({op.ROLLOUT_LAST_PROGRESS}) > 60",
        "rollout_stalled_minutes",
        "warning",
        "{{ $labels.namespace }}/{{ $labels.pool }}: the rollout to a new revision stopped progressing",
        "No engine pod has moved to the new KV-compatibility revision for ${rollout_stalled_minutes} minutes "
        "(status.rollout says how far each pool got). A new pod that never becomes Ready holds the rollout: "
        "look at the newest pods' events and logs (image, model revision that does not exist, GPUs). Old "
        "pods keep serving meanwhile. " + RUNBOOK_HINT,
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
