"""The fake engine: the pure EngineCore driven in wall-clock time behind vLLM's listeners.

What it reproduces of vLLM and LMCache, and where in their code, is docs/engine-contract.md. This module
owns the engine's lifecycle (start, drain on SIGTERM as vLLM's --shutdown-timeout does, stop) and the engine
loop; each listener is a part with one job:
- openai_api.py: the API port (--port), vLLM's OpenAI-compatible endpoints and /metrics;
- side_channel.py: the NIXL side channel, only with a NIXL or LMCache connector: KV reads served to decode
  engines and performed against prefill engines;
- lmcache_pd.py: LMCache PD mode, the receiver's init/alloc sockets or the sender's pushes and ProxyNotifs;
- lmcache_p2p.py: LMCache p2p, the workers that register with the LMCache controller, report the CPU tier's
  chunks, look prompts up at peers and serve peers' lookups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

from inferencepool.engine_sim.config import EngineConfig, PdConfig
from inferencepool.engine_sim.core import EngineCore, RequestFailed, TokenEvent
from inferencepool.engine_sim.host import Stream
from inferencepool.engine_sim.httputil import app_runner, bound_port
from inferencepool.engine_sim.lmcache_p2p import ControllerIndex, P2PWorker
from inferencepool.engine_sim.lmcache_pd import PdReceiver, PdSender
from inferencepool.engine_sim.metrics import EngineMetrics, request_tpot
from inferencepool.engine_sim.openai_api import OpenAIApi
from inferencepool.engine_sim.protocol import GenerationRequest
from inferencepool.engine_sim.side_channel import SideChannel

__all__ = ["EngineConfig", "FakeEngine", "PdConfig"]

log = logging.getLogger("inferencepool.fake_engine")

READ_TIMEOUT_S = 10.0
# A step may start this far behind schedule and still be charged from where the previous one ended, so timer
# overshoot of asyncio.sleep does not accumulate into ITL; beyond it the engine is CPU-bound and time slips.
SCHEDULE_SLACK_S = 0.003


class FakeEngine:
    def __init__(self, config: EngineConfig) -> None:
        config.check()
        self.config = config
        p2p = config.p2p if config.lmcache and config.lmcache.p2p else None
        self.prefix_index = ControllerIndex() if p2p is not None else None
        self.core = EngineCore(
            config.profile,
            config.engine_id,
            prefix_caching=config.prefix_caching,
            lmcache=config.lmcache,
            nixl=config.nixl,
            kv_lease_s=config.kv_lease_s,
            recompute_on_load_failure=config.recompute_on_load_failure,
            prefix_index=self.prefix_index,
            chunk_tokens=config.chunk_tokens,
        )
        self.metrics = EngineMetrics(self.core, config.served_model_names[0], model=config.model)
        self.p2p = P2PWorker(self, p2p, self.prefix_index) if p2p and self.prefix_index else None
        self.streams: dict[str, Stream] = {}  # requests in flight, by request id
        self.draining = False
        self.api = OpenAIApi(self)
        self.side_channel = SideChannel(self)
        self.pd_receiver = (
            PdReceiver(self, config.pd) if config.pd is not None and config.pd.role == "receiver" else None
        )
        self.pd_sender: PdSender | None = None
        self._wake = asyncio.Event()
        self._t0 = time.monotonic()
        self._loop_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._session: ClientSession | None = None
        self._runners: list[web.AppRunner] = []
        self._api_site: web.TCPSite | None = None
        self.port: int | None = None
        self.side_channel_port: int | None = None

    @property
    def session(self) -> ClientSession:
        """The client for engine-to-engine calls (KV reads, PD pushes); exists once started."""
        assert self._session is not None, "the engine is not started"
        return self._session

    @property
    def pd_init_ports(self) -> list[int]:
        """The PD receiver's bound init ports, rank order (empty unless a receiver)."""
        return self.pd_receiver.init_ports if self.pd_receiver is not None else []

    @property
    def pd_alloc_ports(self) -> list[int]:
        return self.pd_receiver.alloc_ports if self.pd_receiver is not None else []

    def api_app(self) -> web.Application:
        return self.api.app()

    # ----- lifecycle -----

    async def start(self) -> None:
        self._session = ClientSession(timeout=ClientTimeout(total=READ_TIMEOUT_S))
        self._loop_task = asyncio.create_task(self._engine_loop(), name="engine-loop")
        if self.config.nixl or self.config.lmcache:
            runner, self.side_channel_port = await self.side_channel.start()
            self._runners.append(runner)
        if self.pd_receiver is not None:
            self._runners.append(await self.pd_receiver.start())
        if self.config.pd is not None and self.config.pd.role == "sender":
            self.pd_sender = PdSender(self, self.config.pd)
        # a generation whose client went away is aborted at once, whole answers too (vLLM's API server
        # cancels the request when its connection closes), so its KV is freed and no lease holds it
        runner = await app_runner(self.api.app(), cancel_on_disconnect=True)
        self._runners.append(runner)
        self._api_site = web.TCPSite(runner, self.config.host, self.config.port)
        await self._api_site.start()
        self.port = bound_port(self._api_site)
        if self.p2p is not None:
            await self.p2p.start()
        log.info(
            "fake engine %s (%s) serving %s on %s:%s, tokenizer %s, profile %s, NIXL %s",
            self.config.engine_id,
            self.config.role,
            ",".join(self.config.served_model_names),
            self.config.host,
            self.port,
            self.config.tokenizer.name,
            self.config.profile.name,
            f"side channel {self.config.side_channel_host}:{self.side_channel_port}"
            if self.config.nixl
            else "off",
        )

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting requests and wait (bounded) for in-flight ones and for the KV this engine holds for
        remote decodes (read, or released when its lease expires), as vLLM drains with --shutdown-timeout;
        True when nothing was left. The NIXL side channel keeps answering meanwhile."""
        self.draining = True
        if self._api_site is not None:
            await self._api_site.stop()  # closes the listening socket; open connections keep streaming
        deadline = time.monotonic() + timeout_s
        while self._busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not self._busy()

    def _busy(self) -> bool:
        return bool(self.streams) or self.core.num_held > 0

    async def stop(self) -> None:
        self.draining = True
        for task in [self._loop_task, *self._tasks]:
            if task is not None:
                task.cancel()
        for task in [self._loop_task, *self._tasks]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for runner in self._runners:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()
        if self.pd_sender is not None:
            self.pd_sender.close()
        if self.p2p is not None:
            await self.p2p.close()

    async def before_admission(self, request: GenerationRequest) -> None:
        """What LMCache does before vLLM can schedule a prompt: with p2p, find its prefix at a peer. A NIXL
        decode leg is looked up too (vLLM's MultiConnector asks every connector) but fetched by NIXL (the
        first connector with hits loads it: kv_connector/v1/multi_connector.py get_num_new_matched_tokens),
        so no peer sends it anything."""
        if self.p2p is not None:
            await self.p2p.lookup(request.prompt_token_ids, fetch=request.remote_prefill is None)

    def spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----- the engine loop (wall clock) -----

    def model_now(self) -> float:
        return (time.monotonic() - self._t0) / self.config.time_scale

    def wake(self) -> None:
        """Something changed outside the loop (a request, a read, a release): schedule again."""
        self._wake.set()

    async def _engine_loop(self) -> None:
        scale = self.config.time_scale
        previous_end: float | None = None
        while True:
            now = self.model_now()
            if previous_end is not None:
                behind = now - previous_end
                if behind <= SCHEDULE_SLACK_S / scale:
                    now = previous_end
                else:
                    # the process did not get the CPU in time: modelled time slips, and we say how much
                    self.metrics.schedule_lag.inc(behind * scale)
            retrieved = self.core.pd_buffer.retrieved_chunks if self.core.pd_buffer is not None else 0
            step = self.core.schedule(now)
            self._start_reads()  # admissions may have asked for KV reads from prefill engines
            buffer = self.core.pd_buffer
            if self.pd_receiver is not None and buffer is not None and buffer.retrieved_chunks != retrieved:
                self.pd_receiver.freed.set()  # allocations waiting for room look again
            if step is None:
                previous_end = None
                wake = self.core.next_wakeup()
                self._wake.clear()
                timeout = None if wake is None else max(0.0, (wake - self.model_now()) * scale)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            delay = (step.end - self.model_now()) * scale
            await asyncio.sleep(max(0.0, delay))
            previous_end = step.end
            for event in self.core.complete(step):
                self.deliver(event)
            for push in self.core.take_pd_pushes():
                if self.pd_sender is not None:
                    self.spawn(self.pd_sender.push(push))

    def deliver(self, event: TokenEvent | RequestFailed) -> None:
        """Hand an event to the request's stream, observing vLLM's latency histograms as tokens leave."""
        stream = self.streams.get(event.request_id)
        if stream is None:
            return
        wall = time.monotonic()
        if isinstance(event, TokenEvent):
            if stream.last_token_wall is None:
                self.metrics.ttft.observe(wall - stream.arrival_wall)
                stream.first_token_wall = wall
            else:
                self.metrics.itl.observe(wall - stream.last_token_wall)
            stream.last_token_wall = wall
            stream.tokens += 1
            if event.finish_reason is not None:
                self.metrics.e2e.observe(wall - stream.arrival_wall)
                first = wall if stream.first_token_wall is None else stream.first_token_wall
                self.metrics.tpot.observe(request_tpot(first, wall, stream.tokens))
        stream.queue.put_nowait(event)

    def _start_reads(self) -> None:
        for read in self.core.take_remote_reads():
            self.spawn(self.side_channel.remote_read(read))
