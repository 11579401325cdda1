"""InferencePool objects as the operator writes them, in the states a GitOps tool must tell apart: built from
examples/demo-cpu.yaml and the operator's own status code (inferencepool.controller.status), so they follow
what the operator really writes."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.autoscaler.figures import AutoscalerFigures, ScalingLimits
from inferencepool.builders.kvcompat import kv_compat_hash
from inferencepool.builders.rollout import PodView, RoleView, plan_rollout
from inferencepool.controller.status import (
    MissingReference,
    Observed,
    ReconcileOutcome,
    StatusInputs,
    WorkloadState,
    status_document,
)

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
ENDPOINT = "http://demo.default.svc/v1"


def manifest(generation: int = 1) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "demo-cpu.yaml").read_text())
    document["metadata"] |= {"namespace": "default", "generation": generation, "uid": "0000-demo"}
    return document


def workload(kind: str, name: str, desired: int, ready: int, generation: int = 1) -> WorkloadState:
    return WorkloadState(
        kind=kind, name=name, generation=generation, observed_generation=generation, desired=desired,
        replicas=desired, ready=ready, updated=desired, current_revision="r1", update_revision="r1",
    )  # fmt: skip


def observed(ready: bool) -> Observed:
    return Observed(
        {
            "prefill": workload("StatefulSet", "demo-prefill", 1, 1 if ready else 0),
            "decode": workload("StatefulSet", "demo-decode", 2, 2 if ready else 0),
            "router": workload("Deployment", "demo-router", 1, 1 if ready else 0),
        }
    )


def with_status(
    document: dict[str, Any],
    seen: Observed,
    outcome: ReconcileOutcome,
    limited: ScalingLimits | None = None,
) -> dict[str, Any]:
    pool = InferencePool.model_validate(document)
    generation = document["metadata"]["generation"]
    figures = AutoscalerFigures(limits=limited)
    inputs = StatusInputs(pool, generation, outcome, seen, ENDPOINT, NOW, figures, previous=pool.status)
    return {**copy.deepcopy(document), "status": status_document(inputs)}


def new() -> dict[str, Any]:
    """Just applied: the operator has written nothing yet."""
    return manifest()


def loading() -> dict[str, Any]:
    """Children created, engines still loading the model: no pod ready."""
    return with_status(manifest(), observed(ready=False), ReconcileOutcome(generation=1))


def ready() -> dict[str, Any]:
    return with_status(manifest(), observed(ready=True), ReconcileOutcome(generation=1))


def degraded() -> dict[str, Any]:
    missing = MissingReference("Secret", "hf-token", "spec.model.tokenSecret")
    return with_status(manifest(), observed(ready=False), ReconcileOutcome(generation=1, missing=(missing,)))


def limited() -> dict[str, Any]:
    """Serving, but the autoscaler wants more prefill replicas than maxReplicas."""
    condition = ScalingLimits(True, "AtMaxReplicas", "prefill wants 5 replicas, maxReplicas is 3")
    return with_status(manifest(), observed(ready=True), ReconcileOutcome(generation=1), condition)


def rolling_out() -> dict[str, Any]:
    """Serving, while the decode StatefulSet has not yet rolled generation 2 out to its pods."""
    seen = observed(ready=True)
    workloads = dict(seen.workloads)
    decode = workloads["decode"]
    assert decode is not None
    workloads["decode"] = WorkloadState(**{**decode.__dict__, "updated": 1, "update_revision": "r2"})
    return with_status(manifest(generation=2), Observed(workloads), ReconcileOutcome(generation=2))


def revision_rollout(done: bool = False) -> dict[str, Any]:
    """Serving, while a new model revision rolls through both pools (builders/rollout.py): each pool has
    its surge pod at the new revision and old pods left (done: every pod at the new revision)."""
    document = manifest(generation=2)
    document["spec"]["model"]["revision"] = "v2"
    pool = InferencePool.model_validate(document)
    target = kv_compat_hash(pool)
    views = {
        role: RoleView(
            count,
            tuple(PodView(o, "old" if o < count and not done else target, True) for o in range(count + 1)),
            None if done else count,
        )
        for role, count in (("prefill", 1), ("decode", 2))
    }
    plan = plan_rollout(pool, target, views)
    inputs = StatusInputs(
        pool,
        2,
        ReconcileOutcome(generation=2),
        observed(ready=True),
        ENDPOINT,
        NOW,
        rollout=plan,
        rollout_progress_at=NOW,
    )
    return {**copy.deepcopy(document), "status": status_document(inputs)}


def spec_changed() -> dict[str, Any]:
    """A new generation the operator has not observed yet (status still from generation 1)."""
    document = ready()
    document["metadata"]["generation"] = 2
    return document


STATES = {
    "new": new,
    "loading": loading,
    "ready": ready,
    "degraded": degraded,
    "limited": limited,
    "spec_changed": spec_changed,
}
