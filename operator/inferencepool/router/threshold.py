"""Adaptive prefill threshold (pure): move the LengthAware threshold from both pools' live load.

Signals are router-observed, so they need no scraping, and each watches what makes requests miss their SLO:

- prefill pressure: the prefill leg's latency (queueing on prefill pods shows up there first), its configured
  percentile against the TTFT target;
- decode pressure, the worse of two: the tail of decode inter-token gaps (their 99th percentile against the
  ITL target) and the TTFT of prompts prefilled on decode pods (the direct route's time to first token, its
  configured percentile against the TTFT target). A p90 of gaps cannot see stalls: a prefill chunk on a decode
  pod stretches one step for every stream running there, so a stall in 1 gap out of 50 reaches most requests,
  and their ITL and the direct prompts' TTFT are what then fail, while the p90 stays at the steady step.

The rule:

- prefill over target, decode has headroom -> raise the threshold (decode pods prefill more prompts);
- decode over target, prefill has headroom -> lower it (more prompts go through the prefill pool);
- both over target                         -> hold (capacity is the autoscaler's job, not routing's);
- both comfortable                         -> drift back toward the configured threshold.

Each move is a fixed relative step, clamped to the configured bounds, at most once per interval. An interval
with too few samples of the prefill legs or the gaps (few long prompts, so few prefill legs) carries its
samples over to the next, for at most KEEP_ROUNDS intervals: a quiet signal is still judged, on load no older
than that. Direct TTFT is judged when it has enough samples, and left out otherwise.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from inferencepool.router.config import AdaptiveThresholdConfig

# Below this share of its target a pool has headroom to take more work.
HEADROOM = 0.8
# Intervals a sample may wait for enough company before it is too old to judge load by.
KEEP_ROUNDS = 6
# The percentile of decode gaps compared with the ITL target: where the stalls are (see the module docstring).
STALL_PERCENTILE = 99


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
    current: int,
    base: int,
    config: AdaptiveThresholdConfig,
    prefill: SampleWindow,
    itl: SampleWindow,
    direct_ttft: SampleWindow | None = None,
) -> Decision:
    """One interval's decision from the windows, which then start the next interval."""
    direct = direct_ttft.recent() if direct_ttft is not None else []
    decision = next_threshold(current, base, config, prefill.recent(), itl.recent(), direct)
    prefill.next_round(decision.judged)
    itl.next_round(decision.judged)
    if direct_ttft is not None:
        direct_ttft.next_round(decision.judged)
    return decision


@dataclass(frozen=True, slots=True)
class Loads:
    """Each signal as a share of its target (1.0: at target); direct TTFT None when it had too few samples."""

    prefill: float
    itl_tail: float
    direct_ttft: float | None

    @property
    def decode(self) -> float:
        return max(self.itl_tail, self.direct_ttft or 0.0)

    def describe(self) -> str:
        direct = (
            f", prompts prefilled on decode at {self.direct_ttft:.0%} of the TTFT target"
            if self.direct_ttft is not None
            else ""
        )
        return (
            f"prefill at {self.prefill:.0%} of its TTFT target, decode ITL p{STALL_PERCENTILE} at "
            f"{self.itl_tail:.0%} of its target{direct}"
        )


def loads(
    config: AdaptiveThresholdConfig,
    prefill_leg_seconds: Sequence[float],
    decode_itl_seconds: Sequence[float],
    direct_ttft_seconds: Sequence[float],
) -> Loads:
    ttft_target = config.ttft_target_milliseconds / 1000
    direct = (
        percentile(direct_ttft_seconds, config.percentile) / ttft_target
        if len(direct_ttft_seconds) >= config.min_samples
        else None
    )
    return Loads(
        prefill=percentile(prefill_leg_seconds, config.percentile) / ttft_target,
        itl_tail=percentile(decode_itl_seconds, STALL_PERCENTILE) * 1000 / config.itl_target_milliseconds,
        direct_ttft=direct,
    )


def next_threshold(
    current: int,
    base: int,
    config: AdaptiveThresholdConfig,
    prefill_leg_seconds: list[float],
    decode_itl_seconds: list[float],
    direct_ttft_seconds: Sequence[float] = (),
) -> Decision:
    """Decide the threshold for the next interval from one interval of samples."""
    if len(prefill_leg_seconds) < config.min_samples or len(decode_itl_seconds) < config.min_samples:
        return Decision(current, "too few samples to judge load", judged=False)
    measured = loads(config, prefill_leg_seconds, decode_itl_seconds, direct_ttft_seconds)
    prefill_load, decode_load = measured.prefill, measured.decode
    factor = 1 + config.step_percent / 100
    described = measured.describe()
    if prefill_load > 1 and decode_load < HEADROOM:
        proposal, reason = math.ceil(current * factor), f"raise: {described}"
    elif decode_load > 1 and prefill_load < HEADROOM:
        proposal, reason = math.floor(current / factor), f"lower: {described}"
    elif prefill_load > 1 and decode_load > 1:
        return Decision(current, f"hold, both pools over target: {described}")
    elif prefill_load < HEADROOM and decode_load < HEADROOM and current != base:
        proposal = (
            max(math.floor(current / factor), base)
            if current > base
            else min(math.ceil(current * factor), base)
        )
        reason = f"return toward {base}: {described}"
    else:
        return Decision(current, f"hold: {described}")
    clamped = min(max(proposal, config.min_tokens), config.max_tokens)
    if clamped == current:
        return Decision(current, f"hold at bound: {described}")
    return Decision(clamped, reason)
