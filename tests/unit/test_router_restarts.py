"""A pod that comes back under its name with a new engine (a container restarted in place, or the Pod
deleted and created again by its StatefulSet) is a new endpoint as soon as the Pod watch says so: nothing
the router learned about the previous engine (its cached prefixes, its load, a cooldown, a hang) carries
over, while the same engine seen again keeps all of it."""

from __future__ import annotations

import copy
from typing import Any

from inferencepool.router.discovery import pod_spec_from_object
from inferencepool.router.pods import PodSet

KEYS = [11, 22, 33]


def pod(uid: str = "uid-1", restarts: int = 0) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "llama-prefill-0",
            "uid": uid,
            "labels": {"serving.inferencepool.dev/role": "prefill"},
        },
        "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {
            "phase": "Running",
            "podIP": "127.0.10.4",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "vllm", "restartCount": restarts}],
        },
    }


def used(pods: PodSet) -> None:
    """What the router learns of an engine while it serves."""
    engine = pods.pods["llama-prefill-0"]
    pods.prefixes.sent(engine.name, KEYS)
    engine.outstanding, engine.engine_waiting, engine.unresponsive = 2, 5, True
    engine.record_failure(100.0)


def snapshot(document: dict[str, Any]) -> list[Any]:
    spec = pod_spec_from_object(document)
    assert spec is not None
    return [spec]


def test_the_same_engine_keeps_what_the_router_learned() -> None:
    pods = PodSet()
    pods.apply(snapshot(pod()))
    used(pods)
    before = pods.pods["llama-prefill-0"]
    seen_again = copy.deepcopy(pod())
    seen_again["status"]["conditions"].append({"type": "ContainersReady", "status": "True"})
    pods.apply(snapshot(seen_again))
    assert pods.pods["llama-prefill-0"] is before and before.known
    assert pods.prefixes.cached_blocks("llama-prefill-0", KEYS) == len(KEYS)


def test_a_restarted_container_or_a_recreated_pod_is_a_new_engine() -> None:
    for restarted in (pod(restarts=1), pod(uid="uid-2")):
        pods = PodSet()
        pods.apply(snapshot(pod()))
        used(pods)
        old = pods.pods["llama-prefill-0"]
        pods.apply(snapshot(restarted))
        new = pods.pods["llama-prefill-0"]
        assert new is not old and not old.known  # legs still open on the old engine finish on the old Pod
        assert pods.prefixes.cached_blocks("llama-prefill-0", KEYS) == 0
        assert (new.outstanding, new.engine_waiting, new.unresponsive, new.cooldown_until) == (
            0,
            0,
            False,
            0.0,
        )
        assert old.outstanding == 2  # the old legs' counts go down on the object they went up on
        assert [p.name for p in pods.available("prefill", 100.0)] == ["llama-prefill-0"]


def test_a_failure_involving_a_restarted_engine_is_told_apart() -> None:
    """What inferencepool_router_stale_peer_failures counts: a request whose pod was replaced under it, or
    that ran on a pod's later engine; never one on a pod that never restarted (or only changed readiness)."""
    pods = PodSet()
    pods.apply(snapshot(pod()))
    first = pods.pods["llama-prefill-0"]
    not_ready = copy.deepcopy(pod())
    not_ready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    pods.apply(snapshot(not_ready))
    assert not pods.restarted(first)
    pods.apply(snapshot(pod(restarts=1)))
    second = pods.pods["llama-prefill-0"]
    assert pods.restarted(first) and pods.restarted(second)
    assert (first.restarts, second.restarts) == (0, 1)
    pods.apply(snapshot(pod(uid="uid-2")))
    assert pods.pods["llama-prefill-0"].restarts == 2
