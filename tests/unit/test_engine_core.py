"""The engine core's scheduling and KV bookkeeping, in virtual time."""

from __future__ import annotations

import dataclasses

import pytest

from inferencepool.engine_sim.core import (
    DisaggSpec,
    EngineCore,
    EngineRequest,
    LmcacheSettings,
    RemotePrefill,
    RemoteRead,
)
from inferencepool.engine_sim.kv import BlockPool, PdBuffer, SharedPrefixIndex, chunk_hashes
from inferencepool.engine_sim.virtual import run_virtual
from inferencepool.perf import timing
from inferencepool.perf.profiles import EngineProfile, get_profile

H100 = get_profile("llama-3.1-8b-h100")


def prompt(seed: int, length: int) -> list[int]:
    return [seed * 1_000_003 + i for i in range(length)]


def small_kv_profile(tokens: int, max_model_len: int = 4096) -> EngineProfile:
    """H100 timings with a KV cache of about `tokens` tokens (by shrinking HBM), to make queueing visible."""
    weights = H100.model.weight_bytes
    kv = tokens * H100.model.kv_bytes_per_token
    hw = dataclasses.replace(H100.hardware, hbm_bytes=(weights + H100.activation_reserve_bytes + kv) / 0.9)
    return dataclasses.replace(H100, hardware=hw, max_model_len=max_model_len, max_num_batched_tokens=16384)


def test_requests_wait_when_kv_is_full_and_run_when_it_frees() -> None:
    profile = small_kv_profile(10_000)
    engine = EngineCore(profile, "e0")
    for i in range(5):
        engine.add_request(EngineRequest(f"r{i}", prompt(i, 3000), 50), 0.0)
    step = engine.schedule(0.0)
    assert step is not None
    assert engine.num_running == 3  # 3 x 3000 tokens fit in 10k, a fourth does not
    assert engine.num_waiting == 2
    assert engine.kv_usage > 0.85
    engine2 = EngineCore(profile, "e0")
    done = run_virtual(engine2, [(0.0, EngineRequest(f"r{i}", prompt(i, 3000), 50)) for i in range(5)])
    first_three = max(done[f"r{i}"].token_times[-1] for i in range(3))
    assert min(done["r3"].ttft, done["r4"].ttft) >= first_three  # queued until KV was freed
    assert all(t.finish_reason == "length" and len(t.token_times) == 50 for t in done.values())
    assert engine2.kv_usage == 0.0


def test_preemption_when_running_requests_outgrow_the_cache() -> None:
    profile = small_kv_profile(4_000, max_model_len=2600)
    engine = EngineCore(profile, "e0")
    arrivals = [(0.0, EngineRequest(f"r{i}", prompt(i, 1000), 1500)) for i in range(3)]
    done = run_virtual(engine, arrivals)
    assert engine.stats.preemptions > 0
    assert all(len(t.token_times) == 1500 for t in done.values())
    assert engine.stats.generation_tokens >= 4500


def test_prefix_cache_hit_skips_prefill_of_the_shared_chunks() -> None:
    engine = EngineCore(H100, "e0")
    shared = prompt(7, 4096)
    cold = run_virtual(engine, [(0.0, EngineRequest("a", [*shared, 1, 2, 3], 2))])["a"].ttft
    warm = run_virtual(engine, [(0.0, EngineRequest("b", [*shared, 4, 5, 6], 2))])["b"].ttft
    assert warm < cold / 5
    assert engine.stats.prefix_cache_hits == 4096  # 16 whole chunks of 256
    assert engine.stats.prefix_cache_queries == 2 * 4099


def test_prefix_cache_never_covers_the_last_prompt_token() -> None:
    engine = EngineCore(H100, "e0")
    exact = prompt(3, 512)
    run_virtual(engine, [(0.0, EngineRequest("a", exact, 1))])
    run_virtual(engine, [(0.0, EngineRequest("b", exact, 1))])
    assert engine.stats.prefix_cache_hits == 256  # the second chunk holds the last token: recomputed


