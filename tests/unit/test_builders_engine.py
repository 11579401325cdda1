"""Engine pools: the StatefulSet, pod and container a GPU cluster would run, rendered from the examples."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from tests.unit.builders_examples import child, load_pool

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import engine, pool_children
from inferencepool.builders.common import CHECKSUM_ANNOTATION, PoolRef


def container(statefulset: dict[str, Any]) -> dict[str, Any]:
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in c["env"]}


def arg_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.fixture
def llama() -> InferencePool:
    return load_pool("llama-3.1-8b.yaml")


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_engine_runs_vllm_serve_with_the_contract_flags(llama: InferencePool, role: str) -> None:
    c = container(child(llama, "StatefulSet", f"llama-8b-{role}"))
    assert c["command"] == ["vllm", "serve"]
    args = c["args"]
    assert args[0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert arg_value(args, "--host") == "0.0.0.0"
    assert arg_value(args, "--port") == "8000"
    assert arg_value(args, "--served-model-name") == "llama-8b"
    assert arg_value(args, "--tensor-parallel-size") == "1"
    assert arg_value(args, "--max-model-len") == "32768"
    assert arg_value(args, "--gpu-memory-utilization") == "0.9"
    transfer = json.loads(arg_value(args, "--kv-transfer-config"))
    # NIXL for the hand-off, LMCache for offload and p2p sharing, both through vLLM's MultiConnector.
    assert transfer["kv_connector"] == "MultiConnector"
    connectors = transfer["kv_connector_extra_config"]["connectors"]
    assert [x["kv_connector"] for x in connectors] == ["NixlConnector", "LMCacheConnectorV1"]
    assert all(x["kv_role"] == "kv_both" for x in connectors)
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in c["ports"]
    assert {"name": "nixl", "containerPort": 5600, "protocol": "TCP"} in c["ports"]


def test_pod_identity_comes_from_the_downward_api(llama: InferencePool) -> None:
    env = env_of(container(child(llama, "StatefulSet", "llama-8b-decode")))
    pod_ip = {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == pod_ip
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert env["LMCACHE_P2P_HOST"] == pod_ip
    assert env["LMCACHE_LMCACHE_INSTANCE_ID"] == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}
    }
    assert env["LMCACHE_CONFIG_FILE"] == "/etc/lmcache/lmcache.yaml"
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    assert env["HF_HOME"] == engine.MODEL_CACHE_PATH


def test_every_lmcache_process_of_a_pool_shares_one_hash_seed(llama: InferencePool) -> None:
    seeds = {
        env_of(container(child(llama, "StatefulSet", f"llama-8b-{role}")))["PYTHONHASHSEED"]
        for role in ("prefill", "decode")
    }
    controller = child(llama, "Deployment", "llama-8b-lmcache-controller")
    seeds.add(env_of(controller["spec"]["template"]["spec"]["containers"][0])["PYTHONHASHSEED"])
    assert len(seeds) == 1
    other = load_pool("llama-3.1-8b.yaml")
    other.metadata["name"] = "other"
    assert env_of(container(child(other, "StatefulSet", "other-decode")))["PYTHONHASHSEED"] not in seeds


def test_gpu_pod_shape(llama: InferencePool) -> None:
    sts = child(llama, "StatefulSet", "llama-8b-prefill")
    pod = sts["spec"]["template"]["spec"]
    c = container(sts)
    assert c["resources"]["limits"] == {"memory": "96Gi", "nvidia.com/gpu": "1"}
    assert c["resources"]["requests"] == {"cpu": "8", "memory": "64Gi"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "model-cache"}
    assert volumes["lmcache-config"]["configMap"]["name"] == "llama-8b-prefill-lmcache"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == {"dshm": "/dev/shm", "model-cache": "/models", "lmcache-config": "/etc/lmcache"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    # The example tolerates the GPU taint itself; the default toleration is not added a second time.
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["enableServiceLinks"] is False
    assert pod["automountServiceAccountToken"] is False
    assert sts["spec"]["podManagementPolicy"] == "Parallel"


def test_probes_leave_time_for_model_loading_and_termination_drains(llama: InferencePool) -> None:
    sts = child(llama, "StatefulSet", "llama-8b-decode")
    c = container(sts)
    startup = c["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTP"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= 300
    hook = c["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["python3", "-c"]
    compile(hook[2], "<preStop>", "exec")


def test_cpu_pool_has_no_gpu_limit_no_gpu_toleration_and_an_emptydir_cache() -> None:
    demo = load_pool("demo-cpu.yaml")
    sts = child(demo, "StatefulSet", "demo-decode")
    pod = sts["spec"]["template"]["spec"]
    c = container(sts)
    assert "limits" not in c["resources"]
    assert "tolerations" not in pod
    assert {"name": "model-cache", "emptyDir": {}} in pod["volumes"]
    assert "HF_TOKEN" not in env_of(c)
    assert env_of(c)["FAKE_ENGINE_PROFILE"] == "llama-3.1-8b-h100"


def test_autoscaled_statefulset_leaves_replicas_to_the_autoscaler(llama: InferencePool) -> None:
    assert "replicas" not in child(llama, "StatefulSet", "llama-8b-prefill")["spec"]
    pinned = load_pool(
        "llama-3.1-8b.yaml",
        prefill__autoscaling={"enabled": False, "maxReplicas": 8, "target": {"ttftMilliseconds": 800}},
    )
    assert child(pinned, "StatefulSet", "llama-8b-prefill")["spec"]["replicas"] == 2
    no_block = load_pool("llama-3.1-8b.yaml", decode__autoscaling=None)
    assert child(no_block, "StatefulSet", "llama-8b-decode")["spec"]["replicas"] == 4


def test_extra_env_overrides_by_name_and_extra_args_are_appended() -> None:
    pool = load_pool(
        "llama-3.1-8b.yaml",
        engine__extraEnv=[
            {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "5999"},
            {"name": "X", "value": "1"},
        ],
        engine__extraArgs=["--enable-chunked-prefill", "--max-num-seqs", "256"],
    )
    c = container(child(pool, "StatefulSet", "llama-8b-decode"))
    names = [item["name"] for item in c["env"]]
    assert len(names) == len(set(names))  # env is keyed by name under server-side apply
    assert env_of(c)["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5999"
    assert env_of(c)["X"] == "1"
    assert c["args"][-3:] == ["--enable-chunked-prefill", "--max-num-seqs", "256"]


def test_tensor_parallel_pool_requests_its_gpus_and_one_lmcache_port_per_rank() -> None:
    pool = load_pool(
        "llama-3.1-8b.yaml", engine__tensorParallelSize=4, prefill__gpusPerReplica=4, decode__gpusPerReplica=4
    )
    c = container(child(pool, "StatefulSet", "llama-8b-decode"))
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert arg_value(c["args"], "--tensor-parallel-size") == "4"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert [ports[f"p2p-init-{r}"] for r in range(4)] == [8200, 8202, 8204, 8206]
    assert [ports[f"lmc-worker-{r}"] for r in range(4)] == [8500, 8501, 8502, 8503]


def test_lmcache_pd_mode_roles_and_receiver_ports() -> None:
    pool = load_pool(
        "llama-3.1-8b.yaml",
        kvTransfer={"connector": "LMCachePD"},
        kvCache={"chunkSize": 256},
        router={"replicas": 1},  # LMCache sends its notifications to one router
    )
    prefill = container(child(pool, "StatefulSet", "llama-8b-prefill"))
    decode = container(child(pool, "StatefulSet", "llama-8b-decode"))
    assert json.loads(arg_value(prefill["args"], "--kv-transfer-config"))["kv_role"] == "kv_producer"
    consumer = json.loads(arg_value(decode["args"], "--kv-transfer-config"))
    assert consumer["kv_role"] == "kv_consumer"
    assert consumer["kv_connector_extra_config"]["skip_last_n_tokens"] == 1
    assert env_of(decode)["LMCACHE_PD_PEER_HOST"] == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}
    }
    assert {p["name"] for p in decode["ports"]} >= {"pd-init-0", "pd-alloc-0"}
    assert "nixl" not in {p["name"] for p in decode["ports"]}
    sender = yaml.safe_load(child(pool, "ConfigMap", "llama-8b-prefill-lmcache")["data"]["lmcache.yaml"])
    assert (sender["pd_role"], sender["pd_proxy_host"]) == ("sender", "llama-8b.prod.svc")


def test_nixl_without_kv_cache_block_has_no_lmcache_at_all() -> None:
    pool = load_pool("llama-3.1-8b.yaml", kvCache=None)
    c = container(child(pool, "StatefulSet", "llama-8b-decode"))
    assert json.loads(arg_value(c["args"], "--kv-transfer-config")) == {
        "kv_buffer_device": "cuda",
        "kv_connector": "NixlConnector",
        "kv_load_failure_policy": "fail",
        "kv_role": "kv_both",
    }
    assert not any(name.startswith("LMCACHE_") for name in env_of(c))
    kinds = {(x["kind"], x["metadata"]["name"]) for x in pool_children(pool)}
    assert ("ConfigMap", "llama-8b-decode-lmcache") not in kinds
    assert ("Deployment", "llama-8b-lmcache-controller") not in kinds


def test_lmcache_config_change_rolls_the_pods_and_image_change_rolls_both_pools(llama: InferencePool) -> None:
    def template(pool: InferencePool, role: str) -> dict[str, Any]:
        return dict(child(pool, "StatefulSet", f"llama-8b-{role}")["spec"]["template"])

    before = {role: template(llama, role) for role in ("prefill", "decode")}
    chunk = load_pool(
        "llama-3.1-8b.yaml", kvCache={"chunkSize": 512, "cpuOffloadGiB": 20, "p2p": {"enabled": True}}
    )
    for role in ("prefill", "decode"):
        assert (
            template(chunk, role)["metadata"]["annotations"][CHECKSUM_ANNOTATION]
            != before[role]["metadata"]["annotations"][CHECKSUM_ANNOTATION]
        )
    image = load_pool("llama-3.1-8b.yaml", engine__image="vllm/vllm-openai:v0.34.0")
    for role in ("prefill", "decode"):
        assert container({"spec": {"template": template(image, role)}})["image"] == "vllm/vllm-openai:v0.34.0"
    assert template(load_pool("llama-3.1-8b.yaml"), "decode") == before["decode"]


def test_drain_script_is_driven_by_the_engine_metric_names() -> None:
    script = engine.drain_script(port=18000, budget_seconds=5)
    assert "127.0.0.1:18000/metrics" in script
    assert "vllm:num_requests_running" in script and "vllm:num_requests_waiting" in script
    compile(script, "<preStop>", "exec")


def test_pool_ref_requires_identity() -> None:
    pool = load_pool("demo-cpu.yaml")
    pool.metadata.pop("uid")
    with pytest.raises(ValueError, match=r"metadata\.uid"):
        PoolRef.of(pool)
