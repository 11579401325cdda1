"""The CPU translation of the operator's engine container (pure): each change, and nothing else."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.unit.builders_examples import child, load_pool

from inferencepool.cluster import podspec, vllm_cpu
from inferencepool.cluster.vllm_cpu import CpuEngine, TranslationError

ENGINE = CpuEngine(venv="/repo/.venv-vllm", model="/models/tiny")
POD_IP = "127.20.0.9"


def operator_container(example: str, role: str, **spec_changes: Any) -> dict[str, Any]:
    pool = load_pool(example, **spec_changes)
    name = f"{pool.metadata['name']}-{role}"
    return dict(child(pool, "StatefulSet", name)["spec"]["template"]["spec"]["containers"][0])


def literal_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's env as the runner resolves it, with the downward-API fields of a pod at POD_IP."""
    fields = {"status.podIP": POD_IP, "metadata.name": "demo-decode-0", "metadata.namespace": "prod"}
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in item.get("valueFrom", {}):
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return {"PATH": "/usr/bin", "PYTHONPATH": "/repo/operator", **env}


def translate(container: dict[str, Any], cores: tuple[int, ...] = (1,)) -> vllm_cpu.CpuCommand:
    argv = podspec.container_argv(container, "vllm-openai")
    return vllm_cpu.translate(argv, literal_env(container), ENGINE, cores, POD_IP)


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_demo_pool_becomes_a_cpu_vllm_serve_with_the_same_flags(role: str) -> None:
    container = operator_container("demo-vllm-cpu.yaml", role)
    original = podspec.container_argv(container, "vllm-openai")
    result = translate(container)
    argv = result.argv
    assert argv[:3] == ("/repo/.venv-vllm/bin/vllm", "serve", "/models/tiny")
    assert argv[-1] == "--enforce-eager"
    # Every other flag the operator wrote is passed unchanged, in order, except the KV buffer device.
    config = json.loads(flag(argv, "--kv-transfer-config"))
    assert config["kv_buffer_device"] == "cpu"
    assert config["kv_role"] == ("kv_producer" if role == "prefill" else "kv_consumer")
    before = list(original[3:])
    after = list(argv[3:-1])
    index = before.index("--kv-transfer-config") + 1
    operator_config = json.loads(before[index])
    assert {**operator_config, "kv_buffer_device": "cpu"} == config
    before[index] = after[index] = "<config>"
    assert after == before
    assert flag(argv, "--served-model-name") == "tiny"
    assert flag(argv, "--gpu-memory-utilization") == flag(tuple(original), "--gpu-memory-utilization")


def test_environment_changes_each_with_a_reason() -> None:
    container = operator_container("demo-vllm-cpu.yaml", "decode")
    original = literal_env(container)
    result = translate(container, cores=(0,))
    env = result.env
    assert env["VLLM_TARGET_DEVICE"] == "cpu"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert env["UCX_TLS"] == "tcp"
    assert env["UCX_NET_DEVICES"] == "lo"
    assert env["NIXL_PTHR_DELAY_US"] == "1000"
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["VLLM_HOST_IP"] == POD_IP
    assert env["PATH"] == "/repo/.venv-vllm/bin:/usr/bin"
    assert env["VIRTUAL_ENV"] == "/repo/.venv-vllm"
    assert "PYTHONPATH" not in env
    # The side channel stays the operator's: the pod's own IP, port 5600.
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == POD_IP
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == original["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    # Every variable that differs from the operator's pod is a named change with a reason, and nothing else.
    changed = {key for key in env.keys() | original.keys() if env.get(key) != original.get(key)}
    named = {change.name for change in result.changes if not change.name.startswith(("argv", "model", "-"))}
    assert changed == named
    assert all(change.why for change in result.changes)


def test_changes_name_every_argument_difference() -> None:
    container = operator_container("demo-vllm-cpu.yaml", "prefill")
    names = [change.name for change in translate(container).changes]
    assert names[:4] == ["argv[0]", "model", "--enforce-eager", "--kv-transfer-config kv_buffer_device"]


def test_lmcache_multiconnector_gets_host_buffers_for_its_nixl_child_only() -> None:
    container = operator_container("llama-3.1-8b.yaml", "decode")
    config = json.loads(flag(translate(container).argv, "--kv-transfer-config"))
    assert config["kv_connector"] == "MultiConnector"
    nixl, lmcache = config["kv_connector_extra_config"]["connectors"]
    assert nixl["kv_connector"] == "NixlConnector" and nixl["kv_buffer_device"] == "cpu"
    assert "kv_buffer_device" not in lmcache


def test_model_and_tokenizer_point_at_the_local_folder() -> None:
    container = operator_container("demo-vllm-cpu.yaml", "decode", model__tokenizer="org/tokenizer")
    argv = translate(container).argv
    assert argv[2] == "/models/tiny"
    assert flag(argv, "--tokenizer") == "/models/tiny"


def test_model_given_as_flag_is_replaced() -> None:
    argv = ["vllm", "serve", "--model", "org/big", "--port", "8000"]
    result = vllm_cpu.translate(argv, {}, ENGINE, (0,), POD_IP)
    assert result.argv[:6] == (
        "/repo/.venv-vllm/bin/vllm",
        "serve",
        "--model",
        "/models/tiny",
        "--port",
        "8000",
    )


def test_a_user_transport_choice_without_cuda_is_kept() -> None:
    result = vllm_cpu.translate(["vllm", "serve", "m"], {"UCX_TLS": "tcp,shm"}, ENGINE, (0,), POD_IP)
    assert result.env["UCX_TLS"] == "tcp,shm"
    assert "UCX_TLS" not in {change.name for change in result.changes}


def test_explicit_eager_is_not_added_twice() -> None:
    result = vllm_cpu.translate(["vllm", "serve", "m", "--enforce-eager"], {}, ENGINE, (0,), POD_IP)
    assert result.argv.count("--enforce-eager") == 1


@pytest.mark.parametrize(
    ("cores", "tp", "expected"),
    [((0,), 1, "0"), ((0, 1), 1, "0,1"), ((0, 1), 2, "0|1"), ((1,), 2, "1|1"), ((0, 1, 2, 3), 2, "0,1|2,3")],
)
def test_omp_binding_gives_each_rank_a_core_list(cores: tuple[int, ...], tp: int, expected: str) -> None:
    assert vllm_cpu.omp_binding(cores, tp) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["python3", "-m", "something"], "vllm serve"),
        (["vllm", "serve", "--port", "8000"], "names no model"),
        (["vllm", "serve", "m", "--kv-transfer-config", "{nope"], "not JSON"),
        (["vllm", "serve", "m", "--tensor-parallel-size", "two"], "not a number"),
    ],
)
def test_refuses_what_it_cannot_run(argv: list[str], message: str) -> None:
    with pytest.raises(TranslationError, match=message):
        vllm_cpu.translate(argv, {}, ENGINE, (0,), POD_IP)


