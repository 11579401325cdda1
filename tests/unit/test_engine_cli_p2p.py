"""The fake engine reads LMCache's p2p settings as LMCache does, and refuses what LMCache asserts on."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inferencepool.cli import build_parser
from inferencepool.engine_sim.cli import build_config

LMCACHE = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
P2P_ENV = {
    "LMCACHE_MAX_LOCAL_CPU_SIZE": "2",
    "LMCACHE_ENABLE_P2P": "true",
    "LMCACHE_ENABLE_CONTROLLER": "true",
    "LMCACHE_CONTROLLER_PULL_URL": "demo-lmcache-controller.default.svc:8300",
    "LMCACHE_CONTROLLER_REPLY_URL": "demo-lmcache-controller.default.svc:8400",
    "LMCACHE_LMCACHE_WORKER_PORTS": "8500,8501",
    "LMCACHE_P2P_INIT_PORTS": "8200,8202",
    "LMCACHE_P2P_LOOKUP_PORTS": "8201,8203",
    "LMCACHE_P2P_HOST": "10.0.0.7",
    "LMCACHE_LMCACHE_INSTANCE_ID": "demo-decode-1",
}


def config_for(env: dict[str, str], tp: int = 2) -> Any:
    argv = ["fake-engine", "--kv-transfer-config", json.dumps(LMCACHE), "--tensor-parallel-size", str(tp)]
    return build_config(build_parser("fake-engine").parse_args(argv), env)


def test_p2p_settings_from_the_environment() -> None:
    p2p = config_for(P2P_ENV).p2p
    assert p2p.instance_id == "demo-decode-1" and p2p.host == "10.0.0.7"
    assert p2p.controller_pull == "demo-lmcache-controller.default.svc:8300"
    assert p2p.controller_reply == "demo-lmcache-controller.default.svc:8400"
    assert (p2p.init_ports, p2p.lookup_ports, p2p.worker_ports) == ((8200, 8202), (8201, 8203), (8500, 8501))


def test_no_p2p_no_controller_settings() -> None:
    assert config_for({"LMCACHE_MAX_LOCAL_CPU_SIZE": "2"}).p2p is None


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("LMCACHE_ENABLE_CONTROLLER", "enable_p2p needs enable_controller"),
        ("LMCACHE_LMCACHE_INSTANCE_ID", "lmcache_instance_id is required"),
        ("LMCACHE_CONTROLLER_REPLY_URL", "controller_reply_url is required"),
        ("LMCACHE_P2P_HOST", "p2p_host is required"),
        ("LMCACHE_P2P_LOOKUP_PORTS", "p2p_lookup_ports is required"),
    ],
)
def test_p2p_without_what_lmcache_asserts_is_refused(missing: str, message: str) -> None:
    env = {k: v for k, v in P2P_ENV.items() if k != missing}
    with pytest.raises(ValueError, match=message):
        config_for(env)


def test_one_port_per_rank() -> None:
    with pytest.raises(ValueError, match="p2p_init_ports needs one port per TP rank"):
        config_for({**P2P_ENV, "LMCACHE_P2P_INIT_PORTS": "8200"})
