"""What the diagnosis needs to know about the pool besides its measurements (pure): the targets, the routing
policy and threshold, the replica counts, the engine settings that matter, read from the `vllm serve`
arguments the operator generates (builders/engine.py), so what is judged is what the pods run, and the
capacity table the autoscaler's planner sizes the pool with (`autoscaler.planner_spec.capacity_seed`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from inferencepool.api.v1alpha1 import InferencePool, PoolRole
from inferencepool.autoscaler.capacity import CapacityModel
from inferencepool.autoscaler.planner_spec import capacity_seed
from inferencepool.builders.engine import vllm_args

# Used when the pool sets no target for a role (the simulator's defaults, a common interactive SLO).
DEFAULT_TTFT_MS: Final = 800
DEFAULT_ITL_MS: Final = 40
DEFAULT_PERCENTILE: Final = 90
# vLLM V1's default token budget per step for the OpenAI server on GPUs of 70 GB and more (2048 below).
VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS: Final = 8192


@dataclass(frozen=True)
class EngineSettings:
    """The engine flags that decide how prefills and decodes share a step."""

    chunked_prefill: bool = True  # vLLM V1 chunks prefills by default; --no-enable-chunked-prefill turns off
    max_num_batched_tokens: int | None = None  # None: vLLM's default
    prefix_caching: bool = True  # on by default in V1

    @property
    def token_budget(self) -> int:
        return self.max_num_batched_tokens or VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS

    def describe(self) -> str:
        budget = (
            str(self.max_num_batched_tokens)
            if self.max_num_batched_tokens is not None
            else f"vLLM default ({VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS} on >=70 GB GPUs)"
        )
        return (
            f"chunked prefill {'on' if self.chunked_prefill else 'OFF'}, max-num-batched-tokens {budget}, "
            f"prefix caching {'on' if self.prefix_caching else 'off'}"
        )


def _flag(args: Sequence[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` (the last one wins, as argparse does)."""
    value = None
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def _switch(args: Sequence[str], name: str, default: bool) -> bool:
    """argparse's BooleanOptionalAction: `--name`, `--no-name` (or `--name=false`); the last one wins."""
    state = default
    for arg in args:
        if arg == f"--{name}":
            state = True
        elif arg == f"--no-{name}":
            state = False
        elif arg.startswith(f"--{name}="):
            state = arg.split("=", 1)[1].strip().lower() in ("1", "true", "yes", "on")
    return state


def engine_settings(args: Sequence[str]) -> EngineSettings:
    """From `vllm serve` arguments; raises ValueError naming a flag whose value is not a number."""
    budget = _flag(args, "--max-num-batched-tokens")
    try:
        tokens = int(budget) if budget is not None else None
    except ValueError:
        raise ValueError(f"--max-num-batched-tokens must be an integer, got {budget!r}") from None
    return EngineSettings(
        chunked_prefill=_switch(args, "enable-chunked-prefill", True),
        max_num_batched_tokens=tokens,
        prefix_caching=_switch(args, "enable-prefix-caching", True),
    )


@dataclass(frozen=True)
class PoolSettings:
    ttft_target_ms: int = DEFAULT_TTFT_MS
    itl_target_ms: int = DEFAULT_ITL_MS
    percentile: int = DEFAULT_PERCENTILE
    policy: str = "LengthAware"
    threshold_tokens: int = 4096
    threshold_bounds: tuple[int, int] = (1, 131072)  # where a recommended threshold may go
    adaptive_threshold: bool = False
    prefill_replicas: int = 1
    decode_replicas: int = 1
    gpus_per_replica: int = 1
    prefill_engine: EngineSettings = field(default_factory=EngineSettings)
    decode_engine: EngineSettings = field(default_factory=EngineSettings)
    lmcache: bool = False
    cpu_offload_gib: int = 0
    p2p: bool = False
    connector: str = "Nixl"
    prefix_affinity: bool = True
    max_model_len: int | None = None
    max_replicas: dict[str, int] = field(default_factory=dict)  # autoscaling ceilings by role
    # what the planner sizes replicas with (None: its default profile's table), and one model load
    capacity: CapacityModel | None = None
    model_load_seconds: float | None = None

    @property
    def disaggregated(self) -> bool:
        return self.policy != "Colocated" and self.prefill_replicas > 0

    @property
    def gpus(self) -> int:
        return (self.prefill_replicas + self.decode_replicas) * self.gpus_per_replica

    def target_ms(self, role: PoolRole) -> int:
        return self.ttft_target_ms if role == "prefill" else self.itl_target_ms


def _target(pool: InferencePool, role: PoolRole) -> tuple[int | None, int | None]:
    """The role's target and percentile from its autoscaling block, even when autoscaling is off."""
    autoscaling = pool.spec.pool(role).autoscaling
    if autoscaling is None:
        return None, None
    target = autoscaling.target
    value = target.ttft_milliseconds if role == "prefill" else target.itl_milliseconds
    return value, target.percentile


def settings_from_pool(
    pool: InferencePool,
    replicas: dict[str, int] | None = None,
    ttft_ms: int | None = None,
    itl_ms: int | None = None,
) -> PoolSettings:
    """The pool's settings; `replicas` (pods found, by role) overrides the spec's counts, and `ttft_ms` /
    `itl_ms` the pool's targets."""
    spec = pool.spec
    ttft, ttft_percentile = _target(pool, "prefill")
    itl, itl_percentile = _target(pool, "decode")
    found = replicas or {}
    kv_cache = spec.kv_cache
    router = spec.router
    return PoolSettings(
        ttft_target_ms=ttft_ms or ttft or DEFAULT_TTFT_MS,
        itl_target_ms=itl_ms or itl or DEFAULT_ITL_MS,
        percentile=ttft_percentile or itl_percentile or DEFAULT_PERCENTILE,
        policy=router.policy,
        threshold_tokens=router.prefill_threshold_tokens,
        threshold_bounds=(
            router.threshold_bounds()
            if router.adaptive_threshold.enabled
            else (1, spec.engine.max_model_len or 131072)
        ),
        adaptive_threshold=router.adaptive_threshold.enabled,
        prefill_replicas=found.get("prefill", spec.prefill.initial_replicas()),
        decode_replicas=found.get("decode", spec.decode.initial_replicas()),
        gpus_per_replica=max(spec.gpus_per_replica("decode"), 1),
        prefill_engine=engine_settings(vllm_args(pool, "prefill")),
        decode_engine=engine_settings(vllm_args(pool, "decode")),
        lmcache=spec.uses_lmcache(),
        cpu_offload_gib=kv_cache.cpu_offload_gib if kv_cache is not None else 0,
        p2p=spec.p2p_enabled(),
        connector=spec.kv_transfer.connector,
        prefix_affinity=router.prefix_affinity,
        max_model_len=spec.engine.max_model_len,
        max_replicas={
            role: autoscaling.max_replicas
            for role in ("prefill", "decode")
            if (autoscaling := spec.pool(role).autoscaling) is not None and autoscaling.enabled
        },
        capacity=capacity_seed(spec),
        model_load_seconds=max(
            (
                float(a.model_load_seconds)
                for role in ("prefill", "decode")
                if (a := spec.pool(role).autoscaling)
            ),
            default=None,
        ),
    )
