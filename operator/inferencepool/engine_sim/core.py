"""The engine loop as a pure, clock-agnostic object: continuous batching, chunked prefill, KV blocks, prefix
cache.

Nothing here reads a clock or does I/O. A driver owns time:
- the HTTP fake engine (server.py) drives it in wall-clock time with asyncio,
- a simulator drives it in virtual time (virtual.py shows the loop in a dozen lines).

The driver calls `schedule(now)` to get the next step (or None when idle), waits `step.duration`, then calls
`complete(step)` to get the tokens the step produced. Requests that need KV from another engine (a NIXL decode
leg) ask the driver to perform the read (`take_remote_reads`), and the driver reports back with
`remote_read_done`. A prefill engine in LMCache PD mode (pd_role sender) pushes each disagg_spec request's
prompt KV to the decode engine the spec names; the driver performs the push (`take_pd_pushes`), and a decode
engine (pd_role receiver) takes pushed chunks into its PD buffer (`pd_offer`) and loads them on a prefix
hit instead of prefilling. `next_wakeup()` says when something changes without new input (a transfer lands,
a lease expires).

Scheduling mirrors vLLM V1: one token budget per step (max_num_batched_tokens) shared by running requests
first (decodes take one token, unfinished prefills take a chunk) and then waiting requests in arrival order; a
request whose KV blocks cannot be allocated waits (num_requests_waiting), and a running request that cannot
grow preempts the most recently admitted one, which later recomputes (vLLM's recompute preemption).
"""

from __future__ import annotations

import bisect
import enum
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferencepool.engine_sim.kv import (
    BlockPool,
    LruChunkStore,
    PdBuffer,
    PrefixIndex,
    chunk_hashes,
    lmcache_chunk_keys,
)
from inferencepool.perf import timing
from inferencepool.perf.profiles import EngineProfile

FINISH_LENGTH = "length"
FINISH_STOP = "stop"
FINISH_ABORT = "abort"
FINISH_ERROR = (
    "error"  # vLLM's FinishReason.ERROR, e.g. a KV load failure under kv_load_failure_policy "fail"
)
# vllm/v1/engine/__init__.py FinishReason, the finished_reason label values of vllm:request_success
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


@dataclass(frozen=True)
class RemotePrefill:
    """kv_transfer_params of a NIXL decode leg: where the prompt's KV waits to be read."""

    engine_id: str
    request_id: str
    host: str
    port: int
    block_ids: tuple[int, ...]
    tp_size: int = 1


@dataclass(frozen=True)
class DisaggSpec:
    """kv_transfer_params.disagg_spec of an LMCache PD prefill leg: push the prompt's KV to this receiver."""

    req_id: str
    receiver_host: str
    receiver_init_ports: tuple[int, ...]  # one per TP rank
    receiver_alloc_ports: tuple[int, ...]


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: Sequence[int]
    output_tokens: int  # exactly this many tokens are generated
    finish_reason: str = FINISH_LENGTH  # reported when the last token is produced
    remote_prefill: RemotePrefill | None = None  # decode leg: load the prompt's KV from a prefill engine
    remote_decode: bool = False  # prefill leg: keep the KV for a decode engine to read after finishing
    disagg: DisaggSpec | None = None  # LMCache PD prefill leg: push the prompt's KV to a decode engine
    # the prompt's `kv.chunk_hashes` at the engine's chunk size, when the driver has them already (a simulator
    # replaying one trace many times hashes each prompt once); None: the engine hashes the prompt
    chunk_hashes: Sequence[bytes] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.output_tokens < 1:
            raise ValueError("a request must generate at least one token")
        if not self.prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")


@dataclass(frozen=True)
class KvHold:
    """What a finished prefill leg keeps for the decode engine (vLLM returns it as kv_transfer_params)."""

    request_id: str
    block_ids: tuple[int, ...]
    prompt_tokens: int
    expires_at: float


@dataclass(frozen=True)
class TokenEvent:
    request_id: str
    time: float
    index: int  # 0 for the first output token
    finish_reason: str | None = None  # set on the last token
    kv_hold: KvHold | None = None  # set on the last token of a prefill leg


@dataclass(frozen=True)
class RequestFailed:
    request_id: str
    time: float
    message: str


Event = TokenEvent | RequestFailed


@dataclass(frozen=True)
class RemoteRead:
    """A read the driver must perform against another engine (NIXL in vLLM; HTTP on loopback in the fake)."""

    request_id: str
    source: RemotePrefill
    tokens: int


