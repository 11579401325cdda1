"""LMCache PD mode between two fake engines, with the router's notification listener as the proxy.

The prefill engine (kv_producer, pd_role sender) pushes a disagg_spec request's KV to the decode engine
(kv_consumer, pd_role receiver) and notifies a real ZMQ PULL socket once per TP rank; the decode engine then
loads the prompt from its PD buffer instead of prefilling it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.engines import RunningEngine, running_engine

from inferencepool.engine_sim.core import LmcacheSettings
from inferencepool.engine_sim.server import PdConfig
from inferencepool.router.lmcache_pd import PDNotifications

MODEL = "fake-model"
PROFILE = "llama-3.1-8b-h100"
CHUNK = 256
PROMPT = " ".join(f"p{i % 997}" for i in range(3000))  # 3000 tokens: 11 whole chunks before the last token
OTHER = " ".join(f"q{i % 997}" for i in range(3000))
PUSHED_TOKENS = 11 * CHUNK
TIME_SCALE = 2.0  # modelled times twice the profile's, so they dominate scheduling noise


def lmcache(role: str, buffer_chunks: int = 1000) -> LmcacheSettings:
    """As the operator configures LMCache PD (the decode engine skips the last token in its lookups)."""
    return LmcacheSettings(
        cpu_capacity_chunks=0,
        load=role == "receiver",
        save=role == "sender",
        pd_role=role,
        pd_buffer_chunks=buffer_chunks if role == "receiver" else 0,
        skip_last_n_tokens=1 if role == "receiver" else 0,
    )


async def start_pair(
    stack: AsyncExitStack,
    proxy_port: int,
    tp: int = 1,
    buffer_chunks: int = 1000,
    allocation_timeout_s: float = math.inf,
    prefix_caching: bool = True,
) -> tuple[RunningEngine, RunningEngine]:
    profile = PROFILE if tp == 1 else "llama-3.1-70b-h100-tp4"
    receiver = PdConfig(
        role="receiver",
        peer_host="127.0.0.1",
        init_ports=(0,) * tp,
        alloc_ports=(0,) * tp,
        allocation_timeout_s=allocation_timeout_s,
    )
    decode = await stack.enter_async_context(
        running_engine(
            profile,
            MODEL,
            time_scale=TIME_SCALE,
            chunk_tokens=CHUNK,
            lmcache=lmcache("receiver", buffer_chunks),
            pd=receiver,
            prefix_caching=prefix_caching,
        )
    )
    prefill = await stack.enter_async_context(
        running_engine(
            profile,
            MODEL,
            time_scale=TIME_SCALE,
            chunk_tokens=CHUNK,
            lmcache=lmcache("sender"),
            pd=PdConfig(role="sender", proxy_host="127.0.0.1", proxy_port=proxy_port),
        )
    )
    return prefill, decode


@pytest.fixture
async def notifications() -> AsyncIterator[PDNotifications]:
    listener = PDNotifications()
    await listener.start("127.0.0.1", 0)
    try:
        yield listener
    finally:
        await listener.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def metric(http: aiohttp.ClientSession, engine: RunningEngine, name: str) -> float:
    async with http.get(f"{engine.url}/metrics") as response:
        text = await response.text()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
    assert samples, f"{name} not exported"
    return float(samples[0].value)


def prefill_leg(prompt: str | list[int], req_id: str, decode: RunningEngine) -> dict[str, Any]:
    """What LMCache's disagg proxy sends the prefill engine (docs/engine-contract.md, "LMCache PD mode")."""
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {
            "ret_first_tok": True,
            "disagg_spec": {
                "req_id": req_id,
                "receiver_host": "127.0.0.1",
                "receiver_init_port": decode.engine.pd_init_ports,
                "receiver_alloc_port": decode.engine.pd_alloc_ports,
            },
        },
    }


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, json=body) as response:
        payload: dict[str, Any] = await response.json()
        payload["_status"] = response.status
        return payload


