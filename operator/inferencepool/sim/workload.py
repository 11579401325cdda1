"""Request traces: Azure LLM inference 2023 (CSV) and Mooncake (JSONL), read into one shape (pure but for file
reads).

Azure rows carry a prompt length and an output length per arrival; their prompts share nothing, so each one is
given a first token id of its own (ids stay 32-bit for traces of any length). Mooncake rows also carry
`hash_ids`, one per 512-token block of the prompt, equal ids meaning equal content under the same prefix; each
block becomes 512 copies of its id, so the engine's chained chunk hashes match exactly where the trace says
prompts share a prefix, and prefix caching and prefix affinity see the reuse the trace recorded.

Vendored slices (the first minutes of each public trace, gzipped) live in `data/`; tests and the default run
use them, since CI runs on a clean clone without the full files.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from random import Random
from typing import overload

DATA_DIR = Path(__file__).parent / "data"
MOONCAKE_BLOCK_TOKENS = 512
# Azure prompt n starts at id (n + 1) x AZURE_ID_STRIDE modulo AZURE_ID_SPACE and counts up from there. The
# space is prime, so every stride is coprime with it and the first ids of 2^31 - 2 prompts are all distinct;
# two prompts then never share a first chunk, and chained chunk hashes (the engine's prefix cache) and prefix
# affinity never match across them, although later ids of a long prompt may reappear inside another one.
# Every id stays below 2^32 (the router packs ids into 4 bytes), for prompts up to 2^31 tokens. The first
# 2,047 prompts keep ids far apart (multiples of the stride, above any prompt a vLLM engine accepts).
AZURE_ID_STRIDE = 1 << 20
AZURE_ID_SPACE = (1 << 31) - 1

VENDORED: dict[str, str] = {
    "azure-code": "azure2023_code.1h.csv.gz",
    "azure-conv": "azure2023_conv.1h.csv.gz",
    "mooncake-conv": "mooncake_conversation.5min.jsonl.gz",
}


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file, the line and the field."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival: float  # seconds since the first request of the trace
    prompt_tokens: int
    output_tokens: int
    block_ids: tuple[int, ...] = ()  # Mooncake hash_ids: one per 512-token block of the prompt


class BlockTokens(Sequence[int]):
    """A prompt's token ids without storing them: block i's 512 tokens are all `block_ids[i]`.

    Azure prompts (no blocks) are a run of ids of their own, `base + position`.
    """

    __slots__ = ("_base", "_blocks", "_length")

    def __init__(self, length: int, blocks: tuple[int, ...] = (), base: int = 0) -> None:
        self._length = length
        self._blocks = blocks
        self._base = base

    def __len__(self) -> int:
        return self._length

    def _at(self, index: int) -> int:
        if self._blocks:
            block = min(index // MOONCAKE_BLOCK_TOKENS, len(self._blocks) - 1)
            return self._blocks[block]
        return self._base + index

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            if step != 1:
                return [self._at(i) for i in range(start, stop, step)]
            if not self._blocks:
                return list(range(self._base + start, self._base + max(start, stop)))
            # whole runs per block: the engine hashes 256-token chunks of long prompts, so this is hot
            ids: list[int] = []
            position = start
            while position < stop:
                block = min(position // MOONCAKE_BLOCK_TOKENS, len(self._blocks) - 1)
                run_end = (
                    stop if block == len(self._blocks) - 1 else min(stop, (block + 1) * MOONCAKE_BLOCK_TOKENS)
                )
                ids.extend([self._blocks[block]] * (run_end - position))
                position = run_end
            return ids
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(index)
        return self._at(index)


def prompt_ids(request: TraceRequest, number: int) -> BlockTokens:
    """The token ids request `number` of a trace sends."""
    if request.block_ids:
        return BlockTokens(request.prompt_tokens, request.block_ids)
    return BlockTokens(request.prompt_tokens, base=(number + 1) * AZURE_ID_STRIDE % AZURE_ID_SPACE)


def _open_text(path: Path) -> io.TextIOBase:
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
        return open(path, encoding="utf-8", newline="")
    except OSError as error:
        raise TraceError(f"{path}: cannot open: {error.strerror or error}") from error


def _positive_int(raw: object, where: str, field: str, minimum: int) -> int:
    if isinstance(raw, bool):
        raise TraceError(f"{where}: field {field!r} must be an integer, got {raw!r}")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        value = int(raw)
    else:
        raise TraceError(f"{where}: field {field!r} must be an integer, got {raw!r}")
    if value < minimum:
        raise TraceError(f"{where}: field {field!r} must be >= {minimum}, got {value}")
    return value


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _read_azure(path: Path) -> list[TraceRequest]:
    rows: list[tuple[datetime, int, int]] = []
    with _open_text(path) as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError(f"{path}: empty file, expected a header {','.join(AZURE_COLUMNS)}")
        columns = [name.strip() for name in header]
        missing = [name for name in AZURE_COLUMNS if name not in columns]
        if missing:
            raise TraceError(
                f"{path}, line 1: missing column(s) {', '.join(missing)} (have {', '.join(columns)})"
            )
        at = {name: columns.index(name) for name in AZURE_COLUMNS}
        for values in reader:
            line = reader.line_num
            where = f"{path}, line {line}"
            if not values:
                continue
            if len(values) != len(columns):
                raise TraceError(f"{where}: {len(values)} fields, the header has {len(columns)}")
            stamp = values[at["TIMESTAMP"]].strip()
            try:
                # Azure writes 7 fractional digits; Python parses at most 6.
                head, _, fraction = stamp.partition(".")
                when = datetime.fromisoformat(f"{head}.{(fraction + '000000')[:6]}" if fraction else head)
            except ValueError:
                raise TraceError(f"{where}: field 'TIMESTAMP' is not a date and time: {stamp!r}") from None
            prompt = _positive_int(values[at["ContextTokens"]], where, "ContextTokens", 1)
            output = _positive_int(values[at["GeneratedTokens"]], where, "GeneratedTokens", 0)
            rows.append((when, prompt, max(output, 1)))
    if not rows:
        raise TraceError(f"{path}: no requests after the header")
    start = min(when for when, _, _ in rows)
    requests = [TraceRequest((when - start).total_seconds(), p, o) for when, p, o in rows]
    return sorted(requests, key=lambda r: r.arrival)


def _read_mooncake(path: Path) -> list[TraceRequest]:
    requests: list[TraceRequest] = []
    with _open_text(path) as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {line_number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise TraceError(f"{where}: not JSON: {error.msg}") from None
            if not isinstance(record, dict):
                raise TraceError(f"{where}: expected a JSON object")
            for field in ("timestamp", "input_length", "output_length"):
                if field not in record:
                    raise TraceError(f"{where}: missing field {field!r}")
            stamp_ms = _positive_int(record["timestamp"], where, "timestamp", 0)
            prompt = _positive_int(record["input_length"], where, "input_length", 1)
            output = _positive_int(record["output_length"], where, "output_length", 0)
            hashes = record.get("hash_ids", [])
            if not isinstance(hashes, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hashes
            ):
                raise TraceError(f"{where}: field 'hash_ids' must be a list of integers")
            if hashes and len(hashes) != math.ceil(prompt / MOONCAKE_BLOCK_TOKENS):
                raise TraceError(
                    f"{where}: field 'hash_ids' has {len(hashes)} blocks, input_length {prompt} needs "
                    f"{math.ceil(prompt / MOONCAKE_BLOCK_TOKENS)} of {MOONCAKE_BLOCK_TOKENS} tokens"
                )
            requests.append(TraceRequest(stamp_ms / 1000, prompt, max(output, 1), tuple(hashes)))
    if not requests:
        raise TraceError(f"{path}: no requests")
    start = min(r.arrival for r in requests)
    return sorted((replace(r, arrival=r.arrival - start) for r in requests), key=lambda r: r.arrival)


def resolve(source: str) -> Path:
    """A vendored trace by name, else a path."""
    if source in VENDORED:
        return DATA_DIR / VENDORED[source]
    path = Path(source).expanduser()
    if not path.exists():
        raise TraceError(f"{source}: no such file, and not a vendored trace ({', '.join(sorted(VENDORED))})")
    return path


def load(source: str) -> list[TraceRequest]:
    """Read a trace (a vendored name or a path); the format follows the file name (.csv or .jsonl, maybe
    .gz)."""
    path = resolve(source)
    name = path.name.removesuffix(".gz")
    if name.endswith(".csv"):
        return _read_azure(path)
    if name.endswith(".jsonl"):
        return _read_mooncake(path)
    raise TraceError(
        f"{path}: unknown trace format (expected .csv for Azure or .jsonl for Mooncake, maybe .gz)"
    )


def shape(
    requests: Sequence[TraceRequest],
    *,
    start: float = 0.0,
    duration: float | None = None,
    rate: float = 1.0,
    max_requests: int | None = None,
) -> list[TraceRequest]:
    """Cut [start, start + duration) of the trace (its own seconds), then replay it `rate` times faster."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if start < 0 or (duration is not None and duration <= 0):
        raise ValueError("start must be >= 0 and duration > 0")
    end = math.inf if duration is None else start + duration
    cut = [r for r in requests if start <= r.arrival < end]
    if max_requests is not None:
        cut = cut[:max_requests]
    if not cut:
        raise ValueError(f"no requests between {start:g}s and {end:g}s of the trace")
    return [replace(r, arrival=(r.arrival - start) / rate) for r in cut]


