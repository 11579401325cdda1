"""The KV-compatibility revision and the coordinated rollout plan, driven against a model of the StatefulSet
controller (partition semantics: ordinals from the partition up run the update revision; one pod replaced at
a time; new pods need a step to become Ready)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.unit.builders_examples import load_pool

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import POOL_ROLES, InferencePool, PoolRole
from inferencepool.builders import pool_children
from inferencepool.builders.common import PoolRef
from inferencepool.builders.engine import engine_statefulset, vllm_args
from inferencepool.builders.kvcompat import kv_compat_hash
from inferencepool.builders.rollout import PodView, RoleStep, RoleView, RolloutPlan, plan_rollout
from inferencepool.controller.rollout import rollout_events


def pool(**overrides: Any) -> InferencePool:
    return load_pool("llama-3.1-8b.yaml", **overrides)


# --- the hash


def test_both_roles_carry_one_kv_compat_label_and_the_model_revision() -> None:
    p = pool(model__revision="a1b2c3")
    templates = [c["spec"]["template"]["metadata"] for c in pool_children(p) if c["kind"] == "StatefulSet"]
    assert [t["labels"][labels.LABEL_KV_COMPAT] for t in templates] == [kv_compat_hash(p)] * 2
    assert all(t["annotations"][labels.ANNOTATION_MODEL_REVISION] == "a1b2c3" for t in templates)


@pytest.mark.parametrize(
    "change",
    [
        {"model__revision": "v2"},
        {"model__name": "meta-llama/Llama-3.1-70B-Instruct"},
        {"model__tokenizer": "other/tokenizer"},
        {"engine__image": "vllm/vllm-openai:v0.34.0"},
        {"engine__extraArgs": ["--kv-cache-dtype", "fp8"]},
        {"engine__extraArgs": ["--block-size", "32"]},
        {"engine__extraArgs": ["--dtype", "float16"]},
        {"engine__extraEnv": [{"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}]},
        {"decode__tensorParallelSize": 2, "decode__gpusPerReplica": None},
        {"kvCache": {"cpuOffloadGiB": 16}},
    ],
)
def test_what_changes_the_kv_layout_or_weights_changes_the_hash(change: dict[str, Any]) -> None:
    assert kv_compat_hash(pool(**change)) != kv_compat_hash(pool())


@pytest.mark.parametrize(
    "change",
    [
        {"router__prefillThresholdTokens": 2048},
        {"router__replicas": 3},
        {"prefill__replicas": 5},
        {"decode__resources": {"requests": {"cpu": "8"}}},
        {"model__servedName": "llama"},
    ],
)
def test_what_leaves_kv_valid_keeps_the_hash(change: dict[str, Any]) -> None:
    assert kv_compat_hash(pool(**change)) == kv_compat_hash(pool())


def test_revision_is_passed_to_vllm_for_weights_and_tokenizer() -> None:
    args = vllm_args(pool(model__revision="0123abcd"), "decode")
    assert args[args.index("--revision") + 1] == "0123abcd"
    assert args[args.index("--tokenizer-revision") + 1] == "0123abcd"
    # a separate tokenizer's repository need not have the model's commit: vLLM's own default applies
    args = vllm_args(pool(model__revision="0123abcd", model__tokenizer="other/tok"), "decode")
    assert "--revision" in args and "--tokenizer-revision" not in args
    assert "--revision" not in vllm_args(pool(), "decode")


def test_a_revision_that_would_read_as_a_flag_is_refused() -> None:
    with pytest.raises(ValueError, match="revision"):
        pool(model__revision="--trust-remote-code")


def test_statefulset_renders_the_steps_partition_and_surge() -> None:
    p = pool(decode__autoscaling=None, decode__replicas=2)
    ref = PoolRef.of(p)
    fixed = engine_statefulset(p, ref, "decode", RoleStep(surge=1, partition=2, replicas=3))
    assert fixed["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}
    assert fixed["spec"]["replicas"] == 3
    assert fixed["metadata"]["annotations"][labels.ANNOTATION_SURGE] == "1"
    plain = engine_statefulset(p, ref, "decode")
    assert plain["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    assert "annotations" not in plain["metadata"]


# --- the plan, against a model of the StatefulSet controller


@dataclass
class Pod:
    kv: str
    ready: bool


@dataclass
class Pool:
    """One engine pool: the StatefulSet's spec as last applied, and its pods by ordinal."""

    wanted: int
    template: str
    replicas: int = 0
    partition: int | None = None
    pods: dict[int, Pod] = field(default_factory=dict)

    def view(self) -> RoleView:
        pods = tuple(PodView(o, p.kv, p.ready) for o, p in sorted(self.pods.items()))
        return RoleView(self.wanted, pods, self.partition)

    def controller_step(self) -> None:
        """One sync of the StatefulSet controller: pods become Ready, missing pods are created (at the
        update revision from the partition up), pods above replicas go, and one out-of-date pod from the
        partition up is replaced (maxUnavailable 1), highest first."""
        for pod in self.pods.values():
            pod.ready = True
        for ordinal in [o for o in self.pods if o >= self.replicas]:
            del self.pods[ordinal]
        boundary = self.partition or 0
        for ordinal in range(self.replicas):
            if ordinal not in self.pods:
                kv = self.template if ordinal >= boundary else self.current
                self.pods[ordinal] = Pod(kv, ready=False)
        stale = [o for o, p in self.pods.items() if o >= boundary and p.kv != self.template]
        if stale and all(p.ready for o, p in self.pods.items() if o != max(stale)):
            self.pods[max(stale)] = Pod(self.template, ready=False)

    current: str = "old"


