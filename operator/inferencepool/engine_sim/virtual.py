"""Driving EngineCore in virtual time: the same loop as the HTTP server, with a clock that jumps.

`run_virtual` plays a list of arrivals through one engine and returns each request's timings; tests and the
simulator use it to ask what the timing model predicts without waiting for it. Remote reads (NIXL decode legs)
are resolved by a callback, so several virtual engines can hand KV to each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from inferencepool.engine_sim.core import EngineCore, EngineRequest, RemoteRead, RequestFailed, TokenEvent


@dataclass
class RequestTimeline:
    request_id: str
    arrival: float
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]

    @property
    def mean_itl(self) -> float:
        gaps = self.itls
        return sum(gaps) / len(gaps) if gaps else 0.0


ReadResolver = Callable[[RemoteRead, float], str | None]  # returns an error message, or None on success


def run_virtual(
    engine: EngineCore,
    arrivals: Sequence[tuple[float, EngineRequest]],
    resolve_read: ReadResolver | None = None,
    until: float = float("inf"),
) -> dict[str, RequestTimeline]:
    """Play `arrivals` (time, request) through `engine` until every request finished (or `until`)."""
    pending = sorted(arrivals, key=lambda item: item[0])
    timelines: dict[str, RequestTimeline] = {}
    now = 0.0
    position = 0
    while now <= until:
        while position < len(pending) and pending[position][0] <= now:
            arrival, request = pending[position]
            engine.add_request(request, arrival)
            timelines[request.request_id] = RequestTimeline(request.request_id, arrival)
            position += 1
        step = engine.schedule(now)
        reads = engine.take_remote_reads()  # admissions in schedule() may have asked for some
        for read in reads:
            error = resolve_read(read, now) if resolve_read else "no resolver for remote KV reads"
            failure = engine.remote_read_done(read.request_id, now, error)
            if failure is not None:
                _record(timelines, failure)
        if step is None and reads:
            continue
        if step is not None:
            for event in engine.complete(step):
                _record(timelines, event)
            now = max(step.end, now)
            continue
        candidates = [t for t in (engine.next_wakeup(),) if t is not None and t > now]
        if position < len(pending):
            candidates.append(pending[position][0])
        if not candidates:
            if engine.idle():
                break
            raise AssertionError("engine has work but nothing can make progress")
        now = min(candidates)
    return timelines


def _record(timelines: dict[str, RequestTimeline], event: TokenEvent | RequestFailed) -> None:
    timeline = timelines[event.request_id]
    if isinstance(event, RequestFailed):
        timeline.error = event.message
        return
    timeline.token_times.append(event.time)
    if event.finish_reason is not None:
        timeline.finish_reason = event.finish_reason


def run_closed_loop(
    engine: EngineCore,
    concurrency: int,
    make_request: Callable[[int], EngineRequest],
    until: float,
    stagger: float = 0.0,
) -> list[RequestTimeline]:
    """`concurrency` clients that each send a new request as soon as their previous one finished.

    Client i starts at i * stagger / concurrency. Returns every timeline (finished or not at `until`).
    """
    timelines: dict[str, RequestTimeline] = {}
    arrivals = sorted((i * stagger / concurrency, i) for i in range(concurrency))
    issued = 0
    now = 0.0

    def submit(at: float) -> None:
        nonlocal issued
        request = make_request(issued)
        issued += 1
        engine.add_request(request, at)
        timelines[request.request_id] = RequestTimeline(request.request_id, at)

    while now <= until:
        while arrivals and arrivals[0][0] <= now:
            at, _ = arrivals.pop(0)
            submit(at)
        step = engine.schedule(now)
        if step is None:
            if not arrivals:
                raise AssertionError("closed loop went idle: remote reads are not supported here")
            now = arrivals[0][0]
            continue
        for event in engine.complete(step):
            _record(timelines, event)
            if isinstance(event, TokenEvent) and event.finish_reason is not None:
                submit(event.time)
        now = max(step.end, now)
    return list(timelines.values())
