"""Route choice, pod choice and the adaptive threshold: the router's pure core."""

from __future__ import annotations

import pytest

from inferencepool.router.config import AdaptiveThresholdConfig
from inferencepool.router.pods import PodSet, PodSpec
from inferencepool.router.threshold import SampleWindow, adapt, next_threshold, percentile


def _pods(*names: str, role: str = "decode") -> PodSet:
    pods = PodSet(load_factor=1.25, virtual_nodes=32, min_load_bound=2)
    pods.apply(PodSpec(name=n, url=f"http://{n}:8000", role=role) for n in names)  # type: ignore[arg-type]
    return pods


def test_least_outstanding_wins() -> None:
    pods = _pods("a", "b", "c")
    pods.pods["a"].outstanding = 3
    pods.pods["b"].outstanding = 1
    pods.pods["c"].outstanding = 2
    assert pods.pick("decode", now=0).name == "b"  # type: ignore[union-attr]


def test_ties_rotate_so_an_idle_pool_spreads_requests() -> None:
    pods = _pods("a", "b", "c")
    picked = {pods.pick("decode", now=0).name for _ in range(6)}  # type: ignore[union-attr]
    assert picked == {"a", "b", "c"}


def test_not_ready_terminating_and_vanished_pods_get_nothing_new() -> None:
    pods = PodSet()
    pods.apply(
        [
            PodSpec("ready", "http://r:1", "decode"),
            PodSpec("starting", "http://s:1", "decode", ready=False),
            PodSpec("leaving", "http://l:1", "decode", terminating=True),
        ]
    )
    assert {pods.pick("decode", now=0).name for _ in range(5)} == {"ready"}  # type: ignore[union-attr]
    ready = pods.pods["ready"]
    ready.outstanding = 2
    pods.apply([PodSpec("other", "http://o:1", "decode")])
    assert not ready.accepts_new and ready.outstanding == 2  # in-flight work is still counted
    assert pods.pick("decode", now=0).name == "other"  # type: ignore[union-attr]


def test_snapshot_keeps_counters_of_pods_that_stay() -> None:
    pods = _pods("a", "b")
    pods.pods["a"].outstanding = 5
    pods.apply(
        [PodSpec("a", "http://a:8000", "decode", ready=False), PodSpec("b", "http://b:8000", "decode")]
    )
    assert pods.pods["a"].outstanding == 5 and not pods.pods["a"].accepts_new


def test_failed_pod_sits_out_its_cooldown_unless_it_is_the_last() -> None:
    pods = _pods("a", "b")
    pods.pods["a"].record_failure(now=100.0)
    assert {pods.pick("decode", now=100.5).name for _ in range(4)} == {"b"}  # type: ignore[union-attr]
    assert "a" in {pods.pick("decode", now=102.0).name for _ in range(4)}  # type: ignore[union-attr]
    pods.pods["b"].ready = False
    assert pods.pick("decode", now=100.5).name == "a"  # type: ignore[union-attr]


def test_exclude_skips_pods_already_tried() -> None:
    pods = _pods("a", "b")
    assert pods.pick("decode", now=0, exclude=frozenset({"a"})).name == "b"  # type: ignore[union-attr]
    assert pods.pick("decode", now=0, exclude=frozenset({"a", "b"})) is None
    assert pods.pick("prefill", now=0) is None


def test_prefix_affinity_is_sticky_and_spreads_keys() -> None:
    pods = _pods(*(f"pod-{i}" for i in range(4)))
    owners = {key: pods.pick("decode", now=0, affinity_key=key).name for key in range(0, 2**64, 2**58)}  # type: ignore[union-attr]
    assert len(set(owners.values())) == 4  # keys spread over every pod
    for key, owner in owners.items():
        assert pods.pick("decode", now=0, affinity_key=key).name == owner  # type: ignore[union-attr]


def test_prefix_affinity_survives_an_unrelated_pod_leaving() -> None:
    pods = _pods("a", "b", "c", "d")
    keys = range(0, 2**64, 2**57)
    before = {key: pods.pick("decode", now=0, affinity_key=key).name for key in keys}  # type: ignore[union-attr]
    pods.apply(PodSpec(name=n, url=f"http://{n}:8000", role="decode") for n in ("a", "b", "c"))
    after = {key: pods.pick("decode", now=0, affinity_key=key).name for key in keys}  # type: ignore[union-attr]
    moved = [key for key in keys if before[key] != after[key]]
    assert all(before[key] == "d" for key in moved)  # only the departed pod's keys move


