"""spec.scaling: the planner's bounds across both pools (prefill:decode ratio, GPU budget), refused with the
field's name when they cannot hold, and handed to the planner as its settings."""

from __future__ import annotations

import math
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError
from tests.unit.test_api_crd import as_kubectl_strict, open_api_schema
from tests.unit.test_api_models import gpu_spec

from inferencepool.api.v1alpha1 import SPEC_RULES, InferencePoolSpec
from inferencepool.autoscaler.planner_spec import planner_settings


def with_scaling(scaling: dict[str, Any], **changes: Any) -> dict[str, Any]:
    spec = gpu_spec()  # prefill 1..8, decode 2..16, one GPU each, both autoscaled by the planner
    spec["scaling"] = scaling
    for role, autoscaling in changes.items():
        spec[role]["autoscaling"].update(autoscaling)
    return spec


def test_the_bounds_reach_the_planner_settings() -> None:
    spec = InferencePoolSpec.model_validate(
        with_scaling({"prefillDecodeRatio": {"minPercent": 25, "maxPercent": 150}, "gpuBudget": 12})
    )
    settings = planner_settings(spec, {"prefill": 2, "decode": 4})
    assert settings is not None
    assert settings.ratio_bounds == (0.25, 1.5)
    assert settings.gpu_budget == 12
    # no maxPercent: no upper bound; no block: no bounds at all
    open_ended = InferencePoolSpec.model_validate(with_scaling({"prefillDecodeRatio": {"minPercent": 50}}))
    settings = planner_settings(open_ended, {"prefill": 2, "decode": 4})
    assert settings is not None and settings.ratio_bounds == (0.5, math.inf) and settings.gpu_budget is None
    unbounded = gpu_spec()
    unbounded.pop("scaling", None)
    plain = planner_settings(InferencePoolSpec.model_validate(unbounded), {"prefill": 2, "decode": 4})
    assert plain is not None and plain.ratio_bounds is None and plain.gpu_budget is None


@pytest.mark.parametrize(
    ("scaling", "changes", "complaint"),
    [
        (
            {"prefillDecodeRatio": {"minPercent": 200, "maxPercent": 100}},
            {},
            "spec.scaling.prefillDecodeRatio.maxPercent must be >= minPercent",
        ),
        # the minimums: prefill 1 + decode 2, one GPU each
        ({"gpuBudget": 2}, {}, "spec.scaling.gpuBudget must hold both pools' minimums"),
        (
            {"gpuBudget": 3},
            {"decode": {"minReplicas": 2}, "prefill": {"minReplicas": 1}},
            None,
        ),
        (
            {"gpuBudget": 8},
            {"prefill": {"enabled": False}, "decode": {"enabled": False}},
            "spec.scaling needs prefill or decode autoscaling",
        ),
        ({"gpuBudget": 8}, {"prefill": {"enabled": False}}, None),  # decode is still planned
    ],
)
def test_bounds_that_cannot_hold_are_refused_naming_the_field(
    scaling: dict[str, Any], changes: dict[str, Any], complaint: str | None
) -> None:
    spec = with_scaling(scaling, **changes)
    if complaint is None:
        InferencePoolSpec.model_validate(spec)
        return
    with pytest.raises(ValidationError, match=complaint):
        InferencePoolSpec.model_validate(spec)


def test_the_budget_counts_gpus_per_replica_and_a_pool_that_does_not_autoscale() -> None:
    spec = with_scaling({"gpuBudget": 9})
    spec["decode"]["gpusPerReplica"] = 4  # 1 x 1 + 2 x 4 = 9
    InferencePoolSpec.model_validate(spec)
    spec["scaling"]["gpuBudget"] = 8
    with pytest.raises(ValidationError, match=r"spec\.scaling\.gpuBudget must hold"):
        InferencePoolSpec.model_validate(spec)
    pinned = with_scaling({"gpuBudget": 4})
    del pinned["prefill"]["autoscaling"]
    pinned["prefill"]["replicas"] = 3  # pinned at 3: 3 + 2 > 4
    with pytest.raises(ValidationError, match=r"spec\.scaling\.gpuBudget must hold"):
        InferencePoolSpec.model_validate(pinned)


def test_the_crd_has_the_fields_and_their_rules() -> None:
    schema = open_api_schema()
    scaling = schema["properties"]["spec"]["properties"]["scaling"]["properties"]
    assert set(scaling) == {"prefillDecodeRatio", "gpuBudget"}
    assert scaling["gpuBudget"]["minimum"] == 1
    fields = {rule.field for rule in SPEC_RULES}
    assert {"scaling", "scaling.gpuBudget", "scaling.prefillDecodeRatio.maxPercent"} <= fields
    bad: dict[str, Any] = {"apiVersion": "serving.inferencepool.dev/v1alpha1", "kind": "InferencePool"}
    bad |= {"metadata": {"name": "p"}, "spec": with_scaling({"prefillDecodeRatio": {"minPercent": -1}})}
    with pytest.raises(jsonschema.ValidationError, match="less than the minimum of 0"):
        jsonschema.validate(bad, as_kubectl_strict(schema))


@pytest.mark.parametrize(
    ("field", "value"),
    [("policy", "Latency"), ("scaleUpStabilizationSeconds", 30), ("maxScaleDownReplicas", 2)],
)
def test_the_removed_latency_rule_s_fields_are_refused_naming_the_field(field: str, value: Any) -> None:
    """The HPA-style Latency rule is gone (the planner superseded it): a spec that still asks for it, or for
    a field only it read, is refused by the operator's models and by the API server's strict field
    validation (kubectl's default), each naming the field, never pruned into a planner it did not ask for."""
    spec = with_scaling({}, decode={field: value})
    spec.pop("scaling")
    with pytest.raises(ValidationError, match=rf"decode\.autoscaling\.{field}\n  Extra inputs"):
        InferencePoolSpec.model_validate(spec)
    document: dict[str, Any] = {"apiVersion": "serving.inferencepool.dev/v1alpha1", "kind": "InferencePool"}
    document |= {"metadata": {"name": "p"}, "spec": spec}
    with pytest.raises(jsonschema.ValidationError, match=f"'{field}' was unexpected") as refused:
        jsonschema.validate(document, as_kubectl_strict(open_api_schema()))
    assert list(refused.value.absolute_path) == ["spec", "decode", "autoscaling"]
