"""The fake engine's other endpoints and its errors: vLLM's shapes and status codes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.engines import RunningEngine, running_engine

from inferencepool.engine_sim import metrics
from inferencepool.engine_sim.tokenizer import EstimateTokenizer
from inferencepool.perf.profiles import get_profile

MODEL = "fake-model"


@pytest.fixture
async def engine() -> AsyncIterator[RunningEngine]:
    async with running_engine("cpu-demo", MODEL, time_scale=0.02) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def call(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else None
    async with http.post(url, data=data, json=None if data is not None else body) as response:
        return response.status, await response.json(content_type=None)


def assert_vllm_error(payload: dict[str, Any], status: int, err_type: str, param: str | None) -> str:
    assert set(payload) == {"error"}
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["type"] == err_type and error["param"] == param
    message: str = error["message"]
    assert message
    return message


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
async def test_bad_json_is_a_400(engine: RunningEngine, http: aiohttp.ClientSession, path: str) -> None:
    status, payload = await call(http, engine.url + path, b'{"model": "fake-model", "prompt": ')
    assert status == 400
    assert "JSON decode error" in assert_vllm_error(payload, 400, "Bad Request", None)


async def test_unknown_model_is_a_404_naming_it(engine: RunningEngine, http: aiohttp.ClientSession) -> None:
    status, payload = await call(
        http, f"{engine.url}/v1/completions", {"model": "llama-9000", "prompt": "hi"}
    )
    assert status == 404
    assert (
        assert_vllm_error(payload, 404, "NotFoundError", "model") == "The model `llama-9000` does not exist."
    )


@pytest.mark.parametrize("max_tokens", [0, -3])
async def test_max_tokens_below_one(
    engine: RunningEngine, http: aiohttp.ClientSession, max_tokens: int
) -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": max_tokens}
    status, payload = await call(http, f"{engine.url}/v1/completions", body)
    assert status == 400
    message = assert_vllm_error(payload, 400, "BadRequestError", "max_tokens")
    assert f"max_tokens must be at least 1, got {max_tokens}" in message


async def test_prompt_longer_than_max_model_len(engine: RunningEngine, http: aiohttp.ClientSession) -> None:
    prompt = " ".join(["word"] * 17000)  # cpu-demo serves 16384 tokens
    status, payload = await call(http, f"{engine.url}/v1/completions", {"model": MODEL, "prompt": prompt})
    assert status == 400
    message = assert_vllm_error(payload, 400, "BadRequestError", "input_tokens")
    assert "maximum context length is 16384 tokens" in message and "17000 input tokens" in message


async def test_prompt_plus_max_tokens_longer_than_max_model_len(
    engine: RunningEngine, http: aiohttp.ClientSession
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16384}
    status, payload = await call(http, f"{engine.url}/v1/chat/completions", body)
    assert status == 400
    assert "you requested 16384 output tokens" in assert_vllm_error(
        payload, 400, "BadRequestError", "max_tokens"
    )


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": MODEL}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": {"text": "x"}}, "prompt"),
        ("/v1/chat/completions", {"model": MODEL}, "messages"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"content": "no role"}]}, "messages"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "ten"}, "max_tokens"),
        ("/v1/completions", [1, 2, 3], None),
    ],
)
async def test_malformed_requests(
    engine: RunningEngine, http: aiohttp.ClientSession, path: str, body: Any, param: str | None
) -> None:
    status, payload = await call(http, engine.url + path, body)
    assert status == 400
    assert_vllm_error(payload, 400, "Bad Request", param)


async def test_stream_options_without_stream(engine: RunningEngine, http: aiohttp.ClientSession) -> None:
    body = {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}
    status, payload = await call(http, f"{engine.url}/v1/completions", body)
    assert status == 400
    assert_vllm_error(payload, 400, "BadRequestError", "stream_options")


async def test_token_ids_as_prompt(engine: RunningEngine, http: aiohttp.ClientSession) -> None:
    status, payload = await call(
        http, f"{engine.url}/v1/completions", {"model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 2}
    )
    assert status == 200 and payload["usage"]["prompt_tokens"] == 4


async def test_tokenize(engine: RunningEngine, http: aiohttp.ClientSession) -> None:
    status, payload = await call(
        http, f"{engine.url}/tokenize", {"model": MODEL, "prompt": "Hello, wonderful world"}
    )
    assert status == 200
    expected = EstimateTokenizer().encode("Hello, wonderful world")
    assert payload["tokens"] == expected and payload["count"] == len(expected) == 8
    assert payload["max_model_len"] == 16384
    status, chat = await call(
        http,
        f"{engine.url}/tokenize",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "add_generation_prompt": True},
    )
    assert status == 200 and chat["count"] > 1
    # the completion endpoint counts the same way
    status, completion = await call(
        http,
        f"{engine.url}/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1},
    )
    assert completion["usage"]["prompt_tokens"] == chat["count"]


async def test_health_version_models(engine: RunningEngine, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{engine.url}/health") as response:
        assert response.status == 200
    async with http.get(f"{engine.url}/version") as response:
        version = await response.json()
    assert version["version"] == "0.33.0"
    assert version["fake_engine"]["profile"] == "cpu-demo"
    assert version["fake_engine"]["tokenizer"] == "estimate"
    async with http.get(f"{engine.url}/v1/models") as response:
        models = await response.json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 16384


async def scrape(http: aiohttp.ClientSession, engine: RunningEngine) -> dict[str, Any]:
    async with http.get(f"{engine.url}/metrics") as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    return {family.name: family for family in text_string_to_metric_families(text)}


async def test_metrics_parse_with_vllm_names_labels_and_buckets(
    engine: RunningEngine, http: aiohttp.ClientSession
) -> None:
    for _ in range(3):
        status, _payload = await call(
            http, f"{engine.url}/v1/completions", {"prompt": "one two three", "max_tokens": 4}
        )
        assert status == 200
    families = await scrape(http, engine)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert families[name].type == "gauge"
    # the parser strips _total from counter family names; the exposed samples keep it
    counters = (
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:external_prefix_cache_queries",
        "vllm:external_prefix_cache_hits",
        "vllm:request_success",
    )
    for name in counters:
        assert families[name].type == "counter"
        assert all(
            s.name == f"{name}_total" for s in families[name].samples if not s.name.endswith("_created")
        )
    values = {
        s.name: s.value for f in families.values() for s in f.samples if "finished_reason" not in s.labels
    }
    assert values["vllm:prompt_tokens_total"] == 3 * len(EstimateTokenizer().encode("one two three")) == 12
    assert values["vllm:generation_tokens_total"] == 12
    success = {s.labels["finished_reason"]: s.value for s in families["vllm:request_success"].samples}
    assert success["length"] == 3
    assert families["fake_engine:schedule_lag_seconds"].type == "counter"  # the fake's own, namespaced apart
    for sample in families["vllm:num_requests_running"].samples:
        assert sample.labels == {"model_name": MODEL, "engine": "0"}

    def buckets(name: str) -> list[float]:
        return [float(s.labels["le"]) for s in families[name].samples if s.name.endswith("_bucket")]

    assert buckets("vllm:time_to_first_token_seconds") == [*metrics.TTFT_BUCKETS, float("inf")]
    assert buckets("vllm:inter_token_latency_seconds") == [*metrics.ITL_BUCKETS, float("inf")]
    assert metrics.TTFT_BUCKETS[:3] == (0.001, 0.005, 0.01) and metrics.TTFT_BUCKETS[-1] == 2560.0
    assert metrics.ITL_BUCKETS[:3] == (0.01, 0.025, 0.05) and metrics.ITL_BUCKETS[-1] == 80.0
    counts = {s.name: s.value for s in families["vllm:time_to_first_token_seconds"].samples}
    assert counts["vllm:time_to_first_token_seconds_count"] == 3
    itl_counts = {s.name: s.value for s in families["vllm:inter_token_latency_seconds"].samples}
    assert itl_counts["vllm:inter_token_latency_seconds_count"] == 9  # 3 gaps per 4-token request


async def test_running_and_waiting_gauges_follow_the_load(http: aiohttp.ClientSession) -> None:
    import asyncio

    # slow motion, a one-sequence engine: a second request must wait for the first
    async with running_engine(get_profile("cpu-demo").with_overrides(max_num_seqs=1), MODEL) as slow:
        body = {"prompt": "x", "max_tokens": 40}
        first = asyncio.ensure_future(call(http, f"{slow.url}/v1/completions", body))
        second = asyncio.ensure_future(call(http, f"{slow.url}/v1/completions", body))
        await asyncio.sleep(0.3)
        families = await scrape(http, slow)
        assert families["vllm:num_requests_running"].samples[0].value == 1
        assert families["vllm:num_requests_waiting"].samples[0].value == 1
        assert families["vllm:kv_cache_usage_perc"].samples[0].value > 0
        await asyncio.gather(first, second)
        families = await scrape(http, slow)
        assert families["vllm:num_requests_running"].samples[0].value == 0
        assert families["vllm:kv_cache_usage_perc"].samples[0].value == 0


async def test_client_disconnect_aborts_the_stream(http: aiohttp.ClientSession) -> None:
    import asyncio

    async with running_engine("cpu-demo", MODEL, time_scale=1.0) as slow:
        body = {"prompt": "go on and on", "max_tokens": 1000, "stream": True}
        async with http.post(f"{slow.url}/v1/completions", json=body) as response:
            await response.content.readline()
            response.close()
        for _ in range(50):
            families = await scrape(http, slow)
            if families["vllm:num_requests_running"].samples[0].value == 0:
                break
            await asyncio.sleep(0.05)
        assert families["vllm:num_requests_running"].samples[0].value == 0
        assert families["vllm:kv_cache_usage_perc"].samples[0].value == 0
        success = {s.labels["finished_reason"]: s.value for s in families["vllm:request_success"].samples}
        assert success["abort"] == 1
