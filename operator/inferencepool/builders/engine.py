"""The prefill and decode pools: a StatefulSet of vLLM engines, its headless Service and its LMCache file.

The pod is one that runs on a GPU cluster as is (docs/engine-contract.md): `vllm serve` with the
kv-transfer config of the pool's role and the pool's own tensor-parallel size, GPUs as limits, /dev/shm for
NCCL, the model cache at HF_HOME, the HF token from a Secret, the pod's own IP and name from the downward API
(NIXL side channel, LMCache p2p), UCX transports that work without RDMA, one PYTHONHASHSEED per pool
(LMCache's prefix hashes must agree between pods), probes sized for model loading, and a drain on
termination that loses no KV hand-off. The fake engine image runs the same pod: its `vllm` shim accepts
exactly vLLM 0.33's flags.
"""

from __future__ import annotations

from typing import Final

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import InferencePool, PoolRole
from inferencepool.builders import lmcache
from inferencepool.builders.common import (
    CHECKSUM_ANNOTATION,
    Manifest,
    PoolRef,
    checksum,
    engine_container_security,
    engine_name,
    engine_pod_security,
    field_env,
    lmcache_config_name,
    lmcache_controller_name,
    merge_env,
    metadata,
    python_hash_seed,
    router_service_name,
    selector_labels,
    service_host,
    tcp_port,
)
from inferencepool.builders.kvcompat import kv_compat_hash
from inferencepool.builders.kvtransfer import KV_LEASE_SECONDS, kv_transfer_config_json
from inferencepool.builders.rollout import RoleStep

CONTAINER_NAME: Final = "vllm"
HTTP_PORT: Final = 8000
NIXL_SIDE_CHANNEL_PORT: Final = 5600
MODEL_CACHE_PATH: Final = "/models"
GPU_RESOURCE: Final = "nvidia.com/gpu"

# Model loading (download, weights to GPU, CUDA graph capture) takes minutes; a 70B at TP4 can take 5-10. The
# startup probe holds liveness off for up to STARTUP_BUDGET_SECONDS, then liveness restarts only a hung
# engine.
STARTUP_PROBE_PERIOD_SECONDS: Final = 10
STARTUP_BUDGET_SECONDS: Final = 30 * 60
# A scale-down in two steps. preStop: the router has stopped sending to the terminating pod; the hook waits
# until the engine runs and queues nothing (a stream may run for minutes: 32k tokens at 40 ms is 21 min).
# SIGTERM: vLLM drains for --shutdown-timeout seconds (its default, 0, aborts in-flight requests), and its
# drain lasts while a finished prefill still holds KV blocks for a decode engine that has not read them
# (scheduler.py has_requests counts requests whose blocks the connector holds), which is at most the NIXL
# lease. The grace period covers both, and the teardown.
SHUTDOWN_TIMEOUT_SECONDS: Final = KV_LEASE_SECONDS + 15
TEARDOWN_SECONDS: Final = 30
TERMINATION_GRACE_SECONDS: Final = 600
DRAIN_POLL_SECONDS: Final = 2
PRESTOP_BUDGET_SECONDS: Final = TERMINATION_GRACE_SECONDS - SHUTDOWN_TIMEOUT_SECONDS - TEARDOWN_SECONDS

# NIXL's UCX backend, and LMCache's nixl channel, on a cluster without RDMA: TCP between pods, CUDA copies
# to stage GPU memory, CUDA IPC between GPUs of one node. Users with InfiniBand/RoCE override UCX_TLS (e.g.
# "rc,cuda_copy,cuda_ipc" or "all") and any other UCX_ variable through engine.extraEnv.
UCX_ENV: Final = (("UCX_TLS", "tcp,cuda_copy,cuda_ipc"),)


def drain_script(port: int = HTTP_PORT, budget_seconds: int = PRESTOP_BUDGET_SECONDS) -> str:
    """preStop hook source (python3 is in both the vLLM and the fake-engine image).

    It waits until the engine reports no running and no waiting requests on its own /metrics, or until the
    budget is spent; Kubernetes sends SIGTERM only after it returns. The router has stopped sending to the pod
    by then (the pod is terminating). KV the engine still holds for remote decodes is vLLM's own drain's
    (--shutdown-timeout)."""
    return f"""\
import time, urllib.request
deadline = time.monotonic() + {budget_seconds}
while time.monotonic() < deadline:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        break
    busy = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))
    if busy == 0:
        break
    time.sleep({DRAIN_POLL_SECONDS})
"""


