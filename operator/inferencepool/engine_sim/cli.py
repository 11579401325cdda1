"""`inferencepool fake-engine [serve] [MODEL] ...`: run the fake engine with vLLM's own serve flags.

The same pod spec runs the real vLLM image or this one, so the fake is as strict as `vllm serve` 0.33 where
the operator depends on it: every vLLM 0.33 flag is accepted (engine_sim/vllm_flags.py, generated from the
released wheel), a flag vLLM does not know is refused, and --kv-transfer-config is checked as vLLM's
KVTransferConfig checks it (unknown fields, kv_role). Flags that change the timing model
(--tensor-parallel-size, --max-model-len, --gpu-memory-utilization, --max-num-batched-tokens, --max-num-seqs,
--block-size, --[no-]enable-prefix-caching) are honoured, and so is --shutdown-timeout (0, vLLM's default,
aborts in-flight requests on SIGTERM; N drains requests and held NIXL KV for up to N seconds); the other vLLM
flags are ignored. Fake-only flags: --profile (or env FAKE_ENGINE_PROFILE), --role, --time-scale (or env
FAKE_ENGINE_TIME_SCALE), --nixl-side-channel-port, --load-time.

P/D disaggregation needs a NIXL connector, as in vLLM: `--kv-transfer-config '{"kv_connector":"NixlConnector",
"kv_role":"kv_producer"}'` (kv_consumer on decode; kv_both still works but is deprecated); `--role
prefill|decode` without a config turns it on too (a shortcut for local runs). LMCache PD mode is
LMCacheConnectorV1 with kv_role kv_producer / kv_consumer (kv_connector_extra_config discard_partial_chunks,
skip_last_n_tokens) and, in the LMCache settings (LMCACHE_CONFIG_FILE, then LMCACHE_<KEY> variables),
enable_pd with pd_role sender (pd_proxy_host, pd_proxy_port) / receiver (pd_peer_host, else --host;
pd_peer_init_port, pd_peer_alloc_port, one per TP rank, 0 for a free port; pd_buffer_size in bytes per rank,
pd_allocation_timeout_sec, pd_max_prefill_len). LMCache p2p is enable_p2p with enable_controller, as LMCache
requires: lmcache_instance_id, controller_pull_url, controller_reply_url, lmcache_worker_ports, p2p_host,
p2p_init_ports, p2p_lookup_ports (one per TP rank, 0 for a free port). See docs/engine-contract.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferencepool.engine_sim.vllm_flags import KV_TRANSFER_CONFIG_FIELDS, SERVE_FLAGS

if TYPE_CHECKING:
    from inferencepool.engine_sim.config import P2PConfig
    from inferencepool.engine_sim.server import PdConfig
    from inferencepool.perf.profiles import EngineProfile

NIXL = "NixlConnector"
LMCACHE = "LMCacheConnectorV1"
log = logging.getLogger("inferencepool.fake_engine")

# The vLLM flags the fake models are declared in configure; every other flag of vLLM 0.33's `vllm serve` is
# accepted and ignored, and anything else is refused, as vLLM's own parser refuses it.


class _IgnoredVllmFlag(argparse.Action):
    """A vLLM flag that means nothing to the fake: consumed with its value(s) and remembered."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        ignored = list(getattr(namespace, "ignored_vllm_args", None) or [])
        ignored.append(str(option_string))
        namespace.ignored_vllm_args = ignored


