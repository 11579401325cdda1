"""LMCache PD mode (enable_pd) on the wire: the receiver's sockets and the sender's pushes.

A receiver (decode, pd_role receiver) listens on pd_peer_init_port[rank] and pd_peer_alloc_port[rank] for
every TP rank, at pd_peer_host; real LMCache answers a NIXL handshake on the first and allocation requests
(msgpack over ZMQ) on the second, then senders write by RDMA. The fake answers HTTP: GET /lmcache/pd/init
(handshake) and POST /lmcache/pd/alloc {"req_id", "keys"} (the chunk keys pushed; the port says which rank).
An allocation that can never fit is refused at once, one that does not fit now waits up to
pd_allocation_timeout_sec for requests to retrieve chunks (the only way chunks leave the buffer).

A sender (prefill, pd_role sender) pushes the prompt of every request whose kv_transfer_params carry a
disagg_spec once its prefill is done, without holding up the HTTP answer (LMCache's async PD backend does
the same), pays the modelled NIXL transfer time, and then sends one msgpack ProxyNotif per TP rank over a
real ZMQ PUSH socket to pd_proxy_host:pd_proxy_port, exactly as LMCache encodes it. A rank whose push fails
sends nothing, as in LMCache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

from aiohttp import ClientError, ClientTimeout, web

from inferencepool.engine_sim import protocol
from inferencepool.engine_sim.config import PdConfig
from inferencepool.engine_sim.core import PdPush
from inferencepool.engine_sim.host import EngineHost
from inferencepool.engine_sim.httputil import app_runner, bound_port, error_response, json_response, url_host
from inferencepool.perf import timing

log = logging.getLogger("inferencepool.fake_engine")


class PdReceiver:
    def __init__(self, engine: EngineHost, pd: PdConfig) -> None:
        self.engine = engine
        self.pd = pd
        self.init_ports: list[int] = []  # bound ports, rank order
        self.alloc_ports: list[int] = []
        self._rank_by_alloc_port: dict[int, int] = {}
        self.freed = asyncio.Event()  # set when requests retrieved chunks from the PD buffer

    async def start(self) -> web.AppRunner:
        pd = self.pd
        app = web.Application()
        app.add_routes(
            [
                web.get("/lmcache/pd/init", self._handle_init),
                web.post("/lmcache/pd/alloc", self._handle_alloc),
            ]
        )
        runner = await app_runner(app)
        for rank in range(self.engine.config.profile.tensor_parallel):
            init_site = web.TCPSite(runner, pd.peer_host, pd.init_ports[rank])
            alloc_site = web.TCPSite(runner, pd.peer_host, pd.alloc_ports[rank])
            await init_site.start()  # a busy port fails the engine, as LMCache's bind would
            await alloc_site.start()
            self.init_ports.append(bound_port(init_site))
            self.alloc_ports.append(bound_port(alloc_site))
            self._rank_by_alloc_port[self.alloc_ports[-1]] = rank
        log.info(
            "LMCache PD receiver on %s: init ports %s, alloc ports %s",
            pd.peer_host,
            self.init_ports,
            self.alloc_ports,
        )
        return runner

    async def _handle_init(self, request: web.Request) -> web.Response:
        return json_response({"engine_id": self.engine.config.engine_id})

    async def _handle_alloc(self, request: web.Request) -> web.Response:
        core = self.engine.core
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        rank = self._rank_by_alloc_port.get(sockname[1]) if sockname else None
        if rank is None:
            message = "allocation requests go to a pd_peer_alloc_port, not an init port"
            return error_response(404, "NotFoundError", message)
        try:
            body = protocol.parse_json_body(await request.read())
            keys = [bytes.fromhex(str(k)) for k in body["keys"]]
        except protocol.ApiError as exc:
            return json_response(exc.body(), exc.status)
        except (KeyError, TypeError, ValueError) as exc:
            return error_response(400, "BadRequestError", f"malformed alloc request: {exc}")
        assert core.pd_buffer is not None
        buffer = core.pd_buffer
        if not core.pd_can_ever_hold(len(keys)):
            # LMCache fails such a request at once instead of waiting for room that can never come
            reason = (
                f"PD receiver buffer too small: the request needs {len(keys)} chunks but the buffer holds "
                f"only {buffer.capacity_chunks} chunks"
            )
            core.stats.pd_rejected_chunks += len(keys)
            return self._refuse(body, reason)
        await self._wait_for_room(rank, len(keys), self.pd.allocation_timeout_s)
        if core.pd_offer(rank, keys):
            return json_response({"accepted": True})
        reason = (
            f"PD buffer full: {len(keys)} chunks do not fit beside {buffer.used_chunks} of "
            f"{buffer.capacity_chunks} within pd_allocation_timeout_sec"
        )
        return self._refuse(body, reason)

    def _refuse(self, body: dict[str, Any], reason: str) -> web.Response:
        log.warning("LMCache PD receiver refused request %s: %s", body.get("req_id"), reason)
        return json_response({"accepted": False, "reason": reason})

    async def _wait_for_room(self, rank: int, chunks: int, timeout_s: float) -> None:
        """LMCache's reservation admission: wait, up to pd_allocation_timeout_sec, until the chunks fit."""
        core = self.engine.core
        deadline = time.monotonic() + timeout_s * self.engine.config.time_scale
        while not core.pd_fits(rank, chunks):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.freed.clear()
            with contextlib.suppress(TimeoutError):
                # not wait_for, which can swallow a cancellation on Python 3.11
                async with asyncio.timeout(None if math.isinf(remaining) else remaining):
                    await self.freed.wait()


