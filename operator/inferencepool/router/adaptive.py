"""The adaptive-threshold loop: every interval, the pure decision in threshold.py moves the LengthAware
threshold from the router-observed prefill-leg latencies, decode inter-token gaps (their tail) and the time to
first token of prompts prefilled on decode pods."""

from __future__ import annotations

import asyncio
import logging

from inferencepool.router.config import RouterConfig
from inferencepool.router.metrics import RouterMetrics
from inferencepool.router.threshold import SampleWindow, adapt

log = logging.getLogger("inferencepool.router")


class AdaptiveThreshold:
    """The threshold in force and why; `run` adapts it (only when the config enables adaptation)."""

    def __init__(self, config: RouterConfig, metrics: RouterMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.threshold = config.prefill_threshold_tokens
        self.reason = "configured"
        self.enabled = config.adaptive_threshold.enabled and config.policy == "LengthAware"
        self.prefill_samples = SampleWindow()
        self.itl_samples = SampleWindow()
        self.direct_ttft_samples = SampleWindow()

    async def run(self) -> None:
        settings = self.config.adaptive_threshold
        while True:
            await asyncio.sleep(settings.interval_seconds)
            self.step()

    def step(self) -> None:
        """One interval's decision."""
        decision = adapt(
            self.threshold,
            self.config.prefill_threshold_tokens,
            self.config.adaptive_threshold,
            self.prefill_samples,
            self.itl_samples,
            self.direct_ttft_samples,
        )
        if decision.threshold != self.threshold:
            direction = "up" if decision.threshold > self.threshold else "down"
            self.metrics.threshold_changes.labels(direction).inc()
            log.info("prefill threshold %d -> %d (%s)", self.threshold, decision.threshold, decision.reason)
        self.threshold, self.reason = decision.threshold, decision.reason
