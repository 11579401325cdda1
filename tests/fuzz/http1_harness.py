"""Drive router/http1.py without sockets, for the fuzz target and the conformance tests.

`serve_bytes` feeds bytes, cut into pieces, to the server side of one client connection and returns what
the router made of them (the requests its handler saw, the bytes it wrote back, whether it closed);
`read_response` does the same for the client side (an engine's answer, relayed). `h11_requests` and
`h11_response` are what h11, a strict and well-known HTTP/1.1 implementation, makes of the same bytes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import h11

from inferencepool.router.errors import transport_error
from inferencepool.router.http1 import HeadLimits, Reply, Request, Server, UpstreamFailure, _ClientConnection
from inferencepool.router.http1 import _ServerConnection as ServerConnection

BODY_LIMIT = 1024


class FakeTransport:
    """What the protocols use of an asyncio transport; closes at once (no lingering timer)."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


@dataclass
class Served:
    requests: list[tuple[str, str, tuple[tuple[str, str], ...], bytes]] = field(default_factory=list)
    written: bytes = b""
    closed: bool = False
    fed_to_parser: int = 0  # bytes the parser saw, at most


async def _echo(request: Request, reply: Reply) -> None:
    """Answers every request; /stream with a streamed body (chunked, or close-delimited for HTTP/1.0)."""
    _SEEN.append((request.method, request.path, tuple(sorted(request.headers.items())), request.body))
    if request.path == "/stream":
        reply.start(200, "text/event-stream")
        reply.write(b"data: 1\n\n")
        reply.end(b"data: [DONE]\n\n")
    else:
        reply.send(200, b"%d" % len(request.body))


_SEEN: list[tuple[str, str, tuple[tuple[str, str], ...], bytes]] = []


class _CountingParser:
    """The connection's parser, counting the bytes it is fed."""

    def __init__(self, parser: Any) -> None:
        self._parser = parser
        self.fed = 0

    def feed_data(self, data: bytes) -> None:
        self.fed += len(data)
        self._parser.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


def cut(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    """`data` split at the given offsets (sorted, clipped to its length)."""
    points = sorted({min(max(c, 0), len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a] or [b""]


async def _serve(data: bytes, cuts: Sequence[int], limits: HeadLimits) -> Served:
    server = Server(_echo, BODY_LIMIT, transport_error, head_limits=limits)
    conn = ServerConnection(server)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    counting = _CountingParser(conn._parser)
    conn._parser = counting  # type: ignore[assignment]
    _SEEN.clear()
    for piece in cut(data, cuts):
        conn.data_received(piece)
    for _ in range(200):  # answer what was read (pipelined requests one after another)
        if conn._task is None:
            break
        await asyncio.sleep(0)
    conn.connection_lost(None)
    for _ in range(5):
        await asyncio.sleep(0)
    return Served(list(_SEEN), bytes(transport.written), transport.closed, counting.fed)


_LOOP: asyncio.AbstractEventLoop | None = None


def _loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
    return _LOOP


DEFAULT_LIMITS = HeadLimits()


def serve_bytes(data: bytes, cuts: Sequence[int] = (), limits: HeadLimits = DEFAULT_LIMITS) -> Served:
    """What the router's server makes of `data` arriving in pieces cut at `cuts`."""
    return _loop().run_until_complete(_serve(data, cuts, limits))


@dataclass
class Relayed:
    status: int
    complete: bool
    body: bytes
    failure: str | None


def read_response(data: bytes, cuts: Sequence[int] = ()) -> Relayed:
    """What the router's client makes of an engine's answer `data` arriving in pieces (body relayed)."""

    async def run() -> Relayed:
        conn = _ClientConnection([])
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        body: list[bytes] = []
        conn.attach(body.extend)
        conn.asked = True  # as `request` marks it when it writes the request
        for piece in cut(data, cuts):
            if transport.closed:
                break
            conn.data_received(piece)
        if not conn.lost:
            conn.connection_lost(None)
        body.extend(conn.pieces)  # parsed in a read that then failed: not handed on, but parsed
        failure: str | None = None
        if conn._failure is not None:
            assert isinstance(conn._failure, UpstreamFailure)
            failure = conn._failure.kind
        if conn.headers_ready.done() and not conn.headers_ready.cancelled():
            conn.headers_ready.exception()  # retrieved: no "never retrieved" noise
        return Relayed(conn.status, conn.complete, b"".join(body), failure)

    return _loop().run_until_complete(run())


def h11_requests(data: bytes) -> tuple[list[tuple[str, str, bytes]], bool]:
    """The requests h11 reads from `data` (method, target, body) and whether it refused something."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HeadLimits().total)
    out: list[tuple[str, str, bytes]] = []
    try:
        conn.receive_data(data)
        conn.receive_data(b"")
        current: tuple[str, str] | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event in (h11.NEED_DATA, h11.PAUSED) or isinstance(event, h11.ConnectionClosed):
                if event is h11.PAUSED and conn.our_state is h11.SEND_RESPONSE:
                    raise AssertionError("unreachable")
                if event is h11.PAUSED:
                    conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
                    conn.send(h11.EndOfMessage())
                    conn.start_next_cycle()
                    continue
                return out, False
            if isinstance(event, h11.Request):
                current = (event.method.decode("latin-1"), event.target.decode("latin-1"))
                body = bytearray()
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert current is not None
                out.append((*current, bytes(body)))
                if conn.our_state is h11.SEND_RESPONSE:
                    conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
                    conn.send(h11.EndOfMessage())
                if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                    conn.start_next_cycle()
                else:
                    return out, False
    except h11.RemoteProtocolError:
        return out, True


def h11_response(data: bytes) -> tuple[int, bytes] | None:
    """The status and body h11 reads from an answer to a POST, or None when it refuses it or it is
    incomplete."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "engine"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    status = 0
    body = bytearray()
    try:
        conn.receive_data(data)
        conn.receive_data(b"")
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, bytes(body)
            elif isinstance(event, h11.InformationalResponse):
                continue
            else:
                return None
    except h11.RemoteProtocolError:
        return None
