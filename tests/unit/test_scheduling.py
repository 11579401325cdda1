"""The scheduling core's pieces the router and the simulator share: the KV-compatibility filter and its
reason, the discovery of the label it reads, and the one bounded-load rule."""

from __future__ import annotations

from inferencepool.api import labels
from inferencepool.router.discovery import pod_spec_from_object
from inferencepool.router.pods import PodSet, PodSpec
from inferencepool.scheduling.decider import Route, RouteReason
from inferencepool.scheduling.filters import load_bound, under_load_bound
from inferencepool.scheduling.prefix import prompt_keys
from inferencepool.scheduling.scheduler import Scheduler, SchedulerConfig

CONFIG = SchedulerConfig("LengthAware", 1.0, 0.05, block_tokens=8)
PROMPT = prompt_keys(b"x" * 800, 8, 1024)  # 100 blocks


def pods(*specs: tuple[str, str, str | None]) -> PodSet:
    found = PodSet()
    found.apply(PodSpec(name, f"http://{name}:1", role, kv_compat=compat) for name, role, compat in specs)  # type: ignore[arg-type]
    return found


def test_a_prefill_pod_pairs_only_with_a_decode_pod_of_its_kv_compat_label() -> None:
    view = pods(("p-old", "prefill", "v1"), ("p-new", "prefill", "v2"), ("d", "decode", "v2"))
    decision = Scheduler(CONFIG).schedule(800, PROMPT, view, 0.0, 100)
    assert (decision.route, decision.reason) == (Route.DISAGGREGATED, RouteReason.LONG)
    assert decision.prefill is view.pods["p-new"] and decision.decode is view.pods["d"]


def test_without_a_compatible_prefill_pod_the_decode_pod_serves_it_with_its_own_reason() -> None:
    view = pods(("p", "prefill", "v1"), ("d", "decode", "v2"))
    decision = Scheduler(CONFIG).schedule(800, PROMPT, view, 0.0, 100)
    assert (decision.route, decision.reason) == (Route.FALLBACK, RouteReason.KV_INCOMPATIBLE)
    assert decision.decode is view.pods["d"] and decision.prefill is None
    # with no prefill pod at all the reason says so
    alone = pods(("d", "decode", "v2"))
    assert Scheduler(CONFIG).schedule(800, PROMPT, alone, 0.0, 100).reason is RouteReason.NO_PREFILL_POD
    # unlabelled pods (static backends) pair with each other
    plain = pods(("p", "prefill", None), ("d", "decode", None))
    assert Scheduler(CONFIG).schedule(800, PROMPT, plain, 0.0, 100).route is Route.DISAGGREGATED


