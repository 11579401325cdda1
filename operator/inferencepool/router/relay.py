"""The decode leg's answer to the client: a whole body as is, or an SSE stream relayed chunk by chunk with the
router-observed TTFT and inter-token gaps measured on the way (one write per upstream read).

A relay that may still be retried (`retriable`: the decode leg of a disaggregated request, which fails
when its KV transfer failed) sends nothing to the client until the first event arrives and is not an
error: a failure before that raises NothingSent, and the caller serves the request colocated instead.

A stream's headers go to the client with its first event, so a stream whose pod hangs after answering the
headers but before its first event (the pod leaves the table: engine_load.py) can still go elsewhere: while
nothing was relayed, the relay looks at the pod a few times a second and, once it is unresponsive,
drops the leg and raises NothingSent for the caller to serve the request on another pod.

A stream whose engine dies after the client got part of the answer is resumed on another decode pod when
the caller passes a Resumable (see resume.py): the relay then keeps what it sent and never sends a partial
event, so the continuation's events follow whole ones and the client sees one answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferencepool.router import resume
from inferencepool.router.errors import UpstreamError, error_body
from inferencepool.router.http1 import Headers, Reply, UpstreamFailure
from inferencepool.router.legs import Leg, Legs
from inferencepool.router.metrics import RouterMetrics
from inferencepool.router.prompt import Endpoint
from inferencepool.scheduling.decider import Route

log = logging.getLogger("inferencepool.router")

ROUTE_HEADER = "X-Inferencepool-Route"
_RESUMES = 2  # decode pods tried after the first one died mid-stream
_WATCH_SECONDS = 0.25  # how often a stream without its first event looks whether its pod hangs


class NothingSent(Exception):
    """The decode leg failed before anything reached the client, so the request can still be served
    (`pod`: the one it failed on, when another should serve it)."""

    def __init__(self, message: str, pod: str | None = None) -> None:
        super().__init__(message)
        self.pod = pod


def is_error_event(data: bytes) -> bool:
    """Whether a stream's first bytes are an error event (vLLM: `data: {"error": {...}}`) and not a token."""
    head = data.lstrip()
    if not head.startswith(b"data:"):
        return False
    return head[5:].lstrip().startswith(b'{"error"')


@dataclass(slots=True)  # not frozen: built for every streamed request, and frozen init is slower
class Resumable:
    """What resuming a stream needs of the client's request."""

    endpoint: Endpoint
    body: dict[str, Any]
    path: str
    headers: list[tuple[str, str]]


Head = tuple[int, str, Headers]


