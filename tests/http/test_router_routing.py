"""Routing decisions through the real router, observed at the fake engines (their vLLM metrics)."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
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
from tests.support.engines import RunningEngine, running_engine

from inferencepool.engine_sim.core import LmcacheSettings
from inferencepool.engine_sim.server import PdConfig
from inferencepool.router.config import StaticBackends
from inferencepool.router.discovery import static_pods

THRESHOLD = 100
PD_CHUNK = 64  # LMCache chunk size in the PD test: the long prompt spans several whole chunks
ROUTE = "X-Inferencepool-Route"


async def prompt_tokens(engine: RunningEngine, prompt: str) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(engine.url + "/tokenize", json={"model": MODEL, "prompt": prompt}) as response,
    ):
        count: int = (await response.json())["count"]
    return count


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


async def test_lmcache_pd_mode_pushes_kv_to_the_decode_pod_that_serves_the_request() -> None:
    """LMCache PD end to end: the router (ZMQ PULL), a prefill engine in pd_role sender, and two receivers
    on their own loopback addresses with the same PD ports, as decode pods have in a cluster."""
    async with contextlib.AsyncExitStack() as stack:
        receivers = []
        init_ports: tuple[int, ...] = (0,)
        alloc_ports: tuple[int, ...] = (0,)
        for host in ("127.0.0.2", "127.0.0.3"):
            receiver = await stack.enter_async_context(
                running_engine(
                    "zero",
                    MODEL,
                    host=host,
                    chunk_tokens=PD_CHUNK,
                    lmcache=LmcacheSettings(0, save=False, pd_role="receiver", pd_buffer_chunks=100),
                    pd=PdConfig(
                        role="receiver", peer_host=host, init_ports=init_ports, alloc_ports=alloc_ports
                    ),
                )
            )
            init_ports, alloc_ports = (
                tuple(receiver.engine.pd_init_ports),
                tuple(receiver.engine.pd_alloc_ports),
            )
            receivers.append(receiver)
        config = {
            "servedModelName": MODEL,
            "policy": "AlwaysDisaggregate",
            "transferMode": "LMCachePD",
            "lmcachePd": {
                "proxyPort": 0,
                "receiverInitPorts": list(init_ports),
                "receiverAllocPorts": list(alloc_ports),
            },
            "timeouts": {"kvPushSeconds": 10},
        }
        router = await stack.enter_async_context(running_router(config_for([], receivers, **config)))
        sender = await stack.enter_async_context(
            running_engine(
                "zero",
                MODEL,
                chunk_tokens=PD_CHUNK,
                lmcache=LmcacheSettings(0, load=False, pd_role="sender"),
                pd=PdConfig(
                    role="sender", proxy_host="127.0.0.1", proxy_port=router.router.kv_push_port or 0
                ),
            )
        )
        router.router.pods.apply(
            static_pods(StaticBackends(prefill=[sender.url], decode=[r.url for r in receivers]))
        )
        client = AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
        stack.push_async_callback(client.close)
        stream = await client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=6, stream=True)
        pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
        assert len(pieces) == 6

        # Concurrent requests with distinct prompts: the decode pod is picked while others are in flight,
        # so only a router that sends the decode leg to the pod it named in the disagg_spec finds the KV.
        prompts = [f"request {i} asks: {LONG_PROMPT}" for i in range(6)]
        answers = await asyncio.gather(*(complete(router.url, prompt) for prompt in prompts))
        assert all(status == 200 and headers[ROUTE] == "disaggregated" for status, _, headers in answers)

        notifications = "inferencepool_router_kv_push_notifications"
        assert await metric_sum(router.url, notifications, outcome="received") == 7
        assert await metric_sum(router.url, "inferencepool_router_requests", route="disaggregated") == 7
        assert await engine_requests(sender) == 7
        whole_chunks = (await prompt_tokens(receivers[0], prompts[0]) - 1) // PD_CHUNK
        for receiver in receivers:
            served = await engine_requests(receiver)
            hits = await metric_sum(receiver.url, "vllm:external_prefix_cache_hits")
            # every request it served loaded its pushed chunks (the openai one is shorter, so >=)
            assert hits >= (served - 1) * whole_chunks * PD_CHUNK, (receiver.url, served, hits)
        assert sum([await engine_requests(r) for r in receivers]) == 7
