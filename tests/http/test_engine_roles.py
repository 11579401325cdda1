"""Every engine takes every phase, whatever its NIXL kv_role, as vLLM 0.33 does (docs/engine-contract.md
section 3, "Roles and lent work"): NixlConnector acts on each request's `kv_transfer_params` alone. The
engines are built from the flags the operator generates (`--kv-transfer-config` with kv_producer on prefill
pods, kv_consumer on decode pods), so a fake that gated a phase on the role would fail here."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from tests.http.test_engine_handshake import metric, post, prefill_leg
from tests.support.engines import RunningEngine

from inferencepool.cli import build_parser
from inferencepool.engine_sim.cli import build_config
from inferencepool.engine_sim.server import FakeEngine

MODEL = "fake-model"
PROMPT = " ".join(f"r{i % 997}" for i in range(2000))  # 2000 prompt tokens with the estimate tokenizer
PROMPT_TOKENS = 2000


@contextlib.asynccontextmanager
async def engine_with_role(kv_role: str) -> AsyncIterator[RunningEngine]:
    nixl = {"kv_connector": "NixlConnector", "kv_role": kv_role, "kv_load_failure_policy": "fail"}
    argv = ["fake-engine", MODEL, "--host", "127.0.0.1", "--port", "0", "--nixl-side-channel-port", "0"]
    argv += ["--kv-transfer-config", json.dumps(nixl), "--profile", "zero", "--time-scale", "0.01"]
    config = build_config(build_parser("fake-engine").parse_args(argv), {})
    engine = FakeEngine(config)
    await engine.start()
    try:
        yield RunningEngine(engine)
    finally:
        await engine.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


BODY: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4}


@pytest.mark.parametrize("kv_role", ["kv_producer", "kv_consumer"])
async def test_a_request_without_kv_transfer_params_is_served_whole(
    kv_role: str, http: aiohttp.ClientSession
) -> None:
    """A producer lent a request prefills and decodes it itself (`get_num_new_matched_tokens` loads only for
    do_remote_prefill, `request_finished` keeps nothing without params): the lent-to-prefill route."""
    async with engine_with_role(kv_role) as engine:
        answer = await post(http, f"{engine.url}/v1/completions", BODY, "whole")
        assert answer["_status"] == 200
        assert answer["usage"]["prompt_tokens"] == PROMPT_TOKENS
        assert answer["usage"]["completion_tokens"] == 4
        assert answer.get("kv_transfer_params") is None
        assert await metric(http, engine, "vllm:external_prefix_cache_hits_total") == 0
        assert await metric(http, engine, "vllm:kv_cache_usage_perc") == 0.0  # nothing held for anyone


@pytest.mark.parametrize(
    ("source_role", "target_role"),
    [
        ("kv_producer", "kv_consumer"),  # the ordinary hand-off
        ("kv_consumer", "kv_consumer"),  # a decode pod prefills for another decode pod (lent prefill)
        ("kv_producer", "kv_producer"),  # a producer asked to load remote KV: vLLM serves it (see the doc)
    ],
)
async def test_any_role_prefills_for_a_remote_decode_and_any_role_loads_it(
    source_role: str, target_role: str, http: aiohttp.ClientSession
) -> None:
    async with engine_with_role(source_role) as source, engine_with_role(target_role) as target:
        prefilled = await post(http, f"{source.url}/v1/completions", prefill_leg(BODY), "lend-1")
        assert prefilled["_status"] == 200
        params = prefilled["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["remote_engine_id"] == source.engine_id
        assert prefilled["usage"]["completion_tokens"] == 1  # truncated to the prefill (on_new_request)
        assert await metric(http, source, "vllm:kv_cache_usage_perc") > 0  # held for the reader

        decoded = await post(
            http, f"{target.url}/v1/completions", {**BODY, "kv_transfer_params": params}, "lend-1"
        )
        assert decoded["_status"] == 200
        assert decoded["usage"]["completion_tokens"] == 4
        assert await metric(http, target, "vllm:external_prefix_cache_hits_total") == PROMPT_TOKENS
        assert await metric(http, source, "vllm:kv_cache_usage_perc") == 0.0  # released after the read
