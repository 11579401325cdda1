"""The router's configuration: one pydantic model, written by the operator into the router's ConfigMap.

Importable without aiohttp or the Kubernetes client: the operator's builder imports it to render the
ConfigMap, the router's CLI to read it back. Field names are camelCase on the wire (as in the InferencePool
spec they come from) and snake_case in Python; durations and percentages are integers, like the rest of the
API.
"""

from __future__ import annotations

from typing import Annotated, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from inferencepool.api.v1alpha1 import (
    DEFAULT_ADAPTIVE_MAX_TOKENS,
    DEFAULT_ADAPTIVE_MIN_TOKENS,
    DEFAULT_PREFILL_THRESHOLD_TOKENS,
    DEFAULT_QUEUED_REQUESTS,
    DEFAULT_RETRY_AFTER_SECONDS,
    MAX_QUEUE_MILLISECONDS,
    MAX_QUEUED_REQUESTS,
    MAX_RETRY_AFTER_SECONDS,
    KVConnector,
    RoutingPolicy,
)
from inferencepool.scheduling.scheduler import SchedulerConfig

# The API's own enums (spec.router.policy, spec.kvTransfer.connector), so values copy across as they are.
TransferMode = KVConnector
__all__ = ["KVConnector", "RouterConfig", "RoutingPolicy", "TransferMode", "parse_config"]

ENV_CONFIG = "INFERENCEPOOL_ROUTER_CONFIG"
MIN_STREAM_HEADERS_MILLISECONDS = 500
DEFAULT_ENGINE_PORT = 8000


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class AdaptiveThresholdConfig(_Model):
    """Moves the LengthAware threshold within [minTokens, maxTokens] from both pools' live load.

    When prefill legs queue past their TTFT target while decode ITL has headroom, the threshold rises (more
    prompts are prefilled on decode pods); when decode ITL runs past its target while prefill has headroom, it
    falls (more prompts go through the prefill pool). The current value is exported as a metric for the
    operator's status.
    """

    enabled: bool = False
    min_tokens: Annotated[int, Field(ge=1, description="lowest threshold the adaptation may reach")] = (
        DEFAULT_ADAPTIVE_MIN_TOKENS
    )
    max_tokens: Annotated[int, Field(ge=1, description="highest threshold the adaptation may reach")] = (
        DEFAULT_ADAPTIVE_MAX_TOKENS
    )
    interval_seconds: Annotated[
        int, Field(ge=1, le=3600, description="how often the threshold is reconsidered")
    ] = 5
    step_percent: Annotated[int, Field(ge=1, le=100, description="relative change per adjustment")] = 20
    ttft_target_milliseconds: Annotated[
        int, Field(ge=1, description="prefill-leg latency (router-observed) that counts as prefill queueing")
    ] = 800
    itl_target_milliseconds: Annotated[
        int,
        Field(
            ge=1, description="decode inter-token latency (router-observed) that counts as decode pressure"
        ),
    ] = 50
    percentile: Annotated[
        int, Field(ge=50, le=99, description="percentile of both signals that is compared")
    ] = 90
    min_samples: Annotated[int, Field(ge=1, description="samples per signal needed before any move")] = 20

    @model_validator(mode="after")
    def _bounds_ordered(self) -> Self:
        if self.min_tokens > self.max_tokens:
            raise ValueError(
                f"adaptiveThreshold.minTokens ({self.min_tokens}) must be <= maxTokens ({self.max_tokens})"
            )
        return self


class PrefixAffinityConfig(_Model):
    """Consistent hashing of the prompt's leading blocks onto pods, bounded by load: prefix hits stay put."""

    enabled: Annotated[bool, Field(description="spec.router.prefixAffinity of the pool")] = True
    block_tokens: Annotated[int, Field(ge=1, description="tokens per hashed block (LMCache chunk size)")] = (
        256
    )
    blocks: Annotated[int, Field(ge=1, le=64, description="leading blocks that make up the affinity key")] = 1
    shared_prefix_blocks: Annotated[
        int,
        Field(
            ge=1,
            le=1024,
            description="leading blocks a shared prefix needs before it keeps requests together on one pod "
            "(requests sharing fewer, such as a system prompt, spread by load)",
        ),
    ] = 4
    index_blocks: Annotated[
        int,
        Field(
            ge=1,
            le=1_000_000,
            description="block keys the router remembers per pod, least recently sent first out (about "
            "170 bytes each)",
        ),
    ] = 8192
    queued_tokens_percent: Annotated[
        int,
        Field(
            ge=0,
            le=1000,
            description="prefill tokens queued on a pod weigh against the tokens its cached prefix saves at "
            "this percent (100: the prompt starts when both are done; 0: the longest prefix under the load "
            "bound wins whatever is queued there)",
        ),
    ] = 100
    load_factor_percent: Annotated[
        int,
        Field(
            ge=100,
            le=1000,
            description="an affine pod is skipped once its load exceeds this share of the mean",
        ),
    ] = 125
    virtual_nodes: Annotated[int, Field(ge=1, le=1000, description="points per pod on the hash ring")] = 64
    min_load_bound: Annotated[
        int,
        Field(
            ge=1, description="an affine pod always takes the request while it has fewer in flight than this"
        ),
    ] = 4


