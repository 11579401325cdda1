"""The real-engine demo's wiring (pure): the pool it applies becomes real engines within the memory bound,
its long prompt is long enough for the prefill pool, and the hand-off evidence is read from engine metrics."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import pool_children
from inferencepool.cluster import podspec, vllm_cpu
from inferencepool.demo import real
from inferencepool.demo import run as demo
from inferencepool.model.tiny import TinyShape, train_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def demo_pool() -> tuple[dict[str, object], InferencePool]:
    document = yaml.safe_load((ROOT / real.POOL_FILE).read_text())
    document["metadata"].update(namespace="default", uid="1f0c7a52-0000-4000-8000-000000000002")
    return document, InferencePool.model_validate(document)


def test_the_vllm_demo_applies_its_own_pool_and_waits_long_enough() -> None:
    parser = argparse.ArgumentParser()
    demo.configure(parser)
    default = parser.parse_args([])
    assert default.engine == "fake" and default.pool_file is None and default.timeout is None
    assert real.POOL_FILE != demo.DEFAULT_POOL_FILE
    assert real.READY_TIMEOUT_SECONDS >= 3 * 5 * 60  # three engines at 3-5 minutes each, started together


def test_the_vllm_demo_pool_runs_every_engine_on_real_vllm_and_at_most_three() -> None:
    document, pool = demo_pool()
    spec = document["spec"]
    assert isinstance(spec, dict)
    most = sum(spec[role]["autoscaling"]["maxReplicas"] for role in ("prefill", "decode"))
    assert most <= vllm_cpu.DEFAULT_MAX_ENGINES
    engine = vllm_cpu.CpuEngine(venv="/repo/.venv-vllm", model="/repo/out/tiny-model")
    statefulsets = [c for c in pool_children(pool) if c["kind"] == "StatefulSet"]
    roles = set()
    for statefulset in statefulsets:
        role = statefulset["metadata"]["labels"]["serving.inferencepool.dev/role"]
        template = statefulset["spec"]["template"]
        pod = {
            "metadata": {"name": f"{statefulset['metadata']['name']}-0", "namespace": "default", "uid": "u"},
            "spec": template["spec"],
            "status": {"phase": "Running", "podIP": "127.20.0.5"},
        }
        if role not in ("prefill", "decode"):
            continue
        roles.add(role)
        # The fake-engine demo's runner leaves these pods to kwok; the engine mode runs them.
        assert not podspec.runs_locally(pod)
        plan = podspec.plan_pod(pod, "/py", _NoObjects(), {}, "/k", "/v", engine, (0,))
        (container,) = plan.containers
        assert container.argv[:3] == ("/repo/.venv-vllm/bin/vllm", "serve", "/repo/out/tiny-model")
        assert '"kv_buffer_device":"cpu"' in container.argv[container.argv.index("--kv-transfer-config") + 1]
    assert roles == {"prefill", "decode"}


class _NoObjects:
    def config_map(self, namespace: str, name: str) -> None:
        return None

    def secret(self, namespace: str, name: str) -> None:
        return None


def test_the_long_prompt_goes_through_prefill_and_fits_the_model() -> None:
    document, _ = demo_pool()
    spec = document["spec"]
    assert isinstance(spec, dict)
    threshold = spec["router"]["prefillThresholdTokens"]
    max_model_len = spec["engine"]["maxModelLen"]
    assert max_model_len <= TinyShape().max_position_embeddings
    # The tiny model's own tokenizer (what the engine counts), with room for the chat template and answer.
    tokenizer = train_tokenizer(TinyShape().vocab_size)
    long_tokens = len(tokenizer.encode(real.LONG_PROMPT).ids)
    short_tokens = len(tokenizer.encode(demo.SHORT_PROMPT).ids)
    assert short_tokens < threshold < long_tokens / 2
    assert long_tokens < max_model_len / 2


# A decode engine's /metrics after one hand-off (vLLM 0.32 CPU, NixlConnector), trimmed to the families read.
DECODE_METRICS = """\
# HELP vllm:nixl_xfer_time_seconds Histogram of transfer duration for NIXL KV Cache transfers.
# TYPE vllm:nixl_xfer_time_seconds histogram
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.005",model_name="tiny"} 1.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 1.0
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="tiny"} 1.0
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="tiny"} 0.0012
# HELP vllm:nixl_bytes_transferred Histogram of bytes transferred per NIXL KV Cache transfers.
# TYPE vllm:nixl_bytes_transferred histogram
vllm:nixl_bytes_transferred_bucket{engine="0",le="+Inf",model_name="tiny"} 1.0
vllm:nixl_bytes_transferred_count{engine="0",model_name="tiny"} 1.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="tiny"} 393216.0
# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_compute"} 1.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_cache_hit"} 0.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="external_kv_transfer"} 767.0
"""


def test_evidence_is_read_from_the_engines_own_counters() -> None:
    values = real.sample_values(DECODE_METRICS)
    assert values == {
        "NIXL reads": 1.0,
        "NIXL bytes": 393216.0,
        "prompt tokens from an external KV transfer": 767.0,
        "prompt tokens computed locally": 1.0,
    }
    assert real.sample_values("") == dict.fromkeys(values, 0.0)


def test_a_hand_off_counts_only_when_a_decode_engine_read_kv() -> None:
    zero = real.sample_values("")
    after = real.sample_values(DECODE_METRICS)
    roles = {"demo-decode-0": "decode", "demo-prefill-0": "prefill"}
    found = real.handoffs({"demo-decode-0": zero}, {"demo-decode-0": after, "demo-prefill-0": zero}, roles)
    assert real.decode_pulled_kv(found)
    assert real.describe(found[0]).startswith("decode demo-decode-0: NIXL reads +1 (now 1)")
    assert real.describe(found[1]) == "prefill demo-prefill-0: no change"
    # The same counters before and after: no hand-off, whatever the totals.
    assert not real.decode_pulled_kv(real.handoffs({"demo-decode-0": after}, {"demo-decode-0": after}, roles))
    # A prefill engine's counters never count as the decode's read.
    swapped = {"demo-decode-0": "prefill"}
    assert not real.decode_pulled_kv(
        real.handoffs({"demo-decode-0": zero}, {"demo-decode-0": after}, swapped)
    )
