"""Routing on uncached tokens with load-aware bypass (the decider), the router's prefix index, and what
they do in the simulator: a shared system prompt spreads, a long shared prefix stays together."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from inferencepool.perf.profiles import get_profile
from inferencepool.router.config import RouterConfig
from inferencepool.router.pods import PodSpec
from inferencepool.scheduling.costs import RouteCosts
from inferencepool.scheduling.decider import Route, RouteReason
from inferencepool.scheduling.decider import decide as choose_route_by_cost
from inferencepool.scheduling.prefix import PrefixIndex, prompt_keys
from inferencepool.sim.cluster import Scenario, simulate
from inferencepool.sim.router import SimRouter
from inferencepool.sim.workload import TraceRequest

H100 = get_profile("llama-3.1-8b-h100")


def costs(
    uncached: int, prefill_queue: float = 0.0, decode_queue: float = 0.0, transfer: float = 0.02
) -> RouteCosts:
    return RouteCosts(
        uncached_tokens=uncached,
        prefill_seconds=uncached * 3e-5,
        prefill_queue_seconds=prefill_queue,
        decode_queue_seconds=decode_queue,
        transfer_seconds=transfer,
        ttft_target_seconds=1.0,
    )


@pytest.mark.parametrize(
    ("prompt", "cost", "ready", "expected"),
    [
        (8000, costs(8000), True, (Route.DISAGGREGATED, RouteReason.LONG)),
        (8000, costs(500), True, (Route.DIRECT, RouteReason.CACHED)),  # long prompt, prefix cached
        (1000, costs(1000), True, (Route.DIRECT, RouteReason.SHORT)),
        (8000, costs(8000, prefill_queue=2.0), True, (Route.DIRECT, RouteReason.PREFILL_BUSY)),
        (
            8000,
            costs(8000, prefill_queue=2.0, decode_queue=2.0),
            True,
            (Route.DISAGGREGATED, RouteReason.LONG),
        ),
        (3000, costs(3000, decode_queue=1.5), True, (Route.DISAGGREGATED, RouteReason.DECODE_BUSY)),
        (500, costs(500, decode_queue=1.5), True, (Route.DIRECT, RouteReason.SHORT)),  # too short to move
        (2000, costs(2000, decode_queue=0.1), True, (Route.DISAGGREGATED, RouteReason.PREFILL_IDLE)),
        # an idle prefill pod behind a slow KV link: the transfer alone would miss the TTFT target
        (2000, costs(2000, decode_queue=0.1, transfer=1.2), True, (Route.DIRECT, RouteReason.SHORT)),
        (2000, costs(2000, prefill_queue=0.1, decode_queue=0.1), True, (Route.DIRECT, RouteReason.SHORT)),
        (2000, costs(2000), True, (Route.DIRECT, RouteReason.SHORT)),  # both idle: no transfer
        (8000, costs(8000), False, (Route.FALLBACK, RouteReason.NO_PREFILL_POD)),
    ],
)
def test_route_by_cost(
    prompt: int, cost: RouteCosts, ready: bool, expected: tuple[Route, RouteReason]
) -> None:
    assert choose_route_by_cost("LengthAware", cost, 4096, ready, prompt) == expected


def test_route_by_cost_keeps_the_fixed_policies() -> None:
    assert choose_route_by_cost("Colocated", costs(9000), 4096, True, 9000) == (
        Route.DIRECT,
        RouteReason.POLICY,
    )
    assert choose_route_by_cost("AlwaysDisaggregate", costs(10), 4096, True, 10)[0] is Route.DISAGGREGATED


def test_prefix_index_counts_leading_blocks_and_forgets_the_oldest() -> None:
    index = PrefixIndex(capacity_blocks=4)
    a, b = prompt_keys(b"abc", 1, 9), prompt_keys(b"abz", 1, 9)
    index.sent("p", a)
    assert index.cached_blocks("p", b) == 2 and index.cached_blocks("p", a) == 3
    assert index.cached_blocks("q", a) == 0
    assert prompt_keys(b"xb", 1, 9)[1] != prompt_keys(b"yb", 1, 9)[1]  # a key depends on what came before
    index.sent("p", prompt_keys(b"gh", 1, 9))  # 5 keys > 4: the oldest (block 1's) goes
    assert index.cached_blocks("p", a) == 0


def test_system_prompt_spreads_and_long_shared_prefix_stays_together() -> None:
    # 40 conversations share a 1-block system prompt; conversation c's turns share 16 more blocks
    trace = [
        TraceRequest(turn * 5.0 + c * 0.1, 17 * 512, 20, (0, *range(1000 * (c + 1), 1000 * (c + 1) + 16)))
        for turn in range(3)
        for c in range(40)
    ]
    trace.sort(key=lambda r: r.arrival)
    longest = simulate(Scenario("long", "Colocated", 0, 4), H100, trace)
    first_turns = [r.decode_pod for r in longest.records[:40]]
    # the system prompt alone does not pin everything to one pod
    assert len(set(first_turns)) >= 3 and max(first_turns.count(p) for p in set(first_turns)) <= 20
    by_conversation: dict[int, set[str | None]] = {}
    for record, request in zip(longest.records, trace, strict=True):
        by_conversation.setdefault(request.block_ids[1], set()).add(record.decode_pod)
    together = sum(len(pods) == 1 for pods in by_conversation.values())
    assert together >= 30  # later turns find the pod that holds their conversation


def test_the_simulated_router_reads_engine_load_as_the_live_one_scrapes_it() -> None:
    """A scrape sets each pod's engine figures (`SimRouter.scrape`): a pod whose KV is full with requests
    waiting sits out, and a pod's load is the larger of its own count and the engine's."""

    @dataclass
    class Core:
        num_running: int
        num_waiting: int
        kv_usage: float

    @dataclass
    class Engine:
        name: str
        core: Core

    config = RouterConfig.model_validate({"static": {"prefill": [], "decode": []}, "policy": "Colocated"})
    router = SimRouter(config)
    router.pods.apply(PodSpec(f"decode-{i}", f"http://d{i}", "decode") for i in range(2))
    router.scrape(
        [
            Engine("decode-0", Core(3, 2, 0.99)),
            Engine("decode-1", Core(1, 0, 0.5)),
            Engine("gone", Core(0, 0, 0)),
        ]
    )
    full, other = router.pods.pods["decode-0"], router.pods.pods["decode-1"]
    assert full.kv_full and full.load == 5 and not other.kv_full and other.load == 1
    keys = router.keys(list(range(5000)))
    assert keys and all(router.decide(5000, keys, 0.0, 4096).decode is other for _ in range(3))
