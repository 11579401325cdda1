"""The router's approximate view of which decode pod holds which prefix (pure), for routing on uncached
tokens and on the longest shared prefix.

The router cannot see engines' caches; it remembers what it sent where. Each prompt is a chain of block
keys (a block's key depends on every block before it, as vLLM's and LMCache's chained hashes do), and each
pod keeps the most recent keys up to its KV capacity, least recently used first out. A pod's cached prefix of
a prompt is the run of leading keys it holds. Requests that share only a short system prompt then find it
on every pod and spread by load, while requests that share a long prefix find the one pod that has it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def chained_keys(blocks: Sequence[int]) -> list[int]:
    """One key per block, each a hash of the block and every block before it."""
    keys: list[int] = []
    previous = 0
    for block in blocks:
        previous = hash((previous, block))
        keys.append(previous)
    return keys


class PrefixIndex:
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