@dataclass(frozen=True)
class PdPush:
    """A push the driver must perform: the prompt's KV chunks to the receiver of a disagg_spec."""

    request_id: str
    spec: DisaggSpec
    chunk_keys: tuple[bytes, ...]  # the partial last chunk's key too, unless discard_partial_chunks
    tokens: int  # prompt tokens sent: all of them, unless discard_partial_chunks drops the partial chunk


@dataclass(frozen=True)
class HoldRelease:
    prompt_tokens: int


class _State(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_KV = "waiting_for_kv"
    RUNNING = "running"
    HELD = "held"
    DONE = "done"


@dataclass(eq=False)
class _Seq:
    request: EngineRequest
    arrival: float
    hashes: list[bytes]
    state: _State = _State.WAITING
    num_computed: int = 0
    num_output: int = 0
    chunk_keys: list[bytes] = field(default_factory=list)
    private_blocks: int = 0
    pending_load_s: float = 0.0
    kv_ready_at: float | None = None
    external_tokens: int = 0
    remote_kv_loaded: bool = False
    prompt_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.prompt_len = len(self.request.prompt_token_ids)

    @property
    def total_tokens(self) -> int:
        return self.prompt_len + self.num_output


@dataclass(frozen=True)
class StepEntry:
    seq: _Seq
    new_tokens: int
    context_tokens: int


@dataclass(frozen=True)
class ScheduledStep:
    start: float
    duration: float
    entries: tuple[StepEntry, ...]
    prefill_tokens: int
    decode_requests: int

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(eq=False)
class DecodeRun:
    """Steps of a steady decode batch, timed at once (`EngineCore.decode_run`): the same running requests each
    get one token per step, nobody waits, and only the last step may finish requests (`finishing`). Nothing
    changes in the engine until the driver commits steps (`commit_decode_run`), in order; a driver that must
    add a request mid-run keeps only the steps up to the one in flight (`cut`), exactly as the engine would
    have scheduled them one at a time."""

    start: float
    ends: list[float]  # when each step ends (step i starts at ends[i - 1], step 0 at start)
    durations: list[float]
    request_ids: tuple[str, ...]  # the batch, in the engine's running order
    seqs: tuple[_Seq, ...] = field(repr=False)
    finishing: bool = False  # the last step gives some request its last token
    committed: int = 0  # steps already applied to the engine
    started: int = 0  # steps whose KV blocks and busy time the engine has taken (at their start, as vLLM)

    def cut(self, now: float) -> bool:
        """Keep the steps up to the one in flight at `now` (an arrival at a step's end waits for the next
        step, as an arrival event precedes a step end at the same time); True when steps were dropped."""
        keep = max(self.committed + 1, self.started, bisect.bisect_left(self.ends, now) + 1)
        if keep >= len(self.ends):
            return False
        del self.ends[keep:]
        del self.durations[keep:]
        self.finishing = False
        return True

    @property
    def end(self) -> float:
        return self.ends[-1]


@dataclass
class EngineStats:
    """Cumulative counters, named after the vLLM metrics they feed."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    preemptions: int = 0
    pd_pushes: int = 0  # LMCache PD sender: pushes whose every TP rank notified the router
    pd_push_failures: int = 0  # ... pushes a rank could not complete (receiver unreachable or full)
    pd_rejected_chunks: int = 0  # LMCache PD receiver: chunks refused because the PD buffer was full
    pd_loaded_tokens: int = 0  # ... prompt tokens loaded from the PD buffer instead of prefilled
    # NIXL, counted per TP worker as vLLM's workers each count and the engine sums them (stats.py aggregate):
    nixl_failed_transfers: int = 0  # decode side: reads that failed (side channel unreachable or refused)
    nixl_kv_expired_reqs: int = 0  # prefill side: holds released because their lease expired unread
    # LMCache's own counters (lmcache:num_requested_tokens, lmcache:num_hit_tokens): prompt tokens beyond
    # vLLM's GPU hit that LMCache was asked to retrieve, and those it retrieved (CPU tier or a peer)
    lmcache_requested_tokens: int = 0
    lmcache_hit_tokens: int = 0
    lmcache_p2p_hit_tokens: int = 0  # ... of which a peer supplied (p2p)
    lmcache_p2p_served_tokens: int = 0  # tokens this engine's CPU tier sent to peers (p2p, serving side)
    request_success: dict[str, int] = field(default_factory=dict)
    requests_failed: int = 0
    steps: int = 0
    busy_seconds: float = 0.0


@dataclass(frozen=True)
class LmcacheSettings:
    cpu_capacity_chunks: int
    p2p: bool = False
    load: bool = True  # kv_producer: LMCache reports no external hits to a prefill engine
    save: bool = True  # kv_consumer: LMCache skips every save on a decode engine
    pd_role: str | None = None  # "sender" or "receiver" in LMCache PD mode (enable_pd)
    pd_buffer_chunks: int = 0  # receiver: chunks its PD buffer (pd_buffer_size per TP rank) holds
    # sender (kv_connector_extra_config): push only whole chunks. LMCache's default (False) with PD's forced
    # save_unfull_chunk pushes the partial last chunk too (vllm_v1_adapter.py _init_connector_state).
    discard_partial_chunks: bool = False
    # receiver (kv_connector_extra_config): LMCache looks the request's tokens up without the last n
    skip_last_n_tokens: int = 0
    # receiver: LMCache refuses to start when its PD buffer holds fewer tokens (pd_backend_async.py)
    pd_max_prefill_len: int = 0

    def __post_init__(self) -> None:
        if self.pd_role not in (None, "sender", "receiver"):
            raise ValueError(f'pd_role must be "sender" or "receiver", got {self.pd_role!r}')
        if self.skip_last_n_tokens < 0:
            raise ValueError(f"skip_last_n_tokens must be >= 0, got {self.skip_last_n_tokens}")


class EngineCore:
    def __init__(
        self,
        profile: EngineProfile,
        engine_id: str,
        *,
        prefix_caching: bool = True,
        lmcache: LmcacheSettings | None = None,
        nixl: bool = False,
        kv_lease_s: float = 30.0,
        recompute_on_load_failure: bool = False,
        prefix_index: PrefixIndex | None = None,
        chunk_tokens: int = 256,
    ) -> None:
        profile.validate()
        self.profile = profile
        self.engine_id = engine_id
        self.lmcache = lmcache
        self.nixl = nixl
        self.kv_lease_s = kv_lease_s
        self.recompute_on_load_failure = recompute_on_load_failure
        self.prefix_index = prefix_index
        self.pool = BlockPool(
            total_blocks=profile.kv_capacity_blocks,
            block_tokens=profile.kv_block_tokens,
            chunk_tokens=chunk_tokens,
            prefix_caching=prefix_caching,
        )
        self.cpu_store = LruChunkStore(lmcache.cpu_capacity_chunks) if lmcache else None
        self.pd_buffer = (
            PdBuffer(lmcache.pd_buffer_chunks, profile.tensor_parallel)
            if lmcache is not None and lmcache.pd_role == "receiver"
            else None
        )
        if self.pd_buffer is not None and lmcache is not None and lmcache.pd_max_prefill_len > 0:
            capacity_tokens = self.pd_buffer.capacity_chunks * chunk_tokens
            if capacity_tokens < lmcache.pd_max_prefill_len:
                raise ValueError(
                    f"PD buffer too small for the configured pd_max_prefill_len: capacity_tokens="
                    f"{capacity_tokens} < pd_max_prefill_len={lmcache.pd_max_prefill_len}. Increase "
                    "pd_buffer_size so that the buffer holds at least pd_max_prefill_len tokens."
                )
        self._pushes: list[PdPush] = []
        self.stats = EngineStats()
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._transferring: list[_Seq] = []
        self._holds: dict[str, tuple[_Seq, KvHold]] = {}
        self._by_id: dict[str, _Seq] = {}
        self._reads: list[RemoteRead] = []
        self._block_ids = itertools.count()

    # ----- inputs -----

    @property
    def has_kv_connector(self) -> bool:
        return self.nixl or self.lmcache is not None

    def add_request(self, request: EngineRequest, now: float) -> None:
        if request.request_id in self._by_id:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        if len(request.prompt_token_ids) + request.output_tokens > self.profile.max_model_len:
            raise ValueError(
                f"prompt ({len(request.prompt_token_ids)}) + output ({request.output_tokens}) tokens exceed "
                f"max_model_len {self.profile.max_model_len}"
            )
        hashes = request.chunk_hashes
        if hashes is None:
            hashes = chunk_hashes(request.prompt_token_ids, self.pool.chunk_tokens)
        elif len(hashes) != len(request.prompt_token_ids) // self.pool.chunk_tokens:
            raise ValueError(
                f"request {request.request_id!r}: {len(hashes)} chunk hashes for a prompt of "
                f"{len(request.prompt_token_ids)} tokens in chunks of {self.pool.chunk_tokens}"
            )
        seq = _Seq(request=request, arrival=now, hashes=list(hashes))
        self._by_id[request.request_id] = seq
        self._waiting.append(seq)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._by_id

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is (client went away); its KV is freed at once."""
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return False
        if seq.state is _State.WAITING:
            self._waiting.remove(seq)
        elif seq.state is _State.WAITING_FOR_KV:
            self._transferring.remove(seq)
            self._free(seq)
        elif seq.state is _State.RUNNING:
            self._running.remove(seq)
            self._free(seq)
        elif seq.state is _State.HELD:
            self._holds.pop(request_id, None)
            self._free(seq)
        if seq.state is not _State.HELD:  # a held prefill leg already counted as finished
            self._count_finish(FINISH_ABORT)
        seq.state = _State.DONE
        return True

    def take_remote_reads(self) -> list[RemoteRead]:
        reads, self._reads = self._reads, []
        return reads

    def take_pd_pushes(self) -> list[PdPush]:
        pushes, self._pushes = self._pushes, []
        return pushes

    def pd_offer(self, rank: int, chunk_keys: Sequence[bytes]) -> bool:
        """A sender's TP rank asks this receiver to take chunks (LMCache's AllocRequest); all or nothing.

        False when they do not fit in the PD buffer now: LMCache's receiver then answers -1 and the sender
        aborts the request without notifying the router. The driver decides how long to wait for room first
        (`pd_fits`, pd_allocation_timeout_sec); a push that can never fit (`pd_can_ever_hold`) fails at once.
        """
        buffer = self._pd_receiver_buffer()
        accepted = buffer.offer(rank, chunk_keys)
        if not accepted:
            self.stats.pd_rejected_chunks += len(chunk_keys)
        return accepted

    def pd_fits(self, rank: int, chunks: int) -> bool:
        return self._pd_receiver_buffer().fits(rank, chunks)

    def pd_can_ever_hold(self, chunks: int) -> bool:
        return self._pd_receiver_buffer().can_ever_hold(chunks)

    def _pd_receiver_buffer(self) -> PdBuffer:
        if self.pd_buffer is None:
            raise LookupError("this engine is not an LMCache PD receiver")
        return self.pd_buffer

    def remote_read_done(
        self, request_id: str, now: float, error: str | None = None, transfer_seconds: float | None = None
    ) -> RequestFailed | None:
        """The driver finished contacting the source engine: start the modelled transfer, or fail the request.

        `transfer_seconds` is how long the KV takes to land from `now`; None charges the profile's figure for
        one transfer alone on the link (a driver that models shared links times it itself and passes 0 once
        the bytes have arrived).

        A failed read fails the request, as vLLM does with kv_load_failure_policy "fail" (the request finishes
        with an error); with "recompute" the request goes back to the queue and is prefilled locally.
        """
        if error is not None:
            # The transport failed whatever became of the request (vLLM counts failed handshakes and reads).
            self.stats.nixl_failed_transfers += self.profile.tensor_parallel
        seq = self._by_id.get(request_id)
        if seq is None or seq.state is not _State.WAITING_FOR_KV:
            return None
        if error is not None and self.recompute_on_load_failure:
            self._transferring.remove(seq)
            self._free(seq)
            seq.remote_kv_loaded = True  # never read again: compute it here
            seq.state = _State.WAITING
            self._waiting.appendleft(seq)
            return None
        if error is not None:
            self._transferring.remove(seq)
            self._free(seq)
            seq.state = _State.DONE
            del self._by_id[request_id]
            self.stats.requests_failed += 1
            self._count_finish(FINISH_ERROR)
            return RequestFailed(request_id, now, error)
        if transfer_seconds is None:
            transfer_seconds = timing.nixl_transfer_time(self.profile, seq.external_tokens)
        seq.kv_ready_at = now + transfer_seconds
        return None

    def release_hold(
        self, request_id: str, engine_id: str, now: float, block_ids: tuple[int, ...] | None = None
    ) -> HoldRelease:
        """A decode engine reads a finished prefill's KV; afterwards its blocks return to the prefix cache.

        Raises LookupError as the NIXL side channel would fail: wrong engine, unknown or expired request, or
        blocks that are not the ones held for it.
        """
        if engine_id != self.engine_id:
            raise LookupError(f"engine {engine_id!r} is not this engine ({self.engine_id!r})")
        self._expire_holds(now)
        entry = self._holds.get(request_id)
        if entry is None:
            raise LookupError(
                f"no KV blocks held for request {request_id!r} on engine {self.engine_id!r} "
                f"(unknown request, or its {self.kv_lease_s:g} s lease expired)"
            )
        seq, hold = entry
        if block_ids is not None and block_ids != hold.block_ids:
            raise LookupError(f"block ids do not match the blocks held for request {request_id!r}")
        del self._holds[request_id]
        self._free(seq)
        seq.state = _State.DONE
        self._by_id.pop(request_id, None)
        return HoldRelease(prompt_tokens=hold.prompt_tokens)

    # ----- observation -----

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self._transferring)

    @property
    def num_held(self) -> int:
        return len(self._holds)

    @property
    def kv_usage(self) -> float:
        return self.pool.usage

    def idle(self) -> bool:
        return not (self._waiting or self._running or self._transferring)

    def next_wakeup(self) -> float | None:
        times = [s.kv_ready_at for s in self._transferring if s.kv_ready_at is not None]
        times += [hold.expires_at for _, hold in self._holds.values()]
        return min(times) if times else None

    def cpu_chunks(self) -> list[bytes]:
        """Chunks this engine's LMCache CPU tier holds (what p2p peers may fetch)."""
        return list(self.cpu_store._chunks) if self.cpu_store is not None else []

    # ----- the loop -----

    def schedule(self, now: float) -> ScheduledStep | None:
        self._expire_holds(now)
        for seq in [s for s in self._transferring if s.kv_ready_at is not None and s.kv_ready_at <= now]:
            self._transferring.remove(seq)
            seq.state = _State.RUNNING
            seq.remote_kv_loaded = True
            # vLLM recomputes the last prompt token locally to get logits for the first output token
            seq.num_computed = seq.prompt_len - 1
            self._running.append(seq)

        budget = self.profile.max_num_batched_tokens
        entries: list[StepEntry] = []
        load_s = 0.0
        scheduled: set[int] = set()
        index = 0
        preemptions_before = self.stats.preemptions
        while index < len(self._running) and budget > 0:
            seq = self._running[index]
            new = min(seq.total_tokens - seq.num_computed, budget)
            if not self._grow(seq, seq.num_computed + new, scheduled):
                # seq itself was preempted (it was the lowest priority left)
                continue
            entries.append(StepEntry(seq, new, seq.num_computed))
            scheduled.add(id(seq))
            load_s += seq.pending_load_s
            seq.pending_load_s = 0.0
            budget -= new
            index += 1

        # as vLLM: no admissions in a step that had to preempt (memory is short; admitting would thrash)
        while (
            self._waiting
            and budget > 0
            and len(self._running) < self.profile.max_num_seqs
            and self.stats.preemptions == preemptions_before
        ):
            seq = self._waiting[0]
            admitted = self._admit(seq, budget)
            if admitted is None:
                break
            self._waiting.popleft()
            if seq.state is _State.WAITING_FOR_KV:
                continue
            entries.append(admitted)
            load_s += seq.pending_load_s
            seq.pending_load_s = 0.0
            budget -= admitted.new_tokens

        if not entries:
            return None
        prefill_chunks = [
            timing.PrefillChunk(e.new_tokens, e.context_tokens)
            for e in entries
            if e.context_tokens < e.seq.prompt_len
        ]
        decode_contexts = [e.context_tokens for e in entries if e.context_tokens >= e.seq.prompt_len]
        duration = timing.step_time(self.profile, prefill_chunks, decode_contexts, load_s)
        self.stats.steps += 1
        self.stats.busy_seconds += duration
        return ScheduledStep(
            start=now,
            duration=duration,
            entries=tuple(entries),
            prefill_tokens=sum(c.new_tokens for c in prefill_chunks),
            decode_requests=len(decode_contexts),
        )

    def decode_run(self, now: float, max_steps: int = 64) -> DecodeRun | None:
        """The next steps at once when the engine is in a steady decode batch: nothing waiting, loading or
        held, every running request decoding within the token budget, up to the step in which the first of
        them finishes, for as long as the KV blocks the batch grows into are there (free or evictable). None
        when `schedule` is needed (fewer than two such steps). Each step's duration is `timing.step_time`
        of the batch at that step."""
        running = self._running
        profile = self.profile
        if (
            not running
            or self._waiting
            or self._transferring
            or self._holds
            or profile.zero_compute
            or len(running) > profile.max_num_batched_tokens
        ):
            return None
        left = max_steps + 1  # steps until the first finish
        context = 0
        for seq in running:
            if seq.num_computed != seq.total_tokens - 1 or seq.num_computed < seq.prompt_len:
                return None
            left = min(left, seq.request.output_tokens - seq.num_output)
            context += seq.num_computed
        steps = min(left, max_steps)
        if steps < 2:
            return None

        def fits(count: int) -> bool:
            return self.pool.can_allocate(
                sum(self._blocks_needed(seq, seq.num_computed + count) for seq in running)
            )

        # each request grows by at most steps // block + 1 blocks: when that fits, no need to count
        worst = len(running) * (steps // self.pool.block_tokens + 1)
        if not self.pool.can_allocate(worst) and not fits(steps):
            low, high = 0, steps  # fits(low), not fits(high)
            while high - low > 1:
                middle = (low + high) // 2
                if fits(middle):
                    low = middle
                else:
                    high = middle
            steps = low
            if steps < 2:
                return None
        batch = len(running)
        fixed = timing.step_time(profile, (), [0] * batch)  # the batch's cost without its KV reads
        # + timing.decode_attention_time(profile, context), inlined term for term (the same floats)
        kv_bytes, ranks = profile.model.kv_bytes_per_token, profile.tensor_parallel
        bandwidth = profile.hardware.hbm_bytes_per_s * profile.bandwidth_efficiency
        durations: list[float] = []
        ends: list[float] = []
        at = now
        for _ in range(steps):
            duration = fixed + context * kv_bytes / ranks / bandwidth
            at = at + duration
            durations.append(duration)
            ends.append(at)
            context += batch
        ids = tuple(s.request.request_id for s in running)
        return DecodeRun(now, ends, durations, ids, tuple(running), finishing=steps == left)

    def start_decode_steps(self, run: DecodeRun, upto: int) -> None:
        """The run's steps up to `upto` have started: their KV blocks are taken and their time counted as
        busy, as `schedule` does at a step's start (what a reader of `kv_usage` or `stats` sees mid-run)."""
        upto = min(upto, len(run.ends))
        if upto <= run.started:
            return
        ahead = upto - run.committed
        for seq in run.seqs:
            if seq.state is not _State.RUNNING:
                raise AssertionError(f"request {seq.request.request_id} left the batch during a decode run")
            need = self._blocks_needed(seq, seq.num_computed + ahead)
            if not self.pool.allocate(need):
                raise AssertionError("a decode run outgrew the KV blocks it was sized for")
            seq.private_blocks += need
        stats = self.stats
        stats.steps += upto - run.started
        for duration in run.durations[run.started : upto]:
            stats.busy_seconds += duration
        run.started = upto

    def commit_decode_run(self, run: DecodeRun, steps: int) -> list[TokenEvent]:
        """Apply the run's next `steps` steps (each running request computed one more token per step); the
        last tokens of the requests that finish in a finishing run's last step, as `complete` gives them."""
        if steps <= 0:
            return []
        if run.committed + steps > len(run.ends):
            raise ValueError(f"the run has {len(run.ends) - run.committed} steps left, not {steps}")
        self.start_decode_steps(run, run.committed + steps)
        for seq in run.seqs:
            seq.num_computed += steps
            seq.num_output += steps
        self.stats.generation_tokens += steps * len(run.seqs)
        run.committed += steps
        if not run.finishing or run.committed < len(run.ends):
            return []
        end = run.ends[-1]
        return [
            self._finish(seq, end, seq.num_output - 1)
            for seq in run.seqs
            if seq.num_output == seq.request.output_tokens
        ]

    def complete(self, step: ScheduledStep) -> list[Event]:
        now = step.end
        events: list[Event] = []
        for entry in step.entries:
            seq = entry.seq
            if seq.state is not _State.RUNNING:
                continue  # aborted or preempted while the step ran
            seq.num_computed += entry.new_tokens
            self._publish_computed_chunks(seq)
            if seq.num_computed < seq.total_tokens:
                continue  # a prefill chunk that did not reach the end of the prompt
            index = seq.num_output
            seq.num_output += 1
            self.stats.generation_tokens += 1
            if index == 0:
                self.stats.prompt_tokens += seq.prompt_len
                self._queue_pd_push(seq)
            if seq.num_output < seq.request.output_tokens:
                events.append(TokenEvent(seq.request.request_id, now, index))
                continue
            events.append(self._finish(seq, now, index))
        return events

    # ----- internals -----

    def _queue_pd_push(self, seq: _Seq) -> None:
        spec = seq.request.disagg
        if spec is None or self.lmcache is None or self.lmcache.pd_role != "sender":
            return  # LMCache pushes nothing without a disagg_spec
        if self.lmcache.discard_partial_chunks:
            keys, tokens = list(seq.hashes), len(seq.hashes) * self.pool.chunk_tokens
        else:
            keys, tokens = (
                lmcache_chunk_keys(seq.request.prompt_token_ids, self.pool.chunk_tokens),
                seq.prompt_len,
            )
        self._pushes.append(PdPush(seq.request.request_id, spec, tuple(keys), tokens))

    def _count_finish(self, reason: str) -> None:
        self.stats.request_success[reason] = self.stats.request_success.get(reason, 0) + 1

    def _finish(self, seq: _Seq, now: float, index: int) -> TokenEvent:
        request = seq.request
        self._running.remove(seq)
        reason = request.finish_reason
        self._count_finish(reason)
        if request.remote_decode and self.nixl and reason == FINISH_LENGTH:
            blocks = len(seq.chunk_keys) * self.pool.blocks_per_chunk + seq.private_blocks
            hold = KvHold(
                request_id=request.request_id,
                block_ids=tuple(next(self._block_ids) for _ in range(blocks)),
                prompt_tokens=seq.prompt_len,
                expires_at=now + self.kv_lease_s,
            )
            seq.state = _State.HELD
            self._holds[request.request_id] = (seq, hold)
            return TokenEvent(request.request_id, now, index, reason, hold)
        self._free(seq)
        seq.state = _State.DONE
        self._by_id.pop(request.request_id, None)
        return TokenEvent(request.request_id, now, index, reason)

    def _expire_holds(self, now: float) -> None:
        for request_id, (seq, hold) in list(self._holds.items()):
            if hold.expires_at <= now:
                del self._holds[request_id]
                self.stats.nixl_kv_expired_reqs += self.profile.tensor_parallel
                self._free(seq)
                seq.state = _State.DONE
                self._by_id.pop(request_id, None)

    def _free(self, seq: _Seq) -> None:
        self.pool.unuse(seq.chunk_keys)
        self.pool.release(seq.private_blocks)
        seq.chunk_keys = []
        seq.private_blocks = 0

    def _blocks_needed(self, seq: _Seq, tokens: int) -> int:
        beyond_chunks = tokens - len(seq.chunk_keys) * self.pool.chunk_tokens
        return max(0, self.pool.blocks_for(beyond_chunks) - seq.private_blocks)

    def _grow(self, seq: _Seq, tokens: int, scheduled: set[int]) -> bool:
        """Make room for `tokens` of KV for a running seq, preempting from the back of the running list."""
        need = self._blocks_needed(seq, tokens)
        while not self.pool.allocate(need):
            victim = self._running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
            if id(victim) in scheduled:
                raise AssertionError("preempted a request already scheduled in this step")
        seq.private_blocks += need
        return True

    def _preempt(self, seq: _Seq) -> None:
        self._running.remove(seq)
        self._free(seq)
        seq.num_computed = 0
        seq.state = _State.WAITING
        self._waiting.appendleft(seq)
        self.stats.preemptions += 1

    def _admit(self, seq: _Seq, budget: int) -> StepEntry | None:
        """Try to start a waiting request; None when its KV does not fit (it keeps waiting, and so do those
        behind)."""
        # at least one prompt token is always computed locally (vLLM needs its logits)
        lookup = seq.hashes[: (seq.prompt_len - 1) // self.pool.chunk_tokens]
        gpu_chunks = self.pool.cached_prefix(lookup)
        self.pool.acquire(lookup[:gpu_chunks])
        seq.chunk_keys = list(lookup[:gpu_chunks])
        gpu_tokens = gpu_chunks * self.pool.chunk_tokens
        remote = seq.request.remote_prefill
        if remote is not None and self.nixl and not seq.remote_kv_loaded:
            need = self._blocks_needed(seq, seq.prompt_len)
            if not self.pool.allocate(need):
                self._undo_admission(seq)
                return None
            seq.private_blocks = need
            seq.external_tokens = seq.prompt_len - gpu_tokens
            self._record_admission(seq, gpu_tokens, seq.external_tokens)
            seq.state = _State.WAITING_FOR_KV
            self._transferring.append(seq)
            self._reads.append(RemoteRead(seq.request.request_id, remote, seq.external_tokens))
            return StepEntry(seq, 0, 0)

        pd_keys, pd_tokens = self._pd_hit(seq, gpu_tokens)
        cpu_tokens, peer_tokens = (0, 0) if pd_keys else self._external_prefix(lookup, gpu_chunks)
        computed = gpu_tokens + pd_tokens + cpu_tokens + peer_tokens
        new = min(seq.total_tokens - computed, budget)
        need = self._blocks_needed(seq, computed + new)
        if not self.pool.allocate(need):
            self._undo_admission(seq)
            return None
        if self.pd_buffer is not None and pd_keys:
            # LMCache's PD backend frees a pushed chunk once it has been retrieved, and only then
            self.pd_buffer.take(pd_keys)
            self.stats.pd_loaded_tokens += pd_tokens
        seq.private_blocks = need
        seq.num_computed = computed
        seq.pending_load_s = (
            timing.host_load_time(self.profile, cpu_tokens)
            + timing.kv_transfer_time(self.profile, peer_tokens, self.profile.hardware.kv_link_bytes_per_s)
            + timing.device_copy_time(self.profile, pd_tokens)
        )
        self._record_admission(seq, gpu_tokens, pd_tokens + cpu_tokens + peer_tokens)
        if self.lmcache is not None and self.lmcache.load and self.lmcache.pd_role is None:
            self.stats.lmcache_requested_tokens += seq.prompt_len - gpu_tokens
            self.stats.lmcache_hit_tokens += cpu_tokens + peer_tokens
            self.stats.lmcache_p2p_hit_tokens += peer_tokens
        seq.state = _State.RUNNING
        self._running.append(seq)
        return StepEntry(seq, new, computed)

    def _undo_admission(self, seq: _Seq) -> None:
        self.pool.unuse(seq.chunk_keys)
        seq.chunk_keys = []

    def _record_admission(self, seq: _Seq, gpu_hit_tokens: int, external_hit_tokens: int) -> None:
        self.stats.prefix_cache_queries += seq.prompt_len
        self.stats.prefix_cache_hits += gpu_hit_tokens
        if self.has_kv_connector:
            self.stats.external_prefix_cache_queries += seq.prompt_len - gpu_hit_tokens
            self.stats.external_prefix_cache_hits += external_hit_tokens

    def _pd_hit(self, seq: _Seq, gpu_tokens: int) -> tuple[list[bytes], int]:
        """LMCache PD receiver: the pushed chunks this request retrieves, and the prompt tokens they add.

        As LMCache does (vllm_v1_adapter.py get_num_new_matched_tokens, then the retrieve): look up the
        request's tokens without the last skip_last_n_tokens, keys with the partial tail included; the hit is
        the leading run of keys the buffer holds; chunks inside what vLLM's own prefix cache already computed
        are masked and so not retrieved (they stay in the buffer); a hit covering every token still leaves the
        last one to compute.
        """
        if self.pd_buffer is None or self.lmcache is None or not self.lmcache.load:
            return [], 0
        tokens = list(seq.request.prompt_token_ids)
        if self.lmcache.skip_last_n_tokens:
            tokens = tokens[: -self.lmcache.skip_last_n_tokens]
        chunk = self.pool.chunk_tokens
        keys = lmcache_chunk_keys(tokens, chunk)
        hit = 0
        while hit < len(keys) and keys[hit] in self.pd_buffer:
            hit += 1
        hit_tokens = min(hit * chunk, len(tokens), seq.prompt_len - 1)
        masked = gpu_tokens // chunk
        if hit_tokens <= gpu_tokens:
            return [], 0
        return keys[masked:hit], hit_tokens - gpu_tokens

    def _external_prefix(self, lookup: Sequence[bytes], start: int) -> tuple[int, int]:
        """LMCache: tokens after the GPU hit found in this engine's CPU tier, then at a peer (p2p)."""
        if self.cpu_store is None or self.lmcache is None or not self.lmcache.load:
            return 0, 0
        cpu = peer = 0
        for key in lookup[start:]:
            if key in self.cpu_store:
                self.cpu_store.touch(key)
                cpu += 1
            elif (
                self.lmcache.p2p
                and self.prefix_index is not None
                and self.prefix_index.holder(key, self.engine_id)
            ):
                peer += 1
            else:
                break
        return cpu * self.pool.chunk_tokens, peer * self.pool.chunk_tokens

    def _publish_computed_chunks(self, seq: _Seq) -> None:
        """Chunks whose every prompt token now has KV become prefix-cache entries (LMCache stores them)."""
        complete_chunks = min(seq.num_computed, seq.prompt_len) // self.pool.chunk_tokens
        while len(seq.chunk_keys) < complete_chunks:
            key = seq.hashes[len(seq.chunk_keys)]
            first_copy = self.pool.publish(key)
            seq.private_blocks -= self.pool.blocks_per_chunk
            if not first_copy:
                self.pool.release(self.pool.blocks_per_chunk)
            seq.chunk_keys.append(key)
            self._store_in_lmcache(key)

    def _store_in_lmcache(self, key: bytes) -> None:
        if self.cpu_store is None or self.lmcache is None or not self.lmcache.save:
            return
        evicted = self.cpu_store.store(key)
        if self.prefix_index is not None and self.lmcache is not None and self.lmcache.p2p:
            self.prefix_index.add(self.engine_id, key)
            if evicted is not None:
                self.prefix_index.remove(self.engine_id, evicted)