def test_prefix_cache_disabled() -> None:
    engine = EngineCore(H100, "e0", prefix_caching=False)
    shared = prompt(7, 1024)
    run_virtual(
        engine, [(0.0, EngineRequest("a", [*shared, 1], 1)), (1.0, EngineRequest("b", [*shared, 2], 1))]
    )
    assert engine.stats.prefix_cache_hits == 0
    assert engine.kv_usage == 0.0
    assert engine.pool.free_blocks == engine.pool.total_blocks


def test_lru_evicts_the_least_recently_used_chunk() -> None:
    pool = BlockPool(total_blocks=48, block_tokens=16, chunk_tokens=256)  # room for 3 chunks
    a, b, c, d = (chunk_hashes(prompt(i, 256))[0] for i in range(4))
    for key in (a, b, c):
        assert pool.allocate(16)
        assert pool.publish(key)
        pool.unuse([key])
    assert pool.used_blocks == 0 and pool.resident_chunks() == 3
    pool.acquire([a])  # a is used again: b is now the least recently used
    pool.unuse([a])
    assert pool.allocate(16)  # needs one chunk's blocks: evicts b
    assert pool.publish(d)
    assert pool.cached_prefix([a]) == 1
    assert pool.cached_prefix([b]) == 0
    assert pool.cached_prefix([c]) == 1
    assert pool.evictions == 1


def test_block_pool_refuses_what_it_cannot_hold_without_side_effects() -> None:
    pool = BlockPool(total_blocks=32, block_tokens=16, chunk_tokens=256)
    key = chunk_hashes(prompt(1, 256))[0]
    assert pool.allocate(16) and pool.publish(key)  # a used chunk cannot be evicted
    assert not pool.allocate(17)
    assert pool.free_blocks == 16
    with pytest.raises(ValueError, match="multiple of the block size"):
        BlockPool(total_blocks=10, block_tokens=24, chunk_tokens=256)


def test_chunk_hashes_chain_the_prefix() -> None:
    base = prompt(1, 512)
    changed_first = [999, *base[1:]]
    assert chunk_hashes(base)[1] != chunk_hashes(changed_first)[1]  # same second chunk, different history
    assert len(chunk_hashes(base, limit_tokens=511)) == 1


def test_abort_frees_everything() -> None:
    engine = EngineCore(H100, "e0")
    engine.add_request(EngineRequest("r", prompt(1, 3000), 100), 0.0)
    step = engine.schedule(0.0)
    assert step is not None and engine.kv_usage > 0
    assert engine.abort("r")
    assert engine.complete(step) == []  # the in-flight step no longer reports for it
    assert engine.kv_usage == 0.0 and engine.idle()
    assert engine.stats.request_success == {"abort": 1}
    assert not engine.abort("r")


def _prefill_then_hold(
    engine: EngineCore, request_id: str, tokens: list[int]
) -> tuple[float, tuple[int, ...]]:
    done = run_virtual(engine, [(0.0, EngineRequest(request_id, tokens, 1, remote_decode=True))], until=1.0)
    assert engine.num_held == 1
    assert engine.kv_usage > 0  # the held blocks stay allocated for the decode engine
    _, hold = engine._holds[request_id]
    return done[request_id].token_times[0], hold.block_ids


def test_prefill_leg_holds_kv_until_read_then_returns_it_to_the_prefix_cache() -> None:
    prefill = EngineCore(H100, "p", nixl=True, kv_lease_s=30.0)
    finished_at, blocks = _prefill_then_hold(prefill, "req-1", prompt(1, 2000))
    assert len(blocks) == 2000 // 16
    with pytest.raises(LookupError, match="not this engine"):
        prefill.release_hold("req-1", "someone-else", finished_at + 1)
    with pytest.raises(LookupError, match="block ids do not match"):
        prefill.release_hold("req-1", "p", finished_at + 1, (1, 2, 3))
    release = prefill.release_hold("req-1", "p", finished_at + 1, blocks)
    assert release.prompt_tokens == 2000
    assert prefill.kv_usage == 0.0 and prefill.num_held == 0
    with pytest.raises(LookupError, match="unknown request, or its 30 s lease expired"):
        prefill.release_hold("req-1", "p", finished_at + 2)


