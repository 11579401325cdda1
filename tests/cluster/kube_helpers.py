"""Helpers for the tests against the local control plane (the fixtures are in conftest.py)."""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from tests.support.cluster import eventually

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import API_VERSION
from inferencepool.builders import CHILD_KINDS
from inferencepool.kube import Kube

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
OPERATOR_ACCOUNT = ("inferencepool-system", "inferencepool-operator")
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"


def example(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES / name).read_text()))


def kubectl_ok(cluster: TestCluster, *args: str, input_text: str | None = None) -> str:
    result = cluster.kubectl(*args, input_text=input_text)
    assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
    return result.stdout


def patch_spec(cluster: TestCluster, namespace: str, name: str, spec: dict[str, Any]) -> None:
    """`kubectl patch` of the pool's spec (a JSON merge patch), by the resource's fully qualified name."""
    patch = json.dumps({"spec": spec})
    resource = f"inferencepools.{labels.GROUP}"
    kubectl_ok(cluster, "-n", namespace, "patch", resource, name, "--type=merge", "-p", patch)


def create_pool(kube: Kube, namespace: str, document: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(document)
    body["metadata"] = {"name": document["metadata"]["name"], "namespace": namespace}
    # The admin client creates it with a plain POST, as `kubectl create` would.
    from kubernetes import client

    api = client.CustomObjectsApi(kube.api)
    return dict(
        api.create_namespaced_custom_object(labels.GROUP, labels.VERSION, namespace, labels.PLURAL, body)
    )


def get_pool(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    return kube.get(API_VERSION, labels.KIND, namespace, name)


def children_of(kube: Kube, namespace: str, pool: str) -> list[dict[str, Any]]:
    selector = f"{labels.LABEL_POOL}={pool},{labels.LABEL_MANAGED_BY}={labels.MANAGED_BY}"
    found = []
    for api_version, kind in CHILD_KINDS:
        for item in kube.list(api_version, kind, namespace, selector):
            item.setdefault("kind", kind)
            found.append(item)
    return found


def resource_versions(kube: Kube, namespace: str, pool: str) -> dict[str, str]:
    return {
        f"{c['kind']}/{c['metadata']['name']}": c["metadata"]["resourceVersion"]
        for c in children_of(kube, namespace, pool)
    }


def settled_versions(kube: Kube, namespace: str, pool: str, quiet_seconds: float = 3.0) -> dict[str, str]:
    """Children's resourceVersions once nothing (controllers, kwok, the runner) changed them for a while."""
    import time

    last = resource_versions(kube, namespace, pool)
    quiet_since = time.monotonic()
    deadline = quiet_since + 90
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = resource_versions(kube, namespace, pool)
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_seconds:
            return now
    raise AssertionError(f"children of {pool} never settled: {last}")


def condition(pool: dict[str, Any] | None, condition_type: str) -> dict[str, Any] | None:
    if pool is None:
        return None
    for item in (pool.get("status") or {}).get("conditions", []):
        if item["type"] == condition_type:
            return dict(item)
    return None


def wait_condition(
    kube: Kube, namespace: str, name: str, condition_type: str, status: str, timeout: float = 90.0
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        found = condition(get_pool(kube, namespace, name), condition_type)
        return found if found is not None and found["status"] == status else None

    return eventually(check, timeout, f"{condition_type}={status} on {namespace}/{name}")


def event_reasons(kube: Kube, namespace: str, name: str) -> dict[str, str]:
    """reason -> message of the Events posted about the pool `name`."""
    from kubernetes import client

    events = client.CoreV1Api(kube.api).list_namespaced_event(namespace).items
    return {e.reason: e.message for e in events if e.involved_object.name == name}


def ready_urls(kube: Kube, namespace: str, pool: str, role: str) -> list[str]:
    """The HTTP addresses of a pool's ready pods of one role."""
    selector = f"{labels.LABEL_POOL}={pool},{labels.LABEL_ROLE}={role}"
    urls = []
    for pod in kube.list("v1", "Pod", namespace, selector):
        status = pod.get("status", {})
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        ports = [p for c in pod["spec"]["containers"] for p in c.get("ports", []) if p.get("name") == "http"]
        if ready and status.get("podIP") and ports:
            urls.append(f"http://{status['podIP']}:{ports[0]['containerPort']}")
    return urls


@contextlib.contextmanager
def background_load(
    urls: Callable[[], list[str]], body: Callable[[], dict[str, Any]], clients: int, timeout: float = 60.0
) -> Iterator[threading.Event]:
    """`clients` threads post `body()` to `/v1/completions` of each of `urls()` in turn while the event is
    set, and stop when the block ends."""
    on, stop = threading.Event(), threading.Event()

    def client() -> None:
        while not stop.is_set():
            if not on.wait(0.2):
                continue
            for url in urls():
                request = urllib.request.Request(
                    url + "/v1/completions", json.dumps(body()).encode(), {"Content-Type": "application/json"}
                )
                try:
                    with urllib.request.urlopen(request, timeout=timeout) as response:
                        response.read()
                except OSError:
                    pass  # a pod going away mid-test; the next round picks the live ones

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield on
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout + 10)
