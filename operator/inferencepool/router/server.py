"""The router's HTTP shell: glue between clients, the pure policy and engine pods.

Hot-path choices, measured with `inferencepool bench router`: one event loop (uvloop) serves clients and
calls engines through the lean HTTP/1.1 layer in http1.py, with pooled keep-alive connections; a streamed
answer is relayed from the engine's connection straight into the client's; the client's body is forwarded
byte for byte when the route is direct (no re-encoding); metric children are bound once, live gauges computed
at scrape time; no per-request logging.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inferencepool.router import handshake
from inferencepool.router.config import RouterConfig
from inferencepool.router.http1 import (
    Reply,
    Request,
    Server,
    Upstream,
    UpstreamFailure,
    UpstreamResponse,
)
from inferencepool.router.lmcache_pd import PDNotifications
from inferencepool.router.metrics import LiveState, RouterMetrics
from inferencepool.router.pods import EngineRole, Pod, PodSet
from inferencepool.router.policy import Route, choose_route
from inferencepool.router.prompt import BadRequest, Endpoint, Prompt, read_prompt
from inferencepool.router.threshold import SampleWindow, adapt
from inferencepool.router.tokens import EstimateCounter, HFTokenCounter, TokenCounter

log = logging.getLogger("inferencepool.router")

ROUTE_HEADER = "X-Inferencepool-Route"
_CALIBRATION_FAST_SAMPLES = 50
_SMALL_CALL_SECONDS = 10


def error_body(message: str, error_type: str, status: int, param: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": status}}
    ).encode()


_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
}


def transport_error(status: int, message: str) -> bytes:
    """The body of an error the HTTP layer answers itself (unreadable or too large requests)."""
    return error_body(message, _ERROR_TYPES.get(status, "InternalServerError"), status)


def send_json(reply: Reply, document: object, status: int = 200) -> None:
    reply.send(status, orjson.dumps(document))


def send_error(reply: Reply, message: str, error_type: str, status: int, param: str | None = None) -> None:
    reply.send(status, error_body(message, error_type, status, param))


class UpstreamError(Exception):
    """No pod could serve a leg; `status` is what the client gets (502 failed, 503 nothing available)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class _Leg:
    pod: Pod
    response: UpstreamResponse


