"""LMCache 0.5.6 engine configuration: one YAML document per engine pool, per-pod values from the downward
API.

The file lands in a ConfigMap (one per pool) mounted into every engine pod and is named by
LMCACHE_CONFIG_FILE. What differs between pods of one pool (their own IP for p2p and PD, their own instance
id for the LMCache controller) cannot be in a shared file, so it is passed as LMCACHE_<KEY> environment
variables, which LMCache applies over the file. Keys and their meaning are checked in tests against
`lmcache.v1.config.LMCacheEngineConfig` itself; what each key does is in docs/engine-contract.md.

Sizes in the spec are per pod; LMCache's are per tensor-parallel rank (every rank is its own LMCache worker
with its own CPU tier, disk budget and PD buffer), so each is divided by the pool's TP size here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from inferencepool.builders.common import Manifest, field_env, tcp_port
from inferencepool.builders.kvtransfer import EngineRole, TransferMode

CONFIG_DIR = "/etc/lmcache"
CONFIG_KEY = "lmcache.yaml"
CONFIG_FILE = f"{CONFIG_DIR}/{CONFIG_KEY}"
LOCAL_DISK_PATH = "/var/cache/lmcache"

# Ports, one per tensor-parallel rank where LMCache binds one socket per rank.
P2P_INIT_PORT = 8200
P2P_LOOKUP_PORT = 8201
P2P_PORT_STRIDE = 2  # init and lookup interleave: rank r uses 8200+2r and 8201+2r
WORKER_PORT = 8500
PD_INIT_PORT = 7300
PD_ALLOC_PORT = 7400
PD_PROXY_PORT = 7500

CONTROLLER_HTTP_PORT = 9000
CONTROLLER_PULL_PORT = 8300
CONTROLLER_REPLY_PORT = 8400

GIB = 1024**3
# LMCache admits a PD push only when all of its chunks fit and by default waits forever for room
# (pd_allocation_timeout_sec inf); bounded, a push that finds no room fails before the router stops waiting
# (30 s).
PD_ALLOCATION_TIMEOUT_SECONDS = 20.0


@dataclass(frozen=True)
class LMCacheSettings:
    """Everything the LMCache files depend on, resolved from the pool spec (defaults already applied)."""

    mode: TransferMode
    p2p: bool
    tensor_parallel_size: int
    chunk_size: int
    cpu_offload_gib: int
    disk_gib: int
    controller_host: str  # DNS name of the LMCache controller Service (p2p)
    proxy_host: str  # DNS name of the router Service (LMCache PD mode notifications)
    pd_buffer_bytes: int = 2 * GIB  # per pod (split across TP ranks)
    pd_max_prefill_len: int = 0  # tokens the PD buffer must hold (LMCache checks at start); 0: unchecked


def p2p_init_ports(tp: int) -> list[int]:
    return [P2P_INIT_PORT + P2P_PORT_STRIDE * rank for rank in range(tp)]


def p2p_lookup_ports(tp: int) -> list[int]:
    return [P2P_LOOKUP_PORT + P2P_PORT_STRIDE * rank for rank in range(tp)]


def worker_ports(tp: int) -> list[int]:
    return [WORKER_PORT + rank for rank in range(tp)]


def pd_init_ports(tp: int) -> list[int]:
    return [PD_INIT_PORT + rank for rank in range(tp)]


def pd_alloc_ports(tp: int) -> list[int]:
    return [PD_ALLOC_PORT + rank for rank in range(tp)]


def engine_config(role: EngineRole, settings: LMCacheSettings) -> dict[str, Any]:
    """The LMCache YAML document (as a dict) for one engine pool."""
    tp = settings.tensor_parallel_size
    if settings.mode == "LMCachePD":
        if settings.p2p:
            raise ValueError(
                "kvCache.p2p.enabled cannot be combined with LMCache PD mode (LMCache refuses it)"
            )
        return _pd_config(role, settings, tp)
    config: dict[str, Any] = {
        "chunk_size": settings.chunk_size,
        "local_cpu": settings.cpu_offload_gib > 0,
        "max_local_cpu_size": per_rank_gib(settings.cpu_offload_gib, tp),
        **_disk(settings),
    }
    if not settings.p2p:
        return config
    config |= {
        "enable_p2p": True,
        "p2p_init_ports": p2p_init_ports(tp),
        "p2p_lookup_ports": p2p_lookup_ports(tp),
        "transfer_channel": "nixl",
        "enable_controller": True,
        "controller_pull_url": f"{settings.controller_host}:{CONTROLLER_PULL_PORT}",
        "controller_reply_url": f"{settings.controller_host}:{CONTROLLER_REPLY_PORT}",
        "lmcache_worker_ports": worker_ports(tp),
    }
    return config


def per_rank_gib(pod_gib: int, tp: int) -> float:
    """A per-pod size in GiB as LMCache's per-rank setting (GiB, 1024**3 bytes: local_cpu_backend.py)."""
    return pod_gib / tp


