"""The engine pods the router knows (pure, no I/O; time is passed in).

A request's pods are the scheduling core's choice (`inferencepool.scheduling`), over `PodSet.available` and
each pod's load: the router's own requests in flight or, when larger, what the engine itself reports running
and waiting (scraped off the request path, which also shows other router replicas' requests). `PodSet.pick`
is for legs that need a pod without a scheduling decision (retries, calibration, a decode leg whose prefill
pod named none): least outstanding requests, or, with an affinity key, the first pod on the hash ring from
the key that is under the bounded-load rule (`scheduling.filters.load_bound`).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from inferencepool.scheduling import prefix
from inferencepool.scheduling.endpoint import EngineRole
from inferencepool.scheduling.filters import load_bound
from inferencepool.scheduling.picker import least_loaded
from inferencepool.scheduling.prefix import PrefixIndex

ROLES: tuple[EngineRole, ...] = ("prefill", "decode")

# A pod whose connection failed sits out this long (doubling per consecutive failure, capped) while others
# serve.
COOLDOWN_SECONDS = 1.0
COOLDOWN_MAX_SECONDS = 30.0
# An engine this full of KV with requests waiting preempts or queues whatever it gets next: it takes new
# requests only when no other pod can.
KV_FULL = 0.95
DEFAULT_INDEX_BLOCKS = 8192  # 2M tokens at 256 a block: more than an 80 GB engine holds


@dataclass(frozen=True, slots=True)
class PodSpec:
    """What discovery reports about one engine pod."""

    name: str
    url: str
    role: EngineRole
    ready: bool = True
    terminating: bool = False
    kv_compat: str | None = None  # the pod's LABEL_KV_COMPAT: prefill and decode pods pair on equal values
    incarnation: str = ""  # discovery.incarnation: another value is another engine under the name


@dataclass(eq=False, slots=True)
class Pod:
    """Live state of one engine pod. Handlers keep a reference while a request runs, so counters stay right
    even after discovery has dropped the pod."""

    name: str
    url: str
    role: EngineRole
    ready: bool = True
    terminating: bool = False
    known: bool = True
    outstanding: int = 0
    consecutive_failures: int = 0
    cooldown_until: float = 0.0
    # what the engine last reported on its /metrics (engine_load.py), and the prefill work the router sent
    # that has not produced its first token yet (tokens)
    engine_running: int = 0
    engine_waiting: int = 0
    kv_usage: float = 0.0
    queued_tokens: int = 0
    kv_compat: str | None = None
    incarnation: str = ""
    restarts: int = 0  # engines seen under the name before this one (PodSet.apply)
    # answers neither its /metrics (engine_load.py) nor a streamed request's headers in time (legs.py): out
    # of the table until its /metrics answers again
    unresponsive: bool = False
    seed: int = 0  # the name's rendezvous seed

    def __post_init__(self) -> None:
        self.seed = prefix.name_seed(self.name)

    @property
    def load(self) -> int:
        """Requests on the pod: the router's own in flight, or the engine's count when it sees more (other
        router replicas' requests, or ones the router already let go of)."""
        return max(self.outstanding, self.engine_running + self.engine_waiting)

    @property
    def kv_full(self) -> bool:
        return self.kv_usage >= KV_FULL and self.engine_waiting > 0

    @property
    def host(self) -> str:
        """The pod's address (its IP in a cluster), as in `url`."""
        return urlsplit(self.url).hostname or ""

    @property
    def accepts_new(self) -> bool:
        """NotReady, terminating or vanished pods finish what they have but take nothing new."""
        return self.ready and not self.terminating and self.known

    def record_failure(self, now: float) -> None:
        self.consecutive_failures += 1
        backoff = COOLDOWN_SECONDS * 2 ** (self.consecutive_failures - 1)
        self.cooldown_until = now + min(backoff, COOLDOWN_MAX_SECONDS)

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self.cooldown_until = 0.0


class in_flight:  # a context manager used as `with in_flight(pod) as hold:`, named as such
    """The one place a pod's outstanding count goes up and down: it counts a leg for as long as the `with`
    block holds it, however the block ends (answered, failed, cancelled), or, after `keep()`, until
    `release()` (a leg handed on to whoever reads its answer). A class, not a generator: it runs for every
    leg."""

    __slots__ = ("_held", "_kept", "pod")

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self._held = self._kept = False

    def __enter__(self) -> in_flight:
        self.pod.outstanding += 1
        self._held = True
        return self

    def __exit__(self, *_: object) -> None:
        if not self._kept:
            self.release()

    def keep(self) -> in_flight:
        """The block ends but the leg goes on: the count stays up until release()."""
        self._kept = True
        return self

    def release(self) -> None:
        if self._held:
            self._held = False
            self.pod.outstanding -= 1


class Queued:
    """Prefill work the router sent a pod, counted in its `queued_tokens` until the first token (or the
    prefill leg's answer) came back: `release()` once, however the leg ends (later calls do nothing)."""

    __slots__ = ("pod", "tokens")

    def __init__(self, pod: Pod, tokens: int) -> None:
        self.pod = pod
        self.tokens = tokens
        pod.queued_tokens += tokens

    def release(self) -> None:
        if self.tokens:
            self.pod.queued_tokens -= self.tokens
            self.tokens = 0


def _point(data: str) -> int:
    return int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "big")


