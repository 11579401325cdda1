"""The per-pool admission core (router/overload.py) on a real PodSet whose engine figures are set as a scrape
sets them: capacity learned per pod, a queue per pool, priority order, and the bound derived from the wait
and the pool's hold time. Counts only; no clock decides a verdict (the waits are far longer than a test)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest

from inferencepool.router.overload import Admission, PoolQueue, Shed, Slot
from inferencepool.router.pods import Pod, PodSet, PodSpec

WAIT = 60.0  # seconds a request may wait: never reached here


def pod_set(prefill: int = 1, decode: int = 1) -> PodSet:
    pods = PodSet()
    specs = [PodSpec(f"prefill-{i}", f"http://127.0.0.1:{9000 + i}", "prefill") for i in range(prefill)]
    specs += [PodSpec(f"decode-{i}", f"http://127.0.0.1:{9100 + i}", "decode") for i in range(decode)]
    pods.apply(specs)
    return pods


def scraped(pod: Pod, running: int, waiting: int, outstanding: int | None = None) -> None:
    pod.engine_running, pod.engine_waiting = running, waiting
    pod.outstanding = running + waiting if outstanding is None else outstanding


async def saturate(admission: Admission, pod: Pod, running: int, waiting: int) -> list[Slot]:
    """Requests the pool let in before it knew its capacity, then the scrape that finds them queueing."""
    pool = admission.pool(pod.role)
    slots = [await pool.acquire(0) for _ in range(running + waiting)]
    scraped(pod, running, waiting)
    admission.refresh()
    return slots


async def test_a_pool_learns_its_capacity_from_a_scrape_that_finds_its_engine_queueing() -> None:
    pods = pod_set()
    admission = Admission(pods, 8, WAIT)
    decode = admission.pool("decode")
    assert decode.slots() is None and decode.has_room()  # never queued: no bound
    slots = await saturate(admission, pods.pods["decode-0"], running=4, waiting=2)
    assert decode.slots() == 4 and decode.held == 6 and not decode.has_room()
    for slot in slots[:3]:
        slot.release()
    assert decode.held == 3 and decode.has_room()


async def test_a_scrape_between_two_engine_steps_does_not_drop_the_capacity_until_the_queue_stays() -> None:
    pods = pod_set()
    admission = Admission(pods, 8, WAIT)
    pod = pods.pods["decode-0"]
    await saturate(admission, pod, running=8, waiting=2)
    scraped(pod, running=1, waiting=7)  # finished requests out, the next ones not yet taken
    admission.refresh()
    assert admission.capacity["decode-0"] == 8
    for _ in range(3):  # the engine keeps running five with others waiting (its KV is full): learned
        scraped(pod, running=5, waiting=3)
        admission.refresh()
    assert admission.capacity["decode-0"] == 5


async def test_a_new_pod_counts_as_the_mean_of_those_whose_capacity_is_known() -> None:
    pods = pod_set(decode=2)
    admission = Admission(pods, 8, WAIT)
    await saturate(admission, pods.pods["decode-0"], running=6, waiting=1)
    await saturate(admission, pods.pods["decode-1"], running=4, waiting=1)
    decode = admission.pool("decode")
    assert decode.slots() == 10
    known = [PodSpec(pod.name, pod.url, pod.role) for pod in pods.pods.values()]
    pods.apply([*known, PodSpec("decode-2", "http://127.0.0.1:9102", "decode")])  # a scale-up
    assert decode.slots() == 15


async def test_another_routers_requests_leave_this_one_its_share() -> None:
    pods = pod_set()
    admission = Admission(pods, 8, WAIT)
    pod = pods.pods["decode-0"]
    scraped(pod, running=8, waiting=8, outstanding=4)  # this router sent 4 of the engine's 16
    admission.refresh()
    assert admission.capacity["decode-0"] == 2


async def test_a_pod_running_all_it_was_given_without_queueing_gets_one_more() -> None:
    pods = pod_set()
    admission = Admission(pods, 8, WAIT)
    pod = pods.pods["decode-0"]
    await saturate(admission, pod, running=4, waiting=2)
    scraped(pod, running=4, waiting=0)
    admission.refresh()
    assert admission.capacity["decode-0"] == 5
    scraped(pod, running=2, waiting=0)  # not all it could run: nothing learned
    admission.refresh()
    assert admission.capacity["decode-0"] == 5


async def test_a_raise_that_made_the_pod_queue_waits_twice_as_many_calm_scrapes_before_the_next() -> None:
    pods = pod_set()
    admission = Admission(pods, 8, WAIT)
    pod = pods.pods["decode-0"]
    await saturate(admission, pod, running=4, waiting=2)
    scraped(pod, running=4, waiting=0)
    admission.refresh()
    assert admission.capacity["decode-0"] == 5
    scraped(pod, running=4, waiting=1)  # the fifth waits: the engine runs four
    admission.refresh()
    assert admission.capacity["decode-0"] == 4
    capacities = []
    for _ in range(3):
        scraped(pod, running=4, waiting=0)
        admission.refresh()
        capacities.append(admission.capacity["decode-0"])
    assert capacities == [4, 5, 5]  # raised on the second calm scrape, not the first


async def test_a_saturated_prefill_pool_queues_and_sheds_its_requests_while_the_decode_pool_admits() -> None:
    pods = pod_set()
    admission = Admission(pods, 1, WAIT)
    await saturate(admission, pods.pods["prefill-0"], running=1, waiting=1)
    prefill, decode = admission.pool("prefill"), admission.pool("decode")
    queued = asyncio.create_task(prefill.acquire(0))
    await asyncio.sleep(0)
    assert prefill.queued == 1
    with pytest.raises(Shed) as shed:
        await prefill.acquire(0)
    assert shed.value.pool == "prefill"
    direct = [await decode.acquire(0) for _ in range(5)]  # the decode pool has room: no wait
    assert decode.held == 5 and not any(slot.waited for slot in direct)
    queued.cancel()


async def test_queued_requests_get_slots_highest_priority_first_then_oldest() -> None:
    pods = pod_set()
    admission = Admission(pods, 8, WAIT)
    held = await one_slot_held(admission, pods.pods["decode-0"])
    decode = admission.pool("decode")
    order: list[str] = []

    async def ask(name: str, priority: int) -> Slot:
        slot = await decode.acquire(priority)
        order.append(name)
        return slot

    waiters = []
    for name, priority in (("low", 1), ("high-old", 7), ("mid", 4), ("high-new", 7)):
        waiters.append(asyncio.create_task(ask(name, priority)))
        await asyncio.sleep(0)
    assert decode.queued == 4 and not order
    for let_in in range(1, 5):  # one slot: each release lets exactly one in
        held.release()
        assert decode.held == 1 and decode.queued == 4 - let_in
        await settle(lambda expected=let_in: len(order) == expected)
        held = await waiters[["low", "high-old", "mid", "high-new"].index(order[-1])]
    assert order == ["high-old", "high-new", "mid", "low"]


async def test_a_full_queue_sheds_its_lowest_priority_newest_first_for_a_higher_one() -> None:
    pods = pod_set()
    admission = Admission(pods, 2, WAIT)
    await one_slot_held(admission, pods.pods["decode-0"])
    decode = admission.pool("decode")
    older = asyncio.create_task(decode.acquire(2))
    newer = asyncio.create_task(decode.acquire(2))
    await asyncio.sleep(0)
    with pytest.raises(Shed):  # an equal priority does not push one out
        await decode.acquire(2)
    higher = asyncio.create_task(decode.acquire(3))
    await asyncio.sleep(0)
    with pytest.raises(Shed, match="higher priority"):
        await newer
    assert not older.done() and not higher.done() and decode.queued == 2
    for task in (older, higher):
        task.cancel()


async def settle(done: Callable[[], bool]) -> None:
    """Let the event loop run ready tasks until `done` (a bounded number of turns, not a time)."""
    for _ in range(50):
        if done():
            return
        await asyncio.sleep(0)
    assert done()


async def one_slot_held(admission: Admission, pod: Pod) -> Slot:
    """The pod runs one request at most, and one holds it."""
    first, second = await saturate(admission, pod, running=1, waiting=1)
    second.release()
    return first


async def test_a_disaggregated_request_waits_for_decode_holding_no_prefill_slot_and_returns_it_shed() -> None:
    pods = pod_set()
    admission = Admission(pods, 1, WAIT)
    prefill, decode = admission.pool("prefill"), admission.pool("decode")
    held = await one_slot_held(admission, pods.pods["decode-0"])
    waiting = asyncio.create_task(admission.admit(("decode", "prefill"), 0))
    await settle(lambda: decode.queued == 1)
    assert prefill.held == 0  # nothing of the prefill pool is held while it waits for decode
    held.release()
    slots = await waiting
    assert [slot.role for slot in slots] == ["decode", "prefill"] and decode.held == prefill.held == 1
    # the prefill pool full and its queue too: a disaggregated request is shed and frees its decode slot
    scraped(pods.pods["decode-0"], running=0, waiting=0)
    admission.capacity["decode-0"] = 8  # decode has room now
    await saturate(admission, pods.pods["prefill-0"], running=1, waiting=1)
    queued = asyncio.create_task(admission.admit(("decode", "prefill"), 0))
    await settle(lambda: prefill.queued == 1)
    decode_held = decode.held
    with pytest.raises(Shed) as shed:
        await admission.admit(("decode", "prefill"), 0)
    assert shed.value.pool == "prefill" and decode.held == decode_held
    queued.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await queued
    assert decode.held == decode_held - 1 and prefill.queued == 0


def test_the_queue_holds_what_the_pool_drains_within_the_wait() -> None:
    pods = pod_set(decode=2)
    queue = PoolQueue("decode", pods, {"decode-0": 8, "decode-1": 8}, 64, 0.4)
    assert queue.bound() == 64  # no hold timed yet: the configured most
    queue.hold_seconds = 1.6  # 16 slots each freed every 1.6 s: 10 per second, 4 within 0.4 s
    assert queue.bound() == 4
    queue.hold_seconds = 0.01
    assert queue.bound() == 64