async def stream_ttft(http: aiohttp.ClientSession, url: str, prompt: str) -> float:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "stream": True}
    started = time.monotonic()
    first: float | None = None
    async with http.post(url, json=body) as response:
        assert response.status == 200
        async for raw in response.content:
            if first is None and raw.startswith(b"data: {"):
                first = time.monotonic() - started
    assert first is not None
    return first


async def test_pushed_prompt_is_loaded_not_prefilled(
    notifications: PDNotifications, http: aiohttp.ClientSession
) -> None:
    async with AsyncExitStack() as stack:
        prefill, decode = await start_pair(stack, notifications.port or 0)
        cold_ttft = await stream_ttft(http, f"{decode.url}/v1/completions", OTHER)

        waiter = notifications.expect("pd-1")
        answer = await post(http, f"{prefill.url}/v1/completions", prefill_leg(PROMPT, "pd-1", decode))
        assert answer["_status"] == 200 and answer["usage"]["completion_tokens"] == 1
        first_tok = answer["kv_transfer_params"]["first_tok"]
        assert isinstance(first_tok, int)
        await asyncio.wait_for(waiter, 5.0)
        assert await metric(http, prefill, "fake_engine:lmcache_pd_pushes_total") == 1

        hits_before = await metric(http, decode, "vllm:external_prefix_cache_hits_total")
        decode_ttft = await stream_ttft(http, f"{decode.url}/v1/completions", PROMPT)
        hits = await metric(http, decode, "vllm:external_prefix_cache_hits_total") - hits_before
        assert hits == PUSHED_TOKENS
        assert await metric(http, decode, "fake_engine:lmcache_pd_loaded_tokens_total") == PUSHED_TOKENS
        assert decode_ttft < cold_ttft / 2, (decode_ttft, cold_ttft)
        # a loaded chunk leaves the PD buffer; the pushed partial last chunk was never looked up (the decode
        # leg had the original prompt and skip_last_n_tokens 1), so it stays: LMCache never evicts it
        assert len(decode.engine.core.pd_buffer or ()) == 1
        # the producer never loads from LMCache, the consumer never saves to it
        assert await metric(http, prefill, "vllm:external_prefix_cache_hits_total") == 0


async def test_without_disagg_spec_nothing_is_pushed(
    notifications: PDNotifications, http: aiohttp.ClientSession
) -> None:
    async with AsyncExitStack() as stack:
        prefill, decode = await start_pair(stack, notifications.port or 0)
        body = {
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": 1,
            "kv_transfer_params": {"ret_first_tok": True},
        }
        answer = await post(http, f"{prefill.url}/v1/completions", body)
        assert answer["_status"] == 200 and "first_tok" in answer["kv_transfer_params"]
        plain = await post(http, f"{prefill.url}/v1/completions", {"model": MODEL, "prompt": OTHER})
        assert plain["_status"] == 200 and plain["kv_transfer_params"] is None
        await asyncio.sleep(0.3)
        assert notifications.stats.received == 0
        assert len(decode.engine.core.pd_buffer or ()) == 0


async def test_dead_receiver_gives_no_notification(
    notifications: PDNotifications, http: aiohttp.ClientSession
) -> None:
    async with AsyncExitStack() as stack:
        prefill, decode = await start_pair(stack, notifications.port or 0)
        body = prefill_leg(PROMPT, "pd-dead", decode)
        await decode.engine.stop()  # its PD ports close
        waiter = notifications.expect("pd-dead")
        answer = await post(http, f"{prefill.url}/v1/completions", body)
        assert answer["_status"] == 200  # the prefill leg itself is served
        for _ in range(100):
            if await metric(http, prefill, "fake_engine:lmcache_pd_push_failures_total") == 1:
                break
            await asyncio.sleep(0.02)
        assert await metric(http, prefill, "fake_engine:lmcache_pd_push_failures_total") == 1
        assert not waiter.done()
        assert notifications.stats.received == 0
        # the engine keeps serving
        again = await post(http, f"{prefill.url}/v1/completions", {"model": MODEL, "prompt": "still alive"})
        assert again["_status"] == 200


