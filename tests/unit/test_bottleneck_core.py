"""The diagnosis' pure core: crafted windows of a pool's measurements give the verdict and advice that fit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from tests.support.histograms import histogram

from inferencepool.autoscaler.histogram import Histogram
from inferencepool.autoscaler.planner import RolePlan
from inferencepool.bottleneck.core import (
    Diagnosis,
    WhatIfRow,
    diagnose,
    threshold_for_share,
    token_share_above,
    with_what_if,
)
from inferencepool.bottleneck.settings import EngineSettings, PoolSettings
from inferencepool.bottleneck.sizing import Sizing
from inferencepool.bottleneck.status import bottleneck_condition, bottleneck_status
from inferencepool.bottleneck.window import EngineWindow, Gauge, PoolWindow, RouterWindow
from inferencepool.engine_sim.metrics import ITL_BUCKETS, TTFT_BUCKETS
from inferencepool.router.metrics import PROMPT_BUCKETS

SECONDS = 60.0


def spread(low: float, high: float, n: int) -> list[float]:
    return [low + (high - low) * i / max(n - 1, 1) for i in range(n)]


def ttft(values: Sequence[float]) -> Histogram:
    return histogram(values, TTFT_BUCKETS)


def itl(values: Sequence[float]) -> Histogram:
    return histogram(values, ITL_BUCKETS)


def prompts(values: Sequence[float]) -> Histogram:
    return histogram(values, PROMPT_BUCKETS)


def engines(
    pods: int,
    *,
    first: Sequence[float] = (),
    gaps: Sequence[float] = (),
    requests: float = 0,
    prompt_tokens: float = 0,
    hits: float = 0,
    external: float = 0,
    output_tokens: float = 0,
    waiting: float = 0.0,
    running: float = 8.0,
    kv: float = 0.3,
    preemptions: float = 0,
) -> EngineWindow:
    return EngineWindow(
        pods=pods,
        ttft=ttft(first) if first else None,
        itl=itl(gaps) if gaps else None,
        counters={
            "vllm:request_success": requests,
            "vllm:prompt_tokens": prompt_tokens,
            "vllm:generation_tokens": output_tokens,
            "vllm:prefix_cache_queries": prompt_tokens,
            "vllm:prefix_cache_hits": hits,
            "vllm:external_prefix_cache_queries": prompt_tokens - hits,
            "vllm:external_prefix_cache_hits": external,
            "vllm:num_preemptions": preemptions,
        },
        waiting=Gauge(waiting, waiting * 2),
        running=Gauge(running, running * 1.5),
        kv_usage=Gauge(kv, min(1.0, kv * 1.1)),
    )


def router(
    *,
    direct: Sequence[float] = (),
    disaggregated: Sequence[float] = (),
    gaps: Sequence[float] = (),
    leg: Sequence[float] = (),
    lengths: Sequence[float] = (),
    fallbacks: float = 0,
) -> RouterWindow:
    return RouterWindow(
        pods=1,
        requests={"direct": len(direct), "disaggregated": len(disaggregated), "fallback": fallbacks},
        ttft={
            route: ttft(values)
            for route, values in (("direct", direct), ("disaggregated", disaggregated))
            if values
        },
        itl={"direct": itl(gaps)} if gaps else {},
        prefill_leg=ttft(leg) if leg else None,
        prompt_tokens=prompts(lengths),
        fallbacks={"prefill_failed": fallbacks},
        threshold_tokens=4096,
    )


PD = PoolSettings(prefill_replicas=2, decode_replicas=2, threshold_tokens=4096)
COLOCATED = PoolSettings(policy="Colocated", prefill_replicas=0, decode_replicas=4)


def kinds(diagnosis: Diagnosis) -> list[str]:
    return [advice.kind for advice in diagnosis.advice]


def prefill_bound(hit_rate: float = 0.02) -> PoolWindow:
    """Long prompts at a high rate: the prefill pool queues, streaming is fast."""
    n = 300
    lengths = spread(6000, 14000, n)
    tokens = sum(lengths)
    return PoolWindow(
        SECONDS,
        prefill=engines(
            2, first=spread(0.9, 2.6, n), requests=n, prompt_tokens=tokens, hits=hit_rate * tokens, waiting=6
        ),
        decode=engines(
            2,
            first=spread(0.02, 0.05, n),
            gaps=spread(0.008, 0.02, 5000),
            requests=n,
            prompt_tokens=tokens,
            external=tokens - n,
            output_tokens=n * 60,
            running=12,
        ),
        router=router(
            disaggregated=spread(1.0, 2.8, n),
            gaps=spread(0.008, 0.02, 5000),
            leg=spread(0.9, 2.6, n),
            lengths=lengths,
        ),
    )


def test_long_prompts_queueing_at_the_prefill_pool_are_prefill_bound() -> None:
    result = diagnose(prefill_bound(), PD)
    assert result.verdict == "Prefill"
    assert result.reason == "PrefillBound"
    assert "AddPrefillReplicas" in kinds(result)
    add = result.advice_of("AddPrefillReplicas")
    assert add is not None and add.replicas is not None and add.replicas > PD.prefill_replicas
    # The decode pool has headroom (ITL at half its target, no queue): move prefill work there.
    threshold = result.advice_of("Threshold")
    assert threshold is not None and threshold.threshold_tokens is not None
    assert threshold.threshold_tokens > PD.threshold_tokens
    assert result.recommended_threshold == threshold.threshold_tokens
    assert "PrefixReuse" not in kinds(result)  # nothing repeats: reuse would not pay
    assert any("queue 6.0 waiting/pod" in line for line in result.evidence)
    assert any(line.startswith("TTFT p50/p90/p99") and "MISSED" in line for line in result.evidence)


def test_repetitive_long_prompts_get_reuse_before_more_compute() -> None:
    result = diagnose(prefill_bound(hit_rate=0.6), PD)
    assert result.verdict == "Prefill"
    assert kinds(result)[0] == "PrefixReuse"
    assert "LMCache" in result.advice[0].text and "60%" in result.advice[0].text
    # With LMCache already on but p2p off, the advice is to share between engines instead.
    with_lmcache = diagnose(prefill_bound(0.6), replace(PD, lmcache=True, cpu_offload_gib=40))
    texts = [a.text for a in with_lmcache.advice if a.kind == "PrefixReuse"]
    assert texts and "kvCache.p2p.enabled" in texts[0]


def decode_bound() -> PoolWindow:
    """Short prompts with long outputs: big decode batches, full KV cache, slow streaming."""
    n = 400
    lengths = spread(200, 6000, n)
    direct = [x for x in lengths if x < 4096]
    disaggregated = [x for x in lengths if x >= 4096]
    return PoolWindow(
        SECONDS,
        prefill=engines(
            2,
            first=spread(0.1, 0.3, len(disaggregated)),
            requests=len(disaggregated),
            prompt_tokens=sum(disaggregated),
        ),
        decode=engines(
            2,
            first=spread(0.05, 0.3, n),
            gaps=spread(0.03, 0.09, 20000),
            requests=n,
            prompt_tokens=sum(lengths),
            external=sum(disaggregated),
            output_tokens=n * 900,
            running=180,
            kv=0.9,
            preemptions=25,
        ),
        router=router(
            direct=spread(0.05, 0.4, len(direct)),
            disaggregated=spread(0.2, 0.6, len(disaggregated)),
            gaps=spread(0.03, 0.09, 20000),
            leg=spread(0.1, 0.3, len(disaggregated)),
            lengths=lengths,
        ),
    )


def test_slow_streaming_with_a_full_kv_cache_is_decode_bound() -> None:
    result = diagnose(decode_bound(), PD)
    assert result.verdict == "Decode"
    add = result.advice_of("AddDecodeReplicas")
    assert add is not None and add.replicas is not None and add.replicas > PD.decode_replicas
    assert any("cache capacity" in line for line in result.evidence)
    assert any("25 preemptions" in line for line in result.evidence)
    # Decode engines prefill the short prompts and the prefill pool has headroom: lower the threshold.
    threshold = result.advice_of("Threshold")
    assert threshold is not None and threshold.threshold_tokens is not None
    assert threshold.threshold_tokens < PD.threshold_tokens
    assert "Colocate" not in kinds(result)  # a third of the prompts are long: P/D pays


def interference(budget: int | None = None, chunked: bool = True) -> PoolWindow:
    """Colocated engines: streaming fine at p50, long prefills stall decode batches at p99."""
    n = 300
    gaps = [0.012] * 9700 + [0.25] * 300
    lengths = spread(500, 16000, n)
    return PoolWindow(
        SECONDS,
        decode=engines(
            4,
            first=spread(0.1, 0.6, n),
            gaps=gaps,
            requests=n,
            prompt_tokens=sum(lengths),
            output_tokens=n * 200,
            running=30,
        ),
        router=router(direct=spread(0.1, 0.6, n), gaps=gaps, lengths=lengths),
    )


def test_a_p99_that_falls_apart_with_prefills_in_decode_batches_is_interference() -> None:
    result = diagnose(interference(), COLOCATED)
    assert result.verdict == "Interference"
    assert kinds(result) == ["SmallerChunks", "Disaggregate"]
    disaggregate = result.advice_of("Disaggregate")
    assert disaggregate is not None and disaggregate.threshold_tokens is not None
    assert 1024 <= disaggregate.threshold_tokens <= 16384
    assert any("decode engines prefilled 100%" in line for line in result.evidence)
    assert any("chunked prefill on, max-num-batched-tokens vLLM default" in line for line in result.evidence)


def test_chunked_prefill_off_is_the_first_thing_to_fix() -> None:
    settings = replace(COLOCATED, decode_engine=EngineSettings(chunked_prefill=False))
    result = diagnose(interference(), settings)
    assert result.verdict == "Interference"
    assert kinds(result)[0] == "ChunkedPrefill"
    # With a small step budget already, only the structural fix is left.
    small = replace(COLOCATED, decode_engine=EngineSettings(max_num_batched_tokens=2048))
    assert kinds(diagnose(interference(), small)) == ["Disaggregate"]


def kv_transfer_bound() -> PoolWindow:
    """The prefill leg answers fast; the first token of disaggregated requests comes a second later."""
    n = 200
    lengths = spread(5000, 9000, n)
    return PoolWindow(
        SECONDS,
        prefill=engines(2, first=spread(0.15, 0.3, n), requests=n, prompt_tokens=sum(lengths)),
        decode=engines(
            2,
            first=spread(1.0, 1.6, n),
            gaps=spread(0.008, 0.02, 5000),
            requests=n,
            prompt_tokens=sum(lengths),
            external=sum(lengths) - n,
            output_tokens=n * 50,
            waiting=0,
        ),
        router=router(
            disaggregated=spread(1.2, 1.9, n),
            gaps=spread(0.008, 0.02, 5000),
            leg=spread(0.15, 0.3, n),
            lengths=lengths,
        ),
    )


def test_slow_disaggregated_first_tokens_after_a_fast_prefill_leg_are_kv_transfer_bound() -> None:
    result = diagnose(kv_transfer_bound(), PD)
    assert result.verdict == "KVTransfer"
    assert result.reason == "KVTransferBound"
    assert kinds(result)[0] == "KVNetwork"
    assert any("is the KV transfer" in line for line in result.evidence)
    threshold = result.advice_of("Threshold")
    assert threshold is not None and (threshold.threshold_tokens or 0) > PD.threshold_tokens


def test_prefill_legs_that_fail_are_kv_transfer_bound() -> None:
    window = prefill_bound()
    assert window.router is not None
    failing = replace(window, router=replace(window.router, fallbacks={"prefill_failed": 40.0}))
    failing = replace(
        failing, router=replace(failing.router, requests={**window.router.requests, "fallback": 40.0})
    )
    result = diagnose(failing, PD)
    assert result.verdict == "KVTransfer"
    assert any("fell back to colocated" in line for line in result.evidence)


def healthy() -> PoolWindow:
    n = 300
    lengths = spread(1000, 9000, n)
    long_ones = [x for x in lengths if x >= 4096]
    return PoolWindow(
        SECONDS,
        prefill=engines(2, first=spread(0.1, 0.4, len(long_ones)), requests=len(long_ones)),
        decode=engines(
            2,
            first=spread(0.05, 0.4, n),
            gaps=spread(0.008, 0.025, 8000),
            requests=n,
            output_tokens=n * 100,
            running=20,
        ),
        router=router(
            direct=spread(0.1, 0.5, n - len(long_ones)),
            disaggregated=spread(0.2, 0.6, len(long_ones)),
            gaps=spread(0.008, 0.025, 8000),
            leg=spread(0.1, 0.4, len(long_ones)),
            lengths=lengths,
        ),
    )


def test_a_pool_within_its_targets_has_no_bottleneck() -> None:
    result = diagnose(healthy(), PD)
    assert result.verdict == "None"
    assert result.reason == "WithinTargets"
    assert kinds(result) == ["NoChange"]
    assert result.recommended_threshold is None


def short_prompts() -> PoolWindow:
    """Chat-sized prompts: nothing reaches the threshold, the prefill pool idles, decode is busy."""
    n = 500
    lengths = spread(40, 700, n)
    return PoolWindow(
        SECONDS,
        prefill=engines(2, requests=0),
        decode=engines(
            2,
            first=spread(0.05, 0.3, n),
            gaps=spread(0.02, 0.06, 20000),
            requests=n,
            prompt_tokens=sum(lengths),
            output_tokens=n * 300,
            running=40,
        ),
        router=router(direct=spread(0.05, 0.3, n), gaps=spread(0.02, 0.06, 20000), lengths=lengths),
    )


def test_short_prompt_traffic_is_better_served_colocated() -> None:
    result = diagnose(short_prompts(), PD)
    assert result.verdict == "Decode"
    colocate = result.advice_of("Colocate")
    assert colocate is not None and colocate.replicas == 4
    assert "prompts are short" in colocate.text and "no request uses the prefill pool" in colocate.text


def row(scenario: str, goodput: float, threshold: int | None = None) -> WhatIfRow:
    return WhatIfRow(scenario, "LengthAware", 2, 2, threshold, goodput, 90.0, None, None, 0.0)


def test_the_what_if_withdraws_advice_it_contradicts() -> None:
    result = diagnose(short_prompts(), PD)
    kept = with_what_if(result, [row("colocated", 9.0), row("current", 6.0)], PD)
    assert kept.advice_of("Colocate") is not None
    withdrawn = with_what_if(result, [row("colocated", 5.0), row("current", 6.0)], PD)
    assert withdrawn.advice_of("Colocate") is None
    assert any("colocation withdrawn" in note for note in withdrawn.notes)


def test_the_what_if_picks_the_best_threshold_candidate_or_none() -> None:
    prefill = diagnose(prefill_bound(), PD)
    advice = prefill.advice_of("Threshold")
    assert advice is not None and len(advice.candidates) >= 2
    assert advice.candidates == tuple(sorted(advice.candidates))  # steps towards the formula's threshold
    first = advice.candidates[0]
    assert advice.threshold_tokens == advice.candidates[-1]
    tried = [row("threshold", 3.5 if c == first else 3.1, c) for c in advice.candidates]
    best = with_what_if(prefill, [row("colocated", 2.0), row("current", 3.0), *tried], PD)
    chosen = best.advice_of("Threshold")
    assert best.recommended_threshold == first and chosen is not None and chosen.threshold_tokens == first
    assert f"-> {first}" in chosen.text and "the what-if's best: 3.50 vs 3.00" in chosen.text
    no_gain = [row("threshold", 2.9, c) for c in advice.candidates]
    withdrawn = with_what_if(prefill, [row("current", 3.0), *no_gain], PD)
    assert withdrawn.advice_of("Threshold") is None and withdrawn.recommended_threshold is None
    assert any("threshold change withdrawn" in note for note in withdrawn.notes)
    # Colocated far ahead of every P/D layout: the replay itself says disaggregation does not pay.
    colocate = with_what_if(prefill, [row("colocated", 5.0), row("current", 3.0), *tried], PD)
    assert colocate.advice_of("Colocate") is not None


def test_too_few_requests_say_nothing() -> None:
    window = PoolWindow(SECONDS, decode=engines(1, requests=3), router=router(direct=[0.1, 0.2, 0.3]))
    result = diagnose(window, PD)
    assert result.verdict == "None" and result.reason == "NotEnoughTraffic" and not result.enough_data


def test_token_share_and_threshold_follow_the_prompt_histogram() -> None:
    lengths = [100.0] * 90 + [10000.0] * 10  # 10 long prompts hold 10x the tokens of 90 short ones
    histogram = prompts(lengths)
    assert token_share_above(histogram, 1) == pytest.approx(1.0)
    assert token_share_above(histogram, 8192) == pytest.approx(100000 / 109000, rel=0.05)
    assert token_share_above(histogram, 20000) == 0.0
    shares = [token_share_above(histogram, t) for t in (64, 256, 1024, 4096, 8192, 16384)]
    assert shares == sorted(shares, reverse=True)
    threshold = threshold_for_share(histogram, 0.5, (1, 32768))
    assert token_share_above(histogram, threshold) <= 0.5 + 1e-9
    assert 8192 < threshold <= 16384 and threshold % 256 == 0
    assert threshold_for_share(histogram, 1.0, (512, 32768)) == 512  # bounds hold


def sized(prefill: int, decode: int) -> Sizing:
    """The planner's sizing (`bottleneck.sizing.size` reads it from the pages: test_controller_bottleneck.py)
    as wanted replicas per role, with figures to quote."""

    def plan(role: str, wanted: int) -> RolePlan:
        return RolePlan(role, 2, 2, wanted, wanted, "ForecastUp", "", 1.5, 1.8, 0.45, 1.0, 1.0, None, 0.04)

    return Sizing(plan("prefill", prefill), plan("decode", decode))


def test_the_replicas_advised_are_the_planner_s_sizing_of_the_window() -> None:
    """One sizing rule: the planner's. The diagnosis advises what it wants for the window's load, at least one
    more replica (the role misses its target), and says when the pages let the planner size nothing."""
    advised = diagnose(decode_bound(), PD, sized(prefill=2, decode=6)).advice_of("AddDecodeReplicas")
    assert advised is not None and advised.replicas == 6
    assert "the planner sizes this load at 6: 1.80 engine-s/s forecast at 0.45 per replica" in advised.text
    below = diagnose(decode_bound(), PD, sized(prefill=2, decode=2)).advice_of("AddDecodeReplicas")
    assert below is not None and below.replicas == PD.decode_replicas + 1
    prefill = diagnose(prefill_bound(), PD, sized(prefill=5, decode=2)).advice_of("AddPrefillReplicas")
    assert prefill is not None and prefill.replicas == 5
    unsized = diagnose(decode_bound(), PD).advice_of("AddDecodeReplicas")
    assert unsized is not None and unsized.replicas == PD.decode_replicas + 1
    assert "the planner could not size the load" in unsized.text


def test_a_pool_at_its_autoscaling_ceiling_is_told_to_raise_it() -> None:
    at_ceiling = diagnose(decode_bound(), replace(PD, max_replicas={"decode": 2}), sized(2, 5))
    advice = at_ceiling.advice_of("AddDecodeReplicas")
    assert advice is not None and "spec.decode.autoscaling.maxReplicas (2)" in advice.text
    assert advice.replicas == 5 and "raise it to 5" in advice.text
    below = diagnose(decode_bound(), replace(PD, max_replicas={"decode": 3}), sized(2, 5))
    capped = below.advice_of("AddDecodeReplicas")
    assert capped is not None and capped.replicas == 3 and "5 would be needed" in capped.text


def test_short_prefills_in_decode_batches_are_not_interference() -> None:
    """A chat turn of a few tokens costs a decode step nothing: a tail there is capacity, not interference."""
    n = 300
    gaps = [0.012] * 9700 + [0.25] * 300
    lengths = [12.0] * n
    window = PoolWindow(
        SECONDS,
        decode=engines(4, first=spread(0.01, 0.05, n), gaps=gaps, requests=n, prompt_tokens=sum(lengths)),
        router=router(direct=spread(0.01, 0.05, n), gaps=gaps, lengths=lengths),
    )
    assert diagnose(window, COLOCATED).verdict != "Interference"
    assert diagnose(interference(), COLOCATED).verdict == "Interference"  # the same tail with long prompts


def test_the_status_the_operator_would_write() -> None:
    prefill = diagnose(prefill_bound(), PD)
    document = bottleneck_status(prefill)
    assert document["phase"] == "Prefill" and document["reason"] == "PrefillBound"
    assert document["recommendedThresholdTokens"] == prefill.recommended_threshold
    assert 1 <= len(document["advice"]) <= 3
    kind, status, reason, message = bottleneck_condition(prefill)
    assert (kind, status, reason) == ("Bottleneck", "True", "PrefillBound")
    assert message.startswith("first token slow") and prefill.advice[0].text in message
    assert bottleneck_condition(diagnose(healthy(), PD))[1:3] == ("False", "WithinTargets")
    quiet = PoolWindow(SECONDS, decode=engines(1, requests=3), router=router(direct=[0.1, 0.2, 0.3]))
    assert bottleneck_condition(diagnose(quiet, PD))[1:3] == ("Unknown", "NotEnoughTraffic")
    assert "recommendedThresholdTokens" not in bottleneck_status(diagnose(healthy(), PD))


def test_a_split_that_lends_much_of_its_work_is_told_to_move_a_prefill_replica_to_decode() -> None:
    window = healthy()
    assert window.router is not None
    total = window.router.total_requests

    def lending(lent: float) -> PoolWindow:
        return replace(
            window, router=replace(window.router, requests={**window.router.requests, "lent": lent})
        )

    some = diagnose(lending(0.1 * total), PD)  # a tenth: lending answers the bursts, the split stands
    assert "AddDecodeReplicas" not in kinds(some)
    assert any("role lending: 9% of requests" in line for line in some.evidence)
    much = diagnose(lending(0.5 * total), PD)
    advice = [a for a in much.advice if a.kind == "AddDecodeReplicas"]
    assert len(advice) == 1 and advice[0].replicas == 3
    assert "split 2P:2D -> 1P:3D" in advice[0].text and "33% of requests were lent" in advice[0].text
    assert "AddDecodeReplicas" not in kinds(diagnose(lending(0.5 * total), replace(PD, prefill_replicas=1)))


def test_decode_pods_that_prefill_much_for_each_other_are_told_to_move_one_to_prefill() -> None:
    window = healthy()
    assert window.router is not None
    total = window.router.total_requests

    def peer_prefilled(count: float) -> PoolWindow:
        return replace(window, router=replace(window.router, peer_prefills=count))

    some = diagnose(peer_prefilled(0.1 * total), PD)  # a tenth: lending answers the bursts, the split stands
    assert "AddPrefillReplicas" not in kinds(some)
    assert any("10% of requests were prefilled on a peer decode engine" in line for line in some.evidence)
    much = diagnose(peer_prefilled(0.4 * total), PD)
    advice = [a for a in much.advice if a.kind == "AddPrefillReplicas"]
    assert len(advice) == 1 and advice[0].replicas == 3
    assert "split 2P:2D -> 3P:1D" in advice[0].text and "40% of requests were prefilled" in advice[0].text
    one_decode = replace(PD, decode_replicas=1)
    assert "AddPrefillReplicas" not in kinds(diagnose(peer_prefilled(0.4 * total), one_decode))
