"""`inferencepool fake-engine` reads vLLM's serve flags and environment as a vLLM pod spec passes them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from inferencepool.cli import build_parser
from inferencepool.engine_sim.cli import build_config

NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "fail"}
LMCACHE = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}


def config_for(argv: list[str], env: dict[str, str] | None = None) -> Any:
    args = build_parser("fake-engine").parse_args(["fake-engine", *argv])
    return build_config(args, env or {})


def test_vllm_serve_command_line() -> None:
    config = config_for(
        [
            "serve",
            "meta-llama/Llama-3.1-70B-Instruct",
            "--host",
            "10.1.2.3",
            "--port",
            "8000",
            "--served-model-name",
            "llama-70b",
            "--tensor-parallel-size",
            "8",
            "--max-model-len",
            "65536",
            "--kv-transfer-config",
            json.dumps(NIXL),
            "--profile",
            "llama-3.1-70b-h100-tp4",
            "--seed",  # vLLM 0.33 flags the fake does not model (--swap-space and --disable-log-requests
            "16",  # are gone from 0.33: vLLM, and so the fake, refuses them)
            "--enable-chunked-prefill",
            "--enable-log-requests",
        ]
    )
    assert config.model == "meta-llama/Llama-3.1-70B-Instruct"
    assert config.served_model_names == ["llama-70b"]
    assert (config.host, config.port) == ("10.1.2.3", 8000)
    assert config.profile.tensor_parallel == 8 and config.profile.max_model_len == 65536
    assert config.nixl and config.lmcache is None
    assert config.side_channel_host == "10.1.2.3" and config.side_channel_port == 5600
    assert config.kv_lease_s == 30.0


def test_vllm_flags_the_fake_does_not_model_are_ignored_and_remembered() -> None:
    args = build_parser("fake-engine").parse_args(
        ["fake-engine", "serve", "m", "--enable-chunked-prefill", "--seed", "7", "--port", "9"]
    )
    assert args.port == 9 and args.words == ["serve", "m"]
    assert args.ignored_vllm_args == ["--enable-chunked-prefill", "--seed"]


@pytest.mark.parametrize("flag", ["--some-future-flag", "--swap-space", "--disable-log-requests"])
def test_flags_vllm_does_not_know_are_refused(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser("fake-engine").parse_args(["fake-engine", "serve", "m", flag, "--port", "9"])
    assert exit_info.value.code == 2
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"kv_connector": "NixlConnector"}, "kv_role is required"),
        ({"kv_connector": "NixlConnector", "kv_role": "both"}, "kv_role must be one of kv_producer"),
        ({**NIXL, "kv_lease_duration": 30}, "unknown KVTransferConfig field"),
        (
            {"kv_connector": "MultiConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"connectors": [{**NIXL, "role": "x"}]}},
            r"connectors\[0\]: unknown KVTransferConfig field\(s\) role",
        ),
        ({**NIXL, "kv_load_failure_policy": "retry"}, "kv_load_failure_policy must be one of recompute"),
    ],
)  # fmt: skip
def test_kv_transfer_config_is_checked_as_vllm_checks_it(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_for(["--kv-transfer-config", json.dumps(config)])


def test_nixl_producer_and_consumer_roles() -> None:
    for role in ("kv_producer", "kv_consumer"):
        assert config_for(["--kv-transfer-config", json.dumps({**NIXL, "kv_role": role})]).nixl


@pytest.mark.parametrize("tier", ["LMCACHE_ENABLE_P2P", "LMCACHE_LOCAL_DISK"])
def test_p2p_or_disk_without_a_cpu_backend_is_refused(tier: str) -> None:
    env = {"LMCACHE_MAX_LOCAL_CPU_SIZE": "0", tier: "true" if "P2P" in tier else "file:///tmp/x/"}
    env["LMCACHE_MAX_LOCAL_DISK_SIZE"] = "4"
    with pytest.raises(ValueError, match="needs the CPU backend"):
        config_for(["--kv-transfer-config", json.dumps(LMCACHE)], env)


def test_environment_profile_side_channel_and_time_scale() -> None:
    config = config_for(
        ["--host", "0.0.0.0"],
        {
            "FAKE_ENGINE_PROFILE": "llama-3.1-8b-h200",
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.7",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601",
            "FAKE_ENGINE_TIME_SCALE": "0.25",
        },
    )
    assert config.profile.name == "llama-3.1-8b-h200"
    assert config.model == "meta-llama/Llama-3.1-8B-Instruct"  # the profile's model when none is given
    assert (config.side_channel_host, config.side_channel_port) == ("10.0.0.7", 5601)
    assert config.time_scale == 0.25
    assert not config.nixl


def test_load_failure_policy() -> None:
    assert not config_for(["--kv-transfer-config", json.dumps(NIXL)]).recompute_on_load_failure
    recompute = {**NIXL, "kv_load_failure_policy": "recompute"}
    assert config_for(["--kv-transfer-config", json.dumps(recompute)]).recompute_on_load_failure


def test_role_alone_enables_nixl_for_local_runs() -> None:
    assert config_for(["--role", "prefill"]).nixl
    assert config_for(["--role", "decode"]).nixl
    assert not config_for(["--role", "both"]).nixl


def test_multiconnector_with_lmcache_p2p(tmp_path: Path) -> None:
    lmcache_yaml = tmp_path / "lmcache.yaml"
    lmcache_yaml.write_text(
        "chunk_size: 256\nlocal_cpu: true\nmax_local_cpu_size: 2.0\nenable_p2p: false\n"
        # what p2p needs besides (LMCache asserts it), as the operator writes it
        "enable_controller: true\ncontroller_pull_url: ctl.ns.svc:8300\n"
        "controller_reply_url: ctl.ns.svc:8400\n"
        "lmcache_worker_ports: [8500]\np2p_init_ports: [8200]\np2p_lookup_ports: [8201]\n"
        "lmcache_instance_id: pod-0\np2p_host: 10.0.0.1\n"
    )
    multi = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "connectors": [{**NIXL, "kv_connector_extra_config": {"kv_lease_duration": 12}}, LMCACHE]
        },
    }
    config = config_for(
        ["--kv-transfer-config", json.dumps(multi), "--profile", "llama-3.1-8b-h100"],
        {"LMCACHE_CONFIG_FILE": str(lmcache_yaml), "LMCACHE_ENABLE_P2P": "True"},  # env wins over the file
    )
    assert config.nixl and config.kv_lease_s == 12.0
    assert config.lmcache is not None and config.lmcache.p2p
    # LMCache counts max_local_cpu_size in GiB per TP rank (local_cpu_backend.py: size * 1024**3)
    assert config.lmcache.cpu_capacity_chunks == int(2.0 * 1024**3 / (256 * 128 * 1024))


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--kv-transfer-config", "{not json"], {}, "--kv-transfer-config is not valid JSON"),
        (["--profile", "h9000"], {}, "unknown engine profile 'h9000'"),
        (["--time-scale", "0"], {}, "--time-scale must be > 0"),
        (["serve", "a", "b"], {}, "at most one MODEL"),
        ([], {"VLLM_NIXL_SIDE_CHANNEL_PORT": "x"}, "VLLM_NIXL_SIDE_CHANNEL_PORT must be an integer"),
        (["--profile", "llama-3.1-70b-h100-tp4", "-tp", "1"], {}, "weights do not fit"),
        (["--max-model-len", "99999"], {}, "max_model_len 99999"),
        # vLLM's SchedulerConfig: the chunk may not be below the batch, its default of 1024 on H100 included
        (
            ["--profile", "llama-3.1-8b-h100", "--max-num-batched-tokens", "512"],
            {},
            r"max_num_batched_tokens \(512\) must be greater than or equal",
        ),
        (["--max-num-batched-tokens", "512", "--max-num-seqs", "600"], {}, r"max_num_seqs \(600\)"),
        (
            ["--kv-transfer-config", json.dumps({**NIXL, "kv_load_failure_policy": "retry"})],
            {},
            "kv_load_failure_policy must be",
        ),
    ],
)
def test_bad_settings_name_the_problem(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_for(argv, env)


def pd_settings(tp: int = 2) -> Any:
    from inferencepool.builders.lmcache import LMCacheSettings

    return LMCacheSettings(
        mode="LMCachePD",
        p2p=False,
        tensor_parallel_size=tp,
        chunk_size=256,
        cpu_offload_gib=0,
        disk_gib=0,
        controller_host="",
        proxy_host="router.prod.svc",
        pd_buffer_bytes=tp * 2 * 2**30,  # per pod: 2 GiB per rank
        pd_max_prefill_len=16384,
    )


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_lmcache_pd_mode_from_the_operators_files(tmp_path: Path, role: str) -> None:
    """The fake reads the LMCache YAML and kv-transfer-config the operator writes for a PD pool."""
    from inferencepool.builders import kvtransfer, lmcache

    settings = pd_settings()
    config_file = tmp_path / "lmcache.yaml"
    config_file.write_text(lmcache.engine_config_yaml(role, settings))  # type: ignore[arg-type]
    kv = kvtransfer.kv_transfer_config_json(role, "LMCachePD", True)  # type: ignore[arg-type]
    env = {"LMCACHE_CONFIG_FILE": str(config_file), "LMCACHE_PD_PEER_HOST": "10.0.0.7"}
    config = config_for(
        [
            "serve",
            "m",
            "--host",
            "10.0.0.7",
            "-tp",
            "2",
            "--kv-transfer-config",
            kv,
            "--profile",
            "llama-3.1-8b-h100",
        ],
        env,
    )
    assert config.lmcache.cpu_capacity_chunks == 0 and not config.lmcache.p2p
    if role == "prefill":
        assert config.pd.role == config.lmcache.pd_role == "sender"
        assert (config.pd.proxy_host, config.pd.proxy_port) == ("router.prod.svc", lmcache.PD_PROXY_PORT)
        assert not config.lmcache.load and config.lmcache.save
    else:
        assert config.pd.role == config.lmcache.pd_role == "receiver"
        assert config.pd.peer_host == "10.0.0.7"
        assert config.pd.init_ports == tuple(lmcache.pd_init_ports(2))
        assert config.pd.alloc_ports == tuple(lmcache.pd_alloc_ports(2))
        # 2 GiB per rank; a rank holds half of each 256-token chunk of Llama-3.1-8B (128 KiB/token)
        assert config.lmcache.pd_buffer_chunks == 2 * 2**30 // (256 * 131072 // 2)
        assert config.lmcache.load and not config.lmcache.save
        assert config.lmcache.skip_last_n_tokens == 1 and config.lmcache.pd_max_prefill_len == 16384
        assert config.pd.allocation_timeout_s == lmcache.PD_ALLOCATION_TIMEOUT_SECONDS


def test_lmcache_pd_settings_from_the_environment() -> None:
    kv = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_consumer"})
    env = {
        "LMCACHE_ENABLE_PD": "true",
        "LMCACHE_PD_ROLE": "receiver",
        "LMCACHE_PD_BUFFER_SIZE": "1073741824",
        "LMCACHE_PD_PEER_INIT_PORT": "0,0",
        "LMCACHE_PD_PEER_ALLOC_PORT": "0,0",
    }
    config = config_for(["--host", "127.0.0.9", "-tp", "2", "--kv-transfer-config", kv], env)
    assert config.pd.peer_host == "127.0.0.9"  # no pd_peer_host: the engine's own address
    assert config.pd.init_ports == config.pd.alloc_ports == (0, 0)


PD_KV = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_producer"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LMCACHE_ENABLE_PD": "1", "LMCACHE_PD_ROLE": "both"}, 'pd_role must be "sender" or "receiver"'),
        ({"LMCACHE_ENABLE_PD": "1", "LMCACHE_PD_ROLE": "sender"}, "needs pd_proxy_host and pd_proxy_port"),
        (
            {"LMCACHE_ENABLE_PD": "1", "LMCACHE_PD_ROLE": "sender", "LMCACHE_PD_PROXY_HOST": "r",
             "LMCACHE_PD_PROXY_PORT": "x"},
            "pd_proxy_port must be an integer",
        ),
        (
            {"LMCACHE_ENABLE_PD": "1", "LMCACHE_PD_ROLE": "receiver", "LMCACHE_PD_BUFFER_SIZE": "1000",
             "LMCACHE_PD_PEER_INIT_PORT": "7300", "LMCACHE_PD_PEER_ALLOC_PORT": "7400,7401"},
            "pd_peer_init_port needs one port per TP rank (2)",
        ),
        (
            {"LMCACHE_ENABLE_PD": "1", "LMCACHE_PD_ROLE": "receiver", "LMCACHE_PD_PEER_INIT_PORT": "1,2",
             "LMCACHE_PD_PEER_ALLOC_PORT": "3,4"},
            "needs pd_buffer_size",
        ),
        (
            {"LMCACHE_ENABLE_PD": "1", "LMCACHE_ENABLE_P2P": "1", "LMCACHE_PD_ROLE": "sender",
             "LMCACHE_PD_PROXY_HOST": "r", "LMCACHE_PD_PROXY_PORT": "1"},
            "enable_pd and enable_p2p cannot both be true",
        ),
    ],
)  # fmt: skip
def test_bad_lmcache_pd_settings_name_the_key(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        config_for(["-tp", "2", "--kv-transfer-config", PD_KV], env)


@pytest.mark.parametrize(
    ("role", "flag", "refused"),
    [
        ("kv_producer", "--prefill-context-parallel-size", False),
        ("kv_consumer", "--prefill-context-parallel-size", True),
        ("kv_both", "--prefill-context-parallel-size", True),
        ("kv_producer", "--pipeline-parallel-size", False),
        ("kv_both", "--pipeline-parallel-size", False),
        ("kv_consumer", "--pipeline-parallel-size", True),
    ],
)
def test_nixl_refuses_parallelism_by_kv_role_as_vllm_does(role: str, flag: str, refused: bool) -> None:
    """NixlConnector: prefill-context parallelism only on a producer, pipeline parallelism not on a consumer
    (docs/engine-contract.md section 3). A pod lent the other phase keeps its role, so these bind it too."""
    argv = ["--kv-transfer-config", json.dumps({**NIXL, "kv_role": role}), flag, "2"]
    if not refused:
        assert config_for(argv).nixl
        return
    with pytest.raises(ValueError, match=re.escape(flag)):
        config_for(argv)
