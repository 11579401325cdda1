"""The router: its config (a RouterConfig in a ConfigMap), Deployment, the pool's Service, and
least-privilege RBAC.

The router discovers engine pods from Pod objects (the API server refuses loopback and many CNI addresses in
EndpointSlices are not what NIXL needs anyway), so its ServiceAccount may get, list and watch Pods in the
pool's namespace and nothing else; it holds no other credential (no HF token), and its pod meets Pod Security
"restricted". Its config arrives as text in an env var from the ConfigMap; the pod
template carries a checksum of that text, so a config change rolls the router.
"""

from __future__ import annotations

from typing import Final

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import lmcache
from inferencepool.builders.common import (
    CHECKSUM_ANNOTATION,
    Manifest,
    PoolRef,
    checksum,
    field_env,
    metadata,
    restricted_container_security,
    restricted_pod_security,
    router_name,
    router_service_name,
    scratch_mount,
    scratch_volume,
    selector_labels,
    tcp_port,
)
from inferencepool.router.config import (
    ENV_CONFIG,
    AdaptiveThresholdConfig,
    LMCachePDConfig,
    OverloadConfig,
    PrefixAffinityConfig,
    RouterConfig,
)

CONTAINER_NAME: Final = "router"
HTTP_PORT: Final = 8000
SERVICE_PORT: Final = 80
CONFIG_KEY: Final = "config.yaml"
# Past the router's own drain (in-flight streams finish after SIGTERM) plus the endpoint removal delay.
TERMINATION_MARGIN_SECONDS: Final = 30
PRESTOP_SLEEP_SECONDS: Final = 5


def router_config(pool: InferencePool, ref: PoolRef) -> RouterConfig:
    spec = pool.spec
    router = spec.router
    prefill_target = spec.prefill.autoscaling.target if spec.prefill.autoscaling is not None else None
    decode_target = spec.decode.autoscaling.target if spec.decode.autoscaling is not None else None
    defaults = AdaptiveThresholdConfig()
    # The router moves the threshold on the same latency targets the autoscalers hold the pools to. Only
    # what the router reads goes into its config (whose checksum rolls it): the TTFT target always (the
    # route's cost is weighed against it); the ITL target and the percentile only while the threshold adapts.
    adapts = router.adaptive_threshold.enabled and router.policy == "LengthAware"
    ttft = prefill_target.ttft_milliseconds if prefill_target is not None else None
    itl = decode_target.itl_milliseconds if decode_target is not None and adapts else None
    known_target = (prefill_target or decode_target) if adapts else None
    adaptive = AdaptiveThresholdConfig(
        enabled=router.adaptive_threshold.enabled,
        min_tokens=router.adaptive_threshold.min_tokens,
        max_tokens=router.adaptive_threshold.max_tokens,
        ttft_target_milliseconds=ttft or defaults.ttft_target_milliseconds,
        itl_target_milliseconds=itl or defaults.itl_target_milliseconds,
        percentile=known_target.percentile if known_target is not None else defaults.percentile,
    )
    tp = spec.tensor_parallel_size("decode")  # the receivers: the decode pool's ranks
    shedding = router.overload
    overload = OverloadConfig(
        enabled=shedding.enabled,
        max_queued_requests=shedding.max_queued_requests,
        max_queue_milliseconds=shedding.max_queue_milliseconds,  # unset: half the TTFT target, in the router
        retry_after_seconds=shedding.retry_after_seconds,
    )
    return RouterConfig(
        pool=ref.name,
        namespace=ref.namespace,
        served_model_name=spec.served_model_name(),
        policy=router.policy,
        prefill_threshold_tokens=router.prefill_threshold_tokens,
        adaptive_threshold=adaptive,
        prefix_affinity=PrefixAffinityConfig(
            enabled=router.prefix_affinity, block_tokens=spec.effective_kv_cache().chunk_size
        ),
        transfer_mode=spec.kv_transfer.connector,
        role_lending=spec.lends_roles(),
        overload=overload,
        lmcache_pd=LMCachePDConfig(
            proxy_port=lmcache.PD_PROXY_PORT,
            receiver_init_ports=lmcache.pd_init_ports(tp),
            receiver_alloc_ports=lmcache.pd_alloc_ports(tp),
        ),
        tokenizer=spec.model.tokenizer or spec.model.name,
        engine_port_name="http",
    )


