"""Route orchestration for one generation request: read and count the prompt (and hash its blocks, in the
same pass), let the scheduling core choose the pods and the route (`inferencepool.scheduling`), run the
transfer mode's prefill leg when disaggregated, then the decode leg and its relay to the client. The
orchestrator times what the scheduler learns from: idle prefill legs and KV transfers (`PrefillSpeed`)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import orjson

from inferencepool.router.adaptive import AdaptiveThreshold
from inferencepool.router.calibration import Calibrator
from inferencepool.router.config import RouterConfig
from inferencepool.router.errors import UpstreamError
from inferencepool.router.http1 import Reply, Request, UpstreamFailure
from inferencepool.router.legs import Legs
from inferencepool.router.metrics import RouterMetrics
from inferencepool.router.overload import PRIORITIES, PRIORITY_HEADER, Admission, Shed, Slot
from inferencepool.router.pods import Pod, Queued
from inferencepool.router.prompt import BadRequest, Endpoint, Prompt, read_prompt
from inferencepool.router.relay import NothingSent, Relay, Resumable
from inferencepool.router.tokens import TokenCounter
from inferencepool.router.transfer import ClientRequest, Transfer
from inferencepool.scheduling.costs import PrefillSpeed
from inferencepool.scheduling.decider import Route
from inferencepool.scheduling.endpoint import EngineRole
from inferencepool.scheduling.scheduler import Decision, Scheduler

log = logging.getLogger("inferencepool.router")

MAX_PREFIX_BLOCKS = 1024  # blocks hashed per prompt (256k tokens at 256 a block)
# A request without its own X-Request-Id gets one of 32 hex digits like a uuid4's: 16 random ones a router
# process, then a count (uuid4 itself costs a getrandom system call and an object: 7.7 us a request).
_ID_PREFIX = os.urandom(8).hex()
_ID_COUNT = itertools.count()


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNT):016x}"


def pools_of(route: Route) -> tuple[EngineRole, ...]:
    """The pools a request on `route` takes a slot of, in the order it takes them (overload.py)."""
    if route is Route.DISAGGREGATED:
        return ("decode", "prefill")
    return ("prefill",) if route is Route.LENT else ("decode",)


def priority_of(request: Request) -> int:
    """The request's X-Inferencepool-Priority (0-9, higher is shed last; 0 without the header)."""
    value = request.headers.get(PRIORITY_HEADER)
    if value is None:
        return 0
    if not value.strip().isdigit() or int(value) not in PRIORITIES:
        raise BadRequest(f"{PRIORITY_HEADER}: {value!r} is not a priority from 0 to 9", param=PRIORITY_HEADER)
    return int(value)


