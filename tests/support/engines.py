"""Start fake engines inside a test's event loop (loopback, ephemeral ports): a test fixture, kept out of the
wheel.

    async with running_engine(profile="zero") as engine:
        url = engine.url  # http://127.0.0.1:<port>

`profile` names a profile in profiles.PROFILES (or is an EngineProfile); `time_scale` < 1 runs the timing
model faster than real time; other keywords are EngineConfig fields (nixl, lmcache, p2p, kv_lease_s...).

LMCache p2p engines need a controller: `async with running_lmcache_controller() as controller:` and
`p2p=p2p_config(controller, "pod-a")` for each engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from inferencepool.engine_sim.config import P2PConfig
from inferencepool.engine_sim.lmcache_controller import FakeLMCacheController
from inferencepool.engine_sim.server import EngineConfig, FakeEngine
from inferencepool.perf.profiles import EngineProfile, get_profile


@dataclass
class RunningEngine:
    engine: FakeEngine

    @property
    def url(self) -> str:
        return f"http://{self.engine.config.host}:{self.engine.port}"

    @property
    def engine_id(self) -> str:
        return self.engine.config.engine_id


@contextlib.asynccontextmanager
async def running_engine(
    profile: str | EngineProfile = "cpu-demo",
    model: str = "fake-model",
    *,
    time_scale: float = 1.0,
    nixl: bool = False,
    host: str = "127.0.0.1",
    **overrides: Any,
) -> AsyncIterator[RunningEngine]:
    config = EngineConfig(
        profile=get_profile(profile) if isinstance(profile, str) else profile,
        served_model_names=[model],
        model=model,
        host=host,
        port=0,
        nixl=nixl,
        side_channel_host=host,
        side_channel_port=0,
        time_scale=time_scale,
        **overrides,
    )
    engine = FakeEngine(config)
    await engine.start()
    try:
        yield RunningEngine(engine)
    finally:
        await engine.stop()


@contextlib.asynccontextmanager
async def running_lmcache_controller(host: str = "127.0.0.1") -> AsyncIterator[FakeLMCacheController]:
    """The fake LMCache controller on free loopback ports (HTTP, pull and reply)."""
    controller = FakeLMCacheController(host, 0, 0, 0)
    await controller.start()
    try:
        yield controller
    finally:
        await controller.stop()


def p2p_config(controller: FakeLMCacheController, instance_id: str, **overrides: Any) -> P2PConfig:
    """An engine's LMCache p2p settings against `controller`, its own sockets on free ports."""
    host = controller.host
    return P2PConfig(
        instance_id=instance_id,
        controller_pull=f"{host}:{controller.pull_port}",
        controller_reply=f"{host}:{controller.reply_port}",
        host=host,
        **overrides,
    )


@contextlib.asynccontextmanager
async def engine_process(*serve_args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`inferencepool fake-engine serve SERVE_ARGS` in its own process (so a test can signal or kill it, as
    a pod's engine is) on a free loopback port; yields the process and its base URL, killed at the end."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "inferencepool", "fake-engine", "serve", *serve_args, "--host", "127.0.0.1", "--port", "0"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
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
