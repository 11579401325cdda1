"""One pool of simulated engines in virtual time, driven by the real router and autoscaler decisions.

Engines are `EngineCore`s (the fake engine's timing and KV model). The router part is the production code:
the live router's scheduling core picks the pods and the route (`sim/router.py` drives it as
`router/generate.py` does), and `adapt` moves an adaptive threshold from the same router-observed samples the
router collects. A disaggregated request runs a one-token prefill leg on a prefill engine that keeps its KV
(NIXL `remote_decode`), then a decode leg on a decode engine that reads that KV (`remote_prefill`): the
decode engine asks for the read, the simulator moves the KV bytes (the model's KV bytes per token times the
prompt tokens the decode engine lacks) over the prefill replica's send link and the decode replica's receive
link, shared max-min fairly with every other transfer on them (`network.Network`; one transfer alone takes
the profile's `nixl_transfer_time`), and releases the prefill engine's hold once the last byte has landed, as
NIXL's side channel does on the read's completion notification.

Engines may be tuned per role: the prefill chunk (vLLM's --max-num-batched-tokens) of prefill replicas and
of decode (or colocated) replicas, which also prefill the prompts that go direct; a small chunk keeps a long
prompt from stalling every co-running decode (chunked-prefill interference), a large one batches prefill.

With LMCache on (`lmcache_cpu_gib`, `lmcache_p2p`), every engine has LMCache's CPU tier: a prefix its GPU
cache evicted loads over the host link, and with p2p a prefix any peer's CPU tier holds is fetched over the KV
link (the engines' own model, `EngineCore._external_prefix`), both inside the admitting step.

Speed: a decode engine whose batch is steady (nothing waiting or loading, every request decoding) is
timed many steps at once (`EngineCore.decode_run`); a request reaching it cuts the run at the step in
flight, and the planner and the threshold see every step that has ended before they read, so the
figures are those of stepping one step at a time (tests/unit/test_sim_speed.py). Each prompt is hashed once
however often a trace is replayed.

Autoscaling is the operator's SLA planner, and it reads only metric pages: every ready engine's vLLM page
(TTFT, ITL and TPOT histograms in vLLM's buckets) and the router's, read by the operator's feed
(`scrape.py`).
A new replica holds its GPUs from the decision on but serves only after the model-load delay; a removed
replica stops taking requests, finishes what it has (and any KV a decode engine still has to read), then
gives its GPUs back.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from inferencepool.api.v1alpha1 import POOL_ROLES, PoolRole, RoutingPolicy
from inferencepool.autoscaler.capacity import CapacityModel, from_profile
from inferencepool.autoscaler.planner import Plan, Planner, PlannerSettings
from inferencepool.engine_sim.core import (
    DecodeRun,
    EngineCore,
    EngineRequest,
    LmcacheSettings,
    RemotePrefill,
    RemoteRead,
    RequestFailed,
    ScheduledStep,
    TokenEvent,
)
from inferencepool.engine_sim.kv import CHUNK_TOKENS, SharedPrefixIndex, chunk_hashes
from inferencepool.engine_sim.metrics import ITL_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS, LatencyCounts
from inferencepool.perf import timing
from inferencepool.perf.profiles import EngineProfile
from inferencepool.router.config import (
    AdaptiveThresholdConfig,
    PrefixAffinityConfig,
    RouterConfig,
    StaticBackends,
)
from inferencepool.router.pods import EngineRole, PodSpec
from inferencepool.router.threshold import SampleWindow, adapt
from inferencepool.scheduling.decider import Route
from inferencepool.sim.network import Network
from inferencepool.sim.router import SimRouter
from inferencepool.sim.scrape import Scrape
from inferencepool.sim.workload import TraceRequest, prompt_ids

REJECTED = "rejected"  # longer than max_model_len: the engine answers 400 and nothing runs
CHUNK_CONTEXT_TOKENS = 2048  # the context a decode pod's prefill chunk is sized at (`chunk_for_itl`)


def chunk_for_itl(profile: EngineProfile, itl_seconds: float) -> int:
    """The prefill chunk (--max-num-batched-tokens) for engines that decode: the largest power of two, 256 at
    least, whose prefill step alone (at 2k tokens of context) fits the ITL target, so a prompt prefilled
    beside running decodes stretches each of their steps by less than the target. On an H100 with Llama 3.1
    8B: 512 for 25 ms, 1024 for 40 ms, the chunks that the colocated sweep finds best at those targets."""
    chunk = 256
    while chunk * 2 <= profile.max_num_batched_tokens and (
        timing.step_time(profile, [timing.PrefillChunk(chunk * 2, CHUNK_CONTEXT_TOKENS)], ()) <= itl_seconds
    ):
        chunk *= 2
    return chunk


class _PromptWork:
    """What the router and the engines derive from one prompt's ids, computed once however often the
    prompt is replayed (every scenario and every probe of a goodput search replays the same trace)."""

    __slots__ = ("hashes", "ids", "keys")

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = ids
        self.hashes: tuple[bytes, ...] | None = None  # the engines' chunk hashes (`kv.chunk_hashes`)
        self.keys: dict[int, list[int]] = {}  # the router's block keys, by block size in tokens

    def block_keys(self, router: SimRouter) -> list[int]:
        keys = self.keys.get(router.block_tokens)
        if keys is None:
            keys = self.keys[router.block_tokens] = router.keys(self.ids)
        return keys

    def chunk_hashes(self) -> tuple[bytes, ...]:
        if self.hashes is None:
            self.hashes = tuple(chunk_hashes(self.ids, CHUNK_TOKENS))
        return self.hashes


_PROMPTS: dict[tuple[int, int, tuple[int, ...]], _PromptWork] = {}
_PROMPTS_KEPT = 1 << 20


def _prompt_work(request: TraceRequest, number: int) -> _PromptWork:
    """Request `number` of a trace: an Azure prompt's ids follow from its number and length, a Mooncake
    prompt's from its length and blocks (whatever its number)."""
    key = (-1 if request.block_ids else number, request.prompt_tokens, request.block_ids)
    work = _PROMPTS.get(key)
    if work is None:
        if len(_PROMPTS) >= _PROMPTS_KEPT:
            _PROMPTS.clear()
        work = _PROMPTS[key] = _PromptWork(prompt_ids(request, number))
    return work


