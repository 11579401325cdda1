"""Role lending on the real control plane: fake engine pods (their model time slowed 10x, two sequences a
batch) behind the pool's own router with `router.roleLending`. Short prompts with long answers, more at once
than the one decode pod batches, saturate it (requests wait in its engine); the router then serves some of
them whole on the prefill pod (route `lent`, reason `decode_saturated`), which decodes them.

The planner's demand per role stays true: the operator's own feed, reading the pods' pages over an interval
as its runner does, counts the lent prompts and their output as the decode pool's demand and none as the
prefill pool's, and the planner fed that wants decode work only (more of it than without the lent requests);
the operator's status reports the lent share and keeps the prefill pool at one replica. (At the fakes'
slowed time the modelled demand is a fraction of an engine, so no replica count moves on demand alone.)"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.cluster import kube_helpers
from tests.cluster.kube_helpers import example, get_pool, kubectl_ok
from tests.support.cluster import eventually

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.autoscaler.feed import PoolFeed, RolePages, RouterReading, observation
from inferencepool.autoscaler.histogram import parse_page
from inferencepool.autoscaler.planner import Planner, RouteLoad
from inferencepool.autoscaler.planner_spec import capacity_seed, planner_settings
from inferencepool.controller.context import OperatorContext
from inferencepool.kube import Kube

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

POOL = "lending"
CLIENTS = 6  # three times what the decode pod batches
SHORT_PROMPT = "word " * 200  # far under the router's 4,096-token threshold: decode-pool work
ANSWER_TOKENS = 40  # ~3 s of decode at the H100 profile slowed 10x


def lending_pool(namespace: str) -> dict[str, Any]:
    document = example("demo-cpu.yaml")
    document["metadata"] = {"name": POOL, "namespace": namespace}
    spec = document["spec"]
    spec.pop("kvCache")
    spec["engine"]["extraEnv"].append({"name": "FAKE_ENGINE_TIME_SCALE", "value": "10"})
    spec["engine"]["extraArgs"] = ["--max-num-seqs", "2"]  # a third request waits in the engine
    spec["router"]["roleLending"] = True
    common = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "intervalSeconds": 6,
        "windowSeconds": 30,
        "modelLoadSeconds": 5,
        "scaleDownStabilizationSeconds": 0,
    }
    spec["prefill"]["replicas"] = 1
    # The lent requests' TTFT is in the prefill engines' histogram, the planner's prefill latency signal; with
    # two sequences a batch one sometimes waits there for a slot (the router reads the engine's queue every
    # 500 ms), seconds at the slowed time. A loose target keeps the latency guard out of the demand's way.
    spec["prefill"]["autoscaling"] = {"target": {"ttftMilliseconds": 20000, "percentile": 90}, **common}
    spec["decode"]["replicas"] = 1
    spec["decode"]["autoscaling"] = {"target": {"itlMilliseconds": 2000, "percentile": 90}, **common}
    return document


def ready_urls(kube: Kube, namespace: str, role: str) -> list[str]:
    return kube_helpers.ready_urls(kube, namespace, POOL, role)


def page_sum(url: str, name: str, **wanted: str) -> float:
    """Sum of a metric's samples (counter or gauge) on a pod's /metrics page, filtered by labels."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    names = (name, f"{name}_total")
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in names and all(sample.labels.get(k) == v for k, v in wanted.items())
    )


def role_status(kube: Kube, namespace: str, role: str) -> dict[str, Any]:
    return dict((get_pool(kube, namespace, POOL) or {}).get("status", {}).get(role) or {})


@pytest.fixture
def short_prompts(admin_kube: Kube, namespace: str) -> Iterator[threading.Event]:
    """CLIENTS clients send short prompts with long answers through the pool's router while the event is
    set."""
    body = {"model": "llama-8b", "prompt": SHORT_PROMPT, "max_tokens": ANSWER_TOKENS, "ignore_eos": True}
    with kube_helpers.background_load(
        lambda: ready_urls(admin_kube, namespace, "router")[:1], lambda: body, CLIENTS
    ) as on:
        yield on


