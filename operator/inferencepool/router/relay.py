"""The decode leg's answer to the client: a whole body as is, or an SSE stream relayed chunk by chunk with the
router-observed TTFT and inter-token gaps measured on the way (one write per upstream read).

A relay that may still be retried (`retriable`: the decode leg of a disaggregated request, which fails
when its KV transfer failed) sends nothing to the client until the first event arrives and is not an
error: a failure before that raises NothingSent, and the caller serves the request colocated instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from inferencepool.router.errors import UpstreamError, error_body
from inferencepool.router.http1 import Reply, UpstreamFailure
from inferencepool.router.legs import Leg
from inferencepool.router.metrics import RouterMetrics
from inferencepool.router.policy import Route

ROUTE_HEADER = "X-Inferencepool-Route"


class NothingSent(Exception):
    """The decode leg failed before anything reached the client, so the request can still be served."""


def is_error_event(data: bytes) -> bool:
    """Whether a stream's first bytes are an error event (vLLM: `data: {"error": {...}}`) and not a token."""
    head = data.lstrip()
    if not head.startswith(b"data:"):
        return False
    return head[5:].lstrip().startswith(b'{"error"')


class Relay:
    """`itl_sample`, when given, also receives every inter-token gap (the adaptive threshold's signal)."""

    def __init__(self, metrics: RouterMetrics, itl_sample: Callable[[float], None] | None) -> None:
        self.metrics = metrics
        self.itl_sample = itl_sample

    async def send(
        self, reply: Reply, leg: Leg, route: Route, stream: bool, started: float, retriable: bool = False
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
        head = (
            200,
            upstream.content_type or "text/event-stream",
            (("Cache-Control", "no-cache"), (ROUTE_HEADER, route)),
        )
        if not retriable:
            reply.start(*head)
        reply.on_backpressure(upstream.pause, upstream.resume)
        itl_metric = self.metrics.itl_by_route[route]
        ttft_metric = self.metrics.ttft_by_route[route]
        sample = self.itl_sample
        pending: list[bytes] = []
        previous = 0.0
        refused: list[bytes] = []

        def on_data(data: bytes) -> None:
            nonlocal previous
            now = time.monotonic()
            if previous:
                gap = (now - previous) / (data.count(b"data:") or 1)
                itl_metric.observe(gap)
                if sample is not None:
                    sample(gap)
            else:
                ttft_metric.observe(now - started)
            previous = now
            pending.append(data)

        def on_flush() -> None:
            # Everything one read brought goes out in one write; the last one carries the end of the body.
            data = b"".join(pending) if len(pending) != 1 else pending[0]
            pending.clear()
            if not reply.started:
                if is_error_event(data):
                    refused.append(data)
                    upstream.abort("the decode leg's first event is an error")
                    return
                reply.start(*head)
            if upstream.complete:
                reply.end(data)
            else:
                reply.write(data)

        try:
            await upstream.relay(on_data, on_flush)
        except UpstreamFailure as failure:
            self.metrics.upstream_errors.labels(pod.name, pod.role, "stream").inc()
            if refused:
                raise self._refused(pod.name, refused[0]) from failure
            if not reply.started:
                if failure.kind != "timeout":
                    raise NothingSent(
                        f"decode pod {pod.name} failed before its first event: {failure}"
                    ) from None
                reply.start(*head)
            # Headers are out, so the status cannot change: end the stream with an SSE error event instead.
            message = f"decode pod {pod.name} failed mid-stream: {failure}"
            reply.end(b"data: " + error_body(message, "BadGatewayError", 502) + b"\n\n")
            return
        if refused:  # the whole answer was one error event
            self.metrics.upstream_errors.labels(pod.name, pod.role, "stream").inc()
            raise self._refused(pod.name, refused[0])
        if reply.closed:
            self.metrics.client_disconnects.inc()
        if not reply.started:
            reply.start(*head)  # an empty stream
        reply.end()

    @staticmethod
    def _refused(pod: str, event: bytes) -> NothingSent:
        detail = event[:300].decode(errors="replace").strip()
        return NothingSent(f"decode pod {pod} answered an error event: {detail}")