def test_prefix_affinity_yields_to_the_load_bound() -> None:
    pods = _pods("a", "b", "c", "d")
    key = 12345
    owner = pods.pick("decode", now=0, affinity_key=key)
    assert owner is not None
    owner.outstanding = 4  # bound max(ceil(1.25*(4+1)/4), 2) = 2: the owner is skipped
    other = pods.pick("decode", now=0, affinity_key=key)
    assert other is not None and other is not owner
    owner.outstanding = 1  # under the minimum bound: affinity holds although others are idle
    assert pods.pick("decode", now=0, affinity_key=key) is owner
    for pod in pods.pods.values():
        pod.outstanding = 6  # bound ceil(1.25*25/4) = 8: all equal, the owner keeps its keys
    assert pods.pick("decode", now=0, affinity_key=key) is owner


def test_percentile_is_nearest_rank() -> None:
    assert percentile([5, 1, 4, 2, 3], 50) == 3
    assert percentile(range(1, 101), 90) == 90
    with pytest.raises(ValueError):
        percentile([], 90)


def test_sample_window_keeps_the_latest_and_empties_once_used() -> None:
    window = SampleWindow(capacity=3)
    for value in range(5):
        window.add(value)
    assert window.recent() == [2, 3, 4]
    window.next_round(consumed=True)
    assert window.recent() == []


def test_unused_samples_wait_a_few_intervals_for_company_then_expire() -> None:
    window = SampleWindow(keep_rounds=3)
    window.add(1.0)
    window.next_round(consumed=False)
    window.add(2.0)
    window.next_round(consumed=False)
    assert window.recent() == [1.0, 2.0]
    window.next_round(consumed=False)
    assert window.recent() == [2.0]  # the first is 3 intervals old now


ADAPT = AdaptiveThresholdConfig(
    enabled=True,
    min_tokens=1000,
    max_tokens=8000,
    step_percent=50,
    ttft_target_milliseconds=100,
    itl_target_milliseconds=20,
    min_samples=5,
)


def _decide(current: int, prefill_s: float, itl_s: float, n: int = 10, base: int = 4000) -> int:
    return next_threshold(current, base, ADAPT, [prefill_s] * n, [itl_s] * n).threshold


def test_threshold_rises_when_prefill_queues_and_decode_has_headroom() -> None:
    assert _decide(4000, prefill_s=0.3, itl_s=0.005) == 6000
    assert _decide(6000, prefill_s=0.3, itl_s=0.005) == 8000  # clamped to maxTokens


def test_threshold_falls_when_decode_is_slow_and_prefill_has_headroom() -> None:
    assert _decide(4000, prefill_s=0.01, itl_s=0.05) == 2666
    assert _decide(1200, prefill_s=0.01, itl_s=0.05) == 1000  # clamped to minTokens


def test_threshold_holds_when_both_pools_are_over_target_or_samples_are_few() -> None:
    assert _decide(4000, prefill_s=0.3, itl_s=0.05) == 4000
    assert _decide(4000, prefill_s=0.3, itl_s=0.005, n=2) == 4000


def test_threshold_returns_toward_base_when_both_pools_are_comfortable() -> None:
    assert _decide(8000, prefill_s=0.01, itl_s=0.005) == 5333
    assert _decide(4500, prefill_s=0.01, itl_s=0.005) == 4000
    assert _decide(1000, prefill_s=0.01, itl_s=0.005) == 1500


def test_a_quiet_prefill_signal_is_judged_once_enough_samples_gathered_over_intervals() -> None:
    """Few long prompts: 2 prefill legs per interval, 5 needed. The old per-interval window never decided."""
    prefill, itl = SampleWindow(), SampleWindow()
    threshold, reasons = 4000, []
    for _ in range(3):
        for _ in range(2):
            prefill.add(0.5)  # 5x the TTFT target: prefill queues
        for _ in range(50):
            itl.add(0.005)  # decode has headroom
        decision = adapt(threshold, 4000, ADAPT, prefill, itl)
        threshold = decision.threshold
        reasons.append(decision.judged)
    assert reasons == [False, False, True] and threshold == 6000
    assert prefill.recent() == [] and itl.recent() == []  # used: the next interval judges fresh load
