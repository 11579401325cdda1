"""The picker: one pod out of the filtered candidates, the best-scored one when the prompt has whole blocks to
be affine to, else the least loaded (rotating among equals, so an idle pool still spreads requests)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic

from inferencepool.scheduling.endpoint import E, Endpoint
from inferencepool.scheduling.prefix import PrefixIndex
from inferencepool.scheduling.scorers import start_score


@dataclass(frozen=True, slots=True)
class Choice(Generic[E]):
    pod: E
    cached_blocks: int  # the pod's cached prefix of the prompt, in blocks (as the index estimates it)


def soonest_start(
    candidates: Sequence[E],
    tokens: int,
    keys: Sequence[int],
    index: PrefixIndex,
    anchor_blocks: int,
    block_tokens: int,
    queue_tokens: Callable[[Endpoint], float],
    queue_weight: float,
) -> Choice[E]:
    """The highest `start_score` (candidates and keys non-empty); `queue_tokens`: a pod's queued prefill
    work in tokens, weighed by `queue_weight` (0: the longest cached prefix alone)."""
    anchor = keys[min(anchor_blocks, len(keys)) - 1]
    max_saved = tokens - 1
    best = candidates[0]
    queued = queue_weight * queue_tokens(best) if queue_weight else 0.0
    best_rank, best_cached = start_score(
        best, keys, anchor, anchor_blocks, index, block_tokens, max_saved, queued
    )
    for pod in candidates[1:]:
        queued = queue_weight * queue_tokens(pod) if queue_weight else 0.0
        rank, cached = start_score(pod, keys, anchor, anchor_blocks, index, block_tokens, max_saved, queued)
        if rank > best_rank:
            best, best_rank, best_cached = pod, rank, cached
    return Choice(best, best_cached)


def least_loaded(candidates: Sequence[E], turn: int) -> E:
    """The pod with the fewest requests of the router's own in flight; `turn` rotates among equals."""
    least = min(pod.outstanding for pod in candidates)
    tied = [pod for pod in candidates if pod.outstanding == least]
    return tied[turn % len(tied)]
