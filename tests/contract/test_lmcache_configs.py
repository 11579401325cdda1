"""Every LMCache configuration the operator generates loads with LMCache 0.5.6's own loader (the installed
wheel, --no-deps: its config module needs no torch), file and per-pod environment as the pod gets them, for
every transfer mode and tensor-parallel size; and the fake engine starts from the same pod."""

from __future__ import annotations

import logging
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from lmcache.v1 import config as lmcache_config

from inferencepool.api.v1alpha1 import POOL_ROLES, PoolRole
from inferencepool.builders import engine, lmcache
from inferencepool.builders.common import PoolRef
from inferencepool.cli import build_parser
from inferencepool.engine_sim.cli import build_config
from inferencepool.engine_sim.core import EngineCore
from tests.contract.pools import POOLS

logging.getLogger("lmcache").setLevel(logging.ERROR)

POD = {"status.podIP": "10.20.3.4", "metadata.name": "pod-0", "metadata.namespace": "prod"}
LMCACHE_CASES = [
    (name, role) for name, pool in POOLS.items() if pool.spec.uses_lmcache() for role in POOL_ROLES
]


def pod_env(name: str, role: PoolRole) -> dict[str, str]:
    """The container's environment as the kubelet resolves it (downward API from the pod above)."""
    pool = POOLS[name]
    resolved = {}
    for item in engine.engine_env(pool, PoolRef.of(pool), role):
        if "value" in item:
            resolved[item["name"]] = str(item["value"])
        elif "fieldRef" in item.get("valueFrom", {}):
            resolved[item["name"]] = POD[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return resolved


def write_config(name: str, role: PoolRole, tmp_path: Path) -> Path:
    pool = POOLS[name]
    path = tmp_path / lmcache.CONFIG_KEY
    path.write_text(engine.lmcache_config(pool, PoolRef.of(pool), role)["data"][lmcache.CONFIG_KEY])
    return path


def test_the_installed_lmcache_is_the_release_the_builders_target() -> None:
    assert version("lmcache") == "0.5.6"


@pytest.mark.parametrize(("name", "role"), LMCACHE_CASES)
def test_lmcache_loads_the_generated_config(
    name: str, role: PoolRole, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = POOLS[name]
    spec = pool.spec
    path = write_config(name, role, tmp_path)
    for key, value in pod_env(name, role).items():
        if key.startswith("LMCACHE_") and key != "LMCACHE_CONFIG_FILE":
            monkeypatch.setenv(key, value)
    loaded: Any = lmcache_config.load_engine_config_with_overrides(config_file_path=str(path))
    loaded.validate()
    tp = spec.tensor_parallel_size(role)
    if spec.kv_transfer.connector == "LMCachePD":
        assert loaded.enable_pd and loaded.pd_role == ("sender" if role == "prefill" else "receiver")
        bytes_per_token = 131072  # Llama-3.1-8B, bf16
        # LMCache's start-up check (pd_backend_async.py initialize_allocator), per rank
        chunk_bytes = loaded.chunk_size * bytes_per_token // tp
        capacity_tokens = (loaded.pd_buffer_size // chunk_bytes) * loaded.chunk_size
        assert capacity_tokens >= loaded.pd_max_prefill_len > 0
        assert loaded.pd_allocation_timeout_sec < float("inf")
        if role == "decode":
            assert len(loaded.pd_peer_init_port) == len(loaded.pd_peer_alloc_port) == tp
    else:
        kv_cache = spec.effective_kv_cache()
        assert loaded.max_local_cpu_size * tp == pytest.approx(kv_cache.cpu_offload_gib)
        if kv_cache.disk is not None:
            assert loaded.max_local_disk_size * tp == pytest.approx(kv_cache.disk.size_gib)
        if loaded.enable_p2p:
            assert len(loaded.p2p_init_ports) == len(loaded.lmcache_worker_ports) == tp
            assert (
                loaded.p2p_host == POD["status.podIP"] and loaded.lmcache_instance_id == POD["metadata.name"]
            )


@pytest.mark.parametrize(("name", "role"), [(n, r) for n in POOLS for r in POOL_ROLES])
def test_the_fake_engine_starts_from_every_generated_pod(name: str, role: PoolRole, tmp_path: Path) -> None:
    """The fake refuses what vLLM or LMCache would refuse; it must take everything the operator generates."""
    pool = POOLS[name]
    env = pod_env(name, role)
    if pool.spec.uses_lmcache():
        env["LMCACHE_CONFIG_FILE"] = str(write_config(name, role, tmp_path))
    env.setdefault("FAKE_ENGINE_PROFILE", "llama-3.1-8b-h100")
    args = build_parser("fake-engine").parse_args(["fake-engine", "serve", *engine.vllm_args(pool, role)])
    config = build_config(args, env)
    assert config.profile.tensor_parallel == pool.spec.tensor_parallel_size(role)
    EngineCore(config.profile, "e", lmcache=config.lmcache, chunk_tokens=config.chunk_tokens)
