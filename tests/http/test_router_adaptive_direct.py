"""The router feeds its adaptive threshold the time to first token of prompts prefilled on decode pods: with
those over the TTFT target, a lagging prefill pool no longer raises the threshold (that would send decode pods
more of what already waits there); the threshold holds, and says why."""

from __future__ import annotations

import asyncio

from tests.http.router_harness import LONG_PROMPT, SHORT_PROMPT, complete, config_for, engines, running_router


async def test_direct_prompts_over_the_ttft_target_hold_a_threshold_prefill_lag_would_raise() -> None:
    async with engines(["prefill", "decode"], profile="cpu-demo") as (prefill, decode):
        config = config_for(
            [prefill],
            [decode],
            prefillThresholdTokens=50,
            adaptiveThreshold={
                "enabled": True,
                "minTokens": 10,
                "maxTokens": 5000,
                "intervalSeconds": 1,
                "minSamples": 2,
                "stepPercent": 50,
                "ttftTargetMilliseconds": 1,  # every prefill leg and every direct first token is over this
                "itlTargetMilliseconds": 10_000,  # decode streams always have headroom
            },
        )
        async with running_router(config) as router:
            adaptive = router.router.adaptive
            for i in range(3):  # first the direct ones: a decision needs prefill legs too, so none comes yet
                status, _, headers = await complete(
                    router.url, f"{i} {SHORT_PROMPT}", stream=True, max_tokens=6
                )
                assert status == 200 and headers["X-Inferencepool-Route"] == "direct"
            assert len(adaptive.direct_ttft_samples.recent()) == 3  # one time to first token each
            for i in range(3):
                prompt = f"request {i}: {LONG_PROMPT}"
                status, _, headers = await complete(router.url, prompt, stream=True, max_tokens=6)
                assert status == 200 and headers["X-Inferencepool-Route"] == "disaggregated"
            for _ in range(40):
                if adaptive.reason.startswith("hold"):
                    break
                await asyncio.sleep(0.1)
            assert adaptive.reason.startswith("hold, both pools over target"), adaptive.reason
            assert "prompts prefilled on decode at" in adaptive.reason
            assert router.router.threshold == 50
