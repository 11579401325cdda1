"""Which route a request takes (pure): straight to a decode pod, or prefill pod -> KV transfer -> decode
pod."""

from __future__ import annotations

from dataclasses import dataclass
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


class RouteReason(StrEnum):
    """Why a request took its route (the `disaggregation decisions` reasons)."""

    POLICY = "policy"  # Colocated or AlwaysDisaggregate decided alone
    SHORT = "short"  # fewer prompt tokens than the threshold
    CACHED = "cached"  # long, but the chosen decode pod holds enough of its prefix
    LONG = "long"  # enough uncached tokens to pay for the transfer
    PREFILL_BUSY = "prefill_busy"  # the prefill pool's queue would miss the TTFT target, the decode pod not
    DECODE_BUSY = "decode_busy"  # the decode pod's prefill queue would miss it, the prefill pool not
    PREFILL_IDLE = "prefill_idle"  # a medium prompt goes to an idle prefill pool, sparing the decodes' ITL
    NO_PREFILL_POD = "no_prefill_pod"


@dataclass(frozen=True, slots=True)
class RouteCosts:
    """What a request costs on each route, as the router estimates it (seconds)."""

    uncached_tokens: int  # prompt tokens the chosen decode pod would compute (prompt minus its cached prefix)
    prefill_seconds: float  # computing those tokens on an idle engine
    prefill_queue_seconds: float  # prefill work already waiting on the least loaded prefill pod
    decode_queue_seconds: float  # prefill work already waiting on the chosen decode pod
    transfer_seconds: float  # moving the prompt's KV from a prefill pod to the decode pod
    ttft_target_seconds: float | None = None  # None: no load-aware bypass
    # whether the decode pod can prefill this prompt without stalling the decodes it runs past their ITL
    # target (nothing running there, or a prefill shorter than the target); False: no bypass onto it
    decode_has_room: bool = True


def choose_route_by_cost(
    policy: RoutingPolicy,
    costs: RouteCosts,
    threshold_tokens: int,
    prefill_ready: bool,
    prompt_tokens: int,
) -> tuple[Route, RouteReason]:
    """LengthAware on what the decode pod would actually compute, with load-aware bypass both ways.

    A prompt goes through the prefill pool when its uncached tokens reach the threshold, unless the prefill
    pool is so busy that its TTFT estimate (queue + prefill + transfer) misses the target while prefilling on
    the decode pod (its queue + prefill) would not and the decode pod has room for it (`decode_has_room`);
    and a shorter prompt goes through the prefill pool when the decode pod's queue would make it miss the
    target and the prefill pool would not, or when the prefill pool has nothing queued and the decode pod
    has (prefill chunks on a decode pod stall its running decodes; an idle prefill pod does the work for the
    price of a transfer). Both only for prompts of at least a quarter of the threshold: a transfer never
    pays for a handful of tokens.
    """
    if policy == "Colocated":
        return Route.DIRECT, RouteReason.POLICY
    if policy == "AlwaysDisaggregate":
        if not prefill_ready:
            return Route.FALLBACK, RouteReason.NO_PREFILL_POD
        return Route.DISAGGREGATED, RouteReason.POLICY
    target = costs.ttft_target_seconds
    direct = costs.decode_queue_seconds + costs.prefill_seconds
    disaggregated = costs.prefill_queue_seconds + costs.prefill_seconds + costs.transfer_seconds
    if costs.uncached_tokens < threshold_tokens:
        medium = prefill_ready and costs.uncached_tokens * 4 >= threshold_tokens
        if medium and target is not None and direct > target >= disaggregated:
            return Route.DISAGGREGATED, RouteReason.DECODE_BUSY
        if medium and costs.prefill_queue_seconds <= 0 < costs.decode_queue_seconds:
            return Route.DISAGGREGATED, RouteReason.PREFILL_IDLE
        return Route.DIRECT, RouteReason.CACHED if prompt_tokens >= threshold_tokens else RouteReason.SHORT
    if not prefill_ready:
        return Route.FALLBACK, RouteReason.NO_PREFILL_POD
    if target is not None and disaggregated > target >= direct and costs.decode_has_room:
        return Route.DIRECT, RouteReason.PREFILL_BUSY
    return Route.DISAGGREGATED, RouteReason.LONG
