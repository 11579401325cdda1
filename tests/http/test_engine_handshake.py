"""Two fake engines complete vLLM's NIXL prefill->decode handshake, driven as vLLM's own proxy drives it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.engines import RunningEngine, running_engine

from inferencepool.perf import timing
from inferencepool.perf.profiles import get_profile

MODEL = "fake-model"
PROFILE = "llama-3.1-8b-h100"
# 6000 words of 1-4 characters: 6000 prompt tokens with the estimate tokenizer
LONG_PROMPT = " ".join(f"w{i % 997}" for i in range(6000))
OTHER_PROMPT = " ".join(f"v{i % 997}" for i in range(6000))
PROMPT_TOKENS = 6000
# slow motion: modelled times twice as long as the profile's, so they dominate scheduling noise on a busy CPU
TIME_SCALE = 2.0


@pytest.fixture
async def pair() -> AsyncIterator[tuple[RunningEngine, RunningEngine]]:
    async with (
        running_engine(PROFILE, MODEL, nixl=True, kv_lease_s=30.0, time_scale=TIME_SCALE) as prefill,
        running_engine(PROFILE, MODEL, nixl=True, time_scale=TIME_SCALE) as decode,
    ):
        yield prefill, decode


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def prefill_leg(body: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's proxy sends the prefill pod (docs/engine-contract.md, section 3, handshake)."""
    leg = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "min_tokens")}
    leg.update(max_tokens=1, stream=False)
    leg["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return leg


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], request_id: str
) -> dict[str, Any]:
    async with http.post(url, json=body, headers={"X-Request-Id": request_id}) as response:
        payload: dict[str, Any] = await response.json()
        payload["_status"] = response.status
        return payload


async def stream_ttft(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], request_id: str
) -> tuple[float, str]:
    """Seconds to the first content chunk of a streamed completion, and the whole streamed text."""
    started = time.monotonic()
    first: float | None = None
    text = []
    async with http.post(url, json=body, headers={"X-Request-Id": request_id}) as response:
        assert response.status == 200
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk["choices"] and chunk["choices"][0]["text"]:
                first = first if first is not None else time.monotonic() - started
                text.append(chunk["choices"][0]["text"])
    assert first is not None
    return first, "".join(text)


async def metric(http: aiohttp.ClientSession, engine: RunningEngine, name: str) -> float:
    async with http.get(f"{engine.url}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not exported")


async def test_prefill_then_decode_with_the_transfer_instead_of_the_prefill(
    pair: tuple[RunningEngine, RunningEngine], http: aiohttp.ClientSession
) -> None:
    prefill, decode = pair
    client_body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 8, "stream": True}

    # colocated baseline on the decode engine: it prefills 6000 tokens itself (another prompt: no cache hits)
    colocated_ttft, _ = await stream_ttft(
        http, f"{decode.url}/v1/completions", {**client_body, "prompt": OTHER_PROMPT}, "baseline"
    )

    prefilled = await post(http, f"{prefill.url}/v1/completions", prefill_leg(client_body), "req-1")
    assert prefilled["_status"] == 200
    params = prefilled["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine_id"] == prefill.engine_id
    assert params["remote_host"] == "127.0.0.1"
    assert params["remote_port"] == prefill.engine.side_channel_port != prefill.engine.port
    assert params["remote_request_id"] == "cmpl-req-1"
    assert params["tp_size"] == 1
    assert sum(len(group) for group in params["remote_block_ids"]) == PROMPT_TOKENS // 16
    assert prefilled["usage"]["completion_tokens"] == 1
    assert await metric(http, prefill, "vllm:kv_cache_usage_perc") > 0  # blocks held for the decode engine

    decode_body = {**client_body, "kv_transfer_params": params}
    decode_ttft, text = await stream_ttft(http, f"{decode.url}/v1/completions", decode_body, "req-1")
    assert len(text.split()) == 8

    profile = get_profile(PROFILE)
    transfer = timing.nixl_transfer_time(profile, PROMPT_TOKENS)
    prefill_time = timing.ideal_prefill_time(profile, PROMPT_TOKENS)
    assert prefill_time > 4 * transfer  # the premise: this prompt is far cheaper to move than to compute
    assert decode_ttft >= transfer * TIME_SCALE
    assert decode_ttft < colocated_ttft / 2
    # the decode engine loaded every prompt token through the connector; the prefill engine released its
    # blocks
    assert await metric(http, decode, "vllm:external_prefix_cache_hits_total") == PROMPT_TOKENS
    assert await metric(http, prefill, "vllm:kv_cache_usage_perc") == 0.0

    # the lease is consumed: a second decode leg with the same params fails as vLLM does (policy "fail")
    again = await post(http, f"{decode.url}/v1/completions", {**decode_body, "stream": False}, "req-1b")
    assert again["_status"] == 500
    assert "cmpl-req-1" in again["error"]["message"] and "lease" in again["error"]["message"]


