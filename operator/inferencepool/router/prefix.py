"""Which pod holds which prefix, as the router estimates it, and the pod choice on it (pure, no I/O).

The router cannot see engines' caches; it remembers what it sent where. Each prompt is a chain of block
keys (a block's key depends on every block before it, as vLLM's and LMCache's chained hashes do), and each
pod keeps the most recent keys up to a bound, least recently used first out. A pod's cached prefix of a
prompt is the run of leading keys it holds.

Pod choice (`choose`): among the pods under the load bound (consistent hashing with bounded loads: a pod
is eligible while its load is below max(ceil(load_factor x (total + 1) / pods), min_load_bound)), the one
holding the longest prefix of the prompt, if that prefix is at least `anchor_blocks` long; else, and among
equals, the rendezvous (highest random weight) winner for the prompt's anchor key, the key of its first
`anchor_blocks` blocks. Requests sharing only a short system prompt have different anchors and spread;
requests sharing a long prefix have the same anchor and land together. Nothing in the choice depends on
the replica's own history but the index, and the index only ever records what the same deterministic
choice made: two router replicas over the same pods at similar load pick the same pod for the same prefix.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

_MASK = (1 << 64) - 1


def chained_keys(blocks: Sequence[int]) -> list[int]:
    """One key per block id, each a hash of the block and every block before it (the simulator's trace
    blocks; Python's hash of ints and tuples is the same in every process)."""
    keys: list[int] = []
    previous = 0
    for block in blocks:
        previous = hash((previous, block))
        keys.append(previous)
    return keys


def prompt_keys(data: bytes, block_bytes: int, max_blocks: int) -> list[int]:
    """Chained keys of a prompt's whole blocks (`block_bytes` each, at most `max_blocks`): key i is a hash
    of bytes [0, (i+1) x block_bytes), the same in every process and every router replica (blake2b, not
    Python's salted hash). One pass over the bytes: the hash state is copied at each block boundary."""
    blocks = min(len(data) // block_bytes, max_blocks)
    if blocks <= 0:
        return []
    state = hashlib.blake2b(digest_size=8)
    view = memoryview(data)
    keys: list[int] = []
    for start in range(0, blocks * block_bytes, block_bytes):
        state.update(view[start : start + block_bytes])
        keys.append(int.from_bytes(state.copy().digest(), "little"))
    return keys


def rendezvous(key: int, seed: int) -> int:
    """Weight of a pod (its name's `seed`) for a key: splitmix64 of both, so every replica ranks alike."""
    z = (key ^ seed) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def name_seed(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


class PrefixIndex:
    """Per pod, the most recent block keys sent there, at most `capacity_blocks` each (LRU)."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("a pod's prefix index holds at least one block")
        self.capacity_blocks = capacity_blocks
        self._pods: dict[str, OrderedDict[int, None]] = {}

    def cached_blocks(self, pod: str, keys: Sequence[int]) -> int:
        held = self._pods.get(pod)
        if not held:
            return 0
        count = 0
        for key in keys:
            if key not in held:
                break
            count += 1
        return count

    def sent(self, pod: str, keys: Sequence[int]) -> None:
        """The pod computes (or receives) this prompt's KV: its keys become the most recent."""
        held = self._pods.setdefault(pod, OrderedDict())
        for key in keys:
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.capacity_blocks:
            held.popitem(last=False)

    def forget(self, pod: str) -> None:
        self._pods.pop(pod, None)

    def retain(self, pods: Iterable[str]) -> None:
        """Drop the pods that are gone (a new pod under an old name starts empty when it comes back)."""
        keep = set(pods)
        for name in [name for name in self._pods if name not in keep]:
            del self._pods[name]

    def size(self) -> int:
        """Keys held over all pods (what bounds the index's memory)."""
        return sum(len(held) for held in self._pods.values())


class Candidate(Protocol):
    """What the choice reads of a pod."""

    @property
    def name(self) -> str: ...

    @property
    def load(self) -> int: ...

    @property
    def seed(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Choice:
    pod: str
    cached_blocks: int  # the chosen pod's cached prefix of the prompt, in blocks (as the index estimates it)


def load_bound(loads: Sequence[int], load_factor: float, min_load_bound: int) -> int:
    """A pod below this load may take one more request (bounded loads, with a floor)."""
    return max(math.ceil(load_factor * (sum(loads) + 1) / max(1, len(loads))), min_load_bound)


def choose(
    candidates: Sequence[Candidate],
    keys: Sequence[int],
    index: PrefixIndex,
    anchor_blocks: int,
    load_factor: float,
    min_load_bound: int,
) -> Choice | None:
    """The pod for a prompt with these chained keys (see the module's docstring), or None without keys
    (nothing to be affine to: the caller picks by load)."""
    if not keys or not candidates:
        return None
    bound = load_bound([c.load for c in candidates], load_factor, min_load_bound)
    eligible = [c for c in candidates if c.load < bound] or list(candidates)
    anchor = keys[min(anchor_blocks, len(keys)) - 1]
    best: Candidate | None = None
    best_rank = (-1, -1)
    best_cached = 0
    for pod in eligible:
        cached = index.cached_blocks(pod.name, keys)
        rank = (cached if cached >= anchor_blocks else 0, rendezvous(anchor, pod.seed))
        if rank > best_rank:
            best, best_rank, best_cached = pod, rank, cached
    assert best is not None
    return Choice(best.name, best_cached)