def apply(plan: RolloutPlan, pools: dict[PoolRole, Pool]) -> None:
    for role, p in pools.items():
        step = plan.step(role)
        p.template = plan.target
        p.partition = step.partition
        p.replicas = p.wanted + step.surge


def run(
    spec: InferencePool,
    replicas: dict[PoolRole, int],
    old: str = "old",
    target: str = "new",
    max_steps: int = 60,
) -> list[tuple[dict[PoolRole, int], bool]]:
    """Roll from `old` to `target`; per step: Ready pods per pool, and whether a Ready pair of one revision
    exists. Fails if the rollout does not finish."""
    pools = {
        role: Pool(n, old, n, None, {o: Pod(old, True) for o in range(n)}, current=old)
        for role, n in replicas.items()
    }
    trace = []
    for _ in range(max_steps):
        plan = plan_rollout(spec, target, {role: p.view() for role, p in pools.items()})
        apply(plan, pools)
        if not plan.active:
            for p in pools.values():
                p.controller_step()  # the surge pod goes
            break
        for p in pools.values():
            p.controller_step()
        ready = {role: sum(pod.ready for pod in p.pods.values()) for role, p in pools.items()}
        revisions = {role: {pod.kv for pod in p.pods.values() if pod.ready} for role, p in pools.items()}
        paired = bool(revisions.get("prefill", set()) & revisions.get("decode", set()))
        trace.append((ready, paired))
    else:
        pytest.fail(f"the rollout did not finish in {max_steps} steps: {pools}")
    for role, p in pools.items():
        assert p.partition is None and p.replicas == p.wanted == len(p.pods)
        assert all(pod.kv == target and pod.ready for pod in p.pods.values()), role
    return trace


@pytest.mark.parametrize(
    "replicas", [{"prefill": 2, "decode": 2}, {"prefill": 1, "decode": 1}, {"prefill": 3, "decode": 5}]
)
def test_with_surge_room_every_pool_keeps_its_ready_count_and_a_pair_exists_throughout(
    replicas: dict[PoolRole, int],
) -> None:
    trace = run(pool(), replicas)
    for ready, paired in trace:
        assert all(ready[role] >= replicas[role] for role in POOL_ROLES), trace
        assert paired, trace


def test_no_old_pod_goes_before_both_pools_have_a_ready_new_pod() -> None:
    spec = pool()
    pools = {role: RoleView(2, (PodView(0, "old", True), PodView(1, "old", True))) for role in POOL_ROLES}
    start = plan_rollout(spec, "new", pools)
    assert {r: (s.surge, s.partition) for r, s in start.roles.items()} == {
        "prefill": (1, 2),
        "decode": (1, 2),
    }
    # decode's surge pod is Ready, prefill's not yet: decode holds its old pods
    with_new = {
        "prefill": RoleView(2, (*pools["prefill"].pods, PodView(2, "new", False)), 2),
        "decode": RoleView(2, (*pools["decode"].pods, PodView(2, "new", True)), 2),
    }
    waiting = plan_rollout(spec, "new", with_new)
    assert waiting.step("decode").partition == 2 and waiting.step("prefill").partition == 2
    both = {**with_new, "prefill": RoleView(2, (*pools["prefill"].pods, PodView(2, "new", True)), 2)}
    stepping = plan_rollout(spec, "new", both)
    assert stepping.step("decode").partition == 1 and stepping.step("prefill").partition == 1
    assert "prefill 1/3 pods at the new revision (1 surge)" in stepping.summary()


def test_without_budget_room_pools_roll_in_place_prefill_first_and_keep_serving_directly() -> None:
    # budget exactly the wanted GPUs: no surge anywhere
    spec = _budget_pool(4)
    plan = plan_rollout(
        spec, "new", {r: RoleView(2, (PodView(0, "old", True), PodView(1, "old", True))) for r in POOL_ROLES}
    )
    assert plan.no_room == ("prefill", "decode")
    assert plan.step("prefill").partition == 1 and plan.step("decode").partition == 2  # prefill first
    trace = run(spec, {"prefill": 2, "decode": 2})
    for ready, _paired in trace:
        assert ready["decode"] >= 1 and ready["prefill"] >= 1  # one pod per pool at a time


def test_budget_room_for_decode_only_surges_decode() -> None:
    spec = _budget_pool(5)
    plan = plan_rollout(
        spec, "new", {r: RoleView(2, (PodView(0, "old", True), PodView(1, "old", True))) for r in POOL_ROLES}
    )
    assert plan.step("decode").surge == 1 and plan.step("prefill").surge == 0
    assert plan.no_room == ("prefill",)
    trace = run(spec, {"prefill": 2, "decode": 2})
    assert all(ready["decode"] >= 2 for ready, _ in trace)
    assert all(paired for _, paired in trace)


