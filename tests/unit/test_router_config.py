"""RouterConfig: the operator writes it, the router reads it; bad input names the field."""

from __future__ import annotations

import pytest

from inferencepool.router.config import ConfigError, RouterConfig, parse_config
from inferencepool.router.discovery import pod_spec_from_object, static_pods
from inferencepool.router.handshake import NIXL_PREFILL_PARAMS, nixl_decode_body, nixl_prefill_body


def test_round_trip_through_the_configmap_text() -> None:
    config = RouterConfig(
        pool="llama", namespace="ml", served_model_name="llama-8b", policy="AlwaysDisaggregate"
    )
    assert parse_config(config.to_yaml(), "cm") == config
    wire = config.to_wire()
    assert wire["servedModelName"] == "llama-8b" and wire["prefillThresholdTokens"] == 4096


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("pool: p\npolicy: Fastest", "policy"),
        ("pool: p\nprefillThresholdTokens: 0", "prefillThresholdTokens"),
        ("pool: p\nadaptiveThreshold: {enabled: true, minTokens: 9000, maxTokens: 100}", "minTokens"),
        (
            "pool: p\nadaptiveThreshold: {enabled: true, minTokens: 8000}\nprefillThresholdTokens: 4096",
            "must lie",
        ),
        ("namespace: x", "either `pool`"),
        ("static: {decode: [ftp://x]}", "not an http"),
        ("pool: p\nsurprise: 1", "surprise"),
        ("- a list", "mapping"),
        ("pool: [unclosed", "not valid YAML"),
    ],
)
def test_bad_config_names_the_field(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "router.yaml")
    assert needle in str(caught.value) and "router.yaml" in str(caught.value)


def test_static_backends_become_named_pods() -> None:
    config = parse_config("static: {prefill: ['http://127.0.0.1:1/'], decode: ['http://127.0.0.1:2']}", "x")
    assert config.static is not None
    specs = static_pods(config.static)
    assert [(s.name, s.url, s.role) for s in specs] == [
        ("prefill@127.0.0.1:1", "http://127.0.0.1:1", "prefill"),
        ("decode@127.0.0.1:2", "http://127.0.0.1:2", "decode"),
    ]


def _pod(**overrides: object) -> dict[str, object]:
    pod: dict[str, object] = {
        "metadata": {"name": "llama-decode-0", "labels": {"serving.inferencepool.dev/role": "decode"}},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "ports": [
                        {"name": "nixl", "containerPort": 5600},
                        {"name": "http", "containerPort": 8000},
                    ],
                }
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": "127.0.10.4",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    pod.update(overrides)
    return pod


def test_pod_object_maps_to_role_url_and_readiness() -> None:
    spec = pod_spec_from_object(_pod())
    assert spec is not None
    assert (spec.name, spec.url, spec.role, spec.ready, spec.terminating) == (
        "llama-decode-0",
        "http://127.0.10.4:8000",
        "decode",
        True,
        False,
    )
    not_ready = _pod(
        status={
            "phase": "Running",
            "podIP": "127.0.10.4",
            "conditions": [{"type": "Ready", "status": "False"}],
        }
    )
    assert pod_spec_from_object(not_ready).ready is False  # type: ignore[union-attr]
    leaving = _pod(
        metadata={
            "name": "x",
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"serving.inferencepool.dev/role": "prefill"},
        }
    )
    assert pod_spec_from_object(leaving).terminating is True  # type: ignore[union-attr]
    assert pod_spec_from_object(_pod(status={"phase": "Pending"})) is None  # no IP yet
    assert pod_spec_from_object(_pod(metadata={"name": "r", "labels": {}})) is None  # not an engine


def test_nixl_legs_follow_vllms_proxy() -> None:
    body = {
        "model": "m",
        "prompt": "p",
        "max_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
        "min_tokens": 5,
        "max_completion_tokens": 50,
    }
    prefill = nixl_prefill_body(body)
    assert prefill["max_tokens"] == 1 and prefill["max_completion_tokens"] == 1 and prefill["stream"] is False
    assert "stream_options" not in prefill and "min_tokens" not in prefill
    assert prefill["kv_transfer_params"] == NIXL_PREFILL_PARAMS
    params = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_block_ids": [1, 2]}
    decode = nixl_decode_body(body, {"choices": [], "kv_transfer_params": params})
    assert decode == {**body, "kv_transfer_params": params}
    with pytest.raises(ValueError, match="kv_transfer_params"):
        nixl_decode_body(body, {"choices": []})
