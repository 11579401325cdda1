"""The router's side of LMCache PD mode: the ZMQ PULL socket prefill engines report finished KV pushes to.

What LMCache 0.5.6 does (read in its wheel; paths under lmcache/):
- The router sends the prefill engine (kv_role kv_producer, pd_role sender) `kv_transfer_params.disagg_spec`
  {req_id, receiver_host, receiver_init_port: [per TP rank], receiver_alloc_port: [per TP rank]}; the
  scheduler copies it into a DisaggSpec (integration/vllm/vllm_v1_adapter.py:1560-1575). Without a
  disagg_spec nothing is pushed (v1/storage_backend/pd_backend.py:525-528).
- After each forward pass, wait_for_save stores the computed chunks with transfer_spec=disagg_spec
  (vllm_v1_adapter.py:1227); the storage manager's batched_put is non-blocking (storage_manager.py:386) and
  the default async PD backend only schedules the push on its own loop (pd_backend_async.py:1046-1090). So
  the HTTP answer to the prefill leg does not wait for the KV push: it can come before the push lands.
- Each TP rank runs its own PD backend: it takes receiver_init_port[rank] / receiver_alloc_port[rank]
  (pd_backend_async.py:1068), asks the receiver to allocate (AllocRequest on the alloc port), writes by NIXL,
  and once every batch of the request is written and the is_last_prefill batch was seen, sends one ProxyNotif
  on its own PUSH socket connected to pd_proxy_host:pd_proxy_port (pd_backend_async.py:680-689, 1003-1044).
  So the router gets one notification per TP rank; the KV is usable once all of them arrived. A failed
  allocation or write aborts the request and sends no ProxyNotif (pd_backend_async.py:975-989; sync backend:
  pd_backend.py:650-654), so a missing notification is the only failure signal the router gets.
- The encoding is msgspec's tagged struct (`class PDMsgBase(msgspec.Struct, tag=True)`,
  pd_backend_async.py:45): a msgpack map {"type": "ProxyNotif", "req_id": <str>}, byte-identical to
  msgpack.packb of that dict.
- The decode engine (kv_consumer, pd_role receiver) stores the pushed chunks under their token-chunk hashes
  (CacheEngineKey), not under the request id (pd_backend_async.py _async_allocate_and_put); a later request
  finds them through the normal LMCache lookup of its prompt tokens, minus skip_last_n_tokens
  (vllm_v1_adapter.py:1428). The request id only ties the ProxyNotif to the router's request.
- `ret_first_tok` in kv_transfer_params makes the prefill engine return {"first_tok": <first output token id>}
  as the response's kv_transfer_params (vllm_v1_adapter.py:1922-1927). LMCache's xp1d proxy sends the decode
  leg the prompt as token ids plus that token, max_tokens - 1, streams the prefill's text as the first chunk,
  and waits for the ProxyNotif before opening the decode leg.

This module is only the notification listener; it lives on the router's event loop and needs no HTTP library.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import msgpack  # type: ignore[import-untyped]  # ships no type hints
import zmq
import zmq.asyncio

log = logging.getLogger("inferencepool.router.lmcache_pd")

PROXY_NOTIF_TYPE = "ProxyNotif"
# A ProxyNotif is a few dozen bytes; anything much larger is not one (libzmq drops such a peer).
MAX_MESSAGE_BYTES = 64 * 1024


@dataclass
class PDNotificationStats:
    received: int = 0  # well-formed ProxyNotif messages
    malformed: int = 0  # messages that were not a ProxyNotif (bad msgpack, wrong shape, multipart)
    unclaimed: int = 0  # notifications nobody expect()ed before they expired or were pushed out


def encode_proxy_notif(req_id: str) -> bytes:
    """A ProxyNotif exactly as LMCache's msgspec encoder writes it (for tests and the fake engine)."""
    packed: bytes = msgpack.packb({"type": PROXY_NOTIF_TYPE, "req_id": req_id})
    return packed


