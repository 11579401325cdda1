"""The dashboard's queries and the alert rules on live data, in a real Prometheus server.

Two pools of fake engines behind real routers, and the operator's metrics module serving what the operator
would record: `demo` is healthy; `broken` has a prefill pod that refuses connections (so long prompts fall
back), gets requests for an unknown model, and the operator reports it slow, limited, degraded and short of
ready pods. Prometheus scrapes them with the scrape configs the chart's PodMonitors stand for (the same
relabelling, from inferencepool.observability), so a wrong metric name, label or relabelling leaves a panel
empty or an alert silent, and the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client import start_http_server
from tests.http.prometheus_harness import Prometheus, check_dashboard, free_port, running_prometheus
from tests.http.router_harness import (
    LONG_PROMPT,
    MODEL,
    SHORT_PROMPT,
    RunningRouter,
    config_for,
    running_router,
)
from tests.support.engines import running_engine

from inferencepool.engine_sim.core import LmcacheSettings
from inferencepool.observability import alerts, dashboard, scrape
from inferencepool.observability.metrics import OperatorMetrics, record_rollout

pytestmark = pytest.mark.asyncio(loop_scope="module")

NAMESPACE = "default"
OPERATOR_NAMESPACE = "inferencepool-system"
STAGED = {
    ("InferencePoolLatencyTargetMissed", "prefill"),
    ("InferencePoolScalingLimited", "prefill"),
    ("InferencePoolEnginesNotReady", "prefill"),
    ("InferencePoolDegraded", None),
    ("InferencePoolFallbackRateHigh", None),
    ("InferencePoolRolloutStalled", None),
    ("InferencePoolStalePeers", "prefill"),
}


@dataclass
class Stack:
    prometheus: Prometheus
    operator: OperatorMetrics


def meta(pool: str, role: str, pod: str, namespace: str = NAMESPACE) -> dict[str, str]:
    """The labels Kubernetes service discovery would give the pod (what relabelling reads)."""
    return {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_container_name": role,
        scrape.pod_label_meta("serving.inferencepool.dev/pool"): pool,
        scrape.pod_label_meta("serving.inferencepool.dev/role"): role,
    }


def target(url: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"targets": [url.removeprefix("http://")], "labels": labels}


def record(operator: OperatorMetrics, pool: str, role: str, **figures: Any) -> None:
    defaults: dict[str, Any] = {
        "observed_ms": 300 if role == "prefill" else 20,
        "target_ms": 800 if role == "prefill" else 40,
        "current": 1,
        "desired": 1,
        "ready": 1,
        "decision_reason": "Steady",
        "scaling_limited": False,
        "degraded": False,
    }
    operator.record_pool(NAMESPACE, pool, role, **(defaults | figures))


async def traffic(url: str, stop: asyncio.Event, bad_every: int = 0) -> None:
    """Short prompts (direct) and long ones (through prefill), streamed so ITL is observed, until stopped;
    every `bad_every`th request names a model the pool does not serve (the router rejects it)."""
    async with aiohttp.ClientSession() as session:
        n = 0
        while not stop.is_set():
            n += 1
            prompt = SHORT_PROMPT if n % 2 else LONG_PROMPT + str(n % 3)
            model = "not-served" if bad_every and n % bad_every == 0 else MODEL
            body = {"model": model, "prompt": prompt, "max_tokens": 6, "stream": True}
            with contextlib.suppress(aiohttp.ClientError):
                async with session.post(url + "/v1/completions", json=body) as response:
                    await response.read()
            await asyncio.sleep(0.05)


async def stale_peers(router: RunningRouter, stop: asyncio.Event) -> None:
    """Staged: decode legs keep failing against a restarted prefill pod's engines (a decode engine that kept
    the previous engine's NIXL state), counted where the router counts them."""
    while not stop.is_set():
        router.router.metrics.stale_peer_failures.labels("prefill").inc()
        await asyncio.sleep(0.5)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    lmcache = LmcacheSettings(cpu_capacity_chunks=64)
    operator = OperatorMetrics()
    record(operator, "demo", "prefill")
    record(operator, "demo", "decode")
    record(
        operator, "broken", "prefill", observed_ms=1500, current=2, desired=2, ready=1,
        decision_reason="ForecastUp", scaling_limited=True, degraded=True,
    )  # fmt: skip
    record(operator, "broken", "decode", degraded=True)
    operator.record_bottleneck(NAMESPACE, "demo", "None", None)
    operator.record_bottleneck(NAMESPACE, "broken", "Prefill", 2048)
    # a revision rollout that last moved a pod long ago; demo's finished
    stalled = {
        "toRevision": "abc",
        "prefill": {"updatedReplicas": 1},
        "lastProgressTime": "2026-01-01T00:00:00Z",
    }
    record_rollout(operator, NAMESPACE, "broken", stalled)
    record_rollout(operator, NAMESPACE, "demo", None)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=operator.registry)
    operator_url = f"127.0.0.1:{server.server_port}"
    stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        engines = {
            (pool, role): await stack.enter_async_context(
                running_engine("zero", MODEL, nixl=True, role=role, lmcache=lmcache)
            )
            for pool, role in (("demo", "prefill"), ("demo", "decode"), ("broken", "decode"))
        }
        demo = await stack.enter_async_context(
            running_router(
                config_for(
                    [engines["demo", "prefill"]], [engines["demo", "decode"]], prefillThresholdTokens=64
                )
            )
        )
        dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: every prefill leg fails to connect
        broken_config = config_for([], [engines["broken", "decode"]], prefillThresholdTokens=64)
        broken_config = broken_config.model_copy(
            update={"static": broken_config.static.model_copy(update={"prefill": [dead]})}  # type: ignore[union-attr]
        )
        broken = await stack.enter_async_context(running_router(broken_config))
        engine_targets = [
            target(engine.url, meta(pool, role, f"{pool}-{role}-0"))
            for (pool, role), engine in engines.items()
        ]
        router_targets = [
            target(router.url, meta(pool, "router", f"{pool}-router-7d9f"))
            for pool, router in (("demo", demo), ("broken", broken))
        ]
        operator_target = target(operator_url, meta("", "operator", "operator-0", OPERATOR_NAMESPACE))
        configs = [
            scrape.scrape_config(scrape.ENGINES, "engines", "1s", static_targets=engine_targets),
            scrape.scrape_config(scrape.ROUTERS, "routers", "1s", static_targets=router_targets),
            scrape.scrape_config(scrape.OPERATOR, "operator", "1s", static_targets=[operator_target]),
        ]
        staged = {name: "0" for name in alerts.threshold_names()} | {"fallback_percent": "5"}
        workdir = tmp_path_factory.mktemp("prometheus")
        prometheus = await stack.enter_async_context(
            running_prometheus(workdir, configs, alerts.rule_groups(staged))
        )
        loads = [
            asyncio.create_task(traffic(demo.url, stop)),
            asyncio.create_task(traffic(broken.url, stop, 7)),
            asyncio.create_task(stale_peers(broken, stop)),
        ]
        try:
            yield Stack(prometheus, operator)
        finally:
            stop.set()
            await asyncio.gather(*loads)
            server.shutdown()
            thread.join(5)


