"""NetworkPolicies (spec.networkPolicy.enabled): only the pool's own pods reach its engines' side channels.

- Engines: any port from the pool's router and engines (HTTP, the NIXL side channel and UCX's TCP transfers,
  LMCache p2p and PD ports); the HTTP port also from the operator (its autoscaler reads /metrics) and from the
  peers the user lists in allowFrom (Prometheus, say).
- LMCache controller: any port from the pool's engines only.
- Router: HTTP from anywhere (it is the pool's entry point); its LMCache PD notification port only from the
  pool's prefill engines.
Only ingress is restricted: engines pull weights from outside, and RDMA traffic bypasses NetworkPolicy anyway.
The operator pod is matched by its labels in any namespace (the chart's and deploy/operator/'s), since the
builders do not know where it runs; what that admits is the engines' HTTP API, which the router serves to
every client anyway.
"""

from __future__ import annotations

from typing import Any, Final

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import POOL_ROLES, InferencePool, PoolRole
from inferencepool.builders import lmcache
from inferencepool.builders.common import (
    Manifest,
    PoolRef,
    engine_name,
    lmcache_controller_name,
    metadata,
    router_name,
    selector_labels,
)

# The operator Deployment's selector labels (charts/inferencepool-operator/templates/_helpers.tpl).
OPERATOR_POD_LABELS: Final = {labels.LABEL_NAME: labels.APP_NAME, labels.LABEL_COMPONENT: "operator"}
ENGINE_HTTP_PORT_NAME: Final = "http"
# Every namespace (each carries its name in this label). `{}` says the same, but the builders write no empty
# maps: where the API server drops one, server-side apply would see a difference on every reconcile.
ANY_NAMESPACE: Final = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "Exists"}]}


def _pods_of(ref: PoolRef, roles: list[str]) -> Manifest:
    """A peer: pods of this pool (in its namespace) in one of `roles`."""
    return {
        "podSelector": {
            "matchLabels": {labels.LABEL_POOL: ref.name},
            "matchExpressions": [{"key": labels.LABEL_ROLE, "operator": "In", "values": roles}],
        }
    }


def _tcp(port: int | str) -> Manifest:
    return {"port": port, "protocol": "TCP"}


def _policy(ref: PoolRef, name: str, role: labels.Role, selector: Manifest, ingress: list[Any]) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(ref, name, role),
        "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def engine_policy(pool: InferencePool, ref: PoolRef, role: PoolRole) -> Manifest:
    operator = {"namespaceSelector": ANY_NAMESPACE, "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}
    http_peers = [operator, *pool.spec.network_policy.allow_from]
    ingress = [
        {"from": [_pods_of(ref, ["router", *labels.ENGINE_ROLES])]},
        {"from": http_peers, "ports": [_tcp(ENGINE_HTTP_PORT_NAME)]},
    ]
    selector = {"matchLabels": selector_labels(ref, role)}
    return _policy(ref, engine_name(ref, role), role, selector, ingress)


def controller_policy(ref: PoolRef) -> Manifest:
    role: labels.Role = "lmcache-controller"
    selector = {"matchLabels": selector_labels(ref, role)}
    ingress = [{"from": [_pods_of(ref, list(labels.ENGINE_ROLES))]}]
    return _policy(ref, lmcache_controller_name(ref), role, selector, ingress)


def router_policy(pool: InferencePool, ref: PoolRef) -> Manifest:
    selector = {"matchLabels": selector_labels(ref, "router")}
    ingress: list[Any] = [{"ports": [_tcp(ENGINE_HTTP_PORT_NAME)]}]
    if pool.spec.kv_transfer.connector == "LMCachePD":
        ingress.append({"from": [_pods_of(ref, ["prefill"])], "ports": [_tcp(lmcache.PD_PROXY_PORT)]})
    return _policy(ref, router_name(ref), "router", selector, ingress)


def network_policies(pool: InferencePool, ref: PoolRef) -> list[Manifest]:
    if not pool.spec.network_policy.enabled:
        return []
    policies = [*(engine_policy(pool, ref, role) for role in POOL_ROLES), router_policy(pool, ref)]
    if pool.spec.p2p_enabled():
        policies.append(controller_policy(ref))
    return policies
