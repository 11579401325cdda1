"""What a request would cost on each route, as the live router can estimate it (pure, no I/O; the inputs
are the endpoint table's live figures).

Prefill speed is learned, not configured: seconds per prompt token of prefill legs that found their pod
idle (nothing of the router's queued there, the engine reporting nothing waiting), a running mean. A pod's
queue is the prefill work waiting on it: the tokens of legs the router sent there that have not produced
their first token yet, or, when the engine reports more requests waiting than that, those requests at the
mean prompt size (other router replicas' work). Until one idle prefill leg has been timed the router knows
no speed, and routes on uncached tokens alone (no load-aware bypass). The KV transfer's own time is not
estimated here (it is part of the prefill legs' measured time only where the engine waits for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferencepool.router.pods import Pod
from inferencepool.router.policy import RouteCosts

_WEIGHT = 0.2  # a new sample's weight in the running means once a few were seen


@dataclass(slots=True)
class PrefillSpeed:
    seconds_per_token: float | None = None
    mean_prompt_tokens: float = 0.0
    samples: int = 0
    prompts: int = 0

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

    def queue_tokens(self, pod: Pod) -> float:
        waiting = pod.engine_waiting * self.mean_prompt_tokens
        return max(float(pod.queued_tokens), waiting)


def route_costs(
    speed: PrefillSpeed,
    uncached_tokens: int,
    prefill_pod: Pod | None,
    decode_pod: Pod | None,
    ttft_target_seconds: float,
) -> RouteCosts:
    rate = speed.seconds_per_token
    if rate is None:
        return RouteCosts(uncached_tokens, 0.0, 0.0, 0.0, 0.0, None)
    return RouteCosts(
        uncached_tokens=uncached_tokens,
        prefill_seconds=rate * uncached_tokens,
        prefill_queue_seconds=rate * speed.queue_tokens(prefill_pod) if prefill_pod is not None else 0.0,
        decode_queue_seconds=rate * speed.queue_tokens(decode_pod) if decode_pod is not None else 0.0,
        transfer_seconds=0.0,
        ttft_target_seconds=ttft_target_seconds,
    )


def idle(pods: Sequence[Pod]) -> bool:
    return all(pod.queued_tokens == 0 and pod.engine_waiting == 0 for pod in pods)