class _HangWatch:
    """While a stream has sent nothing, looks every `period` whether its pod is unresponsive (engine_load.py),
    and then drops the leg (`hung`). An object, not a closure that re-arms itself: that one's closure held
    itself, a reference cycle every request left for the garbage collector."""

    __slots__ = ("_handle", "_leg", "_loop", "_period", "hung")

    def __init__(self, loop: asyncio.AbstractEventLoop, period: float, leg: Leg) -> None:
        self._loop = loop
        self._period = period
        self._leg = leg
        self.hung = False
        self._handle: asyncio.TimerHandle | None = loop.call_later(period, self._look)

    def _look(self) -> None:
        pod = self._leg.pod
        if pod.unresponsive:
            self._handle = None
            self.hung = True
            self._leg.response.abort(f"{pod.role} pod {pod.name} hung before its first event")
        else:
            self._handle = self._loop.call_later(self._period, self._look)

    def stop(self) -> None:
        """No more looks (the handle, which holds this object, is let go)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class Relay:
    """`itl_sample`, when given, also receives every inter-token gap, and `direct_ttft_sample` the time to
    first token of every prompt prefilled on a decode pod (direct and fallback routes): the adaptive
    threshold's signals."""

    def __init__(
        self,
        metrics: RouterMetrics,
        itl_sample: Callable[[float], None] | None,
        legs: Legs,
        first_byte_seconds: float,  # a resumed stream's headers (legs.py: a pod silent so long is hung)
        direct_ttft_sample: Callable[[float], None] | None = None,
    ) -> None:
        self.metrics = metrics
        self.itl_sample = itl_sample
        self.direct_ttft_sample = direct_ttft_sample
        self.legs = legs  # to resume a stream on another decode pod
        self.first_byte_seconds = first_byte_seconds

    async def send(
        self,
        reply: Reply,
        leg: Leg,
        route: Route,
        stream: bool,
        started: float,
        retriable: bool = False,
        resumable: Resumable | None = None,
    ) -> None:
        upstream = leg.response
        pod = leg.pod
        if retriable and upstream.status != 200:
            self.metrics.upstream_errors.labels(pod.name, pod.role, "status").inc()
            raise NothingSent(f"decode pod {pod.name} answered {upstream.status}")
        if not stream or upstream.status != 200:
            try:
                payload = await upstream.body()
            except UpstreamFailure as failure:
                self.metrics.upstream_errors.labels(pod.name, pod.role, failure.kind).inc()
                if retriable and failure.kind != "timeout":
                    raise NothingSent(f"decode pod {pod.name} failed: {failure}") from failure
                status = 504 if failure.kind == "timeout" else 502
                raise UpstreamError(f"decode pod {pod.name} failed: {failure}", status) from failure
            reply.send(
                upstream.status,
                payload,
                upstream.content_type or "application/json",
                ((ROUTE_HEADER, route),),
            )
            return
        head: Head = (
            200,
            upstream.content_type or "text/event-stream",
            (("Cache-Control", "no-cache"), (ROUTE_HEADER, route)),
        )
        sent: list[bytes] | None = [] if resumable is not None else None
        broke = await self._stream(reply, leg, route, started, head, retriable, sent, None)
        if broke is None:
            return
        if resumable is not None and sent is not None and not reply.closed:
            if await self._resume(reply, leg, route, started, head, resumable, sent):
                self.metrics.streams_resumed.labels("resumed").inc()
                return
            self.metrics.streams_resumed.labels("broken").inc()
        # Headers are out, so the status cannot change: end the stream with an SSE error event instead.
        message = f"decode pod {pod.name} failed mid-stream: {broke}"
        reply.end(b"data: " + error_body(message, "BadGatewayError", 502) + b"\n\n")

    async def _stream(
        self,
        reply: Reply,
        leg: Leg,
        route: Route,
        started: float,
        head: Head,
        retriable: bool,
        sent: list[bytes] | None,
        continued: resume.Continued | None,
    ) -> UpstreamFailure | None:
        """Relay one leg's stream: None once it ended, the failure when it broke after the client got
        something (NothingSent when `retriable` and nothing was sent). With `sent`, keeps every byte sent and
        holds a partial event back until it is whole. A continuation's events go out as `continued` rewrites
        them."""
        upstream = leg.response
        pod = leg.pod
        reply.on_backpressure(upstream.pause, upstream.resume)
        itl_metric = self.metrics.itl_by_route[route]
        ttft_metric = self.metrics.ttft_by_route[route]
        sample = self.itl_sample
        ttft_sample = self.direct_ttft_sample if route != "disaggregated" else None
        previous = 0.0
        refused: list[bytes] = []
        held = b""
        # the pod leaves the table on the scrape's clock: look a few times a second, not once a deadline
        watch = (
            None
            if reply.started
            else _HangWatch(asyncio.get_running_loop(), min(self.first_byte_seconds, _WATCH_SECONDS), leg)
        )

        def on_read(pieces: list[bytes]) -> None:
            nonlocal previous, held
            if pieces:
                # The pieces of one read arrived together: the first one's gap is since the last read, the
                # others' none.
                now = time.monotonic()
                for piece in pieces:
                    if previous:
                        gap = (now - previous) / (piece.count(b"data:") or 1)
                        itl_metric.observe(gap)
                        if sample is not None:
                            sample(gap)
                    else:
                        if watch is not None:
                            watch.stop()  # something came: the pod does not hang
                        if continued is None:
                            ttft_metric.observe(now - started)
                            if leg.first_token is not None:
                                # the pod has prefilled it (or loaded its KV): the router learns
                                leg.first_token()
                            if ttft_sample is not None:
                                ttft_sample(now - started)
                    previous = now
                data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            else:
                data = b""
            if not reply.started and retriable and is_error_event(data):
                refused.append(data)
                upstream.abort("the decode leg's first event is an error")
                return
            complete = upstream.complete
            if sent is not None:
                if held:
                    data, held = held + data, b""
                if not complete and not data.endswith(b"\n\n"):
                    whole = data.rfind(b"\n\n") + 2  # 1 when none: nothing whole to send yet
                    whole = whole if whole > 1 else 0
                    data, held = data[:whole], data[whole:]
                if continued is not None:
                    data = continued.events(data)
                sent.append(data)
            # Everything one read brought goes out in one write: the first with the headers, the last with
            # the end of the body.
            if complete:
                if not reply.started:
                    reply.start(*head)
                reply.end(data)
            elif reply.started:
                reply.write(data)
            else:
                reply.start(*head, data)

        try:
            await upstream.relay(on_read)
        except UpstreamFailure as failure:
            self.metrics.upstream_errors.labels(pod.name, pod.role, "stream").inc()
            if watch is not None and watch.hung and not reply.started:
                raise NothingSent(
                    f"{pod.role} pod {pod.name} hung before its first event", pod.name
                ) from None
            if refused:
                raise self._refused(pod.name, refused[0]) from failure
            if not reply.started:
                if failure.kind != "timeout":
                    raise NothingSent(
                        f"decode pod {pod.name} failed before its first event: {failure}", pod.name
                    ) from None
                reply.start(*head)
            return failure
        finally:
            if watch is not None:
                watch.stop()
        if refused:  # the whole answer was one error event
            self.metrics.upstream_errors.labels(pod.name, pod.role, "stream").inc()
            raise self._refused(pod.name, refused[0])
        if reply.closed:
            self.metrics.client_disconnects.inc()
        if not reply.started:
            reply.start(*head)  # an empty stream
        reply.end()
        return None

    async def _resume(
        self,
        reply: Reply,
        leg: Leg,
        route: Route,
        started: float,
        head: Head,
        resumable: Resumable,
        sent: list[bytes],
    ) -> bool:
        """Continue the answer on other decode pods; True once the client got the rest of it."""
        avoid = {leg.pod.name}
        for _ in range(_RESUMES):
            done = resume.progress(b"".join(sent), resumable.endpoint)
            if done is None:
                return False
            if done.finished:
                reply.end(b"data: [DONE]\n\n")  # the engine died between its last event and [DONE]
                return True
            payload = resume.continuation(resumable.body, resumable.endpoint, done)
            if payload is None:
                return False
            log.warning("decode pod %s died mid-stream: resuming after %d tokens", leg.pod.name, done.tokens)
            try:
                async with self.legs.open(
                    "decode",
                    resumable.path,
                    payload,
                    resumable.headers,
                    None,
                    True,
                    self.first_byte_seconds,
                    exclude=frozenset(avoid),
                ) as continued:
                    if continued.response.status != 200:
                        return False
                    rewrite = resume.Continued.of(b"".join(sent), done)
                    failure = await self._stream(reply, continued, route, started, head, False, sent, rewrite)
                    avoid.add(continued.pod.name)
            except UpstreamError as error:
                log.warning("no decode pod could resume the stream: %s", error)
                return False
            if failure is None:
                return True
        return False

    @staticmethod
    def _refused(pod: str, event: bytes) -> NothingSent:
        detail = event[:300].decode(errors="replace").strip()
        return NothingSent(f"decode pod {pod} answered an error event: {detail}")