@dataclass(frozen=True)
class PlannerScaling:
    """The SLA planner (`autoscaler.planner`), fed every interval from the simulated router's and engines'
    metric pages by the operator's feed. The capacity model is seeded from the profile with the prefill
    role's chunk; `window_seconds` is the latency window of the observed percentiles."""

    settings: PlannerSettings
    window_seconds: float = 60.0
    percentile: int = 90


LENT = Route.LENT.value  # a record's route


@dataclass(frozen=True)
class Scenario:
    name: str
    policy: RoutingPolicy
    prefill_replicas: int  # 0 for Colocated
    decode_replicas: int  # every engine of a Colocated pool
    threshold_tokens: int = 4096
    adaptive: AdaptiveThresholdConfig | None = None
    prefix_affinity: bool = True
    prefill_chunk_tokens: int | None = None  # --max-num-batched-tokens of prefill replicas (None: profile's)
    decode_chunk_tokens: int | None = None  # ... of decode replicas, or of every replica of a Colocated pool
    # --max-num-seqs per role (None: the profile's, capped at the chunk as vLLM requires)
    prefill_max_num_seqs: int | None = None
    decode_max_num_seqs: int | None = None
    planner: PlannerScaling | None = None
    # the router's latency targets (its load-aware bypass weighs routes against them); None: the router's
    # defaults, as for a pool without autoscaling targets
    ttft_target_seconds: float | None = None
    itl_target_seconds: float | None = None
    # the router's config as the operator renders it from a pool spec (`builders.router.router_config`; the
    # `deployed` scenario); None: one built from the fields above (`router_config`)
    router: RouterConfig | None = None
    # decode (or colocated) pods' chunk from this ITL target (`chunk_for_itl`), unless decode_chunk_tokens
    chunk_itl_seconds: float | None = None
    # LMCache on every engine (the pool's kvCache): a CPU tier of this many GiB per replica (LMCache's
    # max_local_cpu_size times the TP ranks; 0: no LMCache), hits loaded over the host link; with p2p, a chunk
    # any peer's CPU tier holds is fetched over the KV link instead of recomputed
    lmcache_cpu_gib: float = 0.0
    lmcache_p2p: bool = False

    def __post_init__(self) -> None:
        if self.lmcache_cpu_gib < 0:
            raise ValueError(f"scenario {self.name}: the LMCache CPU tier must be >= 0 GiB")
        if self.lmcache_p2p and self.lmcache_cpu_gib <= 0:
            raise ValueError(f"scenario {self.name}: LMCache p2p shares the CPU tier, which needs > 0 GiB")
        for chunk in (self.prefill_chunk_tokens, self.decode_chunk_tokens):
            if chunk is not None and chunk < 1:
                raise ValueError(f"scenario {self.name}: a prefill chunk must be >= 1 token, got {chunk}")
        if self.decode_replicas < 1:
            raise ValueError(f"scenario {self.name}: needs at least one decode (or colocated) replica")
        if self.planner is not None and self.policy == "Colocated":
            raise ValueError(f"scenario {self.name}: the planner sizes a P/D pool's two roles")
        planned_zero = self.planner is not None and self.planner.settings.prefill.min_replicas == 0
        if self.policy != "Colocated" and self.prefill_replicas < (0 if planned_zero else 1):
            raise ValueError(f"scenario {self.name}: {self.policy} needs at least one prefill replica")
        if self.policy == "Colocated" and self.prefill_replicas:
            raise ValueError(f"scenario {self.name}: a Colocated pool has no prefill replicas to scale")
        router = self.router
        if router is not None and (
            router.policy != self.policy or router.prefill_threshold_tokens != self.threshold_tokens
        ):
            raise ValueError(f"scenario {self.name}: its router config routes by another policy or threshold")

    def router_config(self) -> RouterConfig:
        """What the simulated router runs: the operator's rendering when the scenario carries one, else the
        scenario's policy, threshold, adaptive threshold, targets and prefix affinity on router defaults."""
        if self.router is not None:
            return self.router
        defaults = self.adaptive or AdaptiveThresholdConfig()
        update: dict[str, object] = {}
        if self.ttft_target_seconds is not None:
            update["ttft_target_milliseconds"] = round(self.ttft_target_seconds * 1000)
        if self.itl_target_seconds is not None:
            update["itl_target_milliseconds"] = round(self.itl_target_seconds * 1000)
        return RouterConfig(
            static=StaticBackends(),
            policy=self.policy,
            prefill_threshold_tokens=self.threshold_tokens,
            adaptive_threshold=defaults.model_copy(update=update),
            prefix_affinity=PrefixAffinityConfig(enabled=self.prefix_affinity),
        )