def test_held_kv_expires_after_the_lease() -> None:
    prefill = EngineCore(H100, "p", nixl=True, kv_lease_s=30.0)
    finished_at, _ = _prefill_then_hold(prefill, "req-1", prompt(1, 2000))
    assert prefill.next_wakeup() == pytest.approx(finished_at + 30.0)
    with pytest.raises(LookupError, match="lease expired"):
        prefill.release_hold("req-1", "p", finished_at + 30.5)
    assert prefill.kv_usage == 0.0


def test_expired_and_failed_nixl_reads_are_counted_once_per_tp_worker() -> None:
    tp2 = H100.with_overrides(tensor_parallel=2)
    prefill = EngineCore(tp2, "p", nixl=True, kv_lease_s=30.0)
    finished_at, blocks = _prefill_then_hold(prefill, "read", prompt(1, 2000))
    prefill.release_hold("read", "p", finished_at + 1, blocks)
    assert prefill.stats.nixl_kv_expired_reqs == 0  # read in time
    finished_at, _ = _prefill_then_hold(prefill, "late", prompt(2, 2000))
    assert prefill.schedule(finished_at + 30.0) is None
    assert prefill.stats.nixl_kv_expired_reqs == 2  # each worker reaps its lease (nixl/base_worker.py)
    decode = EngineCore(tp2, "d", nixl=True)
    source = RemotePrefill("p", "late", "10.0.0.1", 5600, (1, 2))
    run_virtual(
        decode, [(0.0, EngineRequest("y", prompt(2, 100), 5, remote_prefill=source))], lambda r, n: None
    )
    assert decode.stats.nixl_failed_transfers == 0
    run_virtual(
        decode, [(0.0, EngineRequest("z", prompt(3, 100), 5, remote_prefill=source))], lambda r, n: "gone"
    )
    assert decode.stats.nixl_failed_transfers == 2
    assert prefill.stats.nixl_failed_transfers == decode.stats.nixl_kv_expired_reqs == 0


def test_without_nixl_a_prefill_leg_holds_nothing() -> None:
    engine = EngineCore(H100, "p", nixl=False)
    run_virtual(engine, [(0.0, EngineRequest("r", prompt(1, 2000), 1, remote_decode=True))])
    assert engine.num_held == 0 and engine.kv_usage == 0.0


def test_decode_leg_pays_the_transfer_instead_of_the_prefill() -> None:
    tokens = prompt(5, 16000)
    prefill = EngineCore(H100, "p", nixl=True)
    decode = EngineCore(H100, "d", nixl=True)
    prefill_ttft = run_virtual(
        prefill, [(0.0, EngineRequest("x", tokens, 1, remote_decode=True))], until=1.0
    )["x"].ttft
    _, hold = prefill._holds["x"]
    source = RemotePrefill("p", "x", "10.0.0.1", 5600, hold.block_ids)
    reads: list[RemoteRead] = []

    def resolve(read: RemoteRead, now: float) -> str | None:
        reads.append(read)
        try:
            prefill.release_hold(read.source.request_id, read.source.engine_id, now, read.source.block_ids)
        except LookupError as exc:
            return str(exc)
        return None

    timeline = run_virtual(decode, [(0.0, EngineRequest("y", tokens, 20, remote_prefill=source))], resolve)[
        "y"
    ]
    assert reads == [RemoteRead("y", source, 16000)]
    transfer = timing.nixl_transfer_time(H100, 16000)
    assert transfer <= timeline.ttft < transfer + 0.05  # transfer + one step for the last prompt token
    assert timeline.ttft < prefill_ttft / 3
    assert len(timeline.token_times) == 20
    assert decode.stats.external_prefix_cache_hits == 16000
    assert prefill.kv_usage == 0.0


