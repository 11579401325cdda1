"""Failures the router absorbs: dead pods, no prefill pool, bad input, disconnects, scale-down, SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
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

from inferencepool.router.pods import PodSpec


def closed_port_url() -> str:
    """A loopback URL nothing listens on (the port was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_no_ready_prefill_pod_serves_long_prompts_colocated_and_counts_it() -> None:
    async with engines(["prefill", "decode"]) as (prefill, decode):
        config = config_for([prefill], [decode], prefillThresholdTokens=100)
        async with running_router(config) as router:
            # Discovery reports the prefill pod NotReady (starting, or failing its probe).
            router.router.pods.apply(
                [
                    PodSpec("prefill-0", prefill.url, "prefill", ready=False),
                    PodSpec("decode-0", decode.url, "decode"),
                ]
            )
            status, body, headers = await complete(router.url, LONG_PROMPT, stream=True)
            assert status == 200 and headers["X-Inferencepool-Route"] == "fallback"
            assert body.rstrip().endswith("data: [DONE]")
            assert (await engine_requests(prefill), await engine_requests(decode)) == (0, 1)
            assert (
                await metric_sum(router.url, "inferencepool_router_fallbacks", reason="no_prefill_pod") == 1
            )
            assert await metric_sum(router.url, "inferencepool_router_requests", route="fallback") == 1


async def test_failed_prefill_leg_falls_back_to_a_decode_pod() -> None:
    async with engines(["decode"]) as (decode,):
        config = config_for([], [decode], prefillThresholdTokens=100)
        config = config.model_copy(
            update={"static": config.static.model_copy(update={"prefill": [closed_port_url()]})}
        )  # type: ignore[union-attr]
        async with running_router(config) as router:
            status, _, headers = await complete(router.url, LONG_PROMPT)
            assert status == 200 and headers["X-Inferencepool-Route"] == "fallback"
            assert await engine_requests(decode) == 1
            assert (
                await metric_sum(router.url, "inferencepool_router_fallbacks", reason="prefill_failed") == 1
            )
            assert (
                await metric_sum(
                    router.url, "inferencepool_router_upstream_errors", role="prefill", kind="connect"
                )
                >= 1
            )


async def test_pod_that_died_before_the_request_is_retried_on_another() -> None:
    async with (
        engines(["decode", "decode"]) as (alive, doomed),
        running_router(config_for([], [alive, doomed])) as router,
    ):
        await doomed.engine.stop()  # the process is gone; discovery has not noticed yet
        statuses = [(await complete(router.url, SHORT_PROMPT))[0] for _ in range(6)]
        assert statuses == [200] * 6
        assert await engine_requests(alive) == 6
        assert await metric_sum(router.url, "inferencepool_router_retries", role="decode") >= 1
        assert await metric_sum(router.url, "inferencepool_router_upstream_errors", kind="connect") >= 1


async def test_no_pod_can_serve_gives_502_or_503_with_a_message() -> None:
    config = config_for([], [])
    config = config.model_copy(
        update={"static": config.static.model_copy(update={"decode": [closed_port_url()]})}
    )  # type: ignore[union-attr]
    async with running_router(config) as router:
        status, body, _ = await complete(router.url)
        assert status == 502 and "refused the connection" in json.loads(body)["error"]["message"]
        router.router.pods.apply([])
        status, body, _ = await complete(router.url)
        assert status == 503 and json.loads(body)["error"]["message"] == "no decode pod is ready"
        async with aiohttp.ClientSession() as http, http.get(router.url + "/ready") as ready:
            assert ready.status == 503


async def test_bad_input_gets_openai_style_errors() -> None:
    async with (
        engines(["decode"]) as (decode,),
        running_router(config_for([], [decode], maxRequestBytes=4096)) as router,
    ):
        cases = [
            (b"{not json", 400, "not valid JSON"),
            (json.dumps({"prompt": "x"}).encode(), 400, "`model` is required"),
            (json.dumps({"model": "gpt-x", "prompt": "x"}).encode(), 404, "does not exist"),
            (json.dumps({"model": MODEL}).encode(), 400, "`prompt` is required"),
            (json.dumps({"model": MODEL, "prompt": "x" * 5000}).encode(), 413, "4096 bytes"),
        ]
        async with aiohttp.ClientSession() as http:
            for payload, status, needle in cases:
                async with http.post(router.url + "/v1/completions", data=payload) as response:
                    error = (await response.json())["error"]
                    assert response.status == status and needle in error["message"], (payload[:40], error)
                    assert error["code"] == status and error["type"]
            # The engine's own validation errors come back as the engine wrote them.
            body = {"model": MODEL, "prompt": "x", "max_tokens": 0}
            async with http.post(router.url + "/v1/completions", json=body) as response:
                assert response.status == 400 and "max_tokens" in (await response.text())
        assert await engine_requests(decode) == 0
        status, _, _ = await complete(router.url)
        assert status == 200  # and the router is still fine


@pytest.mark.parametrize("stream", [True, False])
async def test_client_disconnect_cancels_the_upstream_request(stream: bool) -> None:
    async with (
        engines(["decode"], profile="cpu-demo") as (decode,),
        running_router(config_for([], [decode])) as router,
    ):
        body = {"model": MODEL, "prompt": SHORT_PROMPT, "max_tokens": 2000, "stream": stream}
        async with aiohttp.ClientSession() as http:
            sending = asyncio.create_task(http.post(router.url + "/v1/completions", json=body))
            for _ in range(50):  # until the engine runs it (~40 s of tokens ahead)
                if await metric_sum(decode.url, "vllm:num_requests_running") == 1:
                    break
                await asyncio.sleep(0.05)
            assert await metric_sum(decode.url, "vllm:num_requests_running") == 1
            if stream:
                response = await sending
                assert b"data:" in await response.content.readany()
                response.close()
            else:
                sending.cancel()  # a non-streamed request: the client gives up while waiting
                with contextlib.suppress(asyncio.CancelledError):
                    await sending
        for _ in range(50):
            if await metric_sum(router.url, "inferencepool_router_client_disconnects") == 1:
                break
            await asyncio.sleep(0.1)
        assert await metric_sum(router.url, "inferencepool_router_client_disconnects") == 1
        assert await metric_sum(router.url, "inferencepool_router_in_flight_requests") == 0
        if stream:
            # The engine aborts once its next token finds the router's connection closed. (The fake engine
            # does not watch for disconnects while it computes a non-streamed answer, as vLLM does, so the
            # non-streamed case is checked at the router only.)
            for _ in range(50):
                if await metric_sum(decode.url, "vllm:num_requests_running") == 0:
                    break
                await asyncio.sleep(0.1)
            assert await metric_sum(decode.url, "vllm:num_requests_running") == 0


async def test_terminating_pod_finishes_its_streams_and_gets_no_new_requests() -> None:
    async with (
        engines(["decode", "decode"], profile="cpu-demo") as (first, second),
        running_router(config_for([], [first, second])) as router,
    ):
        body = {"model": MODEL, "prompt": SHORT_PROMPT, "max_tokens": 60, "stream": True}
        async with aiohttp.ClientSession() as http:
            response = await http.post(router.url + "/v1/completions", json=body)
            await response.content.readany()
            busy = next(p for p in router.router.pods.pods.values() if p.outstanding == 1)
            leaving, staying = (first, second) if busy.url == first.url else (second, first)
            # Scale-down: discovery now reports that pod terminating (deletionTimestamp set).
            router.router.pods.apply(
                [
                    PodSpec(busy.name, leaving.url, "decode", terminating=True),
                    PodSpec("staying", staying.url, "decode"),
                ]
            )
            for _ in range(4):
                assert (await complete(router.url))[0] == 200
            rest = await response.read()
            response.release()
        events = rest.count(b"data: {")
        assert rest.rstrip().endswith(b"data: [DONE]") and events >= 50  # the stream ran to its end
        assert await engine_requests(leaving) == 1  # only the stream it already had
        assert await engine_requests(staying) == 4


async def test_sigterm_drains_in_flight_streams_then_exits() -> None:
    async with engines(["decode"], profile="cpu-demo") as (decode,):
        router = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "inferencepool", "router", "--port", "0", "--decode", decode.url,
            "--served-model-name", MODEL, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert router.stdout is not None
            line = (await asyncio.wait_for(router.stdout.readline(), 30)).decode()
            url = line.strip().removeprefix("listening on ")
            body = {"model": MODEL, "prompt": SHORT_PROMPT, "max_tokens": 40, "stream": True}
            async with aiohttp.ClientSession() as http:
                response = await http.post(url + "/v1/completions", json=body)
                await response.content.readany()
                router.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                try:
                    async with aiohttp.ClientSession() as fresh, fresh.get(url + "/health"):
                        accepted_new = True
                except aiohttp.ClientConnectionError:
                    accepted_new = False
                rest = await response.read()
            assert not accepted_new  # the listener closed at once
            assert rest.rstrip().endswith(b"data: [DONE]")  # but the stream in flight ran to its end
            assert await asyncio.wait_for(router.wait(), 30) == 0
        finally:
            if router.returncode is None:
                os.kill(router.pid, signal.SIGKILL)
                await router.wait()


async def test_lmcache_pd_push_that_never_arrives_is_served_by_the_chosen_decode_pod() -> None:
    """A prefill pod that answers but never reports its KV push (here: one not in PD mode)."""
    async with engines(["prefill", "decode"]) as (prefill, decode):
        config = config_for(
            [prefill],
            [decode],
            policy="AlwaysDisaggregate",
            transferMode="LMCachePD",
            lmcachePd={"proxyPort": 0},
            timeouts={"kvPushSeconds": 1},
        )
        async with running_router(config) as router:
            status, _, headers = await complete(router.url, LONG_PROMPT)
            assert status == 200 and headers["X-Inferencepool-Route"] == "fallback"
            assert (await engine_requests(prefill), await engine_requests(decode)) == (1, 1)
            reason = "kv_push_timeout"
            assert await metric_sum(router.url, "inferencepool_router_fallbacks", reason=reason) == 1


@contextlib.asynccontextmanager
async def silent_pod() -> AsyncIterator[str]:
    """A pod that accepts connections and reads requests but never answers (a hung engine)."""

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def test_hung_pods_time_out_prefill_falls_back_decode_gives_504() -> None:
    async with engines(["decode"]) as (decode,), silent_pod() as hung:
        config = config_for(
            [], [decode], policy="AlwaysDisaggregate", timeouts={"prefillSeconds": 1, "firstByteSeconds": 1}
        )
        config = config.model_copy(update={"static": config.static.model_copy(update={"prefill": [hung]})})  # type: ignore[union-attr]
        async with running_router(config) as router:
            status, _, headers = await complete(router.url, LONG_PROMPT)
            assert status == 200 and headers["X-Inferencepool-Route"] == "fallback"
            errors = "inferencepool_router_upstream_errors"
            assert await metric_sum(router.url, errors, role="prefill", kind="timeout") == 1

    async with silent_pod() as hung:
        config = config_for([], [], timeouts={"firstByteSeconds": 1})
        config = config.model_copy(update={"static": config.static.model_copy(update={"decode": [hung]})})  # type: ignore[union-attr]
        async with running_router(config) as router:
            status, body, _ = await complete(router.url, SHORT_PROMPT)
            assert status == 504 and "did not answer in time" in json.loads(body)["error"]["message"]