def decode_proxy_notif(frame: bytes) -> str:
    """The req_id of a ProxyNotif; ValueError naming the problem for anything else."""
    try:
        message = msgpack.unpackb(frame, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ValueError(f"not msgpack: {exc.__class__.__name__}: {exc}") from None
    if not isinstance(message, dict):
        raise ValueError(f"expected a msgpack map, got {type(message).__name__}")
    if message.get("type") != PROXY_NOTIF_TYPE:
        raise ValueError(f"expected type {PROXY_NOTIF_TYPE!r}, got {message.get('type')!r}")
    req_id = message.get("req_id")
    if not isinstance(req_id, str) or not req_id:
        raise ValueError(f"ProxyNotif without a string req_id: {req_id!r}")
    return req_id


class PDNotifications:
    """Collects ProxyNotif messages and hands them to the requests waiting for them.

    Build it inside the router's running event loop. A notification that arrives before its request called
    expect() (the prefill engine can be faster than the router's bookkeeping) is kept for `retention_s`, at
    most `max_unclaimed` of them, oldest dropped first.
    """

    def __init__(self, *, retention_s: float = 60.0, max_unclaimed: int = 10_000) -> None:
        if retention_s <= 0 or max_unclaimed <= 0:
            raise ValueError("retention_s and max_unclaimed must be > 0")
        self._loop = asyncio.get_running_loop()
        self._retention_s = retention_s
        self._max_unclaimed = max_unclaimed
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        # req_id -> (ranks still awaited, future)
        self._waiting: dict[str, tuple[int, asyncio.Future[None]]] = {}
        # req_id -> (notifications so far, monotonic time of the first), oldest first
        self._unclaimed: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.stats = PDNotificationStats()
        self.port: int | None = None

    async def start(self, host: str, port: int) -> int:
        """Bind the PULL socket (port 0: any free port) and return the bound port."""
        if self._socket is not None:
            raise RuntimeError("PDNotifications already started")
        context = zmq.asyncio.Context()
        socket = context.socket(zmq.PULL)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        bind_host = host
        if ":" in host:
            socket.setsockopt(zmq.IPV6, 1)
            bind_host = f"[{host}]"
        try:
            socket.bind(f"tcp://{bind_host}:{port if port else '*'}")
        except zmq.ZMQError as exc:
            socket.close()
            context.term()
            raise OSError(f"cannot bind the LMCache PD notification socket on {host}:{port}: {exc}") from None
        endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(endpoint, bytes)
        self.port = int(endpoint.decode().rsplit(":", 1)[1])
        self._context, self._socket = context, socket
        self._task = asyncio.create_task(self._receive(socket), name="lmcache-pd-notifications")
        log.info("LMCache PD notifications on %s:%s", host, self.port)
        return self.port

    def expect(self, req_id: str, ranks: int = 1) -> asyncio.Future[None]:
        """A future done once `ranks` ProxyNotif for req_id arrived (counting those already here).

        Cancel it, or call discard(), to give up; bound the wait with asyncio.wait_for.
        """
        if ranks < 1:
            raise ValueError("ranks must be >= 1")
        if req_id in self._waiting:
            raise ValueError(f"already waiting for ProxyNotif of request {req_id!r}")
        if self._socket is None:
            raise RuntimeError("PDNotifications is not started (or closed)")
        future: asyncio.Future[None] = self._loop.create_future()
        self._expire(time.monotonic())
        early, _ = self._unclaimed.pop(req_id, (0, 0.0))
        remaining = ranks - early
        if remaining <= 0:
            future.set_result(None)
            return future
        self._waiting[req_id] = (remaining, future)
        future.add_done_callback(lambda done: self._forget(req_id, done))
        return future

    def discard(self, req_id: str) -> None:
        """Stop waiting for req_id; notifications already kept for it are dropped."""
        entry = self._waiting.pop(req_id, None)
        if entry is not None:
            entry[1].cancel()
        self._unclaimed.pop(req_id, None)

    @property
    def pending(self) -> int:
        return len(self._waiting)

    @property
    def unclaimed(self) -> int:
        return len(self._unclaimed)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for _, future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("LMCache PD notification socket closed"))
        self._waiting.clear()
        self._unclaimed.clear()
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._context is not None:
            self._context.term()
            self._context = None

    # ----- internals -----

    def _forget(self, req_id: str, future: asyncio.Future[None]) -> None:
        entry = self._waiting.get(req_id)
        if entry is not None and entry[1] is future:
            del self._waiting[req_id]

    async def _receive(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            if len(frames) != 1:
                self._malformed(f"{len(frames)} frames, expected 1")
                continue
            try:
                req_id = decode_proxy_notif(frames[0])
            except ValueError as exc:
                self._malformed(str(exc))
                continue
            self.stats.received += 1
            self._deliver(req_id)

    def _malformed(self, why: str) -> None:
        self.stats.malformed += 1
        log.warning("ignoring a malformed LMCache PD notification: %s", why)

    def _deliver(self, req_id: str) -> None:
        entry = self._waiting.get(req_id)
        if entry is not None:
            remaining, future = entry
            if remaining > 1:
                self._waiting[req_id] = (remaining - 1, future)
                return
            del self._waiting[req_id]
            if not future.done():
                future.set_result(None)
            return
        now = time.monotonic()
        self._expire(now)
        count, first = self._unclaimed.get(req_id, (0, now))
        self._unclaimed[req_id] = (count + 1, first)  # keeps its place: the order is by first arrival
        while len(self._unclaimed) > self._max_unclaimed:
            self._unclaimed.popitem(last=False)
            self.stats.unclaimed += 1

    def _expire(self, now: float) -> None:
        while self._unclaimed:
            req_id, (_, first) = next(iter(self._unclaimed.items()))
            if now - first < self._retention_s:
                return
            del self._unclaimed[req_id]
            self.stats.unclaimed += 1
