"""The pod runner: pods of this project's images run as local processes at their pod IPs.

A pod turns Ready only once its process answers, goes NotReady when the process dies (and comes back when the
runner restarts it), and its process is stopped when the pod is deleted.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from typing import Any

from kubernetes import client
from tests.support.cluster import TestCluster, eventually

from inferencepool.cluster import controlplane, procs
from inferencepool.cluster.components import Layout

ROUTER_IMAGE = "inferencepool/router:0.1.0"


def router_pod(name: str, args: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "router",
                    "image": ROUTER_IMAGE,
                    "command": ["inferencepool", "router"],
                    "args": args,
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
                }
            ],
        },
    }


STATIC_ROUTER_ARGS = [
    "--host",
    "0.0.0.0",
    "--port",
    "8080",
    "--prefill",
    "http://127.0.0.1:9",
    "--decode",
    "http://127.0.0.1:9",
]


def _condition(pod: Any, kind: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


def _is_ready(pod: Any) -> bool:
    condition = _condition(pod, "Ready")
    return condition is not None and condition.status == "True"


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return int(response.status), response.read().decode()


def _process_pid(cluster: TestCluster, uid: str) -> int | None:
    record = Layout(cluster.state_dir).runner / "pods" / f"{uid}.json"
    try:
        return int(json.loads(record.read_text())["containers"]["router"]["pid"])
    except (OSError, KeyError, ValueError):
        return None


def _pid_exists(pid: int) -> bool:
    return procs.pid_running(pid)


def test_router_pod_runs_at_its_pod_ip_and_stops_when_deleted(
    cluster: TestCluster, kube_api_client: Any, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api_client)
    core.create_namespaced_pod(namespace, router_pod("router", STATIC_ROUTER_ARGS))
    pod = eventually(
        lambda: _is_ready(p := core.read_namespaced_pod("router", namespace)) and p,
        120,
        "the router pod to be Ready",
    )
    status, body = _get(f"http://{pod.status.pod_ip}:8080/health")
    assert status == 200, body
    pid = _process_pid(cluster, pod.metadata.uid)
    assert pid is not None and _pid_exists(pid)

    core.delete_namespaced_pod("router", namespace)
    eventually(lambda: not _pid_exists(pid), 30, f"router process {pid} to stop after the pod was deleted")
    eventually(
        lambda: not [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name == "router"],
        60,
        "the deleted pod to go away once its process exited",
    )


def test_pod_whose_process_cannot_start_never_turns_ready(kube_api_client: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api_client)
    core.create_namespaced_pod(
        namespace, router_pod("broken", [*STATIC_ROUTER_ARGS, "--policy", "NoSuchPolicy"])
    )

    def exit_event() -> Any:
        events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=broken").items
        return next((e for e in events if e.reason == "ProcessExited"), None)

    event = eventually(exit_event, 120, "a ProcessExited event for the broken router")
    assert "router" in event.message
    pod = core.read_namespaced_pod("broken", namespace)
    assert pod.status.phase == "Running"
    assert not _is_ready(pod)
    assert _condition(pod, "Ready").reason == "ProcessNotReady"


def test_dead_process_makes_the_pod_not_ready_until_restarted(
    cluster: TestCluster, kube_api_client: Any, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api_client)
    core.create_namespaced_pod(namespace, router_pod("crashy", STATIC_ROUTER_ARGS))
    pod = eventually(
        lambda: _is_ready(p := core.read_namespaced_pod("crashy", namespace)) and p,
        120,
        "the router pod to be Ready",
    )
    first = _process_pid(cluster, pod.metadata.uid)
    assert first is not None
    os.kill(first, signal.SIGKILL)

    not_ready = eventually(
        lambda: not _is_ready(p := core.read_namespaced_pod("crashy", namespace)) and p,
        60,
        "the pod to go NotReady after its process was killed",
    )
    assert _condition(not_ready, "Ready").reason == "ProcessExited"
    eventually(
        lambda: _is_ready(core.read_namespaced_pod("crashy", namespace)),
        120,
        "the runner to restart the process and the pod to be Ready again",
    )
    second = _process_pid(cluster, pod.metadata.uid)
    assert second is not None and second != first
    assert _get(f"http://{pod.status.pod_ip}:8080/health")[0] == 200


def test_restarted_runner_adopts_running_processes(
    cluster: TestCluster, kube_api_client: Any, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api_client)
    core.create_namespaced_pod(namespace, router_pod("survivor", STATIC_ROUTER_ARGS))
    pod = eventually(
        lambda: _is_ready(p := core.read_namespaced_pod("survivor", namespace)) and p,
        120,
        "the router pod to be Ready",
    )
    pid = _process_pid(cluster, pod.metadata.uid)
    assert pid is not None

    layout = Layout(cluster.state_dir)
    runner = procs.read_record(layout.pid_file("pod-runner"))
    assert runner is not None
    os.kill(runner.pid, signal.SIGKILL)  # a crash: no chance to stop its processes
    eventually(lambda: not procs.is_alive(runner), 30, "the pod runner to die")
    assert _pid_exists(pid), "pod processes must outlive the runner"

    controlplane.up(cluster.state_dir, progress=lambda _message: None)
    restarted = procs.read_record(layout.pid_file("pod-runner"))
    assert restarted is not None and restarted.pid != runner.pid
    # Adopted, not started again: same process, pod still Ready, still answering.
    assert _process_pid(cluster, pod.metadata.uid) == pid
    assert _is_ready(core.read_namespaced_pod("survivor", namespace))
    assert _get(f"http://{pod.status.pod_ip}:8080/health")[0] == 200

    core.delete_namespaced_pod("survivor", namespace)
    eventually(lambda: not _pid_exists(pid), 60, "the adopted process to stop when its pod is deleted")


def test_fake_engine_pod_answers_openai_requests_at_its_pod_ip(kube_api_client: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api_client)
    engine = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "engine"},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    # No command: the image's ENTRYPOINT `vllm serve` applies, as with the real vLLM image.
                    "name": "vllm",
                    "image": "inferencepool/fake-engine:0.1.0",
                    "args": [
                        "meta-llama/Llama-3.1-8B-Instruct",
                        "--served-model-name",
                        "llama-8b",
                        "--host",
                        "0.0.0.0",
                        "--port",
                        "8000",
                    ],
                    "env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "0"}],
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
                }
            ],
        },
    }
    core.create_namespaced_pod(namespace, engine)
    pod = eventually(
        lambda: _is_ready(p := core.read_namespaced_pod("engine", namespace)) and p,
        180,
        "the fake-engine pod to be Ready",
    )
    base = f"http://{pod.status.pod_ip}:8000"
    status, body = _get(f"{base}/v1/models")
    assert status == 200
    assert [model["id"] for model in json.loads(body)["data"]] == ["llama-8b"]
    request = urllib.request.Request(
        f"{base}/v1/completions",
        data=json.dumps({"model": "llama-8b", "prompt": "Hello", "max_tokens": 3}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        completion = json.loads(response.read())
    assert completion["usage"]["completion_tokens"] == 3