async def test_every_target_is_scraped(stack: Stack) -> None:
    for _ in range(30):
        targets = await stack.prometheus.targets()
        if len(targets) == 6 and all(t["health"] == "up" for t in targets):
            break
        await asyncio.sleep(1)
    assert len(targets) == 6 and all(t["health"] == "up" for t in targets), targets


async def test_operator_series_keep_the_pools_namespace(stack: Stack) -> None:
    # honorLabels: the operator pod's own namespace must not replace the pool's.
    (series,) = await stack.prometheus.wait_for('inferencepool_pool_degraded{pool="broken"}')
    assert series["metric"]["namespace"] == NAMESPACE
    assert "exported_namespace" not in series["metric"]


async def test_engine_series_carry_pool_and_role_from_pod_labels(stack: Stack) -> None:
    series = await stack.prometheus.wait_for("vllm:num_requests_running")
    assert {(s["metric"]["pool"], s["metric"]["role"]) for s in series} == {
        ("demo", "prefill"), ("demo", "decode"), ("broken", "decode"),
    }  # fmt: skip
    # Routers keep their own `role` label (the engine role), not the router pod's.
    pods = await stack.prometheus.wait_for('inferencepool_router_pods{pool="demo"}')
    assert {s["metric"]["role"] for s in pods} == {"prefill", "decode"}


