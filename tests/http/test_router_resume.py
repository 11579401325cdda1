"""A decode engine killed mid-stream: its streams are resumed on another decode pod from the text already
sent, so each client sees one uninterrupted answer (and with resumption off, each of them breaks)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal

import aiohttp
import pytest
from tests.http.router_harness import MODEL, config_for, metric_sum, running_router
from tests.support.engines import engine_process as fake_engine_process
from tests.support.engines import running_engine

from inferencepool.bench.resume import read_stream, request_for

STREAMS = 12
MAX_TOKENS = 30
TIME_SCALE = 5  # the model's time runs slower: ~0.1 s a token, so a 30-token answer takes ~3 s


def engine_process() -> contextlib.AbstractAsyncContextManager[tuple[asyncio.subprocess.Process, str]]:
    """A fake engine in its own process, so it can be killed as a crashing pod is (SIGKILL)."""
    return fake_engine_process(MODEL, "--profile", "cpu-demo", "--time-scale", str(TIME_SCALE))


def body_for(i: int) -> tuple[str, dict[str, object]]:
    text = f"stream {i}: tell me about prefill and decode pools"
    if i % 2:
        return "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    return "/v1/completions", {"model": MODEL, "prompt": text}


def answer_of(events: list[bytes], chat: bool) -> tuple[int, bool, bool]:
    """(text-bearing events, ended with [DONE], any error event)."""
    tokens, done, error = 0, False, False
    for event in events:
        data = event.removeprefix(b"data:").strip()
        if data == b"[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            error = True
            continue
        for choice in chunk["choices"]:
            text = choice["delta"].get("content") if chat else choice["text"]
            tokens += bool(text)
    return tokens, done, error


@pytest.mark.parametrize("resume_streams", [True, False])
async def test_streams_of_a_killed_decode_engine_are_resumed_on_another(resume_streams: bool) -> None:
    async with (
        engine_process() as (doomed, doomed_url),
        running_engine("cpu-demo", MODEL, time_scale=TIME_SCALE) as survivor,
    ):
        config = config_for([], [], policy="Colocated", resumeStreams=resume_streams)
        config = config.model_copy(
            update={"static": config.static.model_copy(update={"decode": [doomed_url, survivor.url]})}  # type: ignore[union-attr]
        )
        async with running_router(config) as router, aiohttp.ClientSession() as http:
            started = [asyncio.Event() for _ in range(STREAMS)]

            async def one(i: int) -> list[bytes]:
                path, body = body_for(i)
                body = {**body, "stream": True, "max_tokens": MAX_TOKENS}
                events: list[bytes] = []
                async with http.post(router.url + path, json=body) as response:
                    assert response.status == 200
                    buffer = b""
                    async for piece in response.content.iter_any():
                        buffer += piece
                        *whole, buffer = buffer.split(b"\n\n")
                        events.extend(e for e in whole if e.strip())
                        if len(events) >= 2:
                            started[i].set()
                started[i].set()
                return events

            streams = [asyncio.create_task(one(i)) for i in range(STREAMS)]
            await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 30)
            doomed.send_signal(signal.SIGKILL)  # a crashed pod: every connection to it breaks at once
            answers = await asyncio.wait_for(asyncio.gather(*streams), 60)

            outcomes = [answer_of(events, i % 2 == 1) for i, events in enumerate(answers)]
            whole = sum(1 for tokens, done, error in outcomes if tokens == MAX_TOKENS and done and not error)
            broken = sum(1 for _, _, error in outcomes if error)
            resumed = await metric_sum(router.url, "inferencepool_router_streams_resumed", outcome="resumed")
            # The survivor served its own streams and every continuation: the rest were on the killed one.
            killed = STREAMS - (await metric_sum(survivor.url, "vllm:request_success") - resumed)
            print(f"resumeStreams={resume_streams}: {whole}/{STREAMS} whole answers, {broken} broken")
            assert resumed + broken >= 1  # the kill hit streams in flight (the router spreads them)
            if resume_streams:
                assert (whole, broken) == (STREAMS, 0), outcomes
                assert resumed == killed
                assert (
                    await metric_sum(router.url, "inferencepool_router_streams_resumed", outcome="broken")
                    == 0
                )
            else:
                assert resumed == 0 and broken >= 1 and whole == STREAMS - broken, outcomes


async def test_a_resumed_stream_is_the_answer_an_unkilled_engine_gives() -> None:
    """Chat and completions, with and without a token limit (a chat then stops on its own, a completion gets
    vLLM's default 16) and with usage asked for or not: each stream the kill interrupts reads, event for
    event, as the same request's answer from an engine nobody killed (the fake engine is deterministic)."""
    requests = [request_for(i, MAX_TOKENS) for i in range(STREAMS)]
    async with (
        engine_process() as (doomed, doomed_url),
        running_engine("cpu-demo", MODEL, time_scale=TIME_SCALE) as survivor,
        running_engine("cpu-demo", MODEL, time_scale=TIME_SCALE) as witness,
        aiohttp.ClientSession() as http,
    ):
        references = await asyncio.gather(
            *(
                read_stream(http, witness.url + path, {**body, "model": MODEL}, "chat" in path)
                for path, body in requests
            )
        )
        config = config_for([], [], policy="Colocated")
        config = config.model_copy(
            update={"static": config.static.model_copy(update={"decode": [doomed_url, survivor.url]})}  # type: ignore[union-attr]
        )
        async with running_router(config) as router:
            progressed = [asyncio.Event() for _ in requests]
            streams = [
                asyncio.create_task(
                    read_stream(
                        http, router.url + path, {**body, "model": MODEL}, "chat" in path, progressed[i], 2
                    )
                )
                for i, (path, body) in enumerate(requests)
            ]
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in progressed)), 30)
            doomed.send_signal(signal.SIGKILL)
            answers = await asyncio.wait_for(asyncio.gather(*streams), 60)
            resumed = await metric_sum(router.url, "inferencepool_router_streams_resumed", outcome="resumed")
    assert resumed >= 1  # the kill interrupted streams (the router spreads them over both engines)
    for (path, body), got, expected in zip(requests, answers, references, strict=True):
        where = f"{path} {body}"
        assert expected.done and expected.error is None and len(expected.finish_reasons) == 1, where
        assert got.error is None and got.done, (where, got)
        assert got.text == expected.text, where  # no token twice, none missing
        assert len(got.ids) == 1, (where, got.ids)  # one answer's id throughout
        assert got.finish_reasons == expected.finish_reasons, where  # one end, the same reason
        assert got.usages == expected.usages, where  # usage (when asked for) counts the whole answer once
        assert got.roles == expected.roles, where  # a chat opens once
