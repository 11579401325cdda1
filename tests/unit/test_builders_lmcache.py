"""Generated LMCache configs, checked with LMCache's own config class (its wheel, installed --no-deps)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from lmcache.v1 import config as lmcache_config

from inferencepool.builders import lmcache
from inferencepool.builders.kvtransfer import EngineRole
from inferencepool.builders.lmcache import LMCacheSettings

logging.getLogger("lmcache").setLevel(logging.ERROR)

POD_IP = "10.20.3.4"
POD_NAME = "llama-decode-1"


def settings(**overrides: Any) -> LMCacheSettings:
    values: dict[str, Any] = {
        "mode": "Nixl",
        "p2p": True,
        "tensor_parallel_size": 1,
        "chunk_size": 256,
        "cpu_offload_gib": 20,
        "disk_gib": 0,
        "controller_host": "llama-lmcache.prod.svc",
        "proxy_host": "llama.prod.svc",
    }
    values.update(overrides)
    return LMCacheSettings(**values)


def resolve_env(env: list[dict[str, Any]]) -> dict[str, str]:
    """What the kubelet would put into the container for these env entries."""
    field_values = {"status.podIP": POD_IP, "metadata.name": POD_NAME}
    resolved = {}
    for item in env:
        if "value" in item:
            resolved[item["name"]] = item["value"]
        else:
            resolved[item["name"]] = field_values[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return resolved


def load_as_engine_would(
    role: EngineRole, config: LMCacheSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """Write the file where the ConfigMap puts it, set the pod's env, let LMCache load and validate both."""
    path = tmp_path / lmcache.CONFIG_KEY
    path.write_text(lmcache.engine_config_yaml(role, config))
    env = resolve_env(lmcache.pod_env(role, config))
    assert env["LMCACHE_CONFIG_FILE"] == lmcache.CONFIG_FILE
    for name, value in env.items():
        if name != "LMCACHE_CONFIG_FILE":
            monkeypatch.setenv(name, value)
    return lmcache_config.load_engine_config_with_overrides(config_file_path=str(path))