def router_configmap(pool: InferencePool, ref: PoolRef) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(ref, router_name(ref), "router"),
        "data": {CONFIG_KEY: router_config(pool, ref).to_yaml()},
    }


def router_service_account(ref: PoolRef) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(ref, router_name(ref), "router"),
    }


def router_role(ref: PoolRef) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(ref, router_name(ref), "router"),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }


def router_role_binding(ref: PoolRef) -> Manifest:
    name = router_name(ref)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(ref, name, "router"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ref.namespace}],
    }


def router_deployment(pool: InferencePool, ref: PoolRef) -> Manifest:
    spec = pool.spec
    name = router_name(ref)
    config = router_config(pool, ref)
    env: list[Manifest] = [
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        {"name": ENV_CONFIG, "valueFrom": {"configMapKeyRef": {"name": name, "key": CONFIG_KEY}}},
    ]
    # No HF_TOKEN: the router never downloads (it reads a tokenizer from its HF cache or estimates), so the
    # one credential of the pool stays with the engines.
    ports = [tcp_port("http", HTTP_PORT)]
    if spec.kv_transfer.connector == "LMCachePD":
        ports.append(tcp_port("pd-proxy", lmcache.PD_PROXY_PORT))
    container: Manifest = {
        "name": CONTAINER_NAME,
        "image": spec.router.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["inferencepool", "router", "--host", "0.0.0.0", "--port", str(HTTP_PORT)],
        "env": env,
        "ports": ports,
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "http", "scheme": "HTTP"},
            "periodSeconds": 5,
            "failureThreshold": 2,
            "timeoutSeconds": 2,
            "successThreshold": 1,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http", "scheme": "HTTP"},
            "periodSeconds": 10,
            "failureThreshold": 3,
            "timeoutSeconds": 5,
            "successThreshold": 1,
        },
        # Gives Services and peers time to stop sending before SIGTERM starts the router's own drain.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_SECONDS}}},
        "securityContext": restricted_container_security(spec.router.security_context),
        "volumeMounts": [scratch_mount()],
    }
    if spec.router.resources:
        container["resources"] = spec.router.resources
    template: Manifest = {
        "metadata": {
            "labels": metadata(ref, name, "router")["labels"],
            "annotations": {CHECKSUM_ANNOTATION: checksum(config.to_wire())},
        },
        "spec": {
            "serviceAccountName": name,
            "securityContext": restricted_pod_security(spec.router.pod_security_context),
            "containers": [container],
            "volumes": [scratch_volume()],
            "terminationGracePeriodSeconds": PRESTOP_SLEEP_SECONDS
            + config.timeouts.drain_seconds
            + TERMINATION_MARGIN_SECONDS,
            "enableServiceLinks": False,
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(ref, name, "router"),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": selector_labels(ref, "router")},
            "template": template,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        },
    }


def router_service(pool: InferencePool, ref: PoolRef) -> Manifest:
    """The pool's entry point: http://<pool>.<namespace>.svc/v1/..."""
    ports: list[Manifest] = [{"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}]
    if pool.spec.kv_transfer.connector == "LMCachePD":
        # Prefill engines push their PD notifications here (LMCache pd_proxy_host/pd_proxy_port).
        ports.append(
            {"name": "pd-proxy", "port": lmcache.PD_PROXY_PORT, "targetPort": "pd-proxy", "protocol": "TCP"}
        )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(ref, router_service_name(ref), "router"),
        "spec": {"type": "ClusterIP", "selector": selector_labels(ref, "router"), "ports": ports},
    }


def router_endpoint(ref: PoolRef) -> str:
    return f"http://{router_service_name(ref)}.{ref.namespace}.svc"  # SERVICE_PORT is HTTP's default


def router_children(pool: InferencePool, ref: PoolRef) -> list[Manifest]:
    return [
        router_service_account(ref),
        router_role(ref),
        router_role_binding(ref),
        router_configmap(pool, ref),
        router_service(pool, ref),
        router_deployment(pool, ref),
    ]