async def test_nixl_reads_are_recorded_by_the_decode_engine_that_reads(stack: Stack) -> None:
    series = await stack.prometheus.wait_for("vllm:nixl_bytes_transferred_count > 0")
    assert {(s["metric"]["pool"], s["metric"]["role"]) for s in series} == {("demo", "decode")}
    (failed,) = await stack.prometheus.wait_for(
        'vllm:nixl_num_failed_transfers_total{pool="demo", role="decode"}'
    )
    assert float(failed["value"][1]) == 0.0
    # Every engine with a NIXL connector exports the counters, the prefill side's expiry count included.
    expired = await stack.prometheus.wait_for("vllm:nixl_num_kv_expired_reqs_total")
    assert len(expired) == 3


async def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    # A scaling decision inside the annotation's window.
    await asyncio.sleep(3)
    record(
        stack.operator, "broken", "prefill", observed_ms=1500, current=2, desired=3, ready=1,
        decision_reason="ForecastUp", scaling_limited=True, degraded=True,
    )  # fmt: skip
    problems = await check_dashboard(stack.prometheus, NAMESPACE, ["demo", "broken"], set())
    assert not problems, "\n".join(problems)


async def test_staged_alerts_fire_for_the_broken_pool_only(stack: Stack) -> None:
    firing: set[tuple[str, str | None]] = set()
    for _ in range(60):
        active = [a for a in await stack.prometheus.alerts() if a["state"] == "firing"]
        assert not [a for a in active if a["labels"].get("pool") != "broken"], active
        firing = {(a["labels"]["alertname"], a["labels"].get("role")) for a in active}
        if firing >= STAGED:
            break
        await asyncio.sleep(1)
    assert firing >= STAGED, f"not firing: {STAGED - firing}"
    fallback = [
        a
        for a in await stack.prometheus.alerts()
        if a["labels"]["alertname"] == "InferencePoolFallbackRateHigh"
    ]
    assert {a["labels"]["reason"] for a in fallback} == {"prefill_failed"}
    assert all("broken" in a["annotations"]["summary"] for a in fallback)
    # Not staged (no decode engine reads from the broken pool's unreachable prefill pod): must not fire.
    assert ("InferencePoolKVTransferFailures", "decode") not in firing


@pytest.mark.parametrize(
    ("wrong", "expr", "legend"),
    [
        (
            "metric name",
            'sum by (role) (vllm:num_request_waiting{namespace="$namespace", pool="$pool"})',
            "{{role}}",
        ),
        (
            "label value",
            'sum by (role) (vllm:num_requests_waiting{namespace="$namespace", pool="$pool", role="prefil"})',
            "",
        ),
        (
            "label name",
            'sum by (phase) (vllm:num_requests_waiting{namespace="$namespace", pool="$pool"})',
            "{{phase}}",
        ),
        ("legend label", 'sum(vllm:num_requests_waiting{namespace="$namespace", pool="$pool"})', "{{role}}"),
    ],
)
async def test_the_check_catches_a_wrong_query(stack: Stack, wrong: str, expr: str, legend: str) -> None:
    """The dashboard check is not vacuous: a misspelt metric, a wrong label value, a grouping by a label the
    series lack or a legend naming a summed-away label is reported."""
    panel = dashboard.Panel("broken panel", "", (dashboard.Query(expr, legend),))
    only = [(panel, panel.queries[0])]
    problems = await check_dashboard(
        stack.prometheus, NAMESPACE, ["demo", "broken"], set(), timeout=3, queries=only, annotations=()
    )
    assert problems, f"a wrong {wrong} went unnoticed"
