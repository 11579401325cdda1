"""The one status document the operator writes (reconcile figures, the autoscaler's, ScalingLimited and the
kubectl columns composed in one place), the events a status change posts, and the checks that name a field a
child would refuse. No cluster needed."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import kopf
from tests.unit.builders_examples import load_pool

from inferencepool.api.v1alpha1 import InferencePoolStatus, ScalingDecision
from inferencepool.autoscaler.figures import AutoscalerFigures, RoleFigures, ScalingLimits
from inferencepool.autoscaler.runner import PoolAutoscaler, _Role
from inferencepool.builders import CHILD_KINDS
from inferencepool.controller.apply import ChildApplyError
from inferencepool.controller.checks import resources_problem, size_problem
from inferencepool.controller.handlers import register
from inferencepool.controller.status import (
    Observed,
    ReconcileOutcome,
    StatusInputs,
    WorkloadKey,
    WorkloadState,
    invalid_status_document,
    status_document,
    status_events,
)
from inferencepool.kube import KubeError

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
ENDPOINT = "http://llama-8b.prod.svc"
WITHIN = ScalingLimits(False, "WithinLimits", "every autoscaled pool is within its replica bounds")
AT_MAX = ScalingLimits(True, "AtMaxReplicas", "decode: wants 20 replicas, at maxReplicas 16")


def ready(kind: str, name: str, count: int) -> WorkloadState:
    revision = "r1" if kind == "StatefulSet" else None
    return WorkloadState(kind, name, 1, 1, count, count, count, count, revision, revision)


def workloads() -> Observed:
    found: dict[WorkloadKey, WorkloadState | None] = {
        "prefill": ready("StatefulSet", "llama-8b-prefill", 2),
        "decode": ready("StatefulSet", "llama-8b-decode", 4),
        "router": ready("Deployment", "llama-8b-router", 2),
        "lmcache-controller": ready("Deployment", "llama-8b-lmcache-controller", 1),
    }
    return Observed(found)


def document_for(
    figures: AutoscalerFigures,
    limited: ScalingLimits | None,
    previous: dict[str, Any] | None = None,
    now: datetime = NOW,
) -> dict[str, Any]:
    pool = load_pool("llama-3.1-8b.yaml")
    before = InferencePoolStatus.model_validate(previous) if previous is not None else None
    figures = replace(figures, limits=limited)
    inputs = StatusInputs(pool, 1, ReconcileOutcome(1), workloads(), ENDPOINT, now, figures, previous=before)
    return status_document(inputs)


NONE = AutoscalerFigures()


def test_one_document_carries_the_autoscalers_figures_and_formats_the_columns_from_them() -> None:
    scaled = ScalingDecision.model_validate(
        {"fromReplicas": 3, "replicas": 4, "reason": "ForecastUp", "time": "2026-12-01T09:00:00Z"}
    )
    figures = AutoscalerFigures(
        {"prefill": RoleFigures(650), "decode": RoleFigures(31, scaled)},
        disaggregated_percent=30,
        lent_percent=5,
        peer_prefill_percent=2,
    )
    document = document_for(figures, WITHIN)
    assert {c["type"] for c in document["conditions"]} == {
        "Ready",
        "Progressing",
        "Degraded",
        "Stalled",
        "Reconciling",
        "ScalingLimited",
    }
    assert document["display"] == {"prefill": "2/2", "decode": "4/4", "ttft": "650/800ms", "itl": "31/40ms"}
    assert (document["prefill"]["observedMilliseconds"], document["prefill"]["readyReplicas"]) == (650, 2)
    assert document["decode"]["lastScaling"]["replicas"] == 4
    assert document["router"] == {
        "endpoint": ENDPOINT,
        "replicas": 2,
        "readyReplicas": 2,
        "disaggregatedPercent": 30,
        "lentPercent": 5,
        "peerPrefillPercent": 2,
    }


def test_what_the_autoscaler_no_longer_reports_leaves_the_document() -> None:
    previous = document_for(
        AutoscalerFigures({"prefill": RoleFigures(650)}, disaggregated_percent=30), WITHIN
    )
    document = document_for(NONE, None, previous)
    assert (
        "observedMilliseconds" not in document["prefill"] and "disaggregatedPercent" not in document["router"]
    )
    assert document["display"]["ttft"] == "-/800ms"
    assert "ScalingLimited" not in {c["type"] for c in document["conditions"]}


def test_scaling_limited_keeps_its_transition_time_until_it_flips() -> None:
    def limited(document: dict[str, Any]) -> dict[str, Any]:
        return next(c for c in document["conditions"] if c["type"] == "ScalingLimited")

    first = document_for(NONE, WITHIN, now=NOW)
    later = document_for(NONE, WITHIN, first, now=NOW + timedelta(minutes=5))
    assert (
        limited(later)["lastTransitionTime"] == limited(first)["lastTransitionTime"] == "2026-12-01T10:00:00Z"
    )
    flipped = document_for(NONE, AT_MAX, later, now=NOW + timedelta(minutes=9))
    assert (limited(flipped)["status"], limited(flipped)["reason"]) == ("True", "AtMaxReplicas")
    assert limited(flipped)["lastTransitionTime"] == "2026-12-01T10:09:00Z"


def test_status_changes_post_ready_not_ready_and_scaling_limited_once() -> None:
    def events(previous: dict[str, Any] | None, current: dict[str, Any]) -> list[tuple[str, str]]:
        before = InferencePoolStatus.model_validate(previous) if previous is not None else None
        return [
            (e.type, e.reason) for e in status_events(before, InferencePoolStatus.model_validate(current))
        ]

    healthy = document_for(NONE, WITHIN)
    assert events(None, healthy) == [("Normal", "Ready")]
    assert events(healthy, healthy) == []
    limited = document_for(NONE, AT_MAX, healthy)
    assert events(healthy, limited) == [("Warning", "ScalingLimited")]
    assert events(limited, limited) == []
    broken = {
        **healthy,
        "conditions": [
            {**c, "status": "False", "reason": "DecodeUnavailable"} if c["type"] == "Ready" else c
            for c in healthy["conditions"]
        ],
    }
    assert events(healthy, broken) == [("Warning", "NotReady")]


def test_a_spec_the_models_refuse_gets_only_degraded_with_the_reason() -> None:
    document = invalid_status_document(
        None, 3, "spec rejected: spec.engine.extraEnv[0].name: Required value", NOW
    )
    degraded, stalled = document["conditions"]
    assert (degraded["type"], degraded["status"], degraded["reason"]) == ("Degraded", "True", "InvalidSpec")
    assert "extraEnv[0].name" in degraded["message"] and document["observedGeneration"] == 3
    assert (stalled["type"], stalled["status"], stalled["message"]) == (
        "Stalled",
        "True",
        degraded["message"],
    )


def test_a_quantity_the_statefulset_would_refuse_is_named_in_the_pools_terms() -> None:
    assert resources_problem(load_pool("demo-cpu.yaml")) is None
    assert (
        resources_problem(
            load_pool("demo-cpu.yaml", decode__resources={"limits": {"cpu": 2, "memory": "1.5Gi"}})
        )
        is None
    )
    problem = resources_problem(load_pool("demo-cpu.yaml", decode__resources={"requests": {"cpu": "lots"}}))
    assert problem is not None and problem.reason == "InvalidSpec"
    assert problem.message.startswith(
        "spec.decode.resources.requests.cpu: 'lots' is not a Kubernetes quantity"
    )


def test_a_spec_too_large_for_kopfs_annotation_names_its_largest_field() -> None:
    assert size_problem({"model": {"servedName": "x" * 1000}}) is None
    problem = size_problem({"model": {"servedName": "x" * 300_000}, "engine": {"extraArgs": ["--a"]}})
    assert problem is not None and problem.reason == "SpecTooLarge"
    assert "the largest field is spec.model.servedName (292 KiB)" in problem.message


def test_a_refused_child_is_named_with_the_part_of_the_spec_it_comes_from() -> None:
    manifest = {
        "kind": "StatefulSet",
        "metadata": {"name": "x-decode", "labels": {"serving.inferencepool.dev/role": "decode"}},
    }
    error = ChildApplyError(
        manifest, KubeError(422, "Invalid", "spec.template.spec.tolerations[0].operator: Unsupported")
    )
    assert str(error) == (
        "StatefulSet 'x-decode' (from spec.decode) was refused: 422 Invalid: "
        "spec.template.spec.tolerations[0].operator: Unsupported"
    )


def test_no_handler_puts_a_finalizer_on_pools_and_every_child_kind_is_watched() -> None:
    registry = kopf.OperatorRegistry()
    register(registry)
    daemons = registry._spawning.get_all_handlers()
    assert [h.id for h in daemons] == ["observe"]
    changing = registry._changing.get_all_handlers()
    assert not any(h.requires_finalizer for h in [*daemons, *changing])
    watched = {h.selector.any_name for h in registry._watching.get_all_handlers() if h.selector is not None}
    assert {kind for _, kind in CHILD_KINDS} <= watched


def test_the_autoscalers_readers_post_nothing_and_change_nothing() -> None:
    events: list[str] = []
    pool = load_pool("demo-cpu.yaml")
    scaler = PoolAutoscaler(
        cast(Any, None), pool, cast(Any, None), lambda _r, _t, reason, _m: events.append(reason)
    )
    assert scaler.figures().limits is None  # nothing decided yet
    state = scaler._roles.setdefault("decode", _Role())
    state.limited = "decode: wants 5 replicas, at maxReplicas 4"
    first = scaler.figures()
    assert first == scaler.figures()
    assert first.limits is not None and (first.limits.limited, first.limits.reason) == (True, "AtMaxReplicas")
    assert events == []


def test_children_are_watched_through_a_server_side_selector_on_the_operators_labels() -> None:
    from inferencepool.controller.runtime import configure_settings

    settings = kopf.OperatorSettings()
    configure_settings(settings)
    selectors = {(s.group, s.version, s.any_name): v for s, v in settings.watching.label_selectors.items()}
    expected = "app.kubernetes.io/managed-by=inferencepool-operator,app.kubernetes.io/part-of=inferencepool"
    for api_version, kind in CHILD_KINDS:
        group, _, version = api_version.rpartition("/")
        assert selectors[(group, version, kind)] == expected
