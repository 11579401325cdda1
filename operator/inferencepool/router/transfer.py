"""The two KV transfer modes: how a prefill pod computes a prompt's KV and how the decode leg gets it.

Each mode's `prefill` runs the prefill leg and returns the Handoff for the decode leg, or None when the
request must be served colocated (the reason is counted where it failed). NIXL: the decode engine pulls the
blocks the prefill engine holds for it (kv_transfer_params round trip). LMCache PD: the router picks the
decode pod first, the prefill engine pushes the KV to it, and the router waits for every TP rank's
ProxyNotif before it opens the decode leg.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from inferencepool.router import handshake
from inferencepool.router.config import RouterConfig
from inferencepool.router.errors import UpstreamError
from inferencepool.router.http1 import UpstreamFailure
from inferencepool.router.legs import Legs
from inferencepool.router.lmcache_pd import PDNotifications
from inferencepool.router.metrics import RouterMetrics
from inferencepool.router.pods import Pod
from inferencepool.router.prompt import Endpoint, Prompt
from inferencepool.router.threshold import SampleWindow

log = logging.getLogger("inferencepool.router")


@dataclass(slots=True)  # not frozen: built for every disaggregated request, and frozen init is slower
class ClientRequest:
    """What the transfer modes need from a client's generation request."""

    path: str
    endpoint: Endpoint
    raw: bytes  # the client's body as it sent it
    body: dict[str, Any]
    headers: list[tuple[str, str]]
    affinity: int | None
    prompt: Prompt
    prefill_pod: Pod | None = None  # chosen by prefix and load (pods.choose); others only on retries
    decode_pod: Pod | None = None  # chosen before the route (LMCache PD pushes the KV there)


@dataclass(slots=True)
class Handoff:
    """The decode leg of a disaggregated request: its body, and the decode pod it must go to (or None).

    `payload` None: the transfer failed after a decode pod was committed to, which then serves the request
    colocated (the client's own body)."""

    payload: bytes | None
    pod: Pod | None = None
    source: Pod | None = None  # NIXL: the prefill pod holding the KV the decode engine reads


class Transfer(Protocol):
    async def prefill(self, request: ClientRequest) -> Handoff | None: ...


class _PrefillLegs:
    """The prefill leg both modes share: send it, read its JSON answer, count a failure as a fallback."""

    def __init__(
        self, legs: Legs, config: RouterConfig, metrics: RouterMetrics, samples: SampleWindow
    ) -> None:
        self.legs = legs
        self.config = config
        self.metrics = metrics
        self.samples = samples

    async def _prefill_leg(
        self, request: ClientRequest, payload: bytes, path: str | None = None
    ) -> tuple[Pod, Any] | None:
        """Send a prefill leg and read its JSON answer: (pod, answer), or None when it failed (counted)."""
        try:
            async with self.legs.open(
                "prefill",
                path or request.path,
                payload,
                request.headers,
                request.affinity,
                False,
                self.config.timeouts.prefill_seconds,
                request.prefill_pod,
            ) as leg:
                pod = leg.pod
                try:
                    if leg.response.status != 200:
                        self.metrics.upstream_errors.labels(pod.name, pod.role, "status").inc()
                        self.metrics.fallbacks.labels("prefill_failed").inc()
                        return None
                    return pod, orjson.loads(await leg.response.body())
                except (UpstreamFailure, ValueError) as error:
                    self._failed(pod, "protocol", error)
                    return None
        except UpstreamError as error:
            log.warning("prefill leg failed, serving colocated: %s", error)
            self.metrics.fallbacks.labels("prefill_failed").inc()
            return None

    def _failed(self, pod: Pod, kind: str, error: Exception) -> None:
        log.warning("prefill leg on %s failed, serving colocated: %s", pod.name, error)
        self.metrics.upstream_errors.labels(pod.name, pod.role, kind).inc()
        self.metrics.fallbacks.labels("prefill_failed").inc()

    def _done(self, started: float) -> None:
        elapsed = time.monotonic() - started
        self.samples.add(elapsed)
        self.metrics.prefill_leg.observe(elapsed)


class NixlTransfer(_PrefillLegs):
    """vLLM's NixlConnector: the prefill engine holds the blocks, the decode engine reads them."""

    async def prefill(self, request: ClientRequest) -> Handoff | None:
        started = time.monotonic()
        payload = orjson.dumps(handshake.nixl_prefill_body(request.body))
        answered = await self._prefill_leg(request, payload)
        if answered is None:
            return None
        pod, answer = answered
        try:
            decode_body = handshake.nixl_decode_body(request.body, answer)
        except ValueError as error:
            self._failed(pod, "protocol", error)
            return None
        self._done(started)
        return Handoff(orjson.dumps(decode_body), source=pod)


