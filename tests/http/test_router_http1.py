"""The router's lean HTTP/1.1 layer on the wire: raw sockets against its server, scripted servers against its
client, so framing, keep-alive, errors and timeouts are checked byte for byte."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from inferencepool.router.http1 import Reply, Request, Server, Upstream, UpstreamFailure
from inferencepool.router.server import transport_error

LIMIT = 1024


async def _handler(request: Request, reply: Reply) -> None:
    """Echoes the request; /stream streams three pieces; /fail raises; /wait waits until cancelled."""
    if request.path == "/stream":
        reply.start(200, "text/event-stream")
        for piece in (b"data: 1\n\n", b"data: 2\n\n"):
            reply.write(piece)
            await asyncio.sleep(0)
        reply.end(b"data: [DONE]\n\n")
    elif request.path == "/fail":
        raise RuntimeError("handler bug")
    elif request.path == "/wait":
        STATE["waiting"].set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            STATE["cancelled"].set()
            raise
    else:
        echo = {"method": request.method, "path": request.path, "body": request.body.decode()}
        reply.send(200, json.dumps(echo).encode())


STATE: dict[str, asyncio.Event] = {}


@contextlib.asynccontextmanager
async def _server(
    handler: Callable[[Request, Reply], Awaitable[None]] = _handler, **timeouts: float
) -> AsyncIterator[int]:
    STATE.update(waiting=asyncio.Event(), cancelled=asyncio.Event())
    server = Server(handler, LIMIT, transport_error, **timeouts)
    port = await server.listen("127.0.0.1", 0)
    try:
        yield port
    finally:
        server.stop_accepting()
        server.close()


async def _exchange(port: int, raw: bytes, *, until_close: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    try:
        if until_close:
            return await asyncio.wait_for(reader.read(), 5)
        return await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def test_pipelined_requests_are_answered_in_order_and_close_is_honoured() -> None:
    async with _server() as port:
        raw = _post("/a", b"one") + _post("/b", b"two", "Connection: close\r\n")
        answer = await _exchange(port, raw)
    assert answer.count(b"HTTP/1.1 200 OK") == 2
    assert answer.index(b'"path": "/a"') < answer.index(b'"path": "/b"')
    assert answer.count(b"Connection: close") == 1


async def test_many_pipelined_requests_are_all_answered_in_order() -> None:
    async with _server() as port:
        raw = b"".join(_post(f"/{n}", b"x") for n in range(40)) + _post(
            "/last", b"x", "Connection: close\r\n"
        )
        answer = await _exchange(port, raw)
    paths = [int(chunk.split(b'"')[0]) for chunk in answer.split(b'"path": "/')[1:-1]]
    assert paths == list(range(40)) and answer.count(b"HTTP/1.1 200 OK") == 41


async def test_idle_connections_close_and_stalled_requests_get_408() -> None:
    async with _server(keepalive_seconds=0.3, read_seconds=0.3) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/a", b"one"))
        first = await asyncio.wait_for(reader.readuntil(b"}"), 5)
        assert first.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed once idle past the keep-alive
        writer.close()
        stalled = await _exchange(port, b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhalf")
    assert stalled.startswith(b"HTTP/1.1 408") and b"not received within 0.3 s" in stalled


async def test_chunked_stream_and_http10_close_delimited_stream() -> None:
    async with _server() as port:
        chunked = await _exchange(port, b"GET /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        old = await _exchange(port, b"GET /stream HTTP/1.0\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in chunked
    assert chunked.endswith(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
    head, _, body = old.partition(b"\r\n\r\n")
    assert b"chunked" not in head and b"Connection: close" in head
    assert body == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"


@pytest.mark.parametrize(
    ("raw", "status", "words"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", b"400", b"malformed HTTP request"),
        (_post("/x", b"y" * (LIMIT + 1)), b"413", b"exceeds the router's limit of 1024 bytes"),
        (
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + (b"200\r\n" + b"y" * 0x200 + b"\r\n") * 3
            + b"0\r\n\r\n",
            b"413",
            b"exceeds the router's limit",
        ),
    ],
    ids=["malformed", "content-length-too-large", "chunked-too-large"],
)
async def test_unreadable_requests_get_a_json_error_and_the_connection_closes(
    raw: bytes, status: bytes, words: bytes
) -> None:
    async with _server() as port:
        answer = await _exchange(port, raw)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status) and b"Connection: close" in head
    error = json.loads(body)["error"]  # one answer only: json.loads refuses anything after it
    assert words.decode() in error["message"] and error["code"] == int(status)


async def test_expect_continue_is_answered_before_the_body() -> None:
    async with _server() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hi")
        final = await asyncio.wait_for(reader.readuntil(b"}"), 5)
        writer.close()
    assert final.startswith(b"HTTP/1.1 200") and b'"body": "hi"' in final


async def test_a_failing_handler_gets_500_and_the_server_keeps_serving() -> None:
    async with _server() as port:
        failed = await _exchange(port, b"GET /fail HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        fine = await _exchange(port, b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert failed.startswith(b"HTTP/1.1 500") and b"internal router error" in failed
    assert fine.startswith(b"HTTP/1.1 200")


async def test_a_client_that_goes_away_cancels_its_handler() -> None:
    async with _server() as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(STATE["waiting"].wait(), 5)
        writer.close()
        await asyncio.wait_for(STATE["cancelled"].wait(), 5)


async def test_a_client_that_stops_reading_pauses_the_source_until_it_reads_again() -> None:
    events: list[str] = []
    resumed = asyncio.Event()

    def resume() -> None:
        events.append("resume")
        resumed.set()

    async def flood(_request: Request, reply: Reply) -> None:
        reply.start(200, "application/octet-stream")
        reply.on_backpressure(lambda: events.append("pause"), resume)
        for _ in range(512):  # 32 MiB: far beyond the socket buffers of a client that does not read
            reply.write(b"x" * 65536)
            if events:
                break
        await resumed.wait()
        reply.end()

    async with _server(flood) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(100):
            if events:
                break
            await asyncio.sleep(0.05)
        assert events == ["pause"]
        while not resumed.is_set():
            await asyncio.wait_for(reader.read(1 << 20), 5)
        assert events == ["pause", "resume"]
        writer.close()


# ---- the client, against scripted engines -----------------------------------------------------------


@contextlib.asynccontextmanager
async def _engine(
    script: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[tuple[str, list[int]]]:
    """A raw server running `script` per connection; yields its URL and a connection counter."""
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await script(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections
    finally:
        server.close()


async def _answer_each(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, extra: bytes = b""
) -> None:
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        body = await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
            + extra
            + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        if extra:
            return


async def test_connections_are_reused_and_a_closed_one_is_replaced() -> None:
    async with _engine(_answer_each) as (url, connections):
        upstream = Upstream(1.0, 5.0)
        for n in range(3):
            response = await upstream.post(url + "/p", b"%d" % n, (), stream=False, timeout_seconds=5)
            assert (response.status, await response.body()) == (200, b"%d" % n)
            response.close()
        assert len(connections) == 1
        upstream.close()

    async def close_after_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _answer_each(reader, writer, b"Connection: close\r\n")

    async with _engine(close_after_one) as (url, connections):
        upstream = Upstream(1.0, 5.0)
        for _ in range(2):
            response = await upstream.post(url + "/p", b"x", (), stream=False, timeout_seconds=5)
            assert await response.body() == b"x"
            response.close()
        assert len(connections) == 2
        upstream.close()


@pytest.mark.parametrize("late", [False, True], ids=["same-read", "while-idle"])
async def test_an_answer_the_router_did_not_ask_for_is_never_taken_for_the_next_one(late: bool) -> None:
    """An engine (or anything on its port) that sends a second response after the first: in the same read,
    or while the connection waits idle in the pool. The first answer stands as sent; the extra bytes are
    not appended to it, and the next request goes over a new connection, not to be answered by them."""

    async def answer_twice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            if first:
                if late:
                    await writer.drain()
                    await asyncio.sleep(0.1)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled")
                first = False
            await writer.drain()

    async with _engine(answer_twice) as (url, connections):
        upstream = Upstream(1.0, 5.0)
        response = await upstream.post(url + "/p", b"first", (), stream=False, timeout_seconds=5)
        assert await response.body() == b"first"
        response.close()
        await asyncio.sleep(0.3)  # the late extra answer arrives while the connection is idle
        response = await upstream.post(url + "/p", b"second", (), stream=False, timeout_seconds=5)
        assert await response.body() == b"second"
        response.close()
        assert len(connections) == 2  # the first connection was dropped, not reused
        upstream.close()


async def test_a_chunked_stream_is_relayed_piece_by_piece() -> None:
    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for piece in (b"data: a\n\n", b"data: b\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with _engine(stream) as (url, _):
        upstream = Upstream(1.0, 5.0)
        response = await upstream.post(url + "/s", b"{}", (), stream=True, timeout_seconds=5)
        assert response.content_type == "text/event-stream"
        pieces: list[bytes] = []
        reads: list[bool] = []

        def on_read(read: list[bytes]) -> None:
            pieces.extend(read)
            reads.append(response.complete)

        await response.relay(on_read)
        assert b"".join(pieces) == b"data: a\n\ndata: b\n\n"
        assert reads[-1] is True and reads.count(True) == 1
        response.close()
        upstream.close()


async def _hang(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
    await reader.read()


async def _drop(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")


async def _garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"SPDY/9 what\r\n\r\n")
    await writer.drain()
    await reader.read()


async def _switch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nxx")
    await writer.drain()
    await reader.read()


@pytest.mark.parametrize(
    ("script", "kind"),
    [(_hang, "timeout"), (_drop, "disconnect"), (_garbage, "protocol"), (_switch, "protocol")],
    ids=["silent", "dropped", "garbage", "switched-protocols"],
)
async def test_failures_before_the_answer_name_their_kind(
    script: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], kind: str
) -> None:
    async with _engine(script) as (url, _):
        upstream = Upstream(1.0, 5.0)
        with pytest.raises(UpstreamFailure) as failure:
            await upstream.post(url + "/x", b"{}", (), stream=False, timeout_seconds=0.3)
        assert failure.value.kind == kind
        upstream.close()


async def test_refused_connect_and_silent_stream() -> None:
    upstream = Upstream(1.0, 0.3)
    with pytest.raises(UpstreamFailure) as refused:
        await upstream.post("http://127.0.0.1:9/x", b"", (), stream=True, timeout_seconds=1)
    assert refused.value.kind == "connect"

    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await reader.read()

    async with _engine(stalls) as (url, _):
        response = await upstream.post(url + "/s", b"", (), stream=True, timeout_seconds=1)
        pieces: list[bytes] = []
        with pytest.raises(UpstreamFailure) as silent:
            await response.relay(pieces.extend)
        assert silent.value.kind == "timeout" and pieces == [b"hello"]
        response.close()
    upstream.close()
