"""Where the engine pods are: a static list for local runs, or the pool's Pods watched in Kubernetes.

Pods, not Services or EndpointSlices, as Gateway API endpoint pickers do: the router needs each pod's role
label, readiness and deletionTimestamp, and a terminating pod must stop getting new requests while its streams
finish. `pod_spec_from_object` is the pure mapping; the watch loop runs the (blocking) Kubernetes client in a
thread and hands complete snapshots to the event loop, so routing state is only ever touched from the loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from inferencepool.api import labels
from inferencepool.api.pods import http_url, is_ready
from inferencepool.router.config import DEFAULT_ENGINE_PORT, StaticBackends
from inferencepool.router.pods import EngineRole, PodSpec

log = logging.getLogger("inferencepool.router.discovery")

Snapshot = list[PodSpec]


def static_pods(backends: StaticBackends) -> Snapshot:
    """Named after host:port, the way they appear in metrics."""
    specs: Snapshot = []
    roles: tuple[tuple[EngineRole, list[str]], ...] = (
        ("prefill", backends.prefill),
        ("decode", backends.decode),
    )
    for role, urls in roles:
        for url in urls:
            parts = urlsplit(url)
            specs.append(PodSpec(name=f"{role}@{parts.netloc}", url=url.rstrip("/"), role=role))
    return specs


def pod_spec_from_object(pod: Mapping[str, Any], port_name: str = "http") -> PodSpec | None:
    """A Pod (as the API server serializes it, camelCase) -> what the router needs, or None if not routable
    yet."""
    metadata = pod.get("metadata") or {}
    pod_labels = metadata.get("labels") or {}
    role = pod_labels.get(labels.LABEL_ROLE)
    if role not in ("prefill", "decode"):
        return None
    url = http_url(pod, port_name, DEFAULT_ENGINE_PORT)
    if url is None:
        return None  # no IP yet
    return PodSpec(
        name=str(metadata.get("name")),
        url=url,
        role=role,
        ready=is_ready(pod) and (pod.get("status") or {}).get("phase") == "Running",
        terminating=metadata.get("deletionTimestamp") is not None,
        kv_compat=pod_labels.get(labels.LABEL_KV_COMPAT),
        incarnation=incarnation(pod),
    )


def incarnation(pod: Mapping[str, Any]) -> str:
    """Which engine runs under the pod's name: its uid (a StatefulSet pod deleted and created again keeps
    its name, often its IP) and its containers' restarts (a container restarted in place keeps both). Either
    changing means a new engine, with a new NIXL engine id and an empty KV cache."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or ()
    restarts = sum(int(status.get("restartCount") or 0) for status in statuses)
    return f"{(pod.get('metadata') or {}).get('uid', '')}/{restarts}"


def snapshot_from_pods(pods: Iterable[Mapping[str, Any]], port_name: str = "http") -> Snapshot:
    return [spec for pod in pods if (spec := pod_spec_from_object(pod, port_name)) is not None]


def _api_client() -> Any:
    """In-cluster config when the router runs in a pod, else the kubeconfig named by $KUBECONFIG (read now,
    not when the Kubernetes client was imported)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"))


class PodWatcher:
    """List + watch the pool's Pods in a thread; every change delivers a full snapshot to `apply` on the
    loop."""

    def __init__(
        self,
        pool: str,
        namespace: str,
        port_name: str,
        apply: Callable[[Snapshot], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.pool = pool
        self.namespace = namespace
        self.port_name = port_name
        self._apply = apply
        self._loop = loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pod-watch-{pool}", daemon=True)
        self.first_snapshot = asyncio.Event()
        self._watch: Any = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.stop()

    def _deliver(self, pods: dict[str, dict[str, Any]]) -> None:
        snapshot = snapshot_from_pods(pods.values(), self.port_name)

        def apply() -> None:
            self._apply(snapshot)
            self.first_snapshot.set()

        self._loop.call_soon_threadsafe(apply)

    def _run(self) -> None:
        from kubernetes import client, watch
        from kubernetes.client.exceptions import ApiException

        selector = labels.pool_selector(self.pool)
        backoff = 1.0
        api: Any = None
        while not self._stop.is_set():
            try:
                if api is None:
                    api = client.CoreV1Api(_api_client())
                serialize = api.api_client.sanitize_for_serialization
                listed = api.list_namespaced_pod(self.namespace, label_selector=selector)
                pods: dict[str, dict[str, Any]] = {}
                for item in listed.items:
                    document = serialize(item)
                    pods[document["metadata"]["name"]] = document
                self._deliver(pods)
                version = listed.metadata.resource_version if listed.metadata else None
                self._watch = watch.Watch()
                # Short server-side timeouts keep a silently dead watch from lasting long.
                for event in self._watch.stream(
                    api.list_namespaced_pod,
                    self.namespace,
                    label_selector=selector,
                    resource_version=version,
                    timeout_seconds=60,
                    _request_timeout=90,
                ):
                    if self._stop.is_set():
                        return
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        break
                    document = serialize(obj)
                    name = document["metadata"]["name"]
                    if kind == "DELETED":
                        pods.pop(name, None)
                    else:
                        pods[name] = document
                    self._deliver(pods)
                backoff = 1.0
            except ApiException as error:
                # 410 Gone (resource version too old) and friends: re-list from scratch.
                log.warning("pod watch for pool %s: %s %s; re-listing", self.pool, error.status, error.reason)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            except Exception as error:  # network trouble: keep the last snapshot and retry
                if self._stop.is_set():
                    return
                log.warning("pod watch for pool %s failed (%s); retrying in %.0fs", self.pool, error, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
