"""What the simulated pool's planner reads: the metric pages its engines and its router would serve, read by
the operator's own feed (`autoscaler.feed.PoolFeed`), so a simulated figure goes through the same parsing and
the same signals as a deployed pool's decision (a metric renamed, or a figure the feed does not read, moves
both).

Each simulated engine renders the fake engine's vLLM page (`engine_sim.metrics.EnginePage`: the core's
counters and gauges, and its TTFT, ITL and TPOT histograms); the router's page is the router's own
`RouterMetrics`, counted where the router counts: requests and prompt tokens by route, prompt tokens per
arrival window by pool (on the simulation's clock), and the client-observed time to first token by route.
Pages are text, parsed by the operator's parser.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from prometheus_client import generate_latest

from inferencepool.api.v1alpha1 import POOL_ROLES, PoolRole
from inferencepool.autoscaler.feed import PoolFeed, RolePages, observation
from inferencepool.autoscaler.histogram import Histogram, parse_page
from inferencepool.autoscaler.planner import Observation
from inferencepool.engine_sim.core import EngineCore
from inferencepool.engine_sim.metrics import EnginePage, LatencyCounts
from inferencepool.router.metrics import LiveState, RouterMetrics
from inferencepool.router.pods import PodSet
from inferencepool.scheduling.decider import Route, RouteReason

ROUTER_POD = "router-0"
MODEL_NAME = "sim"


class Engine(Protocol):
    """A simulated engine, as its page shows it."""

    @property
    def name(self) -> str: ...
    @property
    def core(self) -> EngineCore: ...
    @property
    def ttft(self) -> LatencyCounts: ...
    @property
    def itl(self) -> LatencyCounts: ...
    @property
    def tpot(self) -> LatencyCounts: ...


def histogram_of(counts: LatencyCounts) -> Histogram:
    """An engine's latency histogram as a reader of its page gets it (cumulative buckets and the sum)."""
    return Histogram(counts.bounds, tuple(float(c) for c in itertools.accumulate(counts.counts)), counts.sum)


class Scrape:
    """One simulated pool's pages and the feed that reads them, round after round."""

    def __init__(self, pods: PodSet, threshold_tokens: int, clock: Callable[[], float]) -> None:
        self.router = RouterMetrics(
            LiveState(
                pods=pods,
                threshold=lambda: threshold_tokens,
                counter_kind=lambda: "estimate",
                counter_source=lambda: "sim",
                chars_per_token=lambda: 4.0,
                kv_push_notifications=dict,
            ),
            clock,
        )
        self._pages: dict[str, EnginePage] = {}
        self.feed = PoolFeed()

    def routed(self, route: Route, reason: RouteReason, prompt_tokens: int) -> None:
        """A request the router served on `route` (its requests and routed prompt tokens, and its tokens in
        the arrival window of its pool)."""
        self.router.requests_by_route[route].inc()
        self.router.prompt_tokens_by_route[route].inc(prompt_tokens)
        self.router.arrived(route, reason, prompt_tokens)

    def first_token(self, route: Route, seconds: float) -> None:
        self.router.ttft_by_route[route].observe(seconds)

    def _engine_page(self, replica: Engine) -> str:
        page = self._pages.get(replica.name)
        if page is None:
            page = self._pages[replica.name] = EnginePage(
                replica.core, MODEL_NAME, replica.name, replica.ttft, replica.itl, replica.tpot
            )
        return page.text()

    def observation(
        self,
        now: float,
        interval_seconds: float,
        members: Mapping[PoolRole, Sequence[Engine]],
        ready: Mapping[PoolRole, Sequence[Engine]],
        window_seconds: float,
        percentile: int,
        kv_capacity_tokens: int,
    ) -> Observation:
        """Scrape every ready engine and the router, as the operator's runner does each interval, and read
        the planner's input from the pages."""
        readings = {}
        for role in POOL_ROLES:
            pages = tuple((r.name, parse_page(self._engine_page(r))) for r in ready[role])
            readings[role], failed = self.feed.role(
                role,
                now,
                RolePages(
                    replicas=len(members[role]),
                    ready=len(ready[role]),
                    ready_pods=frozenset(r.name for r in ready[role]),
                    pages=pages,
                    window_seconds=window_seconds,
                    percentile=percentile,
                ),
            )
            assert not failed, failed  # the simulator's own pages: a failure is a bug
        router_page = parse_page(generate_latest(self.router.registry).decode())
        router, failed = self.feed.routers(
            now, frozenset((ROUTER_POD,)), [(ROUTER_POD, router_page)], window_seconds
        )
        assert not failed, failed
        return observation(
            now, interval_seconds, readings["prefill"], readings["decode"], router, kv_capacity_tokens
        )
