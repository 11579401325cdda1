"""Scorers: how well a pod suits a prompt. One scorer, the cached prefix (as the router's index estimates it),
ranked with the pod's rendezvous weight for the prompt's anchor key so that equals (and cold prefixes) spread
deterministically: two router replicas over the same pods at similar load rank alike.

A prefix counts only from `anchor_blocks` blocks on: requests sharing just a short system prompt have
different anchors (the key of their first `anchor_blocks` blocks) and spread; requests sharing a long prefix
have the same anchor and land together."""

from __future__ import annotations

from collections.abc import Sequence

from inferencepool.scheduling.endpoint import Endpoint
from inferencepool.scheduling.prefix import PrefixIndex, rendezvous


def prefix_score(
    pod: Endpoint, keys: Sequence[int], anchor: int, anchor_blocks: int, index: PrefixIndex
) -> tuple[tuple[int, int], int]:
    """The pod's rank for the prompt (higher is better) and its cached prefix in blocks."""
    cached = index.cached_blocks(pod.name, keys)
    return (cached if cached >= anchor_blocks else 0, rendezvous(anchor, pod.seed)), cached
