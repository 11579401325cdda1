"""Routing decisions through the real router, observed at the fake engines (their vLLM metrics)."""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI
from tests.http.router_harness import (
    LONG_PROMPT,
    MODEL,
    SHORT_PROMPT,
    complete,
    config_for,
    engine_requests,
    engines,
    metric_sum,
    running_router,
)

THRESHOLD = 100


async def test_length_aware_sends_short_prompts_direct_and_long_ones_through_prefill() -> None:
    async with engines(["prefill", "decode"]) as (prefill, decode):
        config = config_for([prefill], [decode], policy="LengthAware", prefillThresholdTokens=THRESHOLD)
        async with running_router(config) as router:
            status, _, headers = await complete(router.url, SHORT_PROMPT)
            assert status == 200 and headers["X-Inferencepool-Route"] == "direct"
            assert (await engine_requests(prefill), await engine_requests(decode)) == (0, 1)
            assert await metric_sum(decode.url, "vllm:external_prefix_cache_hits") == 0

            status, body, headers = await complete(router.url, LONG_PROMPT, stream=True, max_tokens=8)
            assert status == 200 and headers["X-Inferencepool-Route"] == "disaggregated"
            assert body.rstrip().endswith("data: [DONE]")
            assert (await engine_requests(prefill), await engine_requests(decode)) == (1, 2)
            # The decode pod loaded the prompt's KV from the prefill pod instead of computing it.
            assert await metric_sum(decode.url, "vllm:external_prefix_cache_hits") > 0

            assert await metric_sum(router.url, "inferencepool_router_requests", route="direct") == 1
            assert await metric_sum(router.url, "inferencepool_router_requests", route="disaggregated") == 1


@pytest.mark.parametrize(
    ("policy", "route", "prefill_requests"),
    [("AlwaysDisaggregate", "disaggregated", 2), ("Colocated", "direct", 0)],
)
async def test_policy_overrides_length(policy: str, route: str, prefill_requests: int) -> None:
    async with (
        engines(["prefill", "decode"]) as (prefill, decode),
        running_router(config_for([prefill], [decode], policy=policy)) as router,
    ):
        for prompt in (SHORT_PROMPT, LONG_PROMPT):
            status, _, headers = await complete(router.url, prompt)
            assert status == 200 and headers["X-Inferencepool-Route"] == route
        assert await engine_requests(prefill) == prefill_requests
        assert await engine_requests(decode) == 2


async def test_threshold_is_counted_in_prompt_tokens() -> None:
    """Same prompt, two thresholds either side of its length: the route flips."""
    prompt = "word " * 200  # 200 tokens for the engine's tokenizer, ~250 estimated at 4 chars/token
    async with engines(["prefill", "decode"]) as (prefill, decode):
        for threshold, route in ((1000, "direct"), (150, "disaggregated")):
            config = config_for([prefill], [decode], prefillThresholdTokens=threshold)
            async with running_router(config) as router:
                _, _, headers = await complete(router.url, prompt)
                assert headers["X-Inferencepool-Route"] == route


async def test_openai_client_streams_through_both_routes() -> None:
    async with engines(["prefill", "decode"]) as (prefill, decode):
        config = config_for([prefill], [decode], prefillThresholdTokens=THRESHOLD)
        async with running_router(config) as router:
            client = AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
            try:
                for prompt in (SHORT_PROMPT, LONG_PROMPT):
                    stream = await client.completions.create(
                        model=MODEL, prompt=prompt, max_tokens=6, stream=True
                    )
                    pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
                    assert len(pieces) == 6 and "".join(pieces).strip()

                    chat = await client.chat.completions.create(
                        model=MODEL,
                        messages=[
                            {"role": "system", "content": "be brief"},
                            {"role": "user", "content": prompt},
                        ],
                        max_tokens=5,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                    chunks = [chunk async for chunk in chat]
                    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                    assert text.strip() and chunks[-1].usage is not None
                    assert chunks[-1].usage.completion_tokens == 5
                models = await client.models.list()
                assert [m.id for m in models.data] == [MODEL]
            finally:
                await client.close()
            # two short requests went direct, two long ones through the prefill pool (seen by the engines)
            assert await engine_requests(prefill) == 2
            assert await engine_requests(decode) == 4
