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
    # vLLM 0.33 deprecates kv_both for NixlConnector: producer on prefill pods, consumer on decode pods
    nixl_role = "kv_producer" if role == "prefill" else "kv_consumer"
    assert [x["kv_role"] for x in connectors] == [nixl_role, "kv_both"]
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
        "kv_connector_extra_config": {"kv_lease_duration": 30},
        "kv_load_failure_policy": "fail",
        "kv_role": "kv_consumer",
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


def lmcache_file(pool: InferencePool, role: str) -> dict[str, Any]:
    name = f"{pool.name()}-{role}-lmcache"
    document: dict[str, Any] = yaml.safe_load(child(pool, "ConfigMap", name)["data"]["lmcache.yaml"])
    return document


def test_scale_down_drains_requests_then_held_kv_within_the_grace_period(llama: InferencePool) -> None:
    """preStop waits for running/waiting requests; vLLM's --shutdown-timeout then covers KV a prefill engine
    still holds for decode engines (up to the NIXL lease); the grace period covers both (issue 11, #5)."""
    sts = child(llama, "StatefulSet", "llama-8b-prefill")
    c = container(sts)
    transfer = json.loads(arg_value(c["args"], "--kv-transfer-config"))
    lease = transfer["kv_connector_extra_config"]["connectors"][0]["kv_connector_extra_config"]
    shutdown = int(arg_value(c["args"], "--shutdown-timeout"))
    assert shutdown > lease["kv_lease_duration"]
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    script = c["lifecycle"]["preStop"]["exec"]["command"][2]
    budget = int(script.split("time.monotonic() + ", 1)[1].split("\n", 1)[0])
    assert budget + shutdown < grace


def test_ucx_works_without_rdma_by_default_and_the_user_overrides_it() -> None:
    default = env_of(container(child(load_pool("llama-3.1-8b.yaml"), "StatefulSet", "llama-8b-decode")))
    assert default["UCX_TLS"] == "tcp,cuda_copy,cuda_ipc"
    rdma = load_pool("llama-3.1-8b.yaml", engine__extraEnv=[{"name": "UCX_TLS", "value": "rc,cuda_copy"}])
    assert env_of(container(child(rdma, "StatefulSet", "llama-8b-decode")))["UCX_TLS"] == "rc,cuda_copy"


def test_each_pool_sets_its_own_tensor_parallel_size() -> None:
    pool = load_pool(
        "llama-3.1-8b.yaml",
        prefill__tensorParallelSize=1,
        decode__tensorParallelSize=4,
        decode__gpusPerReplica=None,  # the example pins 1 GPU; unset, GPUs follow the pool's TP
        kvCache={"cpuOffloadGiB": 20, "p2p": {"enabled": True}},
    )
    prefill = container(child(pool, "StatefulSet", "llama-8b-prefill"))
    decode = container(child(pool, "StatefulSet", "llama-8b-decode"))
    assert arg_value(prefill["args"], "--tensor-parallel-size") == "1"
    assert arg_value(decode["args"], "--tensor-parallel-size") == "4"
    assert prefill["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert decode["resources"]["limits"]["nvidia.com/gpu"] == "4"  # GPUs follow the pool's TP
    assert lmcache_file(pool, "decode")["lmcache_worker_ports"] == [8500, 8501, 8502, 8503]
    assert lmcache_file(pool, "prefill")["lmcache_worker_ports"] == [8500]
    assert lmcache_file(pool, "decode")["max_local_cpu_size"] == 5.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"prefill__tensorParallelSize": 2, "decode__tensorParallelSize": 3}, "must divide one another"),
        (
            {"kvTransfer": {"connector": "LMCachePD"}, "kvCache": {"chunkSize": 256},
             "router": {"replicas": 1}, "decode__tensorParallelSize": 2},
            "must be equal with the LMCachePD connector",
        ),
        ({"decode__tensorParallelSize": 4, "decode__gpusPerReplica": 2}, "decode.gpusPerReplica must be"),
    ],
)  # fmt: skip
def test_tensor_parallel_sizes_vllm_cannot_pair_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_pool("llama-3.1-8b.yaml", **overrides)


