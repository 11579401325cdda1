"""What the router reports on /metrics, how it counts tokens, and its adaptive threshold (fake engines)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.http.router_harness import (
    LONG_PROMPT,
    SHORT_PROMPT,
    complete,
    config_for,
    engine_requests,
    engines,
    metric_sum,
    running_router,
)
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from inferencepool.router.tokens import EstimateCounter, load_counter


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tokenizer.json where every word is one token (no model files can be downloaded here)."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["word hello there"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


async def test_metrics_show_routes_tokens_pods_and_threshold() -> None:
    async with engines(["prefill", "decode"]) as (prefill, decode):
        config = config_for([prefill], [decode], prefillThresholdTokens=100)
        async with running_router(config) as router:
            await complete(router.url, SHORT_PROMPT, stream=True)
            await complete(router.url, LONG_PROMPT, stream=True)
            metric = metric_sum
            url = router.url
            assert await metric(url, "inferencepool_router_requests", route="direct") == 1
            assert await metric(url, "inferencepool_router_requests", route="disaggregated") == 1
            assert await metric(url, "inferencepool_router_prompt_tokens_count") == 2
            assert (
                await metric(url, "inferencepool_router_time_to_first_token_seconds_count", route="direct")
                == 1
            )
            assert await metric(url, "inferencepool_router_prefill_leg_seconds_count") == 1
            assert await metric(url, "inferencepool_router_prefill_threshold_tokens") == 100
            assert await metric(url, "inferencepool_router_token_counter_info", kind="estimate") == 1
            assert await metric(url, "inferencepool_router_pods", role="decode", state="serving") == 1
            assert await metric(url, "inferencepool_router_pods", role="prefill", state="serving") == 1
            assert await metric(url, "inferencepool_router_in_flight_requests") == 0


async def test_the_model_tokenizer_decides_the_route_when_configured(word_tokenizer: Path) -> None:
    prompt = "word " * 200  # 200 tokens for the word tokenizer, ~250 for a 4-characters-per-token estimate
    async with engines(["prefill", "decode"]) as (prefill, decode):
        config = config_for([prefill], [decode], prefillThresholdTokens=220, tokenizer=str(word_tokenizer))
        async with running_router(config, load_counter(config.tokenizer)) as router:
            _, _, headers = await complete(router.url, prompt)
            assert headers["X-Inferencepool-Route"] == "direct"
            assert (
                await metric_sum(router.url, "inferencepool_router_token_counter_info", kind="hf-tokenizers")
                == 1
            )
        async with running_router(config, EstimateCounter()) as router:
            _, _, headers = await complete(router.url, prompt)
            assert headers["X-Inferencepool-Route"] == "disaggregated"


async def test_estimate_calibrates_on_the_engines_tokenize() -> None:
    async with engines(["decode"]) as (decode,):
        counter = EstimateCounter()
        async with running_router(config_for([], [decode]), counter) as router:
            # The engine's tokenizer makes one token of a 4-letter word and its space: 5 characters a token.
            await complete(router.url, "word " * 400)
            for _ in range(40):
                if counter.samples:
                    break
                await asyncio.sleep(0.1)
            assert counter.samples == 1
            ratio = await metric_sum(router.url, "inferencepool_router_estimate_chars_per_token")
            assert ratio == pytest.approx(2000 / 400, rel=0.02)


async def test_adaptive_threshold_rises_while_prefill_lags_and_decode_has_headroom() -> None:
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
                "ttftTargetMilliseconds": 1,  # any real prefill leg is over this
                "itlTargetMilliseconds": 10_000,  # and decode always has headroom
            },
        )
        async with running_router(config) as router:
            for i in range(3):  # distinct prompts: a repeated one is cached on the decode pod (goes direct)
                prompt = f"request {i}: {LONG_PROMPT}"
                status, _, headers = await complete(router.url, prompt, stream=True, max_tokens=6)
                assert status == 200 and headers["X-Inferencepool-Route"] == "disaggregated"
            for _ in range(30):
                if router.router.threshold > 50:
                    break
                await asyncio.sleep(0.1)
            assert await metric_sum(router.url, "inferencepool_router_prefill_threshold_tokens") == 75
            assert await metric_sum(router.url, "inferencepool_router_threshold_changes", direction="up") == 1
            assert "raise" in router.router.threshold_reason
            assert await engine_requests(prefill) == 3
