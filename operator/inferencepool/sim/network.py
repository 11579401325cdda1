"""KV transfers over shared links (pure): a fluid model with max-min fair sharing.

Each replica has one NIC per GPU (NIXL reads each TP rank's shard on its own rank's NIC), so a replica's link
carries `bytes_per_s_per_gpu x tensor_parallel`, full duplex: what a prefill replica sends and what a decode
replica receives are separate links. A transfer crosses its source's send link and its destination's receive
link; concurrent transfers share every link they cross, max-min fairly (progressive filling: the most
contended link fixes the rate of its transfers first, what they leave on their other links goes to the
rest). A transfer alone takes `latency + bytes / link` (the profile's `kv_transfer_time`); under contention it
takes longer, which is what makes disaggregation stop paying on a slow or busy network.

Rates change only when a transfer starts or ends, so between those moments every transfer progresses
linearly and the next end is known exactly: the driver asks `next_end()`, advances to it, and collects what
finished.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(eq=False)
class Transfer:
    key: str
    links: tuple[str, ...]
    remaining_bytes: float
    started: float
    rate: float = 0.0
    finished_bytes_at: float | None = None  # when the last byte crossed (the latency is added after)


@dataclass
class Network:
    """Links by name with their capacity (bytes/s); transfers in flight over them."""

    latency_s: float
    capacity: dict[str, float] = field(default_factory=dict)
    transfers: dict[str, Transfer] = field(default_factory=dict)
    now: float = 0.0

    def add_link(self, name: str, bytes_per_s: float) -> None:
        if bytes_per_s <= 0:
            raise ValueError(f"link {name}: capacity must be > 0 bytes/s, got {bytes_per_s}")
        self.capacity[name] = bytes_per_s

    def start(self, now: float, key: str, links: tuple[str, ...], kv_bytes: float) -> None:
        if key in self.transfers:
            raise ValueError(f"transfer {key!r} is already in flight")
        unknown = [link for link in links if link not in self.capacity]
        if unknown:
            raise ValueError(f"transfer {key!r} crosses unknown link(s) {', '.join(unknown)}")
        self.advance(now)
        self.transfers[key] = Transfer(key, links, max(0.0, kv_bytes), now)
        self._share()

    def advance(self, now: float) -> list[str]:
        """Move every transfer on to `now`; returns the keys that completed (bytes and latency) by then."""
        if now < self.now:
            raise ValueError(f"time runs forward: {now} < {self.now}")
        while True:
            moving = [t for t in self.transfers.values() if t.finished_bytes_at is None]
            ends = [self.now + t.remaining_bytes / t.rate for t in moving if t.rate > 0]
            step_to = min([now, *ends])
            elapsed = step_to - self.now
            for transfer in moving:
                transfer.remaining_bytes -= transfer.rate * elapsed
                if transfer.remaining_bytes <= 1e-6 * max(1.0, transfer.rate):
                    transfer.remaining_bytes = 0.0
                    transfer.finished_bytes_at = step_to
            self.now = step_to
            self._share()
            if step_to >= now:
                break
        done = [
            t.key
            for t in self.transfers.values()
            if t.finished_bytes_at is not None and t.finished_bytes_at + self.latency_s <= now + 1e-12
        ]
        for key in done:
            del self.transfers[key]
        if done:
            self._share()
        return done

    def backlog(self, link: str, now: float) -> float:
        """Bytes still to cross `link` at `now` by the transfers in flight on it."""
        return sum(
            max(0.0, t.remaining_bytes - t.rate * max(0.0, now - self.now))
            for t in self.transfers.values()
            if link in t.links and t.finished_bytes_at is None
        )

    def next_end(self) -> float | None:
        """When the next transfer completes (its last byte plus the latency), if nothing else starts."""
        times = []
        for transfer in self.transfers.values():
            if transfer.finished_bytes_at is not None:
                times.append(transfer.finished_bytes_at + self.latency_s)
            elif transfer.rate > 0:
                times.append(self.now + transfer.remaining_bytes / transfer.rate + self.latency_s)
        return min(times) if times else None

    def _share(self) -> None:
        """Max-min fair rates by progressive filling over the transfers still moving bytes."""
        moving = [t for t in self.transfers.values() if t.finished_bytes_at is None]
        left = dict(self.capacity)
        unfixed = set(range(len(moving)))
        for transfer in moving:
            transfer.rate = 0.0
        while unfixed:
            users: dict[str, list[int]] = {}
            for index in unfixed:
                for link in moving[index].links:
                    users.setdefault(link, []).append(index)
            if not users:  # a transfer over no link at all: nothing limits it
                for index in unfixed:
                    moving[index].rate = math.inf
                return
            link, share = min(
                ((name, left[name] / len(ids)) for name, ids in users.items()), key=lambda x: x[1]
            )
            for index in users[link]:
                moving[index].rate = share
                for other in moving[index].links:
                    left[other] = max(0.0, left[other] - share)
                unfixed.discard(index)
