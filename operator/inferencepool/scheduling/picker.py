"""The picker: one pod out of the filtered candidates, the best-scored one when the prompt has whole blocks to
be affine to, else the least loaded (rotating among equals, so an idle pool still spreads requests)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic

from inferencepool.scheduling.endpoint import E
from inferencepool.scheduling.prefix import PrefixIndex
from inferencepool.scheduling.scorers import prefix_score


@dataclass(frozen=True, slots=True)
class Choice(Generic[E]):
    pod: E
    cached_blocks: int  # the pod's cached prefix of the prompt, in blocks (as the index estimates it)


def best_prefix(
    candidates: Sequence[E], keys: Sequence[int], index: PrefixIndex, anchor_blocks: int
) -> Choice[E]:
    """The highest `prefix_score` (candidates and keys non-empty)."""
    anchor = keys[min(anchor_blocks, len(keys)) - 1]
    best = candidates[0]
    best_rank, best_cached = prefix_score(best, keys, anchor, anchor_blocks, index)
    for pod in candidates[1:]:
        rank, cached = prefix_score(pod, keys, anchor, anchor_blocks, index)
        if rank > best_rank:
            best, best_rank, best_cached = pod, rank, cached
    return Choice(best, best_cached)


def least_loaded(candidates: Sequence[E], turn: int) -> E:
    """The pod with the fewest requests of the router's own in flight; `turn` rotates among equals."""
    least = min(pod.outstanding for pod in candidates)
    tied = [pod for pod in candidates if pod.outstanding == least]
    return tied[turn % len(tied)]
