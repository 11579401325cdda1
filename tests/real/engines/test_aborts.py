"""A client that goes away between the legs of a P/D request on real vLLM engines: the prefill engine holds
the prompt's KV for a decode engine that never got the decode leg; the router sends it anyway (one token,
answer dropped), so the decode engine reads the KV and the prefill engine frees it now, not after
kv_lease_duration (the lease alone: test_pd.py). The fake engines' tests (tests/http/test_router_aborts.py)
cover the other points a client can leave at."""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp

from inferencepool.builders.kvtransfer import KV_LEASE_SECONDS
from tests.http.router_harness import metric_sum, unanswering_first, with_addresses
from tests.real.engines.client import TIMEOUT, metric_value, operator_router_config, router
from tests.real.engines.test_pd import prompt_of
from tests.support.real_engines import Fleet, RealEngine


async def kv_usage(engine: RealEngine) -> float:
    return await metric_value(engine, "vllm:kv_cache_usage_perc")


async def idle_within(seconds: float, *engines: RealEngine) -> float:
    """Seconds until every engine's KV usage reads 0 (fails after `seconds`)."""
    began = time.monotonic()
    for engine in engines:
        while await kv_usage(engine) > 0:
            assert time.monotonic() < began + seconds, f"{engine.name} still holds KV of a client gone"
            await asyncio.sleep(0.2)
    return time.monotonic() - began


async def test_a_client_gone_between_the_legs_frees_the_prefill_engines_kv_before_its_lease(
    fleet: Fleet,
) -> None:
    prefill, decode = fleet.prefill, next(engine for engine in fleet.decodes if engine.alive())
    body = {
        "model": fleet.served_name,
        "prompt": await prompt_of(fleet, 1000),
        "max_tokens": 16,
        "stream": True,
    }
    expired = await metric_value(prefill, "vllm:nixl_num_kv_expired_reqs_total")
    received = asyncio.Event()
    async with unanswering_first(decode.url, received) as decode_front:
        config = operator_router_config(fleet, policy="AlwaysDisaggregate")
        config = with_addresses(config, prefill=[prefill.url], decode=[decode_front])
        async with router(fleet, config) as running, aiohttp.ClientSession(timeout=TIMEOUT) as http:
            client = asyncio.create_task(http.post(running.url + "/v1/completions", json=body))
            await asyncio.wait_for(received.wait(), 300)  # the prefill leg answered, the decode leg is out
            assert await kv_usage(prefill) > 0  # the prompt's KV, held for a decode engine
            client.cancel()  # the client goes away
            with contextlib.suppress(asyncio.CancelledError):
                await client
            took = await idle_within(KV_LEASE_SECONDS / 2, prefill, decode)
            releases = await metric_sum(running.url, "inferencepool_router_kv_releases", outcome="read")
    print(f"\n[client gone between the legs] both engines' KV idle {took:.2f} s later")
    assert releases == 1
    assert await metric_value(prefill, "vllm:nixl_num_kv_expired_reqs_total") == expired
