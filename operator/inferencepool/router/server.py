"""The router's HTTP shell: glue between clients, the pure policy and engine pods.

Hot-path choices, measured with `inferencepool bench router`: aiohttp serves clients (on uvloop) and calls
engines on the same loop (upstream.py) with pooled keep-alive connections; the client's body is forwarded
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

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inferencepool.router import handshake
from inferencepool.router.config import RouterConfig
from inferencepool.router.metrics import LiveState, RouterMetrics
from inferencepool.router.pods import EngineRole, Pod, PodSet
from inferencepool.router.policy import Route, choose_route
from inferencepool.router.prompt import BadRequest, Endpoint, Prompt, read_prompt
from inferencepool.router.threshold import SampleWindow, next_threshold
from inferencepool.router.tokens import EstimateCounter, HFTokenCounter, TokenCounter
from inferencepool.router.upstream import Upstream, UpstreamFailure, UpstreamResponse

log = logging.getLogger("inferencepool.router")

ROUTE_HEADER = "X-Inferencepool-Route"
SSE_DONE = b"data: [DONE]\n\n"
# A client that went away while the router wrote to it (aiohttp raises one or the other).
_CLIENT_GONE = (ConnectionResetError, aiohttp.ClientConnectionResetError)
_CALIBRATION_FAST_SAMPLES = 50
_SMALL_CALL_SECONDS = 10


def error_body(message: str, error_type: str, status: int, param: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": status}}
    ).encode()


def error_response(message: str, error_type: str, status: int, param: str | None = None) -> web.Response:
    return web.Response(
        body=error_body(message, error_type, status, param), status=status, content_type="application/json"
    )


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
            )
        )
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._upstream: Upstream | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._prefill_samples = SampleWindow()
        self._itl_samples = SampleWindow()
        self._adaptive = config.adaptive_threshold.enabled and config.policy == "LengthAware"
        # LMCache PD mode (disagg_spec + ZMQ notifications) is not implemented yet: such pools are served
        # colocated, every request counted as a fallback, rather than not served at all.
        self._can_transfer = config.transfer_mode == "Nixl"
        self._calibrating = isinstance(counter, EstimateCounter)
        self._calibration_candidate: tuple[Endpoint, dict[str, Any], Prompt] | None = None
        tuning = config.prefix_affinity
        self._affinity_tokens = tuning.block_tokens * tuning.blocks

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_request_bytes)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        timeouts = self.config.timeouts
        self._upstream = Upstream(timeouts.connect_milliseconds / 1000, timeouts.idle_stream_seconds)
        if self._adaptive:
            self._tasks.append(asyncio.create_task(self._adapt_threshold()))
        if self._calibrating:
            self._tasks.append(asyncio.create_task(self._calibrate()))

    async def _stop(self, _app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._upstream is not None:
            await self._upstream.close()

    def begin_drain(self) -> None:
        """Stop being ready; requests already accepted (and ones still arriving) are served."""
        self.draining = True

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # ---- small endpoints ---------------------------------------------------------------------------------

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _ready(self, _request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"ready": False, "reason": "draining"}, status=503)
        if not self.pods.has_available("decode"):
            return web.json_response({"ready": False, "reason": "no decode pod is ready"}, status=503)
        return web.json_response(
            {"ready": True, "threshold": self.threshold, "thresholdReason": self.threshold_reason}
        )

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _models(self, request: web.Request) -> web.Response:
        assert self._upstream is not None
        pod = self.pods.pick("decode", time.monotonic())
        if pod is not None:
            try:
                upstream = await self._upstream.get(pod.url + "/v1/models", _SMALL_CALL_SECONDS)
                if upstream.status == 200:
                    return web.Response(body=await upstream.body(), content_type="application/json")
            except UpstreamFailure as failure:
                self.metrics.upstream_errors.labels(pod.name, pod.role, failure.kind).inc()
        if self.config.served_model_name is None:
            return error_response("no engine pod answered /v1/models", "ServiceUnavailableError", 503)
        model = {"id": self.config.served_model_name, "object": "model", "owned_by": "inferencepool"}
        return web.json_response({"object": "list", "data": [model]})

    # ---- generation --------------------------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._tracked(request, "completions", "/v1/completions")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._tracked(request, "chat", "/v1/chat/completions")

    async def _tracked(self, request: web.Request, endpoint: Endpoint, path: str) -> web.StreamResponse:
        self.in_flight += 1
        self._idle.clear()
        try:
            return await self._generate(request, endpoint, path)
        except BadRequest as error:
            self.metrics.rejected.labels(str(error.status)).inc()
            return error_response(str(error), error.error_type, error.status, error.param)
        except UpstreamError as error:
            self.metrics.rejected.labels(str(error.status)).inc()
            kind = "ServiceUnavailableError" if error.status == 503 else "BadGatewayError"
            return error_response(str(error), kind, error.status)
        except asyncio.CancelledError:
            self.metrics.client_disconnects.inc()
            raise
        except Exception:  # the router never dies of one request; the client learns something went wrong
            log.exception("request failed inside the router")
            self.metrics.rejected.labels("500").inc()
            return error_response("internal router error", "InternalServerError", 500)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def _generate(self, request: web.Request, endpoint: Endpoint, path: str) -> web.StreamResponse:
        started = time.monotonic()
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as error:
            raise BadRequest(
                f"request body exceeds the router's limit of {self.config.max_request_bytes} bytes",
                status=413,
                error_type="RequestTooLargeError",
            ) from error
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
        elif route is Route.DISAGGREGATED and not self._can_transfer:
            route = Route.FALLBACK
            self.metrics.fallbacks.labels("transfer_mode_unsupported").inc()
        affinity = (
            self.counter.affinity_key(prompt, self._affinity_tokens)
            if self.config.prefix_affinity.enabled
            else None
        )
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]

        decode_payload: bytes = raw
        decode_affinity = affinity
        if route is Route.DISAGGREGATED:
            transferred = await self._prefill(path, body, headers, affinity)
            if transferred is None:
                route = Route.FALLBACK
                self.metrics.fallbacks.labels("prefill_failed").inc()
            else:
                decode_payload = transferred
                # The KV arrives from the prefill pod, so the decode pod's own prefix cache does not matter.
                decode_affinity = None
        self.metrics.requests_by_route[route].inc()
        timeout = self.config.timeouts.first_byte_seconds
        leg = await self._open(
            "decode", path, decode_payload, headers, decode_affinity, prompt.stream, timeout
        )
        try:
            return await self._relay(request, leg, route, prompt.stream, started)
        finally:
            leg.pod.outstanding -= 1
            # Back to the pool when the body was read to its end, else closed (so the engine aborts).
            await leg.response.close()

    async def _prefill(
        self, path: str, body: dict[str, Any], headers: dict[str, str], affinity: int | None
    ) -> bytes | None:
        """Run the prefill leg; the decode leg's body on success, None when it failed (the caller falls
        back)."""
        payload = orjson.dumps(handshake.nixl_prefill_body(body))
        started = time.monotonic()
        try:
            leg = await self._open(
                "prefill", path, payload, headers, affinity, False, self.config.timeouts.prefill_seconds
            )
        except UpstreamError as error:
            log.warning("prefill leg failed, serving colocated: %s", error)
            return None
        pod = leg.pod
        try:
            if leg.response.status != 200:
                self.metrics.upstream_errors.labels(pod.name, pod.role, "status").inc()
                return None
            answer = orjson.loads(await leg.response.body())
            decode_body = handshake.nixl_decode_body(body, answer)
        except (UpstreamFailure, ValueError) as error:
            log.warning("prefill leg on %s failed, serving colocated: %s", pod.name, error)
            self.metrics.upstream_errors.labels(pod.name, pod.role, "protocol").inc()
            return None
        finally:
            pod.outstanding -= 1
        elapsed = time.monotonic() - started
        self._prefill_samples.add(elapsed)
        self.metrics.prefill_leg.observe(elapsed)
        return orjson.dumps(decode_body)

    async def _open(
        self,
        role: EngineRole,
        path: str,
        payload: bytes,
        headers: dict[str, str],
        affinity: int | None,
        stream: bool,
        timeout_seconds: int,
    ) -> _Leg:
        """Send a leg to a pod of `role`, trying others while connections fail before any response byte.

        On success the pod's outstanding count stays raised; the caller lowers it when the response is done.
        """
        assert self._upstream is not None
        tried: set[str] = set()
        last_problem = f"no {role} pod is ready"
        for attempt in range(self.config.max_attempts):
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
                await response.close()
                pod.outstanding -= 1
                self.metrics.upstream_errors.labels(pod.name, role, "status").inc()
                last_problem = f"{role} pod {pod.name} answered {response.status}: {detail}"
                tried.add(pod.name)
                continue
            pod.record_success()
            return _Leg(pod, response)
        status = 503 if not tried else 502
        raise UpstreamError(last_problem, status)

    async def _relay(
        self, request: web.Request, leg: _Leg, route: Route, stream: bool, started: float
    ) -> web.StreamResponse:
        upstream = leg.response
        if not stream or upstream.status != 200:
            try:
                payload = await upstream.body()
            except UpstreamFailure as failure:
                self.metrics.upstream_errors.labels(leg.pod.name, leg.pod.role, failure.kind).inc()
                status = 504 if failure.kind == "timeout" else 502
                raise UpstreamError(f"decode pod {leg.pod.name} failed: {failure}", status) from failure
            return web.Response(
                body=payload,
                status=upstream.status,
                headers={
                    "Content-Type": upstream.content_type or "application/json",
                    ROUTE_HEADER: route,
                },
            )
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": upstream.content_type or "text/event-stream",
                "Cache-Control": "no-cache",
                ROUTE_HEADER: route,
            },
        )
        await response.prepare(request)
        itl_metric = self.metrics.itl_by_route[route]
        sample = self._itl_samples.add if self._adaptive else None
        previous = 0.0
        ended = False
        try:
            while (chunk := await upstream.next_chunk()) is not None:
                now = time.monotonic()
                if previous:
                    gap = (now - previous) / (chunk.count(b"data:") or 1)
                    itl_metric.observe(gap)
                    if sample is not None:
                        sample(gap)
                else:
                    self.metrics.ttft_by_route[route].observe(now - started)
                previous = now
                if ended:
                    continue
                if chunk.endswith(SSE_DONE):
                    # The last event and the end of the chunked body in one write; the loop still reads the
                    # engine's end of body so the upstream connection goes back to the pool.
                    await response.write_eof(chunk)
                    ended = True
                else:
                    await response.write(chunk)
        except _CLIENT_GONE:
            # The client went away: dropping the upstream response (in the caller) aborts it on the engine.
            self.metrics.client_disconnects.inc()
            return response
        except UpstreamFailure as failure:
            # Headers are out, so the status cannot change: end the stream with an SSE error event instead.
            self.metrics.upstream_errors.labels(leg.pod.name, leg.pod.role, "stream").inc()
            message = f"decode pod {leg.pod.name} failed mid-stream: {failure}"
            await response.write(b"data: " + error_body(message, "BadGatewayError", 502) + b"\n\n")
        if not ended:
            await response.write_eof()
        return response

    # ---- background: adaptive threshold and tokenizer calibration ----------------------------------------

    async def _adapt_threshold(self) -> None:
        settings = self.config.adaptive_threshold
        while True:
            await asyncio.sleep(settings.interval_seconds)
            decision = next_threshold(
                self.threshold,
                self.config.prefill_threshold_tokens,
                settings,
                self._prefill_samples.take(),
                self._itl_samples.take(),
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
                {"Content-Type": "application/json"},
                stream=False,
                timeout_seconds=_SMALL_CALL_SECONDS,
            )
            if answer.status != 200:
                return
            count = json.loads(await answer.body()).get("count")
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
    runner = web.AppRunner(router.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
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
    await site.stop()
    finished = await router.wait_idle(timeouts.drain_seconds)
    if not finished:
        log.warning("drain timeout: %d requests still in flight are cut", router.in_flight)
    await runner.cleanup()


def counter_for(config: RouterConfig) -> HFTokenCounter | EstimateCounter:
    from inferencepool.router.tokens import load_counter

    return load_counter(config.tokenizer)
