"""The InferencePool custom resource, version v1alpha1, as pydantic models.

The CRD schema is generated from these models (`inferencepool crd`), so class docstrings and field
descriptions are what `kubectl explain inferencepool.spec...` shows: write them for the user. Defaults live
here, in code, and never in the CRD schema, so a GitOps tool never sees fields it did not write.

Cross-field rules are declared once in `SPEC_RULES`: the CRD turns each into a CEL rule
(x-kubernetes-validations) and the spec model checks the same rule in Python, with the same message, so a bad
spec is rejected with the same words by the API server, by the operator and by the tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from inferencepool.api import labels
from inferencepool.perf.models import KNOWN_MODELS, model_shape

API_VERSION: Final = f"{labels.GROUP}/{labels.VERSION}"

DEFAULT_ENGINE_IMAGE: Final = "vllm/vllm-openai:v0.33.0"
DEFAULT_ROUTER_IMAGE: Final = "inferencepool/router:0.1.0"
DEFAULT_PREFILL_THRESHOLD_TOKENS: Final = 4096
DEFAULT_ADAPTIVE_MIN_TOKENS: Final = 1024
DEFAULT_ADAPTIVE_MAX_TOKENS: Final = 16384
DEFAULT_MIN_REPLICAS: Final = 1
DEFAULT_TENSOR_PARALLEL_SIZE: Final = 1
DEFAULT_CPU_OFFLOAD_GIB: Final = 5
# Overload shedding (spec.router.overload): each pool's queue in the router, and the Retry-After of a 429.
DEFAULT_QUEUED_REQUESTS: Final = 64
MAX_QUEUED_REQUESTS: Final = 4096
MAX_QUEUE_MILLISECONDS: Final = 600_000
DEFAULT_RETRY_AFTER_SECONDS: Final = 1
MAX_RETRY_AFTER_SECONDS: Final = 3600
# The decode pool's prefill chunk (vLLM --max-num-batched-tokens; decode pods also prefill the prompts routed
# to them directly): the largest chunk whose prefill step fits the ITL target, measured in the simulator for
# Llama-3.1-8B on H100 (512 at 25 ms, 1024 at 40 ms; `inferencepool sim` chunk_for_itl). vLLM's own default
# (8192 on H100/H200) stretches a decode step to ~250 ms while a long prompt is prefilled beside it.
DECODE_CHUNK_TOKENS_TIGHT: Final = 512
DECODE_CHUNK_TOKENS: Final = 1024
DECODE_CHUNK_LOOSE_ITL_MS: Final = 40  # ITL targets from here up take the larger chunk
# vLLM refuses max_num_batched_tokens < max_num_seqs (SchedulerConfig), and its default max_num_seqs is 1024
# on H100/H200 (arg_utils.get_batch_defaults), so a smaller chunk caps the running batch at the chunk.
VLLM_DEFAULT_MAX_NUM_SEQS: Final = 1024
MIN_CHUNK_TOKENS: Final = 64
# LMCache PD reserves a whole prompt's chunks up front: the default receive buffer holds this many prompts of
# maxModelLen tokens at once.
PD_BUFFER_PROMPTS: Final = 2
GIB: Final = 1024**3

# The pool's name is its router Service's name and the prefix of every child's. The longest children are the
# Service `<name>-lmcache-controller` and the StatefulSet `<name>-prefill`, whose pods carry the label
# controller-revision-hash=<name>-prefill-<hash of up to 10 characters>; Service names and label values stop
# at 63 characters, so the name may have 63 - 19 = 44. Service names are DNS-1035 labels (a letter first, no
# dots).
MAX_POOL_NAME_LENGTH: Final = 44
POOL_NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Bounds, sized for real use and so that no spec reaches the size at which the copies of it kept in
# annotations overflow them: kopf's last-handled-configuration and kubectl's last-applied-configuration each
# copy the spec, and all annotations of an object share 256 KiB. Typed fields are bounded in the CRD;
# free-form subtrees (resources, affinity, tolerations, security contexts) only at their top level, so the
# model also bounds the spec as a whole (MAX_SPEC_BYTES, reported as Degraded where the API server let it
# through).
MAX_OBJECT_NAME_LENGTH: Final = 253  # names of Secrets and PVCs, Secret keys
MAX_REFERENCE_LENGTH: Final = 512  # model ids and paths, tokenizers, images
MAX_SERVED_NAME_LENGTH: Final = 256
MAX_REVISION_LENGTH: Final = 256
# A git ref or commit as the Hugging Face Hub takes it: no whitespace, no leading '-' (read as a flag).
REVISION_PATTERN: Final = r"^[^-\s][^\s]*$"
MAX_EXTRA_ARGS: Final = 64
MAX_EXTRA_ARG_LENGTH: Final = 4096
MAX_EXTRA_ARGS_TOTAL: Final = 16384
MAX_EXTRA_ENV: Final = 64
MAX_ENV_NAME_LENGTH: Final = 256
MAX_ENV_VALUE_LENGTH: Final = 4096
MAX_EXTRA_ENV_TOTAL: Final = 16384
MAX_NODE_SELECTOR_ENTRIES: Final = 32
MAX_TOLERATIONS: Final = 32
MAX_SECURITY_CONTEXT_FIELDS: Final = 16
MAX_REPLICAS: Final = 512
MAX_ROUTER_REPLICAS: Final = 64
MAX_GPUS_PER_REPLICA: Final = 64
MAX_TOKENS: Final = 16_777_216
MAX_SECONDS: Final = 3600
MAX_SPEC_BYTES: Final = 96 * 1024
# Label limits (prefix/name keys, values), for nodeSelector.
MAX_LABEL_KEY_LENGTH: Final = 317
MAX_LABEL_VALUE_LENGTH: Final = 63

# What the API server accepts as an EnvVar name (before 1.34 relaxed it): the pod template never fails on one.
ENV_VAR_NAME_PATTERN: Final = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

PoolRole = Literal["prefill", "decode"]
POOL_ROLES: Final[tuple[PoolRole, ...]] = ("prefill", "decode")
RoutingPolicy = Literal["LengthAware", "AlwaysDisaggregate", "Colocated"]
KVConnector = Literal["Nixl", "LMCachePD"]
ConditionStatus = Literal["True", "False", "Unknown"]
ScalingMode = Literal["Operator", "External"]

# Condition types the operator reports (Kubernetes API conventions: CamelCase).
CONDITION_READY: Final = "Ready"
CONDITION_PROGRESSING: Final = "Progressing"
CONDITION_DEGRADED: Final = "Degraded"
# True while an autoscaler wants more replicas than maxReplicas allows, i.e. the latency target is at risk.
CONDITION_SCALING_LIMITED: Final = "ScalingLimited"
# True while one phase limits the pool (status.bottleneck: the operator's diagnosis of its own metrics), False
# while every target is met, Unknown while the window holds too little traffic to judge.
CONDITION_BOTTLENECK: Final = "Bottleneck"
# The two conditions kstatus (Flux, kpt) reads, derived from the three above: Stalled mirrors Degraded (a user
# must act), Reconciling mirrors Progressing while the pool does not yet serve its latest spec (new replicas
# of a serving pool are not reconciling).
CONDITION_STALLED: Final = "Stalled"
CONDITION_RECONCILING: Final = "Reconciling"


class SpecModel(BaseModel):
    """Base of every spec model: camelCase on the wire, unknown fields rejected, no silent type coercion."""

    # strict: "2" or 2.0 for an integer field is an error, as it is for the API server's schema.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True, frozen=False
    )


class StatusModel(BaseModel):
    """Base of status models: written by the operator, read back tolerantly (unknown fields ignored)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


# --- spec


class SecretKeyRef(SpecModel):
    """A key of a Secret in the pool's namespace."""

    name: str = Field(min_length=1, max_length=MAX_OBJECT_NAME_LENGTH, description="Name of the Secret.")
    key: str = Field(
        min_length=1, max_length=MAX_OBJECT_NAME_LENGTH, description="Key inside the Secret, e.g. HF_TOKEN."
    )


ENV_VAR_VALUE_MESSAGE: Final = "spec.engine.extraEnv[] entries must set exactly one of value and valueFrom"
ENV_VAR_FIELDS: Final = ("name", "value", "valueFrom")

# A Kubernetes EnvVar as the CRD checks it: a valid name, then a value or a valueFrom (passed through whole).
# Unknown keys are kept by the API server (the schema predates this check) and refused by the model.
_ENV_VAR_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "description": "Environment variable name.",
            "pattern": ENV_VAR_NAME_PATTERN,
            "maxLength": MAX_ENV_NAME_LENGTH,
        },
        "value": {"type": "string", "description": "Its value.", "maxLength": MAX_ENV_VALUE_LENGTH},
        "valueFrom": {
            "type": "object",
            "description": "Where its value comes from (a Kubernetes EnvVarSource), instead of value.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
    },
    "required": ["name"],
    "x-kubernetes-preserve-unknown-fields": True,
    "x-kubernetes-validations": [
        {"rule": "has(self.value) != has(self.valueFrom)", "message": ENV_VAR_VALUE_MESSAGE}
    ],
}
EnvVar = Annotated[dict[str, Any], WithJsonSchema(_ENV_VAR_SCHEMA)]