_NARGS: dict[str, int | str | None] = {"bool": 0, "switch": 0, "value": None, "values": "+", "optional": "?"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("words", nargs="*", metavar="[serve] [MODEL]", help="as `vllm serve MODEL`")
    parser.add_argument("--model", default=None, help="model name or path (older vLLM spelling of MODEL)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json or a directory holding one")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--revision", default=None)
    parser.add_argument("--tokenizer-revision", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--kv-transfer-config", default=None, help="vLLM KVTransferConfig as JSON")
    # read only for the NIXL role checks (_check_nixl_parallel); the fake models one stage, one context rank
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    parser.add_argument("--prefill-context-parallel-size", "-pcp", type=int, default=1)
    parser.add_argument(
        "--shutdown-timeout",
        type=int,
        default=0,
        help="as vLLM: seconds to drain in-flight requests and held NIXL KV on SIGTERM; 0 (default) aborts",
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="timing profile (env FAKE_ENGINE_PROFILE; default cpu-demo), see perf/profiles.py",
    )
    parser.add_argument("--role", choices=("prefill", "decode", "both"), default="both")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="wall seconds per modelled second (env FAKE_ENGINE_TIME_SCALE; 0.1 runs 10x faster)",
    )
    parser.add_argument(
        "--nixl-side-channel-port",
        type=int,
        default=None,
        help="overrides env VLLM_NIXL_SIDE_CHANNEL_PORT (default 5600); 0 picks a free port",
    )
    parser.add_argument(
        "--load-time", type=float, default=0.0, help="seconds before listening (model loading)"
    )
    parser.add_argument("--log-level", default="INFO")
    parser.set_defaults(ignored_vllm_args=[])
    declared = {option for action in parser._actions for option in action.option_strings}
    for option, kind in SERVE_FLAGS.items():
        if option not in declared:
            parser.add_argument(
                option, nargs=_NARGS[kind], action=_IgnoredVllmFlag, default=None, help=argparse.SUPPRESS
            )


def _check_batch_limits(profile: Any, max_num_batched_tokens: int | None, max_num_seqs: int | None) -> None:
    """vLLM refuses max_num_batched_tokens < max_num_seqs (SchedulerConfig.verify_max_model_len), defaults
    included: 1024 sequences on H100/H200 (arg_utils.get_batch_defaults), so a small chunk alone fails."""
    tokens = profile.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    seqs = profile.max_num_seqs if max_num_seqs is None else max_num_seqs
    if tokens < seqs:
        raise ValueError(
            f"--max-num-batched-tokens: max_num_batched_tokens ({tokens}) must be greater than or equal to "
            f"max_num_seqs ({seqs})"
        )


def _check_nixl_parallel(kv_role: str, pipeline: int, prefill_context: int) -> None:
    """What NixlConnector refuses by kv_role (vLLM 0.33, docs/engine-contract.md section 3, roles): prefill
    context parallelism only on a producer (nixl/connector.py:NixlBaseConnector.__init__), pipeline
    parallelism not on a consumer (nixl/base_worker.py:NixlBaseConnectorWorker.__init__). A pod given the
    other phase's work keeps its role, so these hold for lent work too."""
    if prefill_context > 1 and kv_role in ("kv_consumer", "kv_both"):
        raise ValueError(
            "--prefill-context-parallel-size: NixlConnector PCP currently supports kv_producer only. "
            "Consumers and kv_both require prefill_context_parallel_size=1."
        )
    if pipeline > 1 and kv_role == "kv_consumer":
        raise ValueError(
            "--pipeline-parallel-size: NixlPushConnector consumer (decode) does not support "
            "pipeline_parallel_size > 1."
        )


def build_config(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Any:
    """EngineConfig from vLLM-style flags and environment; raises ValueError naming a bad flag or variable."""
    from inferencepool.engine_sim.core import LmcacheSettings
    from inferencepool.engine_sim.server import EngineConfig
    from inferencepool.engine_sim.tokenizer import load_tokenizer
    from inferencepool.perf.profiles import DEFAULT_PROFILE, get_profile

    env = dict(os.environ if environ is None else environ)
    words = list(args.words)
    if words and words[0] == "serve":
        words.pop(0)
    if len(words) > 1:
        raise ValueError(f"expected at most one MODEL argument, got {words}")
    profile = get_profile(args.profile or env.get("FAKE_ENGINE_PROFILE") or DEFAULT_PROFILE)
    _check_batch_limits(profile, args.max_num_batched_tokens, args.max_num_seqs)
    profile = profile.with_overrides(
        tensor_parallel=args.tensor_parallel_size,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        kv_block_tokens=args.block_size,
    )
    model = words[0] if words else (args.model or profile.model.name)
    served = args.served_model_name or [model]

    kv_config = _kv_transfer_config(args.kv_transfer_config)
    connectors = _connectors(kv_config)
    nixl_config = next((c for c in connectors if c.get("kv_connector") == NIXL), None)
    nixl = nixl_config is not None or args.role in ("prefill", "decode")
    if nixl_config is not None and nixl_config.get("kv_role") == "kv_both":
        log.warning(
            "Using kv_role='kv_both' with NixlConnector is deprecated (vLLM 0.33): set kv_producer for "
            "prefill instances and kv_consumer for decode instances"
        )
    if nixl_config is not None:
        _check_nixl_parallel(
            str(nixl_config.get("kv_role")), args.pipeline_parallel_size, args.prefill_context_parallel_size
        )
    lease = float(((nixl_config or {}).get("kv_connector_extra_config") or {}).get("kv_lease_duration", 30))
    failure_policy = (nixl_config or kv_config).get("kv_load_failure_policy", "fail")

    chunk_tokens = 256
    lmcache = None
    pd = None
    lmcache_config = next((c for c in connectors if c.get("kv_connector") == LMCACHE), None)
    if lmcache_config is not None:
        settings = _lmcache_settings(env)
        chunk_tokens = int(settings.get("chunk_size", 256))
        cpu_gb = (
            float(settings.get("max_local_cpu_size", 5.0))
            if _truthy(settings.get("local_cpu", True))
            else 0.0
        )
        _check_cpu_backend(settings, cpu_gb)
        # LMCache sizes its CPU tier per TP rank (max_local_cpu_size GiB), a rank holding its shard of a chunk
        chunk_bytes_per_rank = chunk_tokens * profile.model.kv_bytes_per_token / profile.tensor_parallel
        cpu_chunks = int(cpu_gb * 1024**3 / chunk_bytes_per_rank)
        kv_role = lmcache_config["kv_role"]
        extra = lmcache_config.get("kv_connector_extra_config") or {}
        pd = (
            _pd_config(settings, args.host, profile, chunk_tokens)
            if _truthy(settings.get("enable_pd"))
            else None
        )
        p2p = _truthy(settings.get("enable_p2p", False))
        if pd is not None and p2p:
            raise ValueError(
                "LMCache settings: enable_pd and enable_p2p cannot both be true (LMCache refuses it)"
            )
        lmcache = LmcacheSettings(
            cpu_capacity_chunks=cpu_chunks,
            p2p=p2p,
            load=kv_role != "kv_producer",  # LMCache never loads into a producer (vllm_v1_adapter.py)
            save=kv_role != "kv_consumer",  # nor saves from a consumer
            pd_role=pd[0].role if pd else None,
            pd_buffer_chunks=pd[1] if pd else 0,
            discard_partial_chunks=_truthy(extra.get("discard_partial_chunks", False)),
            skip_last_n_tokens=_int_setting("skip_last_n_tokens", extra.get("skip_last_n_tokens", 0)),
            pd_max_prefill_len=_int_setting("pd_max_prefill_len", settings.get("pd_max_prefill_len", 0)),
        )

    side_host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or (
        args.host if args.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    )
    if args.nixl_side_channel_port is not None:
        side_port = args.nixl_side_channel_port
    else:
        side_port = _int_env(env, "VLLM_NIXL_SIDE_CHANNEL_PORT", 5600)
    p2p_config = (
        _p2p_config(settings, profile.tensor_parallel) if lmcache is not None and lmcache.p2p else None
    )
    time_scale = (
        args.time_scale if args.time_scale is not None else float(env.get("FAKE_ENGINE_TIME_SCALE", "1"))
    )
    if time_scale <= 0:
        raise ValueError("--time-scale must be > 0")
    return EngineConfig(
        profile=profile,
        served_model_names=list(served),
        model=model,
        host=args.host,
        port=args.port,
        engine_id=str(kv_config.get("engine_id") or uuid.uuid4()),
        nixl=nixl,
        side_channel_host=side_host,
        side_channel_port=side_port,
        kv_lease_s=lease,
        recompute_on_load_failure=failure_policy == "recompute",
        lmcache=lmcache,
        p2p=p2p_config,
        prefix_caching=args.enable_prefix_caching,
        chunk_tokens=chunk_tokens,
        time_scale=time_scale,
        tokenizer=load_tokenizer(args.tokenizer, model),
        role=args.role,
        pd=pd[0] if pd else None,
        revision=args.revision,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        enforce_handshake_compat=_truthy(
            ((nixl_config or {}).get("kv_connector_extra_config") or {}).get("enforce_handshake_compat", True)
        ),
    )


def _p2p_config(settings: dict[str, Any], tp: int) -> P2PConfig:
    """LMCache's checks for p2p (lmcache/v1/config.py _validate_config: enable_p2p asserts enable_controller
    and every address it needs), as errors naming the setting."""
    from inferencepool.engine_sim.config import P2PConfig

    if not _truthy(settings.get("enable_controller", False)):
        raise ValueError("LMCache settings: enable_p2p needs enable_controller (LMCache asserts it)")
    for key in ("lmcache_instance_id", "controller_pull_url", "controller_reply_url", "p2p_host"):
        if not settings.get(key):
            raise ValueError(f"LMCache settings: {key} is required when enable_controller/enable_p2p is set")
    for key in ("lmcache_worker_ports", "p2p_init_ports", "p2p_lookup_ports"):
        if settings.get(key) in (None, "", []):
            raise ValueError(f"LMCache settings: {key} is required when enable_controller/enable_p2p is set")
    return P2PConfig(
        instance_id=str(settings["lmcache_instance_id"]),
        controller_pull=str(settings["controller_pull_url"]),
        controller_reply=str(settings["controller_reply_url"]),
        host=str(settings["p2p_host"]),
        init_ports=_port_list("p2p_init_ports", settings["p2p_init_ports"], tp),
        lookup_ports=_port_list("p2p_lookup_ports", settings["p2p_lookup_ports"], tp),
        worker_ports=_port_list("lmcache_worker_ports", settings["lmcache_worker_ports"], tp),
    )


def _pd_config(
    settings: dict[str, Any], host: str, profile: EngineProfile, chunk_tokens: int
) -> tuple[PdConfig, int]:
    """LMCache PD settings -> the fake's PdConfig and the receiver's buffer capacity in chunks."""
    from inferencepool.engine_sim.server import PdConfig

    role = str(settings.get("pd_role") or "")
    tp = profile.tensor_parallel
    if role == "sender":
        proxy_host, proxy_port = settings.get("pd_proxy_host"), settings.get("pd_proxy_port")
        if not proxy_host or proxy_port in (None, ""):
            raise ValueError("LMCache settings: pd_role sender needs pd_proxy_host and pd_proxy_port")
        return PdConfig(
            role=role, proxy_host=str(proxy_host), proxy_port=_int_setting("pd_proxy_port", proxy_port)
        ), 0
    if role != "receiver":
        raise ValueError(
            f'LMCache settings: pd_role must be "sender" or "receiver" with enable_pd, got {role!r}'
        )
    init_ports = _port_list("pd_peer_init_port", settings.get("pd_peer_init_port"), tp)
    alloc_ports = _port_list("pd_peer_alloc_port", settings.get("pd_peer_alloc_port"), tp)
    buffer_bytes = settings.get("pd_buffer_size")
    if buffer_bytes in (None, ""):
        raise ValueError("LMCache settings: pd_role receiver needs pd_buffer_size (bytes)")
    # each rank's buffer holds its shard of every chunk
    chunk_bytes_per_rank = chunk_tokens * profile.model.kv_bytes_per_token / tp
    buffer_chunks = int(_int_setting("pd_buffer_size", buffer_bytes) // chunk_bytes_per_rank)
    peer_host = settings.get("pd_peer_host") or (host if host not in ("0.0.0.0", "::", "") else "127.0.0.1")
    timeout = settings.get("pd_allocation_timeout_sec", math.inf)
    try:
        allocation_timeout_s = float(timeout)
    except (TypeError, ValueError):
        raise ValueError(
            f"LMCache settings: pd_allocation_timeout_sec must be a number, got {timeout!r}"
        ) from None
    config = PdConfig(
        role=role,
        peer_host=str(peer_host),
        init_ports=init_ports,
        alloc_ports=alloc_ports,
        allocation_timeout_s=allocation_timeout_s,
    )
    return config, buffer_chunks


def _kv_transfer_config(raw: str | None) -> dict[str, Any]:
    """--kv-transfer-config checked as vLLM's KVTransferConfig checks it (MultiConnector's children too)."""
    if not raw:
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kv-transfer-config is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError("--kv-transfer-config must be a JSON object")
    _check_kv_transfer_fields(config, "--kv-transfer-config")
    if config.get("kv_connector") == "MultiConnector":
        children = (config.get("kv_connector_extra_config") or {}).get("connectors")
        if not isinstance(children, list) or not children:
            raise ValueError(
                "--kv-transfer-config: MultiConnector needs kv_connector_extra_config.connectors"
            )
        for index, child in enumerate(children):
            if not isinstance(child, dict):
                raise ValueError(f"--kv-transfer-config: connectors[{index}] must be an object")
            _check_kv_transfer_fields(child, f"--kv-transfer-config connectors[{index}]")
    return config


def _check_kv_transfer_fields(config: dict[str, Any], where: str) -> None:
    # vLLM's @config dataclasses forbid extra fields (vllm/config/utils.py config)
    unknown = sorted(set(config) - set(KV_TRANSFER_CONFIG_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown KVTransferConfig field(s) {', '.join(unknown)}")
    for name, allowed in KV_TRANSFER_CONFIG_FIELDS.items():
        if allowed is not None and name in config and config[name] not in allowed:
            choices = ", ".join(dict.fromkeys(allowed))
            raise ValueError(f"{where}: {name} must be one of {choices}, got {config[name]!r}")
    if config.get("kv_connector") is not None and config.get("kv_role") is None:
        raise ValueError(f"{where}: kv_role is required when kv_connector is set (KVTransferConfig)")


def _check_cpu_backend(settings: dict[str, Any], cpu_gb: float) -> None:
    """LMCache asserts at start-up when p2p or the disk tier has no CPU backend to stage through
    (lmcache/v1/storage_backend/__init__.py CreateStorageBackends)."""
    if cpu_gb > 0:
        return
    if _truthy(settings.get("enable_p2p", False)):
        raise ValueError(
            "LMCache settings: enable_p2p needs the CPU backend (local_cpu and max_local_cpu_size > 0)"
        )
    disk = settings.get("local_disk")
    if disk and float(settings.get("max_local_disk_size", 0) or 0) > 0:
        raise ValueError(
            "LMCache settings: local_disk needs the CPU backend (local_cpu and max_local_cpu_size > 0)"
        )


def _int_setting(key: str, value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise ValueError(f"LMCache settings: {key} must be an integer, got {value!r}") from None


def _port_list(key: str, value: object, tp: int) -> tuple[int, ...]:
    """LMCache's int-list setting (a YAML list, or "7300,7301" from the environment), one port per TP rank."""
    if isinstance(value, list):
        parts: list[object] = list(value)
    elif isinstance(value, (int, str)) and not isinstance(value, bool):
        parts = [p.strip() for p in str(value).split(",") if p.strip()]
    else:
        parts = []
    ports = tuple(_int_setting(key, p) for p in parts)
    if len(ports) < tp:
        raise ValueError(f"LMCache settings: {key} needs one port per TP rank ({tp}), got {value!r}")
    return ports


def _connectors(kv_config: dict[str, Any]) -> list[dict[str, Any]]:
    if not kv_config:
        return []
    if kv_config.get("kv_connector") == "MultiConnector":
        extra = kv_config.get("kv_connector_extra_config") or {}
        return [c for c in extra.get("connectors", []) if isinstance(c, dict)]
    return [kv_config]


def _lmcache_settings(env: dict[str, str]) -> dict[str, Any]:
    """LMCache's own precedence: the YAML at LMCACHE_CONFIG_FILE, then LMCACHE_<KEY> variables."""
    import yaml

    settings: dict[str, Any] = {}
    path = env.get("LMCACHE_CONFIG_FILE")
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ValueError(f"LMCACHE_CONFIG_FILE {path}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"LMCACHE_CONFIG_FILE {path} must hold a YAML mapping")
        settings.update(loaded)
    for key in _ENV_KEYS:
        value = env.get(f"LMCACHE_{key.upper()}")
        if value is not None:
            settings[key] = value
    return settings


_ENV_KEYS = (
    "chunk_size", "local_cpu", "max_local_cpu_size", "local_disk", "max_local_disk_size", "enable_p2p",
    "enable_pd", "pd_role", "pd_buffer_size", "pd_peer_host", "pd_peer_init_port", "pd_peer_alloc_port",
    "pd_proxy_host", "pd_proxy_port", "pd_allocation_timeout_sec", "pd_max_prefill_len", "enable_controller",
    "lmcache_instance_id", "controller_pull_url", "controller_reply_url", "lmcache_worker_ports", "p2p_host",
    "p2p_init_ports", "p2p_lookup_ports",
)  # fmt: skip


def _truthy(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _int_env(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log = logging.getLogger("inferencepool.fake_engine")
    try:
        config = build_config(args)
    except ValueError as exc:
        print(f"fake-engine: {exc}", file=sys.stderr)
        return 2
    if args.ignored_vllm_args:
        log.info("ignoring vLLM flags the fake engine does not model: %s", " ".join(args.ignored_vllm_args))
    return asyncio.run(_serve(config, args.shutdown_timeout, args.load_time))


async def _serve(config: Any, shutdown_timeout: int, load_time: float) -> int:
    from inferencepool.engine_sim.server import FakeEngine

    log = logging.getLogger("inferencepool.fake_engine")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if load_time > 0:
        log.info("loading model (simulated, %.1f s)", load_time)
        try:
            async with asyncio.timeout(load_time):  # not wait_for, which can swallow a cancellation on 3.11
                await stop.wait()
            return 0
        except TimeoutError:
            pass
    engine = FakeEngine(config)
    await engine.start()
    print(f"fake engine listening on {config.host}:{engine.port}", flush=True)
    await stop.wait()
    # vLLM: --shutdown-timeout 0 aborts whatever is in flight; N > 0 drains requests and held NIXL KV for N s
    mode = "abort" if shutdown_timeout == 0 else "drain"
    log.info("[shutdown] mode=%s timeout=%ds", mode, shutdown_timeout)
    drained = await engine.drain(shutdown_timeout * config.time_scale)
    if not drained:
        log.warning("shutdown timeout: aborting requests and KV holds still in flight")
    await engine.stop()
    return 0