async def test_full_pd_buffer_refuses_the_push(
    notifications: PDNotifications, http: aiohttp.ClientSession
) -> None:
    async with AsyncExitStack() as stack:
        prefill, decode = await start_pair(stack, notifications.port or 0, buffer_chunks=5)
        waiter = notifications.expect("pd-big")
        answer = await post(http, f"{prefill.url}/v1/completions", prefill_leg(PROMPT, "pd-big", decode))
        assert answer["_status"] == 200
        for _ in range(100):
            if await metric(http, decode, "fake_engine:lmcache_pd_rejected_chunks_total") > 0:
                break
            await asyncio.sleep(0.02)
        # 11 whole chunks and the partial tail, more than the buffer can ever hold: refused at once
        assert await metric(http, decode, "fake_engine:lmcache_pd_rejected_chunks_total") == 12
        assert await metric(http, prefill, "fake_engine:lmcache_pd_push_failures_total") == 1
        assert not waiter.done()


async def test_one_notification_per_tensor_parallel_rank(
    notifications: PDNotifications, http: aiohttp.ClientSession
) -> None:
    async with AsyncExitStack() as stack:
        prefill, decode = await start_pair(stack, notifications.port or 0, tp=4)
        assert len(decode.engine.pd_init_ports) == len(set(decode.engine.pd_alloc_ports)) == 4
        waiter = notifications.expect("pd-tp", ranks=4)
        answer = await post(http, f"{prefill.url}/v1/completions", prefill_leg(PROMPT, "pd-tp", decode))
        assert answer["_status"] == 200
        await asyncio.wait_for(waiter, 5.0)
        assert notifications.stats.received == 4
        hits_before = await metric(http, decode, "vllm:external_prefix_cache_hits_total")
        await stream_ttft(http, f"{decode.url}/v1/completions", PROMPT)
        hits = await metric(http, decode, "vllm:external_prefix_cache_hits_total") - hits_before
        assert hits == PUSHED_TOKENS


async def test_disagg_spec_needs_a_port_per_rank(
    notifications: PDNotifications, http: aiohttp.ClientSession
) -> None:
    async with AsyncExitStack() as stack:
        prefill, decode = await start_pair(stack, notifications.port or 0, tp=4)
        body = prefill_leg(PROMPT, "pd-short", decode)
        body["kv_transfer_params"]["disagg_spec"]["receiver_alloc_port"] = [7400]
        answer = await post(http, f"{prefill.url}/v1/completions", body)
        assert answer["_status"] == 400
        assert "one receiver_init_port and receiver_alloc_port per TP rank (4)" in answer["error"]["message"]
        body["kv_transfer_params"]["disagg_spec"]["receiver_alloc_port"] = 7400
        answer = await post(http, f"{prefill.url}/v1/completions", body)
        assert answer["_status"] == 400
        assert answer["error"]["param"] == "kv_transfer_params.disagg_spec.receiver_alloc_port"


async def tokenize(http: aiohttp.ClientSession, engine: RunningEngine, prompt: str) -> list[int]:
    async with http.post(f"{engine.url}/tokenize", json={"model": MODEL, "prompt": prompt}) as response:
        tokens: list[int] = (await response.json())["tokens"]
        return tokens


async def decode_leg(http: aiohttp.ClientSession, decode: RunningEngine, ids: list[int]) -> None:
    body = {"model": MODEL, "prompt": ids, "max_tokens": 2, "stream": False}
    answer = await post(http, f"{decode.url}/v1/completions", body)
    assert answer["_status"] == 200, answer


async def pd_request(
    http: aiohttp.ClientSession,
    notifications: PDNotifications,
    prefill: RunningEngine,
    decode: RunningEngine,
    prompt: str,
    req_id: str,
    with_first_token: bool,
) -> None:
    ids = await tokenize(http, prefill, prompt)
    waiter = notifications.expect(req_id)
    answer = await post(http, f"{prefill.url}/v1/completions", prefill_leg(ids, req_id, decode))
    assert answer["_status"] == 200
    await asyncio.wait_for(waiter, 10.0)
    first = [answer["kv_transfer_params"]["first_tok"]] if with_first_token else []
    await decode_leg(http, decode, [*ids, *first])  # fmt: skip


