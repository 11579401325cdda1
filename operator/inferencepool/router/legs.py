"""Legs: one request to an engine pod of a role, with the retries that are safe before any response byte.

A streamed leg whose pod sends no response headers by the caller's deadline is on a hung pod (an engine
sends a stream's headers as soon as it accepted the request, long before its first token): nothing was
received or relayed, so it goes to another pod, and the hung one leaves the table (`Pod.unresponsive`) until
its /metrics answers (engine_load.py). A whole (non-streamed) answer has no such early byte: its timeout is
final.

A leg is an async context manager: the pod it went to counts it as in flight (pods.in_flight, the one
place that counts) from the moment it is sent until the block ends, and its connection goes back to the
pool when the body was read to its end, else is closed (so the engine aborts the request).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from inferencepool.router.errors import UpstreamError
from inferencepool.router.http1 import Headers, Upstream, UpstreamFailure, UpstreamResponse
from inferencepool.router.metrics import RouterMetrics
from inferencepool.router.pods import EngineRole, Pod, PodSet, in_flight


@dataclass(slots=True)
class Leg:
    pod: Pod
    response: UpstreamResponse
    first_token: Callable[[], None] | None = None  # called once, at its first token (relay.py)


class Legs:
    """Opens legs on the pods of a PodSet through one Upstream; counts what failed in `metrics`."""

    def __init__(self, upstream: Upstream, pods: PodSet, metrics: RouterMetrics, max_attempts: int) -> None:
        self.upstream = upstream
        self.pods = pods
        self.metrics = metrics
        self.max_attempts = max_attempts

    def open(
        self,
        role: EngineRole,
        path: str,
        payload: bytes,
        headers: Headers,
        affinity: int | None,
        stream: bool,
        timeout_seconds: float,
        pinned: Pod | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> OpenLeg:
        """`async with legs.open(...) as leg`: send a leg to a pod of `role` (`pinned` first when given, never
        one in `exclude`), trying others while connections fail or answer 5xx before any response byte
        reached the caller.

        Raises UpstreamError when no pod could take it: 503 when none was available, 504 when one did not
        answer in time, else 502.
        """
        return OpenLeg(self, role, path, payload, headers, affinity, stream, timeout_seconds, pinned, exclude)


class OpenLeg:
    """One leg for the length of an `async with` block (a class, not a generator: it runs for every leg)."""

    __slots__ = (
        "_affinity",
        "_exclude",
        "_headers",
        "_hold",
        "_legs",
        "_path",
        "_payload",
        "_pinned",
        "_response",
        "_role",
        "_stream",
        "_timeout",
    )

    def __init__(
        self,
        legs: Legs,
        role: EngineRole,
        path: str,
        payload: bytes,
        headers: Headers,
        affinity: int | None,
        stream: bool,
        timeout_seconds: float,
        pinned: Pod | None,
        exclude: frozenset[str],
    ) -> None:
        self._legs = legs
        self._role = role
        self._path = path
        self._payload = payload
        self._headers = headers
        self._affinity = affinity
        self._stream = stream
        self._timeout = timeout_seconds
        self._pinned = pinned
        self._exclude = exclude
        self._hold: in_flight | None = None
        self._response: UpstreamResponse | None = None

    async def __aenter__(self) -> Leg:
        legs, role = self._legs, self._role
        metrics = legs.metrics
        tried: set[str] = set(self._exclude)
        pinned = self._pinned
        last_problem = f"no {role} pod is ready" + ("" if pinned is None else " for the KV's revision")
        timed_out = False
        if pinned is not None:
            # A pinned leg may carry another pod's KV handle: a retry stays on pods the handle is valid on
            # (the same KV-compatibility label), never crossing a revision mid-rollout.
            tried.update(p.name for p in legs.pods.pods.values() if p.kv_compat != pinned.kv_compat)
        barred = len(tried)  # nothing tried beyond these: 503
        for attempt in range(legs.max_attempts):
            if attempt == 0 and pinned is not None and pinned.accepts_new and pinned.name not in tried:
                pod: Pod | None = pinned
            else:
                pod = legs.pods.pick(role, time.monotonic(), self._affinity, frozenset(tried))
            if pod is None:
                break
            if attempt:
                metrics.retries.labels(role).inc()
            with in_flight(pod) as hold:
                try:
                    response = await legs.upstream.post(
                        pod.url + self._path, self._payload, self._headers, stream=self._stream,
                        timeout_seconds=self._timeout,
                    )  # fmt: skip
                except UpstreamFailure as failure:
                    metrics.upstream_errors.labels(pod.name, role, failure.kind).inc()
                    if failure.kind == "timeout" and self._stream:
                        if not pod.unresponsive:  # one cooldown step per hang, however many legs it held
                            pod.unresponsive = True
                            pod.record_failure(time.monotonic())  # /metrics may answer while requests hang
                        last_problem = f"{role} pod {pod.name} sent nothing in {self._timeout:g} s"
                        timed_out = True
                        tried.add(pod.name)
                        continue
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
                    finally:
                        response.close()
                    metrics.upstream_errors.labels(pod.name, role, "status").inc()
                    last_problem = f"{role} pod {pod.name} answered {response.status}: {detail}"
                    tried.add(pod.name)
                    continue
                pod.record_success()
                # The leg outlives this block: the count stays up until __aexit__.
                self._hold, self._response = hold.keep(), response
                return Leg(pod, response)
        status = 503 if len(tried) == barred else 504 if timed_out else 502
        raise UpstreamError(last_problem, status)

    async def __aexit__(self, *_: object) -> None:
        if self._response is not None:
            self._response.close()
        if self._hold is not None:
            self._hold.release()