def env_var_problems(index: int, item: Mapping[str, Any]) -> list[str]:
    """What is wrong with one engine.extraEnv entry, in the API server's words where it has them."""
    where = f"spec.engine.extraEnv[{index}]"
    problems = [f"{where}.{key}: unknown field" for key in item if key not in ENV_VAR_FIELDS]
    name = item.get("name")
    if name is None:
        problems.append(f"{where}.name: Required value")
    elif not isinstance(name, str) or re.fullmatch(ENV_VAR_NAME_PATTERN, name) is None:
        problems.append(f"{where}.name in body should match '{ENV_VAR_NAME_PATTERN}'")
    elif len(name) > MAX_ENV_NAME_LENGTH:
        problems.append(f"{where}.name must be at most {MAX_ENV_NAME_LENGTH} characters")
    if ("value" in item) == ("valueFrom" in item):
        problems.append(ENV_VAR_VALUE_MESSAGE)
    if "value" in item and not isinstance(item["value"], str):
        problems.append(f"{where}.value must be a string")
    elif len(item.get("value", "")) > MAX_ENV_VALUE_LENGTH:
        problems.append(f"{where}.value must be at most {MAX_ENV_VALUE_LENGTH} characters")
    if "valueFrom" in item and not isinstance(item["valueFrom"], dict):
        problems.append(f"{where}.valueFrom must be an object")
    return problems


class ModelCache(SpecModel):
    """Where model weights are cached between pod restarts."""

    persistent_volume_claim: str = Field(
        min_length=1,
        max_length=MAX_OBJECT_NAME_LENGTH,
        description="PersistentVolumeClaim mounted as HF_HOME (ReadWriteMany when pods span nodes).",
    )


class ModelSpec(SpecModel):
    """The model every engine of the pool serves."""

    name: str = Field(
        min_length=1,
        max_length=MAX_REFERENCE_LENGTH,
        description="Hugging Face model id (e.g. meta-llama/Llama-3.1-8B-Instruct) or a local path.",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SERVED_NAME_LENGTH,
        description="Model name clients send in requests (vLLM --served-model-name). Defaults to name.",
    )
    revision: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_REVISION_LENGTH,
        pattern=REVISION_PATTERN,
        description=(
            "Hugging Face revision of the model (a branch, tag or commit; vLLM --revision, and "
            "--tokenizer-revision when no other tokenizer is named). Production pins a commit. Changing it "
            "rolls both pools together, so that no request pairs a prefill pod of one revision with a "
            "decode pod of another. Defaults to the repository's default branch."
        ),
    )
    tokenizer: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_REFERENCE_LENGTH,
        description="Tokenizer id or path when it differs from the model's.",
    )
    cache: ModelCache | None = Field(
        default=None, description="Volume that caches downloaded weights. Without it pods download on start."
    )
    token_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the Hugging Face token (exposed to engines as HF_TOKEN).",
    )


class EngineSpec(SpecModel):
    """The vLLM engine that runs in every prefill and decode pod."""

    image: str = Field(
        default=DEFAULT_ENGINE_IMAGE,
        min_length=1,
        max_length=MAX_REFERENCE_LENGTH,
        description=f"Engine container image. Defaults to {DEFAULT_ENGINE_IMAGE}.",
    )
    extra_args: list[Annotated[str, Field(max_length=MAX_EXTRA_ARG_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_EXTRA_ARGS,
        description=(
            "Extra arguments appended to `vllm serve`, passed through unchanged "
            f"(at most {MAX_EXTRA_ARGS_TOTAL} characters in all)."
        ),
    )
    extra_env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_EXTRA_ENV,
        description=(
            "Extra environment variables for the engine container (Kubernetes EnvVar objects; values of at "
            f"most {MAX_EXTRA_ENV_TOTAL} characters in all)."
        ),
    )
    tensor_parallel_size: int = Field(
        default=DEFAULT_TENSOR_PARALLEL_SIZE,
        ge=1,
        le=MAX_GPUS_PER_REPLICA,
        description=(
            "GPUs one engine shards the model across (vLLM --tensor-parallel-size), for both pools unless "
            "prefill/decode.tensorParallelSize set their own. Defaults to 1."
        ),
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS,
        description="Maximum context length in tokens. Defaults to the model's own.",
    )
    gpu_memory_utilization_percent: int = Field(
        default=90,
        ge=1,
        le=100,
        description="GPU memory vLLM may use, in percent (--gpu-memory-utilization). Defaults to 90.",
    )

    @field_validator("extra_env")
    @classmethod
    def _check_env_vars(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        problems = [problem for index, item in enumerate(value) for problem in env_var_problems(index, item)]
        if problems:
            raise ValueError("; ".join(problems))
        return value


NODE_SELECTOR_MESSAGE: Final = (
    f"scheduling.nodeSelector keys must be at most {MAX_LABEL_KEY_LENGTH} characters and values at most "
    f"{MAX_LABEL_VALUE_LENGTH} (Kubernetes label limits)"
)


class Scheduling(SpecModel):
    """Where the pool's pods may run. Passed through to the pod spec unchanged."""

    node_selector: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_NODE_SELECTOR_ENTRIES,
        description="Pod nodeSelector.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        f"self.all(k, k.size() <= {MAX_LABEL_KEY_LENGTH} && "
                        f"self[k].size() <= {MAX_LABEL_VALUE_LENGTH})"
                    ),
                    "message": NODE_SELECTOR_MESSAGE,
                }
            ]
        },
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=MAX_TOLERATIONS,
        description="Pod tolerations (Kubernetes Toleration objects).",
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict,
        max_length=3,
        description="Pod affinity (a Kubernetes Affinity: nodeAffinity, podAffinity, podAntiAffinity).",
    )

    @field_validator("node_selector")
    @classmethod
    def _check_node_selector(cls, value: dict[str, str]) -> dict[str, str]:
        if any(len(k) > MAX_LABEL_KEY_LENGTH or len(v) > MAX_LABEL_VALUE_LENGTH for k, v in value.items()):
            raise ValueError(NODE_SELECTOR_MESSAGE)
        return value


class LatencyTarget(SpecModel):
    """The latency the autoscaler holds the pool to: TTFT for prefill, ITL for decode."""

    ttft_milliseconds: int | None = Field(
        default=None,
        ge=1,
        le=600_000,
        description="Time to first token, in milliseconds. Prefill pools only.",
    )
    itl_milliseconds: int | None = Field(
        default=None,
        ge=1,
        le=60_000,
        description="Inter-token latency, in milliseconds. Decode pools only.",
    )
    percentile: int = Field(
        default=90,
        ge=50,
        le=99,
        description="Percentile of the latency held to the target (50..99). Defaults to 90.",
    )


class Autoscaling(SpecModel):
    """Autoscaling of one pool by the SLA planner: replicas from the measured load (router and engine
    counters) over what one replica carries at the latency target, sized one model load ahead, with the
    observed percentile against the target as feedback. While on, the operator's autoscaler owns the replica
    count (mode Operator) or recommends it to an HPA or KEDA that does (mode External)."""

    enabled: bool = Field(
        default=True,
        description="Scale on the target. Defaults to true; false keeps the block but pins replicas.",
    )
    mode: ScalingMode = Field(
        default="Operator",
        description=(
            "Operator (default): the operator writes the StatefulSet's replicas. External: an HPA or KEDA "
            "does, and the operator only exports its observed percentile, target "
            "and the planner's recommended replicas as metrics (inferencepool_pool_*) and in status."
        ),
    )
    min_replicas: int = Field(
        default=DEFAULT_MIN_REPLICAS,
        ge=0,
        le=MAX_REPLICAS,
        description=(
            "Fewest replicas. Defaults to 1. Must be <= maxReplicas. 0 (prefill only): "
            "the prefill pool goes while disaggregation does not pay, the decode pods serve colocated, and "
            "it comes back when long prompts and load make it pay."
        ),
    )
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS, description=f"Most replicas (at most {MAX_REPLICAS}).")
    target: LatencyTarget = Field(
        description="Latency target: ttftMilliseconds for prefill, itlMilliseconds for decode."
    )
    window_seconds: int = Field(
        default=60,
        ge=1,
        le=MAX_SECONDS,
        description="Window over which the observed percentile is computed. Defaults to 60.",
    )
    interval_seconds: int = Field(
        default=15, ge=1, le=MAX_SECONDS, description="Seconds between scaling decisions. Defaults to 15."
    )
    tolerance_percent: int = Field(
        default=10,
        ge=0,
        le=100,
        description=(
            "How far over the target the observed percentile may be before the planner treats it as missed "
            "(its latency factor grows, and one replica is added when no more are planned). Defaults to 10."
        ),
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=MAX_SECONDS,
        description=(
            "No scale-down within this many seconds of a scale-up or of the planner's start (the evidence "
            "a scale-down waits for); scale-downs go one replica per decision. Defaults to 300."
        ),
    )
    max_scale_up_replicas: int = Field(
        default=4, ge=1, le=MAX_REPLICAS, description="Most replicas added by one decision. Defaults to 4."
    )
    model_load_seconds: int = Field(
        default=120,
        ge=0,
        le=MAX_SECONDS,
        description=(
            "Seconds from a scale-up to the new pod serving (image pull and model load). The planner "
            "sizes the pool for the load forecast that far ahead. Defaults to 120."
        ),
    )


MAX_RATIO_PERCENT: Final = 10_000  # prefill replicas per decode replica, at most 100:1 either way


class PrefillDecodeRatio(SpecModel):
    """Bounds on prefill replicas per decode replica, in percent (100: one prefill per decode), held by the
    planner while the prefill pool runs (a prefill pool at zero is outside them)."""

    min_percent: int = Field(
        default=0,
        ge=0,
        le=MAX_RATIO_PERCENT,
        description="Fewest prefill replicas per 100 decode replicas (rounded up). Defaults to 0.",
    )
    max_percent: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RATIO_PERCENT,
        description=(
            "Most prefill replicas per 100 decode replicas (rounded down, at least one prefill replica). "
            "No upper bound when unset. Must be >= minPercent."
        ),
    )