def test_a_prefill_pod_serves_lent_requests_while_the_decode_pool_is_saturated_and_the_planner_knows(
    cluster: TestCluster,
    operator: OperatorContext,
    admin_kube: Kube,
    namespace: str,
    short_prompts: threading.Event,
) -> None:
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(lending_pool(namespace)))
    routers = eventually(lambda: ready_urls(admin_kube, namespace, "router"), 90, "a ready router")
    (prefill,) = eventually(lambda: ready_urls(admin_kube, namespace, "prefill"), 90, "a ready prefill pod")
    (decode,) = eventually(lambda: ready_urls(admin_kube, namespace, "decode"), 90, "a ready decode pod")
    router = routers[0]
    short_prompts.set()

    # The decode pod queues (more clients than its batch) and the router lends to the prefill pod.
    eventually(lambda: page_sum(decode, "vllm:num_requests_waiting") >= 1, 60, "requests waiting on decode")
    eventually(
        lambda: page_sum(router, "inferencepool_router_requests", route="lent") >= 3, 90, "lent requests"
    )
    decisions = "inferencepool_router_disaggregation_decisions"
    assert page_sum(router, decisions, reason="decode_saturated") >= 3
    # The prefill pod served them whole: it decoded (a prefill leg generates one token, and no prompt was
    # long enough for one).
    assert page_sum(router, "inferencepool_router_requests", route="disaggregated") == 0
    served = page_sum(prefill, "vllm:request_success")
    assert served >= 1 and page_sum(prefill, "vllm:generation_tokens") >= served * ANSWER_TOKENS

    # The operator's feed over one interval of the live pages, as its runner reads them.
    document = lending_pool(namespace)
    feed = PoolFeed()
    observe(feed, router, prefill, decode, 0.0)
    time.sleep(INTERVAL_SECONDS)
    lent_before = page_sum(router, "inferencepool_router_requests", route="lent")
    reading = observe(feed, router, prefill, decode, INTERVAL_SECONDS)
    assert page_sum(router, "inferencepool_router_requests", route="lent") >= lent_before  # still lending
    spec = InferencePool.model_validate(document).spec
    kv_tokens = capacity_seed(spec).kv_capacity_tokens
    obs = observation(INTERVAL_SECONDS, INTERVAL_SECONDS, *reading, kv_tokens)
    assert obs.lent is not None and obs.lent.prompts > 0, obs
    assert obs.to_prefill is not None and (obs.to_prefill.prompts, obs.to_prefill.prompt_tokens) == (0, 0)
    assert obs.direct is not None and obs.direct.prompts >= obs.lent.prompts  # lent prompts: decode demand
    assert obs.lent_generated_tokens and obs.generated_tokens is not None
    assert obs.generated_tokens >= obs.lent_generated_tokens  # and their output
    plan = fresh_planner(spec).decide(obs)
    assert plan.prefill.demand == 0 and plan.decode.demand > 0, plan.summary()
    # the same interval without the lent requests: less decode demand
    direct = obs.direct
    unlent = dataclasses.replace(
        obs,
        direct=RouteLoad(direct.prompts - obs.lent.prompts, direct.prompt_tokens - obs.lent.prompt_tokens),
        lent=None,
        lent_generated_tokens=None,
        generated_tokens=obs.generated_tokens - obs.lent_generated_tokens,
    )
    assert fresh_planner(spec).decide(unlent).decode.demand < plan.decode.demand

    # The operator's status: the lent share, and a prefill pool the lent work did not grow.
    lent_percent = eventually(
        lambda: ((get_pool(admin_kube, namespace, POOL) or {}).get("status", {}).get("router") or {}).get(
            "lentPercent"
        ),
        60,
        "status.router.lentPercent",
    )
    assert 0 < lent_percent <= 100

    def prefill_recommended() -> dict[str, Any] | None:
        status = role_status(admin_kube, namespace, "prefill")
        return status if status.get("recommendedReplicas") is not None else None

    prefill_status = eventually(prefill_recommended, 60, "the planner's prefill recommendation")
    assert prefill_status["recommendedReplicas"] == 1, prefill_status
    assert "lastScaling" not in prefill_status, prefill_status
    statefulset = admin_kube.get("apps/v1", "StatefulSet", namespace, f"{POOL}-prefill")
    assert statefulset is not None and statefulset["spec"]["replicas"] == 1


INTERVAL_SECONDS = 12.0


def observe(
    feed: PoolFeed, router: str, prefill: str, decode: str, now: float
) -> tuple[Any, Any, RouterReading]:
    """One round of the operator's feed over the pool's pages (one pod each): (prefill, decode, router)."""

    def page(url: str) -> Any:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            return parse_page(response.read().decode())

    readings = []
    for role, url in (("prefill", prefill), ("decode", decode)):
        pages = RolePages(1, 1, frozenset({url}), ((url, page(url)),), 30.0, 90)
        readings.append(feed.role(role, now, pages)[0])
    routed, _ = feed.routers(now, frozenset({router}), [(router, page(router))], 30.0)
    return readings[0], readings[1], routed


def fresh_planner(spec: Any) -> Planner:
    settings = planner_settings(spec, {"prefill": 1, "decode": 1})
    assert settings is not None
    return Planner(settings, capacity_seed(spec))
