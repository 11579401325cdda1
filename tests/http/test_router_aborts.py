"""A client that goes away at any point of a disaggregated request leaves no KV held on either pod until a
lease ends: vLLM frees a prefill's blocks once a decode engine read them, or at kv_lease_duration, and a
request's blocks at once when it is aborted (its API server cancels the request when its client's connection
closes, `with_cancellation`). So the router aborts the leg it has open (it closes that connection), and a
client gone between the legs gets its decode leg sent anyway (one token, its answer dropped), so that the
decode engine reads the KV now. Each test asserts `vllm:kv_cache_usage_perc` of both engines back to idle
well before the lease, with no lease expired."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
from tests.http.router_harness import (
    LONG_PROMPT,
    MODEL,
    RunningRouter,
    config_for,
    engines,
    eventually,
    metric_sum,
    running_router,
    unanswering_first,
    with_addresses,
)
from tests.support.engines import RunningEngine

LEASE_S = 120.0  # far longer than the tests wait: a KV freed only by the lease fails them
SLOW = 20.0  # engine time scale: a prefill leg of LONG_PROMPT takes about a second, a token 0.4 s


async def kv_usage(engine: RunningEngine) -> float:
    return await metric_sum(engine.url, "vllm:kv_cache_usage_perc")


async def until(engine: RunningEngine, name: str) -> None:
    """Wait (bounded) until `engine` reports a positive `name`."""

    async def positive() -> bool:
        return await metric_sum(engine.url, name) > 0

    await eventually(positive, what=f"{name} stayed 0")


async def assert_kv_freed(*pods: RunningEngine) -> None:
    """Every pod's KV usage back to 0 well before the lease, and no lease expired on the way."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LEASE_S / 4
    for pod in pods:
        while await kv_usage(pod) > 0:
            assert loop.time() < deadline, f"{pod.engine.config.role} pod still holds KV of a client gone"
            await asyncio.sleep(0.1)
        assert await metric_sum(pod.url, "vllm:nixl_num_kv_expired_reqs") == 0
        assert await metric_sum(pod.url, "vllm:num_requests_running") == 0


def long_request(router: RunningRouter, http: aiohttp.ClientSession, max_tokens: int) -> asyncio.Task[None]:
    """A streamed request read until cancelled (a client that goes away)."""

    async def read() -> None:
        body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": max_tokens, "stream": True}
        async with http.post(router.url + "/v1/completions", json=body) as response:
            async for _ in response.content.iter_any():
                pass

    return asyncio.create_task(read())


async def go_away(client: asyncio.Task[None]) -> None:
    client.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await client


# where the client leaves: (the pod whose leg is open, max_tokens, the metric that says the leg runs there)
DURING_A_LEG = {
    "prefill leg": ("prefill", 8, "vllm:num_requests_running"),  # the prefill leg is computing
    "mid decode": ("decode", 200, "vllm:generation_tokens"),  # the decode leg is streaming
}


@pytest.mark.parametrize("where", DURING_A_LEG)
async def test_a_client_gone_during_a_leg_frees_that_pods_kv_at_once(where: str) -> None:
    role, max_tokens, running = DURING_A_LEG[where]
    async with (
        engines(["prefill", "decode"], kv_lease_s=LEASE_S, profile="cpu-demo", time_scale=SLOW) as (
            prefill,
            decode,
        ),
        running_router(config_for([prefill], [decode], policy="AlwaysDisaggregate")) as router,
        aiohttp.ClientSession() as http,
    ):
        pod = prefill if role == "prefill" else decode
        client = long_request(router, http, max_tokens)
        await until(pod, running)
        assert await kv_usage(pod) > 0
        await go_away(client)
        await assert_kv_freed(prefill, decode)
        # the engine aborted the open leg; the router counted the client gone
        assert await metric_sum(pod.url, "vllm:request_success", finished_reason="abort") == 1
        assert await metric_sum(router.url, "inferencepool_router_client_disconnects") == 1
        if role == "prefill":  # no decode leg was sent: nothing holds KV for one
            assert await metric_sum(decode.url, "vllm:request_success") == 0


async def test_a_client_gone_between_the_legs_frees_the_prefill_pods_kv_before_the_lease() -> None:
    received = asyncio.Event()
    async with (
        engines(["prefill", "decode"], kv_lease_s=LEASE_S) as (prefill, decode),
        unanswering_first(decode.url, received) as decode_front,
    ):
        config = with_addresses(config_for([prefill], [], policy="AlwaysDisaggregate"), decode=[decode_front])
        async with running_router(config) as router, aiohttp.ClientSession() as http:
            body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 8, "stream": True}
            client = asyncio.create_task(http.post(router.url + "/v1/completions", json=body))
            await asyncio.wait_for(received.wait(), 30)  # the prefill leg answered, the decode leg is out
            assert await kv_usage(prefill) > 0  # the prompt's KV, held for the decode engine
            client.cancel()  # the client goes away
            with contextlib.suppress(asyncio.CancelledError):
                await client
            await assert_kv_freed(prefill, decode)
            assert await metric_sum(router.url, "inferencepool_router_kv_releases", outcome="read") == 1
