"""Legs: one request to an engine pod of a role, with the retries that are safe before any response byte.

A leg is an async context manager: the pod it went to counts it as in flight (pods.in_flight) from the
moment it is sent until the block ends, and its connection goes back to the pool when the body was read to
its end, else is closed (so the engine aborts the request).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from inferencepool.router.errors import UpstreamError
from inferencepool.router.http1 import Headers, Upstream, UpstreamFailure, UpstreamResponse
from inferencepool.router.metrics import RouterMetrics
from inferencepool.router.pods import EngineRole, Pod, PodSet, in_flight


@dataclass(slots=True)
class Leg:
    pod: Pod
    response: UpstreamResponse


class Legs:
    """Opens legs on the pods of a PodSet through one Upstream; counts what failed in `metrics`."""

    def __init__(self, upstream: Upstream, pods: PodSet, metrics: RouterMetrics, max_attempts: int) -> None:
        self.upstream = upstream
        self.pods = pods
        self.metrics = metrics
        self.max_attempts = max_attempts

    @contextlib.asynccontextmanager
    async def open(
        self,
        role: EngineRole,
        path: str,
        payload: bytes,
        headers: Headers,
        affinity: int | None,
        stream: bool,
        timeout_seconds: int,
        pinned: Pod | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> AsyncIterator[Leg]:
        """Send a leg to a pod of `role` (`pinned` first when given, never one in `exclude`), trying others
        while connections fail or answer 5xx before any response byte reached the caller.

        Raises UpstreamError when no pod could take it: 503 when none was available, 504 when one did not
        answer in time, else 502.
        """
        tried: set[str] = set(exclude)
        last_problem = f"no {role} pod is ready"
        for attempt in range(self.max_attempts):
            if attempt == 0 and pinned is not None and pinned.accepts_new and pinned.name not in tried:
                pod: Pod | None = pinned
            else:
                pod = self.pods.pick(role, time.monotonic(), affinity, frozenset(tried))
            if pod is None:
                break
            if attempt:
                self.metrics.retries.labels(role).inc()
            with in_flight(pod):
                try:
                    response = await self.upstream.post(
                        pod.url + path, payload, headers, stream=stream, timeout_seconds=timeout_seconds
                    )
                except UpstreamFailure as failure:
                    self.metrics.upstream_errors.labels(pod.name, role, failure.kind).inc()
                    if failure.kind == "timeout":
                        raise UpstreamError(f"{role} pod {pod.name} did not answer in time", 504) from failure
                    if failure.kind == "connect":
                        pod.record_failure(time.monotonic())
                    # Nothing came back (refused, or the pod dropped the connection): nothing reached the
                    # client either, so another pod may serve it.
                    what = (
                        "refused the connection" if failure.kind == "connect" else "failed before answering"
                    )
                    last_problem = f"{role} pod {pod.name} {what} ({failure})"
                    tried.add(pod.name)
                    continue
                if response.status >= 500:
                    try:
                        detail = (await response.body())[:300].decode(errors="replace")
                    except UpstreamFailure as failure:
                        detail = str(failure)
                    response.close()
                    self.metrics.upstream_errors.labels(pod.name, role, "status").inc()
                    last_problem = f"{role} pod {pod.name} answered {response.status}: {detail}"
                    tried.add(pod.name)
                    continue
                pod.record_success()
                try:
                    yield Leg(pod, response)
                finally:
                    response.close()
                return
        status = 503 if len(tried) == len(exclude) else 502
        raise UpstreamError(last_problem, status)