class PoolScaling(SpecModel):
    """Bounds across both pools that the SLA planner (prefill or decode autoscaling) holds. A decision a bound
    limits says so in its reason (RatioBound, BudgetLimited) in status and its event."""

    prefill_decode_ratio: PrefillDecodeRatio | None = Field(
        default=None, description="Bounds on prefill replicas per decode replica. Unbounded when absent."
    )
    gpu_budget: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICAS * MAX_GPUS_PER_REPLICA,
        description=(
            "Most GPUs both pools may use together (replicas x gpusPerReplica, summed). Over it the planner "
            "cuts the role most over its own need first. Must hold both pools' minimums. No budget when "
            "unset."
        ),
    )


class PoolSpec(SpecModel):
    """One pool of vLLM engines (prefill or decode)."""

    replicas: int | None = Field(
        default=None,
        ge=0,
        le=MAX_REPLICAS,
        description=(
            "Engine pods. Defaults to autoscaling.minReplicas when autoscaling is on, else 1. "
            "With autoscaling on it is only the starting count and must lie within minReplicas..maxReplicas."
        ),
    )
    tensor_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS_PER_REPLICA,
        description=(
            "GPUs one engine of this pool shards the model across (vLLM --tensor-parallel-size). Defaults to "
            "engine.tensorParallelSize. With the Nixl connector the prefill and decode sizes must divide one "
            "another (e.g. prefill 1, decode 4); with LMCachePD they must be equal."
        ),
    )
    gpus_per_replica: int | None = Field(
        default=None,
        ge=0,
        le=MAX_GPUS_PER_REPLICA,
        description=(
            "GPUs per pod (nvidia.com/gpu); 0 runs on CPU. Defaults to the pool's tensor-parallel size."
        ),
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=MIN_CHUNK_TOKENS,
        le=MAX_TOKENS,
        description=(
            "Prefill chunk of this pool's engines (vLLM --max-num-batched-tokens, with chunked prefill on). "
            "Defaults: prefill pool vLLM's own (8192 on H100/H200, 2048 on smaller GPUs), for throughput; "
            "decode pool, which also prefills the prompts routed to it directly, "
            f"{DECODE_CHUNK_TOKENS_TIGHT} when its ITL target is under {DECODE_CHUNK_LOOSE_ITL_MS} ms or it "
            f"has none, else {DECODE_CHUNK_TOKENS}, so a prompt prefilled beside running streams stretches "
            f"their steps by less than the target. Below {VLLM_DEFAULT_MAX_NUM_SEQS} the operator also sets "
            "--max-num-seqs to it (vLLM requires max-num-batched-tokens >= max-num-seqs). Not applied when "
            "engine.extraArgs sets --max-num-batched-tokens or --max-num-seqs."
        ),
    )
    resources: dict[str, Any] = Field(
        default_factory=dict,
        description="Engine container resources (ResourceRequirements); GPUs come from gpusPerReplica.",
    )
    pod_security_context: dict[str, Any] = Field(
        default_factory=dict,
        max_length=MAX_SECURITY_CONTEXT_FIELDS,
        description=(
            "Engine pod securityContext (a Kubernetes PodSecurityContext), merged over the operator's "
            "(seccompProfile RuntimeDefault), e.g. fsGroup for the model cache."
        ),
    )
    security_context: dict[str, Any] = Field(
        default_factory=dict,
        max_length=MAX_SECURITY_CONTEXT_FIELDS,
        description=(
            "Engine container securityContext (a Kubernetes SecurityContext), merged over the operator's "
            "(allowPrivilegeEscalation false, capabilities drop ALL); RDMA: capabilities: {add: [IPC_LOCK]}."
        ),
    )
    scheduling: Scheduling = Field(
        default_factory=Scheduling, description="Node selection for the pool's pods."
    )
    autoscaling: Autoscaling | None = Field(
        default=None, description="Autoscaling by the SLA planner. Off when absent."
    )

    def autoscales(self) -> bool:
        """Whether the autoscaler, not the spec, decides this pool's replica count."""
        return self.autoscaling is not None and self.autoscaling.enabled

    def initial_replicas(self) -> int:
        """Replicas to create the pool with (and to keep, when it does not autoscale)."""
        if self.replicas is not None:
            return self.replicas
        if self.autoscaling is not None and self.autoscaling.enabled:
            return self.autoscaling.min_replicas
        return 1

    def gpus(self, tensor_parallel_size: int) -> int:
        """GPUs each pod requests, given the pool's tensor-parallel size."""
        return tensor_parallel_size if self.gpus_per_replica is None else self.gpus_per_replica


class KVTransferSpec(SpecModel):
    """How a prefill engine hands the KV cache of a prompt to a decode engine."""

    connector: KVConnector = Field(
        default="Nixl",
        description=(
            "Nixl: vLLM's NixlConnector, the decode engine pulls KV from the prefill engine (default). "
            "LMCachePD: LMCache's PD mode, the prefill engine pushes KV to the decode engine; "
            "needs kvCache.p2p disabled."
        ),
    )


class DiskCache(SpecModel):
    """A local-disk tier for LMCache, below CPU memory."""

    size_gib: int = Field(
        alias="sizeGiB",
        ge=1,
        le=65536,
        description=(
            "Disk space per pod for cached KV, in GiB (the emptyDir's sizeLimit), split evenly across the "
            "pod's tensor-parallel ranks (LMCache's max_local_disk_size is per rank)."
        ),
    )


class P2PSpec(SpecModel):
    """Peer-to-peer KV sharing: a prefix computed by one engine is fetched by the others, not recomputed."""

    enabled: bool = Field(
        default=False, description="Share KV between engines through LMCache. Defaults to false."
    )
    controller_image: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_REFERENCE_LENGTH,
        description="LMCache controller image (must provide lmcache_controller). Defaults to engine.image.",
    )


class KVCacheSpec(SpecModel):
    """LMCache settings, shared by every engine of the pool. LMCache is on when this block is present."""

    chunk_size: int = Field(
        default=256, ge=1, le=65536, description="Tokens per LMCache chunk. Defaults to 256."
    )
    cpu_offload_gib: int = Field(
        default=DEFAULT_CPU_OFFLOAD_GIB,
        alias="cpuOffloadGiB",
        ge=0,
        le=65536,
        description=(
            "CPU memory per pod for offloaded KV, in GiB, split evenly across the pod's tensor-parallel "
            "ranks (LMCache's max_local_cpu_size is per rank); counted in the pod's memory request. "
            f"Defaults to {DEFAULT_CPU_OFFLOAD_GIB}. At least 1 with p2p or a disk tier."
        ),
    )
    disk: DiskCache | None = Field(default=None, description="Local disk tier. Off when absent.")
    pd_buffer_gib: int | None = Field(
        default=None,
        alias="pdBufferGiB",
        ge=1,
        le=4096,
        description=(
            "LMCachePD only: GPU memory per engine pod for LMCache's PD buffer (the decode pod receives into "
            "it, the prefill pod stages its pushes in it), in GiB, split across the pod's tensor-parallel "
            "ranks, on top of engine.gpuMemoryUtilizationPercent. A pushed prompt's chunks "
            f"are all reserved at once, so the default holds {PD_BUFFER_PROMPTS} prompts of "
            "engine.maxModelLen tokens (computed for known models; required for others)."
        ),
    )
    p2p: P2PSpec = Field(
        default_factory=P2PSpec, alias="p2p", description="Peer-to-peer KV sharing between engines."
    )


class AdaptiveThreshold(SpecModel):
    """Let the router move the prefill threshold with load, within bounds."""

    enabled: bool = Field(default=False, description="Adapt the threshold. Defaults to false.")
    min_tokens: int = Field(
        default=DEFAULT_ADAPTIVE_MIN_TOKENS,
        ge=1,
        le=MAX_TOKENS,
        description=f"Lowest threshold. Defaults to {DEFAULT_ADAPTIVE_MIN_TOKENS}.",
    )
    max_tokens: int = Field(
        default=DEFAULT_ADAPTIVE_MAX_TOKENS,
        ge=1,
        le=MAX_TOKENS,
        description=f"Highest threshold. Defaults to {DEFAULT_ADAPTIVE_MAX_TOKENS}.",
    )


class Overload(SpecModel):
    """Shed load past what the pools serve within the TTFT target: a bounded queue per pool in the router,
    and an OpenAI-style 429 with Retry-After past it."""

    enabled: bool = Field(
        default=False,
        description=(
            "Hold each pool to the requests its engines run without queueing (learned from their metrics) "
            "and queue the rest in the router, a queue per pool (decode for every request, prefill too for "
            "those that go through it), highest X-Inferencepool-Priority header (0-9) first; answer 429 with "
            "Retry-After when a pool's queue is full, shedding the lowest priority first. "
            "Defaults to false: every request waits inside the engines however long."
        ),
    )
    max_queued_requests: int = Field(
        default=DEFAULT_QUEUED_REQUESTS,
        ge=0,
        le=MAX_QUEUED_REQUESTS,
        description=(
            "The most requests each pool's queue holds. The router holds fewer while the pool's measured "
            "speed says fewer would get a slot within maxQueueMilliseconds. "
            f"Defaults to {DEFAULT_QUEUED_REQUESTS}."
        ),
    )
    max_queue_milliseconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_QUEUE_MILLISECONDS,
        description=(
            "The longest a request waits in the router for a slot; then it is answered 429. Must be less "
            "than prefill.autoscaling.target.ttftMilliseconds. Defaults to half the TTFT target (800 ms "
            "when the prefill pool has none), so that the wait and the prefill fit within it."
        ),
    )
    retry_after_seconds: int = Field(
        default=DEFAULT_RETRY_AFTER_SECONDS,
        ge=1,
        le=MAX_RETRY_AFTER_SECONDS,
        description=(
            f"The Retry-After header of a 429, in seconds. Defaults to {DEFAULT_RETRY_AFTER_SECONDS}."
        ),
    )