def test_tp2_pool_limits_agree_with_what_lmcache_allocates() -> None:
    """cpuOffloadGiB and disk.sizeGiB are per pod; LMCache's sizes are per rank, so they are divided, and the
    emptyDir's sizeLimit is what all ranks together may write (issue 11, defect 4)."""
    pool = load_pool(
        "llama-3.1-8b.yaml",
        engine__tensorParallelSize=2,
        prefill__gpusPerReplica=2,
        decode__gpusPerReplica=2,
        prefill__resources={},
        kvCache={"cpuOffloadGiB": 20, "disk": {"sizeGiB": 100}, "p2p": {"enabled": True}},
    )
    sts = child(pool, "StatefulSet", "llama-8b-prefill")
    document = lmcache_file(pool, "prefill")
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    size_limit = volumes["lmcache-disk"]["emptyDir"]["sizeLimit"]
    assert size_limit == "100Gi" and document["max_local_disk_size"] * 2 == 100
    assert document["max_local_cpu_size"] * 2 == 20
    assert container(sts)["resources"]["requests"]["memory"] == "20Gi"  # the CPU tier, all ranks


def pd_pool(kv_cache: dict[str, Any] | None = None, **overrides: Any) -> InferencePool:
    return load_pool(
        "llama-3.1-8b.yaml",
        kvTransfer={"connector": "LMCachePD"},
        kvCache=kv_cache or {"chunkSize": 256},
        router={"replicas": 1},
        **overrides,
    )


@pytest.mark.parametrize("tp", [1, 2])
def test_lmcache_pd_buffer_holds_full_length_prompts_of_the_model(tp: int) -> None:
    """Llama-3.1-8B keeps 128 KiB of KV per token: two 32768-token prompts need 8 GiB per pod, split across
    the ranks, and LMCache checks at start that the buffer holds a maxModelLen prompt (issue 11, #2)."""
    pool = pd_pool(engine__tensorParallelSize=tp, prefill__gpusPerReplica=tp, decode__gpusPerReplica=tp)
    for role in ("prefill", "decode"):
        document = lmcache_file(pool, role)
        assert document["pd_buffer_size"] * tp == 8 * 1024**3
        assert document["pd_max_prefill_len"] == 32768
        assert document["pd_allocation_timeout_sec"] < 30  # before the router stops waiting
    explicit = pd_pool({"chunkSize": 256, "pdBufferGiB": 5})
    assert lmcache_file(explicit, "decode")["pd_buffer_size"] == 5 * 1024**3
    # a 32768-token prompt of Llama-3.1-8B is 4 GiB: a smaller buffer is refused before LMCache would
    with pytest.raises(ValueError, match=r"spec\.kvCache\.pdBufferGiB must hold one prompt"):
        pd_pool({"chunkSize": 256, "pdBufferGiB": 3})


def test_lmcache_pd_engines_run_without_prefix_caching() -> None:
    """vLLM does not retrieve what its prefix cache holds; LMCache frees a pushed chunk only on retrieval."""
    pool = pd_pool()
    for role in ("prefill", "decode"):
        assert (
            "--no-enable-prefix-caching" in container(child(pool, "StatefulSet", f"llama-8b-{role}"))["args"]
        )
    nixl = container(child(load_pool("llama-3.1-8b.yaml"), "StatefulSet", "llama-8b-decode"))
    assert "--no-enable-prefix-caching" not in nixl["args"]


def test_lmcache_pd_for_a_model_of_unknown_size_needs_the_buffer_size() -> None:
    with pytest.raises(ValueError, match=r"spec\.kvCache\.pdBufferGiB must be set"):
        pd_pool(model__name="example/unknown-model")
    pool = pd_pool({"chunkSize": 256, "pdBufferGiB": 4}, model__name="example/unknown-model")
    assert "pd_max_prefill_len" in lmcache_file(pool, "decode")


@pytest.mark.parametrize("kv_cache", [{"cpuOffloadGiB": 0, "p2p": {"enabled": True}},
                                      {"cpuOffloadGiB": 0, "disk": {"sizeGiB": 10}}])  # fmt: skip
