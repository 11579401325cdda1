"""Which route a request takes (pure): straight to a decode pod, or prefill pod -> KV transfer -> decode
pod."""

from __future__ import annotations

from enum import StrEnum

from inferencepool.router.config import RoutingPolicy


class Route(StrEnum):
    DIRECT = "direct"
    """A decode pod prefills the prompt itself (short prompt, or Colocated policy)."""
    DISAGGREGATED = "disaggregated"
    """Prefill pod computes the KV cache, the decode pod fetches it and generates."""
    FALLBACK = "fallback"
    """Meant for the prefill pool, served colocated because no prefill pod was ready or the prefill leg
    failed."""


def wants_prefill_pool(policy: RoutingPolicy, prompt_tokens: int, threshold_tokens: int) -> bool:
    """Whether the policy sends this prompt through the prefill pool (if one can take it)."""
    if policy == "Colocated":
        return False
    if policy == "AlwaysDisaggregate":
        return True
    return prompt_tokens >= threshold_tokens


def choose_route(
    policy: RoutingPolicy, prompt_tokens: int, threshold_tokens: int, prefill_ready: bool
) -> Route:
    if not wants_prefill_pool(policy, prompt_tokens, threshold_tokens):
        return Route.DIRECT
    return Route.DISAGGREGATED if prefill_ready else Route.FALLBACK
