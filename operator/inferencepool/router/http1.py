"""A lean HTTP/1.1 server and client for the router's hot path: asyncio Protocols, parsing by httptools.

Why not aiohttp, which the router used first: `inferencepool bench router` put the router at 1.35-1.6x the CPU
per request of the Rust vllm-router in P/D mode, with +0.7 ms more added latency at concurrency 1, and perf
found no single hot spot: the cost was spread over aiohttp's request, response, stream-reader and client
layers and the coroutine hand-off for every streamed chunk. Here:

- parsing is httptools (llhttp, Node.js's parser, the one uvicorn uses); this module only frames and manages
  connections;
- a streamed upstream body is relayed from the upstream connection's own `data_received` straight into the
  client's transport: no task switch, no queue, one write per upstream read (chunks that arrive together,
  such as the last event and the end of the body, leave together);
- timers are lazy: a stream's idle timeout is one timer that re-arms itself only when it fires early.

Scope is what the router needs, no more: requests with Content-Length or chunked bodies, keep-alive and
pipelined requests (answered in order), `Expect: 100-continue`, HTTP/1.0 clients (close-delimited streams),
backpressure both ways, and a body size limit. No TLS, upgrades or trailers.

A request's head is bounded as common servers bound it (HeadLimits: request line, each header, the header
count, the whole head), counted on the bytes as they arrive, before the parser accumulates them: httptools
joins a header's pieces by bytes concatenation, so an unbounded header costs quadratic time in its size and
one client could stall the loop for all others. (httptools reports a header only once the next begins, so
one header is cut somewhere between its limit and twice that; the whole head exactly at its limit.)
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Literal, cast

import httptools

log = logging.getLogger("inferencepool.router.http")

Headers = Iterable[tuple[str, str]]
FailureKind = Literal["connect", "disconnect", "timeout", "protocol"]

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_MAX_PIPELINED = 16  # requests read ahead of their answers on one connection
# A refused request's connection is half-closed and what the client still sends is discarded this long
# before the close, so the client reads the error instead of a reset (nginx's lingering close).
_LINGER_SECONDS = 2.0
_LAST_CHUNK = b"0\r\n\r\n"


def _head(status: int, content_type: str, headers: Headers, framing: bytes, close: bool) -> bytes:
    lines = [
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n" % (status, _REASONS.get(status, b""), content_type.encode())
    ]
    lines.extend(f"{name}: {value}\r\n".encode("latin-1") for name, value in headers)
    lines.append(framing)
    if close:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def _whole(status: int, content_type: str, headers: Headers, body: bytes, close: bool) -> bytes:
    """A complete response with a Content-Length body."""
    return _head(status, content_type, headers, b"Content-Length: %d\r\n" % len(body), close) + body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# ---- server ------------------------------------------------------------------------------------------------


class Request:
    __slots__ = ("body", "headers", "http10", "keep_alive", "method", "path")

    def __init__(
        self, method: str, path: str, headers: dict[str, str], body: bytes, keep_alive: bool, http10: bool
    ) -> None:
        self.method = method
        self.path = path
        self.headers = headers  # names lower-cased
        self.body = body
        self.keep_alive = keep_alive
        self.http10 = http10  # no chunked encoding: a stream is delimited by closing the connection


class Reply:
    """The one response to a request, written straight into the connection.

    `send` writes a whole response; `start`, `write` and `end` a streamed one (chunked, or close-delimited
    for an HTTP/1.0 client). Writes after the client went away are dropped (`closed` says so).
    """

    __slots__ = ("_chunked", "_conn", "_keep_alive", "finished", "started")

    def __init__(self, conn: _ServerConnection, keep_alive: bool, chunked: bool) -> None:
        self._conn = conn
        self._keep_alive = keep_alive
        self._chunked = chunked
        self.started = False
        self.finished = False

    @property
    def closed(self) -> bool:
        return self._conn.lost

    def send(
        self, status: int, body: bytes, content_type: str = "application/json", headers: Headers = ()
    ) -> None:
        self.started = self.finished = True
        close = not self._keep_alive or self._conn.server.draining
        self._conn.write(_whole(status, content_type, headers, body, close))
        self._conn.reply_done(close)

    def start(self, status: int, content_type: str, headers: Headers = (), first: bytes = b"") -> None:
        """The head of a streamed response, with the body's `first` bytes when there are some (one write)."""
        self.started = True
        close = not self._keep_alive or not self._chunked or self._conn.server.draining
        self._keep_alive = not close
        framing = b"Transfer-Encoding: chunked\r\n" if self._chunked else b""
        head = _head(status, content_type, headers, framing, close)
        self._conn.write(head + self.frame(first) if first else head)

    def frame(self, data: bytes) -> bytes:
        """`data` as it goes on the wire (a chunk, or as is for HTTP/1.0); for callers that batch writes."""
        return _chunk(data) if self._chunked and data else data

    def write(self, data: bytes) -> None:
        if data:
            self._conn.write(self.frame(data))

    def end(self, data: bytes = b"") -> None:
        """The last bytes of a streamed body, and its end, in one write."""
        if self.finished:
            return
        self.finished = True
        if self._chunked:
            self._conn.write(self.frame(data) + _LAST_CHUNK)
        elif data:
            self._conn.write(data)
        self._conn.reply_done(not self._keep_alive)

    def on_backpressure(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        """Called when the client stops and starts reading again (to pause the upstream it is fed from)."""
        self._conn.backpressure = (pause, resume)


Handler = Callable[[Request, Reply], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """Bounds on a request's head; beyond them the request gets 414 (line) or 431 (headers) and the
    connection closes. Defaults follow common servers: nginx's 8 KiB request line and header buffers,
    Node.js's 16 KiB head, Apache's 100 headers; the total leaves room for large cookies or tokens."""

    request_line: int = 8 * 1024
    header: int = 16 * 1024  # name, value and separators of one header
    count: int = 100
    total: int = 64 * 1024


class Server:
    """Routes requests to `handler`; `limit` is the largest request body accepted (413 beyond).

    Connections that hold resources without using them are closed by a sweep every few seconds: an idle
    keep-alive connection after `keepalive_seconds` (aiohttp's and nginx's 75 s), a request still being read
    after `read_seconds` (a slow or stalled sender gets 408).
    """

    def __init__(
        self,
        handler: Handler,
        limit: int,
        on_error: Callable[[int, str], bytes],
        keepalive_seconds: float = 75.0,
        read_seconds: float = 60.0,
        head_limits: HeadLimits = HeadLimits(),
    ) -> None:
        self.handler = handler
        self.limit = limit
        self.head_limits = head_limits
        self.error_body = on_error
        self.keepalive_seconds = keepalive_seconds
        self.read_seconds = read_seconds
        self.draining = False
        self.connections: set[_ServerConnection] = set()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def listen(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ServerConnection(self), host, port, backlog=1024)
        self._sweeper = loop.create_task(self._sweep())
        return int(self._server.sockets[0].getsockname()[1])

    async def _sweep(self) -> None:
        period = min(5.0, self.keepalive_seconds / 2, self.read_seconds / 2)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conn in list(self.connections):
                conn.expire(now)

    def stop_accepting(self) -> None:
        """New connections are refused; idle keep-alive ones are closed, busy ones close after their reply."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close_if_idle()

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            conn.abort()


class _HeadMeter:
    """Counts a request head's bytes against HeadLimits as they arrive, so the parser is fed no further than
    the bounds and its cost stays linear (see the module docstring)."""

    __slots__ = ("field_room", "headers", "limits", "reading", "room", "url_size")

    def __init__(self, limits: HeadLimits) -> None:
        self.limits = limits
        self.restart()

    def restart(self) -> None:
        """A new head may begin: all its room is free."""
        self.reading = True
        self.room = self.limits.total  # bytes the head may still take
        self.field_room = self.limits.header  # bytes the header being read may still take
        self.url_size = 0
        self.headers = 0

    def take(self, data: bytes) -> tuple[bytes, bytes]:
        """The piece of `data` to feed now (one byte past the room, to see a bound crossed) and the rest."""
        room = min(self.room, self.field_room) + 1
        piece, rest = (data[:room], data[room:]) if len(data) > room else (data, b"")
        self.room -= len(piece)
        self.field_room -= len(piece)
        return piece, rest

    def over(self) -> bool:
        return self.room < 0 or self.field_room < 0 or self.url_size > self.limits.request_line

    def problem(self) -> tuple[int, str]:
        """The bound crossed (the connection updates url_size, field_room and headers as it parses)."""
        limits = self.limits
        if self.url_size > limits.request_line:
            return 414, f"the request line exceeds the router's limit of {limits.request_line} bytes"
        if self.field_room < 0:
            return 431, f"a request header exceeds the router's limit of {limits.header} bytes"
        return 431, f"the request headers exceed the router's limit of {limits.total} bytes"


class _ServerConnection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        # the loop, found once a connection (asyncio.get_running_loop costs a getpid system call on 3.11)
        self._loop = asyncio.get_running_loop()
        self.lost = False
        self.backpressure: tuple[Callable[[], None], Callable[[], None]] | None = None
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url: list[bytes] = []
        self._headers: dict[str, str] = {}
        self._hosts = 0
        self._version = "1.1"
        self._head = _HeadMeter(server.head_limits)
        self._body: list[bytes] = []
        self._size = 0
        self._rejected = False
        self._pending: collections.deque[Request] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._paused = False
        self._closing = False
        self._idle_since: float | None = time.monotonic()  # None while a request is read or answered
        self._reading_since: float | None = None  # a request began arriving and is not complete yet

    def expire(self, now: float) -> None:
        """Close what the server's sweep finds stale (see Server)."""
        if self._task is not None:
            return
        if self._reading_since is not None and now - self._reading_since > self.server.read_seconds:
            self._reject(408, f"the request was not received within {self.server.read_seconds:g} s")
        elif self._idle_since is not None and now - self._idle_since > self.server.keepalive_seconds:
            self._close()

    # transport callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        head = self._head
        while data and not self._rejected:
            if not head.reading:
                piece, data = data, b""
            elif len(data) <= head.room and len(data) <= head.field_room:  # the usual case: all of it fits
                piece, data = data, b""
                head.room -= len(piece)
                head.field_room -= len(piece)
            else:
                piece, data = head.take(data)
            try:
                self._parser.feed_data(piece)
            except httptools.HttpParserUpgrade:
                self._reject(400, "protocol upgrades are not supported")
            except httptools.HttpParserError as error:
                self._reject(400, f"malformed HTTP request: {error}")
            if head.reading and not self._rejected and head.over():
                self._reject(*head.problem())  # still in the head, and past a bound

    def _check_head(self) -> None:
        if self._head.over():
            self._reject(*self._head.problem())

    def eof_received(self) -> bool:
        return False  # a client that stops sending is gone: close, and cancel what it asked for

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.server.connections.discard(self)
        if self._task is not None:
            self._task.cancel()
        if self._paused and self.backpressure is not None:
            self.backpressure[1]()

    def pause_writing(self) -> None:
        self._paused = True
        if self.backpressure is not None:
            self.backpressure[0]()

    def resume_writing(self) -> None:
        self._paused = False
        if self.backpressure is not None:
            self.backpressure[1]()

    # parser callbacks
    def on_message_begin(self) -> None:
        self._reading_since = time.monotonic()
        self._idle_since = None
        self._url = []
        self._headers = {}
        self._hosts = 0
        self._body = []
        self._size = 0

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        head = self._head
        head.url_size += len(url)
        head.field_room = head.limits.header  # the request line's end starts the first header

    def on_header(self, name: bytes, value: bytes) -> None:
        head = self._head
        # httptools reports a header once the next one begins: the room restarts with that one.
        head.field_room = head.limits.header
        head.headers += 1
        if head.headers > head.limits.count:
            self._reject(431, f"the request has more than the router's limit of {head.limits.count} headers")
            return
        key = name.decode("latin-1").lower()
        if key == "host":
            self._hosts += 1
        self._headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._head.reading = False
        if not self._rejected:
            self._check_head()  # a head that ended inside the piece fed last
        if self._rejected or not self._framing_ok():
            return
        length = self._headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.server.limit:
            self._too_large()
            return
        if self._headers.get("expect", "").lower() == "100-continue":
            self.write(_CONTINUE)

    def _framing_ok(self) -> bool:
        """What llhttp lets through but RFC 9112 (and h11, see tests/fuzz) refuses: HTTP/0.9, an HTTP/1.1
        request without exactly one Host, a transfer coding other than chunked (the router decodes none, and
        an unknown coding must not be read as a plain body); and an upgrade, which the router does not do."""
        version = self._version = self._parser.get_http_version()
        if version not in ("1.1", "1.0"):
            self._reject(505, f"HTTP/{version} is not supported")
        elif version == "1.1" and self._hosts != 1:
            self._reject(400, f"an HTTP/1.1 request needs exactly one Host header, not {self._hosts}")
        elif (coding := self._headers.get("transfer-encoding")) is not None and coding.strip().lower() != (
            "chunked"
        ):
            self._reject(501, f"Transfer-Encoding {coding!r} is not supported (only chunked)")
        elif self._parser.should_upgrade():
            # refused here, before the request is handled: llhttp reports the upgrade only after the message,
            # with the body it announced left unread, so the handler would get the request without it
            self._reject(400, "protocol upgrades are not supported")
        else:
            return True
        return False

    def on_body(self, body: bytes) -> None:
        if self._rejected:
            return
        self._size += len(body)
        if self._size > self.server.limit:
            self._too_large()
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._reading_since = None
        self._head.restart()
        if self._rejected:
            return
        url = b"".join(self._url).decode("latin-1")
        request = Request(
            self._parser.get_method().decode(),
            url.split("?", 1)[0],
            self._headers,
            b"".join(self._body),
            self._parser.should_keep_alive(),
            self._version == "1.0",
        )
        if self._task is None:
            self._run(request)
        else:
            self._pending.append(request)
            if len(self._pending) >= _MAX_PIPELINED and self._transport is not None:
                self._transport.pause_reading()  # a client far ahead of its answers waits for them

    # replies
    def _run(self, request: Request) -> None:
        reply = Reply(self, request.keep_alive and not self.server.draining, not request.http10)
        self._task = self._loop.create_task(self._serve(request, reply))

    async def _serve(self, request: Request, reply: Reply) -> None:
        try:
            await self.server.handler(request, reply)
        except asyncio.CancelledError:
            return  # the connection is gone
        except Exception:
            log.exception("request handler failed")
            if not reply.started:
                reply.send(500, self.server.error_body(500, "internal router error"))
        if not reply.finished and not self.lost:
            # A handler that returns without ending its reply leaves the client waiting: end it, closing.
            if reply.started:
                reply.end()
            else:
                reply.send(500, self.server.error_body(500, "internal router error: no response"))

    def reply_done(self, close: bool) -> None:
        self.backpressure = None
        self._task = None
        if close or self.server.draining or self._rejected:
            self._close()
        elif self._pending:
            if len(self._pending) == _MAX_PIPELINED and self._transport is not None:
                self._transport.resume_reading()
            self._run(self._pending.popleft())
        elif self._reading_since is None:
            self._idle_since = time.monotonic()

    def write(self, data: bytes) -> None:
        if not self.lost and self._transport is not None:
            self._transport.write(data)

    def close_if_idle(self) -> None:
        if self._task is None:
            self._close()

    def _close(self) -> None:
        if not self._closing and self._transport is not None:
            self._closing = True
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _reject(self, status: int, message: str) -> None:
        """Answer a request that cannot be read, and close (the rest of its bytes cannot be framed)."""
        if self._rejected:
            return
        self._rejected = True
        if self._task is not None:
            return  # a reply is being written on this connection; closing after it is all that is left
        self.write(_whole(status, "application/json", (), self.server.error_body(status, message), True))
        if self._transport is not None and not self._closing and self._transport.can_write_eof():
            self._transport.write_eof()
            asyncio.get_running_loop().call_later(_LINGER_SECONDS, self._close)
        else:
            self._close()

    def _too_large(self) -> None:
        self._reject(413, f"request body exceeds the router's limit of {self.server.limit} bytes")


# ---- client ------------------------------------------------------------------------------------------------


class UpstreamFailure(Exception):
    """An engine call that failed; `kind` says whether another pod may be tried: a refused or timed-out
    connect, or a connection dropped before any response byte, may be; a timeout may not."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


class _ClientConnection(asyncio.Protocol):
    """One keep-alive connection to an engine; carries one exchange at a time."""

    def __init__(self, pool: list[_ClientConnection]) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        # Body pieces parsed and not yet taken: the parser appends to the list itself (no Python frame per
        # piece); one list for the connection's life, cleared, never replaced (the parser holds its append).
        self.pieces: list[bytes] = []
        self.on_body = self.pieces.append
        self._parser = httptools.HttpResponseParser(self)
        self.loop = asyncio.get_running_loop()
        self.reset()

    def reset(self) -> None:
        self.status = 0
        self.content_type: str | None = None
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.headers_ready: asyncio.Future[None] = self.loop.create_future()
        self.done: asyncio.Future[None] | None = None
        self.pieces.clear()
        self._on_read: Callable[[list[bytes]], None] | None = None
        self.last_read = 0.0
        self._failure: UpstreamFailure | None = None
        self._unsolicited = False
        self.asked = False  # a request has been written on this exchange: an answer may come

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.asked or self.complete or self._unsolicited:
            self._drop_unsolicited()  # before a request, after its answer, idle in the pool: nothing asked
            return
        self.got_bytes = True
        self.last_read = time.monotonic()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            if not self._unsolicited:  # a second message stops the parser (on_message_begin), not the answer
                self.fail(UpstreamFailure("protocol", f"malformed response from the engine: {error}"))
                return
            self._drop_unsolicited()
        on_read = self._on_read
        if on_read is not None and (self.pieces or self.complete):
            on_read(self.pieces)
            self.pieces.clear()

    def _drop_unsolicited(self) -> None:
        """An engine that sends more than the one answer asked for is out of step with this connection: a
        second message here would be taken for the answer to the next request on it (a response desync).
        The answer already read stands; the connection is never reused."""
        self._unsolicited = True
        self.keep_alive = False
        if self in self._pool:
            self._pool.remove(self)
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self in self._pool:
            self._pool.remove(self)
        if not self.complete:
            detail = f"{exc.__class__.__name__}: {exc}" if exc else "the engine closed the connection"
            kind: FailureKind = "disconnect" if not self.got_bytes else "protocol"
            self.fail(UpstreamFailure(kind, f"connection lost before the response ended ({detail})"))

    def on_message_begin(self) -> None:
        if self.complete:  # a second message in the same read as the first's end: parse none of it
            self._unsolicited = True
            raise UpstreamFailure("protocol", "the engine sent a second response to one request")

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._parser.get_status_code() == 101:  # stops the parser: data_received fails the exchange
            raise UpstreamFailure("protocol", "the engine switched protocols, which the router never asks")
        self.status = self._parser.get_status_code()
        if not self.headers_ready.done():
            self.headers_ready.set_result(None)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def fail(self, failure: UpstreamFailure) -> None:
        if self.complete:
            return
        self._failure = failure
        for future in (self.headers_ready, self.done):
            if future is not None and not future.done():
                future.set_exception(failure)
                future.exception()  # retrieved here: a caller that gave up must not log it as lost
        if self.transport is not None:
            self.transport.abort()

    def unanswered(self, authority: str, limit: float) -> None:
        """The engine did not answer within `limit` (the failure is built only then: rarely)."""
        self.fail(UpstreamFailure("timeout", f"no answer from {authority} in {limit:g} s"))

    def finished(self) -> asyncio.Future[None]:
        if self.done is None:
            self.done = self.loop.create_future()
            if self.complete:
                self.done.set_result(None)
            elif self._failure is not None:
                self.done.set_exception(self._failure)
        return self.done

    def take_buffer(self) -> bytes:
        data = b"".join(self.pieces)
        self.pieces.clear()
        return data

    def attach(self, on_read: Callable[[list[bytes]], None]) -> None:
        """From now on `on_read` gets the body pieces of each read (and is called once the body is complete);
        the list is cleared after the call, so it must not be kept."""
        self._on_read = on_read


class UpstreamResponse:
    """An engine's answer: its status and content type, then the body read whole (`body`) or relayed as it
    arrives (`relay`). `close` returns the connection to the pool when the exchange ended cleanly, and
    drops it otherwise (so the engine sees an abandoned request go away)."""

    __slots__ = ("_conn", "_idle_seconds", "_timer", "content_type", "status")

    def __init__(self, conn: _ClientConnection, idle_seconds: float) -> None:
        self._conn = conn
        self._idle_seconds = idle_seconds
        self._timer: asyncio.TimerHandle | None = None
        self.status = conn.status
        self.content_type = conn.content_type

    @property
    def complete(self) -> bool:
        """The whole body has arrived (true inside the last `relay` flush)."""
        return self._conn.complete

    async def body(self) -> bytes:
        """The whole body; a body that stalls for the idle timeout fails with kind timeout."""
        await self._until_done()
        return self._conn.take_buffer()

    async def relay(self, on_read: Callable[[list[bytes]], None]) -> None:
        """Hands `on_read` the body pieces of every read that brought some, as the engine sends them (the
        list is reused: consume it in the call), and once more, maybe with none, on the read that ends the
        body; returns when the body has ended. A stream silent for the idle timeout fails with kind
        timeout."""
        conn = self._conn
        if conn.pieces:  # arrived before the relay began
            early = [conn.take_buffer()]
            on_read(early)
        conn.attach(on_read)
        await self._until_done()

    async def _until_done(self) -> None:
        """Wait for the end of the body, failing it (kind timeout) when the engine falls silent."""
        done = self._conn.finished()
        if not done.done():
            self._arm()
            try:
                await done
            finally:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None  # the handle holds a bound method of this object: no cycle left
        done.result()

    def _arm(self, delay: float | None = None) -> None:
        self._timer = self._conn.loop.call_later(
            self._idle_seconds if delay is None else delay, self._check_idle
        )

    def _check_idle(self) -> None:
        silent = time.monotonic() - self._conn.last_read
        if silent < self._idle_seconds:
            self._arm(self._idle_seconds - silent)
            return
        self._conn.fail(UpstreamFailure("timeout", f"the engine sent nothing for {self._idle_seconds:g} s"))

    def abort(self, reason: str) -> None:
        """Stop the exchange: a `relay` or `body` in progress fails (kind protocol) and the connection is
        dropped, so the engine aborts the request."""
        self._conn.fail(UpstreamFailure("protocol", reason))

    def pause(self) -> None:
        if self._conn.transport is not None and not self._conn.lost:
            self._conn.transport.pause_reading()

    def resume(self) -> None:
        if self._conn.transport is not None and not self._conn.lost:
            self._conn.transport.resume_reading()

    def close(self) -> None:
        conn = self._conn
        if conn.complete and conn.keep_alive and not conn.lost:
            conn.idle_since = time.monotonic()
            conn.reset()
            conn._pool.append(conn)
        elif conn.transport is not None and not conn.lost:
            conn.lost = True
            conn.transport.close()


class Upstream:
    """Pooled keep-alive connections to engines. Streams time out when silent for `idle_stream_seconds`;
    whole-body calls by their per-call limit (a non-streamed generation is silent until it is done)."""

    def __init__(
        self, connect_seconds: float, idle_stream_seconds: float, keepalive_seconds: float = 4.0
    ) -> None:
        # keepalive_seconds stays below the 5 s keep-alive of vLLM's HTTP server (uvicorn), so the router
        # never reuses a connection the engine is about to close (that would fail a request that never
        # reached the engine).
        self._connect_seconds = connect_seconds
        self._idle_seconds = idle_stream_seconds
        self._keepalive = keepalive_seconds
        self._pools: dict[str, list[_ClientConnection]] = {}

    async def _connection(self, authority: str) -> _ClientConnection:
        pool = self._pools.get(authority)
        if pool is None:
            pool = self._pools[authority] = []
        now = time.monotonic()
        while pool:
            conn = pool.pop()
            if not conn.lost and now - conn.idle_since < self._keepalive:
                return conn
            conn.lost = True
            if conn.transport is not None:
                conn.transport.close()
        host, _, port = authority.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            # not wait_for: on Python 3.11 it swallows a cancellation that lands as the connection opens,
            # and a cancelled task (the metrics scraper of a pod that accepts and never answers) runs on
            async with asyncio.timeout(self._connect_seconds):
                _, conn = await loop.create_connection(
                    lambda: _ClientConnection(pool), host.strip("[]"), int(port)
                )
        except TimeoutError as error:
            raise UpstreamFailure("connect", f"connect to {authority} timed out") from error
        except OSError as error:
            raise UpstreamFailure("connect", f"cannot connect to {authority}: {error}") from error
        return conn

    async def request(
        self,
        method: str,
        url: str,
        payload: bytes,
        headers: Headers,
        *,
        stream: bool,
        timeout_seconds: float,
    ) -> UpstreamResponse:
        """Send one request and wait for the response's status line and headers."""
        authority, path = _split_url(url)
        conn = await self._connection(authority)
        assert conn.transport is not None
        head = [f"{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {len(payload)}\r\n"]
        head.extend(f"{name}: {value}\r\n" for name, value in headers)
        head.append("\r\n")
        conn.asked = True
        conn.transport.write("".join(head).encode("latin-1") + payload)
        # a stream's headers come once the engine accepted the request: the caller's limit, at most the idle
        # one
        limit = min(self._idle_seconds, timeout_seconds) if stream else timeout_seconds
        timer = conn.loop.call_later(limit, conn.unanswered, authority, limit)
        try:
            await conn.headers_ready
            if not stream:
                await conn.finished()  # the whole body, within the same limit
        except asyncio.CancelledError:
            conn.lost = True
            conn.transport.abort()
            raise
        finally:
            timer.cancel()
        return UpstreamResponse(conn, self._idle_seconds)

    async def post(
        self, url: str, payload: bytes, headers: Headers, *, stream: bool, timeout_seconds: float
    ) -> UpstreamResponse:
        return await self.request(
            "POST", url, payload, headers, stream=stream, timeout_seconds=timeout_seconds
        )

    async def get(self, url: str, timeout_seconds: float) -> UpstreamResponse:
        return await self.request("GET", url, b"", (), stream=False, timeout_seconds=timeout_seconds)

    def close(self) -> None:
        for pool in self._pools.values():
            for conn in pool:
                if conn.transport is not None:
                    conn.transport.close()
        self._pools.clear()


def _split_url(url: str) -> tuple[str, str]:
    """`http://host:port/path` -> ("host:port", "/path")."""
    if not url.startswith("http://"):
        raise UpstreamFailure("protocol", f"only http:// engine URLs are supported, not {url!r}")
    rest = url[7:]
    slash = rest.find("/")
    if slash < 0:
        return rest if ":" in rest else rest + ":80", "/"
    authority = rest[:slash]
    if ":" not in authority.rsplit("]", 1)[-1]:
        authority += ":80"
    return authority, rest[slash:]
