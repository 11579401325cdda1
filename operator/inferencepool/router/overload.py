"""Overload shedding: a bounded queue per pool, and 429 instead of queueing without bound.

A request takes a slot of each pool it runs on: a direct or Colocated one of the decode pool, a lent one of
the prefill pool, a disaggregated one of the decode pool (for all of it) and then of the prefill pool (for
its prefill leg), the two within one wait. So a saturated prefill pool sheds what would go through it while
direct requests still reach a decode pool with room, and a saturated decode pool holds back both (the
decode slot first: a prefill slot is never held while waiting for a decode slot, and no prefill pod's KV
waits for a decode pod to take it).

A slot is free while the router holds fewer requests on the pool than its engines run without queueing.
Each engine pod's capacity is learned off its /metrics (engine_load.py): the most requests it ran at the
last few scrapes that found others waiting inside it (this router's share of them, by its own requests
there against the engine's; the most, as one scrape may catch the engine between two steps, new requests
not yet taken); raised by one at a scrape that finds it running all the router gave it with nothing
waiting, after twice as many such scrapes each time a raise made it queue (the request that tried the
raise waits inside the engine). A pod that has not queued yet (a new one) counts as the mean of those that
have; until one has, the pool has no bound and takes requests unless a scrape found every pod of it
queueing. So admitted requests do not wait inside the engines, where every request is equal and the wait
is unbounded; they wait here, highest priority first (`X-Inferencepool-Priority`, 0-9, default 0).

Each pool's queue is bounded by what it drains within the wait a request may spend in the router
(`overload.maxQueueMilliseconds`, half the TTFT target unless set, so that the admitted request's TTFT, the
wait plus its prefill, stays within the target): the pool's slots over the mean time a request holds one,
times that wait, at most `overload.maxQueuedRequests`. A request that finds its pool's queue full is shed (429
with Retry-After, OpenAI's rate-limit error) or, when it has a higher priority than the lowest queued,
that one is shed in its place (the newest of equals); one that waits past the wait is shed too.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferencepool.router.pods import Pod, PodSet
from inferencepool.scheduling.endpoint import EngineRole

PRIORITY_HEADER = "x-inferencepool-priority"
PRIORITIES = range(10)
POOLS: tuple[EngineRole, ...] = ("prefill", "decode")
_HOLD_WEIGHT = 0.1  # a finished hold's weight in the pool's mean hold time
SEEN_SCRAPES = 4  # a pod's capacity is the most it ran at this many of the last scrapes that found a queue
MAX_PROBE_SCRAPES = 64  # the longest a pod's capacity goes untried, in scrapes (32 s at 500 ms)


class Shed(Exception):
    """The request is answered 429: its pool has no free slot and its queue is full (or it waited there
    too long, or a request of a higher priority took its place)."""

    def __init__(self, message: str, priority: int, pool: EngineRole) -> None:
        super().__init__(message)
        self.priority = priority
        self.pool = pool


def serving(pod: Pod) -> bool:
    return pod.accepts_new and not pod.unresponsive


def pool_saturated(pods: list[Pod]) -> bool:
    """Every pod that takes requests queues them (none: not saturated; the router answers 503 then)."""
    live = [pod for pod in pods if serving(pod)]
    return bool(live) and all(pod.engine_waiting > 0 or pod.kv_full for pod in live)


@dataclass(order=True)
class _Waiter:
    priority: int
    order: int  # negated arrival: of equal priorities the oldest is let in first, the newest shed first
    future: asyncio.Future[None] = field(compare=False)


class Slot:
    """One request's hold on a pool's slot: `release()` once, however the request ends (later calls do
    nothing)."""

    __slots__ = ("granted", "pool", "waited")

    def __init__(self, pool: PoolQueue, waited: bool) -> None:
        self.pool = pool
        self.waited = waited  # it queued: the pods it was scheduled on may have changed meanwhile
        self.granted: float | None = time.monotonic()

    @property
    def role(self) -> EngineRole:
        return self.pool.role

    def release(self) -> None:
        if self.granted is not None:
            held, self.granted = time.monotonic() - self.granted, None
            self.pool.returned(held)


class PoolQueue:
    """The slots of one pool (prefill or decode) and the requests waiting for one."""

    def __init__(
        self, role: EngineRole, pods: PodSet, capacity: dict[str, int], most_queued: int, wait_seconds: float
    ) -> None:
        self.role = role
        self.pods = pods
        self.capacity = capacity  # learned per pod name (shared by both pools' queues)
        self.most_queued = most_queued
        self.wait_seconds = wait_seconds
        self.held = 0  # slots the router's requests hold on this pool
        self.hold_seconds: float | None = None  # mean time a request holds a slot
        self.holds = 0
        self.saturated = False  # the last scrape found every pod of the pool queueing
        self._queue: list[_Waiter] = []
        self._arrivals = itertools.count()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def slots(self) -> int | None:
        """Requests the pool's engines run without queueing (None: no pod of it has queued yet, no bound); a
        pod that has not queued yet (a new one) counts as the mean of those that have."""
        known: list[int] = []
        unknown = 0
        for pod in self.pods.by_role(self.role):
            if serving(pod):
                learned = self.capacity.get(pod.name)
                if learned is None:
                    unknown += 1
                else:
                    known.append(learned)
        if not known:
            return None
        return sum(known) + round(unknown * sum(known) / len(known))

    def has_room(self) -> bool:
        slots = self.slots()
        return not self.saturated if slots is None else self.held < slots

    def bound(self) -> int:
        """The most requests the queue holds now: what the pool lets in within the wait, by its slots and
        the mean time each is held."""
        slots, hold = self.slots(), self.hold_seconds
        if slots is None or hold is None:
            return self.most_queued
        return min(self.most_queued, int(self.wait_seconds * slots / hold))

    async def acquire(self, priority: int, wait_seconds: float | None = None) -> Slot:
        """A slot once the pool has one for this request, within `wait_seconds` (the pool's wait unless
        given); raise Shed when it will not."""
        wait = self.wait_seconds if wait_seconds is None else max(0.0, wait_seconds)
        if not self._queue and self.has_room():
            self.held += 1
            return Slot(self, False)
        if len(self._queue) >= self.bound():
            lowest = min(self._queue) if self._queue else None
            if lowest is None or lowest.priority >= priority:
                message = f"the {self.role} pool is past its capacity and its queue is full"
                raise Shed(message, priority, self.role)
            self._queue.remove(lowest)
            lowest.future.set_exception(
                Shed("shed for a request of a higher priority", lowest.priority, self.role)
            )
        waiter = _Waiter(priority, -next(self._arrivals), asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), wait)
        except TimeoutError:
            if self._granted(waiter):
                return Slot(self, True)
            if waiter in self._queue:  # (not when a higher priority took its place in the same turn)
                self._queue.remove(waiter)
            raise Shed(
                f"the {self.role} pool had no free slot within {self.wait_seconds:g} s while it was queued",
                priority,
                self.role,
            ) from None
        except asyncio.CancelledError:  # the client went away while queued
            if self._granted(waiter):
                self.held -= 1
                self.pump()
            elif waiter in self._queue:
                self._queue.remove(waiter)
            raise
        return Slot(self, True)

    @staticmethod
    def _granted(waiter: _Waiter) -> bool:
        future = waiter.future
        return future.done() and not future.cancelled() and future.exception() is None

    def take(self) -> Slot:
        """A slot without waiting (a disaggregated request's decode leg: its KV is computed already)."""
        self.held += 1
        return Slot(self, False)

    def returned(self, held_seconds: float) -> None:
        self.held -= 1
        self.holds += 1
        if self.hold_seconds is None:
            self.hold_seconds = held_seconds
        else:
            weight = max(_HOLD_WEIGHT, 1.0 / self.holds)
            self.hold_seconds += (held_seconds - self.hold_seconds) * weight
        self.pump()

    def pump(self) -> None:
        """Let queued requests in, the highest priority (then the oldest) first, while the pool has room."""
        while self._queue and self.has_room():
            waiter = max(self._queue)
            self._queue.remove(waiter)
            if not waiter.future.done():
                self.held += 1
                waiter.future.set_result(None)


@dataclass(slots=True)
class _Probe:
    """When a pod's learned capacity is next raised by one: after `after` scrapes that find it running all
    the router gave it with nothing waiting, doubled each time a raise made it queue."""

    after: int = 1
    calm: int = 0
    raised: bool = False  # the last change was a raise, not yet confirmed or refuted by a scrape
    # what the pod ran at the last scrapes that found requests waiting in it
    seen: deque[int] = field(default_factory=lambda: deque(maxlen=SEEN_SCRAPES))


class Admission:
    """The per-pool queues in front of the engines; `refresh()` after each scrape."""

    def __init__(self, pods: PodSet, most_queued: int, wait_seconds: float) -> None:
        self.pods = pods
        self.wait_seconds = wait_seconds
        self.capacity: dict[str, int] = {}
        self._probes: dict[str, _Probe] = {}
        self.pools = {role: PoolQueue(role, pods, self.capacity, most_queued, wait_seconds) for role in POOLS}

    def pool(self, role: EngineRole) -> PoolQueue:
        return self.pools[role]

    async def admit(self, roles: Sequence[EngineRole], priority: int) -> list[Slot]:
        """Slots of each pool of `roles`, taken in order within one wait in all; raise Shed (giving back
        what was taken) when a pool refuses."""
        slots: list[Slot] = []
        deadline = time.monotonic() + self.wait_seconds
        try:
            for role in roles:
                slots.append(await self.pools[role].acquire(priority, deadline - time.monotonic()))
        except BaseException:
            for slot in slots:
                slot.release()
            raise
        return slots

    def readmit(self, slots: list[Slot], roles: Sequence[EngineRole]) -> list[Slot]:
        """The slots a request rescheduled after its wait needs: those it holds when its pools are the same,
        else those of its new pools, taken without waiting (it waited its turn)."""
        if [slot.role for slot in slots] == list(roles):
            return slots
        for slot in slots:
            slot.release()
        return [self.pools[role].take() for role in roles]

    def refresh(self) -> None:
        """Learn each pod's capacity off its scraped figures, then let in what now fits."""
        capacity = self.capacity
        for pod in self.pods.pods.values():
            if not serving(pod):
                continue
            name = pod.name
            probe = self._probes.setdefault(name, _Probe())
            queued = pod.engine_running + pod.engine_waiting
            if pod.engine_waiting > 0:
                # this router's share of what the engine runs (other replicas send it requests too), the
                # most of the last few such scrapes: one may catch the engine between a step that finished
                # requests and the one that takes the next
                share = min(1.0, pod.outstanding / queued)
                probe.seen.append(max(1, round(pod.engine_running * share)))
                learned = max(probe.seen)
                if probe.raised and learned < capacity[name]:
                    probe.after = min(probe.after * 2, MAX_PROBE_SCRAPES)  # the probe queued: wait longer
                capacity[name], probe.raised, probe.calm = learned, False, 0
            elif name in capacity and pod.outstanding >= capacity[name]:
                # it runs all this router gave it with nothing waiting: one more, once it has for a while
                if probe.raised:  # the raise held: the next may come soon
                    probe.after, probe.raised = 1, False
                probe.calm += 1
                if probe.calm >= probe.after:
                    capacity[name] += 1
                    probe.raised, probe.calm = True, 0
        for role, queue in self.pools.items():
            queue.saturated = pool_saturated(self.pods.by_role(role))
            queue.pump()
