"""The fake engine's HTTP shell: vLLM's OpenAI-compatible API around the pure EngineCore, driven in wall-clock
time. What it reproduces of vLLM and LMCache, and where in their code, is docs/engine-contract.md.

Two listeners, as vLLM has:
- the API port (--port): /v1/completions, /v1/chat/completions, /tokenize, /v1/models, /health, /version,
  /metrics;
- the NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_HOST:VLLM_NIXL_SIDE_CHANNEL_PORT, 5600 by default), only when
  a NIXL connector is configured. Real vLLM answers a ZMQ handshake there and then reads KV blocks by RDMA;
  the fake answers HTTP on the same address: a decode engine POSTs /nixl/read_blocks naming the prefill
  engine, request and blocks from kv_transfer_params, which releases the prefill engine's lease (or fails:
  wrong engine, unknown or expired request), and the decode engine then pays the modelled transfer time. Its
  /lmcache/chunks lists the prefix chunks this engine's LMCache CPU tier holds, which p2p peers mirror into
  their prefix index.
- LMCache PD mode (enable_pd). A receiver (decode, pd_role receiver) listens on pd_peer_init_port[rank] and
  pd_peer_alloc_port[rank] for every TP rank, at pd_peer_host; real LMCache answers a NIXL handshake on the
  first and allocation requests (msgpack over ZMQ) on the second, then senders write by RDMA. The fake answers
  HTTP: GET /lmcache/pd/init (handshake) and POST /lmcache/pd/alloc {"req_id", "keys"} (the chunk hashes
  pushed; the port says which rank). A sender (prefill, pd_role sender) pushes the prompt of every request
  whose kv_transfer_params carry a disagg_spec once its prefill is done, without holding up the HTTP answer
  (LMCache's async PD backend does the same), pays the modelled NIXL transfer time, and then sends one
  msgpack ProxyNotif per TP rank over a real ZMQ PUSH socket to pd_proxy_host:pd_proxy_port, exactly as
  LMCache encodes it. A rank whose push fails sends nothing, as in LMCache.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inferencepool import __version__
from inferencepool.engine_sim import protocol, timing
from inferencepool.engine_sim.core import (
    EngineCore,
    EngineRequest,
    LmcacheSettings,
    PdPush,
    RemoteRead,
    RequestFailed,
    TokenEvent,
)
from inferencepool.engine_sim.kv import SharedPrefixIndex
from inferencepool.engine_sim.metrics import EngineMetrics
from inferencepool.engine_sim.profiles import EngineProfile
from inferencepool.engine_sim.tokenizer import EstimateTokenizer, Tokenizer

log = logging.getLogger("inferencepool.fake_engine")

VLLM_VERSION = "0.33.0"  # the vLLM release whose API this fake reproduces
READ_TIMEOUT_S = 10.0
# drain() already waited for streams; on cleanup, whatever is still open is cut after this
CUT_OPEN_STREAMS_AFTER_S = 0.5
# A step may start this far behind schedule and still be charged from where the previous one ended, so timer
# overshoot of asyncio.sleep does not accumulate into ITL; beyond it the engine is CPU-bound and time slips.
SCHEDULE_SLACK_S = 0.003


@dataclass(frozen=True)
class PdConfig:
    """LMCache PD mode's sockets (the buffer size and role also go to LmcacheSettings for the core)."""

    role: str  # "sender" (prefill) or "receiver" (decode)
    peer_host: str = "127.0.0.1"  # receiver: where it listens (pd_peer_host, the pod IP)
    init_ports: tuple[int, ...] = (0,)  # receiver: pd_peer_init_port, one per TP rank (0: any free port)
    alloc_ports: tuple[int, ...] = (0,)  # receiver: pd_peer_alloc_port
    proxy_host: str | None = None  # sender: pd_proxy_host, the router
    proxy_port: int | None = None  # sender: pd_proxy_port
    push_timeout_s: float = 5.0  # sender: connect/handshake timeout of one rank (allocation waits longer)
    # receiver: how long an allocation waits for room in the PD buffer (LMCache's default: forever)
    allocation_timeout_s: float = math.inf

    def __post_init__(self) -> None:
        if self.role == "sender" and (self.proxy_host is None or self.proxy_port is None):
            raise ValueError("an LMCache PD sender needs pd_proxy_host and pd_proxy_port")
        if self.role == "receiver" and (not self.init_ports or len(self.init_ports) != len(self.alloc_ports)):
            raise ValueError(
                "an LMCache PD receiver needs one pd_peer_init_port and pd_peer_alloc_port per rank"
            )
        if self.role not in ("sender", "receiver"):
            raise ValueError(f'pd_role must be "sender" or "receiver", got {self.role!r}')


