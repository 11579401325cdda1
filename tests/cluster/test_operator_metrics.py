"""The operator's own metrics on the real control plane: a pool's figures appear as it comes up, follow its
status, and disappear when it is deleted."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tests.cluster.kube_helpers import (
    example,
    kubectl_ok,
)
from tests.support.cluster import eventually

from inferencepool.controller.context import OperatorContext
from inferencepool.observability import metrics

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster


POOL = "watched"


def scrape(context: OperatorContext, name: str, **labels: str) -> float | None:
    text = generate_latest(context.metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def test_a_pools_figures_follow_it_and_go_with_it(
    cluster: TestCluster, operator: OperatorContext, namespace: str
) -> None:
    document = example("demo-cpu.yaml")
    document["metadata"] = {"name": POOL, "namespace": namespace}
    for role in ("prefill", "decode"):
        document["spec"][role].pop("autoscaling")
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(document))
    decode = {"namespace": namespace, "pool": POOL, "role": "decode"}
    eventually(lambda: scrape(operator, metrics.READY_REPLICAS, **decode) == 2, 90, "2 ready decode replicas")
    assert scrape(operator, metrics.DESIRED_REPLICAS, **decode) == 2
    assert scrape(operator, metrics.READY_REPLICAS, namespace=namespace, pool=POOL, role="prefill") == 1
    assert scrape(operator, metrics.DEGRADED, namespace=namespace, pool=POOL) == 0
    assert (
        scrape(operator, f"{metrics.RECONCILES}_total", namespace=namespace, pool=POOL, result="ok") or 0
    ) >= 1
    assert (scrape(operator, f"{metrics.RECONCILE_DURATION}_count") or 0) >= 1

    kubectl_ok(cluster, "-n", namespace, "delete", "pdpool", POOL, "--wait=true", "--timeout=60s")
    eventually(
        lambda: scrape(operator, metrics.READY_REPLICAS, **decode) is None, 30, "the pool's series removed"
    )
    assert scrape(operator, metrics.DEGRADED, namespace=namespace, pool=POOL) is None
