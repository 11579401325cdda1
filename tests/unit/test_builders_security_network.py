"""NetworkPolicies of a pool (spec.networkPolicy): who may reach which port, judged by a small evaluator of
the NetworkPolicy semantics (ingress rules OR together; within a rule, peers and ports must both match)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders_examples import load_pool

from inferencepool.api import labels
from inferencepool.builders import lmcache, pool_children
from inferencepool.builders.network import OPERATOR_POD_LABELS

NAMESPACE = "prod"  # builders_examples puts the pools there
ENGINE_HTTP, NIXL = 8000, 5600
NAMED_PORTS = {"http": ENGINE_HTTP}


def selector_matches(selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if pod_labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        if operator == "In" and pod_labels.get(key) not in expression["values"]:
            return False
        if operator == "Exists" and key not in pod_labels:
            return False
    return True


def peer_matches(peer: dict[str, Any], namespace: str, pod_labels: dict[str, str]) -> bool:
    namespace_labels = {"kubernetes.io/metadata.name": namespace}
    if "namespaceSelector" in peer:
        if not selector_matches(peer["namespaceSelector"], namespace_labels):
            return False
    elif namespace != NAMESPACE:
        return False  # a podSelector alone selects pods of the policy's own namespace
    return selector_matches(peer.get("podSelector", {}), pod_labels)


def allowed(
    policies: list[dict[str, Any]], target: dict[str, str], port: int, namespace: str, source: dict[str, str]
) -> bool:
    selecting = [p for p in policies if selector_matches(p["spec"]["podSelector"], target)]
    if not selecting:
        return True  # no policy selects the pod: everything may reach it
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = [NAMED_PORTS.get(p["port"], p["port"]) for p in rule.get("ports", [])]
            peers = rule.get("from", [])
            if (not ports or port in ports) and (
                not peers or any(peer_matches(peer, namespace, source) for peer in peers)
            ):
                return True
    return False


def pod(pool: str, role: str) -> dict[str, str]:
    return labels.standard_labels(pool, role)  # type: ignore[arg-type]


def policies_of(example: str, **changes: Any) -> list[dict[str, Any]]:
    return [c for c in pool_children(load_pool(example, **changes)) if c["kind"] == "NetworkPolicy"]


def test_off_by_default() -> None:
    assert policies_of("llama-3.1-8b.yaml") == []


@pytest.fixture
def llama_policies() -> list[dict[str, Any]]:
    return policies_of("llama-3.1-8b.yaml", networkPolicy={"enabled": True})


def test_side_channels_only_from_the_pools_own_pods(llama_policies: list[dict[str, Any]]) -> None:
    decode, prefill = pod("llama-8b", "decode"), pod("llama-8b", "prefill")
    p2p = lmcache.P2P_INIT_PORT
    for port in (ENGINE_HTTP, NIXL, p2p):
        assert allowed(llama_policies, decode, port, NAMESPACE, prefill)
        assert allowed(llama_policies, prefill, port, NAMESPACE, pod("llama-8b", "router"))
        # Another pool in the same namespace, and any other pod, may not.
        assert not allowed(llama_policies, decode, port, NAMESPACE, pod("other", "prefill"))
        assert not allowed(llama_policies, decode, port, NAMESPACE, {"app": "curl"})
    controller = pod("llama-8b", "lmcache-controller")
    for port in (lmcache.CONTROLLER_PULL_PORT, lmcache.CONTROLLER_REPLY_PORT, lmcache.CONTROLLER_HTTP_PORT):
        assert allowed(llama_policies, controller, port, NAMESPACE, decode)
        assert not allowed(llama_policies, controller, port, NAMESPACE, pod("llama-8b", "router"))
        assert not allowed(llama_policies, controller, port, NAMESPACE, {"app": "curl"})


def test_the_operator_reads_engine_metrics_but_no_side_channel(llama_policies: list[dict[str, Any]]) -> None:
    operator = dict(OPERATOR_POD_LABELS)
    decode = pod("llama-8b", "decode")
    assert allowed(llama_policies, decode, ENGINE_HTTP, "inferencepool-system", operator)
    assert not allowed(llama_policies, decode, NIXL, "inferencepool-system", operator)


def test_the_router_serves_every_client(llama_policies: list[dict[str, Any]]) -> None:
    router = pod("llama-8b", "router")
    assert allowed(llama_policies, router, ENGINE_HTTP, "elsewhere", {"app": "client"})


def test_extra_peers_reach_engine_http_only() -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    policies = policies_of("llama-3.1-8b.yaml", networkPolicy={"enabled": True, "allowFrom": [monitoring]})
    decode, prometheus = pod("llama-8b", "decode"), {"app": "prometheus"}
    assert allowed(policies, decode, ENGINE_HTTP, "monitoring", prometheus)
    assert not allowed(policies, decode, NIXL, "monitoring", prometheus)
    assert not allowed(policies, decode, ENGINE_HTTP, "default", prometheus)


def test_lmcache_pd_notifications_only_from_prefill() -> None:
    policies = policies_of(
        "llama-3.1-8b.yaml",
        networkPolicy={"enabled": True},
        kvTransfer={"connector": "LMCachePD"},
        kvCache={"p2p": {"enabled": False}},
        router={"replicas": 1},
    )
    router = pod("llama-8b", "router")
    assert allowed(policies, router, lmcache.PD_PROXY_PORT, NAMESPACE, pod("llama-8b", "prefill"))
    assert not allowed(policies, router, lmcache.PD_PROXY_PORT, NAMESPACE, pod("llama-8b", "decode"))
    assert not allowed(policies, router, lmcache.PD_PROXY_PORT, NAMESPACE, {"app": "curl"})
    assert "llama-8b-lmcache-controller" not in {p["metadata"]["name"] for p in policies}
