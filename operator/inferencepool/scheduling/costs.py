"""What a request would cost on each route, as the router can estimate it (no I/O: the inputs are the
endpoint table's live figures; the drivers time the legs).

Prefill speed is learned, not configured: seconds per prompt token of prefill legs that found their pod
idle (nothing of the router's queued there, the engine reporting nothing waiting), a running mean. A pod's
queue is the prefill work waiting on it: the tokens of legs the router sent there that have not produced
their first token yet, or, when the engine reports more requests waiting than that, those requests at the
mean prompt size (other router replicas' work). Until one idle prefill leg has been timed the router knows
no speed, and routes on uncached tokens alone (no load-aware bypass). The KV transfer is timed the same
way: from the decode leg's start to its first token, on decode pods that had no queue (the engine loads the
KV, then runs one step), per transferred token (the prompt less what the decode pod holds).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferencepool.scheduling.endpoint import Endpoint

_WEIGHT = 0.2  # a new sample's weight in the running means once a few were seen


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
    # the decode side queues: no decode pod, or every one has requests waiting in its engine or a full KV
    # cache (past its batch, sized for the ITL target, or its memory): a prompt sent to any, directly or after
    # a transfer, waits behind them
    decode_saturated: bool = False
    # serving the request whole on the prefill pod (role lending): its queue and the prompt it would compute
    lend_seconds: float = 0.0
    # the prefill side queues: every prefill pod that could take the prompt has requests waiting in its engine
    # or a full KV cache (role lending's other direction)
    prefill_saturated: bool = False
    # prefilling on an idle peer decode pod for the chosen one (role lending): the prompt it would compute
    # and the transfer; None when no peer can (the chosen decode pod runs nothing, or no other is idle)
    peer_seconds: float | None = None


@dataclass(slots=True)
class PrefillSpeed:
    seconds_per_token: float | None = None
    transfer_seconds_per_token: float = 0.0
    mean_prompt_tokens: float = 0.0
    samples: int = 0
    prompts: int = 0
    transfers: int = 0

    def observe_prompt(self, tokens: int) -> None:
        self.prompts += 1
        weight = max(_WEIGHT, 1.0 / self.prompts)
        self.mean_prompt_tokens += (tokens - self.mean_prompt_tokens) * weight

    def observe_leg(self, seconds: float, tokens: int) -> None:
        """A prefill leg of `tokens` that started on an idle pod took `seconds`."""
        if tokens <= 0 or seconds <= 0:
            return
        self.samples += 1
        rate = seconds / tokens
        if self.seconds_per_token is None:
            self.seconds_per_token = rate
        else:
            weight = max(_WEIGHT, 1.0 / self.samples)
            self.seconds_per_token += (rate - self.seconds_per_token) * weight

    def observe_transfer(self, seconds: float, tokens: int) -> None:
        """A decode leg that loads `tokens` tokens' KV from a prefill pod had its first token after
        `seconds`."""
        if tokens <= 0 or seconds <= 0:
            return
        self.transfers += 1
        weight = max(_WEIGHT, 1.0 / self.transfers)
        self.transfer_seconds_per_token += (seconds / tokens - self.transfer_seconds_per_token) * weight

    def queue_tokens(self, pod: Endpoint) -> float:
        waiting = pod.engine_waiting * self.mean_prompt_tokens
        return max(float(pod.queued_tokens), waiting)


def route_costs(
    speed: PrefillSpeed,
    uncached_tokens: int,
    prefill_pod: Endpoint | None,
    decode_pod: Endpoint | None,
    ttft_target_seconds: float,
    itl_target_seconds: float,
    prefill_tokens: int | None = None,
    decode_saturated: bool = False,
    prefill_saturated: bool = False,
    peer_tokens: int | None = None,
) -> RouteCosts:
    """A decode pod has room for a bypassed prompt when it runs nothing (no decode to stall) or when the
    prompt's prefill is shorter than the ITL target: a long prefill on a busy decode pod would stall every
    stream it serves by as much. `peer_tokens`: what an idle peer decode pod would compute for the chosen one
    (None: no peer can), whose KV the chosen one then loads: the uncached tokens."""
    saturated = decode_saturated
    rate = speed.seconds_per_token
    if rate is None:
        return RouteCosts(
            uncached_tokens, 0.0, 0.0, 0.0, 0.0, None,
            decode_saturated=saturated,
            prefill_saturated=prefill_saturated,
            peer_seconds=None if peer_tokens is None else 0.0,
        )  # fmt: skip
    prefill_seconds = rate * uncached_tokens
    prefill_queue = rate * speed.queue_tokens(prefill_pod) if prefill_pod is not None else 0.0
    lend_tokens = uncached_tokens if prefill_tokens is None else prefill_tokens
    transfer = speed.transfer_seconds_per_token * uncached_tokens
    return RouteCosts(
        uncached_tokens=uncached_tokens,
        prefill_seconds=prefill_seconds,
        prefill_queue_seconds=prefill_queue,
        decode_queue_seconds=rate * speed.queue_tokens(decode_pod) if decode_pod is not None else 0.0,
        transfer_seconds=transfer,
        ttft_target_seconds=ttft_target_seconds,
        decode_has_room=decode_pod is None or decode_pod.load == 0 or prefill_seconds <= itl_target_seconds,
        decode_saturated=saturated,
        lend_seconds=prefill_queue + rate * lend_tokens,
        prefill_saturated=prefill_saturated,
        peer_seconds=None if peer_tokens is None else rate * peer_tokens + transfer,
    )
