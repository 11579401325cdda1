"""`inferencepool diagnose --from-files` on pages scraped from real fake engines and the real router under two
scripted workloads: long prompts at a high rate are prefill-bound, short prompts with long outputs are
decode-bound, through the same code path the command takes on a cluster."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from tests.http.router_harness import MODEL, config_for, running_router
from tests.support.engines import running_engine

from inferencepool import cli
from inferencepool.api import labels
from inferencepool.perf.profiles import PROFILES, EngineProfile
from inferencepool.whatif.cli import RawSnapshot, scrape_pods, snapshot_text

# The CPU demo device with a fifth of its compute: prefill costs ~1.2 ms a token and decode steps grow from
# ~21 ms (a few streams) to ~50 ms (32 streams), so both phases can be driven past a 800 ms / 40 ms target
# with a few dozen requests.
SLOW = dataclasses.replace(
    PROFILES["cpu-demo"],
    name="cpu-demo-slow",
    hardware=dataclasses.replace(PROFILES["cpu-demo"].hardware, bf16_flops=1.5e12),
)
THRESHOLD = 200
LONG = "word " * 400  # ~400 tokens by the engine's tokenizer, ~500 by the router's estimate
SHORT = "say hi"


async def stream(url: str, prompt: str, max_tokens: int) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/completions", json=body) as reply:
        assert reply.status == 200, await reply.text()
        await reply.read()


async def long_prompts_at_a_high_rate(url: str) -> None:
    tasks = []
    for number in range(24):  # each prompt its own: nothing for a prefix cache to reuse
        tasks.append(asyncio.create_task(stream(url, f"request {number} {LONG}", 4)))
        await asyncio.sleep(0.1)
    await asyncio.gather(*tasks)


async def short_prompts_with_long_outputs(url: str) -> None:
    await asyncio.gather(*(stream(url, SHORT, 60) for _ in range(32)))


@contextlib.asynccontextmanager
async def pool(profile: EngineProfile) -> AsyncIterator[tuple[str, Callable[[], Awaitable[RawSnapshot]]]]:
    """One prefill and one decode fake engine (NIXL) behind the router; yields its URL and a snapshot
    taker that scrapes the three /metrics pages as the command does."""
    async with (
        running_engine(profile, MODEL, nixl=True, role="prefill") as prefill,
        running_engine(profile, MODEL, nixl=True, role="decode") as decode,
        running_router(config_for([prefill], [decode], prefillThresholdTokens=THRESHOLD)) as router,
    ):
        pods = [("prefill-0", "prefill", prefill.url), ("decode-0", "decode", decode.url)]
        pods.append(("router-0", "router", router.url))

        async def snapshot() -> RawSnapshot:
            async with aiohttp.ClientSession() as session:
                pages = []
                for name, role, url in pods:
                    async with session.get(url + "/metrics") as response:
                        pages.append((name, role, await response.text()))
            return time.time(), pages

        yield router.url, snapshot


async def diagnose_workload(
    workload: Callable[[str], Awaitable[None]], folder: Path, capsys: pytest.CaptureFixture[str]
) -> str:
    async with pool(SLOW) as (url, snapshot):
        # One request first, so the router's estimate counter calibrates on the engine's tokenizer.
        await stream(url, SHORT, 2)
        earlier = await snapshot()
        running = asyncio.create_task(workload(url))
        await asyncio.sleep(1.5)
        during = await snapshot()  # the gauges (queue, batch, KV cache) while it runs
        await running
        later = await snapshot()
    files = []
    for name, raw in (("earlier", earlier), ("during", during), ("later", later)):
        path = folder / f"{name}.txt"
        path.write_text(snapshot_text(raw))
        files.append(str(path))
    capsys.readouterr()
    argv = ["diagnose", "--from-files", *files, "--ttft-slo-ms", "800", "--itl-slo-ms", "40", "--no-what-if"]
    assert await asyncio.to_thread(cli.main, argv) == 0
    return capsys.readouterr().out


async def test_two_workloads_get_opposite_verdicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "long").mkdir()
    (tmp_path / "short").mkdir()
    prefill_report = await diagnose_workload(long_prompts_at_a_high_rate, tmp_path / "long", capsys)
    decode_report = await diagnose_workload(short_prompts_with_long_outputs, tmp_path / "short", capsys)
    assert prefill_report.startswith(f"pool {tmp_path / 'long' / 'later.txt'}: bottleneck Prefill"), (
        prefill_report
    )
    assert "1 prefill + 1 decode engines, LengthAware, threshold 200" in prefill_report
    assert "prefill replicas 1 -> " in prefill_report
    assert decode_report.startswith(f"pool {tmp_path / 'short' / 'later.txt'}: bottleneck Decode"), (
        decode_report
    )
    assert "decode replicas 1 -> " in decode_report
    # Short prompts never reach the prefill pool: disaggregation does not pay for them.
    assert "serve the pool Colocated" in decode_report
    for report in (prefill_report, decode_report):
        assert "prompt lengths (router-counted tokens" in report
        assert "excludes the first token" in report


def pod(name: str, role: str, url: str, ready: bool = True) -> dict[str, object]:
    """A Pod as the API server serializes it: labels, the named http port, IP, Ready condition."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return {
        "metadata": {"name": name, "labels": {labels.LABEL_POOL: "p", labels.LABEL_ROLE: role}},
        "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": int(port)}]}]},
        "status": {"podIP": host, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


async def test_live_snapshots_read_the_ready_pods_of_each_role() -> None:
    async with (
        running_engine("zero", MODEL, nixl=True, role="prefill") as prefill,
        running_engine("zero", MODEL, nixl=True, role="decode") as decode,
    ):
        pods = [
            pod("p-0", "prefill", prefill.url),
            pod("d-0", "decode", decode.url),
            pod("d-1", "decode", decode.url, ready=False),  # not ready: not read
            pod("c-0", "lmcache-controller", decode.url),  # not an engine or router: not read
        ]
        pages = await scrape_pods(pods)
    assert [(name, role) for name, role, _ in pages] == [("p-0", "prefill"), ("d-0", "decode")]
    assert all("vllm:time_to_first_token_seconds" in page for _, _, page in pages)