class RouterSpec(SpecModel):
    """The pool's OpenAI-compatible entry point, which decides per request whether to use the prefill pool."""

    replicas: int = Field(default=1, ge=1, le=MAX_ROUTER_REPLICAS, description="Router pods. Defaults to 1.")
    image: str = Field(
        default=DEFAULT_ROUTER_IMAGE,
        min_length=1,
        max_length=MAX_REFERENCE_LENGTH,
        description=f"Router image. Defaults to {DEFAULT_ROUTER_IMAGE}.",
    )
    policy: RoutingPolicy = Field(
        default="LengthAware",
        description=(
            "LengthAware: prompts of at least prefillThresholdTokens go through the prefill pool, "
            "shorter ones straight to decode (default). "
            "AlwaysDisaggregate: every request goes through the prefill pool. "
            "Colocated: no request does; decode engines do both phases."
        ),
    )
    prefill_threshold_tokens: int = Field(
        default=DEFAULT_PREFILL_THRESHOLD_TOKENS,
        ge=1,
        le=MAX_TOKENS,
        description=(
            f"Prompt length, in tokens, from which LengthAware sends a request through the prefill pool. "
            f"Defaults to {DEFAULT_PREFILL_THRESHOLD_TOKENS}."
        ),
    )
    adaptive_threshold: AdaptiveThreshold = Field(
        default_factory=AdaptiveThreshold, description="Move the threshold with load, within bounds."
    )
    prefix_affinity: bool = Field(
        default=True,
        description="Prefer the engine that already holds the prompt's prefix. Defaults to true.",
    )
    role_lending: bool = Field(
        default=False,
        description=(
            "LengthAware with the Nixl connector: serve a request whole on a prefill engine when every "
            "decode engine queues requests and a prefill engine has nothing waiting and would meet the TTFT "
            "target. "
            "The prefill engines then prefill in the decode pool's chunk (unless "
            "prefill.maxNumBatchedTokens is set), so the decodes they take keep the ITL target. "
            "Defaults to false."
        ),
    )
    overload: Overload = Field(
        default_factory=Overload,
        description="Shed load (429) past what the pools serve within the TTFT target. Off by default.",
    )
    resources: dict[str, Any] = Field(
        default_factory=dict, description="Router container resources (Kubernetes ResourceRequirements)."
    )
    pod_security_context: dict[str, Any] = Field(
        default_factory=dict,
        max_length=MAX_SECURITY_CONTEXT_FIELDS,
        description=(
            "Router pod securityContext (a Kubernetes PodSecurityContext), merged over the operator's, which "
            "meets Pod Security restricted (runAsNonRoot, runAsUser 10001, seccompProfile RuntimeDefault)."
        ),
    )
    security_context: dict[str, Any] = Field(
        default_factory=dict,
        max_length=MAX_SECURITY_CONTEXT_FIELDS,
        description=(
            "Router container securityContext (a Kubernetes SecurityContext), merged over the operator's "
            "(readOnlyRootFilesystem, allowPrivilegeEscalation false, capabilities drop ALL)."
        ),
    )

    def threshold_bounds(self) -> tuple[int, int]:
        """The range the prefill threshold may take: fixed unless the adaptive threshold is on."""
        if self.adaptive_threshold.enabled:
            return self.adaptive_threshold.min_tokens, self.adaptive_threshold.max_tokens
        return self.prefill_threshold_tokens, self.prefill_threshold_tokens


class NetworkPolicySpec(SpecModel):
    """NetworkPolicies that let only the pool's own pods reach its engines' HTTP ports and side channels
    (NIXL, LMCache) and the LMCache controller; the router's HTTP port stays open to every client."""

    enabled: bool = Field(
        default=False,
        description="Write the pool's NetworkPolicies (needs a CNI that enforces them). Defaults to false.",
    )
    allow_from: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "Other peers (Kubernetes NetworkPolicyPeer objects) that may reach the engines' HTTP port, e.g. "
            "a Prometheus namespace; the operator itself always may (its autoscaler reads /metrics)."
        ),
    )


PlacementMode = Literal["Preferred", "Required"]
# A label key as Kubernetes takes it: an optional DNS-subdomain prefix and '/', then a name of at most 63.
LABEL_KEY_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


class PlacementSpec(SpecModel):
    """Keep the pool's prefill and decode pods in one topology domain, so KV moves over the fast links inside
    it (a zone, a rack, an NVLink domain), rendered as pod affinity between the pool's engine pods."""

    topology_key: str = Field(
        min_length=1,
        max_length=MAX_LABEL_KEY_LENGTH,
        pattern=LABEL_KEY_PATTERN,
        description=(
            "Node label whose value is the domain, e.g. topology.kubernetes.io/zone, or a rack or NVLink "
            "domain label of your nodes."
        ),
    )
    mode: PlacementMode = Field(
        default="Preferred",
        description=(
            "Preferred (default): the scheduler favours the domain of the pool's other engine pods and "
            "places a pod elsewhere when the domain is full. Required: a pod waits Pending until its domain "
            "has room (the first engine pod picks the domain)."
        ),
    )


@dataclass(frozen=True)
class SpecRule:
    """A cross-field rule, checked by the API server (CEL, `self` is the spec) and by the spec model."""

    field: str  # path below spec of the field the message is about, e.g. "prefill.autoscaling.minReplicas"
    cel: str
    message: str
    holds: Callable[[InferencePoolSpec], bool]


SPEC_SIZE_MESSAGE: Final = (
    "spec is {size} bytes as JSON, more than " + str(MAX_SPEC_BYTES) + ": kopf and kubectl keep copies of it "
    "in the object's annotations, which Kubernetes limits to 256 KiB in all"
)


