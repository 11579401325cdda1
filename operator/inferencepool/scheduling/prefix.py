"""Which pod holds which prefix, as the router estimates it (pure, no I/O).

The router cannot see engines' caches; it remembers what it sent where. Each prompt is a chain of block
keys (a block's key depends on every block before it, as vLLM's and LMCache's chained hashes do), and each
pod keeps the most recent keys up to a bound, least recently used first out. A pod's cached prefix of a
prompt is the run of leading keys it holds.

The pod choice on it is scorers.py (the prefix it saves less the prefill queued there, rendezvous among
equals) after filters.py (the load bound).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

_MASK = (1 << 64) - 1


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
