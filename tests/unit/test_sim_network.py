"""KV transfers over shared links: one alone takes the profile's figure, concurrent ones share the links they
cross max-min fairly, and a slow or busy link lands on the TTFT of disaggregated requests."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferencepool.perf import timing
from inferencepool.perf.profiles import get_profile
from inferencepool.sim import workload
from inferencepool.sim.cluster import Scenario, simulate
from inferencepool.sim.network import Network
from inferencepool.sim.report import Slo
from inferencepool.sim.search import attainment
from inferencepool.sim.workload import TraceRequest

H100 = get_profile("llama-3.1-8b-h100")
GB = 1e9


def run_until_empty(network: Network) -> dict[str, float]:
    ends: dict[str, float] = {}
    while (end := network.next_end()) is not None:
        for key in network.advance(end):
            ends[key] = end
    return ends


def test_one_transfer_alone_takes_latency_plus_bytes_over_the_link() -> None:
    network = Network(latency_s=0.002)
    network.add_link("send:p", 10 * GB)
    network.add_link("recv:d", 10 * GB)
    network.start(1.0, "a", ("send:p", "recv:d"), 5 * GB)
    assert run_until_empty(network) == {"a": pytest.approx(1.0 + 0.5 + 0.002)}


def test_concurrent_transfers_share_a_link_and_the_rest_goes_to_others() -> None:
    network = Network(latency_s=0.0)
    for name in ("send:p0", "send:p1", "recv:d0", "recv:d1"):
        network.add_link(name, 10 * GB)
    network.start(0.0, "a", ("send:p0", "recv:d0"), 10 * GB)  # a and b share d0's receive link
    network.start(0.0, "b", ("send:p1", "recv:d0"), 10 * GB)
    network.start(0.0, "c", ("send:p1", "recv:d1"), 10 * GB)  # c shares p1's send link with b
    ends = run_until_empty(network)
    # d0 splits 5/5 between a and b; p1 then has 5 left for c; once a and b finish (2 s), c has the link
    assert ends["a"] == pytest.approx(2.0) and ends["b"] == pytest.approx(2.0)
    assert ends["c"] == pytest.approx(2.0)  # 5 GB/s for 2 s = 10 GB
    network.start(3.0, "d", ("send:p0", "recv:d0"), 10 * GB)
    network.start(3.5, "e", ("send:p0", "recv:d1"), 10 * GB)
    ends = run_until_empty(network)
    # d alone for 0.5 s (5 GB), then 5 GB/s each: d needs 1 s more, e then gets the full link
    assert ends["d"] == pytest.approx(4.5) and ends["e"] == pytest.approx(4.5 + 0.5)


def test_bad_links_are_named() -> None:
    network = Network(latency_s=0.0)
    with pytest.raises(ValueError, match="link x: capacity must be > 0"):
        network.add_link("x", 0)
    with pytest.raises(ValueError, match="unknown link"):
        network.start(0.0, "a", ("nowhere",), 1.0)


def test_two_prompts_read_at_once_by_one_decode_pod_share_its_link() -> None:
    prompt = 16000
    # without prefix affinity the router spreads the two prompts by load: one on each prefill pod
    pd = Scenario("pd", "AlwaysDisaggregate", 2, 1, prefix_affinity=False)
    alone = simulate(pd, H100, [TraceRequest(0.0, prompt, 2)])
    both = simulate(
        pd,
        H100,
        [TraceRequest(0.0, prompt, 2), TraceRequest(0.0, prompt + 1, 2)],
    )
    transfer = timing.nixl_transfer_time(H100, prompt)
    [single] = alone.records
    # the two prefills run in parallel on two prefill pods, then both KV caches cross the one receive link
    assert min(r.ttft or 0 for r in both.records) > (single.ttft or 0) + 0.8 * (transfer - 0.002)


def test_a_slow_link_makes_disaggregation_lose() -> None:
    trace = [TraceRequest(0.0, 8000, 20)] + [TraceRequest(5 + i * 0.5, 8000, 20) for i in range(20)]
    fast = simulate(Scenario("pd", "AlwaysDisaggregate", 1, 1), H100, trace)
    slow = simulate(Scenario("pd", "AlwaysDisaggregate", 1, 1), H100, trace, kv_link_bytes_per_s=1.25 * GB)
    expected = timing.kv_transfer_time(H100, 8000, 1.25 * GB) - timing.nixl_transfer_time(H100, 8000)
    # the first request's transfer is alone on the link: exactly the slower link's extra time
    assert (slow.records[0].ttft or 0) - (fast.records[0].ttft or 0) == pytest.approx(expected)
    # later ones overlap (a 0.84 s transfer every 0.5 s) and share the link: worse than alone
    assert max(r.ttft or 0 for r in slow.records) > (fast.records[0].ttft or 0) + 1.2 * expected


def test_small_decode_chunks_protect_the_decodes_beside_a_long_prompt() -> None:
    """Chunked-prefill interference on a colocated engine, and its cure: a smaller prefill chunk."""
    decodes = [TraceRequest(0.0 + 0.01 * i, 500, 400) for i in range(8)]
    trace = [*decodes, TraceRequest(1.0, 30000, 2)]
    stall: dict[int, float] = {}
    ttft: dict[int, float] = {}
    for chunk in (8192, 512):
        result = simulate(Scenario("co", "Colocated", 0, 1, decode_chunk_tokens=chunk), H100, trace)
        stall[chunk] = max(result.itl_gaps)  # the worst gap a co-running decode saw
        ttft[chunk] = result.records[-1].ttft or 0
    assert stall[8192] > 0.2 and stall[512] < 0.1 * stall[8192]
    assert ttft[512] > ttft[8192]  # the price: the long prompt itself prefills in more, smaller steps
    with pytest.raises(ValueError, match="prefill chunk must be >= 1"):
        Scenario("co", "Colocated", 0, 1, decode_chunk_tokens=0)


def test_disaggregation_pays_on_a_fast_link_and_stops_paying_on_a_slow_one() -> None:
    """Azure conversations at 12x their rate, ITL 25 ms: 2 prefill + 2 decode pods beat 4 colocated ones on a
    40 GB/s link; at 1 GB/s every prompt's KV waits on the link and the P/D pool loses to colocated. (At 11x
    the colocated pool, its pod choice weighing the prefill queued on each pod, holds 95.5% against 100%.)"""
    trace = workload.shape(workload.load("azure-conv"), duration=300, rate=12)
    slo = Slo(0.8, 0.025)
    colocated = attainment(simulate(Scenario("co", "Colocated", 0, 4), H100, trace), slo)
    pd = Scenario("pd", "AlwaysDisaggregate", 2, 2)
    fast = attainment(simulate(pd, H100, trace), slo)
    slow = attainment(simulate(pd, H100, trace, kv_link_bytes_per_s=1 * GB), slo)
    assert fast > colocated + 0.05
    assert slow < colocated - 0.5


def test_the_backlog_of_a_link_is_what_its_transfers_still_have_to_move() -> None:
    network = Network(latency_s=0.0)
    for name in ("send:p", "recv:d0", "recv:d1"):
        network.add_link(name, 10 * GB)
    network.start(0.0, "a", ("send:p", "recv:d0"), 10 * GB)
    network.start(0.0, "b", ("send:p", "recv:d1"), 10 * GB)  # 5 GB/s each over p's send link
    assert network.backlog("send:p", 0.0) == pytest.approx(20 * GB)
    assert network.backlog("send:p", 1.0) == pytest.approx(10 * GB)
    assert network.backlog("recv:d1", 1.0) == pytest.approx(5 * GB)
    network.advance(2.0)
    assert network.backlog("send:p", 2.0) == 0


def test_the_router_learns_a_slow_link_and_prefills_on_decode_pods() -> None:
    """The router times KV transfers (`PrefillSpeed.observe_transfer`); on a slow link the prefill route
    misses the TTFT target and long prompts are prefilled where they decode (an ITL target of 100 ms leaves
    the decode pods room for a prefill beside their streams)."""
    scenario = Scenario(
        "pd",
        "LengthAware",
        2,
        2,
        512,
        ttft_target_seconds=0.8,
        itl_target_seconds=0.1,
        chunk_itl_seconds=0.025,
    )
    # The router's scrape of engine load off: a decode engine reports the requests waiting for their KV among
    # its waiting ones, which the router reads as prefill work queued there (`PrefillSpeed.queue_tokens`), so
    # on a slow link the decode pods look busy and the bypass goes the other way (decode_busy).
    router = scenario.router_config().model_copy(update={"engine_metrics_interval_milliseconds": 0})
    scenario = replace(scenario, router=router)
    trace = workload.shape(workload.load("azure-conv"), duration=120, rate=8)
    direct = {}
    for link in (40 * GB, 0.5 * GB):
        result = simulate(scenario, H100, trace, kv_link_bytes_per_s=link)
        direct[link] = sum(r.route == "direct" for r in result.records) / len(result.records)
    assert direct[0.5 * GB] > direct[40 * GB] + 0.2