class InferencePoolSpec(SpecModel):
    """Desired state of an InferencePool: one model, served by prefill and decode pools behind a router."""

    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(
        default_factory=EngineSpec, description="The vLLM engine shared by both pools."
    )
    prefill: PoolSpec = Field(
        default_factory=PoolSpec,
        description="Prefill engines: compute-bound, they set time to first token (TTFT).",
    )
    decode: PoolSpec = Field(
        default_factory=PoolSpec,
        description="Decode engines: memory-bandwidth-bound, they set inter-token latency (ITL).",
    )
    kv_transfer: KVTransferSpec = Field(
        default_factory=KVTransferSpec, description="How KV moves from prefill to decode."
    )
    kv_cache: KVCacheSpec | None = Field(
        default=None,
        description="LMCache KV cache offload and sharing. Off when absent (LMCachePD turns it on).",
    )
    router: RouterSpec = Field(default_factory=RouterSpec, description="The router in front of both pools.")
    scaling: PoolScaling | None = Field(
        default=None,
        description=(
            "Bounds across both pools for the SLA planner: a prefill:decode ratio and a GPU budget. Only "
            "with prefill or decode autoscaling."
        ),
    )
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec,
        description="Restrict who reaches the pool's engines and side channels. Off when absent.",
    )
    placement: PlacementSpec | None = Field(
        default=None,
        description="Keep prefill and decode pods in one topology domain. Unconstrained when absent.",
    )

    @model_validator(mode="before")
    @classmethod
    def _accept_any_mapping(cls, data: Any) -> Any:
        # kopf hands the spec over as a read-only Mapping; strict mode would refuse anything but a dict.
        if isinstance(data, Mapping) and not isinstance(data, dict):
            return dict(data)
        return data

    @model_validator(mode="after")
    def _check_size(self) -> InferencePoolSpec:
        # What the user wrote (defaults are not stored), as the API server stores it: compact UTF-8 JSON.
        written = self.model_dump(mode="json", by_alias=True, exclude_unset=True)
        size = len(json.dumps(written, separators=(",", ":"), ensure_ascii=False).encode())
        if size > MAX_SPEC_BYTES:
            raise ValueError(SPEC_SIZE_MESSAGE.format(size=size))
        return self

    @model_validator(mode="after")
    def _check_cross_field_rules(self) -> InferencePoolSpec:
        broken = [rule.message for rule in SPEC_RULES if not rule.holds(self)]
        if broken:
            raise ValueError("; ".join(broken))
        return self

    def pool(self, role: PoolRole) -> PoolSpec:
        return self.prefill if role == "prefill" else self.decode

    def served_model_name(self) -> str:
        return self.model.served_name or self.model.name

    def tensor_parallel_size(self, role: PoolRole) -> int:
        """The pool's own tensor-parallel size, or the engine's."""
        own = self.pool(role).tensor_parallel_size
        return self.engine.tensor_parallel_size if own is None else own

    def gpus_per_replica(self, role: PoolRole) -> int:
        return self.pool(role).gpus(self.tensor_parallel_size(role))

    def max_model_len(self) -> int | None:
        """engine.maxModelLen, else the model's own context length when the operator knows the model."""
        if self.engine.max_model_len is not None:
            return self.engine.max_model_len
        shape = model_shape(self.model.name)
        return shape.max_position if shape is not None else None

    def pd_buffer_bytes(self) -> int | None:
        """LMCache PD receive buffer per decode pod: kvCache.pdBufferGiB, else room for PD_BUFFER_PROMPTS
        prompts of max_model_len() tokens of the model's KV; None when neither is known."""
        kv_cache = self.effective_kv_cache()
        if kv_cache.pd_buffer_gib is not None:
            return kv_cache.pd_buffer_gib * GIB
        shape, tokens = model_shape(self.model.name), self.max_model_len()
        if shape is None or tokens is None:
            return None
        wanted = PD_BUFFER_PROMPTS * tokens * shape.kv_bytes_per_token
        return -(-wanted // GIB) * GIB  # whole GiB

    def fewest_replicas(self, role: PoolRole) -> int:
        """autoscaling.minReplicas while the pool autoscales, else its replicas (1 when unset)."""
        autoscaling = self.pool(role).autoscaling
        if autoscaling is not None and autoscaling.enabled:
            return autoscaling.min_replicas
        replicas = self.pool(role).replicas
        return DEFAULT_MIN_REPLICAS if replicas is None else replicas

    def target_milliseconds(self, role: PoolRole) -> int | None:
        """The pool's latency target (TTFT for prefill, ITL for decode); None when it does not autoscale."""
        autoscaling = self.pool(role).autoscaling
        if autoscaling is None or not autoscaling.enabled:
            return None
        target = autoscaling.target
        return target.ttft_milliseconds if role == "prefill" else target.itl_milliseconds

    def chunk_tokens(self, role: PoolRole) -> int | None:
        """The pool's prefill chunk (--max-num-batched-tokens): its own, else the decode default from its ITL
        target; None leaves vLLM's default (the prefill pool, or extraArgs that set the batch flags)."""
        if any(_flag_name(arg) in BATCH_FLAGS for arg in self.engine.extra_args):
            return None
        pool = self.pool(role)
        if pool.max_num_batched_tokens is not None or (role == "prefill" and not self.lends_roles()):
            return pool.max_num_batched_tokens
        if role == "prefill":  # it decodes lent requests: its steps must fit the decode pool's ITL too
            return self.chunk_tokens("decode")
        itl = pool.autoscaling.target.itl_milliseconds if pool.autoscaling is not None else None
        loose = itl is not None and itl >= DECODE_CHUNK_LOOSE_ITL_MS
        return DECODE_CHUNK_TOKENS if loose else DECODE_CHUNK_TOKENS_TIGHT

    def lends_roles(self) -> bool:
        """Whether the router may serve requests whole on prefill pods (`router.roleLending`, refused but
        with LengthAware and NIXL: an engine serves a request without kv_transfer_params colocated whatever
        its NIXL kv_role, docs/engine-contract.md section 3)."""
        return self.router.role_lending  # the spec rules refuse it elsewhere (_kv_rules)

    def batch_args(self, role: PoolRole) -> list[str]:
        """vLLM serve flags for the pool's chunk: --max-num-batched-tokens, and --max-num-seqs where vLLM's
        default would exceed the chunk (it refuses max_num_batched_tokens < max_num_seqs)."""
        chunk = self.chunk_tokens(role)
        if chunk is None:
            return []
        args = ["--max-num-batched-tokens", str(chunk)]
        if chunk < VLLM_DEFAULT_MAX_NUM_SEQS:
            args += ["--max-num-seqs", str(chunk)]
        return args

    def uses_lmcache(self) -> bool:
        return self.kv_cache is not None or self.kv_transfer.connector == "LMCachePD"

    def effective_kv_cache(self) -> KVCacheSpec:
        """LMCache settings with defaults, whether or not the user wrote the block."""
        return self.kv_cache if self.kv_cache is not None else KVCacheSpec()

    def p2p_enabled(self) -> bool:
        return self.kv_cache is not None and self.kv_cache.p2p.enabled


BATCH_FLAGS: Final = frozenset({"--max-num-batched-tokens", "--max-num-seqs"})


def _flag_name(arg: str) -> str:
    """`--flag=value` and `--flag` both name `--flag`; vLLM also accepts underscores."""
    return arg.split("=", 1)[0].replace("_", "-")


# --- cross-field rules
# CEL cannot see defaults applied in code, so each rule guards optional fields with has() and repeats the
# default from the constants above.


def _or_default(path: str, default: int | bool) -> str:
    literal = str(default).lower() if isinstance(default, bool) else str(default)
    return f"(has({path}) ? {path} : {literal})"


def _pool_tp_cel(role: PoolRole) -> str:
    """CEL for spec.tensor_parallel_size(role)."""
    engine_tp = _or_default("self.engine.tensorParallelSize", DEFAULT_TENSOR_PARALLEL_SIZE)
    engine = f"(has(self.engine) ? {engine_tp} : {DEFAULT_TENSOR_PARALLEL_SIZE})"
    own = f"self.{role}.tensorParallelSize"
    return f"(has(self.{role}) && has({own}) ? {own} : {engine})"


def _pool_rules(role: PoolRole) -> list[SpecRule]:
    pool = f"self.{role}"
    scaling = f"{pool}.autoscaling"
    has_scaling = f"has({pool}.autoscaling)"
    enabled = _or_default(f"{scaling}.enabled", True)
    min_replicas = _or_default(f"{scaling}.minReplicas", DEFAULT_MIN_REPLICAS)
    tp = _pool_tp_cel(role)
    metric, other, metric_name = (
        ("ttftMilliseconds", "itlMilliseconds", "time to first token")
        if role == "prefill"
        else ("itlMilliseconds", "ttftMilliseconds", "inter-token latency")
    )

    def scaling_of(spec: InferencePoolSpec) -> Autoscaling | None:
        return spec.pool(role).autoscaling

    def min_le_max(spec: InferencePoolSpec) -> bool:
        a = scaling_of(spec)
        return a is None or a.min_replicas <= a.max_replicas

    def replicas_within_bounds(spec: InferencePoolSpec) -> bool:
        a, replicas = scaling_of(spec), spec.pool(role).replicas
        return a is None or not a.enabled or replicas is None or a.min_replicas <= replicas <= a.max_replicas

    def target_matches_role(spec: InferencePoolSpec) -> bool:
        a = scaling_of(spec)
        if a is None:
            return True
        wanted, unwanted = (
            (a.target.ttft_milliseconds, a.target.itl_milliseconds)
            if role == "prefill"
            else (a.target.itl_milliseconds, a.target.ttft_milliseconds)
        )
        return wanted is not None and unwanted is None

    def gpus_fit_tensor_parallel(spec: InferencePoolSpec) -> bool:
        gpus = spec.pool(role).gpus_per_replica
        return gpus is None or gpus == 0 or gpus >= spec.tensor_parallel_size(role)

    def zero_only_for_prefill(spec: InferencePoolSpec) -> bool:
        a = scaling_of(spec)
        return a is None or a.min_replicas >= 1 or role == "prefill"

    in_pool = f"has(self.{role}) && "
    # the planner takes the prefill pool to zero and back (the decode pods serve colocated meanwhile)
    zero_rules = (
        []
        if role == "prefill"
        else [
            SpecRule(
                field=f"{role}.autoscaling.minReplicas",
                cel=f"!({in_pool}{has_scaling}) || {min_replicas} >= 1",
                message=(
                    f"spec.{role}.autoscaling.minReplicas must be >= 1 (decode pools do not scale to zero)"
                ),
                holds=zero_only_for_prefill,
            )
        ]
    )
    return [
        *zero_rules,
        SpecRule(
            field=f"{role}.autoscaling.minReplicas",
            cel=f"!({in_pool}{has_scaling}) || {min_replicas} <= {scaling}.maxReplicas",
            message=f"spec.{role}.autoscaling.minReplicas must be <= maxReplicas",
            holds=min_le_max,
        ),
        SpecRule(
            field=f"{role}.replicas",
            cel=(
                f"!({in_pool}{has_scaling} && {enabled} && has({pool}.replicas)) || "
                f"({pool}.replicas >= {min_replicas} && {pool}.replicas <= {scaling}.maxReplicas)"
            ),
            message=(
                f"spec.{role}.replicas must be within spec.{role}.autoscaling.minReplicas..maxReplicas "
                "when autoscaling is enabled"
            ),
            holds=replicas_within_bounds,
        ),
        SpecRule(
            field=f"{role}.autoscaling.target",
            cel=(
                f"!({in_pool}{has_scaling}) || "
                f"(has({scaling}.target.{metric}) && !has({scaling}.target.{other}))"
            ),
            message=(
                f"spec.{role}.autoscaling.target must set {metric} ({role} scales on {metric_name}), "
                f"not {other}"
            ),
            holds=target_matches_role,
        ),
        SpecRule(
            field=f"{role}.gpusPerReplica",
            cel=(
                f"!({in_pool}has({pool}.gpusPerReplica)) || {pool}.gpusPerReplica == 0 || "
                f"{pool}.gpusPerReplica >= {tp}"
            ),
            message=(
                f"spec.{role}.gpusPerReplica must be 0 (no GPU) or >= spec.engine.tensorParallelSize, or "
                f"spec.{role}.tensorParallelSize when set"
            ),
            holds=gpus_fit_tensor_parallel,
        ),
    ]


def _router_rules() -> list[SpecRule]:
    adaptive = "self.router.adaptiveThreshold"
    has_adaptive = f"has(self.router) && has({adaptive})"
    min_tokens = _or_default(f"{adaptive}.minTokens", DEFAULT_ADAPTIVE_MIN_TOKENS)
    max_tokens = _or_default(f"{adaptive}.maxTokens", DEFAULT_ADAPTIVE_MAX_TOKENS)
    threshold = _or_default("self.router.prefillThresholdTokens", DEFAULT_PREFILL_THRESHOLD_TOKENS)
    adaptive_on = f"{has_adaptive} && {_or_default(f'{adaptive}.enabled', False)}"

    def min_le_max(spec: InferencePoolSpec) -> bool:
        bounds = spec.router.adaptive_threshold
        return bounds.min_tokens <= bounds.max_tokens

    def threshold_within_bounds(spec: InferencePoolSpec) -> bool:
        bounds = spec.router.adaptive_threshold
        threshold_tokens = spec.router.prefill_threshold_tokens
        return not bounds.enabled or bounds.min_tokens <= threshold_tokens <= bounds.max_tokens

    overload_wait = "self.router.overload.maxQueueMilliseconds"
    ttft = "self.prefill.autoscaling.target.ttftMilliseconds"
    has_wait = f"has(self.router) && has(self.router.overload) && has({overload_wait})"
    has_ttft = (
        "has(self.prefill) && has(self.prefill.autoscaling) && has(self.prefill.autoscaling.target) "
        f"&& has({ttft})"
    )

    def wait_within_ttft(spec: InferencePoolSpec) -> bool:
        wait = spec.router.overload.max_queue_milliseconds
        scaling = spec.prefill.autoscaling
        target = scaling.target.ttft_milliseconds if scaling is not None else None
        return wait is None or target is None or wait < target

    return [
        SpecRule(
            field="router.overload.maxQueueMilliseconds",
            cel=f"!({has_wait} && {has_ttft}) || {overload_wait} < {ttft}",
            message=(
                "spec.router.overload.maxQueueMilliseconds must be less than "
                "spec.prefill.autoscaling.target.ttftMilliseconds: a request held that long in the router "
                "misses its TTFT target before its prefill starts"
            ),
            holds=wait_within_ttft,
        ),
        SpecRule(
            field="router.adaptiveThreshold.minTokens",
            cel=f"!({has_adaptive}) || {min_tokens} <= {max_tokens}",
            message="spec.router.adaptiveThreshold.minTokens must be <= maxTokens",
            holds=min_le_max,
        ),
        SpecRule(
            field="router.prefillThresholdTokens",
            cel=f"!({adaptive_on}) || ({min_tokens} <= {threshold} && {threshold} <= {max_tokens})",
            message=(
                "spec.router.prefillThresholdTokens must be within "
                "spec.router.adaptiveThreshold.minTokens..maxTokens when the adaptive threshold is enabled"
            ),
            holds=threshold_within_bounds,
        ),
    ]


def _kv_rules() -> list[SpecRule]:
    pd_mode = (
        "has(self.kvTransfer) && has(self.kvTransfer.connector) && self.kvTransfer.connector == 'LMCachePD'"
    )
    p2p = "self.kvCache.p2p"
    p2p_on = f"has(self.kvCache) && has({p2p}) && has({p2p}.enabled) && {p2p}.enabled"

    router_replicas = "(has(self.router) && has(self.router.replicas) ? self.router.replicas : 1)"

    def pd_mode_without_p2p(spec: InferencePoolSpec) -> bool:
        return spec.kv_transfer.connector != "LMCachePD" or not spec.p2p_enabled()

    def pd_mode_single_router(spec: InferencePoolSpec) -> bool:
        return spec.kv_transfer.connector != "LMCachePD" or spec.router.replicas <= 1

    lending_on = "has(self.router) && has(self.router.roleLending) && self.router.roleLending"
    policy = "(has(self.router) && has(self.router.policy) ? self.router.policy : 'LengthAware')"

    def lending_where_it_can(spec: InferencePoolSpec) -> bool:
        return not spec.router.role_lending or (
            spec.kv_transfer.connector == "Nixl" and spec.router.policy == "LengthAware"
        )

    return [
        # a lent request goes to a prefill engine without kv_transfer_params: NIXL serves it whole whatever
        # the engine's kv_role, an LMCache PD sender is not known to; and only LengthAware weighs routes
        SpecRule(
            field="router.roleLending",
            cel=f"!({lending_on}) || (!({pd_mode}) && {policy} == 'LengthAware')",
            message=(
                "spec.router.roleLending needs spec.router.policy LengthAware and "
                "spec.kvTransfer.connector Nixl"
            ),
            holds=lending_where_it_can,
        ),
        SpecRule(
            field="kvCache.p2p.enabled",
            cel=f"!({pd_mode}) || !({p2p_on})",
            message="spec.kvCache.p2p.enabled must be false when spec.kvTransfer.connector is LMCachePD",
            holds=pd_mode_without_p2p,
        ),
        # LMCache's prefill engines send their ProxyNotif to one address (pd_proxy_host, the router Service):
        # with two router pods half the notifications would reach a pod that is not waiting for them.
        SpecRule(
            field="router.replicas",
            cel=f"!({pd_mode}) || {router_replicas} <= 1",
            message=(
                "spec.router.replicas must be 1 when spec.kvTransfer.connector is LMCachePD (prefill engines "
                "notify a single router address)"
            ),
            holds=pd_mode_single_router,
        ),
        *_lmcache_backend_rules(p2p_on),
        *_transfer_tp_rules(pd_mode),
        *_pd_buffer_rules(pd_mode),
    ]


def _pd_buffer_rules(pd_mode: str) -> list[SpecRule]:
    """LMCache PD's buffer must be sizable, and hold a prompt of maxModelLen tokens: LMCache refuses to
    start when it cannot (pd_backend_async.py initialize_allocator, with the builder's pd_max_prefill_len)."""
    names = json.dumps(sorted(KNOWN_MODELS))
    kv_bytes = json.dumps({name: shape.kv_bytes_per_token for name, shape in sorted(KNOWN_MODELS.items())})
    own_len = json.dumps({name: shape.max_position for name, shape in sorted(KNOWN_MODELS.items())})
    has_buffer = "has(self.kvCache) && has(self.kvCache.pdBufferGiB)"
    max_len = (
        "(has(self.engine) && has(self.engine.maxModelLen) ? self.engine.maxModelLen : "
        f"{own_len}[self.model.name])"
    )
    chunk = "(has(self.kvCache.chunkSize) ? self.kvCache.chunkSize : 256)"
    needed = f"(({max_len} + {chunk} - 1) / {chunk}) * {chunk} * {kv_bytes}[self.model.name]"

    def buffer_known(spec: InferencePoolSpec) -> bool:
        return spec.kv_transfer.connector != "LMCachePD" or spec.pd_buffer_bytes() is not None

    def buffer_holds_a_prompt(spec: InferencePoolSpec) -> bool:
        kv_cache, shape, max_len = spec.kv_cache, model_shape(spec.model.name), spec.max_model_len()
        if spec.kv_transfer.connector != "LMCachePD" or kv_cache is None or kv_cache.pd_buffer_gib is None:
            return True
        if shape is None or max_len is None:
            return True  # LMCache checks it at start (pd_max_prefill_len)
        chunk = kv_cache.chunk_size
        return kv_cache.pd_buffer_gib * GIB >= -(-max_len // chunk) * chunk * shape.kv_bytes_per_token

    return [
        SpecRule(
            field="kvCache.pdBufferGiB",
            cel=f"!({pd_mode}) || ({has_buffer}) || self.model.name in {names}",
            message=(
                "spec.kvCache.pdBufferGiB must be set when spec.kvTransfer.connector is LMCachePD and the "
                "operator does not know the KV size of spec.model.name"
            ),
            holds=buffer_known,
        ),
        SpecRule(
            field="kvCache.pdBufferGiB",
            cel=(
                f"!({pd_mode}) || !({has_buffer}) || !(self.model.name in {names}) || "
                f"self.kvCache.pdBufferGiB * {GIB} >= {needed}"
            ),
            message=(
                "spec.kvCache.pdBufferGiB must hold one prompt of spec.engine.maxModelLen tokens (the "
                "model's own context length when unset) of spec.model.name's KV cache"
            ),
            holds=buffer_holds_a_prompt,
        ),
    ]


def _lmcache_backend_rules(p2p_on: str) -> list[SpecRule]:
    """LMCache stages p2p transfers and its disk tier through its CPU backend, and asserts at start-up
    without one (lmcache/v1/storage_backend/__init__.py CreateStorageBackends)."""
    cpu = f"(has(self.kvCache.cpuOffloadGiB) ? self.kvCache.cpuOffloadGiB : {DEFAULT_CPU_OFFLOAD_GIB})"
    disk_on = "has(self.kvCache) && has(self.kvCache.disk)"

    def cpu_for_p2p(spec: InferencePoolSpec) -> bool:
        return not spec.p2p_enabled() or spec.effective_kv_cache().cpu_offload_gib > 0

    def cpu_for_disk(spec: InferencePoolSpec) -> bool:
        kv_cache = spec.kv_cache
        return kv_cache is None or kv_cache.disk is None or kv_cache.cpu_offload_gib > 0

    return [
        SpecRule(
            field="kvCache.cpuOffloadGiB",
            cel=f"!({p2p_on}) || {cpu} > 0",
            message=(
                "spec.kvCache.cpuOffloadGiB must be at least 1 when spec.kvCache.p2p.enabled is true "
                "(LMCache moves p2p transfers through its CPU tier)"
            ),
            holds=cpu_for_p2p,
        ),
        SpecRule(
            field="kvCache.cpuOffloadGiB",
            cel=f"!({disk_on}) || {cpu} > 0",
            message=(
                "spec.kvCache.cpuOffloadGiB must be at least 1 when spec.kvCache.disk is set "
                "(LMCache's disk tier sits below its CPU tier)"
            ),
            holds=cpu_for_disk,
        ),
    ]


def _transfer_tp_rules(pd_mode: str) -> list[SpecRule]:
    """Tensor-parallel sizes the two transfer modes accept between a prefill and a decode engine."""
    prefill, decode = _pool_tp_cel("prefill"), _pool_tp_cel("decode")

    def nixl_ratio(spec: InferencePoolSpec) -> bool:
        p, d = spec.tensor_parallel_size("prefill"), spec.tensor_parallel_size("decode")
        return spec.kv_transfer.connector != "Nixl" or p % d == 0 or d % p == 0

    def pd_equal(spec: InferencePoolSpec) -> bool:
        p, d = spec.tensor_parallel_size("prefill"), spec.tensor_parallel_size("decode")
        return spec.kv_transfer.connector != "LMCachePD" or p == d

    return [
        # vLLM's NIXL connector maps ranks by the ratio and asserts divisibility (kv_connector/utils.py
        # TransferTopology.tp_ratio)
        SpecRule(
            field="decode.tensorParallelSize",
            cel=f"({pd_mode}) || {prefill} % {decode} == 0 || {decode} % {prefill} == 0",
            message=(
                "spec.prefill.tensorParallelSize and spec.decode.tensorParallelSize must divide one another "
                "with the Nixl connector (vLLM maps prefill to decode ranks by their ratio)"
            ),
            holds=nixl_ratio,
        ),
        # each LMCache PD sender rank pushes to the receiver rank of its own index (pd_backend_async.py)
        SpecRule(
            field="decode.tensorParallelSize",
            cel=f"!({pd_mode}) || {prefill} == {decode}",
            message=(
                "spec.prefill.tensorParallelSize and spec.decode.tensorParallelSize must be equal with the "
                "LMCachePD connector (each sender rank pushes to the receiver rank of its own index)"
            ),
            holds=pd_equal,
        ),
    ]


def _engine_rules() -> list[SpecRule]:
    has_args = "has(self.engine) && has(self.engine.extraArgs)"
    has_env = "has(self.engine) && has(self.engine.extraEnv)"

    def args_total(spec: InferencePoolSpec) -> bool:
        return sum(len(arg) for arg in spec.engine.extra_args) <= MAX_EXTRA_ARGS_TOTAL

    def env_total(spec: InferencePoolSpec) -> bool:
        return sum(len(str(e.get("value", ""))) for e in spec.engine.extra_env) <= MAX_EXTRA_ENV_TOTAL

    return [
        SpecRule(
            field="engine.extraArgs",
            cel=f"!({has_args}) || self.engine.extraArgs.map(a, a.size()).sum() <= {MAX_EXTRA_ARGS_TOTAL}",
            message=f"spec.engine.extraArgs must have at most {MAX_EXTRA_ARGS_TOTAL} characters in all",
            holds=args_total,
        ),
        SpecRule(
            field="engine.extraEnv",
            cel=(
                f"!({has_env}) || self.engine.extraEnv.map(e, has(e.value) ? e.value.size() : 0).sum() "
                f"<= {MAX_EXTRA_ENV_TOTAL}"
            ),
            message=f"spec.engine.extraEnv values must have at most {MAX_EXTRA_ENV_TOTAL} characters in all",
            holds=env_total,
        ),
    ]


def _scaling_rules() -> list[SpecRule]:
    """spec.scaling: ordered ratio bounds, a budget that holds both pools' minimums, and a planner to hold
    them (a pool that autoscales)."""
    ratio = "self.scaling.prefillDecodeRatio"
    has_ratio = f"has(self.scaling) && has({ratio})"
    has_budget = "has(self.scaling) && has(self.scaling.gpuBudget)"

    def role_cel(role: PoolRole) -> tuple[str, str, str]:
        """CEL for (planned by the planner, the fewest replicas, GPUs per replica) of one role."""
        pool, scaling = f"self.{role}", f"self.{role}.autoscaling"
        on = f"has(self.{role}) && has({scaling}) && {_or_default(f'{scaling}.enabled', True)}"
        planner = f"({on})"
        replicas = f"(has(self.{role}) && has({pool}.replicas) ? {pool}.replicas : 1)"
        fewest = f"({on} ? {_or_default(f'{scaling}.minReplicas', DEFAULT_MIN_REPLICAS)} : {replicas})"
        gpus = (
            f"(has(self.{role}) && has({pool}.gpusPerReplica) ? {pool}.gpusPerReplica : {_pool_tp_cel(role)})"
        )
        return planner, fewest, gpus

    (p_planner, p_fewest, p_gpus), (d_planner, d_fewest, d_gpus) = role_cel("prefill"), role_cel("decode")

    def ordered(spec: InferencePoolSpec) -> bool:
        bounds = spec.scaling.prefill_decode_ratio if spec.scaling is not None else None
        return bounds is None or bounds.max_percent is None or bounds.min_percent <= bounds.max_percent

    def budget_holds_minimums(spec: InferencePoolSpec) -> bool:
        if spec.scaling is None or spec.scaling.gpu_budget is None:
            return True
        return spec.scaling.gpu_budget >= sum(
            spec.fewest_replicas(role) * spec.gpus_per_replica(role) for role in POOL_ROLES
        )

    def planned_somewhere(spec: InferencePoolSpec) -> bool:
        return spec.scaling is None or any(
            (a := spec.pool(role).autoscaling) is not None and a.enabled for role in POOL_ROLES
        )

    return [
        SpecRule(
            field="scaling.prefillDecodeRatio.maxPercent",
            cel=(
                f"!({has_ratio} && has({ratio}.maxPercent)) || "
                f"{_or_default(f'{ratio}.minPercent', 0)} <= {ratio}.maxPercent"
            ),
            message="spec.scaling.prefillDecodeRatio.maxPercent must be >= minPercent",
            holds=ordered,
        ),
        SpecRule(
            field="scaling.gpuBudget",
            cel=(
                f"!({has_budget}) || self.scaling.gpuBudget >= {p_fewest} * {p_gpus} + {d_fewest} * {d_gpus}"
            ),
            message=(
                "spec.scaling.gpuBudget must hold both pools' minimums (autoscaling.minReplicas, or replicas "
                "when a pool does not autoscale, times its GPUs per replica)"
            ),
            holds=budget_holds_minimums,
        ),
        SpecRule(
            field="scaling",
            cel=f"!has(self.scaling) || {p_planner} || {d_planner}",
            message=(
                "spec.scaling needs prefill or decode autoscaling (its bounds are the planner's, and the "
                "planner runs only while a pool autoscales)"
            ),
            holds=planned_somewhere,
        ),
    ]


SPEC_RULES: Final[tuple[SpecRule, ...]] = (
    *_engine_rules(),
    *_pool_rules("prefill"),
    *_pool_rules("decode"),
    *_router_rules(),
    *_kv_rules(),
    *_scaling_rules(),
)


# --- status


def kubernetes_time(value: datetime) -> str:
    """RFC 3339 in UTC at whole seconds, as Kubernetes writes metav1.Time."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Condition(StatusModel):
    """One aspect of the pool's state (Kubernetes metav1.Condition)."""

    type: str = Field(min_length=1, description="Ready, Progressing, Degraded, ScalingLimited or Bottleneck.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="Why the condition has its status, in CamelCase.",
    )
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: datetime = Field(description="When the status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation the condition was computed from."
    )

    @field_serializer("last_transition_time")
    def _serialize_time(self, value: datetime) -> str:
        return kubernetes_time(value)


class ScalingDecision(StatusModel):
    """The autoscaler's last change of a pool's replica count."""

    from_replicas: int = Field(ge=0, description="Replicas before the decision.")
    replicas: int = Field(ge=0, description="Replicas decided.")
    reason: str = Field(
        min_length=1, description="Why, in CamelCase (e.g. ForecastUp, ForecastDown, LatencyGuard)."
    )
    message: str = Field(default="", description="The figures behind the decision.")
    time: datetime = Field(description="When the decision was made.")
    wanted_replicas: int | None = Field(
        default=None, ge=0, description="What the demand asked for, before step limits, delays and bounds."
    )
    demand_milli_engines: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Measured demand, in thousandths of an engine (1000 = one replica busy all the "
            "time), corrected by the observed utilisation."
        ),
    )
    forecast_milli_engines: int | None = Field(
        default=None, ge=0, description="Demand forecast one model load ahead, with headroom."
    )
    capacity_milli_engines_per_replica: int | None = Field(
        default=None, ge=0, description="What one replica carries at the latency target."
    )
    correction_percent: int | None = Field(
        default=None,
        ge=0,
        description="Observed / predicted utilisation (100 = as modelled).",
    )
    observed_milliseconds: int | None = Field(
        default=None, ge=0, description="The pool's latency at the target percentile when it decided."
    )
    target_milliseconds: int | None = Field(default=None, ge=0, description="The latency target.")

    @field_serializer("time")
    def _serialize_time(self, value: datetime) -> str:
        return kubernetes_time(value)


class PoolStatus(StatusModel):
    """Observed state of one pool."""

    replicas: int = Field(default=0, ge=0, description="Engine pods that exist.")
    ready_replicas: int = Field(default=0, ge=0, description="Engine pods that are ready.")
    desired_replicas: int = Field(
        default=0, ge=0, description="Engine pods wanted, by the spec or the autoscaler."
    )
    observed_milliseconds: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Latency at the target percentile over the last window (prefill: TTFT; decode: the requests' "
            "time per output token, or the token gaps from engines that do not export it)."
        ),
    )
    target_milliseconds: int | None = Field(
        default=None, ge=0, description="The latency target, when autoscaling."
    )
    percentile: int | None = Field(
        default=None, ge=0, le=100, description="Percentile of observedMilliseconds."
    )
    last_scaling: ScalingDecision | None = Field(default=None, description="The autoscaler's last decision.")
    recommended_replicas: int | None = Field(
        default=None,
        ge=0,
        description=(
            "The planner's latest recommendation (what it writes in mode Operator, what an HPA or KEDA "
            "may act on in mode External)."
        ),
    )

    def replicas_display(self) -> str:
        """'ready/desired', as kubectl get shows it."""
        return f"{self.ready_replicas}/{self.desired_replicas}"

    def latency_display(self) -> str:
        """'observed/target ms' ('-' where unknown), as kubectl get shows it."""
        if self.observed_milliseconds is None and self.target_milliseconds is None:
            return "-"
        observed = "-" if self.observed_milliseconds is None else str(self.observed_milliseconds)
        if self.target_milliseconds is None:
            return f"{observed}ms"
        return f"{observed}/{self.target_milliseconds}ms"