def test_decode_leg_fails_when_the_read_fails() -> None:
    decode = EngineCore(H100, "d", nixl=True)
    source = RemotePrefill("p", "gone", "10.0.0.1", 5600, (1, 2))
    timeline = run_virtual(
        decode,
        [(0.0, EngineRequest("y", prompt(1, 100), 5, remote_prefill=source))],
        lambda read, now: "expired",
    )["y"]
    assert timeline.error == "expired" and timeline.token_times == []
    assert decode.stats.requests_failed == 1
    assert decode.kv_usage == 0.0 and decode.idle()


def test_lmcache_cpu_tier_serves_prefixes_evicted_from_the_gpu() -> None:
    profile = small_kv_profile(5_000)
    engine = EngineCore(profile, "e0", lmcache=LmcacheSettings(cpu_capacity_chunks=1000))
    first = prompt(1, 2560)
    cold = run_virtual(engine, [(0.0, EngineRequest("a", [*first, 1], 1))])["a"].ttft
    # fill the GPU with other prompts so the first one's chunks are evicted there
    run_virtual(engine, [(0.0, EngineRequest(f"f{i}", prompt(10 + i, 2560), 1)) for i in range(3)])
    assert engine.pool.cached_prefix(chunk_hashes(first)) < 10
    warm = run_virtual(engine, [(0.0, EngineRequest("b", [*first, 2], 1))])["b"].ttft
    assert engine.stats.external_prefix_cache_hits == 2560
    assert warm < cold  # loading 10 chunks over the host link beats recomputing them
    assert warm > timing.host_load_time(profile, 2560)


def test_p2p_fetches_a_prefix_a_peer_holds() -> None:
    index = SharedPrefixIndex()
    settings = LmcacheSettings(cpu_capacity_chunks=1000, p2p=True)
    a = EngineCore(H100, "a", lmcache=settings, prefix_index=index)
    b = EngineCore(H100, "b", lmcache=settings, prefix_index=index)
    shared = prompt(9, 8192)
    cold = run_virtual(a, [(0.0, EngineRequest("x", [*shared, 1], 1))])["x"].ttft
    fetched = run_virtual(b, [(0.0, EngineRequest("y", [*shared, 2], 1))])["y"].ttft
    assert b.stats.external_prefix_cache_hits == 8192
    assert b.stats.prefix_cache_hits == 0
    assert fetched < cold / 2
    without_p2p = EngineCore(H100, "c", lmcache=LmcacheSettings(cpu_capacity_chunks=1000), prefix_index=index)
    run_virtual(without_p2p, [(0.0, EngineRequest("z", [*shared, 3], 1))])
    assert without_p2p.stats.external_prefix_cache_hits == 0


def test_requests_beyond_max_model_len_are_refused() -> None:
    engine = EngineCore(get_profile("cpu-demo"), "e0")
    with pytest.raises(ValueError, match="max_model_len 16384"):
        engine.add_request(EngineRequest("r", prompt(1, 16000), 1000), 0.0)
    with pytest.raises(ValueError, match="at least one token"):
        EngineRequest("r", [1], 0)


def test_recompute_policy_prefills_locally_when_the_read_fails() -> None:
    decode = EngineCore(H100, "d", nixl=True, recompute_on_load_failure=True)
    source = RemotePrefill("p", "gone", "10.0.0.1", 5600, (1, 2))
    tokens = prompt(1, 3000)
    timeline = run_virtual(
        decode, [(0.0, EngineRequest("y", tokens, 5, remote_prefill=source))], lambda read, now: "expired"
    )["y"]
    assert timeline.error is None and len(timeline.token_times) == 5
    assert timeline.ttft >= timing.ideal_prefill_time(H100, 3000)
    assert decode.stats.requests_failed == 0


