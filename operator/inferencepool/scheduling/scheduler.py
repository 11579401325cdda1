"""One scheduling cycle: `Scheduler.schedule(tokens, keys, view, now, threshold) -> Decision`.

1. The decode pod: of the view's available decode pods, those with KV room and under the load bound, the one
   where the prompt would start soonest: the longest cached prefix less the prefill work queued there, in
   tokens (`scorers.start_score`; ties by rendezvous); the least loaded when the prompt has no whole block
   (or prefix affinity is off).
2. The prefill pod, unless the policy is Colocated: available prefill pods whose KV the decode pod can load
   (the same `LABEL_KV_COMPAT` value), chosen the same way.
3. The route (decider.py) from the decode pod's uncached tokens and both pods' queues (costs.py). With role
   lending, when every prefill pod queues and the decode pod runs requests, an idle peer decode pod (same
   KV-compatibility label) is weighed as the prefill pod too; on reason `prefill_saturated` it is the
   decision's prefill pod.
4. Then what the request will leave behind, as GIE's PreRequest does: the decode pod (and on the disaggregated
   route the prefill pod) will hold the prompt's KV, and the prompt's uncached size joins the running mean the
   queue estimates use.

The drivers own the rest: the router times prefill legs and KV transfers into `speed` and counts queued work
on its pods; the simulator does the same in virtual time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from inferencepool.api.v1alpha1 import RoutingPolicy
from inferencepool.scheduling.costs import PrefillSpeed, route_costs
from inferencepool.scheduling.decider import Route, RouteReason, decide
from inferencepool.scheduling.endpoint import E, Endpoint, EngineRole
from inferencepool.scheduling.filters import kv_compatible, under_load_bound, with_kv_room
from inferencepool.scheduling.picker import least_loaded, soonest_start
from inferencepool.scheduling.prefix import PrefixIndex

E_co = TypeVar("E_co", bound=Endpoint, covariant=True)


class PodView(Protocol[E_co]):
    """The pods as a driver sees them (the router's `PodSet`)."""

    @property
    def prefixes(self) -> PrefixIndex: ...

    def available(self, role: EngineRole, now: float) -> Sequence[E_co]:
        """Pods of `role` that take new requests (those cooling down after a failure only when nothing else
        is left)."""
        ...


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    policy: RoutingPolicy
    ttft_target_seconds: float  # the load-aware bypass's targets (`costs.route_costs`)
    itl_target_seconds: float
    block_tokens: int = 256  # tokens per prefix block; 0: no prefix affinity (pods by load alone)
    anchor_blocks: int = 4  # blocks a shared prefix needs before it keeps requests together
    load_factor: float = 1.25
    min_load_bound: int = 4
    # prefill tokens queued on a pod weigh against the tokens its cached prefix saves (scorers.py): 1.0, the
    # prompt starts when both are done; 0, the longest prefix under the load bound wins whatever its queue
    queue_weight: float = 1.0
    lending: bool = False  # role lending: serve a request whole on a prefill pod when the decodes queue


@dataclass(slots=True)  # not frozen: built once per request on the router's hot path
class Decision(Generic[E]):
    route: Route
    reason: RouteReason
    decode: E | None  # None: no decode pod takes requests
    prefill: E | None  # the prefill pod, on the disaggregated and lent routes (else the one weighed)
    prompt_tokens: int
    uncached_tokens: int  # what the decode pod would compute: the prompt less its cached prefix
    prefill_tokens: int  # ... and what the prefill pod would


class Scheduler:
    __slots__ = ("_turn", "config", "speed")

    def __init__(self, config: SchedulerConfig, speed: PrefillSpeed | None = None) -> None:
        self.config = config
        self.speed = speed or PrefillSpeed()
        self._turn = 0

    def schedule(
        self, tokens: int, keys: Sequence[int], view: PodView[E], now: float, threshold_tokens: int
    ) -> Decision[E]:
        config = self.config
        prefixes = view.prefixes
        decodes = view.available("decode", now)
        decode, cached_blocks = self.pick(decodes, tokens, keys, prefixes)
        uncached = self._uncached(tokens, cached_blocks)
        prefill: E | None = None
        prefill_tokens = tokens
        no_prefill = RouteReason.NO_PREFILL_POD
        prefill_saturated = False
        peer: E | None = None
        peer_tokens: int | None = None
        if config.policy != "Colocated":
            candidates = view.available("prefill", now)
            if candidates and decode is not None:
                compatible = kv_compatible(candidates, decode.kv_compat)
                if not compatible:
                    no_prefill = RouteReason.KV_INCOMPATIBLE
                candidates = compatible
            prefill, prefill_blocks = self.pick(candidates, tokens, keys, prefixes)
            prefill_tokens = self._uncached(tokens, prefill_blocks)
            if config.lending and candidates and decode is not None and decode.load > 0:
                prefill_saturated = all(pod.engine_waiting > 0 or pod.kv_full for pod in candidates)
                if prefill_saturated:
                    peer, peer_blocks = self.pick(_idle_peers(decodes, decode), tokens, keys, prefixes)
                    peer_tokens = None if peer is None else self._uncached(tokens, peer_blocks)
        speed = self.speed
        costs = route_costs(
            speed,
            uncached,
            prefill,
            decode,
            config.ttft_target_seconds,
            config.itl_target_seconds,
            prefill_tokens,
            config.lending and all(pod.engine_waiting > 0 or pod.kv_full for pod in decodes),
            prefill_saturated,
            peer_tokens,
        )
        prefill_ready = prefill is not None
        route, reason = decide(
            config.policy,
            costs,
            threshold_tokens,
            prefill_ready,
            tokens,
            no_prefill,
            lending=config.lending,
            prefill_idle=prefill is not None and prefill.engine_waiting == 0,
        )
        speed.observe_prompt(uncached)
        if reason is RouteReason.PREFILL_SATURATED and peer is not None and peer_tokens is not None:
            prefill, prefill_tokens = peer, peer_tokens
        if route is Route.LENT and prefill is not None:
            if keys:
                prefixes.sent(prefill.name, keys)  # the prefill pod computes it and keeps it
            return Decision(route, reason, decode, prefill, tokens, uncached, prefill_tokens)
        if decode is not None and keys:
            prefixes.sent(decode.name, keys)  # it computes the prompt, or the transfer lands its KV there
        if route is Route.DISAGGREGATED and prefill is not None and keys:
            prefixes.sent(prefill.name, keys)
        return Decision(route, reason, decode, prefill, tokens, uncached, prefill_tokens)

    def _uncached(self, tokens: int, cached_blocks: int) -> int:
        if not cached_blocks:
            return tokens
        return tokens - min(cached_blocks * self.config.block_tokens, tokens - 1)

    def pick(
        self, candidates: Sequence[E], tokens: int, keys: Sequence[int], prefixes: PrefixIndex
    ) -> tuple[E | None, int]:
        """One pod of `candidates` for a prompt of `tokens` with these keys, and its cached blocks."""
        if not candidates:
            return None, 0
        if not keys:
            if len(candidates) == 1:
                return candidates[0], 0
            self._turn += 1
            return least_loaded(candidates, self._turn), 0
        config = self.config
        eligible = under_load_bound(with_kv_room(candidates), config.load_factor, config.min_load_bound)
        choice = soonest_start(
            eligible,
            tokens,
            keys,
            prefixes,
            config.anchor_blocks,
            config.block_tokens,
            self.speed.queue_tokens,
            config.queue_weight,
        )
        return choice.pod, choice.cached_blocks


def _idle_peers(decodes: Sequence[E], chosen: E) -> list[E]:
    """Decode pods that may prefill for `chosen` (role lending): its KV-compatibility label (it loads their
    KV), nothing running or queued (no decode to stall, no prefill to wait behind) and KV room."""
    return [
        pod
        for pod in decodes
        if pod is not chosen
        and pod.kv_compat == chosen.kv_compat
        and pod.load == 0
        and pod.queued_tokens == 0
        and pod.engine_waiting == 0
        and not pod.kv_full
    ]