class RouterStatus(StatusModel):
    """Observed state of the router."""

    endpoint: str | None = Field(default=None, description="URL clients send OpenAI-compatible requests to.")
    replicas: int = Field(default=0, ge=0, description="Router pods that exist.")
    ready_replicas: int = Field(default=0, ge=0, description="Router pods that are ready.")
    prefill_threshold_tokens: int | None = Field(
        default=None,
        ge=1,
        description="The prefill threshold in force (moves when the adaptive threshold is on).",
    )
    disaggregated_percent: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Share of recent requests sent through the prefill pool, in percent.",
    )
    lent_percent: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description=(
            "Share of recent requests served whole on prefill engines while every decode engine queued "
            "(router.roleLending), in percent."
        ),
    )
    peer_prefill_percent: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description=(
            "Share of recent requests whose prompt an idle decode engine prefilled for another decode engine "
            "while every prefill engine queued (router.roleLending), in percent."
        ),
    )


class BottleneckStatus(StatusModel):
    """Which phase limits the pool over the last window, diagnosed from the metrics the autoscaler reads
    (`inferencepool diagnose` prints the whole report, with the evidence and the what-if)."""

    phase: str = Field(
        min_length=1,
        description=(
            "Prefill, Decode, Interference (prefills stalling decode batches), KVTransfer, None (every "
            "target met) or Unknown (too little traffic in the window to judge)."
        ),
    )
    reason: str = Field(
        min_length=1,
        description=(
            "The Bottleneck condition's reason: PrefillBound, DecodeBound, PrefillDecodeInterference, "
            "KVTransferBound, WithinTargets or NotEnoughTraffic."
        ),
    )
    summary: str = Field(default="", description="The verdict in one line.")
    advice: list[str] = Field(
        default_factory=list, max_length=3, description="What fits, most useful first (at most three)."
    )
    recommended_threshold_tokens: int | None = Field(
        default=None,
        ge=1,
        description="The prefill threshold the measured prompt lengths and both pools' headroom ask for.",
    )
    window_seconds: int | None = Field(default=None, ge=0, description="The window the diagnosis read.")