class LMCachePDTransfer(_PrefillLegs):
    """LMCache PD: the prefill engine pushes the KV to a decode pod the router chose beforehand."""

    def __init__(
        self,
        legs: Legs,
        config: RouterConfig,
        metrics: RouterMetrics,
        samples: SampleWindow,
        notifications: PDNotifications,
    ) -> None:
        super().__init__(legs, config, metrics, samples)
        self.notifications = notifications

    async def prefill(self, request: ClientRequest) -> Handoff | None:
        """Returns the decode leg's Handoff (the client's body, to the pod the KV was pushed to), or None
        when the request should be served colocated (counted here; after a missing push it is still pinned
        to the decode pod chosen). See handshake.py for why the prefill leg is the prompt's ids less the
        last one."""
        settings = self.config.lmcache_pd
        decode_pod = request.decode_pod
        if decode_pod is None or not decode_pod.accepts_new:
            decode_pod = self.legs.pods.pick("decode", time.monotonic())
        if decode_pod is None:
            return None  # the decode leg will say no decode pod is ready
        unsupported = _unsplittable(request)
        if unsupported is not None:
            log.debug("LMCache PD cannot split this request (%s): serving it colocated", unsupported)
            self.metrics.fallbacks.labels("lmcache_pd_unsupported").inc()
            return Handoff(None, decode_pod)
        token_ids = await self._prompt_ids(request, decode_pod)
        if token_ids is None:
            self.metrics.fallbacks.labels("tokenize_failed").inc()
            return Handoff(None, decode_pod)
        if len(token_ids) < 2:  # nothing to push: the decode pod computes the one token itself
            self.metrics.fallbacks.labels("lmcache_pd_unsupported").inc()
            return Handoff(None, decode_pod)
        # The router's own id: a client's X-Request-Id may repeat, a transfer id must not.
        transfer_id = uuid.uuid4().hex
        pushed = self.notifications.expect(transfer_id, len(settings.receiver_init_ports))
        started = time.monotonic()
        payload = orjson.dumps(
            handshake.lmcache_prefill_ids_body(
                request.body, token_ids, transfer_id, decode_pod.host, settings
            )
        )
        try:
            answered = await self._prefill_leg(request, payload, "/v1/completions")
            if answered is None:
                return None
            try:
                # The engine answers once prefill is done; its push to the decode pod may still be in flight.
                async with asyncio.timeout(self.config.timeouts.kv_push_seconds):  # not wait_for (3.11)
                    await pushed
            except TimeoutError:
                log.warning(
                    "no KV push notification from %s within %d s: %s prefills by itself",
                    answered[0].name,
                    self.config.timeouts.kv_push_seconds,
                    decode_pod.name,
                )
                self.metrics.fallbacks.labels("kv_push_timeout").inc()
                return Handoff(None, decode_pod)
        finally:
            self.notifications.discard(transfer_id)
        self._done(started)
        return Handoff(request.raw, decode_pod)

    async def _prompt_ids(self, request: ClientRequest, pod: Pod) -> list[int] | None:
        """The prompt's token ids as the decode engine computes them: the client's own, or its /tokenize."""
        if request.prompt.token_ids:
            return list(request.prompt.token_ids[0])
        query = handshake.tokenize_body(request.body, request.endpoint == "chat")
        try:
            answer = await self.legs.upstream.post(
                pod.url + "/tokenize",
                orjson.dumps(query),
                (("Content-Type", "application/json"),),
                stream=False,
                timeout_seconds=self.config.timeouts.prefill_seconds,
            )
            try:
                if answer.status != 200:
                    detail = (await answer.body())[:300].decode(errors="replace")
                    log.warning("/tokenize on %s answered %d: %s", pod.name, answer.status, detail)
                    return None
                tokens = orjson.loads(await answer.body()).get("tokens")
            finally:
                answer.close()
        except (UpstreamFailure, ValueError, AttributeError) as error:
            self.metrics.upstream_errors.labels(pod.name, pod.role, "tokenize").inc()
            log.warning("/tokenize on %s failed: %s", pod.name, error)
            return None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return None
        return tokens


def _unsplittable(request: ClientRequest) -> str | None:
    """Why the prefill leg could not push exactly the chunks the decode leg will look up, or None.

    Batched prompts (one /tokenize each, and the decode leg a batch), prompts the engine rewrites
    (truncate_prompt_tokens) and multimodal chat content (LMCache folds the media hashes into its chunk keys,
    which token ids alone cannot reproduce).
    """
    prompt, body = request.prompt, request.body
    if len(prompt.texts) + len(prompt.token_ids) > 1:
        return "a batch of prompts"
    if body.get("truncate_prompt_tokens") is not None:
        return "truncate_prompt_tokens"
    if request.endpoint == "chat":
        for message in body["messages"]:
            content = message.get("content")
            if isinstance(content, list) and any(
                not isinstance(part, dict) or part.get("type", "text") != "text" for part in content
            ):
                return "multimodal content"
    return None
