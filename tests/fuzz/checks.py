"""The properties the fuzz target (fuzz_http1.py) checks of router/http1.py, without atheris, so the
committed corpus can be replayed as a plain test.

An input is (mode, cut offsets, bytes); see `decode`. Properties:
- nothing the bytes say raises out of the protocol callbacks;
- how the bytes are cut into reads changes nothing (requests seen, bytes written, answers relayed);
- the router's framing agrees with h11's wherever both accept the bytes (same requests: method, target,
  body; same response status and body): a disagreement is how request smuggling starts;
- under small head limits no request beyond them reaches the handler, and the parser is fed no further;
- every byte the router writes back is a well-formed response.
"""

from __future__ import annotations

from inferencepool.router.http1 import HeadLimits
from tests.fuzz.http1_harness import h11_requests, h11_response, read_response, serve_bytes

MODES = 3
SMALL = HeadLimits(request_line=64, header=64, count=4, total=256)


def decode(data: bytes) -> tuple[int, list[int], bytes]:
    """byte 0: mode; byte 1: number of cuts (0..8); two bytes per cut offset; the rest is the payload."""
    if len(data) < 2:
        return 0, [], data
    mode, count = data[0] % MODES, data[1] % 9
    offsets = data[2 : 2 + 2 * count]
    cuts = [int.from_bytes(offsets[i : i + 2], "big") for i in range(0, len(offsets) - 1, 2)]
    return mode, cuts, data[2 + 2 * count :]


def encode(mode: int, cuts: list[int], payload: bytes) -> bytes:
    return bytes([mode, len(cuts)]) + b"".join(c.to_bytes(2, "big") for c in cuts) + payload


def _responses_well_formed(written: bytes) -> None:
    assert not written or written.startswith(b"HTTP/1.1 "), written[:80]


def check_server(cuts: list[int], payload: bytes) -> None:
    whole = serve_bytes(payload)
    pieces = serve_bytes(payload, cuts)
    assert whole.requests == pieces.requests, (whole.requests, pieces.requests)
    assert whole.written == pieces.written, (whole.written[:300], pieces.written[:300])
    _responses_well_formed(whole.written)
    theirs, _ = h11_requests(payload)
    ours = [(method, path, body) for method, path, _, body in whole.requests]
    for index, ((method, path, body), (h_method, h_target, h_body)) in enumerate(
        zip(ours, theirs, strict=False)
    ):
        assert (method, path, body) == (h_method, h_target.split("?", 1)[0], h_body), (index, ours, theirs)


def check_limits(cuts: list[int], payload: bytes) -> None:
    served = serve_bytes(payload, cuts, SMALL)
    _responses_well_formed(served.written)
    for _, path, headers, _ in served.requests:
        assert len(path) <= SMALL.request_line, path
        assert len(headers) <= SMALL.count, headers
        for name, value in headers:
            assert len(name) + len(value) <= 2 * SMALL.header, (name, len(value))
    end = payload.find(b"\r\n\r\n")
    if end < 0 or end + 4 > SMALL.total:
        # The first head is larger than the bound (or never ends): the parser saw no more of it than that.
        assert served.fed_to_parser <= SMALL.total + 1, served


def check_client(cuts: list[int], payload: bytes) -> None:
    whole = read_response(payload)
    pieces = read_response(payload, cuts)
    assert whole == pieces, (whole, pieces)
    theirs = h11_response(payload)
    if whole.complete and whole.status >= 200 and theirs is not None:
        assert (whole.status, whole.body) == theirs, (whole, theirs)


CHECKS = (check_server, check_limits, check_client)


def test_one_input(data: bytes) -> None:
    mode, cuts, payload = decode(data)
    CHECKS[mode](cuts, payload)