@dataclass(eq=False)
class RequestRecord:
    """What the client of one request saw."""

    index: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    route: str = ""
    first_token: float | None = None
    last_token: float | None = None
    finish: float | None = None
    tokens_received: int = 0
    itl_sum: float = 0.0
    error: str | None = None
    finishes: int = 0  # conservation check: exactly one finish per request
    prefill_pod: str | None = None
    decode_pod: str | None = None
    reason: str = ""  # why the router chose the route (`RouteReason`)
    uncached_tokens: int = 0  # what the decode pod would compute, as the router estimated it

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def mean_itl(self) -> float:
        """Time per output token after the first (TPOT, DistServe's decode SLO); 0 for one-token answers."""
        gaps = self.tokens_received - 1
        return self.itl_sum / gaps if gaps > 0 else 0.0

    @property
    def completed(self) -> bool:
        return self.error is None and self.route != REJECTED and self.tokens_received == self.output_tokens


@dataclass(eq=False)
class Replica:
    name: str
    role: EngineRole
    core: EngineCore
    created: float
    ready_at: float
    removed_at: float | None = None
    terminating: bool = False
    step: ScheduledStep | None = None
    run: DecodeRun | None = None  # steps of a steady decode batch timed at once (`EngineCore.decode_run`)
    run_generation: int = 0  # the run end event that is current (a cut run pushes an earlier one)
    wake_at: float | None = None
    legs: dict[str, RequestRecord] = field(default_factory=dict)
    last_token: dict[str, float] = field(default_factory=dict)
    engine_arrival: dict[str, float] = field(default_factory=dict)
    ttft: LatencyCounts = field(default_factory=lambda: LatencyCounts(TTFT_BUCKETS))
    itl: LatencyCounts = field(default_factory=lambda: LatencyCounts(ITL_BUCKETS))
    # vllm:request_time_per_output_token_seconds: each finished request's mean time per output token
    tpot: LatencyCounts = field(default_factory=lambda: LatencyCounts(TPOT_BUCKETS))

    def ready(self, now: float) -> bool:
        return self.removed_at is None and now >= self.ready_at

    def drained(self) -> bool:
        return self.core.idle() and self.core.num_held == 0 and not self.legs


@dataclass(frozen=True)
class ScalingEvent:
    time: float
    role: PoolRole
    from_replicas: int
    replicas: int
    reason: str
    message: str


@dataclass
class ScenarioResult:
    scenario: Scenario
    records: list[RequestRecord]
    itl_gaps: array[float]  # every inter-token gap every client saw
    trace_span: float  # first to last arrival
    makespan: float  # first arrival to the last token
    gpu_seconds: float
    replicas: list[tuple[float, int, int, int, int]]  # time, prefill ready/desired, decode ready/desired
    thresholds: list[tuple[float, int]]
    scaling: list[ScalingEvent]
    engine_steps: int
    preemptions: int
    plans: list[Plan] = field(default_factory=list)  # the planner's decisions, when it ran


Progress = Callable[[str, float, float], None]  # scenario name, virtual time reached, trace span