class Router:
    def __init__(self, config: RouterConfig, counter: TokenCounter, pods: PodSet | None = None) -> None:
        self.config = config
        self.counter = counter
        self.pods = pods or PodSet(
            load_factor=config.prefix_affinity.load_factor_percent / 100,
            virtual_nodes=config.prefix_affinity.virtual_nodes,
            min_load_bound=config.prefix_affinity.min_load_bound,
        )
        self.threshold = config.prefill_threshold_tokens
        self.threshold_reason = "configured"
        self.metrics = RouterMetrics(
            LiveState(
                pods=self.pods,
                threshold=lambda: self.threshold,
                counter_kind=lambda: self.counter.kind,
                counter_source=lambda: self.counter.source,
                chars_per_token=lambda: (
                    self.counter.chars_per_token if isinstance(self.counter, EstimateCounter) else 0.0
                ),
                kv_push_notifications=self._notification_counts,
            )
        )
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._upstream: Upstream | None = None
        self._routes: dict[tuple[str, str], Callable[[Request, Reply], Awaitable[None]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._prefill_samples = SampleWindow()
        self._itl_samples = SampleWindow()
        self._adaptive = config.adaptive_threshold.enabled and config.policy == "LengthAware"
        self._notifications: PDNotifications | None = None  # LMCache PD mode only
        self._calibrating = isinstance(counter, EstimateCounter)
        self._calibration_candidate: tuple[Endpoint, dict[str, Any], Prompt] | None = None
        tuning = config.prefix_affinity
        self._affinity_tokens = tuning.block_tokens * tuning.blocks

    # ---- lifecycle ---------------------------------------------------------------------------------------

    async def start(self, host: str) -> None:
        """Open what the router needs before it takes requests (on `host`: LMCache PD's notification
        socket)."""
        if self.config.transfer_mode == "LMCachePD":
            self._notifications = PDNotifications()
            await self._notifications.start(host, self.config.lmcache_pd.proxy_port)
        timeouts = self.config.timeouts
        self._upstream = Upstream(timeouts.connect_milliseconds / 1000, timeouts.idle_stream_seconds)
        self._routes = {
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/chat/completions"): self._chat,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/ready"): self._ready,
            ("GET", "/metrics"): self._metrics,
        }
        if self._adaptive:
            self._tasks.append(asyncio.create_task(self._adapt_threshold()))
        if self._calibrating:
            self._tasks.append(asyncio.create_task(self._calibrate()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._upstream is not None:
            self._upstream.close()
        if self._notifications is not None:
            await self._notifications.close()

    @property
    def kv_push_port(self) -> int | None:
        """The bound port of LMCache PD's notification socket (None in NIXL mode)."""
        return self._notifications.port if self._notifications is not None else None

    def _notification_counts(self) -> dict[str, int]:
        if self._notifications is None:
            return {}
        stats = self._notifications.stats
        return {"received": stats.received, "malformed": stats.malformed, "unclaimed": stats.unclaimed}

    def begin_drain(self) -> None:
        """Stop being ready; requests already accepted (and ones still arriving) are served."""
        self.draining = True

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def handle(self, request: Request, reply: Reply) -> None:
        handler = self._routes.get((request.method, request.path))
        if handler is not None:
            await handler(request, reply)
        elif any(path == request.path for _, path in self._routes):
            send_error(
                reply,
                f"method {request.method} is not allowed on {request.path}",
                "MethodNotAllowedError",
                405,
            )
        else:
            send_error(reply, f"no such endpoint: {request.path}", "NotFoundError", 404)

    # ---- small endpoints ---------------------------------------------------------------------------------

    async def _health(self, _request: Request, reply: Reply) -> None:
        send_json(reply, {"status": "ok"})

    async def _ready(self, _request: Request, reply: Reply) -> None:
        if self.draining:
            send_json(reply, {"ready": False, "reason": "draining"}, 503)
        elif not self.pods.has_available("decode"):
            send_json(reply, {"ready": False, "reason": "no decode pod is ready"}, 503)
        else:
            send_json(
                reply, {"ready": True, "threshold": self.threshold, "thresholdReason": self.threshold_reason}
            )

    async def _metrics(self, _request: Request, reply: Reply) -> None:
        reply.send(200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST)

    async def _models(self, _request: Request, reply: Reply) -> None:
        assert self._upstream is not None
        pod = self.pods.pick("decode", time.monotonic())
        if pod is not None:
            try:
                upstream = await self._upstream.get(pod.url + "/v1/models", _SMALL_CALL_SECONDS)
                try:
                    if upstream.status == 200:
                        reply.send(200, await upstream.body())
                        return
                finally:
                    upstream.close()
            except UpstreamFailure as failure:
                self.metrics.upstream_errors.labels(pod.name, pod.role, failure.kind).inc()
        if self.config.served_model_name is None:
            send_error(reply, "no engine pod answered /v1/models", "ServiceUnavailableError", 503)
            return
        model = {"id": self.config.served_model_name, "object": "model", "owned_by": "inferencepool"}
        send_json(reply, {"object": "list", "data": [model]})

    # ---- generation --------------------------------------------------------------------------------------

    async def _completions(self, request: Request, reply: Reply) -> None:
        await self._tracked(request, reply, "completions")

    async def _chat(self, request: Request, reply: Reply) -> None:
        await self._tracked(request, reply, "chat")

    async def _tracked(self, request: Request, reply: Reply, endpoint: Endpoint) -> None:
        self.in_flight += 1
        self._idle.clear()
        try:
            await self._generate(request, reply, endpoint)
        except BadRequest as error:
            self.metrics.rejected.labels(str(error.status)).inc()
            send_error(reply, str(error), error.error_type, error.status, error.param)
        except UpstreamError as error:
            self.metrics.rejected.labels(str(error.status)).inc()
            kind = "ServiceUnavailableError" if error.status == 503 else "BadGatewayError"
            send_error(reply, str(error), kind, error.status)
        except asyncio.CancelledError:
            self.metrics.client_disconnects.inc()
            raise
        except Exception:  # the router never dies of one request; the client learns something went wrong
            log.exception("request failed inside the router")
            self.metrics.rejected.labels("500").inc()
            if not reply.started:
                send_error(reply, "internal router error", "InternalServerError", 500)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def _generate(self, request: Request, reply: Reply, endpoint: Endpoint) -> None:
        started = time.monotonic()
        raw = request.body
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            raise BadRequest(f"request body is not valid JSON: {error}") from error
        prompt = read_prompt(body, endpoint, self.config.served_model_name)
        tokens = self.counter.count(prompt)
        self.metrics.prompt_tokens.observe(tokens)
        if self._calibrating and self._calibration_candidate is None and prompt.texts:
            self._calibration_candidate = (endpoint, body, prompt)
        route = choose_route(self.config.policy, tokens, self.threshold, self.pods.has_available("prefill"))
        if route is Route.FALLBACK:
            self.metrics.fallbacks.labels("no_prefill_pod").inc()
        affinity = (
            self.counter.affinity_key(prompt, self._affinity_tokens)
            if self.config.prefix_affinity.enabled
            else None
        )
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        headers = [("Content-Type", "application/json"), ("X-Request-Id", request_id)]
        authorization = request.headers.get("authorization")
        if authorization is not None:
            headers.append(("Authorization", authorization))

        path = request.path
        decode_payload: bytes = raw
        decode_affinity = affinity
        decode_pod: Pod | None = None
        if route is Route.DISAGGREGATED:
            if self._notifications is None:
                transferred = await self._prefill(path, body, headers, affinity)
            else:
                transferred, decode_pod = await self._push_prefill(path, body, headers, affinity)
            if transferred is None:
                route = Route.FALLBACK  # counted by reason where it failed
            else:
                decode_payload = transferred
                # The KV arrives from the prefill pod, so the decode pod's own prefix cache does not matter.
                decode_affinity = None
        self.metrics.requests_by_route[route].inc()
        timeout = self.config.timeouts.first_byte_seconds
        leg = await self._open(
            "decode", path, decode_payload, headers, decode_affinity, prompt.stream, timeout, decode_pod
        )
        try:
            await self._relay(reply, leg, route, prompt.stream, started)
        finally:
            leg.pod.outstanding -= 1
            # Back to the pool when the body was read to its end, else closed (so the engine aborts).
            leg.response.close()

    async def _prefill(
        self, path: str, body: dict[str, Any], headers: list[tuple[str, str]], affinity: int | None
    ) -> bytes | None:
        """Run the prefill leg; the decode leg's body on success, None when it failed (the caller falls
        back)."""
        started = time.monotonic()
        payload = orjson.dumps(handshake.nixl_prefill_body(body))
        answered = await self._prefill_leg(path, payload, headers, affinity)
        if answered is None:
            return None
        pod, answer = answered
        try:
            decode_body = handshake.nixl_decode_body(body, answer)
        except ValueError as error:
            self._prefill_failed(pod, "protocol", error)
            return None
        self._prefill_done(started)
        return orjson.dumps(decode_body)

    async def _push_prefill(
        self, path: str, body: dict[str, Any], headers: list[tuple[str, str]], affinity: int | None
    ) -> tuple[bytes | None, Pod | None]:
        """LMCache PD mode: choose the decode pod first, have the prefill pod push the KV to it, and wait
        for every TP rank's notification. Returns the decode leg's body and its pod, or (None, None) when
        the request should be served colocated (counted here)."""
        assert self._notifications is not None
        settings = self.config.lmcache_pd
        decode_pod = self.pods.pick("decode", time.monotonic())
        if decode_pod is None:
            return None, None  # the decode leg will say no decode pod is ready
        # The router's own id: a client's X-Request-Id may repeat, a transfer id must not.
        transfer_id = uuid.uuid4().hex
        pushed = self._notifications.expect(transfer_id, len(settings.receiver_init_ports))
        started = time.monotonic()
        payload = orjson.dumps(handshake.lmcache_prefill_body(body, transfer_id, decode_pod.host, settings))
        try:
            answered = await self._prefill_leg(path, payload, headers, affinity)
            if answered is None:
                return None, None
            try:
                # The engine answers once prefill is done; its push to the decode pod may still be in flight.
                await asyncio.wait_for(pushed, self.config.timeouts.kv_push_seconds)
            except TimeoutError:
                log.warning(
                    "no KV push notification from %s within %d s: %s prefills by itself",
                    answered[0].name,
                    self.config.timeouts.kv_push_seconds,
                    decode_pod.name,
                )
                self.metrics.fallbacks.labels("kv_push_timeout").inc()
                return None, decode_pod
        finally:
            self._notifications.discard(transfer_id)
        self._prefill_done(started)
        return orjson.dumps(handshake.lmcache_decode_body(body)), decode_pod

    async def _prefill_leg(
        self, path: str, payload: bytes, headers: list[tuple[str, str]], affinity: int | None
    ) -> tuple[Pod, Any] | None:
        """Send a prefill leg and read its JSON answer: (pod, answer), or None when it failed (counted)."""
        try:
            leg = await self._open(
                "prefill", path, payload, headers, affinity, False, self.config.timeouts.prefill_seconds
            )
        except UpstreamError as error:
            log.warning("prefill leg failed, serving colocated: %s", error)
            self.metrics.fallbacks.labels("prefill_failed").inc()
            return None
        pod = leg.pod
        try:
            if leg.response.status != 200:
                self.metrics.upstream_errors.labels(pod.name, pod.role, "status").inc()
                self.metrics.fallbacks.labels("prefill_failed").inc()
                return None
            return pod, orjson.loads(await leg.response.body())
        except (UpstreamFailure, ValueError) as error:
            self._prefill_failed(pod, "protocol", error)
            return None
        finally:
            pod.outstanding -= 1
            leg.response.close()

    def _prefill_failed(self, pod: Pod, kind: str, error: Exception) -> None:
        log.warning("prefill leg on %s failed, serving colocated: %s", pod.name, error)
        self.metrics.upstream_errors.labels(pod.name, pod.role, kind).inc()
        self.metrics.fallbacks.labels("prefill_failed").inc()

    def _prefill_done(self, started: float) -> None:
        elapsed = time.monotonic() - started
        self._prefill_samples.add(elapsed)
        self.metrics.prefill_leg.observe(elapsed)

    async def _open(
        self,
        role: EngineRole,
        path: str,
        payload: bytes,
        headers: list[tuple[str, str]],
        affinity: int | None,
        stream: bool,
        timeout_seconds: int,
        pinned: Pod | None = None,
    ) -> _Leg:
        """Send a leg to a pod of `role` (`pinned` first when given), trying others while connections fail
        before any response byte.

        On success the pod's outstanding count stays raised; the caller lowers it when the response is done.
        """
        assert self._upstream is not None
        tried: set[str] = set()
        last_problem = f"no {role} pod is ready"
        for attempt in range(self.config.max_attempts):
            if attempt == 0 and pinned is not None and pinned.accepts_new:
                pod: Pod | None = pinned
            else:
                pod = self.pods.pick(role, time.monotonic(), affinity, frozenset(tried))
            if pod is None:
                break
            if attempt:
                self.metrics.retries.labels(role).inc()
            pod.outstanding += 1
            try:
                response = await self._upstream.post(
                    pod.url + path, payload, headers, stream=stream, timeout_seconds=timeout_seconds
                )
            except UpstreamFailure as failure:
                pod.outstanding -= 1
                self.metrics.upstream_errors.labels(pod.name, role, failure.kind).inc()
                if failure.kind == "timeout":
                    raise UpstreamError(f"{role} pod {pod.name} did not answer in time", 504) from failure
                if failure.kind == "connect":
                    pod.record_failure(time.monotonic())
                # Nothing came back (refused, or the pod dropped the connection): nothing reached the client
                # either, so another pod may serve it.
                what = "refused the connection" if failure.kind == "connect" else "failed before answering"
                last_problem = f"{role} pod {pod.name} {what} ({failure})"
                tried.add(pod.name)
                continue
            except BaseException:
                pod.outstanding -= 1
                raise
            if response.status >= 500:
                try:
                    detail = (await response.body())[:300].decode(errors="replace")
                except UpstreamFailure as failure:
                    detail = str(failure)
                response.close()
                pod.outstanding -= 1
                self.metrics.upstream_errors.labels(pod.name, role, "status").inc()
                last_problem = f"{role} pod {pod.name} answered {response.status}: {detail}"
                tried.add(pod.name)
                continue
            pod.record_success()
            return _Leg(pod, response)
        status = 503 if not tried else 502
        raise UpstreamError(last_problem, status)

    async def _relay(self, reply: Reply, leg: _Leg, route: Route, stream: bool, started: float) -> None:
        upstream = leg.response
        if not stream or upstream.status != 200:
            try:
                payload = await upstream.body()
            except UpstreamFailure as failure:
                self.metrics.upstream_errors.labels(leg.pod.name, leg.pod.role, failure.kind).inc()
                status = 504 if failure.kind == "timeout" else 502
                raise UpstreamError(f"decode pod {leg.pod.name} failed: {failure}", status) from failure
            reply.send(
                upstream.status,
                payload,
                upstream.content_type or "application/json",
                ((ROUTE_HEADER, route),),
            )
            return
        reply.start(
            200,
            upstream.content_type or "text/event-stream",
            (("Cache-Control", "no-cache"), (ROUTE_HEADER, route)),
        )
        reply.on_backpressure(upstream.pause, upstream.resume)
        itl_metric = self.metrics.itl_by_route[route]
        ttft_metric = self.metrics.ttft_by_route[route]
        sample = self._itl_samples.add if self._adaptive else None
        pending: list[bytes] = []
        previous = 0.0

        def on_data(data: bytes) -> None:
            nonlocal previous
            now = time.monotonic()
            if previous:
                gap = (now - previous) / (data.count(b"data:") or 1)
                itl_metric.observe(gap)
                if sample is not None:
                    sample(gap)
            else:
                ttft_metric.observe(now - started)
            previous = now
            pending.append(data)

        def on_flush() -> None:
            # Everything one read brought goes out in one write; the last one carries the end of the body.
            data = b"".join(pending) if len(pending) != 1 else pending[0]
            pending.clear()
            if upstream.complete:
                reply.end(data)
            else:
                reply.write(data)

        try:
            await upstream.relay(on_data, on_flush)
        except UpstreamFailure as failure:
            # Headers are out, so the status cannot change: end the stream with an SSE error event instead.
            self.metrics.upstream_errors.labels(leg.pod.name, leg.pod.role, "stream").inc()
            message = f"decode pod {leg.pod.name} failed mid-stream: {failure}"
            reply.end(b"data: " + error_body(message, "BadGatewayError", 502) + b"\n\n")
            return
        if reply.closed:
            self.metrics.client_disconnects.inc()
        reply.end()

    # ---- background: adaptive threshold and tokenizer calibration ----------------------------------------

    async def _adapt_threshold(self) -> None:
        settings = self.config.adaptive_threshold
        while True:
            await asyncio.sleep(settings.interval_seconds)
            decision = adapt(
                self.threshold,
                self.config.prefill_threshold_tokens,
                settings,
                self._prefill_samples,
                self._itl_samples,
            )
            if decision.threshold != self.threshold:
                direction = "up" if decision.threshold > self.threshold else "down"
                self.metrics.threshold_changes.labels(direction).inc()
                log.info(
                    "prefill threshold %d -> %d (%s)", self.threshold, decision.threshold, decision.reason
                )
            self.threshold, self.threshold_reason = decision.threshold, decision.reason

    async def _calibrate(self) -> None:
        """Ask a decode pod's /tokenize for the true count of a recent prompt, to calibrate the estimate."""
        assert isinstance(self.counter, EstimateCounter)
        counter = self.counter
        while True:
            await asyncio.sleep(1.0 if counter.samples < _CALIBRATION_FAST_SAMPLES else 30.0)
            candidate, self._calibration_candidate = self._calibration_candidate, None
            if candidate is None:
                continue
            await self._calibrate_once(counter, *candidate)

    async def _calibrate_once(
        self, counter: EstimateCounter, endpoint: Endpoint, body: dict[str, Any], prompt: Prompt
    ) -> None:
        assert self._upstream is not None
        pod = self.pods.pick("decode", time.monotonic())
        if pod is None:
            return
        if endpoint == "chat":
            query: dict[str, Any] = {
                "model": body["model"],
                "messages": body["messages"],
                "add_generation_prompt": True,
            }
            allowance = counter.count(prompt) - round(len(prompt.texts[0]) / counter.chars_per_token)
        else:
            query = {"model": body["model"], "prompt": prompt.texts[0]}
            allowance = 0
        try:
            answer = await self._upstream.post(
                pod.url + "/tokenize",
                json.dumps(query).encode(),
                (("Content-Type", "application/json"),),
                stream=False,
                timeout_seconds=_SMALL_CALL_SECONDS,
            )
            try:
                if answer.status != 200:
                    return
                count = json.loads(await answer.body()).get("count")
            finally:
                answer.close()
        except (UpstreamFailure, ValueError, AttributeError):
            return
        if isinstance(count, int):
            counter.observe(len(prompt.texts[0]), count - allowance)


async def serve(
    router: Router,
    host: str,
    port: int,
    on_listening: Callable[[int], Awaitable[None] | None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until `stop` is set (SIGTERM in the CLI), then drain: not ready, stop accepting, finish
    streams."""
    stop = stop or asyncio.Event()
    await router.start(host)
    server = Server(router.handle, router.config.max_request_bytes, transport_error)
    try:
        bound = await server.listen(host, port)
        if on_listening is not None:
            result = on_listening(bound)
            if result is not None:
                await result
        await stop.wait()
        timeouts = router.config.timeouts
        router.begin_drain()
        log.info("draining: /ready is 503; %d requests in flight", router.in_flight)
        if timeouts.drain_grace_seconds:
            await asyncio.sleep(timeouts.drain_grace_seconds)
        server.stop_accepting()
        finished = await router.wait_idle(timeouts.drain_seconds)
        if not finished:
            log.warning("drain timeout: %d requests still in flight are cut", router.in_flight)
    finally:
        server.close()
        await router.stop()


def counter_for(config: RouterConfig) -> HFTokenCounter | EstimateCounter:
    from inferencepool.router.tokens import load_counter

    return load_counter(config.tokenizer)