def lmcache_settings(pool: InferencePool, ref: PoolRef, role: PoolRole) -> lmcache.LMCacheSettings:
    spec = pool.spec
    kv_cache = spec.effective_kv_cache()
    pd_buffer = spec.pd_buffer_bytes() if spec.kv_transfer.connector == "LMCachePD" else None
    max_prefill = spec.max_model_len()
    return lmcache.LMCacheSettings(
        mode=spec.kv_transfer.connector,
        p2p=spec.p2p_enabled(),
        tensor_parallel_size=spec.tensor_parallel_size(role),
        chunk_size=kv_cache.chunk_size,
        cpu_offload_gib=kv_cache.cpu_offload_gib,
        disk_gib=kv_cache.disk.size_gib if kv_cache.disk is not None else 0,
        controller_host=service_host(ref, lmcache_controller_name(ref)),
        proxy_host=service_host(ref, router_service_name(ref)),
        pd_buffer_bytes=pd_buffer if pd_buffer is not None else 2 * lmcache.GIB,
        # LMCache refuses to start when the buffer cannot hold a prompt this long, rather than leaving such a
        # prompt's push to fail at run time; only claimed where the buffer was sized for it
        pd_max_prefill_len=max_prefill if max_prefill is not None and pd_buffer is not None else 0,
    )


def vllm_args(pool: InferencePool, role: PoolRole) -> list[str]:
    """Arguments after `vllm serve` (the image's own entrypoint in the vLLM image)."""
    spec = pool.spec
    engine = spec.engine
    args = [
        spec.model.name,
        "--host",
        "0.0.0.0",
        "--port",
        str(HTTP_PORT),
        "--served-model-name",
        spec.served_model_name(),
        "--tensor-parallel-size",
        str(spec.tensor_parallel_size(role)),
        "--gpu-memory-utilization",
        f"{engine.gpu_memory_utilization_percent / 100:g}",
        "--shutdown-timeout",
        str(SHUTDOWN_TIMEOUT_SECONDS),
    ]
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    args += spec.batch_args(role)
    if spec.model.revision is not None:
        args += ["--revision", spec.model.revision]
        if spec.model.tokenizer is None:
            # vLLM would default it to --revision too (config/model.py); explicit, so the pod says it
            args += ["--tokenizer-revision", spec.model.revision]
    if spec.model.tokenizer is not None:
        args += ["--tokenizer", spec.model.tokenizer]
    if spec.kv_transfer.connector == "LMCachePD":
        # A pushed chunk leaves LMCache's PD buffer only when retrieved, and vLLM does not retrieve what its
        # own prefix cache holds; LMCache's PD launcher turns prefix caching off on both engines too.
        args.append("--no-enable-prefix-caching")
    args += [
        "--kv-transfer-config",
        kv_transfer_config_json(role, spec.kv_transfer.connector, spec.uses_lmcache()),
    ]
    return args + list(engine.extra_args)


def engine_env(pool: InferencePool, ref: PoolRef, role: PoolRole) -> list[Manifest]:
    spec = pool.spec
    env: list[Manifest] = [
        field_env("POD_IP", "status.podIP"),
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        # NIXL peers dial this address to exchange block metadata; it must be the pod's routable IP.
        field_env("VLLM_NIXL_SIDE_CHANNEL_HOST", "status.podIP"),
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)},
        {"name": "PYTHONHASHSEED", "value": python_hash_seed(ref)},
        {"name": "HF_HOME", "value": MODEL_CACHE_PATH},
        *({"name": name, "value": value} for name, value in UCX_ENV),
    ]
    if spec.model.token_secret is not None:
        secret = spec.model.token_secret
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}}
        )
    if spec.uses_lmcache():
        env += lmcache.pod_env(role, lmcache_settings(pool, ref, role))
    return merge_env(env, spec.engine.extra_env)


def engine_ports(pool: InferencePool, ref: PoolRef, role: PoolRole) -> list[Manifest]:
    spec = pool.spec
    ports = [tcp_port("http", HTTP_PORT)]
    if spec.kv_transfer.connector == "Nixl":
        ports.append(tcp_port("nixl", NIXL_SIDE_CHANNEL_PORT))
    if spec.uses_lmcache():
        ports += lmcache.container_ports(role, lmcache_settings(pool, ref, role))
    return ports


def engine_resources(pool: InferencePool, role: PoolRole) -> Manifest:
    """The user's resources with the pool's GPUs as limits (extended resources are requested by their
    limit), and LMCache's CPU tier (every rank's share of cpuOffloadGiB) as the memory request when the
    user requested none."""
    spec = pool.spec
    resources: Manifest = {key: dict(value) for key, value in spec.pool(role).resources.items()}
    gpus = spec.gpus_per_replica(role)
    if gpus > 0:
        resources["limits"] = {**resources.get("limits", {}), GPU_RESOURCE: str(gpus)}
    offload = lmcache_cpu_gib(pool)
    if offload > 0 and "memory" not in resources.get("requests", {}):
        resources["requests"] = {**resources.get("requests", {}), "memory": f"{offload}Gi"}
    return resources