def test_no_cpu_tier_under_p2p_or_disk_is_refused_naming_the_fields(kv_cache: dict[str, Any]) -> None:
    with pytest.raises(
        ValueError, match=r"spec\.kvCache\.cpuOffloadGiB must be at least 1 when spec\.kvCache\."
    ):
        load_pool("llama-3.1-8b.yaml", kvCache=kv_cache)


def args_of(pool: InferencePool, role: str) -> list[str]:
    return list(container(child(pool, "StatefulSet", f"llama-8b-{role}"))["args"])


@pytest.mark.parametrize(
    ("changes", "prefill", "decode"),
    [
        # decode pods prefill the prompts routed to them directly: a chunk whose step fits the ITL target
        ({}, None, ("1024", None)),  # ITL target 40 ms in the example
        ({"decode__autoscaling__target": {"itlMilliseconds": 25}}, None, ("512", "512")),
        ({"decode__autoscaling": None}, None, ("512", "512")),  # no target: the tight chunk
        # the spec's own chunk per pool; below vLLM's default max-num-seqs (1024) the batch is capped with it
        (
            {"prefill__maxNumBatchedTokens": 16384, "decode__maxNumBatchedTokens": 256},
            ("16384", None),
            ("256", "256"),
        ),
        # role lending: a prefill pod decodes lent requests, so its steps fit the decode pool's ITL target
        ({"router__roleLending": True}, ("1024", None), ("1024", None)),
        (
            {"router__roleLending": True, "decode__autoscaling__target": {"itlMilliseconds": 25}},
            ("512", "512"),
            ("512", "512"),
        ),
        ({"router__roleLending": True, "prefill__maxNumBatchedTokens": 4096}, ("4096", None), ("1024", None)),
    ],
)
def test_each_pool_runs_its_own_prefill_chunk(
    changes: dict[str, Any], prefill: tuple[str, str | None] | None, decode: tuple[str, str | None]
) -> None:
    pool = load_pool("llama-3.1-8b.yaml", **changes)
    for role, expected in (("prefill", prefill), ("decode", decode)):
        args = args_of(pool, role)
        if expected is None:  # vLLM's own default (8192 on H100/H200) for throughput
            assert "--max-num-batched-tokens" not in args and "--max-num-seqs" not in args
            continue
        tokens, seqs = expected
        assert arg_value(args, "--max-num-batched-tokens") == tokens
        assert ("--max-num-seqs" in args) == (seqs is not None)
        if seqs is not None:
            assert arg_value(args, "--max-num-seqs") == seqs


@pytest.mark.parametrize("flag", ["--max-num-batched-tokens=2048", "--max_num_seqs"])
def test_extra_args_that_set_the_batch_leave_it_to_them(flag: str) -> None:
    pool = load_pool("llama-3.1-8b.yaml", engine__extraArgs=[flag, "64"] if "=" not in flag else [flag])
    for role in ("prefill", "decode"):
        args = args_of(pool, role)
        assert args.count("--max-num-batched-tokens") == 0 and args.count("--max-num-seqs") == 0


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


@pytest.mark.parametrize("kv_cache", [None, {"chunkSize": 256}])
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_no_engine_pins_its_nixl_engine_id(kv_cache: dict[str, Any] | None, role: str) -> None:
    """vLLM draws a new engine_id at each start when none is set, which is how a decode engine tells a
    restarted prefill pod (same name and IP) from the engine it replaced and drops the old one's NIXL state
    (docs/engine-contract.md §3, "Restarted peers"); a pinned id would leave it a stale peer."""
    pool = load_pool("llama-3.1-8b.yaml", kvCache=kv_cache)
    c = container(child(pool, "StatefulSet", f"llama-8b-{role}"))
    transfer = json.loads(arg_value(c["args"], "--kv-transfer-config"))
    assert "engine_id" not in _keys(transfer)
    assert not any("engine-id" in arg or "engine_id" in arg for arg in c["args"] if arg.startswith("--"))
