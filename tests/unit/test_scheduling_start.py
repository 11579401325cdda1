"""The pod choice weighs the prefill work queued on a pod against the prefix it holds (`scorers.start_score`):
the prompt goes where it would start soonest, so a pod holding the prefix behind a long prefill queue loses
to an idle pod that computes the prompt whole (the Mooncake regression of the request-count bound alone)."""

from __future__ import annotations

from inferencepool.router.config import PrefixAffinityConfig, RouterConfig
from inferencepool.router.pods import PodSet, PodSpec
from inferencepool.scheduling.prefix import prompt_keys
from inferencepool.scheduling.scheduler import Scheduler, SchedulerConfig

CONFIG = SchedulerConfig("Colocated", 1.0, 0.05, block_tokens=8)
PROMPT = prompt_keys(b"x" * 800, 8, 1024)  # 100 blocks of 8 tokens: an 800-token prompt
HELD = 60  # blocks of it cached on d1: 480 tokens the prompt need not compute there


def view(*roles: tuple[str, str]) -> PodSet:
    found = PodSet()
    found.apply(PodSpec(name, f"http://{name}:1", role) for name, role in roles)  # type: ignore[arg-type]
    found.prefixes.sent(roles[0][0], PROMPT[:HELD])
    return found


def decodes() -> PodSet:
    return view(("d1", "decode"), ("d2", "decode"))


def decode_of(scheduler: Scheduler, pods: PodSet) -> str:
    decision = scheduler.schedule(800, PROMPT, pods, 0.0, 10_000)
    assert decision.decode is not None
    return decision.decode.name


def test_a_pod_holding_the_prefix_loses_to_an_idle_pod_once_its_queue_outweighs_the_saving() -> None:
    pods = decodes()
    pods.pods["d1"].queued_tokens = 600  # starts after 600 + 320 tokens there, after 800 on d2
    decision = Scheduler(CONFIG).schedule(800, PROMPT, pods, 0.0, 10_000)
    assert decision.decode is pods.pods["d2"] and decision.uncached_tokens == 800
    # both pods are under the request-count bound: the queue's tokens decided, not the request count
    assert all(pod.load == 0 for pod in pods.pods.values())


def test_the_pod_holding_the_prefix_keeps_it_while_its_queue_is_shorter_than_the_saving() -> None:
    pods = decodes()
    pods.pods["d1"].queued_tokens = 400  # 400 + 320 < 800
    decision = Scheduler(CONFIG).schedule(800, PROMPT, pods, 0.0, 10_000)
    assert decision.decode is pods.pods["d1"] and decision.uncached_tokens == 320
    pods.pods["d2"].queued_tokens = 1000  # the idle pod is no longer idle: all the more reason
    assert decode_of(Scheduler(CONFIG), pods) == "d1"


def test_requests_waiting_in_the_engine_count_at_the_mean_prompt_size() -> None:
    """Other router replicas' work: the engine reports it waiting, the router did not send it."""
    pods = decodes()
    pods.pods["d1"].engine_waiting = 1
    scheduler = Scheduler(CONFIG)
    scheduler.speed.observe_prompt(300)  # one request of 300 tokens waits: 300 + 320 < 800, d1 keeps it
    assert decode_of(scheduler, pods) == "d1"
    scheduler = Scheduler(CONFIG)
    scheduler.speed.observe_prompt(2000)
    assert decode_of(scheduler, pods) == "d2"


def test_the_prefill_pod_is_chosen_by_the_same_rule() -> None:
    pods = view(("p1", "prefill"), ("p2", "prefill"), ("d", "decode"))
    disaggregate = SchedulerConfig("AlwaysDisaggregate", 1.0, 0.05, block_tokens=8)
    assert Scheduler(disaggregate).schedule(800, PROMPT, pods, 0.0, 100).prefill is pods.pods["p1"]
    pods.pods["p1"].queued_tokens = 2000
    decision = Scheduler(disaggregate).schedule(800, PROMPT, pods, 0.0, 100)
    assert decision.prefill is pods.pods["p2"] and decision.prefill_tokens == 800


def test_queued_tokens_percent_sets_the_weight_and_zero_is_the_longest_prefix_alone() -> None:
    def config(percent: int) -> SchedulerConfig:
        affinity = PrefixAffinityConfig(block_tokens=8, queued_tokens_percent=percent)
        return RouterConfig(pool="p", policy="Colocated", prefix_affinity=affinity).scheduling()

    assert config(100).queue_weight == 1.0 and RouterConfig(pool="p").scheduling().queue_weight == 1.0
    assert decode_of(Scheduler(config(100)), decodes_queued(600)) == "d2"
    assert decode_of(Scheduler(config(0)), decodes_queued(600)) == "d1"
    assert decode_of(Scheduler(config(50)), decodes_queued(600)) == "d1"  # 300 + 320 < 800
    assert decode_of(Scheduler(config(50)), decodes_queued(1200)) == "d2"


def decodes_queued(tokens: int) -> PodSet:
    pods = decodes()
    pods.pods["d1"].queued_tokens = tokens
    return pods
