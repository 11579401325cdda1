"""The timing model in virtual time: what each profile predicts for prefill, decode, batching, transfers."""

from __future__ import annotations

import pytest

from inferencepool.engine_sim.core import EngineCore, EngineRequest
from inferencepool.engine_sim.virtual import RequestTimeline, run_virtual
from inferencepool.perf import timing
from inferencepool.perf.profiles import PROFILES, get_profile

GPU_PROFILES = [name for name, p in PROFILES.items() if not p.zero_compute]


def distinct_prompt(seed: int, length: int) -> list[int]:
    """Tokens no other prompt shares (no accidental prefix-cache hits between requests)."""
    return [seed * 1_000_003 + i for i in range(length)]


def one_request(profile: str, prompt_tokens: int, output_tokens: int = 4) -> RequestTimeline:
    engine = EngineCore(get_profile(profile), "e0")
    timelines = run_virtual(
        engine, [(0.0, EngineRequest("r", distinct_prompt(1, prompt_tokens), output_tokens))]
    )
    return timelines["r"]


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_ttft_grows_with_prompt_length_faster_than_linearly(profile: str) -> None:
    lengths = [2048, 8192, 16000]
    ttfts = [one_request(profile, n).ttft for n in lengths]
    assert ttfts == sorted(ttfts) and len(set(ttfts)) == 3
    # attention is quadratic: each token of a longer prompt costs more than a token of a shorter one
    per_token = [t / n for t, n in zip(ttfts, lengths, strict=True)]
    assert per_token[0] < per_token[1] < per_token[2]


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_itl_grows_with_batch_size(profile: str) -> None:
    itls = []
    for batch in (1, 8, 64, 256):
        engine = EngineCore(get_profile(profile), "e0")
        # arrivals spread so prefills are done before decoding settles; measure the steady tail of each stream
        arrivals = [(0.0, EngineRequest(f"r{i}", distinct_prompt(i, 512), 96)) for i in range(batch)]
        timelines = run_virtual(engine, arrivals)
        tails = [gap for t in timelines.values() for gap in t.itls[-32:]]
        itls.append(sum(tails) / len(tails))
    assert itls == sorted(itls) and len(set(itls)) == 4
    # and it matches the closed-form step time of a steady batch (the same formula, no interference)
    p = get_profile(profile)
    assert itls[0] == pytest.approx(timing.ideal_decode_itl(p, 1, 512 + 80), rel=0.05)


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_itl_grows_with_context(profile: str) -> None:
    p = get_profile(profile)
    short = timing.ideal_decode_itl(p, 64, 1000)
    long = timing.ideal_decode_itl(p, 64, 16000)
    assert long > short * 1.3  # reading 16x more KV per step is a large part of a decode step


def test_published_orders_of_magnitude() -> None:
    """Sanity anchors from public figures: single-stream ITL on H100 ~7 ms (8B) and ~16 ms (70B, TP4)."""
    assert 0.005 < timing.ideal_decode_itl(get_profile("llama-3.1-8b-h100"), 1, 1000) < 0.009
    assert 0.012 < timing.ideal_decode_itl(get_profile("llama-3.1-70b-h100-tp4"), 1, 1000) < 0.022
    # H200's extra bandwidth shows in decode, not in prefill (same FLOPS)
    h100, h200 = get_profile("llama-3.1-8b-h100"), get_profile("llama-3.1-8b-h200")
    assert timing.ideal_decode_itl(h200, 1, 1000) < 0.8 * timing.ideal_decode_itl(h100, 1, 1000)
    assert timing.ideal_prefill_time(h200, 8000) == pytest.approx(
        timing.ideal_prefill_time(h100, 8000), rel=0.05
    )
    # KV capacity: an H100 at 0.9 holds a few hundred thousand Llama-3.1-8B tokens
    assert 300_000 < h100.kv_capacity_tokens < 500_000
    assert h200.kv_capacity_tokens > 1.8 * h100.kv_capacity_tokens