class RolloutRoleStatus(StatusModel):
    """One engine pool during a coordinated rollout."""

    updated_replicas: int = Field(default=0, ge=0, description="Pods at the new KV-compatibility revision.")
    ready_updated_replicas: int = Field(default=0, ge=0, description="Of those, the Ready ones.")
    replicas: int = Field(default=0, ge=0, description="Pods wanted now, the surge pod included.")
    surge: int = Field(default=0, ge=0, description="Surge pods (0: the GPU budget left no room).")
    partition: int | None = Field(
        default=None, ge=0, description="Ordinals from this one up run the new revision."
    )


class RolloutStatus(StatusModel):
    """A coordinated rollout of both engine pools to a new KV-compatibility revision: each pool surges by one
    new pod, then replaces its old pods one at a time, so that every prefill pod keeps a decode pod of its
    own revision to hand its KV to."""

    from_revision: str = Field(default="", description="The KV-compatibility revisions being replaced.")
    to_revision: str = Field(min_length=1, description="The KV-compatibility revision being rolled out.")
    from_model_revision: str | None = Field(default=None, description="The model revisions being replaced.")
    to_model_revision: str | None = Field(default=None, description="spec.model.revision.")
    prefill: RolloutRoleStatus | None = Field(default=None, description="The prefill pool.")
    decode: RolloutRoleStatus | None = Field(default=None, description="The decode pool.")
    last_progress_time: datetime | None = Field(
        default=None, description="When a pod last moved to the new revision (or the rollout began)."
    )

    @field_serializer("last_progress_time")
    def _serialize_time(self, value: datetime | None) -> str | None:
        return None if value is None else kubernetes_time(value)


