"""The prefill pool at zero on the real control plane: idle, the planner removes it (the router serves
colocated, counting fallbacks with reason no_prefill_pod); long prompts bring it back. The API server
refuses a decode minReplicas of 0, the removed Latency rule's fields, and planner bounds (spec.scaling) that
cannot hold."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from tests.cluster.kube_helpers import (
    example,
    kubectl_ok,
)
from tests.cluster.test_autoscaler_planner_load import (
    POOL,
    TIME_SCALE,
    ready_urls,
    role_status,
)
from tests.support.cluster import eventually

from inferencepool.controller.context import OperatorContext
from inferencepool.kube import Kube

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster


def zero_prefill_pool(namespace: str) -> dict[str, Any]:
    document = example("demo-cpu.yaml")
    document["metadata"] = {"name": POOL, "namespace": namespace}
    spec = document["spec"]
    spec["engine"]["extraEnv"].append({"name": "FAKE_ENGINE_TIME_SCALE", "value": TIME_SCALE})
    common = {
        "intervalSeconds": 4,
        "windowSeconds": 20,
        "modelLoadSeconds": 5,
        "scaleDownStabilizationSeconds": 0,
    }
    spec["prefill"]["replicas"] = 1
    spec["prefill"]["autoscaling"] = {
        "minReplicas": 0,
        "maxReplicas": 3,
        "target": {"ttftMilliseconds": 6000},
        **common,
    }
    spec["decode"]["replicas"] = 1
    spec["decode"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 4,
        # a decode step is ~70 ms at this time scale: little room for prefill work on the decode pods, so a
        # prefill pool pays once long prompts come
        "target": {"itlMilliseconds": 100},
        **common,
    }
    return document


def router_metric(kube: Kube, namespace: str, name: str, **wanted: str) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for url in ready_urls(kube, namespace, "router"):
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items()):
                    total += sample.value
    return total


def test_an_idle_prefill_pool_goes_to_zero_and_long_prompts_bring_it_back(
    cluster: TestCluster,
    operator: OperatorContext,
    admin_kube: Kube,
    namespace: str,
    long_prompts: threading.Event,
) -> None:
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(zero_prefill_pool(namespace)))
    eventually(lambda: ready_urls(admin_kube, namespace, "router"), 90, "a ready router")

    def prefill_replicas() -> int:
        workload = admin_kube.get("apps/v1", "StatefulSet", namespace, f"{POOL}-prefill") or {}
        return int(workload.get("spec", {}).get("replicas", -1))

    eventually(lambda: prefill_replicas() == 0, 90, "the idle prefill pool at zero")
    # the decision reaches status with the daemon's next write, after the StatefulSet's replicas
    eventually(
        lambda: "lastScaling" in role_status(admin_kube, namespace, "prefill"), 30, "the decision in status"
    )
    last = role_status(admin_kube, namespace, "prefill")["lastScaling"]
    assert (last["fromReplicas"], last["replicas"], last["reason"]) == (1, 0, "PrefillToZero"), last
    eventually(lambda: not ready_urls(admin_kube, namespace, "prefill"), 60, "no prefill pod left")

    long_prompts.set()
    # Meanwhile the router serves the long prompts colocated, and counts why.
    eventually(
        lambda: (
            router_metric(
                admin_kube, namespace, "inferencepool_router_fallbacks_total", reason="no_prefill_pod"
            )
            > 0
        ),
        60,
        "fallbacks with reason no_prefill_pod",
    )
    eventually(lambda: prefill_replicas() >= 1, 120, "the prefill pool back")
    eventually(
        lambda: role_status(admin_kube, namespace, "prefill")["lastScaling"]["fromReplicas"] == 0,
        30,
        "the decision in status",
    )
    last = role_status(admin_kube, namespace, "prefill")["lastScaling"]
    # PrefillBack, or ScalingLimited when the step's forecast asks for more than maxReplicas
    assert last["fromReplicas"] == 0 and last["reason"] in ("PrefillBack", "ScalingLimited"), last
    assert last["message"].startswith(f"0 -> {last['replicas']} ("), last
    assert last["forecastMilliEngines"] > 0 and "forecast" in last["message"]
    eventually(lambda: ready_urls(admin_kube, namespace, "prefill"), 60, "a prefill pod serving again")
    disaggregated = router_metric(
        admin_kube, namespace, "inferencepool_router_requests_total", route="disaggregated"
    )
    eventually(
        lambda: (
            router_metric(admin_kube, namespace, "inferencepool_router_requests_total", route="disaggregated")
            > disaggregated
        ),
        60,
        "long prompts through the prefill pool again",
    )


def test_scaling_specs_the_planner_cannot_hold_are_refused_naming_the_field(
    cluster: TestCluster, crd_installed: None, namespace: str
) -> None:
    for role, changes, complaint in (
        ("decode", {"minReplicas": 0}, "spec.decode.autoscaling.minReplicas must be >= 1"),
        # the HPA-style Latency rule is gone: kubectl's strict field validation names what is left of it
        ("prefill", {"policy": "Latency"}, 'unknown field "spec.prefill.autoscaling.policy"'),
        ("decode", {"maxScaleDownReplicas": 2}, 'unknown field "spec.decode.autoscaling.maxScaleDown'),
    ):
        document = zero_prefill_pool(namespace)
        document["spec"][role]["autoscaling"].update(changes)
        if changes.get("minReplicas") == 0:
            document["spec"][role]["replicas"] = 0
        result = cluster.kubectl("apply", "-f", "-", input_text=json.dumps(document))
        assert result.returncode != 0 and complaint in result.stderr, result.stderr
    # the planner's bounds across both pools (spec.scaling)
    refused: list[tuple[dict[str, Any], dict[str, dict[str, Any]], str]] = [
        (
            {"prefillDecodeRatio": {"minPercent": 200, "maxPercent": 100}},
            {},
            "spec.scaling.prefillDecodeRatio.maxPercent must be >= minPercent",
        ),
        ({"gpuBudget": 0}, {}, "spec.scaling.gpuBudget"),  # the schema's minimum
        (
            {"gpuBudget": 1},
            {"decode": {"gpusPerReplica": 2}},  # decode's one replica alone needs 2
            "spec.scaling.gpuBudget must hold both pools' minimums",
        ),
        (
            {"gpuBudget": 8},
            {"prefill": {"enabled": False}, "decode": {"enabled": False}},
            "spec.scaling needs prefill or decode autoscaling",
        ),
    ]
    for scaling, edits, complaint in refused:
        document = zero_prefill_pool(namespace)
        document["spec"]["scaling"] = scaling
        for role, fields in edits.items():
            gpus = fields.pop("gpusPerReplica", None)
            if gpus is not None:
                document["spec"][role]["gpusPerReplica"] = gpus
            document["spec"][role]["autoscaling"].update(fields)
        result = cluster.kubectl("apply", "-f", "-", input_text=json.dumps(document))
        assert result.returncode != 0 and complaint in result.stderr, result.stderr
    document = zero_prefill_pool(namespace)
    document["spec"]["scaling"] = {"prefillDecodeRatio": {"maxPercent": 100}, "gpuBudget": 4}
    kubectl_ok(cluster, "apply", "--dry-run=server", "-f", "-", input_text=json.dumps(document))
    # External mode may go to zero (KEDA can), and so may the planner
    document = zero_prefill_pool(namespace)
    document["spec"]["prefill"]["autoscaling"].update({"mode": "External"})
    document["spec"]["prefill"]["replicas"] = 0
    kubectl_ok(cluster, "apply", "--dry-run=server", "-f", "-", input_text=json.dumps(document))