@pytest.mark.parametrize(("with_first_token", "prefix_caching", "left"), [
    (False, False, 1),  # the original prompt: skip_last_n_tokens 1 never matches the last pushed chunk
    (True, True, 0),  # distinct prompts: nothing in vLLM's prefix cache masks a pushed chunk
    (True, False, 0),
])  # fmt: skip
async def test_pd_buffer_keeps_what_the_decode_leg_does_not_retrieve(
    notifications: PDNotifications, http: aiohttp.ClientSession,
    with_first_token: bool, prefix_caching: bool, left: int,
) -> None:  # fmt: skip
    async with AsyncExitStack() as stack:
        prefill, decode = await start_pair(stack, notifications.port or 0, prefix_caching=prefix_caching)
        for n in range(3):
            prompt = " ".join(f"r{n}x{i % 991}" for i in range(1000))
            await pd_request(http, notifications, prefill, decode, prompt, f"pd-{n}", with_first_token)
        used = await metric(http, decode, "fake_engine:lmcache_pd_buffer_used_chunks")
        assert used == 3 * left
        assert await metric(http, decode, "fake_engine:lmcache_pd_buffer_capacity_chunks") == 1000


async def test_a_shared_prefix_in_vllms_prefix_cache_is_not_retrieved(
    notifications: PDNotifications, http: aiohttp.ClientSession
) -> None:
    """Prefix caching on: the second request's shared chunks come from the GPU, their pushed copies stay."""
    async with AsyncExitStack() as stack:
        prefill, decode = await start_pair(stack, notifications.port or 0)
        shared = " ".join(f"s{i}" for i in range(1024))
        for n in range(2):
            prompt = shared + " " + " ".join(f"t{n}x{i}" for i in range(500))
            await pd_request(http, notifications, prefill, decode, prompt, f"pd-{n}", True)
        assert await metric(http, decode, "fake_engine:lmcache_pd_buffer_used_chunks") > 0


async def test_a_push_waits_for_room_until_the_allocation_timeout(
    notifications: PDNotifications, http: aiohttp.ClientSession
) -> None:
    """LMCache admits a push only when all its chunks fit, waiting up to pd_allocation_timeout_sec; room
    comes only from retrieval."""
    async with AsyncExitStack() as stack:
        prefill, decode = await start_pair(stack, notifications.port or 0, buffer_chunks=15)
        first_ids = await tokenize(http, prefill, PROMPT)
        first = notifications.expect("pd-a")
        answer = await post(http, f"{prefill.url}/v1/completions", prefill_leg(first_ids, "pd-a", decode))
        await asyncio.wait_for(first, 10.0)
        second = notifications.expect("pd-b")
        await post(http, f"{prefill.url}/v1/completions", prefill_leg(OTHER, "pd-b", decode))
        await asyncio.sleep(0.5)
        assert not second.done()  # 12 + 12 > 15: waiting, not refused
        assert await metric(http, decode, "fake_engine:lmcache_pd_rejected_chunks_total") == 0
        await decode_leg(http, decode, [*first_ids, answer["kv_transfer_params"]["first_tok"]])
        await asyncio.wait_for(second, 10.0)  # the retrieval freed the room
        assert await metric(http, decode, "fake_engine:lmcache_pd_buffer_used_chunks") == 12


async def test_a_push_that_finds_no_room_in_time_is_refused(
    notifications: PDNotifications, http: aiohttp.ClientSession
) -> None:
    async with AsyncExitStack() as stack:
        prefill, decode = await start_pair(
            stack, notifications.port or 0, buffer_chunks=15, allocation_timeout_s=0.2
        )
        first = notifications.expect("pd-a")
        await post(http, f"{prefill.url}/v1/completions", prefill_leg(PROMPT, "pd-a", decode))
        await asyncio.wait_for(first, 10.0)
        await post(http, f"{prefill.url}/v1/completions", prefill_leg(OTHER, "pd-b", decode))
        for _ in range(200):
            if await metric(http, prefill, "fake_engine:lmcache_pd_push_failures_total") > 0:
                break
            await asyncio.sleep(0.02)
        assert await metric(http, decode, "fake_engine:lmcache_pd_rejected_chunks_total") == 12