def test_every_generated_key_is_one_lmcache_knows() -> None:
    known = set(lmcache_config._CONFIG_DEFINITIONS)
    for config in (
        settings(),
        settings(p2p=False),
        settings(disk_gib=100, tensor_parallel_size=4),
        settings(mode="LMCachePD", p2p=False),
    ):
        for role in ("prefill", "decode"):
            generated = set(lmcache.engine_config(role, config))
            assert generated <= known, generated - known
            env_keys = {
                item["name"].removeprefix("LMCACHE_").lower()
                for item in lmcache.pod_env(role, config)
                if item["name"] != "LMCACHE_CONFIG_FILE"
            }
            assert env_keys <= known, env_keys - known


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_p2p_config_validates_and_takes_pod_identity_from_env(
    role: EngineRole, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load_as_engine_would(role, settings(tensor_parallel_size=2), tmp_path, monkeypatch)
    assert loaded.enable_p2p and loaded.enable_controller
    assert loaded.p2p_host == POD_IP
    assert loaded.lmcache_instance_id == POD_NAME
    assert loaded.p2p_init_ports == [8200, 8202]
    assert loaded.p2p_lookup_ports == [8201, 8203]
    assert loaded.lmcache_worker_ports == [8500, 8501]
    assert loaded.controller_pull_url == "llama-lmcache.prod.svc:8300"
    assert loaded.controller_reply_url == "llama-lmcache.prod.svc:8400"
    assert loaded.transfer_channel == "nixl"
    assert loaded.chunk_size == 256
    assert loaded.max_local_cpu_size == 10.0  # cpuOffloadGiB is per pod; LMCache's size is per TP rank
    assert loaded.local_disk is None


def test_p2p_config_without_pod_env_is_rejected_by_lmcache(tmp_path: Path) -> None:
    # The shared file alone is incomplete on purpose: the pod's own IP must come from the downward API.
    path = tmp_path / "decode.yaml"
    path.write_text(lmcache.engine_config_yaml("decode", settings()))
    with pytest.raises(AssertionError):
        lmcache_config.LMCacheEngineConfig.from_file(str(path)).validate()


def test_offload_only_config_has_no_p2p_and_no_per_pod_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = settings(p2p=False, cpu_offload_gib=8)
    assert [item["name"] for item in lmcache.pod_env("decode", config)] == ["LMCACHE_CONFIG_FILE"]
    assert lmcache.container_ports("decode", config) == []
    loaded = load_as_engine_would("decode", config, tmp_path, monkeypatch)
    assert loaded.local_cpu and loaded.max_local_cpu_size == 8.0
    assert not loaded.enable_p2p and not loaded.enable_controller


def test_disk_tier_is_a_path_lmcache_understands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_as_engine_would("decode", settings(disk_gib=200), tmp_path, monkeypatch)
    assert loaded.local_disk == lmcache.LOCAL_DISK_PATH + "/"
    assert loaded.max_local_disk_size == 200.0


def test_pd_mode_sender_and_receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = settings(
        mode="LMCachePD",
        p2p=False,
        tensor_parallel_size=2,
        pd_buffer_bytes=4 * 1024**3,
        pd_max_prefill_len=8192,
    )
    sender = load_as_engine_would("prefill", config, tmp_path, monkeypatch)
    assert sender.enable_pd and not sender.enable_p2p
    assert sender.pd_role == "sender"
    assert (sender.pd_proxy_host, sender.pd_proxy_port) == ("llama.prod.svc", lmcache.PD_PROXY_PORT)
    assert sender.pd_buffer_size == 2 * 1024**3  # per TP rank: each rank buffers its own shard
    assert sender.pd_allocation_timeout_sec == lmcache.PD_ALLOCATION_TIMEOUT_SECONDS
    assert sender.pd_max_prefill_len == 8192
    assert sender.save_unfull_chunk  # LMCache forces it for PD; the whole prompt must reach the decode pod

    receiver = load_as_engine_would("decode", config, tmp_path, monkeypatch)
    assert receiver.pd_role == "receiver"
    assert receiver.pd_peer_host == POD_IP
    assert receiver.pd_peer_init_port == [7300, 7301]
    assert receiver.pd_peer_alloc_port == [7400, 7401]
    assert receiver.pd_buffer_device == "cuda"
    assert receiver.nixl_backends == ["UCX"]


def test_pd_mode_with_p2p_is_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match=r"kvCache\.p2p\.enabled"):
        lmcache.engine_config("prefill", settings(mode="LMCachePD", p2p=True))


def test_container_ports_match_the_config_and_fit_kubernetes_names() -> None:
    config = settings(tensor_parallel_size=8)
    ports = lmcache.container_ports("decode", config)
    numbers = [p["containerPort"] for p in ports]
    assert len(set(numbers)) == len(numbers)
    document = lmcache.engine_config("decode", config)
    for key in ("p2p_init_ports", "p2p_lookup_ports", "lmcache_worker_ports"):
        assert set(document[key]) <= set(numbers)
    assert all(len(p["name"]) <= 15 for p in ports)
    pd = settings(mode="LMCachePD", p2p=False, tensor_parallel_size=2)
    assert [p["containerPort"] for p in lmcache.container_ports("decode", pd)] == [7300, 7301, 7400, 7401]
    assert lmcache.container_ports("prefill", pd) == []


def test_rendering_is_deterministic() -> None:
    assert lmcache.engine_config_yaml("decode", settings()) == lmcache.engine_config_yaml(
        "decode", settings()
    )


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_per_pod_sizes_become_per_rank_sizes_that_add_up_to_the_pod(
    tp: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load_as_engine_would(
        "decode", settings(tensor_parallel_size=tp, cpu_offload_gib=20, disk_gib=100), tmp_path, monkeypatch
    )
    assert loaded.max_local_cpu_size * tp == 20
    assert loaded.max_local_disk_size * tp == 100
