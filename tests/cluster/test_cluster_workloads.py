"""The real controllers run: StatefulSets become Ready pods on the fake GPU node, owners garbage-collect."""

from __future__ import annotations

import ipaddress
from typing import Any

from kubernetes import client
from tests.support.cluster import eventually

from inferencepool.api.labels import ANNOTATION_PROCESS_READY

# Any image that is not one of this project's runs as a pure kwok simulation: no process, Ready at once.
SIMULATED_IMAGE = "vllm/vllm-openai:v0.33.0"


def statefulset(name: str, replicas: int, gpus: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": SIMULATED_IMAGE,
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ]
                },
            },
        },
    }


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def test_node_offers_eight_gpus_and_is_ready(kube_api_client: Any) -> None:
    nodes = client.CoreV1Api(kube_api_client).list_node().items
    assert nodes, "up created no node"
    node = nodes[0]
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    assert ipaddress.ip_network(node.spec.pod_cidr).subnet_of(ipaddress.ip_network("127.0.0.0/8"))


def test_statefulset_of_two_gets_two_ready_pods_with_loopback_ips(
    kube_api_client: Any, namespace: str
) -> None:
    apps, core = client.AppsV1Api(kube_api_client), client.CoreV1Api(kube_api_client)
    apps.create_namespaced_stateful_set(namespace, statefulset("engines", replicas=2, gpus=4))

    def ready_pods() -> list[Any] | None:
        pods = core.list_namespaced_pod(namespace, label_selector="app=engines").items
        return pods if len(pods) == 2 and all(_ready(p) for p in pods) else None

    pods = eventually(ready_pods, 120, "2 Ready pods of StatefulSet engines")
    assert sorted(p.metadata.name for p in pods) == ["engines-0", "engines-1"]
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == 2
    assert all(ipaddress.ip_address(ip).is_loopback for ip in ips)
    # Simulated pods are announced by the runner too: kwok's ready stage keys on this annotation.
    assert all(p.metadata.annotations[ANNOTATION_PROCESS_READY] == "true" for p in pods)
    status = eventually(
        lambda: (
            (s := apps.read_namespaced_stateful_set("engines", namespace).status).ready_replicas == 2 and s
        ),
        120,
        "StatefulSet status readyReplicas=2",
    )
    assert status.replicas == 2


def test_gpu_capacity_is_enforced_by_the_scheduler(kube_api_client: Any, namespace: str) -> None:
    apps, core = client.AppsV1Api(kube_api_client), client.CoreV1Api(kube_api_client)
    # 9 GPUs fit on no 8-GPU node: the pod stays Pending with a scheduler event that says why.
    apps.create_namespaced_stateful_set(namespace, statefulset("too-big", replicas=1, gpus=9))

    def unschedulable() -> str | None:
        pods = core.list_namespaced_pod(namespace, label_selector="app=too-big").items
        for pod in pods:
            for condition in pod.status.conditions or []:
                if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                    return str(condition.message)
        return None

    message = eventually(unschedulable, 120, "the scheduler to refuse a 9-GPU pod")
    assert "nvidia.com/gpu" in message


def test_deleting_an_owner_garbage_collects_its_children(kube_api_client: Any, namespace: str) -> None:
    apps, core = client.AppsV1Api(kube_api_client), client.CoreV1Api(kube_api_client)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}, "data": {"a": "b"}})
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "child", "ownerReferences": [reference]}, "data": {"c": "d"}}
    )
    apps.create_namespaced_stateful_set(namespace, statefulset("owned", replicas=1, gpus=1))
    eventually(
        lambda: [
            p for p in core.list_namespaced_pod(namespace, label_selector="app=owned").items if _ready(p)
        ],
        120,
        "the StatefulSet's pod to be Ready",
    )

    core.delete_namespaced_config_map("owner", namespace)
    apps.delete_namespaced_stateful_set("owned", namespace, propagation_policy="Background")

    eventually(
        lambda: "child" not in [cm.metadata.name for cm in core.list_namespaced_config_map(namespace).items],
        120,
        "the garbage collector to delete ConfigMap child",
    )
    eventually(
        lambda: not core.list_namespaced_pod(namespace, label_selector="app=owned").items,
        120,
        "the StatefulSet's pods to be garbage-collected and removed",
    )
