"""What the benchmarks that run fake engines and a router as processes share: start one and read the address
it listens on, stop all of them however the run ends, and read a /metrics page.

    async with processes() as started:
        engine = await fake_engine(started, "--role", "decode")
        router = await start_router(started, {"static": {"prefill": [], "decode": [engine.url]}, ...})

A process is started in its own session (a signal to it reaches nothing else) with its output drained (a full
pipe would stall it). `bench hung`, `bench resume`, `bench aborts`, `bench kill` and `bench overload` use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

MODEL = "bench"


@dataclass
class Started:
    """One process the benchmark started, and the URL it listens on."""

    process: asyncio.subprocess.Process
    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


_DRAINS: set[asyncio.Task[None]] = set()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def start(argv: list[str], env: dict[str, str] | None = None) -> tuple[asyncio.subprocess.Process, str]:
    """Start `argv` and wait (60 s at most) for its `listening on ADDRESS` line: (process, http URL)."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    assert process.stdout is not None
    async with asyncio.timeout(60):
        line = (await process.stdout.readline()).decode()
    match = re.search(r"listening on (\S+)", line)
    if not match:
        process.kill()
        raise RuntimeError(f"{' '.join(argv[:4])} did not start: {line!r}")
    drain = asyncio.create_task(_drain(process.stdout))
    _DRAINS.add(drain)
    drain.add_done_callback(_DRAINS.discard)
    return process, match.group(1) if match.group(1).startswith("http") else f"http://{match.group(1)}"


@contextlib.asynccontextmanager
async def processes() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """The processes a run starts (append them); every one still running is killed when the block ends."""
    started: list[asyncio.subprocess.Process] = []
    try:
        yield started
    finally:
        for process in started:
            if process.returncode is None:
                process.kill()
            await process.wait()


async def fake_engine(
    started: list[asyncio.subprocess.Process],
    *flags: str,
    profile: str = "cpu-demo",
    time_scale: float = 1.0,
    port: int = 0,
) -> Started:
    """A fake engine process serving MODEL on 127.0.0.1 (`port` 0: a free one); `flags` as `vllm serve`'s."""
    process, url = await start(
        [sys.executable, "-m", "inferencepool", "fake-engine", "serve", MODEL, "--profile", profile,
         "--time-scale", str(time_scale), "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "WARNING", *flags]
    )  # fmt: skip
    started.append(process)
    return Started(process, url)


def nixl_flags(role: str, lease_seconds: float) -> list[str]:
    """A P/D engine's flags: its role and the NIXL connector with its KV lease (kv_lease_duration)."""
    config = {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"kv_lease_duration": lease_seconds},
    }
    return ["--role", role, "--kv-transfer-config", json.dumps(config), "--nixl-side-channel-port", "0"]


async def start_router(started: list[asyncio.subprocess.Process], config: dict[str, Any]) -> Started:
    """The router as its own process, configured by `config` (RouterConfig's JSON form)."""
    env = {**os.environ, "INFERENCEPOOL_ROUTER_CONFIG": json.dumps(config)}
    process, url = await start(
        [sys.executable, "-m", "inferencepool", "router", "--host", "127.0.0.1", "--port", "0",
         "--log-level", "ERROR"],
        env,
    )  # fmt: skip
    started.append(process)
    return Started(process, url)


async def metric_samples(http: Any, url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample named `name` on `url`'s /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(url + "/metrics") as response:
        text = await response.text()
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


async def metric_sum(http: Any, url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples on `url`'s /metrics page whose labels include `labels`."""
    return sum(
        value
        for found, value in await metric_samples(http, url, name)
        if all(found.get(k) == v for k, v in labels.items())
    )