def summary(requests: Sequence[TraceRequest], threshold: int) -> Iterator[str]:
    prompts = sorted(r.prompt_tokens for r in requests)
    span = requests[-1].arrival if requests else 0.0
    above = sum(p >= threshold for p in prompts)
    yield (
        f"{len(requests)} requests over {span:.0f}s ({len(requests) / max(span, 1e-9):.2f} req/s), "
        f"prompt p50 {prompts[len(prompts) // 2]} tokens, {100 * above / len(prompts):.0f}% >= {threshold}"
    )


def _lengths(source: Sequence[TraceRequest]) -> list[TraceRequest]:
    if not source:
        raise ValueError("a synthetic load needs a trace to draw prompt and output lengths from")
    return list(source)


def _thinned(
    rate_at: Callable[[float], float], peak: float, duration: float, random: Random
) -> Iterator[float]:
    """Arrival times of a Poisson process of intensity rate_at(t) <= peak (Lewis-Shedler thinning)."""
    at = 0.0
    while True:
        at += random.expovariate(peak)
        if at >= duration:
            return
        if random.random() * peak < rate_at(at):
            yield at


def _draw(times: Iterable[float], source: Sequence[TraceRequest], random: Random) -> list[TraceRequest]:
    pool = _lengths(source)
    return [replace(random.choice(pool), arrival=at) for at in times]


