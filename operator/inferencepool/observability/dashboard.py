"""The Grafana dashboard for one pool, built in code: the one source the chart's JSON is generated from.

The dashboard is a list of `Row`s, each a list of `Panel`s, so a new concern (diagnosis, autoscaling) adds a
row or a panel here and nothing else. Every query is filtered by the template variables `$namespace` and
`$pool`; `$percentile` picks the quantile the latency panels read. Metric names are those the router
(inferencepool.router.metrics), the engines (vLLM's names, as the fake engine exports them) and the operator
(inferencepool.observability.metrics) expose; the labels `namespace`, `pool` and (engines) `role` come from
the scrape relabelling in `inferencepool.observability.scrape`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from inferencepool.observability import metrics as op

UID: Final = "inferencepool-pool"
TITLE: Final = "InferencePool"
POOL: Final = 'namespace="$namespace", pool="$pool"'
RATE: Final = "$__rate_interval"
ROUTER: Final = "inferencepool_router"
PERCENTILES: Final = ("0.5", "0.9", "0.95", "0.99")
DATASOURCE: Final = {"type": "prometheus", "uid": "${datasource}"}


def sel(*extra: str) -> str:
    """The label selector of this pool, with extra matchers."""
    return "{" + ", ".join((POOL, *extra)) + "}"


def role(name: str) -> str:
    return f'role="{name}"'


def quantile(histogram: str, *matchers: str, by: str = "") -> str:
    grouping = ", ".join(filter(None, ("le", by)))
    return (
        f"histogram_quantile($percentile, sum by ({grouping}) "
        f"(rate({histogram}_bucket{sel(*matchers)}[{RATE}])))"
    )


def rate(counter: str, *matchers: str, by: str) -> str:
    return f"sum by ({by}) (rate({counter}_total{sel(*matchers)}[{RATE}]))"


def hit_ratio(hits: str, queries: str) -> str:
    return f"{rate(hits, by='role')} / {rate(queries, by='role')}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | heatmap | state-timeline
    stacked: bool = False
    width: int = 12
    height: int = 8


@dataclass(frozen=True)
class Row:
    title: str
    description: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Annotation:
    name: str
    expr: str
    title: str
    text: str


ROWS: Final = (
    Row(
        "Latency against target",
        "Does each phase meet its target? Prefill is judged on TTFT, decode on ITL.",
        (
            Panel(
                "Prefill: TTFT against target",
                "Time to first token at the chosen percentile. Router-side: what clients see, by route. "
                "Engine-side: the engines' own histogram (prefill engines serve the prefill leg of "
                "disaggregated requests, decode engines prefill direct ones). The autoscaler scales prefill "
                "on "
                "its reading of the prefill engines over its window, against the target.",
                (
                    Query(
                        quantile(f"{ROUTER}_time_to_first_token_seconds", by="route"),
                        "router-side, {{route}}",
                    ),
                    Query(
                        quantile("vllm:time_to_first_token_seconds", role("prefill")), "engine-side, prefill"
                    ),
                    Query(
                        quantile("vllm:time_to_first_token_seconds", role("decode")), "engine-side, decode"
                    ),
                    Query(f"max({op.OBSERVED_LATENCY}{sel(role('prefill'))})", "autoscaler's reading"),
                    Query(f"max({op.TARGET_LATENCY}{sel(role('prefill'))})", "target"),
                ),
                unit="s",
            ),
            Panel(
                "Decode: ITL against target",
                "Inter-token latency at the chosen percentile. Router-side: the gap between streamed chunks "
                "clients see, by route. Engine-side: the decode engines' own histogram, which the autoscaler "
                "scales decode on.",
                (
                    Query(
                        quantile(f"{ROUTER}_inter_token_latency_seconds", by="route"),
                        "router-side, {{route}}",
                    ),
                    Query(
                        quantile("vllm:inter_token_latency_seconds", role("decode")), "engine-side, decode"
                    ),
                    Query(f"max({op.OBSERVED_LATENCY}{sel(role('decode'))})", "autoscaler's reading"),
                    Query(f"max({op.TARGET_LATENCY}{sel(role('decode'))})", "target"),
                ),
                unit="s",
            ),
        ),
    ),
    Row(
        "Bottleneck",
        "Which phase limits the pool, as the operator diagnoses it every round from the metrics it reads "
        "(status.bottleneck; `inferencepool diagnose POOL` prints the evidence and the what-if).",
        (
            Panel(
                "Limiting phase",
                "The diagnosis over the autoscaler's window: Prefill (first token slow, streaming fast), "
                "Decode (streaming slow), Interference (fine at p50, p99 falls apart as prefills land in "
                "decode batches), KVTransfer (disaggregated requests wait on the hand-over), None (every "
                "target met), Unknown (too little traffic to judge). kubectl describe pdpool shows the "
                "Bottleneck condition with the first advice.",
                (Query(f"max by (phase) ({op.BOTTLENECK}{sel()}) == 1", "{{phase}}"),),
                kind="state-timeline",
            ),
            Panel(
                "Prefill threshold: in force and recommended",
                "The threshold the routers hold, and the one the diagnosis computes from the measured prompt "
                "lengths and both pools' headroom (absent while it recommends no change).",
                (
                    Query(f"max({ROUTER}_prefill_threshold_tokens{sel()})", "in force"),
                    Query(f"max({op.RECOMMENDED_THRESHOLD}{sel()})", "recommended"),
                ),
            ),
        ),
    ),
    Row(
        "Scaling",
        "How many engines each phase has, wants and has ready, and why the autoscaler decided what it did.",
        (
            Panel(
                "Replicas",
                "Engine pods per role: existing, desired (spec or autoscaler) and ready. Desired above ready "
                "for minutes is a model still loading or a pod the scheduler cannot place.",
                (
                    Query(f"max by (role) ({op.REPLICAS}{sel()})", "{{role}} pods"),
                    Query(f"max by (role) ({op.DESIRED_REPLICAS}{sel()})", "{{role}} desired"),
                    Query(f"max by (role) ({op.READY_REPLICAS}{sel()})", "{{role}} ready"),
                ),
            ),
            Panel(
                "Autoscaler's last decision",
                "The reason of each role's last scaling decision (e.g. ForecastUp, ForecastDown, "
                "LatencyGuard, ScaleDownDelay, ScalingLimited); kubectl describe pdpool "
                "has the figures behind it.",
                (
                    Query(
                        f"max by (role, reason) ({op.SCALING_DECISION}{sel()}) == 1", "{{role}}: {{reason}}"
                    ),
                ),
                kind="state-timeline",
            ),
            Panel(
                "ScalingLimited and Degraded",
                "1 while the autoscaler wants more replicas than maxReplicas or the scheduler can give "
                "(ScalingLimited: the target is at risk), or while the pool is Degraded (kubectl describe "
                "pdpool names the cause).",
                (
                    Query(f"max by (role) ({op.SCALING_LIMITED}{sel()})", "ScalingLimited, {{role}}"),
                    Query(f"max({op.DEGRADED}{sel()})", "Degraded"),
                ),
                kind="stat",
            ),
            Panel(
                "Engine pods the routers see",
                "Engine pods by role and state as the routers discovered them (serving, not_ready, "
                "terminating).",
                (Query(f"max by (role, state) ({ROUTER}_pods{sel()})", "{{role}} {{state}}"),),
            ),
        ),
    ),
    Row(
        "Routing",
        "Where requests go: straight to decode, through prefill, or served colocated as a fallback.",
        (
            Panel(
                "Routing split",
                "Requests per second by route: direct (a decode pod prefills itself), disaggregated "
                "(prefill, "
                "KV transfer, decode) and fallback (meant for prefill, served colocated).",
                (Query(rate(f"{ROUTER}_requests", by="route"), "{{route}}"),),
                unit="reqps",
                stacked=True,
            ),
            Panel(
                "Why requests were or were not disaggregated",
                "The router's route decisions per second by reason: policy (Colocated or "
                "AlwaysDisaggregate decided alone), short (fewer prompt tokens than the threshold), cached "
                "(long, but the chosen decode pod holds enough of its prefix), long (enough uncached tokens "
                "to pay for the transfer), prefill_busy (the prefill queue would miss the TTFT target, the "
                "decode pod not), decode_busy and prefill_idle (a medium prompt spared a busy decode pod), "
                "decode_saturated (role lending: served whole on a prefill pod while every decode pod "
                "queued), prefill_saturated (role lending: prefilled on an idle decode pod for a busy one "
                "while every prefill pod queued), no_prefill_pod.",
                (Query(rate(f"{ROUTER}_disaggregation_decisions", by="reason"), "{{reason}}"),),
                unit="reqps",
                stacked=True,
            ),
            Panel(
                "Fallbacks by reason",
                "Requests meant for the prefill pool but served colocated: no_prefill_pod (none ready), "
                "prefill_failed (the prefill leg failed), kv_push_timeout (LMCache PD: no push "
                "notification).",
                (Query(rate(f"{ROUTER}_fallbacks", by="reason"), "{{reason}}"),),
                unit="reqps",
                stacked=True,
            ),
            Panel(
                "Requests shed (429)",
                "Requests per second the router answered 429 with Retry-After (router.overload), by the "
                "pool whose queue refused them (decode, or prefill for requests going through the prefill "
                "pool) and priority (X-Inferencepool-Priority): the pool ran all its engines run without "
                "queueing and its bounded queue in the router was full, or they waited there past "
                "maxQueueMilliseconds. Lowest priorities go first.",
                (
                    Query(
                        rate(f"{ROUTER}_shed_requests", by="role, priority"),
                        "{{role}} priority {{priority}}",
                    ),
                ),
                unit="reqps",
                stacked=True,
            ),
            Panel(
                "Prefill threshold in force",
                "Prompts of at least this many tokens go through the prefill pool (LengthAware); it moves "
                "when "
                "the adaptive threshold is on.",
                (Query(f"max({ROUTER}_prefill_threshold_tokens{sel()})", "threshold"),),
            ),
            Panel(
                "Prompt length distribution",
                "Prompt tokens as the router counted them, per bucket; compare with the threshold.",
                (Query(f"sum by (le) (increase({ROUTER}_prompt_tokens_bucket{sel()}[{RATE}]))", "{{le}}"),),
                kind="heatmap",
            ),
            Panel(
                "Router errors",
                "Failed calls to engine pods by role and kind (connect, status, timeout, protocol), and "
                "requests "
                "the router answered itself with an error, by status.",
                (
                    Query(rate(f"{ROUTER}_upstream_errors", by="role, kind"), "{{role}} {{kind}}"),
                    Query(rate(f"{ROUTER}_rejected_requests", by="status"), "rejected {{status}}"),
                ),
                unit="reqps",
            ),
        ),
    ),
    Row(
        "Engines",
        "Load and cache state of the engines, by role.",
        (
            Panel(
                "Queue depth",
                "Requests waiting for a batch slot (vllm:num_requests_waiting). A growing queue comes before "
                "a missed latency target.",
                (Query(f"sum by (role) (vllm:num_requests_waiting{sel()})", "{{role}}"),),
                width=8,
            ),
            Panel(
                "Running batch",
                "Requests in the engines' running batches (vllm:num_requests_running).",
                (Query(f"sum by (role) (vllm:num_requests_running{sel()})", "{{role}}"),),
                width=8,
            ),
            Panel(
                "KV-cache usage",
                "GPU KV-cache blocks in use, busiest pod per role (vllm:kv_cache_usage_perc). Near 100% "
                "means "
                "preemptions and queueing.",
                (Query(f"max by (role) (vllm:kv_cache_usage_perc{sel()})", "{{role}}"),),
                unit="percentunit",
                width=8,
            ),
            Panel(
                "Prefix-cache hit rate",
                "Share of prompt tokens found in the engine's own GPU prefix cache.",
                (Query(hit_ratio("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"), "{{role}}"),),
                unit="percentunit",
            ),
            Panel(
                "LMCache hit rate",
                "Share of the prompt tokens LMCache was asked for (beyond the GPU prefix cache) that it "
                "supplied from CPU offload, disk or a peer engine (lmcache:num_hit_tokens over "
                "lmcache:num_requested_tokens). vLLM's vllm:external_prefix_cache_* would also count the "
                "tokens a decode pod loads over NIXL.",
                (
                    Query(
                        hit_ratio("lmcache:num_hit_tokens", "lmcache:num_requested_tokens"),
                        "{{role}}",
                    ),
                ),
                unit="percentunit",
            ),
        ),
    ),
    Row(
        "KV transfer",
        "The prefill -> decode hand-over: how long it takes and whether it fails.",
        (
            Panel(
                "KV transfer time",
                "NIXL transfer duration at the chosen percentile as the decode engines report it "
                "(vllm:nixl_xfer_time_seconds), and the router's prefill leg (prefill request to its "
                "answer).",
                (
                    Query(quantile("vllm:nixl_xfer_time_seconds", by="role"), "NIXL transfer, {{role}}"),
                    Query(quantile(f"{ROUTER}_prefill_leg_seconds"), "prefill leg, router-side"),
                ),
                unit="s",
            ),
            Panel(
                "KV transfer failures",
                "Failed NIXL transfers per second (vllm:nixl_num_failed_transfers), and requests that fell "
                "back because the prefill leg or the KV push failed.",
                (
                    Query(rate("vllm:nixl_num_failed_transfers", by="role"), "NIXL failed, {{role}}"),
                    Query(
                        rate(f"{ROUTER}_fallbacks", 'reason=~"prefill_failed|kv_push_timeout"', by="reason"),
                        "fallback, {{reason}}",
                    ),
                ),
                unit="reqps",
            ),
        ),
    ),
)

ANNOTATIONS: Final = (
    Annotation(
        "Scaling decisions",
        f"changes(max by (role) ({op.DESIRED_REPLICAS}{sel()})[2m:]) > 0",
        "{{role}} scaled",
        "desired replicas of {{role}} changed",
    ),
)


def panels() -> Iterator[Panel]:
    for row in ROWS:
        yield from row.panels


def queries() -> Iterator[tuple[Panel, Query]]:
    for panel in panels():
        for query in panel.queries:
            yield panel, query


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = [
        {
            "refId": chr(ord("A") + index),
            "datasource": DATASOURCE,
            "expr": query.expr,
            "legendFormat": query.legend,
            **({"format": "heatmap"} if panel.kind == "heatmap" else {}),
        }
        for index, query in enumerate(panel.queries)
    ]
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.kind == "timeseries":
        defaults["custom"] = {"stacking": {"mode": "normal" if panel.stacked else "none"}}
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}}
        if panel.kind == "timeseries"
        else {},
        "targets": targets,
    }


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "includeAll": False,
        "multi": False,
    }


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    body: list[dict[str, Any]] = []
    panel_id, y = 1, 0
    for row in ROWS:
        body.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "description": row.description,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id, y, x, line_height = panel_id + 1, y + 1, 0, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y, line_height = 0, y + line_height, 0
            body.append(_panel_json(panel, panel_id, x, y))
            panel_id, x, line_height = panel_id + 1, x + panel.width, max(line_height, panel.height)
        y += line_height
    return {
        "uid": UID,
        "title": TITLE,
        "description": "One InferencePool: latency against target per phase, the bottleneck, scaling, "
        "routing, engines, KV transfer.",
        "tags": ["inferencepool", "vllm", "llm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _variable("namespace", "Namespace", f"label_values({ROUTER}_requests_total, namespace)"),
                _variable(
                    "pool", "Pool", f'label_values({ROUTER}_requests_total{{namespace="$namespace"}}, pool)'
                ),
                {
                    "name": "percentile",
                    "label": "Percentile",
                    "type": "custom",
                    "query": ",".join(PERCENTILES),
                    "current": {"text": "0.9", "value": "0.9"},
                    "options": [{"text": p, "value": p, "selected": p == "0.9"} for p in PERCENTILES],
                },
            ]
        },
        "annotations": {
            "list": [
                {
                    "name": annotation.name,
                    "datasource": DATASOURCE,
                    "enable": True,
                    "expr": annotation.expr,
                    "titleFormat": annotation.title,
                    "textFormat": annotation.text,
                    "iconColor": "orange",
                    "step": "30s",
                }
                for annotation in ANNOTATIONS
            ]
        },
        "panels": body,
    }


def dashboard_json() -> str:
    """The chart's file: stable key order and indentation, so a drift test can compare bytes."""
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"
