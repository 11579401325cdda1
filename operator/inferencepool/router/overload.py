"""Overload shedding: the router answers 429 instead of queueing without bound.

A pool is saturated when every engine of it that takes requests is queueing: requests wait inside it (its
vllm:num_requests_waiting, scraped by engine_load.py) or its KV is full. Work sent there waits behind others
however it is routed, so its first token misses any TTFT target by as long as the queue lasts. When every
pool a request may go to is saturated (the decode pool, and the prefill pool unless the policy is
Colocated), the request waits in the router's bounded queue for the scrape to find room; a request that
finds the queue full is shed (429 with Retry-After, OpenAI's rate-limit error), or, when it carries a
higher priority (the `X-Inferencepool-Priority` header, 0-9, default 0), the lowest-priority request queued
is shed in its place (the newest of equals). One that waits past `overload.queueMilliseconds` is shed too.

Saturation is computed once per scrape, not per request: admitting a request is one flag and one length
when nothing is saturated.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from inferencepool.router.pods import Pod, PodSet

PRIORITY_HEADER = "x-inferencepool-priority"
PRIORITIES = range(10)


class Shed(Exception):
    """The request is answered 429: every pool it could use is saturated and the router's queue is full
    (or it waited there too long)."""

    def __init__(self, message: str, priority: int) -> None:
        super().__init__(message)
        self.priority = priority


def pool_saturated(pods: list[Pod]) -> bool:
    """Every pod that takes requests queues them (none: not saturated; the router answers 503 then)."""
    serving = [pod for pod in pods if pod.accepts_new and not pod.unresponsive]
    return bool(serving) and all(pod.engine_waiting > 0 or pod.kv_full for pod in serving)


@dataclass(order=True)
class _Waiter:
    priority: int
    order: int  # negated arrival: of equal priorities the newest sorts first, so it is shed first
    future: asyncio.Future[None] = field(compare=False)


class Admission:
    """The bounded queue in front of the pools; `refresh()` after each scrape."""

    def __init__(self, pods: PodSet, colocated: bool, queue_limit: int, queue_seconds: float) -> None:
        self.pods = pods
        self.colocated = colocated
        self.queue_limit = queue_limit
        self.queue_seconds = queue_seconds
        self.saturated = False
        self._queue: list[_Waiter] = []
        self._arrivals = itertools.count()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def refresh(self) -> None:
        """Read saturation off the table (the engines' scraped figures); let queued requests go, the highest
        priority first, once a pool has room."""
        decode = pool_saturated(self.pods.by_role("decode"))
        prefill = self.colocated or pool_saturated(self.pods.by_role("prefill"))
        self.saturated = decode and prefill
        if not self.saturated and self._queue:
            for waiter in sorted(self._queue, reverse=True):
                if not waiter.future.done():
                    waiter.future.set_result(None)
            self._queue.clear()

    async def admit(self, priority: int) -> None:
        """Return when the request may go on; raise Shed when it may not."""
        if not self.saturated:
            return
        if len(self._queue) >= self.queue_limit:
            lowest = min(self._queue) if self._queue else None
            if lowest is None or lowest.priority >= priority:
                raise Shed("every pool is past its target and the router's queue is full", priority)
            self._queue.remove(lowest)
            lowest.future.set_exception(Shed("shed for a request of a higher priority", lowest.priority))
        waiter = _Waiter(priority, -next(self._arrivals), asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), self.queue_seconds)
        except TimeoutError:
            if waiter in self._queue:
                self._queue.remove(waiter)
            raise Shed(
                f"every pool stayed past its target for {self.queue_seconds:g} s while it was queued",
                priority,
            ) from None
        except asyncio.CancelledError:  # the client went away while queued
            if waiter in self._queue:
                self._queue.remove(waiter)
            raise
