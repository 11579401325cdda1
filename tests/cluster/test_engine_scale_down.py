"""Scale-down of a prefill pod under P/D load loses no request (issue 11, defect 5), on the control plane.

The engine pods are the builders' own pod templates (`vllm serve` with the operator's flags, among them
--shutdown-timeout), run by the local pod runner as fake engines; a router in the test process discovers them
through the API server. One prefill pod is deleted while requests flow: the router stops sending to it, and
on SIGTERM the engine drains what it runs and the KV it still holds for decode engines, so no decode leg loses
its hand-off and every client request succeeds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client
from tests.cluster.kube_helpers import (
    example,
)
from tests.support.cluster import TestCluster
from tests.support.routers import discovering_router

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import engine
from inferencepool.builders.common import PoolRef
from inferencepool.router.config import RouterConfig
from inferencepool.router.server import Router

POOL = "drain"
LONG_PROMPT = "a prompt long enough to be worth a prefill pod " * 40


def pool_model(namespace: str) -> InferencePool:
    document = example("demo-cpu.yaml")
    document["metadata"] = {
        "name": POOL,
        "namespace": namespace,
        "uid": "00000000-0000-4000-8000-00000000d7a1",
    }
    spec = document["spec"]
    spec.pop("kvCache")  # NIXL only: the hold is the engine's own
    spec["engine"]["extraEnv"].append({"name": "FAKE_ENGINE_TIME_SCALE", "value": "0.2"})
    # One sequence at a time: decode legs queue on the decode engine, so prefill engines hold KV for a while
    # (the hand-offs a scale-down could lose)
    spec["engine"]["extraArgs"] = ["--max-num-seqs", "1"]
    for role, replicas in (("prefill", 2), ("decode", 1)):
        spec[role].pop("autoscaling")
        spec[role]["replicas"] = replicas
    return InferencePool.model_validate(document)


def engine_pod(pool: InferencePool, role: str, index: int) -> dict[str, Any]:
    """The pod the StatefulSet would create: the builders' template, named as the StatefulSet names it."""
    template = engine.engine_pod_template(pool, PoolRef.of(pool), role)  # type: ignore[arg-type]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": f"{POOL}-{role}-{index}"},
        "spec": template["spec"],
    }


async def until(check: Any, seconds: float, what: str) -> None:
    for _ in range(int(seconds * 5)):
        if check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {seconds:.0f}s waiting for {what}")


def fallbacks(router: Router, reason: str) -> float:
    value: float = router.metrics.fallbacks.labels(reason)._value.get()
    return value


async def test_deleting_a_prefill_pod_under_load_loses_no_hand_off(
    cluster: TestCluster, kube_api_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(Path(cluster.kubeconfig)))
    pool = pool_model(namespace)
    core = client.CoreV1Api(kube_api_client)
    for role, index in (("prefill", 0), ("prefill", 1), ("decode", 0)):
        core.create_namespaced_pod(namespace, engine_pod(pool, role, index))

    config = RouterConfig(
        pool=POOL,
        namespace=namespace,
        served_model_name=pool.spec.served_model_name(),
        policy="AlwaysDisaggregate",
    )
    async with discovering_router(config) as (router, url), aiohttp.ClientSession() as http:

        def serving(role: str) -> set[str]:
            return {pod.name for pod in router.pods.by_role(role) if pod.accepts_new}  # type: ignore[arg-type]

        await until(
            lambda: len(serving("prefill")) == 2 and len(serving("decode")) == 1, 120, "engines Ready"
        )
        statuses: list[int] = []
        routes: list[str] = []
        stop = asyncio.Event()

        async def client_loop() -> None:
            body = {"model": pool.spec.served_model_name(), "prompt": LONG_PROMPT, "max_tokens": 32}
            while not stop.is_set():
                async with http.post(url + "/v1/completions", json=body) as response:
                    await response.read()
                    statuses.append(response.status)
                    routes.append(response.headers.get("X-Inferencepool-Route", ""))

        clients = [asyncio.create_task(client_loop()) for _ in range(6)]
        try:
            await until(lambda: routes.count("disaggregated") >= 20, 60, "P/D load")
            gone = f"{POOL}-prefill-1"
            core.delete_namespaced_pod(gone, namespace)
            await until(lambda: gone not in serving("prefill"), 30, "the router to stop sending to it")

            def deleted() -> bool:
                return not [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name == gone]

            await until(deleted, 120, "the prefill pod to go")
            served_before = len(statuses)
            await until(lambda: len(statuses) >= served_before + 12, 60, "requests after the scale-down")
        finally:
            stop.set()
            await asyncio.gather(*clients)

        assert set(statuses) == {200}, statuses
        assert fallbacks(router, "decode_leg_failed") == 0  # no decode leg lost its KV hand-off
        assert routes[-12:].count("disaggregated") >= 6  # the remaining prefill pod carries the load
