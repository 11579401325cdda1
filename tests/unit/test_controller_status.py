"""The pool's status and conditions as a pure function of the workloads, references and last reconcile."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.unit.builders_examples import load_pool

from inferencepool.api.v1alpha1 import InferencePool, InferencePoolStatus, ScalingDecision
from inferencepool.autoscaler.figures import AutoscalerFigures, RoleFigures
from inferencepool.controller.status import (
    MissingReference,
    Observed,
    ReconcileOutcome,
    StatusInputs,
    WorkloadKey,
    WorkloadState,
    compose_status,
    status_differs,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
ENDPOINT = "http://llama-8b.prod.svc"


def workload(kind: str, name: str, desired: int, ready: int, **status: Any) -> WorkloadState:
    return WorkloadState(
        kind=kind,
        name=name,
        generation=status.get("generation", 1),
        observed_generation=status.get("observed_generation", 1),
        desired=desired,
        replicas=status.get("replicas", desired),
        ready=ready,
        updated=status.get("updated", desired),
        current_revision=status.get("current", "r1" if kind == "StatefulSet" else None),
        update_revision=status.get("update", "r1" if kind == "StatefulSet" else None),
    )


def sts(name: str, desired: int, ready: int, **status: Any) -> WorkloadState:
    return workload("StatefulSet", name, desired, ready, **status)


def deploy(name: str, desired: int, ready: int, **status: Any) -> WorkloadState:
    return workload("Deployment", name, desired, ready, **status)


def all_ready() -> dict[WorkloadKey, WorkloadState | None]:
    return {
        "prefill": sts("llama-8b-prefill", 2, 2),
        "decode": sts("llama-8b-decode", 4, 4),
        "router": deploy("llama-8b-router", 2, 2),
        "lmcache-controller": deploy("llama-8b-lmcache-controller", 1, 1),
    }


def status_of(
    pool: InferencePool,
    workloads: dict[WorkloadKey, WorkloadState | None],
    outcome: ReconcileOutcome | None = None,
    now: datetime = NOW,
) -> InferencePoolStatus:
    outcome = outcome if outcome is not None else ReconcileOutcome(generation=1)
    inputs = StatusInputs(pool, 1, outcome, Observed(workloads), ENDPOINT, now, previous=pool.status)
    return compose_status(inputs)


def conditions(status: InferencePoolStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_all_ready_pool_is_ready_settled_and_healthy_with_filled_columns() -> None:
    status = status_of(load_pool("llama-3.1-8b.yaml"), all_ready())
    assert conditions(status) == {
        "Ready": ("True", "Serving"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "AsExpected"),
        "Stalled": ("False", "AsExpected"),  # kstatus' pair, derived from Degraded and Progressing
        "Reconciling": ("False", "RolloutComplete"),
    }
    assert status.observed_generation == 1
    assert status.prefill is not None and status.decode is not None and status.router is not None
    assert (status.prefill.ready_replicas, status.prefill.desired_replicas) == (2, 2)
    assert status.decode.target_milliseconds == 40 and status.decode.percentile == 90
    assert status.router.endpoint == ENDPOINT
    assert status.display is not None
    assert (status.display.prefill, status.display.decode) == ("2/2", "4/4")
    assert (status.display.ttft, status.display.itl) == ("-/800ms", "-/40ms")


def test_new_pool_waits_for_children_and_is_not_ready() -> None:
    workloads: dict[WorkloadKey, WorkloadState | None] = {key: None for key in all_ready()}
    status = status_of(load_pool("llama-3.1-8b.yaml"), workloads)
    found = conditions(status)
    assert found["Ready"] == ("False", "RouterUnavailable")
    assert found["Progressing"] == ("True", "CreatingChildren")
    assert status.display is not None and status.display.prefill == "0/2"


def test_not_ready_names_the_missing_part() -> None:
    workloads = all_ready()
    workloads["decode"] = sts("llama-8b-decode", 4, 0)
    status = status_of(load_pool("llama-3.1-8b.yaml"), workloads)
    ready = status.condition("Ready")
    assert ready is not None and (ready.status, ready.reason) == ("False", "DecodeUnavailable")
    assert "decode 0/4" in ready.message
    assert conditions(status)["Progressing"] == ("True", "WaitingForReplicas")


def test_partially_ready_pool_serves_while_it_scales() -> None:
    workloads = all_ready()
    workloads["decode"] = sts("llama-8b-decode", 4, 1)
    found = conditions(status_of(load_pool("llama-3.1-8b.yaml"), workloads))
    assert found["Ready"] == ("True", "Serving")
    assert found["Progressing"] == ("True", "WaitingForReplicas")


def test_colocated_policy_or_prefill_at_zero_needs_no_prefill_pod() -> None:
    workloads = all_ready()
    workloads["prefill"] = sts("llama-8b-prefill", 2, 0)
    colocated = load_pool("llama-3.1-8b.yaml", router__policy="Colocated")
    assert conditions(status_of(colocated, workloads))["Ready"] == ("True", "Serving")
    assert (
        conditions(status_of(load_pool("llama-3.1-8b.yaml"), workloads))["Ready"][1] == "PrefillUnavailable"
    )
    workloads["prefill"] = sts("llama-8b-prefill", 0, 0)
    assert conditions(status_of(load_pool("llama-3.1-8b.yaml"), workloads))["Ready"] == ("True", "Serving")


def test_rollout_of_a_new_template_is_progressing() -> None:
    workloads = all_ready()
    workloads["prefill"] = sts("llama-8b-prefill", 2, 2, updated=1, current="r1", update="r2")
    found = conditions(status_of(load_pool("llama-3.1-8b.yaml"), workloads))
    assert found["Progressing"] == ("True", "RollingOut")
    workloads["prefill"] = sts("llama-8b-prefill", 2, 2, generation=3, observed_generation=2)
    assert conditions(status_of(load_pool("llama-3.1-8b.yaml"), workloads))["Progressing"][1] == "RollingOut"


def test_missing_secret_is_degraded_with_its_name() -> None:
    missing = (MissingReference("Secret", "hf-token", "spec.model.tokenSecret"),)
    status = status_of(load_pool("llama-3.1-8b.yaml"), all_ready(), ReconcileOutcome(1, missing))
    degraded = status.condition("Degraded")
    assert degraded is not None and (degraded.status, degraded.reason) == ("True", "MissingSecret")
    assert "hf-token" in degraded.message and "spec.model.tokenSecret" in degraded.message
    both = (*missing, MissingReference("PersistentVolumeClaim", "model-cache", "spec.model.cache"))
    status = status_of(load_pool("llama-3.1-8b.yaml"), all_ready(), ReconcileOutcome(1, both))
    degraded = status.condition("Degraded")
    assert degraded is not None and degraded.reason == "MissingReferences"
    assert "model-cache" in degraded.message and "hf-token" in degraded.message


def test_apply_failure_is_degraded() -> None:
    outcome = ReconcileOutcome(1, apply_error="applying children failed: 422 Invalid")
    degraded = status_of(load_pool("llama-3.1-8b.yaml"), all_ready(), outcome).condition("Degraded")
    assert degraded is not None and (degraded.status, degraded.reason) == ("True", "ApplyFailed")


def test_transition_time_moves_only_when_status_changes() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    first = status_of(pool, all_ready(), now=NOW)
    pool.status = first
    later = status_of(pool, all_ready(), now=NOW + timedelta(minutes=5))
    ready_before, ready_after = first.condition("Ready"), later.condition("Ready")
    assert ready_before is not None and ready_after is not None
    assert ready_after.last_transition_time == ready_before.last_transition_time
    workloads = all_ready()
    workloads["router"] = deploy("llama-8b-router", 2, 0)
    pool.status = later
    changed = status_of(pool, workloads, now=NOW + timedelta(minutes=9)).condition("Ready")
    assert changed is not None and changed.last_transition_time == NOW + timedelta(minutes=9)


def test_the_autoscalers_figures_come_from_the_autoscaler_not_from_the_previous_status() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    pool.status = InferencePoolStatus.model_validate(
        {
            "prefill": {
                "observedMilliseconds": 650,
                "lastScaling": {
                    "fromReplicas": 1,
                    "replicas": 2,
                    "reason": "ForecastUp",
                    "time": "2026-11-29T11:00:00Z",
                },
            },
            "conditions": [
                {
                    "type": "ScalingLimited",
                    "status": "False",
                    "reason": "WithinBounds",
                    "lastTransitionTime": "2026-11-29T11:00:00Z",
                }
            ],
        }
    )
    status = status_of(pool, all_ready())
    assert status.prefill is not None and status.prefill.observed_milliseconds is None
    assert status.prefill.last_scaling is None and status.display is not None
    assert status.display.ttft == "-/800ms"
    assert set(conditions(status)) == {"Ready", "Progressing", "Degraded", "Stalled", "Reconciling"}
    # The adaptive threshold's live value is the routers' (through the autoscaler): none reported, none shown.
    assert status.router is not None and status.router.prefill_threshold_tokens is None
    fixed = load_pool("demo-cpu.yaml")
    fixed_router = status_of(fixed, all_ready()).router
    assert fixed_router is not None and fixed_router.prefill_threshold_tokens == 4096
    decision = ScalingDecision.model_validate(
        {"fromReplicas": 1, "replicas": 2, "reason": "ForecastUp", "time": "2026-11-29T11:00:00Z"}
    )
    figures = AutoscalerFigures(
        {"prefill": RoleFigures(700, decision, 2)}, disaggregated_percent=30, threshold_tokens=2048
    )
    inputs = StatusInputs(pool, 1, ReconcileOutcome(1), Observed(all_ready()), ENDPOINT, NOW, figures)
    told = compose_status(inputs)
    assert told.prefill is not None and (told.prefill.observed_milliseconds, told.prefill.last_scaling) == (
        700,
        decision,
    )
    assert told.display is not None and told.display.ttft == "700/800ms"
    assert told.router is not None
    assert (told.router.prefill_threshold_tokens, told.router.disaggregated_percent) == (2048, 30)


def test_status_differs_ignores_fields_the_operator_does_not_write() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    document = status_of(pool, all_ready()).model_dump(mode="json", by_alias=True, exclude_none=True)
    live = {
        **document,
        "conditions": [*document["conditions"], {"type": "ScalingLimited", "status": "True"}],
        "prefill": {**document["prefill"], "observedMilliseconds": 900},
    }
    assert not status_differs(live, document)
    assert status_differs(None, document)
    live["decode"] = {**document["decode"], "readyReplicas": 3}
    assert status_differs(live, document)
    reordered = {**document, "conditions": list(reversed(document["conditions"]))}
    assert not status_differs(reordered, document)


def test_workload_state_from_api_objects() -> None:
    state = WorkloadState.from_object(
        {
            "kind": "StatefulSet",
            "metadata": {"name": "x", "generation": 2},
            "spec": {"replicas": 3},
            "status": {
                "observedGeneration": 2,
                "replicas": 3,
                "readyReplicas": 3,
                "updatedReplicas": 3,
                "currentRevision": "x-1",
                "updateRevision": "x-2",
            },
        }
    )
    assert state.all_ready() and not state.rolled_out()  # the last pod still runs the old revision
    fresh = WorkloadState.from_object(
        {"kind": "Deployment", "metadata": {"name": "y", "generation": 1}, "spec": {}}
    )
    assert (fresh.desired, fresh.ready, fresh.rolled_out()) == (1, 0, False)
