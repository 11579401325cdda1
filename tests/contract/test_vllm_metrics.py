"""The fake engine's vLLM latency histograms against vLLM 0.33.0's PrometheusStatLogger: each name shares the
bucket list vLLM gives it, and the per-request TPOT is vLLM's figure (decode time over the tokens after the
first)."""

from __future__ import annotations

import ast

from inferencepool.engine_sim import metrics
from tests.contract.vllm_source import Wheel

LOGGERS = "vllm/v1/metrics/loggers.py"
STATS = "vllm/v1/metrics/stats.py"


def histogram_buckets(wheel: Wheel) -> dict[str, str]:
    """Metric name -> the bucket variable its `self._histogram_cls(name=..., buckets=...)` gets."""
    found: dict[str, str] = {}
    for node in ast.walk(wheel.tree(LOGGERS)):
        if not isinstance(node, ast.Call):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        name, buckets = keywords.get("name"), keywords.get("buckets")
        if isinstance(name, ast.Constant) and isinstance(name.value, str) and isinstance(buckets, ast.Name):
            found[name.value] = buckets.id
    return found


def test_tpot_histogram_is_vllms_with_the_itl_buckets(vllm_wheel: Wheel) -> None:
    buckets = histogram_buckets(vllm_wheel)
    assert buckets["vllm:inter_token_latency_seconds"] == "inter_token_latency_buckets"
    assert buckets["vllm:request_time_per_output_token_seconds"] == "inter_token_latency_buckets"
    assert buckets["vllm:time_to_first_token_seconds"] == "time_to_first_token_buckets"
    assert metrics.TPOT_BUCKETS == metrics.ITL_BUCKETS
    source = vllm_wheel.source(LOGGERS)
    assert "Histogram of time_per_output_token_seconds per request." in source
    assert "finished_request.mean_time_per_output_token" in source


def test_tpot_is_decode_time_over_the_tokens_after_the_first(vllm_wheel: Wheel) -> None:
    source = " ".join(vllm_wheel.source(STATS).split())
    assert "decode_time = req_stats.last_token_ts - req_stats.first_token_ts" in source
    assert (
        "decode_time / (req_stats.num_generation_tokens - 1) "
        "if req_stats.num_generation_tokens - 1 > 0 else 0" in source
    )
    assert metrics.request_tpot(1.0, 2.0, 5) == 0.25 and metrics.request_tpot(1.0, 1.0, 1) == 0.0
