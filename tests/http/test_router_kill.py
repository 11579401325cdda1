"""An engine pod killed under steady P/D load and restarted on its address (a new NIXL engine id, an empty
cache): no request fails before its first token reached the client, none breaks mid-stream, and the router
uses the restarted pod again, after the cooldown its failed connections earned, or at once when the Pod watch
reports the restart (a new incarnation: nothing learnt of the previous engine carries over)."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field

import aiohttp
import pytest
from tests.http.router_harness import (
    LONG_PROMPT,
    MODEL,
    config_for,
    engine_requests,
    engines,
    metric_sum,
    running_router,
)
from tests.support.engines import RunningEngine

from inferencepool.engine_sim.server import FakeEngine
from inferencepool.router.pods import PodSet, PodSpec

CLIENTS = 6


@dataclass
class Load:
    answered: int = 0
    failed_before_streaming: list[str] = field(default_factory=list)
    broken_mid_stream: list[str] = field(default_factory=list)


async def client(url: str, i: int, load: Load, stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession() as http:
        n = 0
        while not stop.is_set():
            n += 1
            # a prompt of its own from the first block: no prefix holds it on a pod (a restarted one has none)
            prompt = f"client {i} request {n} {LONG_PROMPT}"
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "stream": True}
            streaming, text = False, ""
            try:
                async with http.post(url + "/v1/completions", json=body) as response:
                    async for piece in response.content.iter_any():
                        text += piece.decode(errors="replace")
                        streaming = streaming or '"text"' in text
                ok = response.status == 200 and '"error"' not in text and "[DONE]" in text
            except aiohttp.ClientError as error:
                ok, text = False, repr(error)
            if ok:
                load.answered += 1
            else:
                (load.broken_mid_stream if streaming else load.failed_before_streaming).append(text[:300])


async def answered(load: Load, more: int) -> None:
    """Wait (bounded) until `more` requests more were answered."""
    target = load.answered + more
    async with asyncio.timeout(60):
        while load.answered < target:
            await asyncio.sleep(0.01)


def restarted_watch(pods: PodSet, name: str) -> None:
    """What the Pod watch delivers once the pod's container restarted: the pod under another incarnation."""
    pods.apply(
        PodSpec(p.name, p.url, p.role, incarnation="restarted" if p.name == name else p.incarnation)
        for p in pods.pods.values()
    )


@pytest.mark.parametrize("watched", [False, True], ids=["static", "watched"])
@pytest.mark.parametrize("role", ["prefill", "decode"])
async def test_an_engine_killed_under_load_fails_nothing_and_serves_again_once_restarted(
    role: str, watched: bool
) -> None:
    async with engines(["prefill", "prefill", "decode", "decode"]) as started:
        prefill, decode = started[:2], started[2:]
        doomed = (prefill if role == "prefill" else decode)[0].engine
        name = f"{role}@127.0.0.1:{doomed.port}"
        config = config_for(prefill, decode, policy="AlwaysDisaggregate")
        load, stop = Load(), asyncio.Event()
        restarted: FakeEngine | None = None
        async with running_router(config) as router:
            clients = [asyncio.create_task(client(router.url, i, load, stop)) for i in range(CLIENTS)]
            try:
                await answered(load, 20)
                await doomed.stop()  # its connections are cut, its KV gone
                await answered(load, 40)  # served by the others meanwhile
                assert doomed.port is not None and doomed.side_channel_port is not None
                restarted = FakeEngine(
                    dataclasses.replace(
                        doomed.config,
                        port=doomed.port,
                        side_channel_port=doomed.side_channel_port,
                        engine_id=f"{doomed.config.engine_id}-restarted",
                    )
                )
                await restarted.start()
                if watched:
                    restarted_watch(router.router.pods, name)
                    assert router.router.pods.pods[name].cooldown_until == 0.0
                async with asyncio.timeout(60):  # the cooldown is at most 30 s
                    while await engine_requests(RunningEngine(restarted)) == 0:
                        await asyncio.sleep(0.05)
                await answered(load, 20)
            finally:
                stop.set()
                await asyncio.gather(*clients)
                if restarted is not None:
                    await restarted.stop()
            assert load.failed_before_streaming == []
            assert load.broken_mid_stream == []
            assert await metric_sum(router.url, "inferencepool_router_rejected_requests") == 0
