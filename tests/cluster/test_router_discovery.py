"""The router discovers its pool's engine Pods on the real control plane and follows scaling, no restart.

Fake-engine Pods carry the pool labels (inferencepool.api.labels); the local pod runner starts each as a
process at its pod IP and marks it Ready once it listens. The router watches those Pods through the API
server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from tests.support.cluster import TestCluster
from tests.support.routers import discovering_router

from inferencepool.api import labels
from inferencepool.router.config import RouterConfig
from inferencepool.router.server import Router

POOL = "disco"
MODEL = "fake-model"
ENGINE_IMAGE = "inferencepool/fake-engine:0.1.0"
LONG_PROMPT = "the pool keeps shared prefixes warm " * 60


def engine_pod(name: str, role: str, profile: str = "zero") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels.standard_labels(POOL, role)},  # type: ignore[arg-type]
        "spec": {
            "terminationGracePeriodSeconds": 10,
            "containers": [
                {
                    "name": "vllm",
                    "image": ENGINE_IMAGE,
                    "command": ["vllm", "serve", MODEL],
                    "args": ["--host", "0.0.0.0", "--port", "8000", "--profile", profile, "--role", role],
                    "ports": [{"name": "http", "containerPort": 8000}],
                }
            ],
        },
    }


async def until(check: Any, seconds: float, what: str, router: Router) -> None:
    for _ in range(int(seconds * 5)):
        if check():
            return
        await asyncio.sleep(0.2)
    known = {p.name: (p.url, p.ready, p.terminating) for p in router.pods.pods.values()}
    raise AssertionError(f"timed out after {seconds:.0f}s waiting for {what}; the router knows {known}")


def serving(router: Router, role: str) -> set[str]:
    return {pod.name for pod in router.pods.by_role(role) if pod.accepts_new}  # type: ignore[arg-type]


async def generate(url: str) -> tuple[int, str]:
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 4}
    async with aiohttp.ClientSession() as http, http.post(url + "/v1/completions", json=body) as response:
        return response.status, response.headers.get("X-Inferencepool-Route", "")


async def served(engine_url: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(engine_url + "/metrics") as response:
        text = await response.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "vllm:request_success"
        for sample in family.samples
        if sample.name == "vllm:request_success_total"
    )


async def test_router_follows_the_pools_pods(
    cluster: TestCluster, kube_api_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(Path(cluster.kubeconfig)))
    core = client.CoreV1Api(kube_api_client)
    core.create_namespaced_pod(namespace, engine_pod("disco-prefill-0", "prefill"))
    core.create_namespaced_pod(namespace, engine_pod("disco-decode-0", "decode"))
    # A pod of the pool whose process never starts stays NotReady: it must get no requests.
    core.create_namespaced_pod(
        namespace, engine_pod("disco-decode-broken", "decode", profile="no-such-profile")
    )
    config = RouterConfig(
        pool=POOL, namespace=namespace, served_model_name=MODEL, policy="AlwaysDisaggregate"
    )
    async with discovering_router(config) as (router, url):
        await until(
            lambda: serving(router, "decode") == {"disco-decode-0"}, 90, "decode-0 discovered Ready", router
        )
        await until(
            lambda: serving(router, "prefill") == {"disco-prefill-0"},
            30,
            "prefill-0 discovered Ready",
            router,
        )
        assert "disco-decode-broken" in {p.name for p in router.pods.by_role("decode")}
        assert (await generate(url)) == (200, "disaggregated")

        # Scale up: a new decode pod is used without restarting the router.
        core.create_namespaced_pod(namespace, engine_pod("disco-decode-1", "decode"))
        await until(lambda: len(serving(router, "decode")) == 2, 90, "decode-1 discovered Ready", router)
        for _ in range(4):
            assert (await generate(url))[0] == 200
        for pod in router.pods.by_role("decode"):
            if pod.accepts_new:  # both Ready decode pods took some of the four
                assert await served(pod.url) >= 1, pod.name

        # Scale down: the deleted pod stops getting requests; every request still succeeds.
        core.delete_namespaced_pod("disco-decode-0", namespace)
        await until(
            lambda: serving(router, "decode") == {"disco-decode-1"}, 30, "decode-0 leaving the set", router
        )
        for _ in range(4):
            assert (await generate(url)) == (200, "disaggregated")
        pod = router.pods.pods["disco-decode-1"]
        assert pod.outstanding == 0 and pod.url.startswith("http://127.")

        # The prefill pool gone: long prompts are served colocated, not failed.
        core.delete_namespaced_pod("disco-prefill-0", namespace)
        await until(lambda: not serving(router, "prefill"), 30, "prefill-0 leaving the set", router)
        assert (await generate(url)) == (200, "fallback")
