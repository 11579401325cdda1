"""The router's arrival windows: prompt tokens per fixed window, by pool, as a Prometheus histogram of the
windows' totals (what the planner's burst hold reads)."""

from __future__ import annotations

import math

from prometheus_client import generate_latest

from inferencepool.autoscaler.histogram import parse_page, read_histogram
from inferencepool.router.metrics import (
    ARRIVAL_BUCKETS,
    ARRIVAL_WINDOW,
    ARRIVAL_WINDOW_SECONDS,
    LiveState,
    RouterMetrics,
    WindowTotals,
    arrival_pool,
)
from inferencepool.router.pods import PodSet
from inferencepool.scheduling.decider import Route, RouteReason


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def buckets(windows: WindowTotals) -> dict[float, float]:
    cumulative, total = windows.closed()
    assert total == windows.sum
    return {float(le): count for le, count in cumulative}


def test_windows_sum_their_arrivals_and_idle_windows_count_as_zero() -> None:
    clock = Clock(0.0)
    windows = WindowTotals(2.0, (0.0, 100.0, 200.0), clock)
    for at, tokens in ((0.5, 100), (1.9, 50), (2.1, 30), (9.0, 10)):
        clock.now = at
        windows.add(tokens)
    # ended by 9 s: [0, 2) 150, [2, 4) 30, [4, 6) and [6, 8) idle; [8, 10) still open
    assert buckets(windows) == {0.0: 2, 100.0: 3, 200.0: 4, math.inf: 4}
    assert windows.sum == 180
    clock.now = 10.0  # a scrape at the window's end closes it, with no arrival to do it
    assert buckets(windows) == {0.0: 2, 100.0: 4, 200.0: 5, math.inf: 5}
    clock.now = 31.0  # an idle stretch: one window each 2 s, all 0
    assert buckets(windows)[0.0] == 2 + 10
    clock.now = 31.5
    windows.add(1000)
    clock.now = 32.0
    assert buckets(windows) == {0.0: 12, 100.0: 14, 200.0: 15, math.inf: 16}
    assert windows.sum == 1190


def test_a_prompt_is_demand_for_the_pool_whose_prefill_it_needs() -> None:
    assert arrival_pool(Route.DIRECT, RouteReason.SHORT) == "direct"
    assert arrival_pool(Route.DIRECT, RouteReason.PREFILL_BUSY) == "prefill"  # as the feed counts it
    assert arrival_pool(Route.DISAGGREGATED, RouteReason.LONG) == "prefill"
    assert arrival_pool(Route.FALLBACK, RouteReason.NO_PREFILL_POD) == "prefill"
    assert (
        arrival_pool(Route.LENT, RouteReason.DECODE_SATURATED) == "direct"
    )  # decode demand, as the feed counts it


def test_the_router_s_page_shows_the_windows_by_pool() -> None:
    clock = Clock(100.0)
    state = LiveState(PodSet(), lambda: 2048, lambda: "estimate", lambda: "", lambda: 4.0, dict)
    metrics = RouterMetrics(state, clock)
    metrics.arrived(Route.DISAGGREGATED, RouteReason.LONG, 8000)
    metrics.arrived(Route.DIRECT, RouteReason.SHORT, 300)
    clock.now = 100.0 + 3 * ARRIVAL_WINDOW_SECONDS
    page = parse_page(generate_latest(metrics.registry).decode())
    for pool, tokens in (("prefill", 8000), ("direct", 300)):
        samples = [s for s in page[ARRIVAL_WINDOW] if s[1].get("pool") == pool]
        windows = read_histogram({ARRIVAL_WINDOW: samples}, ARRIVAL_WINDOW)
        assert windows is not None and windows.bounds == (*ARRIVAL_BUCKETS, math.inf)
        assert windows.count == 3 and windows.sum == tokens  # one busy window, two idle
        assert windows.counts[0] == 2
