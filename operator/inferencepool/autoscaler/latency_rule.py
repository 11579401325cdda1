"""How many replicas a pool wants, from its own latency signal (pure; time is passed in).

Prefill pools are held to a TTFT target, decode pools to an ITL target, each at a percentile over a window.
The rule is the Horizontal Pod Autoscaler's, applied to latency: outside the tolerance band, ask for
ceil(current x observed / target) replicas; then bound the change by the step limits and the min/max, and
stabilize it (scale up only if every recommendation in the up window asked for more; scale down only to the
highest recommendation in the down window, and never before a full down window was observed), so a burst does
not thrash a pool whose pods take minutes to load a model. A pool with no traffic in the window is sized to
its minimum, through the same down-stabilization.

Beyond the HPA: no scale-up is stacked on one still in progress (pods not yet ready would be counted as
capacity that does nothing yet, and a model load takes minutes), and a pool that wants more than
maxReplicas says so (ScalingLimited), since its latency target is then at risk.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from inferencepool.api.v1alpha1 import Autoscaling

# Reasons (CamelCase, as in Kubernetes conditions and events).
TARGET_EXCEEDED = "TargetExceeded"
BELOW_TARGET = "BelowTarget"
WITHIN_TOLERANCE = "WithinTolerance"
NO_TRAFFIC = "NoTraffic"
WAITING_FOR_REPLICAS = "WaitingForReplicas"
STABILIZING = "Stabilizing"
OUT_OF_BOUNDS = "OutOfBounds"


@dataclass(frozen=True, slots=True)
class Decision:
    current: int  # what the pool had
    replicas: int  # what the pool should have now
    reason: str
    message: str
    wanted: int  # the unbounded recommendation (ceil(current x observed / target)); above max => limited

    def limited(self, settings: Autoscaling) -> bool:
        return self.wanted > settings.max_replicas


class Recommender:
    """One pool's decisions; remembers recent recommendations for stabilization."""

    def __init__(self) -> None:
        self._history: deque[tuple[float, int]] = deque()
        self._since: float | None = None  # first decision: scale-down waits a full window from here

    def decide(
        self,
        now: float,
        current: int,
        ready: int,
        observed_seconds: float | None,
        target_milliseconds: int,
        settings: Autoscaling,
        metric: str,
    ) -> Decision:
        """`current` is the pool's replica count (spec), `ready` its ready pods, `observed_seconds` the
        latency at the target percentile over the window (None: no traffic)."""
        low, high = settings.min_replicas, settings.max_replicas
        if self._since is None:
            self._since = now
        if current < low or current > high:
            bounded = min(max(current, low), high)
            return Decision(
                current, bounded, OUT_OF_BOUNDS, f"{current} replicas is outside {low}..{high}", bounded
            )

        target = target_milliseconds / 1000
        if observed_seconds is None:
            wanted = low
            figures = f"no {metric} observed in the last {settings.window_seconds}s"
            reason = NO_TRAFFIC
        else:
            ratio = observed_seconds / target
            figures = (
                f"p{settings.target.percentile} {metric} {observed_seconds * 1000:.0f}ms "
                f"vs target {target_milliseconds}ms over {settings.window_seconds}s"
            )
            if abs(ratio - 1) <= settings.tolerance_percent / 100:
                wanted = current
                reason = WITHIN_TOLERANCE
            else:
                wanted = max(1, math.ceil(current * ratio))
                reason = TARGET_EXCEEDED if wanted > current else BELOW_TARGET
        self._remember(now, wanted, settings)

        stable = self._stabilized(now, current, wanted, settings)
        step = min(
            max(stable, current - settings.max_scale_down_replicas), current + settings.max_scale_up_replicas
        )
        replicas = min(max(step, low), high)
        if replicas > current and ready < current:
            return Decision(
                current,
                current,
                WAITING_FOR_REPLICAS,
                f"{figures}; {ready}/{current} replicas ready, waiting for them before adding more",
                wanted,
            )
        if replicas == current:
            if wanted == current:
                kept = NO_TRAFFIC if reason == NO_TRAFFIC else WITHIN_TOLERANCE
                return Decision(current, current, kept, f"{figures}; keeping {current}", wanted)
            why = f"at maxReplicas {high}" if current == high and wanted > high else "stabilization window"
            return Decision(
                current, current, STABILIZING, f"{figures}; wants {wanted}, keeping {current} ({why})", wanted
            )
        return Decision(current, replicas, reason, f"{figures}; {current} -> {replicas} replicas", wanted)

    def _remember(self, now: float, wanted: int, settings: Autoscaling) -> None:
        self._history.append((now, wanted))
        keep = max(settings.scale_up_stabilization_seconds, settings.scale_down_stabilization_seconds)
        while self._history and self._history[0][0] < now - keep:
            self._history.popleft()

    def _stabilized(self, now: float, current: int, wanted: int, settings: Autoscaling) -> int:
        if wanted > current:
            window = [w for at, w in self._history if at >= now - settings.scale_up_stabilization_seconds]
            return max(current, min(window, default=wanted))
        if wanted < current:
            horizon = now - settings.scale_down_stabilization_seconds
            window = [w for at, w in self._history if at >= horizon]
            if self._since is not None and self._since > horizon:
                # Watching for less than the window (an operator restart, say): what the pool has now counts
                # as asked for, so a restart never shrinks a pool before a full window of evidence.
                window.append(current)
            return min(current, max(window, default=wanted))
        return current