def _disk(settings: LMCacheSettings) -> dict[str, Any]:
    if settings.disk_gib <= 0:
        return {}
    return {
        "local_disk": f"file://{LOCAL_DISK_PATH}/",
        "max_local_disk_size": per_rank_gib(settings.disk_gib, settings.tensor_parallel_size),
    }


def _pd_config(role: EngineRole, settings: LMCacheSettings, tp: int) -> dict[str, Any]:
    # PD mode moves KV through its own NIXL buffer; the CPU tier would only duplicate it on the sender, and on
    # the receiver LMCache insists the PD backend is the only place to load from.
    config: dict[str, Any] = {
        "chunk_size": settings.chunk_size,
        "local_cpu": False,
        "max_local_cpu_size": 0.0,
        "enable_pd": True,
        # per rank, on each rank's GPU; the sender stages the KV it pushes in a buffer of its own too
        "pd_buffer_size": settings.pd_buffer_bytes // tp,
        "pd_buffer_device": "cuda",
        "pd_allocation_timeout_sec": PD_ALLOCATION_TIMEOUT_SECONDS,
        "transfer_channel": "nixl",
        "nixl_backends": ["UCX"],
    }
    if settings.pd_max_prefill_len > 0:
        config["pd_max_prefill_len"] = settings.pd_max_prefill_len
    if role == "prefill":
        config.update(
            {"pd_role": "sender", "pd_proxy_host": settings.proxy_host, "pd_proxy_port": PD_PROXY_PORT}
        )
    else:
        config.update(
            {
                "pd_role": "receiver",
                "pd_peer_init_port": pd_init_ports(tp),
                "pd_peer_alloc_port": pd_alloc_ports(tp),
            }
        )
    return config


def engine_config_yaml(role: EngineRole, settings: LMCacheSettings) -> str:
    return yaml.safe_dump(engine_config(role, settings), sort_keys=True, default_flow_style=False)


def pod_env(role: EngineRole, settings: LMCacheSettings) -> list[Manifest]:
    """Per-pod LMCache values (they override the shared file): own IP and own name, from the downward API."""
    env: list[Manifest] = [{"name": "LMCACHE_CONFIG_FILE", "value": CONFIG_FILE}]
    if settings.mode == "LMCachePD":
        if role == "decode":
            # The receiver binds its init/alloc sockets on this address; the router tells the sender to dial
            # it.
            env.append(field_env("LMCACHE_PD_PEER_HOST", "status.podIP"))
    elif settings.p2p:
        env.append(field_env("LMCACHE_P2P_HOST", "status.podIP"))
        env.append(field_env("LMCACHE_LMCACHE_INSTANCE_ID", "metadata.name"))
    return env


def container_ports(role: EngineRole, settings: LMCacheSettings) -> list[Manifest]:
    """Ports other pods dial: p2p init/lookup and the controller's worker socket, or the PD receiver's
    sockets."""
    tp = settings.tensor_parallel_size
    ports: list[tuple[str, int]] = []
    if settings.mode == "LMCachePD":
        if role == "decode":
            ports += [(f"pd-init-{r}", p) for r, p in enumerate(pd_init_ports(tp))]
            ports += [(f"pd-alloc-{r}", p) for r, p in enumerate(pd_alloc_ports(tp))]
    elif settings.p2p:
        ports += [(f"p2p-init-{r}", p) for r, p in enumerate(p2p_init_ports(tp))]
        ports += [(f"p2p-lookup-{r}", p) for r, p in enumerate(p2p_lookup_ports(tp))]
        ports += [(f"lmc-worker-{r}", p) for r, p in enumerate(worker_ports(tp))]
    return [tcp_port(name, port) for name, port in ports]


def controller_command() -> list[str]:
    monitor_ports = f'{{"pull":{CONTROLLER_PULL_PORT},"reply":{CONTROLLER_REPLY_PORT}}}'
    return [
        "lmcache_controller",
        "--host",
        "0.0.0.0",
        "--port",
        str(CONTROLLER_HTTP_PORT),
        "--monitor-ports",
        monitor_ports,
    ]
