"""Adaptive prefill threshold (pure): move the LengthAware threshold from both pools' live load.

Signals are router-observed, so they need no scraping: the prefill leg's latency (queueing on prefill pods
shows up there first) against the TTFT target, and decode inter-token latency against the ITL target. The
rule:

- prefill over target, decode has headroom -> raise the threshold (decode pods prefill more prompts);
- decode over target, prefill has headroom -> lower it (more prompts go through the prefill pool);
- both over target                         -> hold (capacity is the autoscaler's job, not routing's);
- both comfortable                         -> drift back toward the configured threshold.

Each move is a fixed relative step, clamped to the configured bounds, at most once per interval. An interval
with too few samples of either signal (few long prompts, so few prefill legs) carries its samples over to the
next, for at most KEEP_ROUNDS intervals: a quiet signal is still judged, on load no older than that.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from inferencepool.router.config import AdaptiveThresholdConfig

# Below this share of its target a pool has headroom to take more work.
HEADROOM = 0.8
# Intervals a sample may wait for enough company before it is too old to judge load by.
KEEP_ROUNDS = 6


def percentile(values: Iterable[float], pct: int) -> float:
    """Nearest-rank percentile of a sample (no interpolation: what a user would compute by hand)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of an empty sample")
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class SampleWindow:
    """Samples of one signal not yet used by a decision, from the last `keep_rounds` intervals at most."""

    capacity: int = 2048
    keep_rounds: int = KEEP_ROUNDS
    values: deque[tuple[int, float]] = field(default_factory=deque)  # (interval added, value)
    round: int = 0

    def add(self, value: float) -> None:
        if len(self.values) >= self.capacity:
            self.values.popleft()
        self.values.append((self.round, value))

    def recent(self) -> list[float]:
        oldest = self.round - self.keep_rounds + 1
        while self.values and self.values[0][0] < oldest:
            self.values.popleft()
        return [value for _, value in self.values]

    def next_round(self, consumed: bool) -> None:
        """End an interval; `consumed`: a decision used the samples, so the next one judges fresh load."""
        if consumed:
            self.values.clear()
        self.round += 1


@dataclass(frozen=True, slots=True)
class Decision:
    threshold: int
    reason: str
    judged: bool = True  # False: too few samples, nothing was decided


def adapt(
    current: int, base: int, config: AdaptiveThresholdConfig, prefill: SampleWindow, itl: SampleWindow
) -> Decision:
    """One interval's decision from the windows, which then start the next interval."""
    decision = next_threshold(current, base, config, prefill.recent(), itl.recent())
    prefill.next_round(decision.judged)
    itl.next_round(decision.judged)
    return decision


def next_threshold(
    current: int,
    base: int,
    config: AdaptiveThresholdConfig,
    prefill_leg_seconds: list[float],
    decode_itl_seconds: list[float],
) -> Decision:
    """Decide the threshold for the next interval from one interval of samples."""
    if len(prefill_leg_seconds) < config.min_samples or len(decode_itl_seconds) < config.min_samples:
        return Decision(current, "too few samples to judge load", judged=False)
    prefill_load = percentile(prefill_leg_seconds, config.percentile) * 1000 / config.ttft_target_milliseconds
    decode_load = percentile(decode_itl_seconds, config.percentile) * 1000 / config.itl_target_milliseconds
    factor = 1 + config.step_percent / 100
    loads = f"prefill at {prefill_load:.0%} of its TTFT target, decode at {decode_load:.0%} of its ITL target"
    if prefill_load > 1 and decode_load < HEADROOM:
        proposal, reason = math.ceil(current * factor), f"raise: {loads}"
    elif decode_load > 1 and prefill_load < HEADROOM:
        proposal, reason = math.floor(current / factor), f"lower: {loads}"
    elif prefill_load > 1 and decode_load > 1:
        return Decision(current, f"hold, both pools over target: {loads}")
    elif prefill_load < HEADROOM and decode_load < HEADROOM and current != base:
        proposal = (
            max(math.floor(current / factor), base)
            if current > base
            else min(math.ceil(current * factor), base)
        )
        reason = f"return toward {base}: {loads}"
    else:
        return Decision(current, f"hold: {loads}")
    clamped = min(max(proposal, config.min_tokens), config.max_tokens)
    if clamped == current:
        return Decision(current, f"hold at bound: {loads}")
    return Decision(clamped, reason)
