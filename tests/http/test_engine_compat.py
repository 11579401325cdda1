"""A decode engine refuses KV from an incompatible prefill engine as vLLM's NIXL handshake does: the
compatibility hash is compared before any block is read, the error is vLLM's, the request fails its KV load
(kv_load_failure_policy "fail") and vllm:nixl_num_failed_transfers counts it. The fake hashes the model
revision too, so that a request paired across revisions fails visibly (engine_sim/nixl_compat.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from tests.http.test_engine_handshake import metric, post, prefill_leg
from tests.support.engines import RunningEngine, running_engine

MODEL = "fake-model"
PROMPT = " ".join(f"w{i % 97}" for i in range(600))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def transfer(
    http: aiohttp.ClientSession, prefill: RunningEngine, decode: RunningEngine, rid: str
) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4}
    prefilled = await post(http, f"{prefill.url}/v1/completions", prefill_leg(body), rid)
    assert prefilled["_status"] == 200
    decode_body = {**body, "kv_transfer_params": prefilled["kv_transfer_params"]}
    return await post(http, f"{decode.url}/v1/completions", decode_body, rid)


async def test_engines_of_one_revision_hand_kv_over(http: aiohttp.ClientSession) -> None:
    async with (
        running_engine("zero", MODEL, nixl=True, revision="r1") as prefill,
        running_engine("zero", MODEL, nixl=True, revision="r1") as decode,
    ):
        answer = await transfer(http, prefill, decode, "same")
        assert answer["_status"] == 200, answer
        assert await metric(http, decode, "vllm:nixl_num_failed_transfers_total") == 0


@pytest.mark.parametrize(
    ("prefill_settings", "decode_settings"),
    [
        ({"revision": "r1"}, {"revision": "r2"}),
        ({"kv_cache_dtype": "fp8"}, {}),
        ({"dtype": "float16"}, {"dtype": "bfloat16"}),
    ],
)
async def test_an_incompatible_prefill_engine_is_refused_at_the_handshake(
    http: aiohttp.ClientSession, prefill_settings: dict[str, Any], decode_settings: dict[str, Any]
) -> None:
    async with (
        running_engine("zero", MODEL, nixl=True, **prefill_settings) as prefill,
        running_engine("zero", MODEL, nixl=True, **decode_settings) as decode,
    ):
        answer = await transfer(http, prefill, decode, "crossed")
        assert answer["_status"] >= 400 or answer.get("choices", [{}])[0].get("finish_reason") == "error", (
            answer
        )
        assert "NIXL compatibility hash mismatch" in str(answer), answer
        assert await metric(http, decode, "vllm:nixl_num_failed_transfers_total") >= 1
        # the prefill engine still holds the blocks: nothing was read from it
        assert await metric(http, prefill, "vllm:kv_cache_usage_perc") > 0


async def test_the_check_can_be_switched_off_as_in_vllm(http: aiohttp.ClientSession) -> None:
    async with (
        running_engine("zero", MODEL, nixl=True, revision="r1") as prefill,
        running_engine("zero", MODEL, nixl=True, revision="r2", enforce_handshake_compat=False) as decode,
    ):
        answer = await transfer(http, prefill, decode, "allowed")
        assert answer["_status"] == 200, answer
