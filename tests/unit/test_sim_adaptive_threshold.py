"""The simulator drives the adaptive threshold (sim/cluster.py::_adapt_threshold) with the router's signals:
decode pods that prefill mid-size prompts stall their streams, and the threshold falls to move those prompts
to the prefill pool, which a p90 of token gaps did not see."""

from __future__ import annotations

import pytest

import inferencepool.router.threshold as threshold
from inferencepool.perf.profiles import get_profile
from inferencepool.router.config import AdaptiveThresholdConfig
from inferencepool.sim.cluster import Scenario, simulate
from inferencepool.sim.workload import TraceRequest

H100 = get_profile("llama-3.1-8b-h100")
BASE = 4096


def stalling_trace() -> list[TraceRequest]:
    # a request every 0.1 s: 3000-token prompts (under the threshold, so prefilled on decode pods), and one
    # long prompt in five
    return [TraceRequest(i * 0.1, 6000 if i % 5 == 0 else 3000, 150) for i in range(400)]


def thresholds(monkeypatch: pytest.MonkeyPatch, stall_percentile: int) -> list[int]:
    monkeypatch.setattr(threshold, "STALL_PERCENTILE", stall_percentile)
    # decode pods on vLLM's default chunk (8192): the ITL-sized chunk of the tuned default would not stall
    adaptive = AdaptiveThresholdConfig(
        enabled=True,
        min_tokens=1024,
        max_tokens=16384,
        ttft_target_milliseconds=2000,
        itl_target_milliseconds=25,
    )
    scenario = Scenario(
        "adaptive",
        "LengthAware",
        1,
        2,
        BASE,
        adaptive=adaptive,
        decode_chunk_tokens=H100.max_num_batched_tokens,
        ttft_target_seconds=2.0,
        itl_target_seconds=0.025,
    )
    result = simulate(scenario, H100, stalling_trace())
    return [value for _, value in result.thresholds]


def test_stalls_on_decode_pods_lower_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    moved = thresholds(monkeypatch, threshold.STALL_PERCENTILE)
    assert moved[0] == BASE
    assert min(moved) < 3000  # low enough that the stalling prompts go through the prefill pool


def test_a_p90_of_gaps_would_have_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same run judged on the p90 of gaps (the old signal) never moves: the stalls hide under it."""
    assert thresholds(monkeypatch, 90) == [BASE]
