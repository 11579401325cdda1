"""The adaptive threshold judges decode by what fails there: stalls in the ITL tail and the TTFT of prompts
prefilled on decode pods, not a p90 of token gaps."""

from __future__ import annotations

import pytest

from inferencepool.router.config import AdaptiveThresholdConfig
from inferencepool.router.threshold import SampleWindow, adapt, loads, next_threshold

ADAPT = AdaptiveThresholdConfig(
    enabled=True,
    min_tokens=1000,
    max_tokens=8000,
    step_percent=50,
    ttft_target_milliseconds=100,
    itl_target_milliseconds=20,
    percentile=90,
    min_samples=5,
)
STEADY_GAP = 0.010  # half the ITL target
STALL_GAP = 0.250  # a decode step stretched by a long prefill chunk


def gaps(stall_share: float, n: int = 1000) -> list[float]:
    stalls = round(n * stall_share)
    return [STALL_GAP] * stalls + [STEADY_GAP] * (n - stalls)


@pytest.mark.parametrize(
    ("case", "prefill_s", "itl", "direct_ttft", "expected", "reason"),
    [
        # 3% of gaps stall: the p90 sits at the steady step, the p99 sees the stalls -> decode over target
        ("stalls hidden from a p90", 0.01, gaps(0.03), [], 2666, "lower"),
        ("stalls while prefill is also over target", 0.3, gaps(0.03), [], 4000, "hold, both pools over"),
        # stalls so rare that they miss even the p99: decode has headroom, prefill queues -> raise
        ("stalls below the tail", 0.3, gaps(0.005), [], 6000, "raise"),
        # steady ITL, but prompts prefilled on decode pods wait past the TTFT target -> fewer of them
        ("direct prompts queue on decode", 0.01, gaps(0.0), [0.3] * 10, 2666, "lower"),
        # prefill queues and would raise, but decode pods are already near their TTFT target -> hold
        ("direct TTFT without headroom", 0.3, gaps(0.0), [0.09] * 10, 4000, "hold"),
        ("direct TTFT with headroom", 0.3, gaps(0.0), [0.02] * 10, 6000, "raise"),
        # too few direct samples: judged on the ITL tail alone
        ("direct TTFT too sparse", 0.3, gaps(0.0), [0.3] * 4, 6000, "raise"),
        ("both comfortable, back toward base", 0.01, gaps(0.0), [0.02] * 10, 4000, "return toward 4000"),
    ],
)
def test_threshold_moves_for_the_signal_that_fails(
    case: str,
    prefill_s: float,
    itl: list[float],
    direct_ttft: list[float],
    expected: int,
    reason: str,
) -> None:
    current = 4000 if case != "both comfortable, back toward base" else 6000
    decision = next_threshold(current, 4000, ADAPT, [prefill_s] * 10, itl, direct_ttft)
    assert decision.judged
    assert decision.threshold == expected, decision.reason
    assert decision.reason.startswith(reason), decision.reason


def test_a_p90_of_gaps_would_not_have_seen_the_stalls() -> None:
    """The case the tail exists for: stalls in 3% of gaps leave the p90 at the steady step."""
    measured = loads(ADAPT, [0.01] * 10, gaps(0.03), [])
    assert measured.itl_tail == pytest.approx(STALL_GAP / 0.020)
    ordered = sorted(gaps(0.03))
    assert ordered[int(0.9 * len(ordered))] == STEADY_GAP
    assert measured.direct_ttft is None


def test_the_reason_names_each_signal() -> None:
    decision = next_threshold(4000, 4000, ADAPT, [0.01] * 10, gaps(0.03), [0.3] * 10)
    assert "decode ITL p99 at 1250% of its target" in decision.reason
    assert "prompts prefilled on decode at 300% of the TTFT target" in decision.reason


def test_direct_ttft_window_carries_over_and_is_used_with_the_others() -> None:
    prefill, itl, direct = SampleWindow(), SampleWindow(), SampleWindow()
    for _ in range(10):
        prefill.add(0.01)
        direct.add(0.3)
    for gap in gaps(0.0, n=50):
        itl.add(gap)
    decision = adapt(4000, 4000, ADAPT, prefill, itl, direct)
    assert decision.threshold == 2666 and decision.reason.startswith("lower")
    assert direct.recent() == []  # used: the next interval judges fresh load
    # without the window (the simulator's and the router's old call), the same load holds at base
    for _ in range(10):
        prefill.add(0.01)
    for gap in gaps(0.0, n=50):
        itl.add(gap)
    assert adapt(4000, 4000, ADAPT, prefill, itl).threshold == 4000