@dataclass
class HashRing:
    virtual_nodes: int
    points: list[int] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)

    def rebuild(self, names: Iterable[str]) -> None:
        entries = sorted((_point(f"{name}#{i}"), name) for name in names for i in range(self.virtual_nodes))
        self.points = [point for point, _ in entries]
        self.owners = [name for _, name in entries]

    def walk(self, key: int) -> Iterable[str]:
        """Pod names clockwise from `key`, each once."""
        if not self.points:
            return
        start = bisect.bisect_left(self.points, key)
        seen: set[str] = set()
        total = len(self.points)
        for offset in range(total):
            name = self.owners[(start + offset) % total]
            if name not in seen:
                seen.add(name)
                yield name


@dataclass
class PodSet:
    """Every known engine pod by role, updated from discovery snapshots, with the pick logic."""

    load_factor: float = 1.25
    virtual_nodes: int = 64
    # An engine batching a few requests is far from saturated: below this, a prefix hit beats balance.
    min_load_bound: int = 4
    # keys remembered per pod (the prefix index the scheduler reads and records into)
    index_blocks: int = DEFAULT_INDEX_BLOCKS
    pods: dict[str, Pod] = field(default_factory=dict)
    prefixes: PrefixIndex = field(init=False)
    _rings: dict[EngineRole, HashRing] = field(default_factory=dict)
    _rotation: int = 0

    def __post_init__(self) -> None:
        self._rings = {role: HashRing(self.virtual_nodes) for role in ROLES}
        self.prefixes = PrefixIndex(self.index_blocks)

    def apply(self, specs: Iterable[PodSpec]) -> None:
        """Replace the known set with a discovery snapshot, keeping counters of pods that stay."""
        fresh: dict[str, Pod] = {}
        for spec in specs:
            pod = self.pods.get(spec.name)
            if (
                pod is None
                or pod.url != spec.url
                or pod.role != spec.role
                or pod.kv_compat != spec.kv_compat
                or pod.incarnation != spec.incarnation
            ):
                # Another engine under the name (a restart: the Pod watch says so before any request fails):
                # its cache starts empty and nothing of the previous one's state carries over (load,
                # cooldown, unresponsive). Legs still open on the old engine keep the old Pod (known=False).
                restarts = 0
                if pod is not None:
                    self.prefixes.forget(spec.name)
                    restarts = pod.restarts + (pod.incarnation != spec.incarnation)
                pod = Pod(
                    name=spec.name,
                    url=spec.url,
                    role=spec.role,
                    kv_compat=spec.kv_compat,
                    incarnation=spec.incarnation,
                    restarts=restarts,
                )
            pod.ready, pod.terminating, pod.known = spec.ready, spec.terminating, True
            fresh[spec.name] = pod
        for name, pod in self.pods.items():
            if fresh.get(name) is not pod:
                pod.known = False
        self.pods = fresh
        self.prefixes.retain(fresh)
        for role in ROLES:
            self._rings[role].rebuild(sorted(p.name for p in fresh.values() if p.role == role))

    def restarted(self, pod: Pod) -> bool:
        """Whether `pod` (the engine a leg went to, or that held a request's KV) has been replaced by another
        engine under its name since, or itself replaced one: a failure involving it may be a stale peer's (a
        handshake or KV handle naming the previous engine, a decode engine that kept the previous engine's
        NIXL state)."""
        current = self.pods.get(pod.name)
        if current is None:
            return False
        return current.incarnation != pod.incarnation or current.restarts > 0

    def by_role(self, role: EngineRole) -> list[Pod]:
        return [pod for pod in self.pods.values() if pod.role == role]

    def available(self, role: EngineRole, now: float, exclude: frozenset[str] = frozenset()) -> list[Pod]:
        """Pods that take new requests; those cooling down after a failure or unresponsive only when nothing
        else is left."""
        open_pods = [
            p for p in self.pods.values() if p.role == role and p.accepts_new and p.name not in exclude
        ]
        healthy = [p for p in open_pods if p.cooldown_until <= now and not p.unresponsive]
        return healthy or open_pods

    def has_available(self, role: EngineRole) -> bool:
        return any(p.role == role and p.accepts_new for p in self.pods.values())

    def pick(
        self,
        role: EngineRole,
        now: float,
        affinity_key: int | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> Pod | None:
        candidates = self.available(role, now, exclude)
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        if affinity_key is not None:
            by_name = {pod.name: pod for pod in candidates}
            bound = load_bound([pod.outstanding for pod in candidates], self.load_factor, self.min_load_bound)
            for name in self._rings[role].walk(affinity_key):
                pod = by_name.get(name)
                if pod is not None and pod.outstanding < bound:
                    return pod
        # Rotate among equally loaded pods so an idle pool still spreads requests.
        self._rotation += 1
        return least_loaded(candidates, self._rotation)
