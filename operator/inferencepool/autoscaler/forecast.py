"""Load one model-load time ahead (pure; time is passed in).

A new replica serves only after its model loads, so the planner sizes a pool for the load it will carry
then, not now. The forecast of one signal is the larger of:
- the trend: a least-squares line over the last `trend_seconds` of samples, read at now + horizon (never
  below zero),
- the recent level: the mean of the samples of the last `recent_seconds`, the latest one included (a falling
  trend lowers the forecast no faster than the load itself has fallen, so a pool does not shrink ahead of
  its load).
The recent level is a mean, not the highest sample: one interval's sample of a steady load scatters around
its level (prompt lengths vary, a request's tokens land in one interval or the next), and the highest of
four such samples sits about one scatter above it, a margin held all day for noise. Bursts are held apart,
by `BurstMemory` (the planner's burst hold), not by the forecast.
With fewer than `min_trend_samples` samples in the trend window (a line through two or three points
extrapolates noise, or a start-up ramp, into a surge), the forecast is the larger of the latest sample and
the recent level (or None: nothing is known yet).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Forecast:
    value: float  # what the pool should be sized for at now + horizon (before headroom)
    latest: float
    trend: float  # the line at now + horizon
    recent: float  # the mean of the last recent_seconds
    slope: float  # per second


class Forecaster:
    def __init__(
        self, trend_seconds: float = 300.0, recent_seconds: float = 120.0, min_trend_samples: int = 2
    ) -> None:
        if trend_seconds <= 0 or recent_seconds < 0 or min_trend_samples < 2:
            raise ValueError("trend_seconds must be > 0, recent_seconds >= 0 and min_trend_samples >= 2")
        self.trend_seconds = trend_seconds
        self.recent_seconds = recent_seconds
        self.min_trend_samples = min_trend_samples
        self._samples: deque[tuple[float, float]] = deque()

    def observe(self, now: float, value: float) -> None:
        if self._samples and now < self._samples[-1][0]:
            raise ValueError(f"samples must come in time order: {now} after {self._samples[-1][0]}")
        self._samples.append((now, value))
        keep = max(self.trend_seconds, self.recent_seconds)
        while self._samples and self._samples[0][0] < now - keep:
            self._samples.popleft()

    def forecast(self, now: float, horizon: float) -> Forecast | None:
        if not self._samples:
            return None
        latest = self._samples[-1][1]
        window = [(t, v) for t, v in self._samples if t >= now - self.trend_seconds]
        recent = self.mean(now, self.recent_seconds)
        if recent is None:
            recent = latest
        if len(window) < self.min_trend_samples:
            return Forecast(max(latest, recent), latest, latest, recent, 0.0)
        n = len(window)
        mean_t = sum(t for t, _ in window) / n
        mean_v = sum(v for _, v in window) / n
        spread = sum((t - mean_t) ** 2 for t, _ in window)
        slope = sum((t - mean_t) * (v - mean_v) for t, v in window) / spread if spread > 0 else 0.0
        trend = max(0.0, mean_v + slope * (now + horizon - mean_t))
        return Forecast(max(trend, recent), latest, trend, recent, slope)

    def mean(self, now: float, seconds: float) -> float | None:
        """The mean sample of the last `seconds` (None: no sample in it)."""
        values = [v for t, v in self._samples if t >= now - seconds]
        return sum(values) / len(values) if values else None


class BurstMemory:
    """The q-quantile (nearest rank) of samples over the last `memory_seconds`: how big a burst the pool
    should be ready for. Bursts shorter than a model load cannot be followed, only held capacity for; q
    trades GPU-hours for attainment (1.0 holds the largest burst of the memory)."""

    def __init__(self, memory_seconds: float = 1800.0, quantile: float = 0.99) -> None:
        if memory_seconds <= 0 or not 0 < quantile <= 1:
            raise ValueError("memory_seconds must be > 0 and quantile within (0, 1]")
        self.memory_seconds = memory_seconds
        self.quantile = quantile
        self._samples: deque[tuple[float, float]] = deque()

    def observe(self, now: float, value: float) -> None:
        self._samples.append((now, value))
        while self._samples and self._samples[0][0] < now - self.memory_seconds:
            self._samples.popleft()

    def level(self) -> float:
        if not self._samples:
            return 0.0
        values = sorted(v for _, v in self._samples)
        rank = max(1, math.ceil(self.quantile * len(values)))
        return values[rank - 1]
