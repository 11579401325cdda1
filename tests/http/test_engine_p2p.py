"""LMCache p2p between two fake engines and the LMCache controller: a prefix computed on one is fetched by the
other at transfer cost."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from tests.support.engines import RunningEngine, p2p_config, running_engine, running_lmcache_controller

from inferencepool.engine_sim.core import LmcacheSettings

MODEL = "fake-model"
SHARED = " ".join(f"s{i % 997}" for i in range(3000))  # 3000 tokens: 11 whole 256-token chunks


async def counter(http: aiohttp.ClientSession, engine: RunningEngine, name: str) -> float:
    async with http.get(f"{engine.url}/metrics") as response:
        text = await response.text()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
    return float(samples[0].value)


async def complete(http: aiohttp.ClientSession, engine: RunningEngine, prompt: str) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    async with http.post(f"{engine.url}/v1/completions", json=body) as response:
        assert response.status == 200


async def test_peer_prefix_is_fetched_not_recomputed() -> None:
    settings = LmcacheSettings(cpu_capacity_chunks=1000, p2p=True)
    async with (
        running_lmcache_controller() as controller,
        running_engine(
            "cpu-demo", MODEL, time_scale=0.05, lmcache=settings, p2p=p2p_config(controller, "holder")
        ) as holder,
        running_engine(
            "cpu-demo", MODEL, time_scale=0.05, lmcache=settings, p2p=p2p_config(controller, "fetcher")
        ) as fetcher,
        aiohttp.ClientSession() as http,
    ):
        await complete(http, holder, SHARED + " first question")
        await asyncio.sleep(0.3)  # the holder's admit batches reach the controller
        await complete(http, fetcher, SHARED + " second question")
        assert await counter(http, fetcher, "vllm:external_prefix_cache_hits_total") == 11 * 256
        assert await counter(http, fetcher, "vllm:prefix_cache_hits_total") == 0
        # a prompt nobody holds is computed locally
        await complete(http, fetcher, " ".join(f"u{i}" for i in range(600)))
        assert await counter(http, fetcher, "vllm:external_prefix_cache_hits_total") == 11 * 256
