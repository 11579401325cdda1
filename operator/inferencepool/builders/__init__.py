"""Pure builders: an InferencePool in, the manifests of all its children out (no I/O, no Kubernetes client).

`pool_children(pool)` lists every object the operator applies for a pool, in apply order: configuration and
identities before the workloads that read them.
"""

from __future__ import annotations

from inferencepool.api.v1alpha1 import POOL_ROLES, InferencePool
from inferencepool.builders.common import Manifest, PoolRef
from inferencepool.builders.disruption import disruption_budgets
from inferencepool.builders.engine import engine_children
from inferencepool.builders.lmcache_controller import controller_children
from inferencepool.builders.network import network_policies
from inferencepool.builders.rollout import RolloutPlan
from inferencepool.builders.router import router_children, router_endpoint

__all__ = ["CHILD_KINDS", "Manifest", "PoolRef", "pool_children", "router_endpoint"]

# Every (apiVersion, kind) that pool_children can produce: what the benchmark and the tests list to find a
# pool's children (a unit test keeps it in step with the builders).
CHILD_KINDS: list[tuple[str, str]] = [
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
]


def pool_children(pool: InferencePool, rollout: RolloutPlan | None = None) -> list[Manifest]:
    """`rollout`: where a coordinated rollout of the engine pools stands (None: none in progress)."""
    ref = PoolRef.of(pool)
    children: list[Manifest] = [*controller_children(pool, ref)]
    for role in POOL_ROLES:
        children += engine_children(pool, ref, role, rollout.step(role) if rollout is not None else None)
    children += router_children(pool, ref)
    children += disruption_budgets(ref)
    children += network_policies(pool, ref)
    return children
