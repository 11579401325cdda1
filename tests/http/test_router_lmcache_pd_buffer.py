"""LMCache PD frees a pushed chunk only when a request retrieves it: every chunk the router has a prefill
engine push must be one its decode leg looks up, or the receiver's buffer fills for good and every later
request times out into the colocated fallback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
from tests.http.router_harness import LONG_PROMPT, MODEL, config_for, metric_sum, running_router
from tests.support.engines import RunningEngine, running_engine

from inferencepool.engine_sim.core import LmcacheSettings
from inferencepool.engine_sim.server import PdConfig
from inferencepool.router.config import StaticBackends
from inferencepool.router.discovery import static_pods

CHUNK = 64
BUFFER_CHUNKS = 256  # room for the requests in flight (CONCURRENCY x ~9 chunks), not for a leak
CONCURRENCY = 16
REQUESTS = 1024


@contextlib.asynccontextmanager
async def lmcache_pd_pair(kv_push_seconds: int) -> AsyncIterator[tuple[str, RunningEngine, RunningEngine]]:
    """A router, a sender and a receiver configured as the operator configures them: the decode engine
    looks up without its last token (skip_last_n_tokens 1) and neither engine uses vLLM's prefix cache."""
    async with contextlib.AsyncExitStack() as stack:
        host = "127.0.0.2"
        receiver = await stack.enter_async_context(
            running_engine(
                "zero",
                MODEL,
                host=host,
                chunk_tokens=CHUNK,
                prefix_caching=False,
                lmcache=LmcacheSettings(
                    0, save=False, pd_role="receiver", pd_buffer_chunks=BUFFER_CHUNKS, skip_last_n_tokens=1
                ),
                pd=PdConfig(role="receiver", peer_host=host),
            )
        )
        config = config_for(
            [],
            [receiver],
            policy="AlwaysDisaggregate",
            transferMode="LMCachePD",
            lmcachePd={
                "proxyPort": 0,
                "receiverInitPorts": list(receiver.engine.pd_init_ports),
                "receiverAllocPorts": list(receiver.engine.pd_alloc_ports),
            },
            timeouts={"kvPushSeconds": kv_push_seconds},
        )
        router = await stack.enter_async_context(running_router(config))
        sender = await stack.enter_async_context(
            running_engine(
                "zero",
                MODEL,
                chunk_tokens=CHUNK,
                prefix_caching=False,
                lmcache=LmcacheSettings(0, load=False, pd_role="sender"),
                pd=PdConfig(
                    role="sender", proxy_host="127.0.0.1", proxy_port=router.router.kv_push_port or 0
                ),
            )
        )
        router.router.pods.apply(static_pods(StaticBackends(prefill=[sender.url], decode=[receiver.url])))
        yield router.url, sender, receiver


def request_for(i: int) -> tuple[str, dict[str, object]]:
    """Distinct long prompts (every chunk hash differs), completions and chat, some streamed."""
    text = f"request {i} of the leak test: {LONG_PROMPT}"
    if i % 4 == 3:
        body: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
        path = "/v1/chat/completions"
    else:
        body, path = {"model": MODEL, "prompt": text}, "/v1/completions"
    return path, {**body, "max_tokens": 3, "stream": i % 2 == 0}


async def send_all(url: str, count: int) -> list[tuple[int, str]]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)
    outcomes: list[tuple[int, str]] = []

    async def worker(http: aiohttp.ClientSession) -> None:
        while not queue.empty():
            path, body = request_for(queue.get_nowait())
            async with http.post(url + path, json=body) as response:
                await response.read()
                outcomes.append((response.status, response.headers.get("X-Inferencepool-Route", "")))

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(worker(http) for _ in range(CONCURRENCY)))
    return outcomes


async def test_every_pushed_chunk_is_retrieved_over_a_thousand_distinct_prompts() -> None:
    async with lmcache_pd_pair(kv_push_seconds=10) as (url, sender, receiver):
        outcomes = await send_all(url, REQUESTS)
        assert len(outcomes) == REQUESTS
        assert all(status == 200 for status, _ in outcomes)
        routes = {route for _, route in outcomes}
        assert routes == {"disaggregated"}, routes
        assert await metric_sum(url, "inferencepool_router_fallbacks") == 0
        assert await metric_sum(sender.url, "fake_engine:lmcache_pd_pushes") == REQUESTS
        # Nothing is left behind: the buffer is as empty as it started, every chunk was retrieved.
        assert await metric_sum(receiver.url, "fake_engine:lmcache_pd_buffer_used_chunks") == 0
        assert await metric_sum(receiver.url, "fake_engine:lmcache_pd_rejected_chunks") == 0
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                receiver.url + "/tokenize", json={"model": MODEL, "prompt": request_for(0)[1]["prompt"]}
            ) as t,
        ):
            tokens = json.loads(await t.read())["count"]
        # Each decode leg loaded its whole prompt but the last token from the buffer.
        loaded = await metric_sum(receiver.url, "fake_engine:lmcache_pd_loaded_tokens")
        assert loaded >= REQUESTS * (tokens - 1) * 0.9