class LMCachePDConfig(_Model):
    """Ports for LMCache PD mode (read only when kvTransfer.connector is LMCachePD)."""

    proxy_port: Annotated[
        int,
        Field(
            ge=0, le=65535, description="ZMQ PULL port the router binds (pd_proxy_port); 0 picks a free one"
        ),
    ] = 7500
    receiver_init_ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=lambda: [7300], description="decode pods' pd_peer_init_port, one per TP rank"
    )
    receiver_alloc_ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=lambda: [7400], description="decode pods' pd_peer_alloc_port, one per TP rank"
    )

    @model_validator(mode="after")
    def _one_port_per_rank(self) -> Self:
        if len(self.receiver_init_ports) != len(self.receiver_alloc_ports) or not self.receiver_init_ports:
            raise ValueError(
                "lmcachePD.receiverInitPorts and receiverAllocPorts need one port per TP rank each"
            )
        return self


class TimeoutsConfig(_Model):
    connect_milliseconds: Annotated[int, Field(ge=1, description="TCP connect to an engine pod")] = 2000
    prefill_seconds: Annotated[int, Field(ge=1, description="whole prefill leg (one token)")] = 300
    first_byte_seconds: Annotated[
        int, Field(ge=1, description="decode leg: until response headers arrive")
    ] = 600
    stream_headers_milliseconds: Annotated[
        int | None,
        Field(
            ge=1,
            description="streamed decode legs: a pod that sends no response headers in this long is hung "
            "and the leg goes to another pod (an engine sends a stream's headers once it accepted the "
            "request, long before its first token); unset: the TTFT target "
            "(adaptiveThreshold.ttftTargetMilliseconds), at least 500, so a request retried off a hung pod "
            "still sees its first token within about twice the target",
        ),
    ] = None
    idle_stream_seconds: Annotated[
        int, Field(ge=1, description="longest silence between two streamed chunks")
    ] = 300
    kv_push_seconds: Annotated[
        int,
        Field(
            ge=1,
            description="LMCache PD mode: how long the decode leg waits for the prefill engine's KV push "
            "notification after the prefill leg answered; then the decode pod prefills by itself",
        ),
    ] = 30
    drain_seconds: Annotated[
        int, Field(ge=0, description="on SIGTERM: how long in-flight requests may finish")
    ] = 120
    drain_grace_seconds: Annotated[
        int,
        Field(ge=0, description="on SIGTERM: keep accepting while /ready says 503, so Services drop the pod"),
    ] = 0


class OverloadConfig(_Model):
    """A bounded queue per pool and 429 past it (router/overload.py)."""

    enabled: bool = False
    max_queued_requests: Annotated[
        int,
        Field(
            ge=0,
            le=MAX_QUEUED_REQUESTS,
            description="the most requests each pool's queue holds (prefill, decode); the bound in force is "
            "what the pool lets in within maxQueueMilliseconds, by its slots and the time each is held, when "
            "lower; more are answered 429",
        ),
    ] = DEFAULT_QUEUED_REQUESTS
    max_queue_milliseconds: Annotated[
        int | None,
        Field(
            ge=1,
            le=MAX_QUEUE_MILLISECONDS,
            description="longest a request waits for a slot, then it is answered 429; unset: half the TTFT "
            "target (adaptiveThreshold.ttftTargetMilliseconds), the other half for its prefill",
        ),
    ] = None
    retry_after_seconds: Annotated[
        int, Field(ge=1, le=MAX_RETRY_AFTER_SECONDS, description="the Retry-After of a 429")
    ] = DEFAULT_RETRY_AFTER_SECONDS


class StaticBackends(_Model):
    """Fixed engine URLs for local runs and benchmarks; in a cluster the pool's Pods are discovered
    instead."""

    prefill: list[str] = Field(default_factory=list)
    decode: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _urls_look_like_urls(self) -> Self:
        for role, urls in (("prefill", self.prefill), ("decode", self.decode)):
            for url in urls:
                if not url.startswith("http://"):
                    raise ValueError(
                        f"static.{role}: {url!r} is not an http:// URL (engines serve plain HTTP)"
                    )
        return self


