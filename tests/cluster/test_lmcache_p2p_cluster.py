"""LMCache p2p on the real control plane: a pool with kvCache.p2p.enabled gets its LMCache controller (run by
the pod runner as the fake controller), every engine pod registers with it through the Service name (the
runner's Service table), and a prefix computed on one decode pod is fetched by the other, as the demo's p2p
step shows and the engines' counters confirm."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tests.cluster.kube_helpers import (
    example,
    kubectl_ok,
)

from inferencepool.controller.context import OperatorContext
from inferencepool.demo import p2p as demo_p2p
from inferencepool.kube import Kube

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster


POOL = "shared"
MODEL = "llama-8b"


class Kubectl:
    def __init__(self, cluster: TestCluster) -> None:
        self.cluster = cluster

    def __call__(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        return kubectl_ok(self.cluster, *args, input_text=input_text)

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))


def pool_document(namespace: str) -> dict[str, Any]:
    """demo-cpu.yaml with p2p on, two decode pods and one prefill pod, held there (no autoscaling moves)."""
    document = example("demo-cpu.yaml")
    document["metadata"] = {"name": POOL, "namespace": namespace}
    spec = document["spec"]
    spec["engine"]["extraEnv"] = [{"name": "FAKE_ENGINE_PROFILE", "value": "cpu-demo"}]
    spec["kvCache"]["p2p"] = {"enabled": True}
    for role, replicas in (("prefill", 1), ("decode", 2)):
        spec[role]["replicas"] = replicas
        spec[role]["autoscaling"]["minReplicas"] = spec[role]["autoscaling"]["maxReplicas"] = replicas
    return document


def test_a_prefix_computed_on_one_decode_pod_is_fetched_by_the_other(
    cluster: TestCluster,
    operator: OperatorContext,
    admin_kube: Kube,
    namespace: str,
    capsys: Any,
) -> None:
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(pool_document(namespace)))
    demo_p2p.run_p2p_step(Kubectl(cluster), namespace, POOL, MODEL, timeout=180)
    output = capsys.readouterr().out
    fetched = next(line for line in output.splitlines() if "prompt tokens fetched from a peer" in line)
    tokens = int(fetched.split(": ", 1)[1].split(" prompt tokens")[0])
    assert tokens >= 2048, output  # the shared document's whole chunks (about 3600 tokens)
    assert "0 from its own prefix cache" in fetched, output
    served = next(line for line in output.splitlines() if "served 1 p2p transfer(s)" in line)
    assert f"of {tokens} tokens" in served, output
    controller = kubectl_ok(cluster, "get", "deployment", f"{POOL}-lmcache-controller", "-n", namespace)
    assert "1/1" in controller, controller