@dataclass
class EngineConfig:
    profile: EngineProfile
    served_model_names: list[str]
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    nixl: bool = False
    side_channel_host: str = "127.0.0.1"
    side_channel_port: int = 5600
    kv_lease_s: float = 30.0
    recompute_on_load_failure: bool = False  # kv_load_failure_policy "recompute" instead of "fail"
    lmcache: LmcacheSettings | None = None
    p2p_peers: list[str] = field(default_factory=list)  # side-channel "host:port" of peers, for p2p mirrors
    p2p_refresh_s: float = 0.5
    prefix_caching: bool = True
    chunk_tokens: int = 256
    time_scale: float = 1.0
    tokenizer: Tokenizer = field(default_factory=EstimateTokenizer)
    role: str = "both"
    pd: PdConfig | None = None  # LMCache PD mode (needs lmcache with the same pd_role)


@dataclass
class _Stream:
    queue: asyncio.Queue[TokenEvent | RequestFailed]
    arrival_wall: float
    last_token_wall: float | None = None


class FakeEngine:
    def __init__(self, config: EngineConfig) -> None:
        if config.time_scale <= 0:
            raise ValueError("time scale must be > 0")
        pd_role = config.lmcache.pd_role if config.lmcache else None
        if (config.pd.role if config.pd else None) != pd_role:
            raise ValueError("LMCache PD mode needs both EngineConfig.pd and LmcacheSettings.pd_role, alike")
        if (
            config.pd
            and config.pd.role == "receiver"
            and len(config.pd.init_ports) < config.profile.tensor_parallel
        ):
            raise ValueError(
                f"pd_peer_init_port/pd_peer_alloc_port need one port per TP rank "
                f"({config.profile.tensor_parallel}), got {len(config.pd.init_ports)}"
            )
        self.config = config
        self.prefix_index = SharedPrefixIndex() if config.lmcache and config.lmcache.p2p else None
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
        self.metrics = EngineMetrics(self.core, config.served_model_names[0])
        self._streams: dict[str, _Stream] = {}
        self._wake = asyncio.Event()
        self._draining = False
        self._t0 = time.monotonic()
        self._loop_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._session: ClientSession | None = None
        self._runners: list[web.AppRunner] = []
        self._api_site: web.TCPSite | None = None
        self._ids = itertools.count()
        self.port: int | None = None
        self.side_channel_port: int | None = None
        # LMCache PD: the receiver's bound ports (rank order), the sender's PUSH sockets (one per rank)
        self.pd_init_ports: list[int] = []
        self.pd_alloc_ports: list[int] = []
        self._pd_rank_by_alloc_port: dict[int, int] = {}
        self._pd_context: Any = None
        self._pd_sockets: list[Any] = []
        self._pd_peers: set[tuple[str, int]] = set()
        self._pd_freed = asyncio.Event()  # set when requests retrieved chunks from the PD buffer

    # ----- lifecycle -----

    async def start(self) -> None:
        self._session = ClientSession(timeout=ClientTimeout(total=READ_TIMEOUT_S))
        self._loop_task = asyncio.create_task(self._engine_loop(), name="engine-loop")
        if self.config.nixl or self.config.lmcache:
            self.side_channel_port = await self._start_side_channel()
        if self.config.pd is not None and self.config.pd.role == "receiver":
            await self._start_pd_receiver(self.config.pd)
        if self.config.pd is not None and self.config.pd.role == "sender":
            self._start_pd_sender(self.config.pd)
        runner = web.AppRunner(
            self.api_app(), access_log=None, handle_signals=False, shutdown_timeout=CUT_OPEN_STREAMS_AFTER_S
        )
        await runner.setup()
        self._runners.append(runner)
        self._api_site = web.TCPSite(runner, self.config.host, self.config.port)
        await self._api_site.start()
        self.port = _bound_port(self._api_site)
        if self.prefix_index is not None and self.config.p2p_peers:
            self._spawn(self._mirror_peers())
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

    async def _peer_runner(self, *routes: web.RouteDef) -> web.AppRunner:
        """A set-up runner for an engine-to-engine endpoint (stopped with the engine's other runners)."""
        app = web.Application()
        app.add_routes(routes)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=CUT_OPEN_STREAMS_AFTER_S
        )
        await runner.setup()
        self._runners.append(runner)
        return runner

    async def _start_side_channel(self) -> int:
        runner = await self._peer_runner(
            web.post("/nixl/read_blocks", self._handle_read_blocks),
            web.get("/lmcache/chunks", self._handle_lmcache_chunks),
        )
        site = web.TCPSite(runner, self.config.side_channel_host, self.config.side_channel_port)
        try:
            await site.start()
        except OSError as exc:
            # Two fake engines on one address (a laptop, not a pod) would both want 5600; vLLM would fail
            # here.
            log.warning(
                "side channel port %s unavailable (%s); using an ephemeral port",
                self.config.side_channel_port,
                exc,
            )
            site = web.TCPSite(runner, self.config.side_channel_host, 0)
            await site.start()
        return _bound_port(site)

    async def _start_pd_receiver(self, pd: PdConfig) -> None:
        runner = await self._peer_runner(
            web.get("/lmcache/pd/init", self._handle_pd_init),
            web.post("/lmcache/pd/alloc", self._handle_pd_alloc),
        )
        for rank in range(self.config.profile.tensor_parallel):
            init_site = web.TCPSite(runner, pd.peer_host, pd.init_ports[rank])
            alloc_site = web.TCPSite(runner, pd.peer_host, pd.alloc_ports[rank])
            await init_site.start()  # a busy port fails the engine, as LMCache's bind would
            await alloc_site.start()
            self.pd_init_ports.append(_bound_port(init_site))
            self.pd_alloc_ports.append(_bound_port(alloc_site))
            self._pd_rank_by_alloc_port[self.pd_alloc_ports[-1]] = rank
        log.info(
            "LMCache PD receiver on %s: init ports %s, alloc ports %s",
            pd.peer_host,
            self.pd_init_ports,
            self.pd_alloc_ports,
        )

    def _start_pd_sender(self, pd: PdConfig) -> None:
        import zmq
        import zmq.asyncio

        self._pd_context = zmq.asyncio.Context()
        host = f"[{pd.proxy_host}]" if pd.proxy_host and ":" in pd.proxy_host else pd.proxy_host
        for _ in range(self.config.profile.tensor_parallel):
            # one socket per TP rank, as each LMCache worker process connects its own
            socket = self._pd_context.socket(zmq.PUSH)
            socket.setsockopt(zmq.LINGER, 0)
            if host and host.startswith("["):
                socket.setsockopt(zmq.IPV6, 1)
            socket.connect(f"tcp://{host}:{pd.proxy_port}")
            self._pd_sockets.append(socket)
        log.info("LMCache PD sender: ProxyNotif to %s:%s", pd.proxy_host, pd.proxy_port)

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting requests and wait (bounded) for in-flight ones and for the KV this engine holds for
        remote decodes (read, or released when its lease expires), as vLLM drains with --shutdown-timeout;
        True when nothing was left. The NIXL side channel keeps answering meanwhile."""
        self._draining = True
        if self._api_site is not None:
            await self._api_site.stop()  # closes the listening socket; open connections keep streaming
        deadline = time.monotonic() + timeout_s
        while self._busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not self._busy()

    def _busy(self) -> bool:
        return bool(self._streams) or self.core.num_held > 0

    async def stop(self) -> None:
        self._draining = True
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
        for socket in self._pd_sockets:
            socket.close()
        if self._pd_context is not None:
            self._pd_context.term()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----- the engine loop (wall clock) -----

    def _model_now(self) -> float:
        return (time.monotonic() - self._t0) / self.config.time_scale

    async def _engine_loop(self) -> None:
        scale = self.config.time_scale
        previous_end: float | None = None
        while True:
            now = self._model_now()
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
            if self.core.pd_buffer is not None and self.core.pd_buffer.retrieved_chunks != retrieved:
                self._pd_freed.set()  # allocations waiting for room look again
            if step is None:
                previous_end = None
                wake = self.core.next_wakeup()
                self._wake.clear()
                timeout = None if wake is None else max(0.0, (wake - self._model_now()) * scale)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            delay = (step.end - self._model_now()) * scale
            await asyncio.sleep(max(0.0, delay))
            previous_end = step.end
            for event in self.core.complete(step):
                self._deliver(event)
            for push in self.core.take_pd_pushes():
                self._spawn(self._pd_push(push))

    def _deliver(self, event: TokenEvent | RequestFailed) -> None:
        stream = self._streams.get(event.request_id)
        if stream is None:
            return
        wall = time.monotonic()
        if isinstance(event, TokenEvent):
            if stream.last_token_wall is None:
                self.metrics.ttft.observe(wall - stream.arrival_wall)
            else:
                self.metrics.itl.observe(wall - stream.last_token_wall)
            stream.last_token_wall = wall
            if event.finish_reason is not None:
                self.metrics.e2e.observe(wall - stream.arrival_wall)
        stream.queue.put_nowait(event)

    def _start_reads(self) -> None:
        for read in self.core.take_remote_reads():
            self._spawn(self._remote_read(read))

    async def _remote_read(self, read: RemoteRead) -> None:
        source = read.source
        url = f"http://{_url_host(source.host)}:{source.port}/nixl/read_blocks"
        payload = {
            "engine_id": source.engine_id,
            "request_id": source.request_id,
            "block_ids": list(source.block_ids),
        }
        error: str | None = None
        assert self._session is not None
        try:
            async with self._session.post(url, json=payload) as response:
                if response.status != 200:
                    detail = (await response.json(content_type=None)).get("error", {}).get("message", "")
                    error = (
                        f"KV transfer from engine {source.engine_id} at {source.host}:{source.port} "
                        f"failed: {detail}"
                    )
        except (ClientError, TimeoutError, ValueError) as exc:
            error = (
                f"KV transfer from engine {source.engine_id} at {source.host}:{source.port} failed: "
                f"cannot reach its NIXL side channel ({exc.__class__.__name__}: {exc})"
            )
        failure = self.core.remote_read_done(read.request_id, self._model_now(), error)
        if failure is not None:
            self._deliver(failure)
        self._wake.set()

    async def _pd_push(self, push: PdPush) -> None:
        ranks = range(self.config.profile.tensor_parallel)
        results = await asyncio.gather(*(self._pd_push_rank(push, rank) for rank in ranks))
        if all(results):
            self.core.stats.pd_pushes += 1
        else:
            self.core.stats.pd_push_failures += 1

    async def _pd_push_rank(self, push: PdPush, rank: int) -> bool:
        """One TP rank's push: handshake (once per receiver), allocation, transfer, then its ProxyNotif."""
        import msgpack  # type: ignore[import-untyped]  # ships no type hints

        assert self._session is not None and self.config.pd is not None
        spec = push.spec
        host = _url_host(spec.receiver_host)
        init_port, alloc_port = spec.receiver_init_ports[rank], spec.receiver_alloc_ports[rank]
        timeout = ClientTimeout(total=self.config.pd.push_timeout_s)
        where = f"{spec.receiver_host} (init port {init_port}, alloc port {alloc_port})"
        try:
            if (spec.receiver_host, init_port) not in self._pd_peers:
                async with self._session.get(
                    f"http://{host}:{init_port}/lmcache/pd/init", timeout=timeout
                ) as response:
                    response.raise_for_status()
                self._pd_peers.add((spec.receiver_host, init_port))
            payload = {"req_id": spec.req_id, "keys": [key.hex() for key in push.chunk_keys]}
            # the receiver may hold the allocation until its buffer has room (pd_allocation_timeout_sec)
            waiting = ClientTimeout(total=None, sock_connect=self.config.pd.push_timeout_s)
            async with self._session.post(
                f"http://{host}:{alloc_port}/lmcache/pd/alloc", json=payload, timeout=waiting
            ) as response:
                response.raise_for_status()
                answer = await response.json()
        except (ClientError, TimeoutError, ValueError) as exc:
            log.warning(
                "LMCache PD push of request %s (rank %d) to %s failed: %s: %s",
                spec.req_id,
                rank,
                where,
                exc.__class__.__name__,
                exc,
            )
            return False
        if not answer.get("accepted"):
            log.warning(
                "LMCache PD push of request %s (rank %d) refused by %s: %s",
                spec.req_id,
                rank,
                where,
                answer.get("reason", "no reason given"),
            )
            return False
        transfer_s = timing.nixl_transfer_time(self.config.profile, push.tokens)
        await asyncio.sleep(transfer_s * self.config.time_scale)
        notif = msgpack.packb({"type": "ProxyNotif", "req_id": spec.req_id})  # LMCache's msgspec bytes
        await self._pd_sockets[rank].send(notif)
        return True

    async def _mirror_peers(self) -> None:
        """Keep the p2p prefix index in step with peers' LMCache CPU tiers (as LMCache's controller does)."""
        assert self._session is not None and self.prefix_index is not None
        while True:
            for peer in self.config.p2p_peers:
                try:
                    async with self._session.get(f"http://{peer}/lmcache/chunks") as response:
                        body = await response.json()
                    self.prefix_index.replace_engine(
                        body["engine_id"], [bytes.fromhex(h) for h in body["chunks"]]
                    )
                except (ClientError, TimeoutError, ValueError, KeyError) as exc:
                    log.debug("p2p peer %s not reachable: %s", peer, exc)
            await asyncio.sleep(self.config.p2p_refresh_s)

    # ----- side channel -----

    async def _handle_read_blocks(self, request: web.Request) -> web.Response:
        try:
            body = protocol.parse_json_body(await request.read())
            release = self.core.release_hold(
                str(body["request_id"]),
                str(body["engine_id"]),
                self._model_now(),
                tuple(int(b) for b in body.get("block_ids", [])),
            )
        except protocol.ApiError as exc:
            return _json(exc.body(), exc.status)
        except (KeyError, TypeError, ValueError) as exc:
            return _json(protocol.error_body(400, "BadRequestError", f"malformed read request: {exc}"), 400)
        except LookupError as exc:
            return _json(protocol.error_body(404, "NotFoundError", str(exc.args[0])), 404)
        self._wake.set()
        return _json({"prompt_tokens": release.prompt_tokens, "engine_id": self.config.engine_id})

    async def _handle_pd_init(self, request: web.Request) -> web.Response:
        return _json({"engine_id": self.config.engine_id})

    async def _handle_pd_alloc(self, request: web.Request) -> web.Response:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        rank = self._pd_rank_by_alloc_port.get(sockname[1]) if sockname else None
        if rank is None:
            message = "allocation requests go to a pd_peer_alloc_port, not an init port"
            return _json(protocol.error_body(404, "NotFoundError", message), 404)
        try:
            body = protocol.parse_json_body(await request.read())
            keys = [bytes.fromhex(str(k)) for k in body["keys"]]
        except protocol.ApiError as exc:
            return _json(exc.body(), exc.status)
        except (KeyError, TypeError, ValueError) as exc:
            return _json(protocol.error_body(400, "BadRequestError", f"malformed alloc request: {exc}"), 400)
        assert self.config.pd is not None and self.core.pd_buffer is not None
        buffer = self.core.pd_buffer
        if not self.core.pd_can_ever_hold(len(keys)):
            # LMCache fails such a request at once instead of waiting for room that can never come
            reason = (
                f"PD receiver buffer too small: the request needs {len(keys)} chunks but the buffer holds "
                f"only {buffer.capacity_chunks} chunks"
            )
        else:
            await self._wait_for_pd_room(rank, len(keys), self.config.pd.allocation_timeout_s)
            if self.core.pd_offer(rank, keys):
                return _json({"accepted": True})
            reason = (
                f"PD buffer full: {len(keys)} chunks do not fit beside {buffer.used_chunks} of "
                f"{buffer.capacity_chunks} within pd_allocation_timeout_sec"
            )
            return self._pd_refuse(body, reason)
        self.core.stats.pd_rejected_chunks += len(keys)
        return self._pd_refuse(body, reason)

    def _pd_refuse(self, body: dict[str, Any], reason: str) -> web.Response:
        log.warning("LMCache PD receiver refused request %s: %s", body.get("req_id"), reason)
        return _json({"accepted": False, "reason": reason})

    async def _wait_for_pd_room(self, rank: int, chunks: int, timeout_s: float) -> None:
        """LMCache's reservation admission: wait, up to pd_allocation_timeout_sec, until the chunks fit."""
        deadline = time.monotonic() + timeout_s * self.config.time_scale
        while not self.core.pd_fits(rank, chunks):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._pd_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._pd_freed.wait(), None if math.isinf(remaining) else remaining)

    async def _handle_lmcache_chunks(self, request: web.Request) -> web.Response:
        return _json(
            {"engine_id": self.config.engine_id, "chunks": [c.hex() for c in self.core.cpu_chunks()]}
        )

    # ----- API -----

    def api_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self._draining else 200)

    async def _version(self, request: web.Request) -> web.Response:
        return _json(
            {
                "version": VLLM_VERSION,
                "fake_engine": {
                    "inferencepool": __version__,
                    "profile": self.config.profile.name,
                    "tokenizer": self.config.tokenizer.name,
                    "engine_id": self.config.engine_id,
                    "role": self.config.role,
                },
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": self.config.model,
                "parent": None,
                "max_model_len": self.config.profile.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.config.served_model_names
        ]
        return _json({"object": "list", "data": data})

    async def _tokenize(self, request: web.Request) -> web.Response:
        try:
            body = protocol.parse_json_body(await request.read())
            result = protocol.tokenize(
                body, self.config.served_model_names, self.config.tokenizer, self.config.profile.max_model_len
            )
        except protocol.ApiError as exc:
            return _json(exc.body(), exc.status)
        return _json(result)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate("completion", request)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate("chat", request)

    def _new_request_id(self, request: web.Request, kind: protocol.Kind) -> str:
        base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        request_id = protocol.response_id(kind, base)
        if request_id in self._streams or self.core.has_request(request_id):
            request_id = f"{request_id}-{next(self._ids)}"
        return request_id

    async def _generate(self, kind: protocol.Kind, request: web.Request) -> web.StreamResponse:
        if self._draining:
            return _json(
                protocol.error_body(503, "ServiceUnavailableError", "The engine is shutting down."), 503
            )
        arrival_wall = time.monotonic()
        try:
            body = protocol.parse_json_body(await request.read())
            req = protocol.parse_generation(
                kind,
                body,
                self.config.served_model_names,
                self.config.tokenizer,
                self.config.profile.max_model_len,
            )
            self._check_disagg(req)
        except protocol.ApiError as exc:
            return _json(exc.body(), exc.status)
        request_id = self._new_request_id(request, kind)
        stream = _Stream(queue=asyncio.Queue(), arrival_wall=arrival_wall)
        self._streams[request_id] = stream
        finished = False
        try:
            self.core.add_request(
                EngineRequest(
                    request_id=request_id,
                    prompt_token_ids=req.prompt_token_ids,
                    output_tokens=req.output_tokens,
                    finish_reason=req.finish_reason,
                    remote_prefill=req.remote_prefill,
                    remote_decode=req.remote_decode,
                    disagg=req.disagg,
                ),
                self._model_now(),
            )
            self._wake.set()
            headers = {"X-Request-Id": request.headers.get("X-Request-Id", request_id)}
            response: web.StreamResponse
            if req.stream:
                response, finished = await self._stream_response(request, req, request_id, stream, headers)
            else:
                response, finished = await self._full_response(req, request_id, stream, headers)
            return response
        finally:
            del self._streams[request_id]
            if not finished:
                self.core.abort(request_id)
                self._wake.set()

    def _check_disagg(self, req: protocol.GenerationRequest) -> None:
        tp = self.config.profile.tensor_parallel
        pd = self.config.pd
        if req.disagg is None or pd is None or pd.role != "sender":
            return
        if min(len(req.disagg.receiver_init_ports), len(req.disagg.receiver_alloc_ports)) < tp:
            param = "kv_transfer_params.disagg_spec"
            raise protocol.bad_request(
                f"{param} needs one receiver_init_port and receiver_alloc_port per TP rank ({tp})", param
            )

    def _first_token_id(self, req: protocol.GenerationRequest) -> int:
        ids = self.config.tokenizer.encode(self.config.tokenizer.output_piece(req.seed, 0))
        return ids[0] if ids else 0

    async def _full_response(
        self, req: protocol.GenerationRequest, request_id: str, stream: _Stream, headers: dict[str, str]
    ) -> tuple[web.Response, bool]:
        pieces: list[str] = []
        while True:
            event = await stream.queue.get()
            if isinstance(event, RequestFailed):
                return _json(
                    protocol.error_body(500, "InternalServerError", event.message), 500, headers
                ), True
            pieces.append(self.config.tokenizer.output_piece(req.seed, event.index))
            if event.finish_reason is None:
                continue
            kv_params = None
            if event.kv_hold is not None:
                kv_params = protocol.kv_transfer_params_for(
                    self.config.engine_id,
                    request_id,
                    event.kv_hold.block_ids,
                    self.config.side_channel_host,
                    self.side_channel_port or self.config.side_channel_port,
                    self.config.profile.tensor_parallel,
                )
            elif req.ret_first_tok:
                kv_params = {"first_tok": self._first_token_id(req)}  # LMCache's request_finished
            body = protocol.full_response(
                req, request_id, "".join(pieces), len(pieces), event.finish_reason, kv_params
            )
            return _json(body, 200, headers), True

    async def _stream_response(
        self,
        request: web.Request,
        req: protocol.GenerationRequest,
        request_id: str,
        stream: _Stream,
        headers: dict[str, str],
    ) -> tuple[web.StreamResponse, bool]:
        response = web.StreamResponse(
            headers={
                **headers,
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        await response.prepare(request)
        encoder = protocol.StreamEncoder(req, request_id)
        write: Callable[[bytes], Awaitable[None]] = response.write
        tokens = 0
        try:
            role = encoder.role_chunk()
            if role is not None:
                await write(role)
            while True:
                event = await stream.queue.get()
                if isinstance(event, RequestFailed):
                    await write(encoder.error_chunk(500, "InternalServerError", event.message))
                    await write(encoder.done())
                    return response, True
                tokens += 1
                piece = self.config.tokenizer.output_piece(req.seed, event.index)
                if event.finish_reason is None:
                    await write(encoder.token_chunk(piece))
                    continue
                await write(encoder.final_chunk(piece, event.finish_reason))
                if req.include_usage:
                    await write(encoder.usage_chunk(tokens))
                await write(encoder.done())
                return response, True
        except ConnectionResetError:
            return response, False  # the client went away; the caller aborts the request


def _json(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(body).encode(), status=status, content_type="application/json", headers=headers
    )


def _bound_port(site: web.TCPSite) -> int:
    server = site._server
    assert server is not None and isinstance(server, asyncio.base_events.Server)
    port: int = server.sockets[0].getsockname()[1]
    return port


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