class RouterConfig(_Model):
    """Everything the router needs; either `pool` (Kubernetes discovery) or `static` backends must be
    given."""

    pool: Annotated[str | None, Field(description="InferencePool whose Pods are discovered")] = None
    namespace: Annotated[str, Field(description="namespace of the pool's Pods")] = "default"
    served_model_name: Annotated[
        str | None, Field(description="model name clients must send; None accepts any (static runs)")
    ] = None
    policy: RoutingPolicy = "LengthAware"
    prefill_threshold_tokens: Annotated[
        int, Field(ge=1, description="LengthAware: prompts this long disaggregate")
    ] = DEFAULT_PREFILL_THRESHOLD_TOKENS
    adaptive_threshold: AdaptiveThresholdConfig = Field(default_factory=AdaptiveThresholdConfig)
    prefix_affinity: PrefixAffinityConfig = Field(default_factory=PrefixAffinityConfig)
    transfer_mode: Annotated[KVConnector, Field(description="spec.kvTransfer.connector of the pool")] = "Nixl"
    lmcache_pd: LMCachePDConfig = Field(default_factory=LMCachePDConfig)
    tokenizer: Annotated[
        str | None,
        Field(description="tokenizer.json file, a folder holding one, or a model name in the local HF cache"),
    ] = None
    engine_port_name: Annotated[str, Field(description="container port name of the engine's HTTP port")] = (
        "http"
    )
    static: StaticBackends | None = None
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    overload: OverloadConfig = Field(default_factory=OverloadConfig)
    max_request_bytes: Annotated[int, Field(ge=1024, description="larger request bodies get 413")] = (
        32 * 1024 * 1024
    )
    max_attempts: Annotated[
        int, Field(ge=1, le=10, description="pods tried per leg when a connection fails before any byte")
    ] = 3
    engine_metrics_interval_milliseconds: Annotated[
        int,
        Field(
            ge=0,
            le=60_000,
            description="how often each engine's /metrics is read for its running and waiting requests and "
            "KV usage (load signals for pod and route choice); 0 turns it off",
        ),
    ] = 500
    role_lending: Annotated[
        bool,
        Field(
            description="serve a request whole on a prefill pod when every decode pod queues (LengthAware)"
        ),
    ] = False
    resume_streams: Annotated[
        bool,
        Field(description="continue a stream on another decode pod when its engine dies mid-answer"),
    ] = True

    @model_validator(mode="after")
    def _has_backends(self) -> Self:
        if self.pool is None and self.static is None:
            raise ValueError(
                "router config needs either `pool` (discover Pods) or `static` (fixed engine URLs)"
            )
        if self.adaptive_threshold.enabled and not (
            self.adaptive_threshold.min_tokens
            <= self.prefill_threshold_tokens
            <= self.adaptive_threshold.max_tokens
        ):
            raise ValueError(
                f"prefillThresholdTokens ({self.prefill_threshold_tokens}) must lie within adaptiveThreshold "
                f"[{self.adaptive_threshold.min_tokens}, {self.adaptive_threshold.max_tokens}]"
            )
        return self

    def stream_headers_seconds(self) -> float:
        """How long a streamed decode leg waits for its pod's response headers before trying another."""
        explicit = self.timeouts.stream_headers_milliseconds
        if explicit is not None:
            return explicit / 1000
        # below this, an engine's API server busy with other streams could miss it and look hung
        return max(self.adaptive_threshold.ttft_target_milliseconds, MIN_STREAM_HEADERS_MILLISECONDS) / 1000

    def overload_wait_seconds(self) -> float:
        """How long a request may wait in its pool's queue (overload.py) before it is answered 429."""
        explicit = self.overload.max_queue_milliseconds
        if explicit is not None:
            return explicit / 1000
        return self.adaptive_threshold.ttft_target_milliseconds / 2000

    def scheduling(self) -> SchedulerConfig:
        """The scheduling core's settings (the router's and the simulator's `Scheduler`)."""
        affinity = self.prefix_affinity
        return SchedulerConfig(
            policy=self.policy,
            ttft_target_seconds=self.adaptive_threshold.ttft_target_milliseconds / 1000,
            itl_target_seconds=self.adaptive_threshold.itl_target_milliseconds / 1000,
            block_tokens=affinity.block_tokens if affinity.enabled else 0,
            anchor_blocks=affinity.shared_prefix_blocks,
            load_factor=affinity.load_factor_percent / 100,
            min_load_bound=affinity.min_load_bound,
            queue_weight=affinity.queued_tokens_percent / 100,
            lending=self.role_lending and self.policy == "LengthAware",
        )

    def to_wire(self) -> dict[str, object]:
        """The camelCase document the operator writes into the ConfigMap (defaults included, so it is
        explicit)."""
        return self.model_dump(mode="json", by_alias=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_wire(), sort_keys=False)


class ConfigError(ValueError):
    """A router configuration that cannot be used, with the reason in words."""


def parse_config(text: str, source: str) -> RouterConfig:
    """Parse YAML or JSON text (JSON is YAML) into a RouterConfig; errors name the source and the field."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML/JSON: {error}") from error
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(document).__name__}")
    try:
        return RouterConfig.model_validate(document)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or '(top)'}: {item['msg']}"
            for item in error.errors()
        )
        raise ConfigError(f"{source}: {problems}") from error
