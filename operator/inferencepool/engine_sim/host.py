"""What the fake engine's parts (the OpenAI API, the NIXL side channel, LMCache PD and p2p) need of the
engine that hosts them: a narrow Protocol, so each part depends on it and not on `server.FakeEngine`, which
builds them (no import cycle)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import ClientSession

from inferencepool.engine_sim.config import EngineConfig
from inferencepool.engine_sim.core import EngineCore, RequestFailed, TokenEvent
from inferencepool.engine_sim.metrics import EngineMetrics
from inferencepool.engine_sim.protocol import GenerationRequest


@dataclass
class Stream:
    """One request's way back from the engine loop to its HTTP handler."""

    queue: asyncio.Queue[TokenEvent | RequestFailed]
    arrival_wall: float
    last_token_wall: float | None = None
    first_token_wall: float | None = None
    tokens: int = 0  # output tokens delivered so far


class EngineHost(Protocol):
    config: EngineConfig
    core: EngineCore
    metrics: EngineMetrics
    streams: dict[str, Stream]
    draining: bool
    side_channel_port: int | None

    @property
    def session(self) -> ClientSession:
        """The engine's HTTP client (KV pushes, peer lookups)."""
        ...

    def model_now(self) -> float:
        """The engine core's clock."""
        ...

    def wake(self) -> None:
        """Something changed outside the engine loop: schedule again."""
        ...

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run a background task the engine keeps (and cancels on stop)."""
        ...

    def deliver(self, event: TokenEvent | RequestFailed) -> None: ...

    async def before_admission(self, request: GenerationRequest) -> None: ...