class StatusDisplay(StatusModel):
    """Figures formatted for `kubectl get` columns (a printer column is one JSONPath: it cannot compute)."""

    prefill: str = Field(default="-", description="Prefill replicas, ready/desired.")
    decode: str = Field(default="-", description="Decode replicas, ready/desired.")
    ttft: str = Field(default="-", description="Prefill TTFT, observed/target in milliseconds.")
    itl: str = Field(default="-", description="Decode ITL, observed/target in milliseconds.")


class InferencePoolStatus(StatusModel):
    """Observed state of an InferencePool, written by the operator."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status reflects."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing, Degraded, ScalingLimited and Bottleneck, one entry per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: PoolStatus | None = Field(default=None, description="The prefill pool.")
    decode: PoolStatus | None = Field(default=None, description="The decode pool.")
    router: RouterStatus | None = Field(default=None, description="The router.")
    bottleneck: BottleneckStatus | None = Field(
        default=None, description="The phase that limits the pool, from its own metrics (get -o wide)."
    )
    display: StatusDisplay | None = Field(default=None, description="Figures formatted for kubectl get.")
    kv_compat: str | None = Field(
        default=None,
        description=(
            "The KV-compatibility revision every engine pod runs (their label serving.inferencepool.dev/"
            "kv-compat): a hash of what must match for a prefill pod's KV to be valid on a decode pod."
        ),
    )
    model_revision: str | None = Field(
        default=None,
        description="The model revision every engine pod runs (spec.model.revision, rolled out).",
    )
    rollout: RolloutStatus | None = Field(
        default=None, description="The coordinated rollout of both engine pools in progress, if any."
    )

    def condition(self, condition_type: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == condition_type), None)

    def set_condition(
        self,
        condition_type: str,
        status: ConditionStatus,
        reason: str,
        message: str,
        now: datetime,
        observed_generation: int | None = None,
    ) -> None:
        """Add or update a condition; lastTransitionTime moves only when the status changes."""
        previous = self.condition(condition_type)
        transition = now if previous is None or previous.status != status else previous.last_transition_time
        updated = Condition(
            type=condition_type,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=transition,
            observed_generation=observed_generation,
        )
        others = [c for c in self.conditions if c.type != condition_type]
        self.conditions = (
            [*others, updated]
            if previous is None
            else [updated if c.type == condition_type else c for c in self.conditions]
        )

    def with_display(self) -> InferencePoolStatus:
        """A copy whose display strings match the pool figures."""
        prefill, decode = self.prefill or PoolStatus(), self.decode or PoolStatus()
        display = StatusDisplay(
            prefill=prefill.replicas_display(),
            decode=decode.replicas_display(),
            ttft=prefill.latency_display(),
            itl=decode.latency_display(),
        )
        return self.model_copy(update={"display": display})


@dataclass(frozen=True)
class NameRule:
    """A rule on metadata.name, checked by the API server (CEL at the root, `self` is the object) and by the
    model."""

    cel: str
    message: str
    holds: Callable[[str], bool]


NAME_RULES: Final[tuple[NameRule, ...]] = (
    NameRule(
        cel=f"self.metadata.name.size() <= {MAX_POOL_NAME_LENGTH}",
        message=(
            f"metadata.name must be at most {MAX_POOL_NAME_LENGTH} characters (children such as "
            "<name>-lmcache-controller and the pods of <name>-prefill must stay within 63)"
        ),
        holds=lambda name: len(name) <= MAX_POOL_NAME_LENGTH,
    ),
    NameRule(
        cel=f"self.metadata.name.matches('{POOL_NAME_PATTERN}')",
        message=(
            "metadata.name must be a DNS-1035 label: lowercase letters, digits and '-', starting with a "
            "letter and ending with a letter or digit (it names the pool's Service)"
        ),
        holds=lambda name: re.fullmatch(POOL_NAME_PATTERN, name) is not None,
    ),
)


class InferencePool(BaseModel):
    """A model served by disaggregated prefill and decode pools of vLLM engines behind a router."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    api_version: Literal["serving.inferencepool.dev/v1alpha1"] = Field(
        default="serving.inferencepool.dev/v1alpha1", description="serving.inferencepool.dev/v1alpha1"
    )
    kind: Literal["InferencePool"] = Field(default="InferencePool", description="InferencePool")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: InferencePoolSpec = Field(description="Desired state.")
    status: InferencePoolStatus | None = Field(
        default=None, description="Observed state, written by the operator."
    )

    @model_validator(mode="after")
    def _check_name(self) -> InferencePool:
        name = self.metadata.get("name")
        if isinstance(name, str):
            broken = [rule.message for rule in NAME_RULES if not rule.holds(name)]
            if broken:
                raise ValueError("; ".join(broken))
        return self

    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))
