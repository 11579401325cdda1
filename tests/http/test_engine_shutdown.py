"""`inferencepool fake-engine` as a process: vLLM flags accepted, SIGTERM drains streams (bounded), exits."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest


@contextlib.asynccontextmanager
async def engine_process(*extra: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "inferencepool",
        "fake-engine",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--served-model-name",
        "llama-8b",
        "--profile",
        "cpu-demo",
        "--dtype",
        "bfloat16",
        "--enable-chunked-prefill",  # a vLLM flag the fake does not know: ignored
        "--gpu-memory-utilization",
        "0.9",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        match = re.search(r"listening on (\S+)", line)
        assert match, line
        yield process, f"http://{match.group(1)}"
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def first_chunk_then_rest(response: aiohttp.ClientResponse) -> list[str]:
    return [line.decode().strip() async for line in response.content if line.strip()]


async def test_sigterm_finishes_in_flight_streams_and_refuses_new_connections() -> None:
    # vLLM drains only with --shutdown-timeout > 0 (its default, 0, aborts: see the next test)
    async with (
        engine_process("--time-scale", "0.5", "--shutdown-timeout", "30") as (process, url),
        aiohttp.ClientSession() as http,
    ):
        body = {"model": "llama-8b", "prompt": "stream for a while", "max_tokens": 40, "stream": True}
        async with http.post(f"{url}/v1/completions", json=body) as response:
            assert response.status == 200
            first = await response.content.readline()
            assert first.startswith(b"data: ")
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)
            with pytest.raises(aiohttp.ClientConnectionError):
                async with aiohttp.ClientSession() as other:
                    await other.get(f"{url}/health")
            rest = await first_chunk_then_rest(response)
        assert rest[-1] == "data: [DONE]"
        assert len([line for line in rest if '"text"' in line]) == 39  # the first came before the signal
        assert await asyncio.wait_for(process.wait(), 10) == 0


@pytest.mark.parametrize("shutdown_timeout", ["0", "1"])
async def test_drain_is_bounded(shutdown_timeout: str) -> None:
    """--shutdown-timeout bounds the drain; 0 (vLLM's default) aborts in-flight requests at once."""
    async with (
        engine_process("--time-scale", "1", "--shutdown-timeout", shutdown_timeout) as (process, url),
        aiohttp.ClientSession() as http,
    ):
        body = {"model": "llama-8b", "prompt": "a very long answer", "max_tokens": 2000, "stream": True}
        async with http.post(f"{url}/v1/completions", json=body) as response:
            await response.content.readline()
            process.send_signal(signal.SIGTERM)
            started = asyncio.get_running_loop().time()
            assert await asyncio.wait_for(process.wait(), 10) == 0
            assert asyncio.get_running_loop().time() - started < 5
            with contextlib.suppress(aiohttp.ClientPayloadError):
                rest = await first_chunk_then_rest(response)
                assert "data: [DONE]" not in rest


async def test_bad_flag_values_are_reported() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "inferencepool",
        "fake-engine",
        "--profile",
        "no-such-profile",
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    assert b"unknown engine profile 'no-such-profile'" in stderr
