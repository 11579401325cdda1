"""The router's LMCache PD notification listener against real ZMQ PUSH sockets on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import msgpack
import pytest
import zmq
import zmq.asyncio

from inferencepool.router.lmcache_pd import PDNotifications, decode_proxy_notif, encode_proxy_notif

# What LMCache's msgspec encoder writes for ProxyNotif(req_id="abc-1") (checked against msgspec 0.23 with
# LMCache's `class PDMsgBase(msgspec.Struct, tag=True)`): a map whose tag field "type" comes first.
LMCACHE_BYTES = b"\x82\xa4type\xaaProxyNotif\xa6req_id\xa5abc-1"


@pytest.fixture
async def notifications() -> AsyncIterator[PDNotifications]:
    listener = PDNotifications(retention_s=5.0, max_unclaimed=4)
    await listener.start("127.0.0.1", 0)
    try:
        yield listener
    finally:
        await listener.close()


@pytest.fixture
async def push(notifications: PDNotifications) -> AsyncIterator[Callable[..., asyncio.Future[None]]]:
    """A function sending raw frames from one PUSH socket, as one prefill engine's TP rank does."""
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.PUSH)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(f"tcp://127.0.0.1:{notifications.port}")

    def send(*frames: bytes) -> asyncio.Future[None]:
        return socket.send_multipart(list(frames))  # type: ignore[return-value]

    try:
        yield send
    finally:
        socket.close()
        context.term()


async def settle(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached in 1 s")


def test_encoding_is_lmcaches() -> None:
    assert encode_proxy_notif("abc-1") == LMCACHE_BYTES
    assert decode_proxy_notif(LMCACHE_BYTES) == "abc-1"


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb(["ProxyNotif", "x"]), "expected a msgpack map"),
        (msgpack.packb({"type": "AllocRequest", "req_id": "x"}), "expected type 'ProxyNotif'"),
        (msgpack.packb({"type": "ProxyNotif"}), "without a string req_id"),
        (msgpack.packb({"type": "ProxyNotif", "req_id": 7}), "without a string req_id"),
    ],
)
def test_decode_names_the_problem(frame: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        decode_proxy_notif(frame)


async def test_expect_completes_after_every_rank(
    notifications: PDNotifications, push: Callable[..., asyncio.Future[None]]
) -> None:
    waiter = notifications.expect("req-1", ranks=2)
    await push(encode_proxy_notif("req-1"))
    await settle(lambda: notifications.stats.received == 1)
    assert not waiter.done()  # one TP rank of two has pushed its shard
    await push(encode_proxy_notif("req-1"))
    await asyncio.wait_for(waiter, 1.0)
    assert notifications.pending == 0


async def test_notification_before_expect_is_kept(
    notifications: PDNotifications, push: Callable[..., asyncio.Future[None]]
) -> None:
    await push(LMCACHE_BYTES)
    await settle(lambda: notifications.unclaimed == 1)
    await asyncio.wait_for(notifications.expect("abc-1"), 1.0)
    assert notifications.unclaimed == 0


async def test_malformed_messages_are_counted_and_the_listener_keeps_going(
    notifications: PDNotifications, push: Callable[..., asyncio.Future[None]]
) -> None:
    waiter = notifications.expect("ok")
    await push(b"\xc1")
    await push(msgpack.packb({"type": "AllocRequest", "keys": []}))
    await push(encode_proxy_notif("ok"), b"second frame")
    await push(encode_proxy_notif("ok"))
    await asyncio.wait_for(waiter, 1.0)
    assert notifications.stats.malformed == 3
    assert notifications.stats.received == 1


async def test_unclaimed_notifications_are_bounded_and_expire() -> None:
    listener = PDNotifications(retention_s=0.2, max_unclaimed=2)
    await listener.start("127.0.0.1", 0)
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.PUSH)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(f"tcp://127.0.0.1:{listener.port}")
    try:
        for name in ("a", "b", "c"):
            await socket.send(encode_proxy_notif(name))
        await settle(lambda: listener.stats.received == 3)
        assert listener.unclaimed == 2 and listener.stats.unclaimed == 1  # "a" was pushed out
        await asyncio.sleep(0.25)
        late = listener.expect("b")  # "b" expired: it must not count
        await asyncio.sleep(0.05)
        assert not late.done()
        assert listener.stats.unclaimed == 3
    finally:
        socket.close()
        context.term()
        await listener.close()


async def test_discard_and_cancel_stop_waiting(
    notifications: PDNotifications, push: Callable[..., asyncio.Future[None]]
) -> None:
    given_up = notifications.expect("gone")
    notifications.discard("gone")
    assert given_up.cancelled()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(notifications.expect("slow"), 0.05)
    assert notifications.pending == 0
    # the same ids can be waited for again
    again = notifications.expect("slow")
    await push(encode_proxy_notif("slow"))
    await asyncio.wait_for(again, 1.0)


async def test_expect_twice_is_refused(notifications: PDNotifications) -> None:
    notifications.expect("dup")
    with pytest.raises(ValueError, match="already waiting"):
        notifications.expect("dup")
    with pytest.raises(ValueError, match="ranks"):
        notifications.expect("zero", ranks=0)


async def test_close_fails_pending_waiters() -> None:
    listener = PDNotifications()
    port = await listener.start("127.0.0.1", 0)
    assert port > 0
    waiter = listener.expect("never")
    await listener.close()
    with pytest.raises(ConnectionError):
        await waiter
    with pytest.raises(RuntimeError, match="not started"):
        listener.expect("after-close")


async def test_busy_port_is_a_clear_error(notifications: PDNotifications) -> None:
    other = PDNotifications()
    with pytest.raises(OSError, match="cannot bind"):
        await other.start("127.0.0.1", notifications.port or 0)
    await other.close()
