"""vllm:request_time_per_output_token_seconds: each finished request's mean time per output token, as
vLLM 0.33 computes (decode time over the tokens after the first) and buckets it (the ITL buckets)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.engines import running_engine

from inferencepool.engine_sim import metrics

MODEL = "fake-model"
TPOT = "vllm:request_time_per_output_token_seconds"
ITL = "vllm:inter_token_latency_seconds"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def test_request_tpot_is_decode_time_over_the_tokens_after_the_first() -> None:
    assert metrics.request_tpot(10.0, 10.9, 10) == pytest.approx(0.1)  # 9 gaps in 0.9 s
    assert metrics.request_tpot(10.0, 10.0, 1) == 0.0  # one token: vLLM observes 0
    assert metrics.TPOT_BUCKETS == metrics.ITL_BUCKETS  # loggers.py: buckets=inter_token_latency_buckets


async def test_one_request_exports_its_mean_gap(http: aiohttp.ClientSession) -> None:
    async with running_engine("cpu-demo", MODEL, time_scale=0.02) as engine:
        body = {"prompt": "one two three", "max_tokens": 6}
        async with http.post(f"{engine.url}/v1/completions", json=body) as response:
            assert response.status == 200
        async with http.get(f"{engine.url}/metrics") as response:
            families = {f.name: f for f in text_string_to_metric_families(await response.text())}
    tpot = {s.name: s for s in families[TPOT].samples}
    itl = {s.name: s.value for s in families[ITL].samples}
    assert tpot[f"{TPOT}_count"].value == 1  # one observation per finished request, not per token
    assert tpot[f"{TPOT}_count"].labels == {"model_name": MODEL, "engine": "0"}
    # the request's gaps telescope: its mean is the first-to-last span over the 5 tokens after the first
    assert itl[f"{ITL}_count"] == 5
    assert tpot[f"{TPOT}_sum"].value == pytest.approx(itl[f"{ITL}_sum"] / 5)
    assert tpot[f"{TPOT}_sum"].value > 0
    buckets = [float(s.labels["le"]) for s in families[TPOT].samples if s.name.endswith("_bucket")]
    assert buckets == [*metrics.ITL_BUCKETS, float("inf")]
