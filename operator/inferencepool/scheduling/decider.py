"""The disaggregation decider: route prompts over N uncached tokens through the prefill pool.

N is the pool's prefill threshold (`spec.router.prefillThresholdTokens`, moved by the adaptive threshold
when that is on), and the tokens are the uncached ones: the prompt less the prefix the chosen decode pod
already holds (llm-d's `prefix_based_pd_decider`: `nonCachedTokens = inputTokens - hitPrefixTokens`).
Around that rule, a load-aware bypass both ways, from the route costs (`costs.py`):

- a long prompt is prefilled on its decode pod when the prefill pool is so busy that its TTFT estimate
  (queue + prefill + transfer) misses the target while the decode pod's (queue + prefill) would not, and the
  decode pod has room for it (`decode_has_room`);
- a shorter prompt goes through the prefill pool when the decode pod's queue would make it miss the target
  and the prefill pool would not, or when the prefill pod has nothing queued and the decode pod has (prefill
  chunks on a decode pod stall its running decodes; an idle prefill pod does the work for the price of a
  transfer). Both only for prompts of at least a quarter of the threshold: a transfer never pays for a
  handful of tokens.

Role lending (`spec.router.roleLending`, LengthAware only): a request is served whole on a prefill pod
(route `lent`, reason `decode_saturated`) when the decode side queues (no decode pod, or every one has
requests waiting in its engine or a full KV cache: past the batch the operator sized for the ITL target, or
its memory, so the request would wait on either route) and the prefill pod would not: nothing waiting in
its engine and, once the prefill speed is known, its queue plus the whole prompt within the TTFT target.
vLLM serves a request without `kv_transfer_params` colocated whatever the engine's kv_role
(docs/engine-contract.md, section 3), and the operator sizes a lending pool's prefill chunk so that the
lent decodes keep their ITL target (`InferencePoolSpec.batch_args`).

Lending's other direction: a long prompt meant for the prefill pool is prefilled on another decode pod for
the chosen one (route `disaggregated`, reason `prefill_saturated`) when the prefill side queues (every prefill
pod that could take it has requests waiting in its engine or a full KV cache), the chosen decode pod runs
requests (a prefill there would stall them: the load-aware bypass above did not take it) and a peer decode
pod with its KV-compatibility label runs nothing and has nothing queued, and, once the prefill speed is
known, the peer's prefill plus the transfer is within the TTFT target. The peer is sent the prefill leg as a
prefill pod is (`do_remote_decode`), which vLLM's NixlConnector serves on a `kv_consumer` as on a producer
(docs/engine-contract.md, section 3); the chosen pod loads the KV and keeps the decode, so the peer stays
free for the next prompt and the decodes stay where the prefix-aware choice put them.

Policy Colocated never disaggregates, AlwaysDisaggregate always does when it can.
"""

from __future__ import annotations

from enum import StrEnum

from inferencepool.api.v1alpha1 import RoutingPolicy
from inferencepool.scheduling.costs import RouteCosts


class Route(StrEnum):
    DIRECT = "direct"
    """A decode pod prefills the prompt itself (short prompt, or Colocated policy)."""
    DISAGGREGATED = "disaggregated"
    """Prefill pod computes the KV cache, the decode pod fetches it and generates."""
    LENT = "lent"
    """Served whole (prefill and decode) on a prefill pod: the decode pool was saturated (role lending)."""
    FALLBACK = "fallback"
    """Meant for the prefill pool, served colocated because no prefill pod could take it (none ready, none
    whose KV the decode pod can load) or the prefill leg failed."""


class RouteReason(StrEnum):
    """Why a request took its route (the `disaggregation decisions` reasons)."""

    POLICY = "policy"  # Colocated or AlwaysDisaggregate decided alone
    SHORT = "short"  # fewer prompt tokens than the threshold
    CACHED = "cached"  # long, but the chosen decode pod holds enough of its prefix
    LONG = "long"  # enough uncached tokens to pay for the transfer
    PREFILL_BUSY = "prefill_busy"  # the prefill pool's queue would miss the TTFT target, the decode pod not
    DECODE_BUSY = "decode_busy"  # the decode pod's prefill queue would miss it, the prefill pool not
    PREFILL_IDLE = "prefill_idle"  # a medium prompt goes to an idle prefill pod, sparing the decodes' ITL
    PREFILL_SATURATED = "prefill_saturated"  # disaggregated, prefilled on an idle peer decode pod (lending)
    DECODE_SATURATED = "decode_saturated"  # lent: the decode side queues, a prefill pod has room
    NO_PREFILL_POD = "no_prefill_pod"  # no prefill pod is ready
    KV_INCOMPATIBLE = "kv_incompatible"  # prefill pods are ready, none with the decode pod's KV-compat label


def decide(
    policy: RoutingPolicy,
    costs: RouteCosts,
    threshold_tokens: int,
    prefill_ready: bool,
    prompt_tokens: int,
    no_prefill: RouteReason = RouteReason.NO_PREFILL_POD,
    *,
    lending: bool = False,
    prefill_idle: bool = False,
) -> tuple[Route, RouteReason]:
    """The route and why (see the module's docstring). `prefill_ready`: a prefill pod can take the request;
    when none can, `no_prefill` says why. `lending`: the pool lends decode work to prefill pods;
    `prefill_idle`: the prefill pod has nothing waiting in its engine. On the `prefill_saturated` decision the
    caller's prefill pod is the peer decode pod the costs weighed (`Scheduler.schedule`)."""
    if policy == "Colocated":
        return Route.DIRECT, RouteReason.POLICY
    if policy == "AlwaysDisaggregate":
        if not prefill_ready:
            return Route.FALLBACK, no_prefill
        return Route.DISAGGREGATED, RouteReason.POLICY
    target = costs.ttft_target_seconds
    lend = lending and prefill_ready and prefill_idle and costs.decode_saturated
    if lend and (target is None or costs.lend_seconds <= target):
        return Route.LENT, RouteReason.DECODE_SATURATED
    direct = costs.decode_queue_seconds + costs.prefill_seconds
    disaggregated = costs.prefill_queue_seconds + costs.prefill_seconds + costs.transfer_seconds
    if costs.uncached_tokens < threshold_tokens:
        medium = prefill_ready and costs.uncached_tokens * 4 >= threshold_tokens
        if medium and target is not None and direct > target >= disaggregated:
            return Route.DISAGGREGATED, RouteReason.DECODE_BUSY
        # only where the hand-off still meets the target: on a slow KV link the transfer alone may not
        if (
            medium
            and costs.prefill_queue_seconds <= 0 < costs.decode_queue_seconds
            and (target is None or disaggregated <= target)
        ):
            return Route.DISAGGREGATED, RouteReason.PREFILL_IDLE
        return Route.DIRECT, RouteReason.CACHED if prompt_tokens >= threshold_tokens else RouteReason.SHORT
    if not prefill_ready:
        return Route.FALLBACK, no_prefill
    if target is not None and disaggregated > target >= direct and costs.decode_has_room:
        return Route.DIRECT, RouteReason.PREFILL_BUSY
    peer = costs.peer_seconds
    if lending and costs.prefill_saturated and peer is not None and (target is None or peer <= target):
        return Route.DISAGGREGATED, RouteReason.PREFILL_SATURATED
    return Route.DISAGGREGATED, RouteReason.LONG
