"""The autoscaler's shell: the scaling loop of one pool, stepped by the operator's per-pool daemon.

Every interval: list the ready pods, scrape each one's /metrics (the engine's and the router's own
Prometheus pages: no Prometheus server needed), read them (feed.PoolFeed: the interval's counts, the latency
histograms over the window), decide (the planner, planner.py, for both roles at once), and act on the
decision through one actuator (`_actuate`):

- the StatefulSet's spec.replicas, by server-side apply under labels.AUTOSCALER_FIELD_MANAGER (the operator
  renders autoscaled StatefulSets without replicas, so the two managers never fight), or, in mode External,
  the planner's recommendation only;
- an Event for every scaling.

It also reads the routers' own metrics (share of requests through the prefill pool, the threshold in force),
for every pool. What it learnt is handed to the operator's status composer by one pure reader, `figures()`
(figures.AutoscalerFigures, the ScalingLimited condition's value among them); the operator writes the status,
once, with everything else. The pages each router round parsed, every role's, are kept
over the router's window as snapshots (`readings()`) for the operator's bottleneck diagnosis: nothing is
scraped twice.

Scrape failures leave a pod out of that tick (its metrics are still counted when it answers again); a pool
whose metrics cannot be read at all keeps its replica count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from inferencepool.api import labels
from inferencepool.api.pods import http_url, is_ready
from inferencepool.api.v1alpha1 import POOL_ROLES, Autoscaling, InferencePool, PoolRole, ScalingDecision
from inferencepool.autoscaler.feed import (
    PEER_REASON,
    ROUTER_DECISIONS,
    ROUTER_REQUESTS,
    ROUTES,
    PoolFeed,
    RolePages,
    RoleReading,
    RouterReading,
    observation,
)
from inferencepool.autoscaler.figures import AutoscalerFigures, RoleFigures, ScalingLimits
from inferencepool.autoscaler.histogram import (
    Counts,
    MetricsError,
    Page,
    PageReading,
    Reading,
    Window,
    parse_page,
    read_counts,
    read_gauge,
)
from inferencepool.autoscaler.planner import (
    BUDGET_LIMITED,
    RATIO_BOUND,
    SCALING_LIMITED,
    Planner,
    RolePlan,
)
from inferencepool.autoscaler.planner_spec import capacity_seed, planned, planner_settings
from inferencepool.builders.common import PoolRef, engine_name, selector_labels
from inferencepool.kube import Kube
from inferencepool.kube.fields import replicas_document, wanted_replicas
from inferencepool.kube.objects import label_selector, pool_reference

log = logging.getLogger("inferencepool.autoscaler")

SCRAPE_TIMEOUT_SECONDS = 3.0
# The router's own metrics (router/metrics.py): requests by route, and the threshold in force.
ROUTER_THRESHOLD = "inferencepool_router_prefill_threshold_tokens"
# How often and over how long the router is read when no pool autoscales (else: the pools' own settings).
ROUTER_INTERVAL_SECONDS = 15.0
ROUTER_WINDOW_SECONDS = 60.0


# (the pool's object reference, event type, reason, message) -> posted; the operator passes kopf.event.
EventSink = Callable[[dict[str, Any], str, str, str], None]


@dataclass(frozen=True)
class RoleChange:
    """What the planner decided for one role, as the actuator applies it: the replicas, why, and the figures
    behind it for status."""

    current: int
    replicas: int
    reason: str
    message: str
    figures: dict[str, int | None] = field(default_factory=dict)


@dataclass
class _Role:
    observed_milliseconds: int | None = None
    recommended: int | None = None
    told: tuple[int, int] | None = None  # mode External: (recommended, current) last posted as an event
    last_scaling: ScalingDecision | None = None
    limited: str | None = None  # why the role wants more than maxReplicas, while it does
    bounded: tuple[str, str] | None = None  # (reason, message) while spec.scaling holds it below its want
    unschedulable: str | None = None  # pods the scheduler cannot place (no GPUs free, say), while there are


class PoolAutoscaler:
    """The autoscaler of one InferencePool. `update` hands it a new spec; `tick` runs what is due (the
    operator's daemon calls it again after `seconds_to_next()`)."""

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
        self._routes: Window[Counts] = Window()
        self._router_due = 0.0
        self.disaggregated_percent: int | None = None
        self.lent_percent: int | None = None
        self.peer_prefill_percent: int | None = None
        self.threshold_tokens: int | None = None
        self._parsed: list[PageReading] = []  # this round's pages
        self._readings: deque[Reading] = deque()
        # one planner for both roles, fed every interval
        self._planner: Planner | None = None
        self._plan_due = 0.0
        self._planned_at: float | None = None
        self._feed = PoolFeed()  # what the planner reads from the pages, round after round
        self._restore(pool)

    @property
    def namespace(self) -> str:
        return str(self.pool.metadata["namespace"])

    @property
    def name(self) -> str:
        return str(self.pool.metadata["name"])

    def update(self, pool: InferencePool) -> None:
        if self._planner is not None and pool.spec.engine != self.pool.spec.engine:
            self._planner.model = capacity_seed(pool.spec)
        self.pool = pool

    def _planned_roles(self) -> list[PoolRole]:
        return [role for role in POOL_ROLES if planned(self.pool.spec, role) is not None]

    def settings(self, role: PoolRole) -> Autoscaling | None:
        """The role's autoscaling settings while it autoscales (the planner decides its replicas)."""
        return planned(self.pool.spec, role)

    @property
    def ref(self) -> PoolRef:
        return PoolRef.of(self.pool)

    def _restore(self, pool: InferencePool) -> None:
        """After an operator restart: keep the last decisions and readings already in status (they are the
        best there is until a new window is read), so a restart rewrites nothing."""
        status = pool.status
        if status is None:
            return
        for role in POOL_ROLES:
            figures = getattr(status, role)
            if figures is not None and self.settings(role) is not None:
                state = self._roles.setdefault(role, _Role())
                state.last_scaling = figures.last_scaling
                state.observed_milliseconds = figures.observed_milliseconds
        if status.router is not None:
            self.disaggregated_percent = status.router.disaggregated_percent
            self.lent_percent = status.router.lent_percent
            self.peer_prefill_percent = status.router.peer_prefill_percent
            if pool.spec.router.adaptive_threshold.enabled:
                self.threshold_tokens = status.router.prefill_threshold_tokens

    def seconds_to_next(self) -> float:
        """Until the plan or the router round is due (at most 1 s, so a spec change is picked up quickly)."""
        now = self._clock()
        dues = [self._plan_due] if self._planned_roles() else []
        return max(0.05, min([1.0, self._router_due - now, *[due - now for due in dues]]))

    async def tick(self) -> bool:
        """Decide for every role that is due; write replicas and post events. Whether anything was due (else
        nothing it reports changed). Raises KubeError when the API server cannot be read (the caller logs it
        and tries again next time)."""
        now, ran = self._clock(), False
        self._parsed = []
        planned_roles = self._planned_roles()
        for role in POOL_ROLES:
            if self.settings(role) is None:
                ran = ran or self._roles.pop(role, None) is not None
        if not planned_roles:
            self._planner, self._planned_at = None, None
        elif now >= self._plan_due:
            interval, window = self._router_timing()
            self._plan_due = self._router_due = now + interval  # the plan reads the routers itself
            await self._plan(now, planned_roles, window)
            await self._keep_reading(now, window)
            return True
        if now >= self._router_due:
            interval, window = self._router_timing()
            self._router_due, ran = now + interval, True
            await self._observe_router(now, window)
            await self._keep_reading(now, window)
        return ran

    async def _keep_reading(self, now: float, window_seconds: float) -> None:
        """Keep this round's pages as one reading, over the window. Engine roles the round did not read
        (autoscaling off, or not due) are read here, so a reading holds every role at one moment."""
        read = {role for role, _, _ in self._parsed}
        for role in POOL_ROLES:
            if role in read:
                continue
            _, pages = await self._scrape_ready(await self._pods(role))
            for name, page in pages:
                try:
                    self._parsed.append((role, name, parse_page(page)))
                except MetricsError as error:
                    log.warning("pod %s/%s: %s", self.namespace, name, error)
        self._readings.append((now, tuple(self._parsed)))
        while self._readings[0][0] < now - window_seconds:
            self._readings.popleft()

    def readings(self) -> list[Reading]:
        """The readings of the router's window, oldest first (pure: reads only)."""
        return list(self._readings)

    async def _actuate(
        self,
        role: PoolRole,
        state: _Role,
        autoscaling: Autoscaling,
        workload: dict[str, Any],
        change: RoleChange,
    ) -> None:
        """The one actuator. Mode External: the change is only recommended (status,
        metrics, an event when it moves). Mode Operator: the StatefulSet's replicas are written under the
        autoscaler's field manager, the decision is kept for status and a ScaledUp or ScaledDown event
        explains it."""
        if autoscaling.mode == "External":
            self._recommend(role, state, change.replicas, change.current, change.message)
            return
        state.recommended = change.replicas
        if change.replicas == change.current:
            return
        await asyncio.to_thread(
            self.kube.apply, replicas_document(workload, change.replicas), labels.AUTOSCALER_FIELD_MANAGER
        )
        state.last_scaling = ScalingDecision(
            from_replicas=change.current,
            replicas=change.replicas,
            reason=change.reason,
            message=change.message,
            time=self._wall_clock(),
            **change.figures,
        )
        direction = "ScaledUp" if change.replicas > change.current else "ScaledDown"
        self._post_event(pool_reference(self.pool.metadata), "Normal", direction, f"{role}: {change.message}")

    def _recommend(self, role: PoolRole, state: _Role, replicas: int, current: int, message: str) -> None:
        """Mode External: the recommendation is only reported (status, metrics, an event when it moves)."""
        if (replicas, current) != state.told and replicas != current:
            self._post_event(
                pool_reference(self.pool.metadata),
                "Normal",
                "Recommended",
                f"{role}: {replicas} replicas recommended, {current} set externally: {message}",
            )
        state.recommended, state.told = replicas, (replicas, current)

    async def _plan(self, now: float, roles: list[PoolRole], window_seconds: float) -> None:
        """Read both roles and the routers, plan, and act on the roles that autoscale."""
        workloads: dict[PoolRole, dict[str, Any]] = {}
        for role in POOL_ROLES:
            workload = await asyncio.to_thread(
                self.kube.get, "apps/v1", "StatefulSet", self.namespace, engine_name(self.ref, role)
            )
            if workload is None:
                return  # not created yet
            workloads[role] = workload
        current = {role: wanted_replicas(w) for role, w in workloads.items()}
        settings = planner_settings(self.pool.spec, current)
        assert settings is not None
        if self._planner is None:
            self._planner = Planner(settings, capacity_seed(self.pool.spec))
        else:
            self._planner.settings = settings
        readings = {}
        for role in POOL_ROLES:
            state = self._roles.setdefault(role, _Role())
            readings[role] = await self._read_role(role, state, workloads[role], now)
        router = await self._read_routers(now, window_seconds)
        interval = settings.interval_seconds if self._planned_at is None else now - self._planned_at
        self._planned_at = now
        plan = self._planner.decide(
            observation(
                now,
                interval,
                readings["prefill"],
                readings["decode"],
                router,
                self._planner.model.kv_capacity_tokens,
            )
        )
        if "decode" in roles:  # what the planner held: the requests' TPOT where the engines export it
            seen = plan.decode.observed_seconds
            self._roles["decode"].observed_milliseconds = None if seen is None else round(seen * 1000)
        for role in roles:
            autoscaling = planned(self.pool.spec, role)
            assert autoscaling is not None
            await self._act(role, self._roles[role], autoscaling, workloads[role], getattr(plan, role))

    async def _read_role(
        self, role: PoolRole, state: _Role, workload: dict[str, Any], now: float
    ) -> RoleReading:
        """One role's engines: the interval's counts, the latency window, the gauges."""
        autoscaling = self.pool.spec.pool(role).autoscaling
        pods = await self._pods(role)
        state.unschedulable = _unschedulable(pods)
        ready_pods, pages = await self._scrape_ready(pods)
        parsed: list[tuple[str, Page]] = []
        for name, page in pages:
            try:
                parsed.append((name, parse_page(page)))
            except MetricsError as error:
                log.warning("pod %s/%s: %s", self.namespace, name, error)
        percentile = autoscaling.target.percentile if autoscaling is not None else 90
        reading, failed = self._feed.role(
            role,
            now,
            RolePages(
                replicas=wanted_replicas(workload),
                ready=int(workload.get("status", {}).get("readyReplicas", 0)),
                ready_pods=frozenset(ready_pods),
                pages=tuple(parsed),
                window_seconds=autoscaling.window_seconds if autoscaling is not None else 60,
                percentile=percentile,
            ),
        )
        for name, why in failed:
            log.warning("pod %s/%s: %s", self.namespace, name, why)
        unread = {name for name, _ in failed}
        self._parsed.extend((role, name, page) for name, page in parsed if name not in unread)
        latency = reading.latency_window
        observed = None if latency is None else latency.quantile(percentile / 100)
        state.observed_milliseconds = None if observed is None else round(observed * 1000)
        return reading

    async def _read_routers(self, now: float, window_seconds: float) -> RouterReading:
        """The routers' counts by route over the interval and the direct route's TTFT over the window (and
        the split and threshold `_observe_router` reports)."""
        ready_pods, pages = await self._observe_router(now, window_seconds)
        reading, failed = self._feed.routers(now, frozenset(ready_pods), pages, window_seconds)
        for name, why in failed:
            log.warning("router pod %s/%s: %s", self.namespace, name, why)
        return reading

    async def _act(
        self,
        role: PoolRole,
        state: _Role,
        autoscaling: Autoscaling,
        workload: dict[str, Any],
        plan: RolePlan,
    ) -> None:
        """One role's plan, through the actuator, with the figures behind it."""
        state.limited = plan.message if plan.reason == SCALING_LIMITED else None
        # a bound across both pools (spec.scaling) holding the role below what its target needs
        cut = plan.reason in (BUDGET_LIMITED, RATIO_BOUND) and plan.replicas < plan.wanted
        state.bounded = (plan.reason, plan.message) if cut else None
        # The planner scales up at once; the spec's step limit still holds.
        replicas = min(plan.replicas, plan.current + autoscaling.max_scale_up_replicas)
        figures = {
            "wanted_replicas": plan.wanted,
            "demand_milli_engines": round(plan.demand * 1000),
            "forecast_milli_engines": round(plan.forecast * 1000),
            "capacity_milli_engines_per_replica": round(plan.capacity_per_replica * 1000),
            "correction_percent": round(plan.correction * 100),
            "observed_milliseconds": None
            if plan.observed_seconds is None
            else round(plan.observed_seconds * 1000),
            "target_milliseconds": round(plan.target_seconds * 1000),
        }
        change = RoleChange(plan.current, replicas, plan.reason, plan.message, figures)
        await self._actuate(role, state, autoscaling, workload, change)

    def _router_timing(self) -> tuple[float, float]:
        """The router is read as often, and over as long, as the pools are (the shortest of them)."""
        scaled = [settings for role in POOL_ROLES if (settings := self.settings(role)) is not None]
        if not scaled:
            return ROUTER_INTERVAL_SECONDS, ROUTER_WINDOW_SECONDS
        return (
            float(min(s.interval_seconds for s in scaled)),
            float(min(s.window_seconds for s in scaled)),
        )

    async def _observe_router(
        self, now: float, window_seconds: float
    ) -> tuple[set[str], list[tuple[str, Page]]]:
        """Share of requests that went through the prefill pool, and the threshold the routers hold; the
        ready routers and the pages parsed."""
        ready_pods, pages = await self._scrape_ready(await self._pods("router"))
        thresholds: list[float] = []
        read: list[tuple[str, Page]] = []
        for name, page in pages:
            try:
                parsed = parse_page(page)
                self._parsed.append(("router", name, parsed))
                read.append((name, parsed))
                routes = read_counts(parsed, ROUTER_REQUESTS, "route", ROUTES)
                peer = read_counts(parsed, ROUTER_DECISIONS, "reason", (PEER_REASON,))
                # by route, then the prompts prefilled on a peer decode pod (a detail of disaggregated)
                counts = (
                    None if routes is None else Counts((*routes.values, *(peer or Counts((0.0,))).values))
                )
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
        total = sum(change.values[: len(ROUTES)]) if change is not None else 0.0
        if change is not None:
            # None (not 0) for a quiet window: no requests says nothing about the split.
            self.disaggregated_percent = round(100 * change.values[1] / total) if total else None
            self.lent_percent = round(100 * change.values[3] / total) if total else None
            self.peer_prefill_percent = round(100 * change.values[4] / total) if total else None
        if thresholds:
            self.threshold_tokens = round(sum(thresholds) / len(thresholds))
        return ready_pods, read

    async def _pods(self, role: labels.Role) -> list[dict[str, Any]]:
        selector = label_selector(selector_labels(self.ref, role))
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

    def figures(self) -> AutoscalerFigures:
        """Everything the autoscaler learnt that status reports (pure: reads only)."""
        roles = {
            role: RoleFigures(state.observed_milliseconds, state.last_scaling, state.recommended)
            for role, state in self._roles.items()
        }
        threshold = self.threshold_tokens if self.pool.spec.router.adaptive_threshold.enabled else None
        return AutoscalerFigures(
            roles,
            self.disaggregated_percent,
            threshold,
            self._limits(),
            self.lent_percent,
            self.peer_prefill_percent,
        )

    def _limits(self) -> ScalingLimits | None:
        """Whether a role wants more replicas than it can get (None when nothing autoscales)."""
        if not self._roles:
            return None
        stuck = [
            f"{role}: {state.unschedulable}" for role, state in self._roles.items() if state.unschedulable
        ]
        at_max = [f"{role}: {state.limited}" for role, state in self._roles.items() if state.limited]
        bounded = {role: state.bounded for role, state in self._roles.items() if state.bounded}
        if not stuck and not at_max and not bounded:
            return ScalingLimits(False, "WithinLimits", "every autoscaled pool is within its replica bounds")
        cut = [f"{role}: {message}" for role, (_, message) in bounded.items()]
        if stuck or at_max:
            reason = "PodsUnschedulable" if stuck else "AtMaxReplicas"
        else:  # spec.scaling: the GPU budget before the ratio, as the planner applies them
            reasons = {reason for reason, _ in bounded.values()}
            reason = "AtGpuBudget" if BUDGET_LIMITED in reasons else "AtRatioBound"
        return ScalingLimits(True, reason, "; ".join(stuck + at_max + cut))


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


def scrape_session() -> aiohttp.ClientSession:
    """One session for every pool's scrapes: pod IPs, so no proxies from the environment, no cookies, and a
    small connection pool per pod. Made on the event loop that uses it."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit_per_host=2), cookie_jar=aiohttp.DummyCookieJar()
    )
