"""LMCache p2p through the controller, end to end over its wire protocol: two fake engines register with the
fake LMCache controller, report their CPU tiers' chunks, and one fetches a prefix the other computed; the
counters LMCache exports (and the fake's p2p counters) show it on both sides."""

from __future__ import annotations

import contextlib
import socket

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from tests.http.router_harness import eventually
from tests.support.engines import RunningEngine, p2p_config, running_engine, running_lmcache_controller

from inferencepool.engine_sim.core import LmcacheSettings
from inferencepool.engine_sim.lmcache_controller import FakeLMCacheController

MODEL = "fake-model"
SHARED = " ".join(f"s{i % 997}" for i in range(3000))  # 3000 tokens: 11 whole 256-token chunks
SHARED_TOKENS = 11 * 256
SETTINGS = LmcacheSettings(cpu_capacity_chunks=1000, p2p=True)


async def metric(http: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def complete(http: aiohttp.ClientSession, engine: RunningEngine, prompt: str) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    async with http.post(f"{engine.url}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()


def keys_held(controller: FakeLMCacheController, instance_id: str) -> int:
    workers = controller.state.instances.get(instance_id, {})
    return sum(len(keys) for worker in workers.values() for keys in worker.kv.values())


async def test_a_prefix_computed_on_one_engine_is_fetched_by_another_through_the_controller() -> None:
    async with (
        running_lmcache_controller() as controller,
        running_engine(
            "cpu-demo", MODEL, time_scale=0.05, lmcache=SETTINGS, p2p=p2p_config(controller, "a")
        ) as a,
        running_engine(
            "cpu-demo", MODEL, time_scale=0.05, lmcache=SETTINGS, p2p=p2p_config(controller, "b")
        ) as b,
        aiohttp.ClientSession() as http,
    ):
        await eventually(lambda: controller.state.worker_count() == 2, 5)
        await complete(http, a, SHARED + " first question")
        await eventually(lambda: keys_held(controller, "a") == 11, 5)  # a's CPU tier, reported as admits
        base = f"http://{controller.host}:{controller.port}"
        tokens = a.engine.config.tokenizer.encode(SHARED + " first question")
        async with http.post(f"{base}/lookup", json={"tokens": tokens}) as response:
            assert (await response.json())["layout_info"] == {"a": ["LocalCPUBackend", SHARED_TOKENS]}
        assert await metric(http, base, "lmcache:cache_controller_kv_pool_keys_count") == 11

        await complete(http, b, SHARED + " second question")
        # the fetching engine: vLLM's external hits and LMCache's own retrieve counters
        assert await metric(http, b.url, "vllm:external_prefix_cache_hits_total") == SHARED_TOKENS
        assert await metric(http, b.url, "vllm:prefix_cache_hits_total") == 0
        assert await metric(http, b.url, "lmcache:num_hit_tokens_total") == SHARED_TOKENS
        requested = await metric(http, b.url, "lmcache:num_requested_tokens_total")
        assert requested == len(b.engine.config.tokenizer.encode(SHARED + " second question"))
        assert await metric(http, b.url, "fake_engine:lmcache_p2p_hit_tokens_total") == SHARED_TOKENS
        # the serving engine timed one p2p transfer of those tokens, as LMCache does on that side
        assert await metric(http, a.url, "lmcache:p2p_time_to_transfer_count") == 1
        assert await metric(http, a.url, "fake_engine:lmcache_p2p_served_tokens_total") == SHARED_TOKENS
        assert await metric(http, a.url, "fake_engine:lmcache_p2p_hit_tokens_total") == 0
        # the fetched chunks are in b's CPU tier now, and the controller knows
        await eventually(lambda: keys_held(controller, "b") == 11, 5)

        # a prompt nobody holds is computed locally: no new hits, no transfer
        await complete(http, b, " ".join(f"u{i}" for i in range(600)))
        assert await metric(http, b.url, "fake_engine:lmcache_p2p_hit_tokens_total") == SHARED_TOKENS
        assert await metric(http, a.url, "lmcache:p2p_time_to_transfer_count") == 1


async def test_an_engine_gone_from_the_controller_is_not_asked() -> None:
    """A peer deregisters when it stops (LMCacheWorker.close): its chunks leave the controller, so the next
    lookup finds nobody and the prompt is computed locally."""
    async with (
        running_lmcache_controller() as controller,
        running_engine(
            "cpu-demo", MODEL, time_scale=0.05, lmcache=SETTINGS, p2p=p2p_config(controller, "b")
        ) as b,
        aiohttp.ClientSession() as http,
    ):
        async with running_engine(
            "cpu-demo", MODEL, time_scale=0.05, lmcache=SETTINGS, p2p=p2p_config(controller, "a")
        ) as a:
            await complete(http, a, SHARED + " first question")
            await eventually(lambda: keys_held(controller, "a") == 11, 5)
        await eventually(lambda: "a" not in controller.state.instances, 5)
        await complete(http, b, SHARED + " second question")
        assert await metric(http, b.url, "lmcache:num_hit_tokens_total") == 0
        assert await metric(http, b.url, "fake_engine:lmcache_p2p_hit_tokens_total") == 0


def hold_port(host: str, port: int) -> socket.socket:
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind((host, port))
    held.listen(1)
    return held


async def test_without_a_controller_an_engine_serves_and_computes_locally() -> None:
    """LMCache 0.5.6 tries to register once (30 s by default): an engine whose controller never answers
    reports nothing, and its lookups fail over to computing the prompt."""
    async with (
        running_lmcache_controller() as controller,
        aiohttp.ClientSession() as http,
    ):
        dead = p2p_config(controller, "lonely", recv_timeout_s=0.2, send_timeout_s=0.2)
        await controller.stop()  # its ports stay named in the config, nobody answers there
        # hold the freed ports (listening, never answering), or the engine's own sockets may be given one of
        # them and answer its registration themselves
        held = [hold_port(controller.host, port) for port in (controller.pull_port, controller.reply_port)]
        async with (
            running_engine("cpu-demo", MODEL, time_scale=0.05, lmcache=SETTINGS, p2p=dead) as engine,
            contextlib.AsyncExitStack() as stack,
        ):
            for sock in held:
                stack.callback(sock.close)
            p2p = engine.engine.p2p
            assert p2p is not None
            await eventually(lambda: p2p.registration_failed is not None, 5)
            assert "TimeoutError" in (p2p.registration_failed or "")
            await complete(http, engine, SHARED + " question")
            assert await metric(http, engine.url, "lmcache:num_hit_tokens_total") == 0
            assert await metric(http, engine.url, "vllm:generation_tokens_total") == 2


async def test_a_nixl_decode_leg_is_looked_up_but_not_fetched_from_a_peer() -> None:
    """vLLM's MultiConnector asks LMCache too, but NixlConnector (first, with the whole prompt) loads the
    request: the controller sees the lookup, the peer sends nothing."""
    unreachable_prefill = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "gone",
        "remote_request_id": "cmpl-x",
        "remote_block_ids": [[1, 2]],
        "remote_host": "127.0.0.1",
        "remote_port": 9,  # discard port: nothing listens
        "tp_size": 1,
    }
    async with (
        running_lmcache_controller() as controller,
        running_engine(
            "cpu-demo", MODEL, time_scale=0.05, lmcache=SETTINGS, p2p=p2p_config(controller, "a")
        ) as a,
        running_engine(
            "cpu-demo", MODEL, time_scale=0.05, nixl=True, lmcache=SETTINGS, p2p=p2p_config(controller, "b")
        ) as b,
        aiohttp.ClientSession() as http,
    ):
        await complete(http, a, SHARED + " first question")
        await eventually(lambda: keys_held(controller, "a") == 11, 5)
        lookups = controller.state.p2p_lookups
        body = {"model": MODEL, "prompt": SHARED + " second question", "max_tokens": 2}
        body["kv_transfer_params"] = unreachable_prefill
        async with http.post(f"{b.url}/v1/completions", json=body) as response:
            assert response.status == 500  # the NIXL read fails: nothing listens there
        assert controller.state.p2p_lookups == lookups + 1
        assert await metric(http, a.url, "fake_engine:lmcache_p2p_served_tokens_total") == 0
        assert await metric(http, b.url, "fake_engine:lmcache_p2p_hit_tokens_total") == 0
