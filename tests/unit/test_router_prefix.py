"""The router's pod choice on prefixes and its route costs: the scheduling core (prefix.py, the scheduler's
pick, costs.py, the decider) and the engine-load parse."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from inferencepool.router.engine_load import parse_engine_load
from inferencepool.router.pods import Pod, PodSet, PodSpec
from inferencepool.scheduling.costs import PrefillSpeed, route_costs
from inferencepool.scheduling.decider import Route, RouteReason
from inferencepool.scheduling.decider import decide as choose_route_by_cost
from inferencepool.scheduling.prefix import PrefixIndex, prompt_keys
from inferencepool.scheduling.scheduler import Scheduler, SchedulerConfig

BLOCK = 8  # bytes per block in these tests


def keys(text: str) -> list[int]:
    return prompt_keys(text.encode(), BLOCK, 1024)


SCHEDULER = Scheduler(SchedulerConfig("Colocated", 1.0, 0.05, load_factor=1.25, min_load_bound=2))


def decode_pods(count: int = 4, index_blocks: int = 10_000) -> PodSet:
    pods = PodSet(load_factor=1.25, min_load_bound=2, index_blocks=index_blocks)
    pods.apply(PodSpec(f"decode-{i}", f"http://d{i}:8000", "decode") for i in range(count))
    return pods


def choose(pods: PodSet, prompt: list[int]) -> tuple[Pod | None, int]:
    """The decode pod the scheduling core picks for the prompt, and its cached prefix in blocks."""
    tokens = (len(prompt) + 1) * SCHEDULER.config.block_tokens  # whole blocks and a tail
    return SCHEDULER.pick(pods.available("decode", 0.0), tokens, prompt, pods.prefixes)


def serve(pods: PodSet, text: str) -> str:
    """Schedule a prompt as the router does (which records it on the chosen pod)."""
    decision = SCHEDULER.schedule(len(text) // BLOCK, keys(text), pods, 0.0, 4096)
    assert decision.decode is not None
    return decision.decode.name


SYSTEM = "S" * (2 * BLOCK)  # a two-block system prompt, shorter than the 4-block anchor
LONG_SHARED = "L" * (10 * BLOCK)  # ten shared blocks


def test_prompt_keys_are_chained_whole_blocks_and_the_same_in_every_process() -> None:
    a = keys("x" * 20)  # two whole blocks, the rest ignored
    assert len(a) == 2 and keys("x" * 24 + "tail")[:2] == a
    assert keys("y" + "x" * 23)[1] != keys("z" + "x" * 23)[1]  # a key depends on every block before it
    code = (
        "from inferencepool.scheduling.prefix import prompt_keys; print(prompt_keys(b'abcdefgh' * 3, 8, 9))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert outputs == {f"{prompt_keys(b'abcdefgh' * 3, 8, 9)}\n"}


def test_a_shared_system_prompt_spreads_over_the_pods() -> None:
    pods = decode_pods()
    served = Counter(serve(pods, SYSTEM + f"q{i:03d} asks a question " * 3) for i in range(40))
    assert len(served) == 4 and max(served.values()) <= 20, served


def test_a_long_shared_prefix_keeps_requests_together() -> None:
    pods = decode_pods()
    served = {serve(pods, LONG_SHARED + f"turn {i}") for i in range(20)}
    assert len(served) == 1


def test_the_pod_holding_the_longest_prefix_wins_over_the_rendezvous_pick() -> None:
    pods = decode_pods()
    prompt = keys(LONG_SHARED + "the next turn")
    home, _ = choose(pods, prompt)
    assert home is not None
    other = next(p for p in pods.pods.values() if p is not home)
    pods.prefixes.sent(other.name, keys(LONG_SHARED))  # e.g. an earlier turn overflowed there
    chosen, cached = choose(pods, prompt)
    assert chosen is other and cached == 10
    pods.prefixes.sent(home.name, prompt[:3])  # three blocks: shorter than the anchor, not a reason
    assert choose(pods, prompt)[0] is other


def test_the_load_bound_moves_a_hot_prefix_and_kv_full_pods_sit_out() -> None:
    pods = decode_pods()
    prompt = keys(LONG_SHARED)
    home, _ = choose(pods, prompt)
    assert home is not None
    home.outstanding = 3  # bound max(ceil(1.25 x 4 / 4), 2) = 2: the home pod is full
    moved, _ = choose(pods, prompt)
    assert moved is not None and moved is not home
    home.outstanding = 0
    home.engine_running, home.engine_waiting = 2, 1  # the engine sees other replicas' requests
    assert choose(pods, prompt)[0] is moved
    home.engine_running = home.engine_waiting = 0
    assert choose(pods, prompt)[0] is home
    home.kv_usage, home.engine_waiting = 0.99, 1  # KV full with a queue (and 1 waiting is under the bound)
    assert choose(pods, prompt)[0] is not home


def test_two_replicas_with_their_own_indexes_choose_the_same_pods() -> None:
    first, second = decode_pods(), decode_pods()
    prefixes = [f"conversation {c} " * 8 for c in range(12)]
    on_first = [serve(first, prefix + "turn one") for prefix in prefixes]
    for prefix in prefixes:  # the other replica sees other prompts first: its index differs
        serve(second, SYSTEM + prefix)
    on_second = [serve(second, prefix + "turn two, through the other replica") for prefix in prefixes]
    assert on_first == on_second
    assert len(set(on_first)) > 1


def test_the_index_stays_bounded_over_many_distinct_prompts() -> None:
    pods = decode_pods(index_blocks=500)
    for i in range(20_000):
        serve(pods, f"distinct prompt {i:06d} " * 2)
    assert pods.prefixes.size() <= 4 * 500
    pods.apply([PodSpec("decode-0", "http://d0:8000", "decode")])  # pods that go are forgotten
    assert pods.prefixes.size() <= 500


def test_no_whole_block_picks_by_load() -> None:
    pods = decode_pods()
    pods.pods["decode-2"].outstanding = 0
    for name in ("decode-0", "decode-1", "decode-3"):
        pods.pods[name].outstanding = 5
    assert choose(pods, keys("short"))[0] is pods.pods["decode-2"]
    assert PrefixIndex(3).cached_blocks("anyone", [1, 2]) == 0


def test_route_costs_have_no_bypass_until_the_prefill_speed_is_known() -> None:
    pods = PodSet()
    pods.apply([PodSpec("p", "http://p:1", "prefill"), PodSpec("d", "http://d:1", "decode")])
    prefill, decode = pods.pods["p"], pods.pods["d"]
    prefill.queued_tokens = 100_000
    speed = PrefillSpeed()
    costs = route_costs(speed, 8000, prefill, decode, 1.0, 0.05)
    assert costs.ttft_target_seconds is None and costs.prefill_queue_seconds == 0
    assert choose_route_by_cost("LengthAware", costs, 4096, True, 8000) == (
        Route.DISAGGREGATED,
        RouteReason.LONG,
    )
    speed.observe_leg(0.08, 8000)  # 10 us a token
    costs = route_costs(speed, 8000, prefill, decode, 1.0, 0.05)
    assert costs.prefill_queue_seconds == pytest.approx(1.0)
    assert choose_route_by_cost("LengthAware", costs, 4096, True, 8000) == (
        Route.DIRECT,
        RouteReason.PREFILL_BUSY,
    )
    decode.engine_running = 3  # decodes running there: an 80 ms prefill would stall them past 50 ms
    costs = route_costs(speed, 8000, prefill, decode, 1.0, 0.05)
    assert not costs.decode_has_room
    assert choose_route_by_cost("LengthAware", costs, 4096, True, 8000)[1] is RouteReason.LONG
    short = route_costs(speed, 4100, prefill, decode, 1.0, 0.05)  # a 41 ms prefill stalls them less
    assert short.decode_has_room
    assert choose_route_by_cost("LengthAware", short, 4096, True, 4100)[1] is RouteReason.PREFILL_BUSY
    decode.engine_running = 0
    decode.queued_tokens = 100_000  # both pools queue: the length decides
    costs = route_costs(speed, 8000, prefill, decode, 1.0, 0.05)
    assert choose_route_by_cost("LengthAware", costs, 4096, True, 8000)[1] is RouteReason.LONG
    prefill.queued_tokens, decode.queued_tokens = 0, 0
    decode.engine_waiting = 40  # another replica's queue, seen by the engine, at the mean prompt size
    speed.observe_prompt(3000)
    costs = route_costs(speed, 3000, prefill, decode, 1.0, 0.05)
    assert costs.decode_queue_seconds == pytest.approx(40 * 3000 * 1e-5)
    assert choose_route_by_cost("LengthAware", costs, 4096, True, 3000) == (
        Route.DISAGGREGATED,
        RouteReason.DECODE_BUSY,
    )


def test_a_slow_kv_transfer_counts_against_the_prefill_route() -> None:
    pods = PodSet()
    pods.apply([PodSpec("p", "http://p:1", "prefill"), PodSpec("d", "http://d:1", "decode")])
    speed = PrefillSpeed()
    speed.observe_leg(0.05, 5000)  # 10 us a prompt token
    fast = route_costs(speed, 8000, pods.pods["p"], pods.pods["d"], 0.5, 0.05)
    assert choose_route_by_cost("LengthAware", fast, 4096, True, 8000)[1] is RouteReason.LONG
    speed.observe_transfer(0.5, 8000)  # a slow link: 62.5 us a token to move
    slow = route_costs(speed, 8000, pods.pods["p"], pods.pods["d"], 0.5, 0.05)
    assert slow.transfer_seconds == pytest.approx(0.5)
    assert choose_route_by_cost("LengthAware", slow, 4096, True, 8000) == (
        Route.DIRECT,
        RouteReason.PREFILL_BUSY,
    )


@pytest.mark.parametrize(
    ("policy", "uncached", "prompt", "ready", "expected"),
    [
        ("LengthAware", 100, 100, True, (Route.DIRECT, RouteReason.SHORT)),
        ("LengthAware", 100, 9000, True, (Route.DIRECT, RouteReason.CACHED)),
        ("LengthAware", 9000, 9000, True, (Route.DISAGGREGATED, RouteReason.LONG)),
        ("LengthAware", 9000, 9000, False, (Route.FALLBACK, RouteReason.NO_PREFILL_POD)),
        ("Colocated", 9000, 9000, True, (Route.DIRECT, RouteReason.POLICY)),
        ("AlwaysDisaggregate", 10, 10, True, (Route.DISAGGREGATED, RouteReason.POLICY)),
        ("AlwaysDisaggregate", 10, 10, False, (Route.FALLBACK, RouteReason.NO_PREFILL_POD)),
    ],
)
def test_routes_and_reasons_without_load(
    policy: str, uncached: int, prompt: int, ready: bool, expected: tuple[Route, RouteReason]
) -> None:
    costs = route_costs(PrefillSpeed(), uncached, None, None, 1.0, 0.05)
    assert choose_route_by_cost(policy, costs, 4096, ready, prompt) == expected  # type: ignore[arg-type]


def test_engine_load_is_read_from_the_three_gauges() -> None:
    page = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 12345.0
"""
    assert parse_engine_load(page) == (5, 7, 0.5)
    assert parse_engine_load(b"# nothing here\nother_metric 1\n") is None
