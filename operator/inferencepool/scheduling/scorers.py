"""Scorers: how well a pod suits a prompt. One scorer, when the prompt would start on the pod: its cached
prefix (as the router's index estimates it) saves the prompt that many tokens of prefill, the prefill work
already queued there delays it by as many, ranked with the pod's rendezvous weight for the prompt's anchor key
so that equals (and cold prefixes on idle pods) spread deterministically: two router replicas over the same
pods at similar load rank alike.

Why queued tokens and not only the prefix: the load bound (filters.py) counts requests, not their tokens, and
with long prompts (Mooncake's conversations: p50 8354 tokens, 70% over 4096) a pod holding the prefix under
that bound could have several prompts' prefill ahead of this one, more than the prefix saves: the prompt
then starts later there than on an idle pod that computes it whole. Scored by the longest prefix alone, the
colocated prefix-aware pool went from 0.72 to 0.51 requests/s per GPU on Mooncake (README). Tokens, not
seconds: both sides are prefill work on the same engines, so the scorer needs no learned speed.

A prefix counts only from `anchor_blocks` blocks on: requests sharing just a short system prompt have
different anchors (the key of their first `anchor_blocks` blocks) and spread; requests sharing a long prefix
have the same anchor and land together while their pod's queue is shorter than the prefix."""

from __future__ import annotations

from collections.abc import Sequence

from inferencepool.scheduling.endpoint import Endpoint
from inferencepool.scheduling.prefix import PrefixIndex, rendezvous


def start_score(
    pod: Endpoint,
    keys: Sequence[int],
    anchor: int,
    anchor_blocks: int,
    index: PrefixIndex,
    saved_per_block: int,
    max_saved: int,
    queued: float,
) -> tuple[tuple[float, int], int]:
    """The pod's rank for the prompt (higher is better: the prompt starts sooner) and its cached prefix in
    blocks. `saved_per_block`: prompt tokens per block; `max_saved`: the most a prefix saves (the engine
    computes the prompt's last token); `queued`: the prefill tokens ahead of the prompt there, as weighed."""
    cached = index.cached_blocks(pod.name, keys)
    saved = min(cached * saved_per_block, max_saved) if cached >= anchor_blocks else 0
    return (saved - queued, rendezvous(anchor, pod.seed)), cached
