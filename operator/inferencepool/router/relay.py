"""The decode leg's answer to the client: a whole body as is, or an SSE stream relayed chunk by chunk with the
router-observed TTFT and inter-token gaps measured on the way (one write per upstream read)."""

from __future__ import annotations

import time
from collections.abc import Callable

from inferencepool.router.errors import UpstreamError, error_body
from inferencepool.router.http1 import Reply, UpstreamFailure
from inferencepool.router.legs import Leg
from inferencepool.router.metrics import RouterMetrics
from inferencepool.router.policy import Route

ROUTE_HEADER = "X-Inferencepool-Route"


class Relay:
    """`itl_sample`, when given, also receives every inter-token gap (the adaptive threshold's signal)."""

    def __init__(self, metrics: RouterMetrics, itl_sample: Callable[[float], None] | None) -> None:
        self.metrics = metrics
        self.itl_sample = itl_sample

    async def send(self, reply: Reply, leg: Leg, route: Route, stream: bool, started: float) -> None:
        upstream = leg.response
        if not stream or upstream.status != 200:
            try:
                payload = await upstream.body()
            except UpstreamFailure as failure:
                self.metrics.upstream_errors.labels(leg.pod.name, leg.pod.role, failure.kind).inc()
                status = 504 if failure.kind == "timeout" else 502
                raise UpstreamError(f"decode pod {leg.pod.name} failed: {failure}", status) from failure
            reply.send(
                upstream.status,
                payload,
                upstream.content_type or "application/json",
                ((ROUTE_HEADER, route),),
            )
            return
        reply.start(
            200,
            upstream.content_type or "text/event-stream",
            (("Cache-Control", "no-cache"), (ROUTE_HEADER, route)),
        )
        reply.on_backpressure(upstream.pause, upstream.resume)
        itl_metric = self.metrics.itl_by_route[route]
        ttft_metric = self.metrics.ttft_by_route[route]
        sample = self.itl_sample
        pending: list[bytes] = []
        previous = 0.0

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
            if upstream.complete:
                reply.end(data)
            else:
                reply.write(data)

        try:
            await upstream.relay(on_data, on_flush)
        except UpstreamFailure as failure:
            # Headers are out, so the status cannot change: end the stream with an SSE error event instead.
            self.metrics.upstream_errors.labels(leg.pod.name, leg.pod.role, "stream").inc()
            message = f"decode pod {leg.pod.name} failed mid-stream: {failure}"
            reply.end(b"data: " + error_body(message, "BadGatewayError", 502) + b"\n\n")
            return
        if reply.closed:
            self.metrics.client_disconnects.inc()
        reply.end()