def lmcache_cpu_gib(pool: InferencePool) -> int:
    """CPU memory LMCache holds in a pod, all ranks together (LMCachePD keeps no CPU tier)."""
    spec = pool.spec
    if spec.kv_cache is None or spec.kv_transfer.connector != "Nixl":
        return 0
    return spec.kv_cache.cpu_offload_gib


def _http_probe(path: str, period: int, failures: int, timeout: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": "http", "scheme": "HTTP"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
        "successThreshold": 1,
    }


def engine_container(pool: InferencePool, ref: PoolRef, role: PoolRole) -> Manifest:
    spec = pool.spec
    mounts: list[Manifest] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "model-cache", "mountPath": MODEL_CACHE_PATH},
    ]
    if spec.uses_lmcache():
        mounts.append({"name": "lmcache-config", "mountPath": lmcache.CONFIG_DIR, "readOnly": True})
        kv_cache = spec.effective_kv_cache()
        if kv_cache.disk is not None and spec.kv_transfer.connector == "Nixl":
            mounts.append({"name": "lmcache-disk", "mountPath": lmcache.LOCAL_DISK_PATH})
    container: Manifest = {
        "name": CONTAINER_NAME,
        "image": spec.engine.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["vllm", "serve"],
        "args": vllm_args(pool, role),
        "env": engine_env(pool, ref, role),
        "ports": engine_ports(pool, ref, role),
        "startupProbe": _http_probe(
            "/health", STARTUP_PROBE_PERIOD_SECONDS, STARTUP_BUDGET_SECONDS // STARTUP_PROBE_PERIOD_SECONDS, 5
        ),
        "readinessProbe": _http_probe("/health", 5, 3, 5),
        # /health answers 503 once the engine core is dead; a minute of that means it will not come back.
        "livenessProbe": _http_probe("/health", 10, 6, 10),
        "lifecycle": {"preStop": {"exec": {"command": ["python3", "-c", drain_script()]}}},
        "volumeMounts": mounts,
        "securityContext": engine_container_security(spec.pool(role).security_context),
    }
    resources = engine_resources(pool, role)
    if resources:
        container["resources"] = resources
    return container


def engine_volumes(pool: InferencePool, ref: PoolRef, role: PoolRole) -> list[Manifest]:
    spec = pool.spec
    # NCCL and vLLM's worker processes share tensors through /dev/shm; the container default of 64 MiB is too
    # small.
    volumes: list[Manifest] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if spec.model.cache is not None:
        claim = {"claimName": spec.model.cache.persistent_volume_claim}
        volumes.append({"name": "model-cache", "persistentVolumeClaim": claim})
    else:
        volumes.append({"name": "model-cache", "emptyDir": {}})
    if spec.uses_lmcache():
        config_map = {"name": lmcache_config_name(ref, role), "defaultMode": 0o444}
        volumes.append({"name": "lmcache-config", "configMap": config_map})
        kv_cache = spec.effective_kv_cache()
        if kv_cache.disk is not None and spec.kv_transfer.connector == "Nixl":
            volumes.append({"name": "lmcache-disk", "emptyDir": {"sizeLimit": f"{kv_cache.disk.size_gib}Gi"}})
    return volumes


def gpu_tolerations(pool: InferencePool, role: PoolRole) -> list[Manifest]:
    """GPU node pools are commonly tainted nvidia.com/gpu:NoSchedule; GPU pods tolerate that taint."""
    if pool.spec.gpus_per_replica(role) == 0:
        return []
    return [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]


PLACEMENT_WEIGHT: Final = 100  # the most a preferred term weighs: the domain matters more than spreading


def engine_affinity(pool: InferencePool, ref: PoolRef, role: PoolRole) -> Manifest:
    """The pool's scheduling.affinity (passed through), with spec.placement's term added: affinity to the
    pool's engine pods of either role in the same topology domain. The first engine pod matches its own term,
    which the scheduler accepts with no other pod yet (Kubernetes' rule for a pod that matches its own
    affinity), and picks the domain the others follow."""
    placement = pool.spec.placement
    user: Manifest = dict(pool.spec.pool(role).scheduling.affinity)
    if placement is None:
        return user
    term: Manifest = {
        "labelSelector": {
            "matchLabels": {labels.LABEL_POOL: ref.name},
            "matchExpressions": [
                {"key": labels.LABEL_ROLE, "operator": "In", "values": ["prefill", "decode"]}
            ],
        },
        "topologyKey": placement.topology_key,
    }
    pod_affinity: Manifest = dict(user.get("podAffinity") or {})
    if placement.mode == "Required":
        key, entry = "requiredDuringSchedulingIgnoredDuringExecution", term
    else:
        key = "preferredDuringSchedulingIgnoredDuringExecution"
        entry = {"weight": PLACEMENT_WEIGHT, "podAffinityTerm": term}
    pod_affinity[key] = [*pod_affinity.get(key, []), entry]
    return {**user, "podAffinity": pod_affinity}