def _budget_pool(budget: int) -> InferencePool:
    return pool(
        prefill__replicas=2,
        decode__replicas=2,
        prefill__autoscaling={
            "minReplicas": 1,
            "maxReplicas": 4,
            "target": {"ttftMilliseconds": 500},
        },
        decode__autoscaling={
            "minReplicas": 1,
            "maxReplicas": 4,
            "target": {"itlMilliseconds": 30},
        },
        prefill__gpusPerReplica=1,
        decode__gpusPerReplica=1,
        prefill__tensorParallelSize=1,
        decode__tensorParallelSize=1,
        scaling={"gpuBudget": budget},
    )


def test_a_second_change_mid_rollout_moves_every_pod_to_the_latest_revision() -> None:
    spec = pool()
    pools = {
        role: Pool(
            2, "mid", 3, 1, {0: Pod("old", True), 1: Pod("mid", True), 2: Pod("mid", True)}, current="old"
        )
        for role in POOL_ROLES
    }
    for _ in range(60):
        plan = plan_rollout(spec, "latest", {role: p.view() for role, p in pools.items()})
        if not plan.active and all(p.replicas == p.wanted for p in pools.values()):
            break
        apply(plan, pools)
        for p in pools.values():
            p.controller_step()
            assert sum(pod.ready for pod in p.pods.values()) >= 1
    assert all(pod.kv == "latest" for p in pools.values() for pod in p.pods.values())


def test_a_pool_without_old_pods_or_without_replicas_is_not_rolled() -> None:
    spec = pool()
    assert not plan_rollout(
        spec, "new", {"decode": RoleView(2, (PodView(0, "new", True), PodView(1, "new", True)))}
    ).active
    assert not plan_rollout(spec, "new", {"prefill": RoleView(0, (PodView(0, "old", False),))}).active
    assert not plan_rollout(spec, "new", {}).active


# --- placement


@pytest.mark.parametrize("mode", ["Preferred", "Required"])
def test_placement_keeps_both_pools_in_one_domain_by_pod_affinity(mode: str) -> None:
    user_term = {
        "weight": 5,
        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {}},
    }
    p = pool(
        placement={"topologyKey": "topology.kubernetes.io/zone", "mode": mode},
        decode__scheduling={
            "affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [user_term]}}
        },
    )
    affinities = {
        c["metadata"]["labels"][labels.LABEL_ROLE]: c["spec"]["template"]["spec"]["affinity"]["podAffinity"]
        for c in pool_children(p)
        if c["kind"] == "StatefulSet"
    }
    for affinity in affinities.values():
        if mode == "Required":
            (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
        else:
            term = affinity["preferredDuringSchedulingIgnoredDuringExecution"][-1]
            assert term["weight"] == 100
            term = term["podAffinityTerm"]
        assert term["topologyKey"] == "topology.kubernetes.io/zone"
        # it selects the engine pods of both roles of this pool, this pod's own template included
        selector = term["labelSelector"]
        assert selector["matchLabels"] == {labels.LABEL_POOL: "llama-8b"}
        assert selector["matchExpressions"][0]["values"] == ["prefill", "decode"]
    # the user's own terms stay
    assert user_term in affinities["decode"]["preferredDuringSchedulingIgnoredDuringExecution"]


def test_placement_is_off_by_default_and_names_a_label_key() -> None:
    template = next(c for c in pool_children(pool()) if c["kind"] == "StatefulSet")["spec"]["template"]
    assert "affinity" not in template["spec"]
    with pytest.raises(ValueError, match=r"topology_key|topologyKey"):
        pool(placement={"topologyKey": "not a label key"})


# --- what a user hears


def test_events_mark_the_start_each_move_and_the_end() -> None:
    spec = _budget_pool(5)  # room for decode's surge only
    old = {r: RoleView(2, (PodView(0, "old", True, "r1"), PodView(1, "old", True, "r1"))) for r in POOL_ROLES}
    start = plan_rollout(spec, "new", old)
    reasons = [(e.reason, e.type) for e in rollout_events(None, start, "r2")]
    assert reasons == [("RolloutStarted", "Normal"), ("RolloutInPlace", "Warning")]
    started = rollout_events(None, start, "r2")[0].message
    assert "(model revision r1 -> r2)" in started and "kv-compat old -> new" in started
    assert "gpuBudget" in rollout_events(None, start, "r2")[1].message
    assert rollout_events(start, start, "r2") == []  # nothing moved
    moved = plan_rollout(
        spec, "new", {**old, "decode": RoleView(2, (*old["decode"].pods, PodView(2, "new", True)), 2)}
    )
    assert [e.reason for e in rollout_events(start, moved, "r2")] == ["RolloutProgressing"]
    assert [e.reason for e in rollout_events(moved, RolloutPlan("new"), "r2")] == ["RolloutComplete"]