class ClusterSim:
    _ARRIVAL, _STEP_END, _WAKE, _READY, _THRESHOLD, _PROGRESS, _TRANSFER, _PLAN, _SCRAPE = range(9)

    def __init__(
        self,
        scenario: Scenario,
        profile: EngineProfile,
        trace: Sequence[TraceRequest],
        *,
        horizon: float = 0.0,
        progress: Progress | None = None,
        progress_every: float = 60.0,
        kv_link_bytes_per_s: float | None = None,
        decode_runs: bool = True,
    ) -> None:
        if not trace:
            raise ValueError("an empty trace")
        if kv_link_bytes_per_s is not None and kv_link_bytes_per_s <= 0:
            raise ValueError(f"the KV link must carry > 0 bytes/s per GPU, got {kv_link_bytes_per_s}")
        self.scenario = scenario
        self.profile = profile
        self.trace = sorted(trace, key=lambda r: r.arrival)
        self.horizon = horizon  # keep the autoscaler ticking at least this long (to watch a pool shrink)
        self.progress = progress
        self.progress_every = progress_every
        self.decode_runs = decode_runs
        self.steps_in_runs = 0  # engine steps timed in decode runs (the rest one at a time)
        self.router = SimRouter(scenario.router_config())
        self.pods = self.router.pods
        self.threshold = scenario.threshold_tokens
        self.prefill_samples = SampleWindow()
        self.itl_samples = SampleWindow()
        self.direct_ttft_samples = SampleWindow()  # prompts prefilled on decode pods (adaptive threshold)
        self.replicas: list[Replica] = []
        self.by_engine: dict[str, Replica] = {}
        self.records = [
            RequestRecord(i, r.arrival, r.prompt_tokens, r.output_tokens) for i, r in enumerate(self.trace)
        ]
        self.gaps: array[float] = array("d")
        self.in_flight = 0
        self.now = 0.0
        self._events: list[tuple[float, int, int, object]] = []
        self._sequence = itertools.count()
        self._ordinals = {"prefill": itertools.count(), "decode": itertools.count()}
        self.timeline: list[tuple[float, int, int, int, int]] = []
        self.thresholds: list[tuple[float, int]] = [(0.0, self.threshold)]
        self.scaling: list[ScalingEvent] = []
        decode_chunk = scenario.decode_chunk_tokens
        if decode_chunk is None and scenario.chunk_itl_seconds is not None:
            decode_chunk = chunk_for_itl(profile, scenario.chunk_itl_seconds)
        self.profiles: dict[EngineRole, EngineProfile] = {
            "prefill": self._tuned(scenario.prefill_chunk_tokens, scenario.prefill_max_num_seqs),
            "decode": self._tuned(decode_chunk, scenario.decode_max_num_seqs),
        }
        # per GPU; a replica's link carries this times its tensor-parallel ranks
        self.kv_link_bytes_per_s = kv_link_bytes_per_s or profile.hardware.kv_link_bytes_per_s
        if self.kv_link_bytes_per_s != profile.hardware.kv_link_bytes_per_s:  # LMCache p2p reads over it too
            self.profiles = {
                role: replace(
                    tuned, hardware=replace(tuned.hardware, kv_link_bytes_per_s=self.kv_link_bytes_per_s)
                )
                for role, tuned in self.profiles.items()
            }
        self._lmcache = (
            LmcacheSettings(
                cpu_capacity_chunks=int(
                    scenario.lmcache_cpu_gib * 1024**3 / (CHUNK_TOKENS * profile.model.kv_bytes_per_token)
                ),
                p2p=scenario.lmcache_p2p,
            )
            if scenario.lmcache_cpu_gib > 0
            else None
        )
        self._peers = SharedPrefixIndex() if scenario.lmcache_p2p else None  # LMCache's controller
        self.network = Network(latency_s=profile.kv_transfer_latency_s)
        self._reads: dict[str, tuple[Replica, RemoteRead]] = {}
        self._transfer_wake: float | None = None
        self.plans: list[Plan] = []
        self._planner: Planner | None = None
        self._capacity: CapacityModel | None = None
        if scenario.planner is not None:
            self._capacity = from_profile(self.profile, self.profiles["prefill"].max_num_batched_tokens)
            self._planner = Planner(scenario.planner.settings, self._capacity)
        # the pages the planner reads, as the operator's runner scrapes them
        self._scrape = (
            Scrape(self.pods, self.threshold, lambda: self.now) if scenario.planner is not None else None
        )
        self.route_reasons = self.router.reasons

    def _tuned(self, chunk_tokens: int | None, max_num_seqs: int | None = None) -> EngineProfile:
        if max_num_seqs is not None:
            chunk = chunk_tokens or self.profile.max_num_batched_tokens
            return self.profile.with_overrides(max_num_batched_tokens=chunk, max_num_seqs=max_num_seqs)
        if chunk_tokens is None or chunk_tokens == self.profile.max_num_batched_tokens:
            return self.profile
        # vLLM refuses max_num_batched_tokens < max_num_seqs, so the operator caps the batch at a smaller
        # chunk (InferencePoolSpec.batch_args); the simulated engine runs as deployed
        seqs = min(self.profile.max_num_seqs, chunk_tokens)
        return self.profile.with_overrides(max_num_batched_tokens=chunk_tokens, max_num_seqs=seqs)

    # ----- the event loop -----

    def _push(self, at: float, kind: int, payload: object) -> None:
        heapq.heappush(self._events, (at, kind, next(self._sequence), payload))

    def run(self) -> ScenarioResult:
        for _ in range(self.scenario.prefill_replicas):
            self._add_replica("prefill", ready_at=0.0)
        for _ in range(self.scenario.decode_replicas):
            self._add_replica("decode", ready_at=0.0)
        self._sync_pods()
        self._record_replicas()
        if self.scenario.planner is not None:
            self._push(self.scenario.planner.settings.interval_seconds, self._PLAN, None)
        if self.scenario.adaptive is not None and self.scenario.policy == "LengthAware":
            self._push(self.scenario.adaptive.interval_seconds, self._THRESHOLD, None)
        if self.progress is not None:
            self._push(self.progress_every, self._PROGRESS, None)
        scrape_every = self.router.config.engine_metrics_interval_milliseconds / 1000
        if scrape_every > 0:
            self._push(scrape_every, self._SCRAPE, None)
        for record in self.records:
            self._push(record.arrival, self._ARRIVAL, record)
        self.pending_arrivals = len(self.records)

        while self._events:
            at, kind, _, payload = heapq.heappop(self._events)
            self.now = max(self.now, at)
            if kind == self._ARRIVAL:
                assert isinstance(payload, RequestRecord)
                self.pending_arrivals -= 1
                self._arrive(payload)
            elif kind == self._STEP_END:
                if isinstance(payload, Replica):
                    self._step_end(payload)
                else:
                    assert isinstance(payload, tuple)
                    replica, generation = payload
                    if replica.run is not None and generation == replica.run_generation:
                        self._run_end(replica)
            elif kind == self._WAKE:
                assert isinstance(payload, Replica)
                if payload.wake_at == at:
                    payload.wake_at = None
                self._kick(payload)
                self._maybe_remove(payload)
            elif kind == self._READY:
                assert isinstance(payload, Replica)
                if payload.removed_at is None:
                    self._sync_pods()
                    self._record_replicas()
            elif kind == self._THRESHOLD:
                self._adapt_threshold()
                if self._busy():
                    assert self.scenario.adaptive is not None
                    self._push(self.now + self.scenario.adaptive.interval_seconds, self._THRESHOLD, None)
            elif kind == self._PLAN:
                self._plan()
                if self._busy():
                    assert self.scenario.planner is not None
                    self._push(self.now + self.scenario.planner.settings.interval_seconds, self._PLAN, None)
            elif kind == self._TRANSFER:
                if payload == self._transfer_wake:
                    self._transfer_wake = None
                self._transfers_landed()
            elif kind == self._SCRAPE:
                self.router.scrape(self.replicas)
                if self._busy():
                    self._push(self.now + scrape_every, self._SCRAPE, None)
            elif kind == self._PROGRESS:
                assert self.progress is not None
                self.progress(self.scenario.name, self.now, self.trace[-1].arrival)
                if self._busy():
                    self._push(self.now + self.progress_every, self._PROGRESS, None)
        return self._result()

    def _busy(self) -> bool:
        return self.pending_arrivals > 0 or self.in_flight > 0 or self.now < self.horizon

    # ----- router -----

    def _arrive(self, record: RequestRecord) -> None:
        now = self.now
        request = self.trace[record.index]
        if request.prompt_tokens + request.output_tokens > self.profile.max_model_len:
            record.route = REJECTED
            record.error = f"prompt + output exceed max_model_len {self.profile.max_model_len}"
            self._finish(record, now)
            return
        self.in_flight += 1
        prompt = _prompt_work(request, record.index)
        router = self.router
        decision = router.decide(record.prompt_tokens, prompt.block_keys(router), now, self.threshold)
        route = decision.route
        record.route, record.reason = route.value, decision.reason.value
        record.uncached_tokens = decision.uncached_tokens
        record.decode_pod = decision.decode.name if decision.decode is not None else None
        if route is Route.LENT:
            assert decision.prefill is not None
            # served whole on the prefill pod (role lending), whose uncached prefix is what it computes
            record.decode_pod = decision.prefill.name
            record.uncached_tokens = decision.prefill_tokens
        if self._scrape is not None:
            self._scrape.routed(route, decision.reason, record.prompt_tokens)
        request_id = f"r{record.index}"
        if route is Route.DISAGGREGATED:
            pod = decision.prefill
            assert pod is not None
            record.prefill_pod = pod.name
            router.prefill_sent(pod, request_id, decision.prefill_tokens, now)
            request_ = self._engine_request(request_id, prompt, 1, remote_decode=True)
            self._send(self.by_engine[pod.name], record, request_)
            return
        self._send_decode(record, self._engine_request(request_id, prompt, record.output_tokens), route)

    @staticmethod
    def _engine_request(
        request_id: str,
        work: _PromptWork,
        output_tokens: int,
        *,
        remote_decode: bool = False,
        remote_prefill: RemotePrefill | None = None,
    ) -> EngineRequest:
        return EngineRequest(
            request_id,
            work.ids,
            output_tokens,
            remote_prefill=remote_prefill,
            remote_decode=remote_decode,
            chunk_hashes=work.chunk_hashes(),
        )

    def _send_decode(self, record: RequestRecord, request: EngineRequest, route: Route) -> None:
        """The decode leg, to the pod the router chose while it takes requests (`SimRouter.decode_pod`)."""
        pod = self.router.decode_pod(record.decode_pod, self.now)
        record.decode_pod = pod.name
        self.router.decode_sent(pod, request.request_id, route, record.uncached_tokens, self.now)
        self._send(self.by_engine[pod.name], record, request)

    def _send(self, replica: Replica, record: RequestRecord, request: EngineRequest) -> None:
        self._settle(replica)
        pod = self.pods.pods[replica.name]
        pod.outstanding += 1
        replica.core.add_request(request, self.now)
        replica.legs[request.request_id] = record
        replica.engine_arrival[request.request_id] = self.now
        self._kick(replica)

    def _prefill_done(self, replica: Replica, record: RequestRecord, event: TokenEvent) -> None:
        now = self.now
        request_id = event.request_id
        started = replica.engine_arrival.pop(request_id)
        replica.legs.pop(request_id)
        self.pods.pods[replica.name].outstanding -= 1
        self.router.prefill_answered(replica.name, request_id, now)
        self.prefill_samples.add(now - started)
        hold = event.kv_hold
        assert hold is not None, "a NIXL prefill leg always ends holding its KV"
        request = self.trace[record.index]
        remote = RemotePrefill(
            engine_id=replica.core.engine_id,
            request_id=request_id,
            host=replica.name,
            port=0,
            block_ids=hold.block_ids,
            tp_size=self.profile.tensor_parallel,
        )
        work = _prompt_work(request, record.index)
        self._send_decode(
            record,
            self._engine_request(request_id, work, record.output_tokens, remote_prefill=remote),
            Route.DISAGGREGATED,
        )

    # ----- engines -----

    def _kick(self, replica: Replica) -> None:
        """Start the engine's next step if it is idle and has work (the driver loop of virtual.py)."""
        if replica.step is not None or replica.run is not None or replica.removed_at is not None:
            return
        now = self.now
        if self.decode_runs and replica.role == "decode":
            run = replica.core.decode_run(now)
            if run is not None:
                replica.run = run
                replica.run_generation += 1
                self._push(run.end, self._STEP_END, (replica, replica.run_generation))
                return
        while True:
            step = replica.core.schedule(now)
            reads = replica.core.take_remote_reads()
            settled = False
            for read in reads:
                settled = self._start_read(replica, read) or settled
            if step is None and settled:
                continue
            break
        if step is not None:
            replica.step = step
            self._push(step.end, self._STEP_END, replica)
            return
        wake = replica.core.next_wakeup()
        if wake is not None and wake > now and wake != replica.wake_at:
            replica.wake_at = wake
            self._push(wake, self._WAKE, replica)

    def _start_read(self, replica: Replica, read: RemoteRead) -> bool:
        """A decode engine reads a prefill engine's KV: the bytes start over both replicas' links. True when
        the read settled at once (it failed, or there was nothing to move), so the engine may schedule
        again."""
        source = self.by_engine.get(read.source.engine_id)
        if source is None:
            failure = replica.core.remote_read_done(
                read.request_id, self.now, f"prefill engine {read.source.engine_id} is gone"
            )
            if failure is not None:
                self._failed(replica, failure)
            return True
        kv_bytes = 0 if self.profile.zero_compute else read.tokens * self.profile.model.kv_bytes_per_token
        if kv_bytes <= 0:  # nothing to move: as `nixl_transfer_time`, no setup either
            self._read_landed(replica, read, 0.0)
            return True
        key = f"{replica.name}/{read.request_id}"
        self._reads[key] = (replica, read)
        self.network.start(self.now, key, (f"send:{source.name}", f"recv:{replica.name}"), kv_bytes)
        self._schedule_transfer_wake()
        return False

    def _schedule_transfer_wake(self) -> None:
        end = self.network.next_end()
        if end is not None and end != self._transfer_wake:
            self._transfer_wake = end
            self._push(end, self._TRANSFER, end)

    def _transfers_landed(self) -> None:
        for key in self.network.advance(self.now):
            replica, read = self._reads.pop(key)
            self._read_landed(replica, read, 0.0)
            self._kick(replica)
        self._schedule_transfer_wake()

    def _read_landed(self, replica: Replica, read: RemoteRead, transfer_seconds: float) -> None:
        """The last byte is on the decode engine: the prefill engine frees its hold, the decode leg runs."""
        self._settle(replica)
        failure = replica.core.remote_read_done(
            read.request_id, self.now, self._release(read), transfer_seconds=transfer_seconds
        )
        if failure is not None:
            self._failed(replica, failure)

    def _release(self, read: RemoteRead) -> str | None:
        """NIXL's side channel: the decode engine tells the prefill engine it has read the held blocks."""
        source = self.by_engine.get(read.source.engine_id)
        if source is None:
            return f"prefill engine {read.source.engine_id} is gone"
        self._settle(source)
        try:
            source.core.release_hold(read.request_id, read.source.engine_id, self.now, read.source.block_ids)
        except LookupError as error:
            return str(error)
        # freed blocks may let the prefill engine admit what was waiting, and a drained one may now go
        self._kick(source)
        self._maybe_remove(source)
        return None

    def _step_end(self, replica: Replica) -> None:
        step = replica.step
        assert step is not None
        replica.step = None
        for event in replica.core.complete(step):
            if isinstance(event, RequestFailed):
                self._failed(replica, event)
            else:
                self._token(replica, event)
        self._kick(replica)
        self._maybe_remove(replica)

    # ----- decode runs: many steps of a steady batch at once -----

    def _settle(self, replica: Replica) -> None:
        """Something is about to reach this engine now: its decode run keeps only the step in flight."""
        run = replica.run
        if run is not None and run.cut(self.now):
            replica.run_generation += 1
            self._push(run.end, self._STEP_END, (replica, replica.run_generation))

    def _realize(self) -> None:
        """Before the autoscaler or the threshold reads the engines: every step that has ended has counted."""
        for replica in self.replicas:
            run = replica.run
            if run is not None:
                done = bisect_right(run.ends, self.now)
                self._commit_run(replica, run, done)
                replica.core.start_decode_steps(run, done + 1)  # the step in flight has its KV, as in vLLM

    def _run_end(self, replica: Replica) -> None:
        run = replica.run
        assert run is not None
        self._commit_run(replica, run, len(run.ends))
        replica.run = None
        self._kick(replica)
        self._maybe_remove(replica)

    def _commit_run(self, replica: Replica, run: DecodeRun, upto: int) -> None:
        """Steps [committed, upto) of a run: the engine applies them, and each request's client and the
        engine's histograms see one token per step, as `_token` would have, one step at a time."""
        first = run.committed
        if upto <= first:
            return
        ends = run.ends
        at = ends[upto - 1]
        start = ends[first]
        later = array("d", [ends[i] - ends[i - 1] for i in range(first + 1, upto)])
        count = upto - first
        itl = replica.itl
        engine_last = replica.last_token
        engine_gaps: list[float] = []
        client_gaps: list[float] = []
        gaps = self.gaps
        for request_id in run.request_ids:
            record = replica.legs[request_id]
            gap = start - engine_last[request_id]
            itl.observe(gap)
            engine_gaps.append(gap)
            engine_last[request_id] = at
            assert record.last_token is not None
            gap = start - record.last_token
            client_gaps.append(gap)
            total = record.itl_sum + gap
            for later_gap in later:
                total += later_gap
            record.itl_sum = total
            record.last_token = at
            record.tokens_received += count
            gaps.append(gap)
            gaps.extend(later)
        batch = len(run.request_ids)
        for later_gap in later:
            itl.observe_many(later_gap, batch)
        if self.scenario.adaptive is not None:
            samples = self.itl_samples
            for gap in client_gaps:
                samples.add(gap)
            for later_gap in later:
                for _ in range(batch):
                    samples.add(later_gap)
        finished = replica.core.commit_decode_run(run, count)
        self.steps_in_runs += count
        for event in finished:
            self._leg_finished(replica, event.request_id, replica.legs[event.request_id], event.time)

    def _token(self, replica: Replica, event: TokenEvent) -> None:
        now = self.now
        request_id = event.request_id
        record = replica.legs[request_id]
        if event.index == 0:
            replica.ttft.observe(now - replica.engine_arrival[request_id])
            self.router.first_token(replica.name, request_id, now)
        else:
            replica.itl.observe(now - replica.last_token[request_id])
        replica.last_token[request_id] = now
        # a prefill leg: on a prefill pod (a lent request streams), or on a peer decode pod (role lending)
        if (replica.role == "prefill" and record.route != LENT) or record.prefill_pod == replica.name:
            assert event.finish_reason is not None
            replica.last_token.pop(request_id, None)
            self._prefill_done(replica, record, event)
            return
        # the client's stream
        if record.tokens_received == 0:
            record.first_token = now
            if self._scrape is not None:
                self._scrape.first_token(Route(record.route), now - record.arrival)
            if record.route != "disaggregated" and self.scenario.adaptive is not None:
                self.direct_ttft_samples.add(now - record.arrival)
        else:
            assert record.last_token is not None
            gap = now - record.last_token
            record.itl_sum += gap
            self.gaps.append(gap)
            if self.scenario.adaptive is not None:
                self.itl_samples.add(gap)
        record.last_token = now
        record.tokens_received += 1
        if event.finish_reason is not None:
            self._leg_finished(replica, request_id, record, now)

    def _leg_finished(self, replica: Replica, request_id: str, record: RequestRecord, now: float) -> None:
        replica.tpot.observe(record.mean_itl)  # the engine's figure: its first to last token over the gaps
        replica.legs.pop(request_id)
        replica.engine_arrival.pop(request_id)
        replica.last_token.pop(request_id)
        self.pods.pods[replica.name].outstanding -= 1
        self.in_flight -= 1
        self._finish(record, now)

    def _failed(self, replica: Replica, failure: RequestFailed) -> None:
        record = replica.legs.pop(failure.request_id)
        self.router.leg_failed(replica.name, failure.request_id)
        replica.engine_arrival.pop(failure.request_id, None)
        replica.last_token.pop(failure.request_id, None)
        self.pods.pods[replica.name].outstanding -= 1
        record.error = failure.message
        self.in_flight -= 1
        self._finish(record, failure.time)

    def _finish(self, record: RequestRecord, now: float) -> None:
        record.finishes += 1
        if record.finishes > 1:
            raise AssertionError(f"request {record.index} finished twice")
        record.finish = now

    # ----- replicas -----

    def _add_replica(self, role: EngineRole, ready_at: float) -> Replica:
        disaggregated = self.scenario.policy != "Colocated"
        name = f"{role}-{next(self._ordinals[role])}"
        core = EngineCore(
            self.profiles[role], name, nixl=disaggregated, lmcache=self._lmcache, prefix_index=self._peers
        )
        link = self.kv_link_bytes_per_s * self.profile.tensor_parallel
        self.network.add_link(f"send:{name}", link)
        self.network.add_link(f"recv:{name}", link)
        replica = Replica(name, role, core, created=self.now, ready_at=ready_at)
        self.replicas.append(replica)
        self.by_engine[name] = replica
        if ready_at > self.now:
            self._push(ready_at, self._READY, replica)
        return replica

    def _sync_pods(self) -> None:
        self.pods.apply(
            PodSpec(r.name, f"http://{r.name}", r.role, ready=r.ready(self.now), terminating=r.terminating)
            for r in self.replicas
            if r.removed_at is None
        )

    def _maybe_remove(self, replica: Replica) -> None:
        if replica.terminating and replica.removed_at is None and replica.drained():
            replica.removed_at = self.now
            self._gone(replica)
            self._sync_pods()
            self._record_replicas()

    def _gone(self, replica: Replica) -> None:
        """A removed engine's LMCache deregisters: peers stop finding its chunks."""
        if self._peers is not None:
            for key in replica.core.cpu_chunks():
                self._peers.remove(replica.name, key)

    def _members(self, role: PoolRole) -> list[Replica]:
        return [r for r in self.replicas if r.role == role and r.removed_at is None and not r.terminating]

    def _record_replicas(self) -> None:
        counts: list[int] = []
        for role in ("prefill", "decode"):
            members = self._members(role)
            counts += [sum(r.ready(self.now) for r in members), len(members)]
        entry = (self.now, counts[0], counts[1], counts[2], counts[3])
        if self.timeline and self.timeline[-1][1:] == entry[1:]:
            return
        self.timeline.append(entry)

    def _resize(self, role: PoolRole, members: list[Replica], replicas: int, load_seconds: float) -> None:
        """Scale a role to `replicas`: new ones load the model; the newest go first, after draining."""
        current = len(members)
        if replicas > current:
            for _ in range(replicas - current):
                self._add_replica(role, ready_at=self.now + load_seconds)
        elif replicas < current:
            # a StatefulSet removes its highest ordinals (the newest pods) first
            for replica in sorted(members, key=lambda r: r.created)[replicas:]:
                replica.terminating = True
                if not replica.ready(self.now):
                    replica.removed_at = self.now  # still loading the model: nothing to drain
                    self._gone(replica)
                self._maybe_remove(replica)
        self._sync_pods()
        self._record_replicas()

    def _plan(self) -> None:
        planner, scaling, scrape = self._planner, self.scenario.planner, self._scrape
        assert planner is not None and scaling is not None and scrape is not None
        self._realize()
        settings = scaling.settings
        members = {role: self._members(role) for role in POOL_ROLES}
        ready = {role: [r for r in members[role] if r.ready(self.now)] for role in POOL_ROLES}
        observation = scrape.observation(
            self.now,
            settings.interval_seconds,
            members,
            ready,
            scaling.window_seconds,
            scaling.percentile,
            planner.model.kv_capacity_tokens,
        )
        plan = planner.decide(observation)
        self.plans.append(plan)
        for role, decision in (("prefill", plan.prefill), ("decode", plan.decode)):
            pool: PoolRole = "prefill" if role == "prefill" else "decode"
            if decision.replicas != decision.current:
                self.scaling.append(
                    ScalingEvent(
                        self.now, pool, decision.current, decision.replicas, decision.reason, decision.message
                    )
                )
                self._resize(pool, members[pool], decision.replicas, settings.model_load_seconds)

    def _adapt_threshold(self) -> None:
        config = self.scenario.adaptive
        assert config is not None
        self._realize()
        decision = adapt(
            self.threshold,
            self.scenario.threshold_tokens,
            config,
            self.prefill_samples,
            self.itl_samples,
            self.direct_ttft_samples,
        )
        if decision.threshold != self.threshold:
            self.threshold = decision.threshold
            self.thresholds.append((self.now, self.threshold))

    # ----- result -----

    def _result(self) -> ScenarioResult:
        # GPU time: every replica from its creation (the scale-up decision: it holds its GPUs while the model
        # loads) to its removal, or to the last token of the run if it was still up then. The event loop may
        # run on past that (progress ticks, autoscaler ticks, a replica becoming ready after the traffic);
        # that idle tail is nobody's cost, since a real pool's run ends with its last request.
        last_token = max(r.finish or 0.0 for r in self.records)
        end = max(self.trace[0].arrival, last_token, min(self.now, self.horizon))
        tp = self.profile.tensor_parallel
        gpu_seconds = sum(
            max(0.0, min(end, r.removed_at if r.removed_at is not None else end) - r.created) * tp
            for r in self.replicas
        )
        self._record_replicas()
        return ScenarioResult(
            scenario=self.scenario,
            records=self.records,
            itl_gaps=self.gaps,
            trace_span=self.trace[-1].arrival - self.trace[0].arrival,
            makespan=end - self.trace[0].arrival,
            gpu_seconds=gpu_seconds,
            replicas=self.timeline,
            thresholds=self.thresholds,
            scaling=self.scaling,
            engine_steps=sum(r.core.stats.steps for r in self.replicas),
            preemptions=sum(r.core.stats.preemptions for r in self.replicas),
            plans=self.plans,
        )


def simulate(
    scenario: Scenario,
    profile: EngineProfile,
    trace: Sequence[TraceRequest],
    *,
    horizon: float = 0.0,
    progress: Progress | None = None,
    progress_every: float = 60.0,
    kv_link_bytes_per_s: float | None = None,
) -> ScenarioResult:
    return ClusterSim(
        scenario,
        profile,
        trace,
        horizon=horizon,
        progress=progress,
        progress_every=progress_every,
        kv_link_bytes_per_s=kv_link_bytes_per_s,
    ).run()