def diurnal(
    source: Sequence[TraceRequest],
    *,
    duration: float,
    mean_rate: float,
    swing: float = 0.7,
    period: float | None = None,
    seed: int = 0,
) -> list[TraceRequest]:
    """A day compressed into `period` (default: the whole duration): Poisson arrivals at
    mean_rate x (1 - swing x cos(2 pi t / period)), quietest at the start and end, busiest in the middle.
    Each request's (prompt, output) pair, and Mooncake blocks, are drawn from the source trace."""
    if duration <= 0 or mean_rate <= 0 or not 0 <= swing < 1:
        raise ValueError("a diurnal load needs duration > 0, mean_rate > 0 and 0 <= swing < 1")
    cycle = period or duration
    random = Random(seed)

    def rate_at(t: float) -> float:
        return mean_rate * (1 - swing * math.cos(2 * math.pi * t / cycle))

    return _draw(_thinned(rate_at, mean_rate * (1 + swing), duration, random), source, random)


def bursty(
    source: Sequence[TraceRequest],
    *,
    duration: float,
    base_rate: float,
    burst_rate: float,
    burst_seconds: float = 60.0,
    mean_gap_seconds: float = 600.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """Poisson arrivals at base_rate, with bursts at burst_rate lasting burst_seconds whose starts are
    themselves Poisson, mean_gap_seconds apart (an on/off modulated process). Lengths drawn as in diurnal."""
    if (
        duration <= 0
        or base_rate <= 0
        or burst_rate < base_rate
        or burst_seconds <= 0
        or mean_gap_seconds <= 0
    ):
        raise ValueError(
            "a bursty load needs duration, base_rate, burst_seconds and mean_gap_seconds > 0 and "
            "burst_rate >= base_rate"
        )
    random = Random(seed)
    bursts: list[float] = []
    at = random.expovariate(1 / mean_gap_seconds)
    while at < duration:
        bursts.append(at)
        at += burst_seconds + random.expovariate(1 / mean_gap_seconds)

    def rate_at(t: float) -> float:
        index = bisect_right(bursts, t) - 1
        return burst_rate if index >= 0 and t < bursts[index] + burst_seconds else base_rate

    return _draw(_thinned(rate_at, burst_rate, duration, random), source, random)


def superpose(
    requests: Sequence[TraceRequest], copies: int, shift_seconds: float = 0.0
) -> list[TraceRequest]:
    """`copies` copies of a trace at once (copy k shifted k x shift_seconds later, cut to the original
    span): the same shape over time at `copies` times the load. Mooncake blocks get ids of their own per copy,
    so copies share no content (the block id space is shifted past the trace's largest id)."""
    if copies < 1 or shift_seconds < 0:
        raise ValueError("copies must be >= 1 and shift_seconds >= 0")
    if not requests:
        return []
    span = max(r.arrival for r in requests)
    offset = 1 + max((max(r.block_ids, default=0) for r in requests), default=0)
    merged = [
        replace(
            r,
            arrival=r.arrival + copy * shift_seconds,
            block_ids=tuple(b + copy * offset for b in r.block_ids),
        )
        for copy in range(copies)
        for r in requests
        if r.arrival + copy * shift_seconds <= span
    ]
    return sorted(merged, key=lambda r: r.arrival)