def test_the_timing_core_imports_no_io_library() -> None:
    """The simulator drives the same core in virtual time: it must not drag in the HTTP shell."""
    import subprocess
    import sys

    code = (
        "import sys, inferencepool.engine_sim.core, inferencepool.engine_sim.virtual;"
        "print(sorted(m for m in ('aiohttp', 'prometheus_client', 'asyncio') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_pd_buffer_needs_every_rank_and_refuses_what_does_not_fit() -> None:
    keys = chunk_hashes(prompt(7, 1024))  # 4 chunks
    buffer = PdBuffer(capacity_chunks=5, ranks=2)
    assert buffer.offer(0, keys)
    assert keys[0] not in buffer  # rank 1's shard is still missing
    assert buffer.offer(1, keys)
    assert all(key in buffer for key in keys)
    assert not buffer.offer(0, chunk_hashes(prompt(8, 512)))  # 4 + 2 > 5: refused whole
    assert len(buffer) == 4
    buffer.take(keys[:2])
    assert keys[0] not in buffer and keys[2] in buffer
    with pytest.raises(ValueError, match=r"rank 2 outside 0\.\.1"):
        buffer.offer(2, keys)


def test_pd_sender_pushes_only_disagg_requests_and_receiver_loads_them() -> None:
    sender = EngineCore(H100, "p", lmcache=LmcacheSettings(0, load=False, pd_role="sender"))
    receiver = EngineCore(
        H100, "d", lmcache=LmcacheSettings(0, save=False, pd_role="receiver", pd_buffer_chunks=100)
    )
    spec = DisaggSpec("req-1", "10.0.0.2", (7300,), (7400,))
    tokens = prompt(3, 3000)
    run_virtual(sender, [(0.0, EngineRequest("plain", prompt(4, 600), 1))])
    assert sender.take_pd_pushes() == []  # no disagg_spec: LMCache pushes nothing
    run_virtual(sender, [(0.0, EngineRequest("pd", tokens, 1, disagg=spec))])
    (push,) = sender.take_pd_pushes()
    # 11 whole chunks and the partial tail: PD forces save_unfull_chunk (LMCache config.py _validate_config)
    assert push.spec == spec and push.tokens == 3000 and len(push.chunk_keys) == 12

    cold = run_virtual(EngineCore(H100, "x"), [(0.0, EngineRequest("c", tokens, 1))])["c"].ttft
    assert receiver.pd_offer(0, push.chunk_keys)
    warm = run_virtual(receiver, [(0.0, EngineRequest("d", tokens, 2))])["d"].ttft
    # the whole prompt was pushed and looked up (skip_last_n_tokens 0); the last token is still computed
    assert receiver.stats.external_prefix_cache_hits == receiver.stats.pd_loaded_tokens == 2999
    assert warm < cold / 5
    assert receiver.pd_buffer is not None and len(receiver.pd_buffer) == 0  # loaded chunks leave the buffer
    assert receiver.cpu_chunks() == []  # a kv_consumer saves nothing


def pd_pair(
    buffer_chunks: int = 100, *, skip_last: int = 1, prefix_caching: bool = True, max_prefill: int = 0
) -> tuple[EngineCore, EngineCore]:
    """An LMCache PD sender and receiver configured as the operator configures them (skip_last_n_tokens 1)."""
    sender = EngineCore(H100, "p", lmcache=LmcacheSettings(0, load=False, pd_role="sender"))
    receiver_settings = LmcacheSettings(
        0,
        save=False,
        pd_role="receiver",
        pd_buffer_chunks=buffer_chunks,
        skip_last_n_tokens=skip_last,
        pd_max_prefill_len=max_prefill,
    )
    receiver = EngineCore(H100, "d", lmcache=receiver_settings, prefix_caching=prefix_caching)
    return sender, receiver


def push_of(sender: EngineCore, tokens: list[int], req: str) -> tuple[bytes, ...]:
    spec = DisaggSpec(req, "10.0.0.2", (7300,), (7400,))
    run_virtual(sender, [(0.0, EngineRequest(req, tokens, 1, disagg=spec))])
    (push,) = sender.take_pd_pushes()
    return push.chunk_keys


@pytest.mark.parametrize("length", [3000, 3072])
def test_pd_decode_leg_with_the_original_prompt_leaves_a_chunk_in_the_buffer(length: int) -> None:
    """skip_last_n_tokens 1 looks up one token less than was pushed: the last pushed chunk never matches and,
    as LMCache never evicts, stays in the buffer for good (issue 11, defect 1)."""
    sender, receiver = pd_pair()
    tokens = prompt(5, length)
    assert receiver.pd_offer(0, push_of(sender, tokens, "r"))
    run_virtual(receiver, [(0.0, EngineRequest("d", tokens, 2))])
    assert receiver.pd_buffer is not None and len(receiver.pd_buffer) == 1
    assert receiver.stats.pd_loaded_tokens == (length - 1) // 256 * 256


def test_pd_decode_leg_with_the_prompt_and_first_token_retrieves_every_pushed_chunk() -> None:
    """LMCache's own proxy sends the decode engine the prompt's ids plus the first token."""
    sender, receiver = pd_pair()
    tokens = prompt(6, 3000)
    assert receiver.pd_offer(0, push_of(sender, tokens, "r"))
    run_virtual(receiver, [(0.0, EngineRequest("d", [*tokens, 42], 2))])
    assert receiver.pd_buffer is not None and len(receiver.pd_buffer) == 0
    assert receiver.stats.pd_loaded_tokens == 3000  # every prompt token; only the first token is computed


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_pd_chunks_vllm_already_caches_are_not_retrieved(prefix_caching: bool) -> None:
    """A GPU prefix-cache hit masks the chunks it covers: LMCache does not retrieve them, so they stay."""
    sender, receiver = pd_pair(prefix_caching=prefix_caching)
    shared = prompt(7, 1024)
    first, second = [*shared, *prompt(8, 1000)], [*shared, *prompt(9, 1000)]
    for name, tokens in (("a", first), ("b", second)):
        assert receiver.pd_offer(0, push_of(sender, tokens, name))
        run_virtual(receiver, [(0.0, EngineRequest(name, [*tokens, 42], 2))])
    assert receiver.pd_buffer is not None
    # with prefix caching on, the second request found the 4 shared chunks on the GPU and left their copies
    assert len(receiver.pd_buffer) == (4 if prefix_caching else 0)


def test_pd_buffer_refuses_at_once_what_it_can_never_hold_and_checks_max_prefill_at_start() -> None:
    sender, receiver = pd_pair(buffer_chunks=5)
    keys = push_of(sender, prompt(10, 3000), "big")
    assert not receiver.pd_can_ever_hold(len(keys))
    assert receiver.pd_can_ever_hold(5) and receiver.pd_fits(0, 5) and not receiver.pd_fits(0, 6)
    with pytest.raises(ValueError, match=r"capacity_tokens=1280 < pd_max_prefill_len=4096"):
        pd_pair(buffer_chunks=5, max_prefill=4096)


def test_pd_buffer_never_evicts_and_frees_one_copy_per_retrieval() -> None:
    keys = chunk_hashes(prompt(11, 1024))
    buffer = PdBuffer(capacity_chunks=8)
    assert buffer.offer(0, keys) and buffer.offer(0, keys)  # two requests, one prompt: two copies
    assert not buffer.offer(0, keys[:1])  # full: refused, nothing evicted
    buffer.take(keys)
    assert all(key in buffer for key in keys) and len(buffer) == 4
    buffer.take(keys)
    assert len(buffer) == 0 and buffer.retrieved_chunks == 8


def test_failed_kv_load_counts_as_error_finish() -> None:
    core = EngineCore(H100, "d", nixl=True)
    remote = RemotePrefill("p", "r", "10.0.0.1", 5600, (1, 2))
    core.add_request(EngineRequest("r", prompt(12, 512), 4, remote_prefill=remote), 0.0)
    core.schedule(0.0)
    (read,) = core.take_remote_reads()
    assert core.remote_read_done(read.request_id, 0.1, "unreachable") is not None
    assert core.stats.request_success == {"error": 1}
