"""The fake engine's configuration: what `inferencepool fake-engine` resolves from vLLM's flags, the
environment and LMCache's settings (engine_sim/cli.py), or what a test passes directly."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

from inferencepool.engine_sim.core import LmcacheSettings
from inferencepool.engine_sim.nixl_compat import VLLM_VERSION, HandshakePayload, compatibility_hash
from inferencepool.engine_sim.tokenizer import EstimateTokenizer, Tokenizer
from inferencepool.perf.profiles import EngineProfile


@dataclass(frozen=True)
class PdConfig:
    """LMCache PD mode's sockets (the buffer size and role also go to LmcacheSettings for the core)."""

    role: str  # "sender" (prefill) or "receiver" (decode)
    peer_host: str = "127.0.0.1"  # receiver: where it listens (pd_peer_host, the pod IP)
    init_ports: tuple[int, ...] = (0,)  # receiver: pd_peer_init_port, one per TP rank (0: any free port)
    alloc_ports: tuple[int, ...] = (0,)  # receiver: pd_peer_alloc_port
    proxy_host: str | None = None  # sender: pd_proxy_host, the router
    proxy_port: int | None = None  # sender: pd_proxy_port
    push_timeout_s: float = 5.0  # sender: connect/handshake timeout of one rank (allocation waits longer)
    # receiver: how long an allocation waits for room in the PD buffer (LMCache's default: forever)
    allocation_timeout_s: float = math.inf

    def __post_init__(self) -> None:
        if self.role == "sender" and (self.proxy_host is None or self.proxy_port is None):
            raise ValueError("an LMCache PD sender needs pd_proxy_host and pd_proxy_port")
        if self.role == "receiver" and (not self.init_ports or len(self.init_ports) != len(self.alloc_ports)):
            raise ValueError(
                "an LMCache PD receiver needs one pd_peer_init_port and pd_peer_alloc_port per rank"
            )
        if self.role not in ("sender", "receiver"):
            raise ValueError(f'pd_role must be "sender" or "receiver", got {self.role!r}')


@dataclass(frozen=True)
class P2PConfig:
    """LMCache p2p through its controller (enable_p2p with enable_controller): what this engine's LMCache
    workers bind (p2p_host, one init, lookup and worker port per TP rank; 0: any free port) and the
    controller's sockets they dial ("host:port", controller_pull_url and controller_reply_url)."""

    instance_id: str  # lmcache_instance_id, the pod name
    controller_pull: str
    controller_reply: str
    host: str = "127.0.0.1"  # p2p_host, the pod IP
    init_ports: tuple[int, ...] = (0,)  # p2p_init_ports
    lookup_ports: tuple[int, ...] = (0,)  # p2p_lookup_ports
    worker_ports: tuple[int, ...] = (0,)  # lmcache_worker_ports
    # LMCache's socket timeouts (rpc_utils.py DEFAULT_SOCKET_RECV/SEND_TIMEOUT_MS), wall seconds
    recv_timeout_s: float = 30.0
    send_timeout_s: float = 10.0
    batch_timeout_s: float = 0.01  # kv_msg_batch_timeout: admit/evict batches go out this often

    def check(self, tensor_parallel: int) -> None:
        for name, ports in (
            ("p2p_init_ports", self.init_ports),
            ("p2p_lookup_ports", self.lookup_ports),
            ("lmcache_worker_ports", self.worker_ports),
        ):
            if len(ports) < tensor_parallel:
                raise ValueError(f"LMCache settings: {name} needs one port per TP rank ({tensor_parallel})")


@dataclass
class EngineConfig:
    profile: EngineProfile
    served_model_names: list[str]
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    nixl: bool = False
    side_channel_host: str = "127.0.0.1"
    side_channel_port: int = 5600
    kv_lease_s: float = 30.0
    recompute_on_load_failure: bool = False  # kv_load_failure_policy "recompute" instead of "fail"
    lmcache: LmcacheSettings | None = None
    p2p: P2PConfig | None = None  # LMCache p2p: the controller and this engine's sockets (lmcache.p2p)
    prefix_caching: bool = True
    chunk_tokens: int = 256
    time_scale: float = 1.0
    tokenizer: Tokenizer = field(default_factory=EstimateTokenizer)
    role: str = "both"
    pd: PdConfig | None = None  # LMCache PD mode (needs lmcache with the same pd_role)
    # What the NIXL handshake compares (nixl_compat.py): --revision, --dtype, --kv-cache-dtype, and whether
    # a mismatch is refused (kv_connector_extra_config enforce_handshake_compat, true by default)
    revision: str | None = None
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    enforce_handshake_compat: bool = True

    def handshake_payload(self) -> HandshakePayload:
        digest = compatibility_hash(
            VLLM_VERSION, self.model, self.revision, self.dtype, self.kv_cache_dtype, self.profile
        )
        return HandshakePayload(
            digest, self.engine_id, self.profile.kv_block_tokens, self.profile.tensor_parallel
        )

    def check(self) -> None:
        """What an engine refuses to start with, as vLLM or LMCache would."""
        if self.time_scale <= 0:
            raise ValueError("time scale must be > 0")
        if self.lmcache is not None and self.lmcache.p2p:
            if self.p2p is None:
                raise ValueError("LMCache p2p needs its controller settings (EngineConfig.p2p)")
            self.p2p.check(self.profile.tensor_parallel)
        pd_role = self.lmcache.pd_role if self.lmcache else None
        if (self.pd.role if self.pd else None) != pd_role:
            raise ValueError("LMCache PD mode needs both EngineConfig.pd and LmcacheSettings.pd_role, alike")
        if self.pd and self.pd.role == "receiver" and len(self.pd.init_ports) < self.profile.tensor_parallel:
            raise ValueError(
                f"pd_peer_init_port/pd_peer_alloc_port need one port per TP rank "
                f"({self.profile.tensor_parallel}), got {len(self.pd.init_ports)}"
            )