async def test_the_decode_engine_records_the_read_as_vllms_nixl_metrics(
    pair: tuple[RunningEngine, RunningEngine], http: aiohttp.ClientSession
) -> None:
    prefill, decode = pair
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 2}
    prefilled = await post(http, f"{prefill.url}/v1/completions", prefill_leg(body), "m-1")
    decoded = await post(
        http,
        f"{decode.url}/v1/completions",
        {**body, "kv_transfer_params": prefilled["kv_transfer_params"]},
        "m",
    )
    assert decoded["_status"] == 200
    profile = get_profile(PROFILE)
    assert await metric(http, decode, "vllm:nixl_xfer_time_seconds_count") == 1
    assert await metric(http, decode, "vllm:nixl_xfer_time_seconds_sum") == pytest.approx(
        timing.nixl_transfer_time(profile, PROMPT_TOKENS) * TIME_SCALE
    )
    assert await metric(http, decode, "vllm:nixl_bytes_transferred_sum") == (
        PROMPT_TOKENS * profile.model.kv_bytes_per_token
    )
    assert await metric(http, decode, "vllm:nixl_num_failed_transfers_total") == 0
    # the prefill engine served the read; it transferred nothing itself and its lease did not expire
    assert await metric(http, prefill, "vllm:nixl_bytes_transferred_count") == 0
    assert await metric(http, prefill, "vllm:nixl_num_kv_expired_reqs_total") == 0


async def test_a_reused_request_id_does_not_clash_with_held_kv(
    pair: tuple[RunningEngine, RunningEngine], http: aiohttp.ClientSession
) -> None:
    prefill, _ = pair
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 3}
    first = await post(http, f"{prefill.url}/v1/completions", prefill_leg(body), "same-id")
    second = await post(http, f"{prefill.url}/v1/completions", prefill_leg(body), "same-id")
    assert first["_status"] == second["_status"] == 200
    ids = {
        first["kv_transfer_params"]["remote_request_id"],
        second["kv_transfer_params"]["remote_request_id"],
    }
    assert len(ids) == 2 and prefill.engine.core.num_held == 2


async def test_chat_handshake(pair: tuple[RunningEngine, RunningEngine], http: aiohttp.ClientSession) -> None:
    prefill, decode = pair
    body = {"model": MODEL, "messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 5}
    prefilled = await post(http, f"{prefill.url}/v1/chat/completions", prefill_leg(body), "chat-1")
    assert prefilled["kv_transfer_params"]["remote_request_id"] == "chatcmpl-chat-1"
    decoded = await post(
        http,
        f"{decode.url}/v1/chat/completions",
        {**body, "kv_transfer_params": prefilled["kv_transfer_params"]},
        "c",
    )
    assert decoded["_status"] == 200
    assert decoded["usage"]["completion_tokens"] == 5
    assert decoded["kv_transfer_params"] is None


async def test_expired_lease_fails_the_decode_leg(http: aiohttp.ClientSession) -> None:
    async with (
        running_engine("cpu-demo", MODEL, nixl=True, kv_lease_s=0.05) as prefill,
        running_engine("cpu-demo", MODEL, nixl=True) as decode,
    ):
        body = {"model": MODEL, "prompt": "a short prompt", "max_tokens": 3}
        prefilled = await post(http, f"{prefill.url}/v1/completions", prefill_leg(body), "late")
        await asyncio.sleep(0.2)
        failed = await post(
            http,
            f"{decode.url}/v1/completions",
            {**body, "kv_transfer_params": prefilled["kv_transfer_params"]},
            "x",
        )
        assert failed["_status"] == 500
        assert failed["error"]["type"] == "InternalServerError"
        assert "lease expired" in failed["error"]["message"]
        assert await metric(http, prefill, "vllm:kv_cache_usage_perc") == 0.0
        assert await metric(http, prefill, "vllm:nixl_num_kv_expired_reqs_total") == 1
        assert await metric(http, decode, "vllm:nixl_num_failed_transfers_total") == 1
        assert await metric(http, decode, "vllm:nixl_xfer_time_seconds_count") == 0


async def test_unknown_engine_fails_the_decode_leg(
    pair: tuple[RunningEngine, RunningEngine], http: aiohttp.ClientSession
) -> None:
    prefill, decode = pair
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 3}
    prefilled = await post(http, f"{prefill.url}/v1/completions", prefill_leg(body), "r")
    wrong = {**prefilled["kv_transfer_params"], "remote_engine_id": "not-an-engine"}
    failed = await post(http, f"{decode.url}/v1/completions", {**body, "kv_transfer_params": wrong}, "r2")
    assert failed["_status"] == 500
    assert "not-an-engine" in failed["error"]["message"]


async def test_unreachable_prefill_engine_fails_the_streamed_decode_leg(
    pair: tuple[RunningEngine, RunningEngine], http: aiohttp.ClientSession
) -> None:
    _, decode = pair
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "gone",
        "remote_request_id": "cmpl-x",
        "remote_block_ids": [[1, 2]],
        "remote_host": "127.0.0.1",
        "remote_port": 9,  # discard port: nothing listens
        "tp_size": 1,
    }
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 3, "stream": True, "kv_transfer_params": params}
    async with http.post(f"{decode.url}/v1/completions", json=body) as response:
        assert response.status == 200  # as vLLM: the stream has started before the transfer fails
        events = [line.decode().strip() async for line in response.content if line.strip()]
    error = json.loads(events[0][len("data: ") :])["error"]
    assert error["code"] == 500 and "cannot reach its NIXL side channel" in error["message"]
    assert events[-1] == "data: [DONE]"
    assert await metric(http, decode, "vllm:nixl_num_failed_transfers_total") == 1


async def test_incomplete_params_are_ignored_and_the_prompt_is_prefilled_locally(
    pair: tuple[RunningEngine, RunningEngine], http: aiohttp.ClientSession
) -> None:
    _, decode = pair
    body = {
        "model": MODEL,
        "prompt": "hello",
        "max_tokens": 2,
        "kv_transfer_params": {"do_remote_prefill": True},
    }
    result = await post(http, f"{decode.url}/v1/completions", body, "partial")
    assert result["_status"] == 200 and result["usage"]["completion_tokens"] == 2
