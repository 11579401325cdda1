"""The InferencePool models: examples parse, defaults apply in code, bad specs fail with the field's name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from inferencepool.api.v1alpha1 import (
    DEFAULT_PREFILL_THRESHOLD_TOKENS,
    InferencePool,
    InferencePoolSpec,
    InferencePoolStatus,
    PoolStatus,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return document


def gpu_spec() -> dict[str, Any]:
    spec: dict[str, Any] = example("llama-3.1-8b.yaml")["spec"]
    return spec


@pytest.mark.parametrize("name", ["llama-3.1-8b.yaml", "demo-cpu.yaml"])
def test_examples_parse_and_round_trip(name: str) -> None:
    document = example(name)
    pool = InferencePool.model_validate(document)
    assert pool.model_dump(by_alias=True, exclude_unset=True) == document


def test_gpu_example_reads_as_designed() -> None:
    spec = InferencePoolSpec.model_validate(gpu_spec())
    assert spec.served_model_name() == "llama-8b"
    assert (spec.prefill.initial_replicas(), spec.decode.initial_replicas()) == (2, 4)
    assert spec.prefill.autoscales() and spec.decode.autoscales()
    assert (spec.target_milliseconds("prefill"), spec.target_milliseconds("decode")) == (800, 40)
    assert spec.gpus_per_replica("prefill") == 1
    assert spec.kv_transfer.connector == "Nixl"
    assert spec.uses_lmcache() and spec.p2p_enabled()
    assert spec.router.threshold_bounds() == (1024, 16384)
    assert spec.model.cache is not None and spec.model.cache.persistent_volume_claim == "model-cache"


def test_demo_example_runs_the_fake_engine_without_gpus() -> None:
    spec = InferencePoolSpec.model_validate(example("demo-cpu.yaml")["spec"])
    assert spec.engine.image == "inferencepool/fake-engine:0.1.0"
    assert spec.router.image == "inferencepool/router:0.1.0"
    assert spec.gpus_per_replica("prefill") == spec.gpus_per_replica("decode") == 0
    assert {"name": "FAKE_ENGINE_PROFILE", "value": "llama-3.1-8b-h100"} in spec.engine.extra_env
    assert spec.model.cache is None and spec.model.token_secret is None
    assert not spec.p2p_enabled()


def test_defaults_are_applied_in_code() -> None:
    spec = InferencePoolSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}})
    assert spec.served_model_name() == "Qwen/Qwen3-0.6B"
    assert spec.engine.image == "vllm/vllm-openai:v0.33.0"
    assert spec.engine.tensor_parallel_size == 1
    assert spec.engine.gpu_memory_utilization_percent == 90
    assert spec.router.policy == "LengthAware"
    assert spec.router.prefill_threshold_tokens == DEFAULT_PREFILL_THRESHOLD_TOKENS == 4096
    assert spec.router.threshold_bounds() == (4096, 4096)
    assert spec.router.prefix_affinity is True
    assert spec.kv_transfer.connector == "Nixl"
    assert not spec.uses_lmcache() and not spec.p2p_enabled()
    assert spec.effective_kv_cache().chunk_size == 256
    assert not spec.prefill.autoscales()
    assert spec.prefill.initial_replicas() == spec.decode.initial_replicas() == 1
    assert spec.target_milliseconds("prefill") is None


def test_autoscaled_pool_without_replicas_starts_at_min() -> None:
    spec = InferencePoolSpec.model_validate(
        {
            "model": {"name": "m"},
            "decode": {
                "autoscaling": {"minReplicas": 3, "maxReplicas": 9, "target": {"itlMilliseconds": 30}}
            },
        }
    )
    assert spec.decode.autoscales()
    assert spec.decode.initial_replicas() == 3
    autoscaling = spec.decode.autoscaling
    assert autoscaling is not None and autoscaling.target.percentile == 90
    assert (autoscaling.scale_down_stabilization_seconds, autoscaling.max_scale_up_replicas) == (300, 4)


def test_disabled_autoscaling_pins_replicas() -> None:
    spec = gpu_spec()
    spec["prefill"]["autoscaling"]["enabled"] = False
    spec["prefill"]["replicas"] = 12  # outside the bounds, which only matter while autoscaling is on
    parsed = InferencePoolSpec.model_validate(spec)
    assert not parsed.prefill.autoscales()
    assert parsed.prefill.initial_replicas() == 12
    assert parsed.target_milliseconds("prefill") is None


def test_gpus_default_to_tensor_parallel_size() -> None:
    spec = gpu_spec()
    spec["engine"]["tensorParallelSize"] = 4
    del spec["prefill"]["gpusPerReplica"]
    spec["decode"]["gpusPerReplica"] = 4
    parsed = InferencePoolSpec.model_validate(spec)
    assert parsed.gpus_per_replica("prefill") == parsed.gpus_per_replica("decode") == 4


def test_accepts_a_read_only_mapping_like_kopf_hands_over() -> None:
    parsed = InferencePoolSpec.model_validate(MappingProxyType(gpu_spec()))
    assert parsed.decode.initial_replicas() == 4


def set_path(document: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        document = document.setdefault(key, {})
    document[last] = value


INVALID_SPECS = [
    # (what to change in the GPU example, value, text the error must contain)
    ("prefill.autoscaling.minReplicas", 9, "spec.prefill.autoscaling.minReplicas must be <= maxReplicas"),
    ("decode.autoscaling.minReplicas", 20, "spec.decode.autoscaling.minReplicas must be <= maxReplicas"),
    (
        "decode.replicas",
        17,
        "spec.decode.replicas must be within spec.decode.autoscaling.minReplicas..maxReplicas",
    ),
    ("prefill.replicas", 0, "spec.prefill.replicas must be within"),
    (
        "router.prefillThresholdTokens",
        0,
        "router.prefillThresholdTokens\n  Input should be greater than or equal to 1",
    ),
    (
        "router.prefillThresholdTokens",
        -1,
        "router.prefillThresholdTokens\n  Input should be greater than or equal to 1",
    ),
    ("router.prefillThresholdTokens", 20000, "spec.router.prefillThresholdTokens must be within"),
    (
        "router.adaptiveThreshold.minTokens",
        50000,
        "spec.router.adaptiveThreshold.minTokens must be <= maxTokens",
    ),
    (
        "router.policy",
        "RoundRobin",
        "router.policy\n  Input should be 'LengthAware', 'AlwaysDisaggregate' or 'Colocated'",
    ),
    (
        "prefill.autoscaling.target.percentile",
        120,
        "prefill.autoscaling.target.percentile\n  Input should be less",
    ),
    (
        "decode.autoscaling.target.percentile",
        49,
        "decode.autoscaling.target.percentile\n  Input should be greater",
    ),
    (
        "kvTransfer.connector",
        "LMCachePD",
        "spec.kvCache.p2p.enabled must be false when spec.kvTransfer.connector is LMCachePD",
    ),
    (
        "prefill.autoscaling.target",
        {"itlMilliseconds": 40},
        "spec.prefill.autoscaling.target must set ttftMilliseconds",
    ),
    (
        "decode.autoscaling.target.ttftMilliseconds",
        500,
        "spec.decode.autoscaling.target must set itlMilliseconds",
    ),
    ("prefill.gpusPerReplica", 1, None),  # valid: TP1 on one GPU (control case for the next line)
    (
        "engine.tensorParallelSize",
        2,
        "spec.prefill.gpusPerReplica must be 0 (no GPU) or >= spec.engine.tensorParallelSize",
    ),
    ("router.prefilThresholdTokens", 4096, "router.prefilThresholdTokens\n  Extra inputs are not permitted"),
    ("decode.replicas", 4.0, "decode.replicas\n  Input should be a valid integer"),
    ("decode.replicas", "4", "decode.replicas\n  Input should be a valid integer"),
    ("kvCache.cpuOffloadGiB", 2.5, "kvCache.cpuOffloadGiB\n  Input should be a valid integer"),
    ("model.tokenSecret", {"name": "hf-token"}, "model.tokenSecret.key\n  Field required"),
]


@pytest.mark.parametrize(
    ("dotted", "value", "error"), INVALID_SPECS, ids=[f"{d}={v}" for d, v, _ in INVALID_SPECS]
)
def test_invalid_specs_fail_naming_the_field(dotted: str, value: Any, error: str | None) -> None:
    spec = gpu_spec()
    set_path(spec, dotted, value)
    if error is None:
        InferencePoolSpec.model_validate(spec)
        return
    with pytest.raises(ValidationError) as raised:
        InferencePoolSpec.model_validate(spec)
    assert error in str(raised.value)


def test_missing_model_is_named() -> None:
    spec = gpu_spec()
    del spec["model"]
    with pytest.raises(ValidationError, match="model\n  Field required"):
        InferencePoolSpec.model_validate(spec)


def test_whole_object_errors_carry_the_spec_prefix() -> None:
    document = example("demo-cpu.yaml")
    document["spec"]["router"]["policy"] = "Random"
    with pytest.raises(ValidationError, match=r"spec\.router\.policy"):
        InferencePool.model_validate(document)


def test_all_broken_rules_are_reported_at_once() -> None:
    spec = gpu_spec()
    spec["prefill"]["autoscaling"]["minReplicas"] = 10
    spec["kvTransfer"]["connector"] = "LMCachePD"
    with pytest.raises(ValidationError) as raised:
        InferencePoolSpec.model_validate(spec)
    assert "spec.prefill.autoscaling.minReplicas" in str(raised.value)
    assert "spec.kvCache.p2p.enabled" in str(raised.value)


def test_lmcache_pd_mode_without_p2p_is_valid_and_turns_lmcache_on() -> None:
    spec = gpu_spec()
    spec["kvTransfer"]["connector"] = "LMCachePD"
    del spec["kvCache"]
    spec["router"]["replicas"] = 1
    parsed = InferencePoolSpec.model_validate(spec)
    assert parsed.uses_lmcache() and not parsed.p2p_enabled()


@pytest.mark.parametrize(
    ("connector", "replicas", "valid"), [("LMCachePD", 2, False), ("LMCachePD", 1, True), ("Nixl", 2, True)]
)
def test_lmcache_pd_mode_needs_a_single_router(connector: str, replicas: int, valid: bool) -> None:
    # LMCache's prefill engines notify one address; a second router pod would miss half the notifications.
    spec = gpu_spec()
    spec["kvTransfer"]["connector"] = connector
    del spec["kvCache"]
    spec.setdefault("router", {})["replicas"] = replicas
    if valid:
        assert InferencePoolSpec.model_validate(spec).router.replicas == replicas
        return
    with pytest.raises(ValidationError) as raised:
        InferencePoolSpec.model_validate(spec)
    assert "spec.router.replicas must be 1 when spec.kvTransfer.connector is LMCachePD" in str(raised.value)


def test_set_condition_moves_transition_time_only_on_status_change() -> None:
    start = datetime(2025, 1, 1, tzinfo=UTC)
    status = InferencePoolStatus()
    status.set_condition("Ready", "False", "PodsStarting", "0/2 prefill", start, observed_generation=1)
    status.set_condition("Degraded", "False", "AsExpected", "", start)
    status.set_condition("Ready", "False", "PodsStarting", "1/2 prefill", start + timedelta(seconds=5))
    ready = status.condition("Ready")
    assert ready is not None and ready.last_transition_time == start and ready.message == "1/2 prefill"
    status.set_condition("Ready", "True", "AllReplicasReady", "", start + timedelta(seconds=9))
    ready = status.condition("Ready")
    assert ready is not None and ready.last_transition_time == start + timedelta(seconds=9)
    assert [c.type for c in status.conditions] == ["Ready", "Degraded"]  # order kept, one entry per type
    assert status.condition("Progressing") is None


def test_condition_reason_must_be_camel_case() -> None:
    status = InferencePoolStatus()
    with pytest.raises(ValidationError, match="reason"):
        status.set_condition("Ready", "True", "all ready", "", datetime(2025, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(
    ("pool", "replicas", "latency"),
    [
        (
            PoolStatus(
                ready_replicas=2, desired_replicas=2, observed_milliseconds=412, target_milliseconds=800
            ),
            "2/2",
            "412/800ms",
        ),
        (PoolStatus(ready_replicas=1, desired_replicas=3, target_milliseconds=40), "1/3", "-/40ms"),
        (PoolStatus(ready_replicas=4, desired_replicas=4, observed_milliseconds=35), "4/4", "35ms"),
        (PoolStatus(), "0/0", "-"),
    ],
)
def test_display_strings(pool: PoolStatus, replicas: str, latency: str) -> None:
    display = InferencePoolStatus(prefill=pool, decode=pool).with_display().display
    assert display is not None
    assert (display.prefill, display.decode, display.ttft, display.itl) == (
        replicas,
        replicas,
        latency,
        latency,
    )


def test_status_reads_back_what_the_api_server_returns() -> None:
    body = {
        "observedGeneration": 2,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "AllReplicasReady",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            }
        ],
        "prefill": {"replicas": 2, "readyReplicas": 2, "desiredReplicas": 2},
        "someFutureField": {"ignored": True},
    }
    status = InferencePoolStatus.model_validate(body)
    assert status.condition("Ready") is not None
    assert status.model_dump(mode="json", by_alias=True, exclude_none=True)["conditions"][0][
        "lastTransitionTime"
    ] == ("2025-01-01T00:00:00Z")