class PdSender:
    def __init__(self, engine: EngineHost, pd: PdConfig) -> None:
        import zmq
        import zmq.asyncio

        self.engine = engine
        self.pd = pd
        self._context = zmq.asyncio.Context()
        self._sockets: list[Any] = []  # one PUSH socket per TP rank
        self._peers: set[tuple[str, int]] = set()  # receivers this engine has handshaken with
        host = f"[{pd.proxy_host}]" if pd.proxy_host and ":" in pd.proxy_host else pd.proxy_host
        for _ in range(engine.config.profile.tensor_parallel):
            # one socket per TP rank, as each LMCache worker process connects its own
            socket = self._context.socket(zmq.PUSH)
            socket.setsockopt(zmq.LINGER, 0)
            if host and host.startswith("["):
                socket.setsockopt(zmq.IPV6, 1)
            socket.connect(f"tcp://{host}:{pd.proxy_port}")
            self._sockets.append(socket)
        log.info("LMCache PD sender: ProxyNotif to %s:%s", pd.proxy_host, pd.proxy_port)

    def close(self) -> None:
        for socket in self._sockets:
            socket.close()
        self._context.term()

    async def push(self, push: PdPush) -> None:
        core = self.engine.core
        ranks = range(self.engine.config.profile.tensor_parallel)
        results = await asyncio.gather(*(self._push_rank(push, rank) for rank in ranks))
        if all(results):
            core.stats.pd_pushes += 1
        else:
            core.stats.pd_push_failures += 1

    async def _push_rank(self, push: PdPush, rank: int) -> bool:
        """One TP rank's push: handshake (once per receiver), allocation, transfer, then its ProxyNotif."""
        import msgpack  # type: ignore[import-untyped]  # ships no type hints

        session, config = self.engine.session, self.engine.config
        spec = push.spec
        host = url_host(spec.receiver_host)
        init_port, alloc_port = spec.receiver_init_ports[rank], spec.receiver_alloc_ports[rank]
        timeout = ClientTimeout(total=self.pd.push_timeout_s)
        where = f"{spec.receiver_host} (init port {init_port}, alloc port {alloc_port})"
        try:
            if (spec.receiver_host, init_port) not in self._peers:
                async with session.get(
                    f"http://{host}:{init_port}/lmcache/pd/init", timeout=timeout
                ) as response:
                    response.raise_for_status()
                self._peers.add((spec.receiver_host, init_port))
            payload = {"req_id": spec.req_id, "keys": [key.hex() for key in push.chunk_keys]}
            # the receiver may hold the allocation until its buffer has room (pd_allocation_timeout_sec)
            waiting = ClientTimeout(total=None, sock_connect=self.pd.push_timeout_s)
            async with session.post(
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
        transfer_s = timing.nixl_transfer_time(config.profile, push.tokens)
        await asyncio.sleep(transfer_s * config.time_scale)
        notif = msgpack.packb({"type": "ProxyNotif", "req_id": spec.req_id})  # LMCache's msgspec bytes
        await self._sockets[rank].send(notif)
        return True
