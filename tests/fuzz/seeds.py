"""Seed inputs for the fuzz corpus: `python -m tests.fuzz.seeds` writes them into tests/fuzz/corpus/http1."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.fuzz.checks import encode

CORPUS = Path(__file__).parent / "corpus" / "http1"

REQUESTS = [
    b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
    b'Content-Length: 13\r\n\r\n{"prompt":1}\n',
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: r\r\n\r\nGET /ready HTTP/1.1\r\nHost: r\r\n\r\n"
    b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\nok",
    b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\nbody",
    b"GET /stream HTTP/1.0\r\n\r\n",
    b"GET /stream HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    b"GET /x HTTP/1.1\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde",
    b"GET / HTTP/1.1\r\nHost: r\r\nX-Folded: a\r\n  continued\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: 2000\r\n\r\n" + b"x" * 100,
    b"POST / HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: r\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    b"GET /lf HTTP/1.1\nHost: r\n\n",
    b"GET /" + b"a" * 80 + b" HTTP/1.1\r\nHost: r\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
]

RESPONSES = [
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'f\r\ndata: {"a":1}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n',
    b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
    b'HTTP/1.1 500 Internal Server Error\r\nContent-Length: 11\r\n\r\n{"error":1}',
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nq\r\nbad\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef",
]


def main() -> None:
    CORPUS.mkdir(parents=True, exist_ok=True)
    inputs = [encode(0, [], r) for r in REQUESTS] + [encode(0, [7, 19, 33], r) for r in REQUESTS[:4]]
    inputs += [encode(1, [5, 40], r) for r in REQUESTS]
    inputs += [encode(2, [], r) for r in RESPONSES] + [encode(2, [3, 17, 30], r) for r in RESPONSES]
    for data in inputs:
        (CORPUS / hashlib.sha1(data).hexdigest()).write_bytes(data)


if __name__ == "__main__":
    main()
