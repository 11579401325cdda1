"""A prefill pod's KV goes only to a decode pod that can load it: through the real router and fake engines, a
long prompt whose decode pod carries another KV-compatibility label than every prefill pod is served on the
decode pod, counted under its own reason; once the labels match it is disaggregated."""

from __future__ import annotations

from typing import Any

import pytest
from tests.http.router_harness import (
    LONG_PROMPT,
    complete,
    config_for,
    engine_requests,
    engines,
    metric_sum,
    running_router,
)

from inferencepool.router.pods import PodSpec

ROUTE = "X-Inferencepool-Route"
DECISIONS = "inferencepool_router_disaggregation_decisions"
FALLBACKS = "inferencepool_router_fallbacks"


async def test_a_decode_pod_of_another_kv_layout_prefills_the_prompt_itself() -> None:
    async with engines(["prefill", "decode"]) as (prefill, decode):
        config = config_for([prefill], [decode], prefillThresholdTokens=100)
        async with running_router(config) as router:
            pods = router.router.pods

            def label(prefill_compat: str, decode_compat: str) -> None:
                pods.apply(
                    [
                        PodSpec("prefill-0", prefill.url, "prefill", kv_compat=prefill_compat),
                        PodSpec("decode-0", decode.url, "decode", kv_compat=decode_compat),
                    ]
                )

            label("tp1-bf16", "tp2-bf16")
            status, body, headers = await complete(router.url, LONG_PROMPT)
            assert status == 200, body
            assert headers[ROUTE] == "fallback"
            assert await engine_requests(prefill) == 0 and await engine_requests(decode) == 1
            assert await metric_sum(router.url, DECISIONS, reason="kv_incompatible") == 1
            assert await metric_sum(router.url, FALLBACKS, reason="kv_incompatible") == 1
            label("tp2-bf16", "tp2-bf16")
            status, body, headers = await complete(router.url, "another document, not cached " * 60)
            assert status == 200, body
            assert headers[ROUTE] == "disaggregated"
            assert await engine_requests(prefill) == 1


async def test_a_prompt_whose_revision_lost_its_decode_pods_during_the_prefill_leg_is_served_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rollout retires the last decode pod of the prefill pod's revision while the prefill leg runs: the KV
    has nowhere to go, so the prompt is served whole on a decode pod of the new revision, not failed with a
    503 (the CI failure of the rollout test under load)."""
    async with engines(["prefill", "decode", "decode"]) as (prefill, old, new):
        config = config_for([prefill], [old], prefillThresholdTokens=100, policy="AlwaysDisaggregate")
        async with running_router(config) as router:
            pods = router.router.pods
            prefill_0 = PodSpec("prefill-0", prefill.url, "prefill", kv_compat="r1")
            pods.apply([prefill_0, PodSpec("decode-0", old.url, "decode", kv_compat="r1")])
            orchestrator = router.router._orchestrator
            assert orchestrator is not None
            prefill_leg = orchestrator.transfer.prefill

            async def retired_during_the_leg(request: Any) -> Any:
                handoff = await prefill_leg(request)
                pods.apply(
                    [
                        prefill_0,
                        PodSpec("decode-0", old.url, "decode", terminating=True, kv_compat="r1"),
                        PodSpec("decode-1", new.url, "decode", kv_compat="r2"),
                    ]
                )
                return handoff

            monkeypatch.setattr(orchestrator.transfer, "prefill", retired_during_the_leg)
            status, body, headers = await complete(router.url, LONG_PROMPT)
            assert status == 200, body
            assert headers[ROUTE] == "fallback"
            assert await engine_requests(prefill) == 1
            assert await engine_requests(old) == 0 and await engine_requests(new) == 1
            assert await metric_sum(router.url, FALLBACKS, reason="decode_leg_failed") == 1
