"""Every engine command line the operator generates, as the CPU engine mode runs it, is one real vLLM accepts:
vLLM's own parser and `create_engine_config` (vllm_config_check.py, in .venv-vllm) build its engine config
from the exact argv (builders -> pod -> the runner's plan -> vllm_cpu.translate), and what vLLM made of each
flag the operator sets is what the operator meant. A flag or a flag combination vLLM refuses fails here.

Starting an engine per configuration would take hours; vLLM refuses bad flags while building this config,
before any process starts, and tests/real/engines/ starts one P/D pair for real.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from inferencepool.api.v1alpha1 import POOL_ROLES, InferencePool
from inferencepool.builders import pool_children
from inferencepool.builders.engine import SHUTDOWN_TIMEOUT_SECONDS
from inferencepool.builders.kvtransfer import KV_LEASE_SECONDS, kv_transfer_config
from inferencepool.cluster import podspec, vllm_cpu
from tests.contract.pools import POOLS
from tests.support.real_engines import VENV
from tests.unit.builders_examples import load_pool

CHECK = Path(__file__).with_name("vllm_config_check.py")
POD_IP = "127.9.0.2"


def tier_variants() -> dict[str, InferencePool]:
    """The CPU demo pool and the batch-flag rules on it: the prefill pool's own chunk below vLLM's default
    max-num-seqs, a tight decode ITL target (the smaller chunk), and extraArgs that set the batch flags
    (the operator then writes none)."""
    return {
        "demo-vllm-cpu": load_pool("demo-vllm-cpu.yaml"),
        "demo-vllm-cpu-prefill-chunk-256": load_pool("demo-vllm-cpu.yaml", prefill__maxNumBatchedTokens=256),
        "demo-vllm-cpu-decode-itl-20ms": load_pool(
            "demo-vllm-cpu.yaml", decode__autoscaling__target={"itlMilliseconds": 20, "percentile": 90}
        ),
        "demo-vllm-cpu-extra-batch-args": load_pool(
            "demo-vllm-cpu.yaml", engine__extraArgs=["--max-num-batched-tokens", "2048"]
        ),
    }


def engine_container(pool: InferencePool, role: str) -> dict[str, Any]:
    name = f"{pool.metadata['name']}-{role}"
    (statefulset,) = (
        c for c in pool_children(pool) if c["kind"] == "StatefulSet" and c["metadata"]["name"] == name
    )
    return dict(statefulset["spec"]["template"]["spec"]["containers"][0])


# Llama 3.1 8B's attention heads (the examples' model): what tensor-parallel sizes up to 8 divide.
LLAMA_HEADS = {"num_attention_heads": 32, "num_key_value_heads": 8}


def model_for(pool: InferencePool, tiny: Path, root: Path) -> Path:
    """The tiny model as a stand-in for the pool's own: its config.json given the positions the pool's
    maxModelLen asks for, and Llama 3.1 8B's head counts where the pool's tensor-parallel size does not
    divide the tiny model's 4 heads. vLLM's engine config reads only config.json, never the weights."""
    config = json.loads((tiny / "config.json").read_text())
    changes: dict[str, Any] = {}
    wanted = pool.spec.max_model_len() or 0
    if wanted > config["max_position_embeddings"]:
        changes["max_position_embeddings"] = wanted
    if any(config["num_attention_heads"] % pool.spec.tensor_parallel_size(role) for role in POOL_ROLES):
        changes |= LLAMA_HEADS
    if not changes:
        return tiny
    folder = root / "-".join(f"{k}={v}" for k, v in sorted(changes.items()))
    if not folder.exists():
        folder.mkdir()
        for item in tiny.iterdir():
            if item.name != "config.json":
                (folder / item.name).symlink_to(item)
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def cpu_command(pool: InferencePool, role: str, tiny: Path, root: Path) -> vllm_cpu.CpuCommand:
    container = engine_container(pool, role)
    argv = podspec.container_argv(container, vllm_cpu.IMAGE_SUFFIX)
    engine = vllm_cpu.CpuEngine(venv=str(VENV), model=str(model_for(pool, tiny, root)))
    return vllm_cpu.translate(argv, {"PATH": "/usr/bin"}, engine, (0,), POD_IP)


def all_pools() -> dict[str, InferencePool]:
    return {**POOLS, **tier_variants()}


# Refusals the check must report (so the test below can fail): a flag vLLM lacks, more sequences than the
# chunk, a NixlConnector config without a role.
REFUSED = {
    "unknown-flag": ["--no-such-flag"],
    "seqs-over-chunk": ["--max-num-batched-tokens", "64", "--max-num-seqs", "128"],
    "connector-without-role": ["--kv-transfer-config", '{"kv_connector":"NixlConnector"}'],
}


@pytest.fixture(scope="module")
def vllm_configs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """vLLM's verdict on every (pool, role) command line and on the REFUSED ones, from one process (importing
    vLLM takes most of a minute)."""
    root = tmp_path_factory.mktemp("models")
    entries = [
        {"id": f"{name}/{role}", "argv": list(cpu_command(pool, role, tiny_model, root).argv)}
        for name, pool in all_pools().items()
        for role in POOL_ROLES
    ]
    demo = cpu_command(load_pool("demo-vllm-cpu.yaml"), "decode", tiny_model, root)
    entries += [{"id": name, "argv": [*demo.argv, *extra]} for name, extra in REFUSED.items()]
    for entry in entries:
        entry["argv"][0] = "vllm"
    result = subprocess.run(
        [str(VENV / "bin" / "python"), str(CHECK)],
        input=json.dumps(entries),
        capture_output=True,
        text=True,
        env=dict(demo.env),
        timeout=1800,
        check=False,
    )
    verdicts = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            verdict = json.loads(line)
            verdicts[verdict["id"]] = verdict
    assert len(verdicts) == len(entries), f"the check stopped early:\n{result.stderr[-4000:]}"
    return verdicts


CASES = [(name, role) for name in all_pools() for role in POOL_ROLES]


@pytest.mark.parametrize(("pool_name", "role"), CASES, ids=[f"{n}/{r}" for n, r in CASES])
def test_vllm_builds_its_engine_config_from_the_generated_command(
    vllm_configs: dict[str, dict[str, Any]], pool_name: str, role: str
) -> None:
    verdict = vllm_configs[f"{pool_name}/{role}"]
    assert verdict["ok"], verdict["error"]
    config = verdict["config"]
    spec = all_pools()[pool_name].spec
    assert config["served_model_name"] == spec.served_model_name()
    assert config["tensor_parallel_size"] == spec.tensor_parallel_size(role)
    assert config["shutdown_timeout"] == SHUTDOWN_TIMEOUT_SECONDS
    if spec.max_model_len() is not None:
        assert config["max_model_len"] == spec.max_model_len()
    # The batch flags: the pool's chunk, and max-num-seqs never above it (vLLM refuses that).
    chunk = spec.chunk_tokens(role)
    if chunk is not None:
        assert config["max_num_batched_tokens"] == chunk
    assert config["max_num_seqs"] <= config["max_num_batched_tokens"]
    # Prefix caching stays on except where LMCache's PD mode needs it off.
    assert config["enable_prefix_caching"] == (spec.kv_transfer.connector != "LMCachePD")
    # The kv-transfer-config is the operator's, with the host buffer the CPU translation sets.
    operator_config = kv_transfer_config(role, spec.kv_transfer.connector, spec.uses_lmcache())
    assert config["kv_connector"] == operator_config["kv_connector"]
    assert config["kv_role"] == operator_config["kv_role"]
    if operator_config["kv_connector"] == "NixlConnector":
        assert config["kv_buffer_device"] == "cpu"
        assert config["kv_connector_extra_config"]["kv_lease_duration"] == KV_LEASE_SECONDS


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_command_vllm_refuses_fails_the_check(vllm_configs: dict[str, dict[str, Any]], name: str) -> None:
    assert not vllm_configs[name]["ok"]