class Orchestrator:
    def __init__(
        self,
        config: RouterConfig,
        counter: TokenCounter,
        legs: Legs,
        transfer: Transfer,
        relay: Relay,
        metrics: RouterMetrics,
        threshold: AdaptiveThreshold,
        calibrator: Calibrator | None,
    ) -> None:
        self.config = config
        self.counter = counter
        self.legs = legs
        self.transfer = transfer
        self.relay = relay
        self.metrics = metrics
        self.threshold = threshold
        self.calibrator = calibrator
        self.scheduler = Scheduler(config.scheduling())
        self._block_tokens = self.scheduler.config.block_tokens
        self._stream_headers = config.stream_headers_seconds()
        self._releases: set[asyncio.Task[None]] = set()  # decode legs sent for clients that went away
        self.admission = (
            Admission(legs.pods, config.overload.max_queued_requests, config.overload_wait_seconds())
            if config.overload.enabled and config.engine_metrics_interval_milliseconds
            else None
        )

    async def generate(self, request: Request, reply: Reply, endpoint: Endpoint) -> None:
        started = time.monotonic()
        raw = request.body
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            raise BadRequest(f"request body is not valid JSON: {error}") from error
        prompt = read_prompt(body, endpoint, self.config.served_model_name)
        admission = self.admission
        priority = priority_of(request) if admission is not None else 0
        block_tokens = self._block_tokens
        if block_tokens:
            tokens, keys = self.counter.measure_prefix(prompt, block_tokens, MAX_PREFIX_BLOCKS)
        else:
            tokens, keys = self.counter.measure(prompt, None)[0], []
        self.metrics.prompt_tokens.observe(tokens)
        calibrator = self.calibrator
        if calibrator is not None and calibrator.wants_sample:
            calibrator.offer(endpoint, body, prompt)
        pods = self.legs.pods
        decision = self.scheduler.schedule(tokens, keys, pods, time.monotonic(), self.threshold.threshold)
        if admission is None:
            await self._route(request, reply, endpoint, started, body, prompt, tokens, decision, [])
            return
        # slots of the pools it runs on (overload.py); queued, it is scheduled again on the pods as they
        # are once it has them
        try:
            slots = await admission.admit(pools_of(decision.route), priority)
        except Shed:
            self.metrics.shed_demand(decision.route, decision.reason, tokens)
            raise
        try:
            if any(slot.waited for slot in slots):
                decision = self.scheduler.schedule(
                    tokens, keys, pods, time.monotonic(), self.threshold.threshold
                )
                slots = admission.readmit(slots, pools_of(decision.route))
            await self._route(request, reply, endpoint, started, body, prompt, tokens, decision, slots)
        finally:
            for slot in slots:
                slot.release()

    async def _route(
        self,
        request: Request,
        reply: Reply,
        endpoint: Endpoint,
        started: float,
        body: dict[str, Any],
        prompt: Prompt,
        tokens: int,
        decision: Decision[Pod],
        slots: list[Slot],
    ) -> None:
        """Serve the request on the route decided; `slots`: the pool slots it holds (overload.py), of
        which a disaggregated request gives back its prefill slot once its prefill leg is done."""
        raw = request.body
        route, reason = decision.route, decision.reason
        decode_pod, prefill_pod = decision.decode, decision.prefill
        uncached = decision.uncached_tokens
        self.metrics.decisions_by_reason[reason].inc()
        self.metrics.decision_tokens_by_reason[reason].inc(tokens)
        self.metrics.arrived(route, reason, tokens)
        if route is Route.FALLBACK:
            self.metrics.fallbacks.labels(reason.value).inc()
        request_id = request.headers.get("x-request-id") or new_request_id()
        headers = [("Content-Type", "application/json"), ("X-Request-Id", request_id)]
        authorization = request.headers.get("authorization")
        if authorization is not None:
            headers.append(("Authorization", authorization))

        if route is Route.LENT:
            # served whole on the prefill pod: no kv_transfer_params, so its engine prefills and decodes
            decode_pod, uncached = prefill_pod, decision.prefill_tokens
        decode_payload = raw
        kv_source: Pod | None = None
        speed = self.scheduler.speed
        if route is Route.DISAGGREGATED and prefill_pod is not None:
            prefill_tokens = decision.prefill_tokens
            # the prefill pool's speed, not a peer decode pod's (role lending: reason prefill_saturated)
            found_idle = prefill_pod.role == "prefill" and (
                prefill_pod.queued_tokens == 0 and prefill_pod.engine_waiting == 0
            )
            work = Queued(prefill_pod, prefill_tokens)
            leg_started = time.monotonic()
            try:
                handoff = await self.transfer.prefill(
                    ClientRequest(
                        request.path, endpoint, raw, body, headers, None, prompt, prefill_pod, decode_pod
                    )
                )
            finally:
                work.release()
                for slot in slots:  # the prefill pod is done with it: its slot is free again
                    if slot.role == "prefill":
                        slot.release()
            if handoff is None or handoff.payload is None:
                route = Route.FALLBACK  # counted by reason where it failed
            else:
                decode_payload, kv_source = handoff.payload, handoff.source
                if found_idle:
                    speed.observe_leg(time.monotonic() - leg_started, prefill_tokens)
            if handoff is not None and handoff.pod is not None:
                decode_pod = handoff.pod
        job = _Job(request, reply, prompt.stream, headers, started, None, tokens)
        if decode_pod is not None:
            if route is not Route.DISAGGREGATED:
                job.queued = Queued(decode_pod, uncached)  # released at the first token (relay.py)
            elif decode_pod.queued_tokens == 0 and decode_pod.engine_waiting == 0:
                job.transfer = TransferClock(speed, uncached)  # its first token times the KV transfer
        if prompt.stream and self.config.resume_streams:
            job.resumable = Resumable(endpoint, body, request.path, headers)
        if route is Route.DISAGGREGATED:
            try:
                await self._decode(job, route, decode_payload, decode_pod)
                return
            except asyncio.CancelledError:
                if not job.decode_open and self.config.transfer_mode == "Nixl":
                    self._release(request.path, decode_payload, headers, decode_pod)
                raise
            except NothingSent as failure:
                # Nothing reached the client (the KV source died, the transfer failed): serve it whole.
                log.warning("decode leg after a KV transfer failed, serving colocated: %s", failure)
                self.metrics.fallbacks.labels("decode_leg_failed").inc()
                self._stale_peer(kv_source, job.decode)
                route, decode_payload, decode_pod = Route.FALLBACK, raw, None
        avoid = frozenset[str]()
        for attempt in range(self.legs.max_attempts):
            try:
                await self._decode(job, route, decode_payload, decode_pod, avoid)
                return
            except NothingSent as failure:
                # Nothing reached the client (the pod hung or died before its first event): another serves it.
                if failure.pod is None or attempt + 1 == self.legs.max_attempts:
                    raise UpstreamError(str(failure), 502) from failure
                log.warning("decode leg failed before its first event, trying another pod: %s", failure)
                self.metrics.retries.labels("decode").inc()
                self._stale_peer(None, job.decode)
                avoid, decode_pod = avoid | {failure.pod}, None

    def _stale_peer(self, kv_source: Pod | None, decode: Pod | None) -> None:
        """Count a decode leg that failed before its first event against a restarted pod's engines: the
        prefill pod holding its KV (the KV load failed), else the decode pod itself."""
        pods = self.legs.pods
        if kv_source is not None and pods.restarted(kv_source):
            self.metrics.stale_peer_failures.labels("prefill").inc()
        elif decode is not None and pods.restarted(decode):
            self.metrics.stale_peer_failures.labels("decode").inc()

    def _release(self, path: str, payload: bytes, headers: list[tuple[str, str]], pod: Pod | None) -> None:
        """The client went away between the legs: the prefill pod holds the prompt's KV for a decode leg
        that no engine has accepted. vLLM frees it when a decode engine reads it or when the lease
        (kv_lease_duration) runs out; a decode engine that finishes or aborts such a request notifies the
        prefill engine (nixl/pull_scheduler.py, request_finished), but only once it got the request. So the
        decode leg goes out anyway, one token, not streamed, its answer dropped: the KV is read (or the
        prefill engine notified) now, not at the lease's end."""
        try:
            body = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        body.update(max_tokens=1, stream=False)
        for field in ("max_completion_tokens", "min_tokens", "stream_options"):
            body.pop(field, None)
        task = asyncio.create_task(self._release_leg(path, orjson.dumps(body), headers, pod))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release_leg(
        self, path: str, payload: bytes, headers: list[tuple[str, str]], pod: Pod | None
    ) -> None:
        try:
            async with self.legs.open(
                "decode", path, payload, headers, None, False, self.config.timeouts.prefill_seconds, pod
            ) as leg:
                await leg.response.body()
            self.metrics.kv_releases.labels("read").inc()
        except (UpstreamError, UpstreamFailure) as failure:
            log.warning("the KV of a request whose client went away stays until its lease ends: %s", failure)
            self.metrics.kv_releases.labels("failed").inc()

    def _count(self, job: _Job, route: Route) -> None:
        if job.counted:
            return
        job.counted = True
        self.metrics.requests_by_route[route].inc()
        self.metrics.prompt_tokens_by_route[route].inc(job.tokens)

    async def _decode(
        self, job: _Job, route: Route, payload: bytes, pod: Pod | None, avoid: frozenset[str] = frozenset()
    ) -> None:
        """The decode leg and its relay, counted under `route`.

        On the disaggregated route a failure before anything reached the client that another try could
        mend (an error answer or event, a dropped connection, pods that answered 5xx, no decode pod of the
        KV's revision left: a rollout retired the last one during the prefill leg) raises NothingSent
        uncounted, for the caller to serve the request colocated on any decode pod; a hung pod (504) would
        fare no better, so that is final.
        """
        retriable = route is Route.DISAGGREGATED
        if not retriable:
            self._count(job, route)
        try:
            async with self.legs.open(
                "decode",
                job.request.path,
                payload,
                job.headers,
                None,
                job.stream,
                self._stream_headers if job.stream else self.config.timeouts.first_byte_seconds,
                pod,
                exclude=avoid,
            ) as leg:
                job.decode_open, job.decode = True, leg.pod
                if job.queued is not None:
                    leg.first_token = job.queued.release
                elif job.transfer is not None:
                    leg.first_token = job.transfer.first_token
                await self.relay.send(
                    job.reply, leg, route, job.stream, job.started, retriable, job.resumable
                )
        except NothingSent:
            raise
        except UpstreamError as failure:
            if retriable and failure.status in (502, 503):
                raise NothingSent(str(failure)) from failure
            if retriable:
                self._count(job, route)
            raise
        except BaseException:
            if retriable:
                self._count(job, route)
            raise
        finally:
            if job.queued is not None:
                job.queued.release()
        if retriable:
            self._count(job, route)


@dataclass(slots=True)
class _Job:
    """What every decode attempt of one request shares."""

    request: Request
    reply: Reply
    stream: bool
    headers: list[tuple[str, str]]
    started: float
    resumable: Resumable | None
    tokens: int = 0  # prompt tokens as counted, for the per-route token counter the autoscaler reads
    queued: Queued | None = None  # a direct prompt's prefill work on its decode pod, until its first token
    transfer: TransferClock | None = None  # a disaggregated one's decode leg, on a pod that had no queue
    counted: bool = False  # in the per-route counters (once, however many decode legs it took)
    decode_open: bool = False  # a decode engine accepted the decode leg (it frees the KV if it is aborted)
    decode: Pod | None = None  # the pod of the latest decode leg


class TransferClock:
    """Times one disaggregated request's decode leg to its first token (`first_token`, called by the
    relay)."""

    __slots__ = ("speed", "started", "tokens")

    def __init__(self, speed: PrefillSpeed, tokens: int) -> None:
        self.speed = speed
        self.tokens = tokens
        self.started = time.monotonic()

    def first_token(self) -> None:
        self.speed.observe_transfer(time.monotonic() - self.started, self.tokens)
