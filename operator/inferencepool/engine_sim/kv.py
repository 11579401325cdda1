"""KV cache bookkeeping: GPU blocks with a prefix cache, LMCache's CPU tier, the p2p index of peers' chunks.

Granularity: capacity is counted in vLLM blocks (16 tokens by default); prefix reuse is by 256-token chunks
(LMCache's chunk_size), each a chained hash of its tokens and of every chunk before it, so a chunk matches
only under the same prefix. A chunk resident on the GPU occupies chunk_tokens / block_tokens blocks. Chunks
nobody uses stay resident and are evicted least recently used first, only when an allocation needs their
blocks (vLLM's free-block queue).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

CHUNK_TOKENS = 256


def chunk_hashes(
    token_ids: Sequence[int], chunk_tokens: int = CHUNK_TOKENS, limit_tokens: int | None = None
) -> list[bytes]:
    """Chained hashes of the full chunks among the first `limit_tokens` tokens (all tokens when None).

    Content hashes (not Python's hash()) so that separate engine processes agree, as LMCache needs a shared
    PYTHONHASHSEED or sha256 for the same reason.
    """
    usable = len(token_ids) if limit_tokens is None else min(limit_tokens, len(token_ids))
    hashes: list[bytes] = []
    previous = b""
    for start in range(0, usable - chunk_tokens + 1, chunk_tokens):
        digest = hashlib.blake2b(previous, digest_size=16)
        # the same bytes as joining each id's text with commas, built in C (this is the simulator's hot loop)
        digest.update(",".join(map(str, token_ids[start : start + chunk_tokens])).encode())
        previous = digest.digest()
        hashes.append(previous)
    return hashes


@dataclass
class _ResidentChunk:
    users: int = 0


@dataclass
class BlockPool:
    """GPU KV blocks: free, used by running sequences, or holding an unused cached chunk (evictable)."""

    total_blocks: int
    block_tokens: int
    chunk_tokens: int = CHUNK_TOKENS
    prefix_caching: bool = True
    free_blocks: int = field(init=False)
    _chunks: OrderedDict[bytes, _ResidentChunk] = field(init=False, default_factory=OrderedDict)
    _evictable_blocks: int = field(init=False, default=0)
    evictions: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.chunk_tokens % self.block_tokens:
            raise ValueError(
                f"chunk size {self.chunk_tokens} must be a multiple of the block size {self.block_tokens}"
            )
        self.free_blocks = self.total_blocks

    @property
    def blocks_per_chunk(self) -> int:
        return self.chunk_tokens // self.block_tokens

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks - self._evictable_blocks

    @property
    def usage(self) -> float:
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def can_allocate(self, blocks: int) -> bool:
        return blocks <= self.free_blocks + self._evictable_blocks

    def allocate(self, blocks: int) -> bool:
        """Take `blocks` free blocks, evicting unused cached chunks (LRU first) if needed; all or nothing."""
        if blocks <= 0:
            return True
        if not self.can_allocate(blocks):
            return False
        while self.free_blocks < blocks:
            self._evict_one()
        self.free_blocks -= blocks
        return True

    def release(self, blocks: int) -> None:
        self.free_blocks += blocks
        if self.free_blocks + self._evictable_blocks > self.total_blocks:
            raise AssertionError("released more KV blocks than were allocated")

    def _evict_one(self) -> None:
        for key, chunk in self._chunks.items():
            if chunk.users == 0:
                del self._chunks[key]
                self._evictable_blocks -= self.blocks_per_chunk
                self.free_blocks += self.blocks_per_chunk
                self.evictions += 1
                return
        raise AssertionError("no evictable chunk although can_allocate said yes")

    def cached_prefix(self, hashes: Sequence[bytes]) -> int:
        """How many leading chunks of `hashes` are resident (used or evictable)."""
        if not self.prefix_caching:
            return 0
        count = 0
        for key in hashes:
            if key not in self._chunks:
                break
            count += 1
        return count

    def acquire(self, hashes: Iterable[bytes]) -> None:
        """A sequence starts using resident chunks (a prefix hit): they stop being evictable."""
        for key in hashes:
            chunk = self._chunks[key]
            if chunk.users == 0:
                self._evictable_blocks -= self.blocks_per_chunk
            chunk.users += 1
            self._chunks.move_to_end(key)

    def publish(self, key: bytes) -> bool:
        """A sequence finished computing a chunk in its own blocks; they become the shared cached copy.

        Returns False when another sequence published the same chunk first: the caller then uses that copy and
        gives its own blocks back (vLLM keeps duplicates until free; the difference is a few blocks, briefly).
        """
        if not self.prefix_caching:
            return True
        existing = self._chunks.get(key)
        if existing is None:
            self._chunks[key] = _ResidentChunk(users=1)
            return True
        if existing.users == 0:
            self._evictable_blocks -= self.blocks_per_chunk
        existing.users += 1
        self._chunks.move_to_end(key)
        return False

    def unuse(self, hashes: Iterable[bytes]) -> None:
        """A sequence stops using chunks; the last user leaves them cached and evictable (newest last)."""
        for key in hashes:
            chunk = self._chunks.get(key)
            if chunk is None:
                # prefix caching off: the chunk's blocks were private all along
                self.release(self.blocks_per_chunk)
                continue
            chunk.users -= 1
            if chunk.users == 0:
                self._evictable_blocks += self.blocks_per_chunk
                self._chunks.move_to_end(key)

    def resident_chunks(self) -> int:
        return len(self._chunks)


@dataclass
class LruChunkStore:
    """LMCache's local CPU tier: chunk hashes up to a capacity, least recently used evicted first."""

    capacity_chunks: int
    _chunks: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    def __contains__(self, key: bytes) -> bool:
        return key in self._chunks

    def touch(self, key: bytes) -> None:
        self._chunks.move_to_end(key)

    def store(self, key: bytes) -> bytes | None:
        """Store a chunk; returns the evicted chunk's hash, if one had to go."""
        if self.capacity_chunks <= 0:
            return None
        if key in self._chunks:
            self._chunks.move_to_end(key)
            return None
        self._chunks[key] = None
        if len(self._chunks) > self.capacity_chunks:
            evicted, _ = self._chunks.popitem(last=False)
            return evicted
        return None

    def __len__(self) -> int:
        return len(self._chunks)


class PdBuffer:
    """An LMCache PD receiver's buffer: chunks pushed by senders, waiting for the request that loads them.

    Every TP rank pushes its own shard of each chunk to its own port; a chunk is loadable once all ranks
    delivered it. Capacity is in chunks (pd_buffer_size holds the same number of shards on every rank). A push
    that does not fit is refused whole, as LMCache's async receiver answers -1 and the sender aborts (it
    would first wait up to pd_allocation_timeout_sec for room; the fake does not). A chunk leaves the buffer
    when a request loads it.
    """

    def __init__(self, capacity_chunks: int, ranks: int = 1) -> None:
        if ranks < 1:
            raise ValueError("ranks must be >= 1")
        self.capacity_chunks = capacity_chunks
        self.ranks = ranks
        self._shards: OrderedDict[bytes, set[int]] = OrderedDict()

    def offer(self, rank: int, keys: Sequence[bytes]) -> bool:
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} outside 0..{self.ranks - 1}")
        new = [k for k in dict.fromkeys(keys) if k not in self._shards]
        if len(self._shards) + len(new) > self.capacity_chunks:
            return False
        for key in keys:
            self._shards.setdefault(key, set()).add(rank)
        return True

    def __contains__(self, key: bytes) -> bool:
        return len(self._shards.get(key, ())) == self.ranks

    def take(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            self._shards.pop(key, None)

    def __len__(self) -> int:
        return len(self._shards)


class SharedPrefixIndex:
    """Which engine holds which chunk (LMCache's controller view, for p2p fetches between engines).

    In virtual time one instance is shared by every simulated engine; the HTTP fake engine keeps a local
    mirror refreshed from its peers (see server.py), which is eventually consistent as LMCache's controller
    is.
    """

    def __init__(self) -> None:
        self._holders: dict[bytes, set[str]] = {}

    def add(self, engine_id: str, key: bytes) -> None:
        self._holders.setdefault(key, set()).add(engine_id)

    def remove(self, engine_id: str, key: bytes) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(engine_id)
            if not holders:
                del self._holders[key]

    def replace_engine(self, engine_id: str, keys: Iterable[bytes]) -> None:
        """Set an engine's full holding (mirror refresh)."""
        for key in list(self._holders):
            self.remove(engine_id, key)
        for key in keys:
            self.add(engine_id, key)

    def holder(self, key: bytes, excluding: str) -> str | None:
        holders = self._holders.get(key)
        if not holders:
            return None
        others = sorted(h for h in holders if h != excluding)
        return others[0] if others else None
