"""The router in virtual time: the live router's scheduling core (`inferencepool.scheduling.Scheduler`) over
the live router's `PodSet`, with the bookkeeping the router's orchestrator (`router/generate.py`) does around
each decision, driven by the simulator's events instead of HTTP legs:

- the prompt's block keys are the router's own (`tokens.ids_keys`, as for a prompt sent as token ids);
- prefill work sent to a pod counts in its `queued_tokens` (`router.pods.Queued`) until that leg's first
  token: the prefill leg's answer, or a direct request's first token;
- a prefill leg that found its pod idle times the prefill speed, and a disaggregated decode leg on a pod with
  nothing queued times the KV transfer (`PrefillSpeed.observe_leg` / `observe_transfer`);
- a decode leg goes to the pod the decision named while it takes requests, else to `PodSet.pick`, as
  `router/legs.py` does.

- every `engineMetricsIntervalMilliseconds` the router reads each engine's running and waiting requests and
  KV usage, as `router/engine_load.py` scrapes them off /metrics (`scrape`): a pod's load is the larger of
  its own in-flight count and the engine's, and a pod full of KV with requests waiting sits out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from inferencepool.router.config import RouterConfig
from inferencepool.router.generate import MAX_PREFIX_BLOCKS
from inferencepool.router.pods import Pod, PodSet, Queued
from inferencepool.router.tokens import ids_keys
from inferencepool.scheduling.decider import Route
from inferencepool.scheduling.scheduler import Decision, Scheduler


class Engine(Protocol):
    """What the scrape reads of an engine: vLLM's num_requests_running and _waiting, kv_cache_usage."""

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...


class Scraped(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def core(self) -> Engine: ...


class SimRouter:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        affinity = config.prefix_affinity
        self.pods = PodSet(
            load_factor=affinity.load_factor_percent / 100,
            virtual_nodes=affinity.virtual_nodes,
            min_load_bound=affinity.min_load_bound,
            index_blocks=affinity.index_blocks,
        )
        self.scheduler = Scheduler(config.scheduling())
        self.block_tokens = self.scheduler.config.block_tokens
        self.reasons: dict[str, int] = {}
        self._queued: dict[str, Queued] = {}  # by leg (pod/request id): prefill work until its first token
        # prefill legs that found their pod idle, and decode legs timing a KV transfer: start, tokens
        self._prefill_clocks: dict[str, tuple[float, int]] = {}
        self._transfer_clocks: dict[str, tuple[float, int]] = {}

    def keys(self, ids: Sequence[int]) -> list[int]:
        """The prompt's chained block keys, as the router hashes a prompt of token ids."""
        if not self.block_tokens:
            return []
        return ids_keys(ids, self.block_tokens, MAX_PREFIX_BLOCKS)

    def decide(self, tokens: int, keys: Sequence[int], now: float, threshold: int) -> Decision[Pod]:
        decision = self.scheduler.schedule(tokens, keys, self.pods, now, threshold)
        reason = decision.reason.value
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        return decision

    def prefill_sent(self, pod: Pod, request_id: str, tokens: int, now: float) -> None:
        leg = f"{pod.name}/{request_id}"
        if pod.role == "prefill" and pod.queued_tokens == 0 and pod.engine_waiting == 0:
            self._prefill_clocks[leg] = (now, tokens)  # the prefill pool's speed, not a peer decode pod's
        self._queued[leg] = Queued(pod, tokens)

    def prefill_answered(self, pod_name: str, request_id: str, now: float) -> None:
        leg = f"{pod_name}/{request_id}"
        self._release(leg)
        clock = self._prefill_clocks.pop(leg, None)
        if clock is not None:
            self.scheduler.speed.observe_leg(now - clock[0], clock[1])

    def decode_pod(self, named: str | None, now: float) -> Pod:
        """The decode leg's pod: the one the decision named while it takes requests, else the pick."""
        pod = self.pods.pods.get(named) if named is not None else None
        if pod is None or not pod.accepts_new:
            pod = self.pods.pick("decode", now)
        if pod is None:
            raise AssertionError(f"no decode pod takes requests at {now:.3f}s")
        return pod

    def decode_sent(self, pod: Pod, request_id: str, route: Route, uncached: int, now: float) -> None:
        leg = f"{pod.name}/{request_id}"
        if route is not Route.DISAGGREGATED:
            self._queued[leg] = Queued(pod, uncached)
        elif pod.queued_tokens == 0 and pod.engine_waiting == 0:
            self._transfer_clocks[leg] = (now, uncached)

    def first_token(self, pod_name: str, request_id: str, now: float) -> None:
        leg = f"{pod_name}/{request_id}"
        self._release(leg)
        clock = self._transfer_clocks.pop(leg, None)
        if clock is not None:
            self.scheduler.speed.observe_transfer(now - clock[0], clock[1])

    def _release(self, leg: str) -> None:
        work = self._queued.pop(leg, None)
        if work is not None:
            work.release()

    def leg_failed(self, pod_name: str, request_id: str) -> None:
        leg = f"{pod_name}/{request_id}"
        self._release(leg)
        self._prefill_clocks.pop(leg, None)
        self._transfer_clocks.pop(leg, None)

    def scrape(self, replicas: Iterable[Scraped]) -> None:
        """The engines' own load figures, as the router's periodic read of their /metrics sets them."""
        pods = self.pods.pods
        for replica in replicas:
            pod = pods.get(replica.name)
            if pod is not None:
                core = replica.core
                pod.engine_running, pod.engine_waiting, pod.kv_usage = (
                    core.num_running,
                    core.num_waiting,
                    core.kv_usage,
                )