def engine_pod_template(pool: InferencePool, ref: PoolRef, role: PoolRole) -> Manifest:
    spec = pool.spec
    scheduling = spec.pool(role).scheduling
    # the router pairs prefill and decode pods only within one KV-compatibility revision
    pod_labels = {**labels.standard_labels(ref.name, role), labels.LABEL_KV_COMPAT: kv_compat_hash(pool)}
    annotations: dict[str, str] = {}
    if spec.model.revision is not None:
        annotations[labels.ANNOTATION_MODEL_REVISION] = spec.model.revision
    if spec.uses_lmcache():
        annotations[CHECKSUM_ANNOTATION] = checksum(lmcache_config(pool, ref, role)["data"])
    pod_spec: Manifest = {
        "securityContext": engine_pod_security(spec.pool(role).pod_security_context),
        "containers": [engine_container(pool, ref, role)],
        "volumes": engine_volumes(pool, ref, role),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        # Engines never call the Kubernetes API.
        "automountServiceAccountToken": False,
        # Service links would inject <SERVICE>_PORT variables; a Service named "vllm" sets VLLM_PORT, which
        # vLLM reads as its own setting and fails on.
        "enableServiceLinks": False,
    }
    tolerations = [t for t in gpu_tolerations(pool, role) if t not in scheduling.tolerations]
    tolerations += scheduling.tolerations
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(scheduling.node_selector)
    affinity = engine_affinity(pool, ref, role)
    if affinity:
        pod_spec["affinity"] = affinity
    template_meta: Manifest = {"labels": pod_labels}
    if annotations:
        template_meta["annotations"] = annotations
    return {"metadata": template_meta, "spec": pod_spec}


def engine_statefulset(
    pool: InferencePool, ref: PoolRef, role: PoolRole, step: RoleStep | None = None
) -> Manifest:
    """The pool's StatefulSet; without `replicas` when the autoscaler owns that field. `step`: where a
    coordinated rollout (builders/rollout.py) stands: the partition, and the surge where the operator owns
    replicas (the autoscaler's field manager writes both replicas and the surge annotation where it does)."""
    pool_spec = pool.spec.pool(role)
    name = engine_name(ref, role)
    step = step or RoleStep()
    update: Manifest = {"type": "RollingUpdate"}
    if step.partition is not None:
        update["rollingUpdate"] = {"partition": step.partition}
    spec: Manifest = {
        "serviceName": name,
        # Engines are independent of each other; starting them one by one would add a model load per replica.
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": selector_labels(ref, role)},
        "template": engine_pod_template(pool, ref, role),
        "updateStrategy": update,
    }
    meta = metadata(ref, name, role)
    if not pool_spec.autoscales():
        spec["replicas"] = pool_spec.initial_replicas() + step.surge
        if step.surge:
            meta["annotations"] = {**meta.get("annotations", {}), labels.ANNOTATION_SURGE: str(step.surge)}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta, "spec": spec}


def engine_service(pool: InferencePool, ref: PoolRef, role: PoolRole) -> Manifest:
    """Headless: gives each engine pod a stable DNS name; the router reads pod IPs from the Pods
    themselves."""
    name = engine_name(ref, role)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(ref, name, role),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(ref, role),
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def lmcache_config(pool: InferencePool, ref: PoolRef, role: PoolRole) -> Manifest:
    settings = lmcache_settings(pool, ref, role)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(ref, lmcache_config_name(ref, role), role),
        "data": {lmcache.CONFIG_KEY: lmcache.engine_config_yaml(role, settings)},
    }


def engine_children(
    pool: InferencePool, ref: PoolRef, role: PoolRole, step: RoleStep | None = None
) -> list[Manifest]:
    """Every object of one engine pool, in the order they should be applied (config before its readers)."""
    children: list[Manifest] = []
    if pool.spec.uses_lmcache():
        children.append(lmcache_config(pool, ref, role))
    children += [engine_service(pool, ref, role), engine_statefulset(pool, ref, role, step)]
    return children
