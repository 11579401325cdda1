"""Route orchestration for one generation request: read and count the prompt, choose the route, run the
transfer mode's prefill leg when disaggregated, then the decode leg and its relay to the client."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

import orjson

from inferencepool.router.adaptive import AdaptiveThreshold
from inferencepool.router.calibration import Calibrator
from inferencepool.router.config import RouterConfig
from inferencepool.router.errors import UpstreamError
from inferencepool.router.http1 import Reply, Request
from inferencepool.router.legs import Legs
from inferencepool.router.metrics import RouterMetrics
from inferencepool.router.pods import Pod
from inferencepool.router.policy import Route, choose_route
from inferencepool.router.prompt import BadRequest, Endpoint, read_prompt
from inferencepool.router.relay import NothingSent, Relay, Resumable
from inferencepool.router.tokens import TokenCounter
from inferencepool.router.transfer import ClientRequest, Transfer

log = logging.getLogger("inferencepool.router")


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
        tuning = config.prefix_affinity
        self._affinity_tokens = tuning.block_tokens * tuning.blocks if tuning.enabled else None

    async def generate(self, request: Request, reply: Reply, endpoint: Endpoint) -> None:
        started = time.monotonic()
        raw = request.body
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            raise BadRequest(f"request body is not valid JSON: {error}") from error
        prompt = read_prompt(body, endpoint, self.config.served_model_name)
        tokens, affinity = self.counter.measure(prompt, self._affinity_tokens)
        self.metrics.prompt_tokens.observe(tokens)
        calibrator = self.calibrator
        if calibrator is not None and calibrator.wants_sample:
            calibrator.offer(endpoint, body, prompt)
        pods = self.legs.pods
        route = choose_route(
            self.config.policy, tokens, self.threshold.threshold, pods.has_available("prefill")
        )
        if route is Route.FALLBACK:
            self.metrics.fallbacks.labels("no_prefill_pod").inc()
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        headers = [("Content-Type", "application/json"), ("X-Request-Id", request_id)]
        authorization = request.headers.get("authorization")
        if authorization is not None:
            headers.append(("Authorization", authorization))

        decode_payload = raw
        decode_affinity = affinity
        decode_pod: Pod | None = None
        if route is Route.DISAGGREGATED:
            handoff = await self.transfer.prefill(
                ClientRequest(request.path, endpoint, raw, body, headers, affinity, prompt)
            )
            if handoff is None or handoff.payload is None:
                route = Route.FALLBACK  # counted by reason where it failed
            else:
                decode_payload = handoff.payload
                # The KV arrives from the prefill pod, so the decode pod's own prefix cache does not matter.
                decode_affinity = None
            if handoff is not None:
                decode_pod = handoff.pod
        job = _Job(request, reply, prompt.stream, headers, started, None, tokens)
        if prompt.stream and self.config.resume_streams:
            job.resumable = Resumable(endpoint, body, request.path, headers)
        if route is Route.DISAGGREGATED:
            try:
                await self._decode(job, route, decode_payload, None, decode_pod)
                return
            except NothingSent as failure:
                # Nothing reached the client (the KV source died, the transfer failed): serve it whole.
                log.warning("decode leg after a KV transfer failed, serving colocated: %s", failure)
                self.metrics.fallbacks.labels("decode_leg_failed").inc()
                route, decode_payload, decode_affinity, decode_pod = Route.FALLBACK, raw, affinity, None
        await self._decode(job, route, decode_payload, decode_affinity, decode_pod)

    def _count(self, job: _Job, route: Route) -> None:
        self.metrics.requests_by_route[route].inc()
        self.metrics.prompt_tokens_by_route[route].inc(job.tokens)

    async def _decode(
        self, job: _Job, route: Route, payload: bytes, affinity: int | None, pod: Pod | None
    ) -> None:
        """The decode leg and its relay, counted under `route`.

        On the disaggregated route a failure before anything reached the client that another try could
        mend (an error answer or event, a dropped connection, pods that answered 5xx) raises NothingSent
        uncounted, for the caller to serve the request colocated; no decode pod (503) or a hung one (504)
        would fare no better, so those are final.
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
                affinity,
                job.stream,
                self.config.timeouts.first_byte_seconds,
                pod,
            ) as leg:
                await self.relay.send(
                    job.reply, leg, route, job.stream, job.started, retriable, job.resumable
                )
        except NothingSent:
            raise
        except UpstreamError as failure:
            if retriable and failure.status == 502:
                raise NothingSent(str(failure)) from failure
            if retriable:
                self._count(job, route)
            raise
        except BaseException:
            if retriable:
                self._count(job, route)
            raise
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
