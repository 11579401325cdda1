"""Every child of a pool: names, labels, owner references, router config and RBAC, LMCache controller."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.unit.builders_examples import child, load_pool

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import pool_children, router_endpoint
from inferencepool.builders.common import CHECKSUM_ANNOTATION, PoolRef
from inferencepool.builders.kvcompat import kv_compat_hash
from inferencepool.router.config import ENV_CONFIG, parse_config

UID = "1f0c7a52-0000-4000-8000-000000000001"


def test_llama_example_renders_every_child_once() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    rendered = Counter((c["kind"], c["metadata"]["name"]) for c in pool_children(pool))
    assert rendered == Counter(
        {
            ("StatefulSet", "llama-8b-prefill"): 1,
            ("StatefulSet", "llama-8b-decode"): 1,
            ("Service", "llama-8b-prefill"): 1,
            ("Service", "llama-8b-decode"): 1,
            ("ConfigMap", "llama-8b-prefill-lmcache"): 1,
            ("ConfigMap", "llama-8b-decode-lmcache"): 1,
            ("Deployment", "llama-8b-router"): 1,
            ("Service", "llama-8b"): 1,
            ("ConfigMap", "llama-8b-router"): 1,
            ("ServiceAccount", "llama-8b-router"): 1,
            ("Role", "llama-8b-router"): 1,
            ("RoleBinding", "llama-8b-router"): 1,
            ("Deployment", "llama-8b-lmcache-controller"): 1,
            ("Service", "llama-8b-lmcache-controller"): 1,
            ("PodDisruptionBudget", "llama-8b-prefill"): 1,
            ("PodDisruptionBudget", "llama-8b-decode"): 1,
            ("PodDisruptionBudget", "llama-8b-router"): 1,
        }
    )


def test_every_child_and_pod_template_carries_owner_and_standard_labels() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    for c in pool_children(pool):
        meta = c["metadata"]
        assert meta["namespace"] == "prod"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "serving.inferencepool.dev/v1alpha1",
                "kind": "InferencePool",
                "name": "llama-8b",
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        role = meta["labels"][labels.LABEL_ROLE]
        assert meta["labels"] == labels.standard_labels("llama-8b", role)
        template = c.get("spec", {}).get("template")
        if template is not None:
            pod_labels = dict(template["metadata"]["labels"])
            if role in ("prefill", "decode"):  # engine pods also carry their KV-compatibility revision
                assert pod_labels.pop(labels.LABEL_KV_COMPAT) == kv_compat_hash(pool)
            assert pod_labels == meta["labels"]
            selector = c["spec"]["selector"]["matchLabels"]
            assert selector.items() <= template["metadata"]["labels"].items()


def test_only_engine_pods_match_the_routers_discovery_selector() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    selector = labels.pool_selector("llama-8b")
    assert "prefill,decode" in selector
    roles = {
        c["metadata"]["labels"][labels.LABEL_ROLE]
        for c in pool_children(pool)
        if c["kind"] in ("StatefulSet", "Deployment")
    }
    assert roles == {"prefill", "decode", "router", "lmcache-controller"}


def test_router_config_round_trips_through_the_routers_own_parser() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    configmap = child(pool, "ConfigMap", "llama-8b-router")
    config = parse_config(configmap["data"]["config.yaml"], "configmap")
    assert (config.pool, config.namespace) == ("llama-8b", "prod")
    assert config.served_model_name == "llama-8b"
    assert config.policy == "LengthAware"
    assert config.prefill_threshold_tokens == 4096
    assert config.adaptive_threshold.enabled
    assert (config.adaptive_threshold.min_tokens, config.adaptive_threshold.max_tokens) == (1024, 16384)
    assert config.adaptive_threshold.ttft_target_milliseconds == 800
    assert config.adaptive_threshold.itl_target_milliseconds == 40
    assert config.prefix_affinity.enabled and config.prefix_affinity.block_tokens == 256
    assert config.transfer_mode == "Nixl"
    assert config.engine_port_name == "http"
    assert config.static is None


def test_router_deployment_reads_config_from_env_and_rolls_on_config_change() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    deployment = child(pool, "Deployment", "llama-8b-router")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["inferencepool", "router", "--host", "0.0.0.0", "--port", "8000"]
    env = {e["name"]: e for e in container["env"]}
    assert env[ENV_CONFIG]["valueFrom"] == {
        "configMapKeyRef": {"name": "llama-8b-router", "key": "config.yaml"}
    }
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in container["ports"]
    assert pod["serviceAccountName"] == "llama-8b-router"
    assert deployment["spec"]["replicas"] == 2
    assert container["image"] == "inferencepool/router:0.1.0"
    # The drain the router does after SIGTERM fits in the grace period.
    config = parse_config(child(pool, "ConfigMap", "llama-8b-router")["data"]["config.yaml"], "x")
    assert pod["terminationGracePeriodSeconds"] > config.timeouts.drain_seconds

    checksum = deployment["spec"]["template"]["metadata"]["annotations"][CHECKSUM_ANNOTATION]
    changed = load_pool("llama-3.1-8b.yaml", router__prefillThresholdTokens=8192)
    changed_checksum = child(changed, "Deployment", "llama-8b-router")["spec"]["template"]["metadata"][
        "annotations"
    ][CHECKSUM_ANNOTATION]
    assert changed_checksum != checksum


def test_router_rbac_is_get_list_watch_pods_in_its_namespace_only() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    role = child(pool, "Role", "llama-8b-router")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = child(pool, "RoleBinding", "llama-8b-router")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "llama-8b-router",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llama-8b-router", "namespace": "prod"}]


def test_pool_service_is_the_entry_point() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    service = child(pool, "Service", "llama-8b")
    assert service["spec"]["selector"] == {labels.LABEL_POOL: "llama-8b", labels.LABEL_ROLE: "router"}
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert router_endpoint(PoolRef("llama-8b", "prod", UID)) == "http://llama-8b.prod.svc"
    headless = child(pool, "Service", "llama-8b-decode")
    assert headless["spec"]["clusterIP"] == "None"


def test_pd_mode_router_receives_notifications_on_its_service() -> None:
    pool = load_pool(
        "llama-3.1-8b.yaml",
        kvTransfer={"connector": "LMCachePD"},
        kvCache={"chunkSize": 256},
        router={"replicas": 1},  # LMCache sends its notifications to one router
    )
    ports = {p["name"]: p["port"] for p in child(pool, "Service", "llama-8b")["spec"]["ports"]}
    assert ports == {"http": 80, "pd-proxy": 7500}
    config = parse_config(child(pool, "ConfigMap", "llama-8b-router")["data"]["config.yaml"], "x")
    assert config.transfer_mode == "LMCachePD"
    assert config.lmcache_pd.proxy_port == 7500
    assert config.lmcache_pd.receiver_init_ports == [7300]


def test_lmcache_controller_matches_what_engines_dial() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    deployment = child(pool, "Deployment", "llama-8b-lmcache-controller")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][0] == "lmcache_controller"
    assert (
        container["command"][container["command"].index("--monitor-ports") + 1]
        == '{"pull":8300,"reply":8400}'
    )
    assert container["readinessProbe"]["tcpSocket"] == {"port": "http"}
    assert container["image"] == pool.spec.engine.image  # no controllerImage given
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    service = child(pool, "Service", "llama-8b-lmcache-controller")
    assert {p["port"] for p in service["spec"]["ports"]} == {9000, 8300, 8400}


def test_disruption_budgets_never_block_a_drain_of_a_one_replica_pool() -> None:
    pool = load_pool("demo-cpu.yaml")
    budgets = [c for c in pool_children(pool) if c["kind"] == "PodDisruptionBudget"]
    assert {b["metadata"]["name"] for b in budgets} == {"demo-prefill", "demo-decode", "demo-router"}
    assert all(b["spec"] == {"maxUnavailable": 1, "selector": b["spec"]["selector"]} for b in budgets)


def test_rendering_is_deterministic_and_canonical() -> None:
    first, second = (
        pool_children(load_pool("llama-3.1-8b.yaml")),
        pool_children(load_pool("llama-3.1-8b.yaml")),
    )
    assert first == second

    def walk(node: Any) -> None:
        # Empty maps and lists are left out (the API server drops them, and SSA would then see a difference);
        # ports always name their protocol, which is part of their merge key.
        if isinstance(node, dict):
            if "containerPort" in node or "targetPort" in node:
                assert node["protocol"] == "TCP"
            for key, value in node.items():
                if key not in ("emptyDir",):
                    assert value not in ({}, []), key
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for c in first:
        walk(c)


def test_a_pool_in_another_namespace_names_its_services_there() -> None:
    document: dict[str, Any] = {
        "apiVersion": "serving.inferencepool.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "team-a", "uid": UID},
        "spec": {"model": {"name": "m"}, "kvCache": {"p2p": {"enabled": True}}},
    }
    pool = InferencePool.model_validate(document)
    lmcache_file = child(pool, "ConfigMap", "p-decode-lmcache")["data"]["lmcache.yaml"]
    assert "p-lmcache-controller.team-a.svc:8300" in lmcache_file


def test_child_kinds_lists_every_kind_the_builders_produce() -> None:
    from inferencepool.builders import CHILD_KINDS

    produced = {
        (child["apiVersion"], child["kind"])
        for name in ("llama-3.1-8b.yaml", "demo-cpu.yaml")
        for child in pool_children(load_pool(name))
    }
    assert produced == set(CHILD_KINDS)
