"""The autoscaler's shell, inside the operator: one task per autoscaled pool.

Every interval, for each role that autoscales: list the role's ready pods, scrape each one's /metrics (the
engine's own Prometheus page: no Prometheus server needed), difference the latency histogram over the window,
decide (policy.py), and write what changed:

- the StatefulSet's spec.replicas, by server-side apply under labels.AUTOSCALER_FIELD_MANAGER (the operator
  renders autoscaled StatefulSets without replicas, so the two managers never fight);
- the pool's status: observed latency, the last scaling decision, and the ScalingLimited condition, applied
  on the status subresource under the same manager. Server-side apply removes fields a manager stops sending,
  so every write carries all of the autoscaler's status fields, for both roles;
- an Event for every scaling and for ScalingLimited turning on.

Scrape failures leave a pod out of that tick (its metrics are still counted when it answers again); a pool
whose metrics cannot be read at all keeps its replica count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from inferencepool.api import labels
from inferencepool.api.pods import http_url, is_ready
from inferencepool.api.v1alpha1 import (
    API_VERSION,
    CONDITION_SCALING_LIMITED,
    POOL_ROLES,
    Autoscaling,
    InferencePool,
    PoolRole,
    ScalingDecision,
)
from inferencepool.autoscaler.histogram import (
    ITL_METRIC,
    TTFT_METRIC,
    Counts,
    Histogram,
    MetricsError,
    Window,
    parse_page,
    read_counts,
    read_gauge,
    read_histogram,
)
from inferencepool.autoscaler.policy import Decision, Recommender
from inferencepool.kube import Kube, KubeError

log = logging.getLogger("inferencepool.autoscaler")

SCRAPE_TIMEOUT_SECONDS = 3.0
METRIC = {"prefill": (TTFT_METRIC, "TTFT"), "decode": (ITL_METRIC, "ITL")}
# The router's own metrics (router/metrics.py): requests by route, and the threshold in force.
ROUTER_REQUESTS = "inferencepool_router_requests"
ROUTER_THRESHOLD = "inferencepool_router_prefill_threshold_tokens"
ROUTES = ("direct", "disaggregated", "fallback")
# How often and over how long the router is read when no pool autoscales (else: the pools' own settings).
ROUTER_INTERVAL_SECONDS = 15.0
ROUTER_WINDOW_SECONDS = 60.0

# (pool uid, event type, reason, message) -> posted; the operator passes kopf.event through this.
EventSink = Callable[[dict[str, Any], str, str, str], None]


@dataclass
class _Role:
    recommender: Recommender = field(default_factory=Recommender)
    window: Window[Histogram] = field(default_factory=Window)
    due: float = 0.0
    observed_milliseconds: int | None = None
    last_scaling: ScalingDecision | None = None
    limited: str | None = None  # why the role wants more than maxReplicas, while it does
    unschedulable: str | None = None  # pods the scheduler cannot place (no GPUs free, say), while there are


class PoolAutoscaler:
    """The autoscaler of one InferencePool. `update` hands it a new spec; `run` loops until cancelled."""

    def __init__(
        self,
        kube: Kube,
        pool: InferencePool,
        session: aiohttp.ClientSession,
        post_event: EventSink,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.pool = pool
        self._session = session
        self._post_event = post_event
        self._clock = clock
        self._wall_clock = wall_clock
        self._roles: dict[PoolRole, _Role] = {}
        # ScalingLimited as last written: its status and when it took it (kept across operator restarts).
        self._limited: bool | None = None
        self._transition = wall_clock()
        self._written: dict[str, Any] | None = None
        self._routes: Window[Counts] = Window()
        self._router_due = 0.0
        self.disaggregated_percent: int | None = None
        self.threshold_tokens: int | None = None
        self._restore(pool)

    @property
    def namespace(self) -> str:
        return str(self.pool.metadata["namespace"])

    @property
    def name(self) -> str:
        return str(self.pool.metadata["name"])

    def update(self, pool: InferencePool) -> None:
        self.pool = pool

    def settings(self, role: PoolRole) -> Autoscaling | None:
        autoscaling = self.pool.spec.pool(role).autoscaling
        return autoscaling if autoscaling is not None and autoscaling.enabled else None

    def _restore(self, pool: InferencePool) -> None:
        """After an operator restart: keep the last decisions already in status (they are still true)."""
        status = pool.status
        if status is None:
            return
        for role in POOL_ROLES:
            figures = getattr(status, role)
            if figures is not None and figures.last_scaling is not None:
                self._roles.setdefault(role, _Role()).last_scaling = figures.last_scaling
        condition = status.condition(CONDITION_SCALING_LIMITED)
        if condition is not None:
            self._limited = condition.status == "True"
            self._transition = condition.last_transition_time

    def seconds_to_next(self) -> float:
        """Until the earliest role is due (at most 1 s, so a spec change is picked up quickly)."""
        now = self._clock()
        dues = [self._roles[r].due for r in POOL_ROLES if self.settings(r) is not None and r in self._roles]
        return max(0.05, min([1.0, self._router_due - now, *[due - now for due in dues]]))

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except KubeError as error:
                log.warning("autoscaler %s/%s: %s", self.namespace, self.name, error)
            except Exception:  # one bad round must not stop autoscaling this pool
                log.exception("autoscaler %s/%s: round failed", self.namespace, self.name)
            await asyncio.sleep(self.seconds_to_next())

    async def tick(self) -> None:
        """Decide for every role that is due; write replicas, status and events."""
        now = self._clock()
        for role in POOL_ROLES:
            settings = self.settings(role)
            if settings is None:
                self._roles.pop(role, None)
                continue
            state = self._roles.setdefault(role, _Role())
            if now < state.due:
                continue
            state.due = now + settings.interval_seconds
            decision = await self._decide(role, state, settings, now)
            if decision is None:
                continue
            state.limited = decision.message if decision.limited(settings) else None
            current = decision.current
            if decision.replicas != current:
                await asyncio.to_thread(self._scale, role, decision.replicas)
                state.last_scaling = ScalingDecision(
                    from_replicas=current,
                    replicas=decision.replicas,
                    reason=decision.reason,
                    message=decision.message,
                    time=self._wall_clock(),
                )
                direction = "ScaledUp" if decision.replicas > current else "ScaledDown"
                self._post_event(self._ref(), "Normal", direction, f"{role}: {decision.message}")
        if now >= self._router_due:
            interval, window = self._router_timing()
            self._router_due = now + interval
            await self._observe_router(now, window)
        await asyncio.to_thread(self._write_status)

    def _router_timing(self) -> tuple[float, float]:
        """The router is read as often, and over as long, as the pools are (the shortest of them)."""
        scaled = [settings for role in POOL_ROLES if (settings := self.settings(role)) is not None]
        if not scaled:
            return ROUTER_INTERVAL_SECONDS, ROUTER_WINDOW_SECONDS
        return (
            float(min(s.interval_seconds for s in scaled)),
            float(min(s.window_seconds for s in scaled)),
        )

    async def _observe_router(self, now: float, window_seconds: float) -> None:
        """Share of requests that went through the prefill pool, and the threshold the routers hold."""
        ready_pods, pages = await self._scrape_ready(await self._pods("router"))
        thresholds: list[float] = []
        for name, page in pages:
            try:
                parsed = parse_page(page)
                counts = read_counts(parsed, ROUTER_REQUESTS, "route", ROUTES)
                threshold = read_gauge(parsed, ROUTER_THRESHOLD)
            except MetricsError as error:
                log.warning("router pod %s/%s: %s", self.namespace, name, error)
                continue
            if counts is not None:
                self._routes.add(name, now, counts)
            if threshold is not None:
                thresholds.append(threshold)
        self._routes.keep_only(ready_pods)
        change = self._routes.delta(now, window_seconds)
        total = sum(change.values) if change is not None else 0.0
        if change is not None:
            # None (not 0) for a quiet window: no requests says nothing about the split.
            self.disaggregated_percent = round(100 * change.values[1] / total) if total else None
        if thresholds:
            self.threshold_tokens = round(sum(thresholds) / len(thresholds))

    async def _decide(
        self, role: PoolRole, state: _Role, settings: Autoscaling, now: float
    ) -> Decision | None:
        workload = await asyncio.to_thread(
            self.kube.get, "apps/v1", "StatefulSet", self.namespace, f"{self.name}-{role}"
        )
        if workload is None:
            return None  # not created yet
        current = int(workload.get("spec", {}).get("replicas", 0))
        ready = int(workload.get("status", {}).get("readyReplicas", 0))
        pods = await self._pods(role)
        state.unschedulable = _unschedulable(pods)
        ready_pods, pages = await self._scrape_ready(pods)
        metric, label = METRIC[role]
        read_any = False
        for name, page in pages:
            try:
                histogram = read_histogram(parse_page(page), metric)
            except MetricsError as error:
                log.warning("pod %s/%s: %s", self.namespace, name, error)
                continue
            if histogram is not None:
                state.window.add(name, now, histogram)
                read_any = True
        state.window.keep_only(ready_pods)
        change = state.window.delta(now, settings.window_seconds)
        if change is None:
            # Not two readings of any pod yet (just started, or no pod answers): nothing to decide on.
            if not read_any:
                log.debug("%s/%s %s: no engine metrics to read yet", self.namespace, self.name, role)
            return None
        observed = change.quantile(settings.target.percentile / 100)
        state.observed_milliseconds = None if observed is None else round(observed * 1000)
        target = self.pool.spec.target_milliseconds(role)
        assert target is not None  # autoscaling is on, so the spec rules require the role's target
        return state.recommender.decide(now, current, ready, observed, target, settings, label)

    async def _pods(self, role: str) -> list[dict[str, Any]]:
        selector = f"{labels.LABEL_POOL}={self.name},{labels.LABEL_ROLE}={role}"
        return await asyncio.to_thread(self.kube.list, "v1", "Pod", self.namespace, selector)

    async def _scrape_ready(self, pods: list[dict[str, Any]]) -> tuple[set[str], list[tuple[str, str]]]:
        """The names of the ready pods, and the metrics pages of those that answered."""
        urls = {
            str(pod["metadata"]["name"]): url
            for pod in pods
            if is_ready(pod) and (url := http_url(pod)) is not None
        }
        pages = await asyncio.gather(*(self._scrape(url) for url in urls.values()))
        return set(urls), [(name, page) for name, page in zip(urls, pages, strict=True) if page is not None]

    async def _scrape(self, url: str) -> str | None:
        try:
            async with self._session.get(
                url + "/metrics", timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS)
            ) as response:
                if response.status != 200:
                    return None
                return await response.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None

    def _scale(self, role: PoolRole, replicas: int) -> None:
        document = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": f"{self.name}-{role}", "namespace": self.namespace},
            "spec": {"replicas": replicas},
        }
        self.kube.apply(document, labels.AUTOSCALER_FIELD_MANAGER)

    def _ref(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": labels.KIND,
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.pool.metadata.get("uid"),
            },
        }

    def status_document(self) -> dict[str, Any]:
        """Every status field the autoscaler owns, for both roles."""
        status: dict[str, Any] = {}
        for role in POOL_ROLES:
            state = self._roles.get(role)
            if state is None:
                continue
            figures: dict[str, Any] = {}
            if state.observed_milliseconds is not None:
                figures["observedMilliseconds"] = state.observed_milliseconds
            if state.last_scaling is not None:
                figures["lastScaling"] = state.last_scaling.model_dump(mode="json", by_alias=True)
            if figures:
                status[role] = figures
        router: dict[str, Any] = {}
        if self.disaggregated_percent is not None:
            router["disaggregatedPercent"] = self.disaggregated_percent
        if self.threshold_tokens is not None and self.pool.spec.router.adaptive_threshold.enabled:
            router["prefillThresholdTokens"] = self.threshold_tokens
        if router:
            status["router"] = router
        if not self._roles:
            return status  # nothing autoscales: no ScalingLimited to report
        stuck = [
            f"{role}: {state.unschedulable}" for role, state in self._roles.items() if state.unschedulable
        ]
        at_max = [f"{role}: {state.limited}" for role, state in self._roles.items() if state.limited]
        limited = stuck + at_max
        if bool(limited) != self._limited:
            if limited:
                self._post_event(self._ref(), "Warning", "ScalingLimited", "; ".join(limited))
            self._limited = bool(limited)
            self._transition = self._wall_clock()
        reason = "PodsUnschedulable" if stuck else "AtMaxReplicas" if at_max else "WithinLimits"
        status["conditions"] = [
            {
                "type": CONDITION_SCALING_LIMITED,
                "status": "True" if limited else "False",
                "reason": reason,
                "message": "; ".join(limited)
                if limited
                else "every autoscaled pool is within its replica bounds",
                "lastTransitionTime": self._transition.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        ]
        return status

    def _write_status(self) -> None:
        document = self.status_document()
        if document == self._written or (self._written is None and not document):
            return
        self.kube.apply_status({**self._ref(), "status": document}, labels.AUTOSCALER_FIELD_MANAGER)
        self._written = document


class Autoscalers:
    """The autoscaler task of every pool (it also reads the router's figures for status), started, updated and
    stopped as pools come, change and go.

    Lives on the operator's event loop; `sync` is called after each reconcile, `stop` when a pool is deleted.
    """

    def __init__(self, kube: Kube, post_event: EventSink) -> None:
        self._kube = kube
        self._post_event = post_event
        self._running: dict[tuple[str, str], tuple[PoolAutoscaler, asyncio.Task[None]]] = {}
        self._session: aiohttp.ClientSession | None = None

    def sync(self, pool: InferencePool) -> None:
        key = (str(pool.metadata["namespace"]), str(pool.metadata["name"]))
        entry = self._running.get(key)
        if entry is not None and entry[0].pool.metadata.get("uid") == pool.metadata.get("uid"):
            entry[0].update(pool)
            return
        self.stop(*key)
        if self._session is None:
            # Scrapes go to pod IPs: no proxies from the environment, no cookies, a small pool per pod.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit_per_host=2), cookie_jar=aiohttp.DummyCookieJar()
            )
        scaler = PoolAutoscaler(self._kube, pool, self._session, self._post_event)
        task = asyncio.create_task(scaler.run(), name=f"autoscaler {key[0]}/{key[1]}")
        self._running[key] = (scaler, task)
        log.info("watching %s/%s (autoscaling, router figures)", *key)

    def stop(self, namespace: str, name: str) -> None:
        entry = self._running.pop((namespace, name), None)
        if entry is not None:
            entry[1].cancel()
            log.info("stopped watching %s/%s", namespace, name)

    async def close(self) -> None:
        tasks = [task for _, task in self._running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None


def _unschedulable(pods: list[dict[str, Any]]) -> str | None:
    """Pods the scheduler has found no node for, with its own words (e.g. Insufficient nvidia.com/gpu)."""
    stuck: dict[str, str] = {}
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Pending":
            continue
        for condition in status.get("conditions") or []:
            if (condition.get("type"), condition.get("status"), condition.get("reason")) == (
                "PodScheduled",
                "False",
                "Unschedulable",
            ):
                stuck[str(pod["metadata"]["name"])] = str(condition.get("message") or "no node fits")
    if not stuck:
        return None
    names = ", ".join(sorted(stuck))
    return f"{len(stuck)} pod(s) cannot be scheduled ({names}): {next(iter(stuck.values()))}"
