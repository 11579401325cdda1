"""Request framing of router/http1.py against h11 (a strict, well-known HTTP/1.1 implementation), case by
case: duplicate and conflicting Content-Length, chunked encoding edge cases, obs-fold, Content-Length +
Transfer-Encoding smuggling patterns, Host rules. Wherever both accept, they must frame the same requests;
where the router is stricter than h11 (it refuses what RFC 9112 lets a server refuse), that is stated."""

from __future__ import annotations

import pytest

from tests.fuzz.http1_harness import h11_requests, serve_bytes

NEXT = b"GET /next HTTP/1.1\r\nHost: r\r\n\r\n"  # a request behind: a smuggled one would show up framed


def post(headers: bytes, body: bytes) -> bytes:
    return b"POST /p HTTP/1.1\r\nHost: r\r\n" + headers + b"\r\n" + body + NEXT


def chunked(body: bytes, coding: bytes = b"chunked") -> bytes:
    return post(b"Transfer-Encoding: " + coding + b"\r\n", body)


def get(head: bytes) -> bytes:
    return head + NEXT


ONE = b"1\r\na\r\n0\r\n\r\n"
BOTH = [("POST", "/p", b"a"), ("GET", "/next", b"")]

# name, bytes, what the router does (the requests it frames, which h11 frames too, or the status it refuses
# with), and whether h11 refuses.
CASES: list[tuple[str, bytes, list[tuple[str, str, bytes]] | int, bool]] = [
    ("conflicting Content-Length", post(b"Content-Length: 3\r\nContent-Length: 5\r\n", b"abcde"), 400, True),
    # RFC 9112 6.3: a repeated identical length may be collapsed or refused; refusing is the safe choice.
    ("repeated Content-Length", post(b"Content-Length: 5\r\nContent-Length: 5\r\n", b"abcde"), 400, False),
    ("Content-Length list", post(b"Content-Length: 5, 5\r\n", b"abcde"), 400, False),
    # The classic smuggling pair (CL.TE / TE.CL): RFC 9112 6.1 lets a server refuse it, and the router does.
    ("CL then TE", post(b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"), 400, False),
    ("TE then CL", post(b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", b"0\r\n\r\n"), 400, False),
    ("TE twice", post(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", ONE), 400, True),
    ("TE gzip, chunked", chunked(ONE, b"gzip, chunked"), 501, True),
    ("TE chunked, gzip", chunked(ONE, b"chunked, gzip"), 400, True),
    ("TE identity", post(b"Transfer-Encoding: identity\r\n", b""), 501, True),
    ("TE xchunked", chunked(ONE, b"xchunked"), 501, True),
    ("TE Chunked (case)", chunked(ONE, b"Chunked"), BOTH, False),
    ("TE with spaces", chunked(ONE, b" chunked "), BOTH, False),
    ("space before colon", post(b"Content-Length : 5\r\n", b"abcde"), 400, True),
    # RFC 9112 5.2: a server must refuse obs-fold or unfold it; the router refuses, h11 unfolds.
    ("obs-fold", get(b"GET /p HTTP/1.1\r\nHost: r\r\nX-A: a\r\n b\r\n\r\n"), 400, False),
    ("obs-fold Content-Length", post(b"X-A: a\r\nContent-Length:\r\n 5\r\n", b"abcde"), 400, False),
    ("chunk size with a space", chunked(b" " + ONE), 400, True),
    ("chunk size 0x1", chunked(b"0x1\r\na\r\n0\r\n\r\n"), 400, True),
    ("chunk size overflow", chunked(b"fffffffffffffffff1\r\na\r\n0\r\n\r\n"), 400, True),
    ("chunk extensions", chunked(b'1;a=b;c="d"\r\na\r\n0\r\n\r\n'), BOTH, False),
    ("chunk without CRLF", chunked(b"1\r\naX0\r\n\r\n"), 400, True),
    ("chunks with bare LF", chunked(b"1\na\n0\n\n"), 400, True),
    ("trailer", chunked(b"1\r\na\r\n0\r\nX-T: 1\r\n\r\n"), BOTH, False),
    ("Content-Length in a trailer", chunked(b"1\r\na\r\n0\r\nContent-Length: 9\r\n\r\n"), 400, False),
    ("bare LF line ends", get(b"GET /p HTTP/1.1\nHost: r\n\n"), 400, False),
    ("Content-Length +5", post(b"Content-Length: +5\r\n", b"abcde"), 400, True),
    ("Content-Length 5abc", post(b"Content-Length: 5abc\r\n", b"abcde"), 400, True),
    ("Content-Length -1", post(b"Content-Length: -1\r\n", b""), 400, True),
    ("NUL in a value", post(b"X-A: a\x00b\r\nContent-Length: 0\r\n", b""), 400, True),
    ("CR in a value", post(b"X-A: a\rb\r\nContent-Length: 0\r\n", b""), 400, True),
    ("header without a colon", post(b"NoColon\r\nContent-Length: 0\r\n", b""), 400, True),
    ("empty header name", post(b": v\r\nContent-Length: 0\r\n", b""), 400, True),
    ("whitespace before the request line", get(b" GET /p HTTP/1.1\r\nHost: r\r\n\r\n"), 400, True),
    ("HTTP/0.9", b"GET /p\r\n\r\n", 505, True),
    ("HTTP/1.1 without Host", get(b"GET /p HTTP/1.1\r\n\r\n"), 400, True),
    ("two Host headers", get(b"GET /p HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400, True),
    (
        "absolute form",
        get(b"GET http://r/p HTTP/1.1\r\nHost: r\r\n\r\n"),
        [("GET", "http://r/p", b""), ("GET", "/next", b"")],
        False,
    ),
    (
        "GET with a body",
        get(b"GET /p HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\nab"),
        [("GET", "/p", b"ab"), ("GET", "/next", b"")],
        False,
    ),
    # Stricter than h11 (which frames them and leaves the upgrade to the server): the router does no upgrades
    # and refuses them before the handler sees the request (llhttp reports the upgrade after the message,
    # with the announced body unread: the handler got the request without its body).
    (
        "upgrade with a body",
        post(b"Connection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 4\r\n", b"body"),
        400,
        False,
    ),
    (
        "h2c upgrade",
        get(b"GET /p HTTP/1.1\r\nHost: r\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"),
        400,
        False,
    ),
    # RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding is read chunked, then the connection closes.
    (
        "HTTP/1.0 chunked",
        get(b"POST /p HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" + ONE),
        [("POST", "/p", b"a")],
        False,
    ),
]


@pytest.mark.parametrize(("name", "raw", "expected", "h11_refuses"), CASES, ids=[c[0] for c in CASES])
def test_framing_matches_h11_or_is_stricter(
    name: str, raw: bytes, expected: list[tuple[str, str, bytes]] | int, h11_refuses: bool
) -> None:
    ours = serve_bytes(raw)
    framed = [(method, path, body) for method, path, _, body in ours.requests]
    theirs, refused = h11_requests(raw)
    assert refused == h11_refuses, (theirs, refused)
    if isinstance(expected, int):
        assert framed == [], framed
        assert ours.written.startswith(b"HTTP/1.1 %d " % expected), ours.written[:100]
        assert b'"error"' in ours.written and ours.closed
    else:
        assert framed == expected
        assert framed == [(m, t.split("?", 1)[0], b) for m, t, b in theirs]
    # One byte per read frames exactly the same.
    bytewise = serve_bytes(raw, range(len(raw)))
    assert (bytewise.requests, bytewise.written, bytewise.closed) == (
        ours.requests,
        ours.written,
        ours.closed,
    )
