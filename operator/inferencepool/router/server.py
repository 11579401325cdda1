"""The router's HTTP shell: lifecycle, the endpoint table and the small endpoints; the parts do the work.

Parts, one job each: pods.py (the endpoint table with load accounting; the pod and route choice on it is
the scheduling core, `inferencepool.scheduling`, shared with the simulator), engine_load.py (the engines' own
load, read off the request path), legs.py (a leg to a pod of a role, with safe retries), generate.py (route
orchestration), transfer.py (the NIXL and LMCache PD transfer modes), relay.py (the answer to the client, with
per-chunk metrics), adaptive.py (the adaptive-threshold loop), calibration.py (the token estimate's
calibration).

Hot-path choices, measured with `inferencepool bench router`: one event loop (uvloop) serves clients and
calls engines through the lean HTTP/1.1 layer in http1.py, with pooled keep-alive connections; a streamed
answer is relayed from the engine's connection straight into the client's; the client's body is forwarded
byte for byte when the route is direct (no re-encoding); metric children are bound once, live gauges computed
at scrape time; no per-request logging.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inferencepool.router.adaptive import AdaptiveThreshold
from inferencepool.router.calibration import SMALL_CALL_SECONDS, Calibrator
from inferencepool.router.config import RouterConfig
from inferencepool.router.engine_load import EngineLoad
from inferencepool.router.errors import UpstreamError, error_body, send_error, transport_error
from inferencepool.router.generate import Orchestrator
from inferencepool.router.http1 import Reply, Request, Server, Upstream, UpstreamFailure
from inferencepool.router.legs import Legs
from inferencepool.router.lmcache_pd import PDNotifications
from inferencepool.router.metrics import LiveState, RouterMetrics
from inferencepool.router.overload import POOLS, PRIORITIES, Admission, Shed
from inferencepool.router.pods import PodSet
from inferencepool.router.prompt import BadRequest, Endpoint
from inferencepool.router.relay import ROUTE_HEADER, Relay
from inferencepool.router.tokens import EstimateCounter, HFTokenCounter, TokenCounter
from inferencepool.router.transfer import LMCachePDTransfer, NixlTransfer, Transfer

__all__ = ["ROUTE_HEADER", "Router", "UpstreamError", "counter_for", "error_body", "serve", "transport_error"]

log = logging.getLogger("inferencepool.router")


def send_json(reply: Reply, document: object, status: int = 200) -> None:
    reply.send(status, orjson.dumps(document))


class Router:
    def __init__(self, config: RouterConfig, counter: TokenCounter, pods: PodSet | None = None) -> None:
        self.config = config
        self.counter = counter
        affinity = config.prefix_affinity
        self.pods = pods or PodSet(
            load_factor=affinity.load_factor_percent / 100,
            virtual_nodes=affinity.virtual_nodes,
            min_load_bound=affinity.min_load_bound,
            index_blocks=affinity.index_blocks,
        )
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
                overload=self._overload_figures,
            )
        )
        self.adaptive = AdaptiveThreshold(config, self.metrics)
        # every series a shed could add, at 0 from the start (a rate over a series that appears late misses
        # its first increase)
        shed_pools = ("decode",) if config.policy == "Colocated" else POOLS
        for pool, priority in itertools.product(shed_pools, PRIORITIES):
            self.metrics.shed.labels(pool, str(priority))
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._upstream: Upstream | None = None
        self._orchestrator: Orchestrator | None = None
        self._routes: dict[tuple[str, str], Callable[[Request, Reply], Awaitable[None]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._notifications: PDNotifications | None = None  # LMCache PD mode only

    @property
    def admission(self) -> Admission | None:
        """The per-pool overload queues (None: overload.enabled is off, or engine metrics are not read)."""
        return self._orchestrator.admission if self._orchestrator is not None else None

    @property
    def threshold(self) -> int:
        return self.adaptive.threshold

    @property
    def threshold_reason(self) -> str:
        return self.adaptive.reason

    # ---- lifecycle ---------------------------------------------------------------------------------------

    async def start(self, host: str) -> None:
        """Open what the router needs before it takes requests (on `host`: LMCache PD's notification
        socket)."""
        config = self.config
        timeouts = config.timeouts
        self._upstream = Upstream(timeouts.connect_milliseconds / 1000, timeouts.idle_stream_seconds)
        legs = Legs(self._upstream, self.pods, self.metrics, config.max_attempts)
        samples = self.adaptive.prefill_samples
        transfer: Transfer
        if config.transfer_mode == "LMCachePD":
            self._notifications = PDNotifications()
            await self._notifications.start(host, config.lmcache_pd.proxy_port)
            transfer = LMCachePDTransfer(legs, config, self.metrics, samples, self._notifications)
        else:
            transfer = NixlTransfer(legs, config, self.metrics, samples)
        calibrator = (
            Calibrator(self.counter, self.pods, self._upstream)
            if isinstance(self.counter, EstimateCounter)
            else None
        )
        itl_sample = self.adaptive.itl_samples.add if self.adaptive.enabled else None
        ttft_sample = self.adaptive.direct_ttft_samples.add if self.adaptive.enabled else None
        relay = Relay(self.metrics, itl_sample, legs, config.stream_headers_seconds(), ttft_sample)
        self._orchestrator = Orchestrator(
            config, self.counter, legs, transfer, relay, self.metrics, self.adaptive, calibrator
        )
        self._routes = {
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/chat/completions"): self._chat,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/ready"): self._ready,
            ("GET", "/metrics"): self._metrics,
        }
        if self.adaptive.enabled:
            self._tasks.append(asyncio.create_task(self.adaptive.run()))
        if calibrator is not None:
            self._tasks.append(asyncio.create_task(calibrator.run()))
        if config.engine_metrics_interval_milliseconds:
            admission = self._orchestrator.admission
            engine_load = EngineLoad(
                self.pods,
                self._upstream,
                config.engine_metrics_interval_milliseconds / 1000,
                admission.refresh if admission is not None else None,
            )
            self._tasks.append(asyncio.create_task(engine_load.run()))

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

    def _overload_figures(self) -> dict[str, tuple[int, int | None]]:
        admission = self.admission
        if admission is None:
            return {}
        return {role: (queue.queued, queue.slots()) for role, queue in admission.pools.items()}

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
            async with asyncio.timeout(timeout):  # not wait_for, which can swallow a cancellation on 3.11
                await self._idle.wait()
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
                upstream = await self._upstream.get(pod.url + "/v1/models", SMALL_CALL_SECONDS)
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
        assert self._orchestrator is not None
        self.in_flight += 1
        self._idle.clear()
        try:
            await self._orchestrator.generate(request, reply, endpoint)
        except BadRequest as error:
            self.metrics.rejected.labels(str(error.status)).inc()
            send_error(reply, str(error), error.error_type, error.status, error.param)
        except Shed as shed:
            self.metrics.rejected.labels("429").inc()
            self.metrics.shed.labels(shed.pool, str(shed.priority)).inc()
            retry_after = str(self.config.overload.retry_after_seconds)
            body = error_body(str(shed), "RateLimitError", 429)
            reply.send(429, body, headers=(("Retry-After", retry_after),))
        except UpstreamError as error:
            log.warning("answered %d: %s", error.status, error)
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