def test_engine_settings_round_trip_through_json() -> None:
    engine = CpuEngine(venv="/v", model="/m", kv_cache_gib=2, nixl_delay_us=500)
    assert CpuEngine.from_json(engine.to_json()) == engine


@pytest.mark.parametrize(
    ("available", "in_use", "count", "expected"),
    [
        ((0, 1), (), 1, (0,)),
        ((0, 1), (0,), 1, (1,)),
        ((0, 1), (0, 1), 1, (0,)),
        ((0, 1), (1, 1, 0), 1, (0,)),
        ((0, 1, 2, 3), (0, 1), 2, (2, 3)),
        ((0, 1), (5,), 1, (0,)),
    ],
)
def test_each_new_engine_gets_the_least_used_cores(
    available: tuple[int, ...], in_use: tuple[int, ...], count: int, expected: tuple[int, ...]
) -> None:
    assert vllm_cpu.pick_cores(available, in_use, count) == expected


def test_the_operators_vllm_image_runs_only_in_the_engine_mode() -> None:
    container = operator_container("demo-vllm-cpu.yaml", "decode")
    pod = {
        "metadata": {"name": "demo-decode-0", "namespace": "prod", "uid": "u-1"},
        "spec": {"containers": [container], "volumes": [{"name": "dshm"}, {"name": "model-cache"}]},
        "status": {"phase": "Running", "podIP": POD_IP},
    }
    assert not podspec.runs_locally(pod)
    assert podspec.runs_locally(pod, real_engine=True)

    class NoObjects:
        def config_map(self, namespace: str, name: str) -> None:
            return None

        def secret(self, namespace: str, name: str) -> None:
            return None

    args = (pod, "/venv/bin/python", NoObjects(), {"PATH": "/usr/bin"}, "/state/kubeconfig", "/state/u-1")
    assert podspec.plan_pod(*args).containers == ()
    plan = podspec.plan_pod(*args, ENGINE, (1,))
    (engine,) = plan.containers
    assert engine.argv[:3] == ("/repo/.venv-vllm/bin/vllm", "serve", "/models/tiny")
    assert flag(engine.argv, "--host") == POD_IP and engine.port == 8000
    assert engine.probe == podspec.Probe("http", 8000, "/health")
    assert engine.env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    # HF_HOME is the pod's model-cache volume, relocated to the pod's own folder as for any volume.
    assert engine.env["HF_HOME"] == "/state/u-1/model-cache"
    assert [change.name for change in engine.changes][:2] == ["argv[0]", "model"]


def test_strays_are_threads_bound_narrower_than_the_machine_and_outside_the_engines_cores() -> None:
    machine, cores = (0, 1, 2, 3), (0, 1)
    affinities = {
        10: frozenset(machine),  # free: vLLM's API server, the engine core's loop
        11: frozenset({3}),  # NixlConnector's reserved core, not the engine's
        12: frozenset({1}),  # the OpenMP binding the engine was given
        13: frozenset({1, 2}),  # partly outside
    }
    assert vllm_cpu.strays(affinities, cores, machine) == [11, 13]
    assert vllm_cpu.strays(affinities, machine, machine) == []
