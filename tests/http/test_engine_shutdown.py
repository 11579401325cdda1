"""`inferencepool fake-engine` as a process: vLLM flags accepted, SIGTERM drains streams (bounded), exits."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

import aiohttp
import pytest
from tests.support.engines import engine_process as fake_engine_process

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def engine_process(
    *extra: str,
) -> contextlib.AbstractAsyncContextManager[tuple[asyncio.subprocess.Process, str]]:
    return fake_engine_process(
        MODEL,
        *("--served-model-name", "llama-8b", "--profile", "cpu-demo", "--dtype", "bfloat16"),
        "--enable-chunked-prefill",  # a vLLM flag the fake does not know: ignored
        *("--gpu-memory-utilization", "0.9"),
        *extra,
    )


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


NIXL_PRODUCER = '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_connector_extra_config":{"kv_lease_duration":30}}'  # noqa: E501


@pytest.mark.parametrize(("shutdown_timeout", "served"), [("45", True), ("0", False)])
async def test_a_terminating_prefill_engine_keeps_its_held_kv_only_with_a_shutdown_timeout(
    shutdown_timeout: str, served: bool
) -> None:
    """Scale-down of a prefill pod: after SIGTERM, a decode engine still reads the KV the prefill engine
    holds for it when vLLM drains (--shutdown-timeout > 0, as the operator sets it); with vLLM's default (0)
    the hand-off is lost and the decode leg fails (issue 11, defect 5)."""
    from tests.support.engines import running_engine

    async with (
        engine_process(
            "--time-scale", "0.05", "--shutdown-timeout", shutdown_timeout,
            "--kv-transfer-config", NIXL_PRODUCER, "--nixl-side-channel-port", "0",
        ) as (process, url),
        # the prefill engine's model and dtype, which the NIXL handshake compares
        running_engine("cpu-demo", MODEL, time_scale=0.05, nixl=True, dtype="bfloat16") as decode,
        aiohttp.ClientSession() as http,
    ):  # fmt: skip
        leg = {
            "model": "llama-8b", "prompt": "a long shared prompt " * 200, "max_tokens": 1, "stream": False,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
        }  # fmt: skip
        async with http.post(f"{url}/v1/completions", json=leg) as response:
            assert response.status == 200
            params = (await response.json())["kv_transfer_params"]
        process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        body = {"model": MODEL, "prompt": leg["prompt"], "max_tokens": 2, "kv_transfer_params": params}
        async with http.post(f"{decode.url}/v1/completions", json=body) as response:
            assert (response.status == 200) is served, await response.text()
        # the drain ends once nothing is held any more (here: read), well before the timeout
        assert await asyncio.wait_for(process.wait(), 10) == 0
