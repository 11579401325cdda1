"""Bounds on a request's head (request line, each header, header count, total) and that a client sending a
huge or slow head cannot hold up other clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httptools
import pytest

from inferencepool.router.http1 import HeadLimits, Reply, Request, Server, _ServerConnection
from inferencepool.router.server import transport_error


async def _ok(request: Request, reply: Reply) -> None:
    reply.send(200, json.dumps({"path": request.path, "headers": len(request.headers)}).encode())


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[int]:
    server = Server(_ok, 1024, transport_error)
    port = await server.listen("127.0.0.1", 0)
    try:
        yield port
    finally:
        server.stop_accepting()
        server.close()


async def _exchange(port: int, raw: bytes) -> tuple[int, dict[str, Any]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(raw)
            await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _get(path: str = "/", headers: list[tuple[str, str]] | None = None) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: router", "Connection: close"] + [
        f"{n}: {v}" for n, v in headers or []
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


LIMITS = HeadLimits()


@pytest.mark.parametrize(
    ("raw", "status", "needle"),
    [
        (_get("/" + "a" * (LIMITS.request_line + 10)), 414, "request line"),
        (_get(headers=[("X-Big", "v" * (2 * LIMITS.header + 10))]), 431, "a request header"),
        (_get(headers=[(f"X-{i}", "v") for i in range(LIMITS.count + 1)]), 431, "more than"),
        # Each header within its bound, all of them together over the total.
        (_get(headers=[(f"X-{i}", "v" * (LIMITS.header // 2)) for i in range(9)]), 431, "request headers"),
    ],
)
async def test_oversized_heads_get_414_or_431_with_a_json_body(raw: bytes, status: int, needle: str) -> None:
    async with _server() as port:
        answered, body = await _exchange(port, raw)
        assert answered == status and needle in body["error"]["message"], body
        assert body["error"]["code"] == status
        # Heads within every bound are served.
        within = [(f"X-{i}", "v" * 1000) for i in range(30)] + [("X-Cookie", "c" * (LIMITS.header - 100))]
        answered, body = await _exchange(port, _get("/" + "p" * (LIMITS.request_line - 100), within))
        assert answered == 200 and body["headers"] == 33


async def test_a_huge_head_is_fed_to_the_parser_no_further_than_its_bound() -> None:
    """The parser (whose header accumulation is quadratic) never sees more than the bound, however much a
    client sends: the cost of refusing a 32 MiB header is that of reading 64 KiB."""
    fed: list[int] = []

    class Counting:
        def __init__(self, protocol: Any) -> None:
            self._parser = httptools.HttpRequestParser(protocol)

        def feed_data(self, data: bytes) -> None:
            fed.append(len(data))
            self._parser.feed_data(data)

    class Transport:
        def __init__(self) -> None:
            self.written = b""
            self.closed = False

        def write(self, data: bytes) -> None:
            self.written += data

        def close(self) -> None:
            self.closed = True

        def can_write_eof(self) -> bool:
            return False

    server = Server(_ok, 1024, transport_error)
    for piece_size in (1, 1000, 1 << 20):
        fed.clear()
        conn = _ServerConnection(server)
        conn._parser = Counting(conn)  # type: ignore[assignment]
        transport = Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        stream = _get(headers=[(f"X-{i}", "v" * 8000) for i in range(4096)])  # 32 MiB of headers
        for start in range(0, min(len(stream), 200_000), piece_size):
            conn.data_received(stream[start : start + piece_size])
        assert sum(fed) <= LIMITS.total + 1, piece_size
        assert transport.closed and b" 431 " in transport.written.split(b"\r\n", 1)[0]
        more = stream[200_000 : 200_000 + (1 << 20)]
        conn.data_received(more)  # a refused connection reads nothing more
        assert sum(fed) <= LIMITS.total + 1


async def test_health_answers_while_another_client_sends_a_huge_or_slow_head() -> None:
    async with _server() as port:
        # A slow client: a header trickling in, a byte at a time.
        _, slow = await asyncio.open_connection("127.0.0.1", port)
        slow.write(b"GET / HTTP/1.1\r\nHost: r\r\nX-Slow: ")
        # A greedy one: 16 MiB of header as fast as it can write.
        greedy_reader, greedy = await asyncio.open_connection("127.0.0.1", port)

        async def flood() -> bytes:
            with contextlib.suppress(ConnectionError):
                greedy.write(b"GET / HTTP/1.1\r\nHost: r\r\nX-Flood: ")
                for _ in range(256):
                    greedy.write(b"f" * 65536)
                    await greedy.drain()
            return await greedy_reader.read()

        flooding = asyncio.create_task(flood())
        try:
            for _ in range(20):
                slow.write(b"s")
                answered, body = await _exchange(port, _get("/health"))
                assert answered == 200 and body["path"] == "/health"
            refused = await asyncio.wait_for(flooding, 30)
            assert refused.startswith(b"HTTP/1.1 431 ")
            slow.write(b"s" * (2 * LIMITS.header))
            await slow.drain()
        finally:
            slow.close()
            greedy.close()
