"""A decode engine that stops answering (its process stopped by SIGSTOP, as a hung node or a stuck engine
leaves it: connections are accepted by the kernel, nothing comes back) leaves the router's endpoint table
from its unanswered /metrics and from streamed legs that got no headers by the deadline (the TTFT target);
those legs go to another pod, and the pod rejoins once it answers again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable

import aiohttp
from tests.http.router_harness import LONG_PROMPT, MODEL, eventually, metric_sum, running_router
from tests.support.engines import engine_process

from inferencepool.router.config import RouterConfig

TTFT_TARGET_MS = 500


@contextlib.asynccontextmanager
async def decode_engine() -> AsyncIterator[tuple[int, str]]:
    async with engine_process(MODEL, "--profile", "zero", "--served-model-name", MODEL) as (process, url):
        try:
            yield process.pid, url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)  # so the harness's kill and wait return


async def stream(http: aiohttp.ClientSession, url: str) -> str:
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 4, "stream": True}
    async with http.post(url + "/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        return (await response.read()).decode()


async def pods(router: str, state: str) -> float:
    return await metric_sum(router, "inferencepool_router_pods", role="decode", state=state)


async def equals(value: Awaitable[float], wanted: float) -> bool:
    return await value == wanted


async def test_a_stopped_decode_engine_leaves_the_table_its_streams_go_elsewhere_and_it_rejoins() -> None:
    async with decode_engine() as (_, live), decode_engine() as (stopped_pid, stopped):
        config = RouterConfig.model_validate(
            {
                "static": {"prefill": [], "decode": [live, stopped]},
                "servedModelName": MODEL,
                "policy": "Colocated",
                "engineMetricsIntervalMilliseconds": 200,
                # the streamed legs' header deadline is this (timeouts.streamHeadersMilliseconds unset)
                "adaptiveThreshold": {"ttftTargetMilliseconds": TTFT_TARGET_MS},
            }
        )
        stopped_name = "decode@" + stopped.removeprefix("http://")
        async with running_router(config) as router, aiohttp.ClientSession() as http:
            for _ in range(4):
                assert "[DONE]" in await stream(http, router.url)
            assert await pods(router.url, "serving") == 2
            os.kill(stopped_pid, signal.SIGSTOP)
            # Every stream is answered while the engine stays stopped: those sent to it got no headers by
            # the deadline and went to the live pod (without the deadline they would wait for the idle
            # timeout, minutes, and this would time out).
            answers = await asyncio.wait_for(
                asyncio.gather(*(stream(http, router.url) for _ in range(20))), 60
            )
            assert all("[DONE]" in answer for answer in answers)
            await eventually(lambda: equals(pods(router.url, "unresponsive"), 1), 20)
            # Out of the table: no further leg is sent to it, so none waits for its deadline.
            hung_legs = await metric_sum(
                router.url, "inferencepool_router_upstream_errors", pod=stopped_name, kind="timeout"
            )
            answers = await asyncio.wait_for(
                asyncio.gather(*(stream(http, router.url) for _ in range(20))), 60
            )
            assert all("[DONE]" in answer for answer in answers)
            assert (
                await metric_sum(
                    router.url, "inferencepool_router_upstream_errors", pod=stopped_name, kind="timeout"
                )
                == hung_legs
            )
            os.kill(stopped_pid, signal.SIGCONT)
            await eventually(lambda: equals(pods(router.url, "serving"), 2), 20)
            assert await pods(router.url, "unresponsive") == 0
            served = await metric_sum(stopped, "vllm:request_success")

            async def used_again() -> bool:
                await stream(http, router.url)
                return await metric_sum(stopped, "vllm:request_success") > served

            await eventually(used_again, 20)


async def test_a_stream_whose_engine_stops_after_its_headers_goes_to_another_pod_before_its_first_event() -> (
    None
):
    """The engine answered the stream's headers, then stopped before its first token: nothing reached the
    client (the router sends the headers with the first event), so once the pod leaves the table the
    request goes to the other pod."""
    slow = ("--profile", "cpu-demo", "--time-scale", "40")  # a long prompt's prefill takes seconds
    async with (
        engine_process(MODEL, "--served-model-name", MODEL, *slow) as (_, live),
        engine_process(MODEL, "--served-model-name", MODEL, *slow) as (stopped_process, stopped),
    ):
        config = RouterConfig.model_validate(
            {
                "static": {"prefill": [], "decode": [live, stopped]},
                "servedModelName": MODEL,
                "policy": "Colocated",
                "engineMetricsIntervalMilliseconds": 200,
                "adaptiveThreshold": {"ttftTargetMilliseconds": TTFT_TARGET_MS},
                # pods by load alone, so the four prompts split two and two: prefix affinity hashes each
                # prompt's first block onto a pod (the pods' names hold their random ports), and below its
                # load floor of 4 one pod could take all four, leaving the stopped pod none to be stopped in
                "prefixAffinity": {"enabled": False},
            }
        )
        async with running_router(config) as router, aiohttp.ClientSession() as http:

            async def long_stream(i: int) -> str:
                body = {"model": MODEL, "prompt": f"{i} " + LONG_PROMPT * 4, "max_tokens": 4, "stream": True}
                async with http.post(router.url + "/v1/completions", json=body) as response:
                    return (await response.read()).decode()

            requests = [asyncio.create_task(long_stream(i)) for i in range(4)]
            # the router sends the headers with the first event: wait until both engines run prompts instead
            await eventually(lambda: running_both(live, stopped), 20)
            os.kill(stopped_process.pid, signal.SIGSTOP)
            try:
                answers = await asyncio.wait_for(asyncio.gather(*requests), 60)
                assert all("[DONE]" in answer for answer in answers)
                assert all('"error"' not in answer for answer in answers)
                # ... because those on the stopped pod went to the other one, not because they were done
                assert await metric_sum(router.url, "inferencepool_router_retries", role="decode") >= 1
            finally:
                os.kill(stopped_process.pid, signal.SIGCONT)


async def running_both(*urls: str) -> bool:
    counts = [await metric_sum(url, "vllm:num_requests_running") for url in urls]
    return all(count > 0 for count in counts)