def test_discovery_reads_the_kv_compat_label_into_the_pod_view() -> None:
    pod = {
        "metadata": {"name": "e-0", "labels": {labels.LABEL_ROLE: "decode", labels.LABEL_KV_COMPAT: "abc"}},
        "status": {
            "podIP": "10.0.0.1",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
        "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8000}]}]},
    }
    spec = pod_spec_from_object(pod)
    assert spec is not None and spec.kv_compat == "abc"
    view = PodSet()
    view.apply([spec])
    assert view.pods["e-0"].kv_compat == "abc"
    view.apply([PodSpec("e-0", spec.url, "decode", kv_compat="def")])  # relabelled: a new pod
    assert view.pods["e-0"].kv_compat == "def"


def test_the_bounded_load_rule_is_one_rule_for_the_ring_and_the_prefix_choice() -> None:
    view = pods(*((f"d{i}", "decode", None) for i in range(4)))
    for i, pod in enumerate(view.pods.values()):
        pod.outstanding = 3 * i  # 0, 3, 6, 9: total 18
    bound = load_bound([pod.load for pod in view.pods.values()], 1.25, 4)
    assert bound == 6  # ceil(1.25 x 19 / 4)
    assert {pod.name for pod in under_load_bound(list(view.pods.values()), 1.25, 4)} == {"d0", "d1"}
    assert view.pick("decode", 0.0, affinity_key=12345).name in {"d0", "d1"}  # type: ignore[union-attr]


LENDING = SchedulerConfig("LengthAware", 1.0, 0.05, block_tokens=8, lending=True)


def saturated(view: PodSet, waiting: int = 2) -> PodSet:
    for pod in view.pods.values():
        if pod.role == "decode":
            pod.engine_waiting = waiting
    return view


def test_lending_serves_a_request_whole_on_a_prefill_pod_when_every_decode_pod_queues() -> None:
    view = saturated(pods(("p", "prefill", None), ("d1", "decode", None), ("d2", "decode", None)))
    for tokens, keys in ((800, PROMPT), (40, prompt_keys(b"y" * 40, 8, 1024))):  # long and short
        decision = Scheduler(LENDING).schedule(tokens, keys, view, 0.0, 100)
        assert (decision.route, decision.reason) == (Route.LENT, RouteReason.DECODE_SATURATED)
        assert decision.prefill is view.pods["p"]
    # the prefill pod now holds the prompt, not the decode pod: a repeat finds it there
    assert view.prefixes.cached_blocks("p", PROMPT) == len(PROMPT)


def test_no_lending_while_a_decode_pod_has_room_or_the_prefill_pod_queues_or_it_is_off() -> None:
    view = saturated(pods(("p", "prefill", None), ("d1", "decode", None), ("d2", "decode", None)))

    def route(config: SchedulerConfig, seed: bytes) -> Route:
        return Scheduler(config).schedule(800, prompt_keys(seed * 800, 8, 1024), view, 0.0, 100).route

    view.pods["d2"].engine_waiting = 0  # one decode pod takes requests without queueing
    assert route(LENDING, b"a") is Route.DISAGGREGATED
    saturated(view)
    view.pods["p"].engine_waiting = 1  # the prefill pod queues too
    assert route(LENDING, b"b") is Route.DISAGGREGATED
    view.pods["p"].engine_waiting = 0
    assert route(CONFIG, b"c") is Route.DISAGGREGATED  # lending off
    assert route(LENDING, b"d") is Route.LENT
    colocated = SchedulerConfig("Colocated", 1.0, 0.05, block_tokens=8, lending=True)
    assert route(colocated, b"e") is Route.DIRECT
    always = SchedulerConfig("AlwaysDisaggregate", 1.0, 0.05, block_tokens=8, lending=True)
    assert route(always, b"f") is Route.DISAGGREGATED


def test_lending_waits_for_a_prefill_pod_that_would_meet_the_ttft_target() -> None:
    """Once the prefill speed is known, the prefill pod's queue plus the whole prompt must fit the target."""
    view = saturated(pods(("p", "prefill", None), ("d", "decode", None)))
    scheduler = Scheduler(LENDING)
    scheduler.speed.observe_leg(0.5, 1000)  # 0.5 ms a token: 800 tokens take 0.4 s of the 1 s target
    assert scheduler.schedule(800, PROMPT, view, 0.0, 100).route is Route.LENT
    view.pods["p"].queued_tokens = 1500  # 0.75 s queued: 1.15 s > 1 s
    assert scheduler.schedule(800, prompt_keys(b"z" * 800, 8, 1024), view, 0.0, 100).route is (
        Route.DISAGGREGATED
    )


def prefill_queues(view: PodSet, busy: str) -> PodSet:
    """Every prefill pod has requests waiting in its engine; the decode pod `busy` runs requests."""
    for pod in view.pods.values():
        if pod.role == "prefill":
            pod.engine_running, pod.engine_waiting = 1, 1
    view.pods[busy].engine_running = 3
    return view


def three_pods() -> PodSet:
    return pods(("p", "prefill", None), ("d1", "decode", None), ("d2", "decode", None))


def test_an_idle_decode_pod_prefills_for_a_busy_one_while_the_prefill_pool_queues() -> None:
    view = prefill_queues(three_pods(), "d1")
    # the prompt is cached on d1, so the prefix-aware choice keeps its decode there
    view.prefixes.sent("d1", PROMPT[:10])
    decision = Scheduler(LENDING).schedule(800, PROMPT, view, 0.0, 100)
    assert (decision.route, decision.reason) == (Route.DISAGGREGATED, RouteReason.PREFILL_SATURATED)
    assert decision.decode is view.pods["d1"] and decision.prefill is view.pods["d2"]
    assert decision.uncached_tokens == 720 and decision.prefill_tokens == 800  # d2 computes it all
    assert view.prefixes.cached_blocks("d2", PROMPT) == len(PROMPT)  # and holds it after


def test_no_peer_prefill_unless_the_prefill_pool_queues_the_decode_pod_is_busy_and_a_peer_idle() -> None:
    def decide(config: SchedulerConfig, view: PodSet, seed: bytes) -> tuple[Route, RouteReason]:
        keys = prompt_keys(seed * 800, 8, 1024)
        view.prefixes.sent("d1", keys[:10])  # the decode pod stays d1
        decision = Scheduler(config).schedule(800, keys, view, 0.0, 100)
        return decision.route, decision.reason

    def fresh() -> PodSet:
        return prefill_queues(three_pods(), "d1")

    long = (Route.DISAGGREGATED, RouteReason.LONG)
    assert decide(CONFIG, fresh(), b"a") == long  # lending off
    view = fresh()
    view.pods["p"].engine_waiting = 0  # the prefill pod has room
    assert decide(LENDING, view, b"b") == long
    view = fresh()
    view.pods["d1"].engine_running = 0  # the chosen decode pod runs nothing: no decode to stall there
    assert decide(LENDING, view, b"c") == long
    view = fresh()
    view.pods["d2"].engine_running = 1  # no idle peer
    assert decide(LENDING, view, b"d") == long
    view = fresh()
    view.pods["d2"].queued_tokens = 100  # the peer has prefill work queued
    assert decide(LENDING, view, b"e") == long
    incompatible = prefill_queues(
        pods(("p", "prefill", "v1"), ("d1", "decode", "v1"), ("d2", "decode", "v2")), "d1"
    )  # d1 could not load d2's KV
    assert decide(LENDING, incompatible, b"f") == long
    assert decide(LENDING, fresh(), b"g") == (Route.DISAGGREGATED, RouteReason.PREFILL_SATURATED)


def test_a_peer_prefills_only_within_the_ttft_target_once_the_speed_is_known() -> None:
    view = prefill_queues(three_pods(), "d1")
    scheduler = Scheduler(LENDING)
    scheduler.speed.observe_leg(0.5, 1000)  # 0.5 ms a token: 800 tokens take 0.4 s of the 1 s target
    view.prefixes.sent("d1", PROMPT[:10])
    assert scheduler.schedule(800, PROMPT, view, 0.0, 100).reason is RouteReason.PREFILL_SATURATED
    scheduler.speed.observe_transfer(0.8, 100)  # 8 ms a token: moving 720 tokens misses the target
    keys = prompt_keys(b"w" * 800, 8, 1024)
    view.prefixes.sent("d1", keys[:10])
    assert scheduler.schedule(800, keys, view, 0.0, 100).reason is RouteReason.LONG
