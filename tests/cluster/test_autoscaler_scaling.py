"""The autoscaler on the real control plane: fake engine pods (run by the pod runner) under load, scaled by
the planner from their own metrics pages up to maxReplicas and back, with the decision in status, events,
the ScalingLimited condition and `kubectl get`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from tests.cluster.kube_helpers import (
    background_load,
    event_reasons,
    example,
    get_pool,
    kubectl_ok,
    ready_urls,
)
from tests.support.cluster import eventually

from inferencepool.api import labels
from inferencepool.controller.context import OperatorContext
from inferencepool.kube import Kube
from inferencepool.kube.fields import replicas_managers

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster


POOL = "scaling"


@pytest.fixture
def load(admin_kube: Kube, namespace: str) -> Iterator[threading.Event]:
    """Streams completions to the ready decode pods from 4 threads while the event is set."""
    body = {"model": "llama-8b", "prompt": "tell me more", "max_tokens": 24, "stream": True}
    with background_load(
        lambda: ready_urls(admin_kube, namespace, POOL, "decode"), lambda: body, 4, 10
    ) as on:
        yield on


def decode_status(kube: Kube, namespace: str) -> dict[str, Any]:
    pool = get_pool(kube, namespace, POOL) or {}
    return dict(pool.get("status", {}).get("decode") or {})


def scaling_limited(kube: Kube, namespace: str) -> dict[str, Any] | None:
    pool = get_pool(kube, namespace, POOL) or {}
    conditions = pool.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "ScalingLimited"), None)


def test_decode_pool_scales_on_its_load_up_to_max_then_back_down(
    cluster: TestCluster, operator: OperatorContext, admin_kube: Kube, namespace: str, load: threading.Event
) -> None:
    document = example("demo-cpu.yaml")
    document["metadata"] = {"name": POOL, "namespace": namespace}
    spec = document["spec"]
    spec["prefill"].pop("autoscaling")
    spec["decode"]["replicas"] = 1
    spec["decode"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 2,
        # Far below what the fake H100 profile does (~10 ms between tokens): a replica has no room under the
        # target (the planner's capacity floor), so any load wants more replicas than maxReplicas allows.
        "target": {"itlMilliseconds": 1, "percentile": 90},
        "windowSeconds": 4,
        "intervalSeconds": 1,
        "modelLoadSeconds": 2,
        "scaleDownStabilizationSeconds": 3,
    }
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(document))
    eventually(lambda: ready_urls(admin_kube, namespace, POOL, "decode"), 90, "a ready decode pod")

    load.set()
    statefulset = eventually(
        lambda: (
            (s := admin_kube.get("apps/v1", "StatefulSet", namespace, f"{POOL}-decode"))
            and s["spec"]["replicas"] == 2
            and s
        ),
        60,
        "the decode StatefulSet scaled to 2",
    )
    assert replicas_managers(statefulset) == {labels.AUTOSCALER_FIELD_MANAGER}
    figures = eventually(
        lambda: (d := decode_status(admin_kube, namespace)).get("lastScaling") and d,
        30,
        "lastScaling in status",
    )
    last = figures["lastScaling"]
    assert (last["fromReplicas"], last["replicas"]) == (1, 2), last
    # sized from the load (ForecastUp; ScalingLimited when it wanted more than maxReplicas at once), or the
    # latency guard (over target with every replica up); the figures behind it in status
    assert last["reason"] in ("ForecastUp", "ScalingLimited", "LatencyGuard"), last
    assert last["wantedReplicas"] >= 2 and "vs target 1ms" in last["message"], last
    assert figures["observedMilliseconds"] >= 2
    eventually(lambda: "ScaledUp" in event_reasons(admin_kube, namespace, POOL), 15, "a ScaledUp event")

    # Both pods ready and still far too slow: it wants more than maxReplicas allows, and says so.
    limited = eventually(
        lambda: (c := scaling_limited(admin_kube, namespace)) and c["status"] == "True" and c,
        60,
        "ScalingLimited=True",
    )
    assert limited["reason"] == "AtMaxReplicas" and "decode" in limited["message"]
    # `kubectl get pdpool`: DECODE 2/2 once the new pod is ready, ITL observed/target.
    columns = eventually(
        lambda: (
            (line := kubectl_ok(cluster, "-n", namespace, "get", "pdpool", POOL, "--no-headers").split())[3]
            == "2/2"
            and line[5].endswith("/1ms")
            and not line[5].startswith("-")
            and line
        ),
        60,
        "DECODE 2/2 and ITL observed/target in kubectl get",
    )
    assert int(columns[5].split("/")[0]) >= 2

    # No traffic: back to minReplicas once the forecast has fallen (the last minute's mean and the 5-minute
    # trend: a pool shrinks no faster than its load has; up to ~140 s after a minute of load here).
    load.clear()
    eventually(
        lambda: decode_status(admin_kube, namespace).get("lastScaling", {}).get("reason") == "ForecastDown",
        240,
        "a ForecastDown scale-down",
    )
    assert admin_kube.get("apps/v1", "StatefulSet", namespace, f"{POOL}-decode")["spec"]["replicas"] == 1
    eventually(
        lambda: (c := scaling_limited(admin_kube, namespace)) and c["status"] == "False",
        30,
        "ScalingLimited=False",
    )


def test_pods_the_scheduler_cannot_place_are_reported_as_scaling_limited(
    cluster: TestCluster, operator: OperatorContext, admin_kube: Kube, namespace: str
) -> None:
    document = example("demo-cpu.yaml")
    document["metadata"] = {"name": POOL, "namespace": namespace}
    spec = document["spec"]
    spec["prefill"].pop("autoscaling")
    # More CPU than any node has: the scheduler leaves the pod Pending, as it would with no free GPU.
    spec["decode"]["resources"] = {"requests": {"cpu": "5000"}}
    spec["decode"]["replicas"] = 1  # one pod, so the message names exactly it
    spec["decode"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "target": {"itlMilliseconds": 40},
        "intervalSeconds": 1,
    }
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(document))
    limited = eventually(
        lambda: (c := scaling_limited(admin_kube, namespace)) and c["status"] == "True" and c,
        60,
        "ScalingLimited=True for an unschedulable pod",
    )
    assert limited["reason"] == "PodsUnschedulable"
    assert f"decode: 1 pod(s) cannot be scheduled ({POOL}-decode-0)" in limited["message"]
    assert "Insufficient cpu" in limited["message"]
    eventually(
        lambda: "Insufficient cpu" in event_reasons(admin_kube, namespace, POOL).get("ScalingLimited", ""),
        15,
        "a ScalingLimited event with the scheduler's words",
    )
