"""KV cache bookkeeping: GPU blocks with a prefix cache, LMCache's CPU tier, the p2p index of peers' chunks.

Granularity: capacity is counted in vLLM blocks (16 tokens by default); prefix reuse is by 256-token chunks
(LMCache's chunk_size), each a chained hash of its tokens and of every chunk before it, so a chunk matches
only under the same prefix. A chunk resident on the GPU occupies chunk_tokens / block_tokens blocks. Chunks
nobody uses stay resident and are evicted least recently used first, only when an allocation needs their
blocks (vLLM's free-block queue).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

CHUNK_TOKENS = 256


def chunk_hashes(
    token_ids: Sequence[int], chunk_tokens: int = CHUNK_TOKENS, limit_tokens: int | None = None
) -> list[bytes]:
    """Chained hashes of the full chunks among the first `limit_tokens` tokens (all tokens when None).

    Content hashes (not Python's hash()) so that separate engine processes agree, as LMCache needs a shared
    PYTHONHASHSEED or sha256 for the same reason.
    """
    usable = len(token_ids) if limit_tokens is None else min(limit_tokens, len(token_ids))
    usable -= usable % chunk_tokens
    if usable <= 0:
        return []
    # each id as 8 bytes, packed in C once for the whole prompt (this is the simulator's hot loop)
    data = memoryview(array("q", token_ids[:usable]).tobytes())
    step = chunk_tokens * 8  # bytes
    hashes: list[bytes] = []
    previous = b""
    for start in range(0, len(data), step):
        digest = hashlib.blake2b(previous, digest_size=16)
        digest.update(data[start : start + step])
        previous = digest.digest()
        hashes.append(previous)
    return hashes


def lmcache_chunk_keys(token_ids: Sequence[int], chunk_tokens: int = CHUNK_TOKENS) -> list[bytes]:
    """LMCache's keys for a token sequence with its partial last chunk: the full chunks' keys (as
    `chunk_hashes`), then, when the length is not a multiple of the chunk size, one key for the tail, which
    matches only a sequence of exactly that length under the same prefix (LMCache's prefix hash covers the
    tokens up to the chunk's end, token_database.py)."""
    keys = chunk_hashes(token_ids, chunk_tokens)
    tail = len(token_ids) % chunk_tokens
    if tail:
        digest = hashlib.blake2b(keys[-1] if keys else b"", digest_size=16)
        digest.update(b"tail:" + array("q", token_ids[len(token_ids) - tail :]).tobytes())
        keys.append(digest.digest())
    return keys


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

    def chunks(self) -> list[bytes]:
        return list(self._chunks)

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
    """An LMCache PD receiver's buffers: pushed chunks, waiting for the request that retrieves them.

    Every TP rank has its own buffer of pd_buffer_size bytes and its sender rank pushes its own shard of each
    chunk there; a chunk is loadable once every rank holds it. Capacity is in chunks per rank. As LMCache's
    async receiver does (pd_backend_async.py, PDBackend's allocation handler), a push reserves all of its
    chunks at once: one that can never fit is refused at once, one that does not fit now waits (the driver
    waits up to pd_allocation_timeout_sec, see `fits`). Nothing is ever evicted: a chunk leaves the buffer
    only when a request retrieves it (`take`). The same chunk pushed twice (two requests with one prefix)
    occupies two slots and needs two retrievals.
    """

    def __init__(self, capacity_chunks: int, ranks: int = 1) -> None:
        if ranks < 1:
            raise ValueError("ranks must be >= 1")
        self.capacity_chunks = capacity_chunks
        self.ranks = ranks
        self._copies: list[Counter[bytes]] = [Counter() for _ in range(ranks)]
        self._used = [0] * ranks
        self.retrieved_chunks = 0  # chunks freed by retrieval, over the buffer's life

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} outside 0..{self.ranks - 1}")

    def can_ever_hold(self, chunks: int) -> bool:
        return chunks <= self.capacity_chunks

    def fits(self, rank: int, chunks: int) -> bool:
        self._check_rank(rank)
        return self._used[rank] + chunks <= self.capacity_chunks

    def offer(self, rank: int, keys: Sequence[bytes]) -> bool:
        """Reserve and fill one slot per key on `rank`; all or nothing."""
        if not self.fits(rank, len(keys)):
            return False
        for key in keys:
            self._copies[rank][key] += 1
        self._used[rank] += len(keys)
        return True

    def __contains__(self, key: bytes) -> bool:
        return all(copies[key] > 0 for copies in self._copies)

    def take(self, keys: Iterable[bytes]) -> None:
        """A request retrieved these chunks: one slot of each is freed on every rank."""
        for key in keys:
            for rank, copies in enumerate(self._copies):
                if copies[key] > 0:
                    copies[key] -= 1
                    if copies[key] == 0:
                        del copies[key]
                    self._used[rank] -= 1
            self.retrieved_chunks += 1

    @property
    def used_chunks(self) -> int:
        """Slots in use on the fullest rank."""
        return max(self._used)

    def __len__(self) -> int:
        return self.used_chunks


class PrefixIndex(Protocol):
    """Where an engine's LMCache learns which peer holds a chunk, and tells what its CPU tier holds."""

    def add(self, engine_id: str, key: bytes) -> None: ...

    def remove(self, engine_id: str, key: bytes) -> None: ...

    def holder(self, key: bytes, excluding: str) -> str | None: ...


class SharedPrefixIndex:
    """Which engine holds which chunk (LMCache's controller view, for p2p fetches between engines), shared by
    every simulated engine in virtual time. The HTTP fake engine asks a controller instead
    (lmcache_p2p.ControllerIndex).
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

    def holder(self, key: bytes, excluding: str) -> str | None:
        holders = self._holders.get(key)
        if not holders:
            return None
        others = sorted(h for h in holders if h != excluding)
        return others[0] if others else None