def test_long_prefill_stalls_decodes_sharing_the_step() -> None:
    """Chunked-prefill interference: a decode stream slows while another long prompt is prefilled."""
    profile = get_profile("llama-3.1-8b-h100")
    alone = run_virtual(EngineCore(profile, "e0"), [(0.0, EngineRequest("d", distinct_prompt(1, 256), 200))])
    shared = run_virtual(
        EngineCore(profile, "e0"),
        [
            (0.0, EngineRequest("d", distinct_prompt(1, 256), 200)),
            (0.2, EngineRequest("p", distinct_prompt(2, 30000), 1)),
        ],
    )
    worst_alone = max(alone["d"].itls)
    worst_shared = max(shared["d"].itls)
    assert worst_shared > 10 * worst_alone
    # the stall is bounded by one chunk of max_num_batched_tokens, not the whole 30k prompt
    assert worst_shared < timing.ideal_prefill_time(profile, 30000) / 2


def test_prefill_is_chunked_by_the_token_budget() -> None:
    profile = get_profile("llama-3.1-8b-h100").with_overrides(max_num_batched_tokens=2048)
    engine = EngineCore(profile, "e0")
    engine.add_request(EngineRequest("r", distinct_prompt(1, 5000), 2), 0.0)
    steps = []
    now = 0.0
    while (step := engine.schedule(now)) is not None:
        steps.append(step.prefill_tokens)
        engine.complete(step)
        now = step.end
    assert steps[:3] == [2048, 2048, 904]


def test_kv_transfer_time_scales_with_tokens_and_tensor_parallel_links() -> None:
    p8 = get_profile("llama-3.1-8b-h100")
    small = timing.nixl_transfer_time(p8, 1000)
    large = timing.nixl_transfer_time(p8, 10000)
    assert large > 5 * small
    expected = p8.kv_transfer_latency_s + 10000 * 128 * 1024 / 40e9
    assert large == pytest.approx(expected)
    p70 = get_profile("llama-3.1-70b-h100-tp4")
    # 2.5x the bytes per token, but four NICs read in parallel
    assert timing.nixl_transfer_time(p70, 10000) < large


def test_zero_profile_costs_nothing() -> None:
    zero = get_profile("zero")
    timeline = one_request("zero", 4000, 50)
    assert timeline.ttft == 0.0 and timeline.mean_itl == 0.0
    assert timing.nixl_transfer_time(zero, 10000) == 0.0


def test_tensor_parallel_override_changes_the_model() -> None:
    p = get_profile("llama-3.1-70b-h100-tp4")
    tp8 = p.with_overrides(tensor_parallel=8)
    assert timing.ideal_decode_itl(tp8, 1, 1000) < timing.ideal_decode_itl(p, 1, 1000)
    assert tp8.kv_capacity_tokens > p.kv_capacity_tokens
    with pytest.raises(ValueError, match="weights do not fit"):
        p.with_overrides(tensor_parallel=1)
    with pytest.raises(ValueError, match="max_model_len"):
        p.with_overrides(max_model_len=10**7)


def test_closed_loop_keeps_every_client_busy() -> None:
    from inferencepool.engine_sim.virtual import run_closed_loop

    profile = get_profile("llama-3.1-8b-h100")

    def throughput(concurrency: int) -> float:
        timelines = run_closed_loop(
            EngineCore(profile, "e0"),
            concurrency,
            lambda n: EngineRequest(f"r{n}", distinct_prompt(n, 64), 32),
            until=3.0,
        )
        in_flight_at_end = [t for t in timelines if t.finish_reason is None]
        assert len(in_flight_at_end) == concurrency
        return sum(1 for t in timelines for at in t.token_times if 1.0 <= at < 3.0) / 2.0

    single, many = throughput(1), throughput(64)
    assert single == pytest.approx(1 / timing.ideal_decode_itl(profile, 1, 80), rel=0.1)
    assert 20 * single < many < 64 * single  # batching pays, but each step gets slower
