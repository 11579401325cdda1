"""spec.router.overload: what the API server refuses (schema bounds, and the CEL rule that a request's wait in
the router leaves room within the TTFT target), each naming the field, and how the builder carries it into
the router's config (whose checksum rolls the router)."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError
from tests.unit.builders_examples import EXAMPLES, child, load_pool
from tests.unit.test_api_crd import as_kubectl_strict, open_api_schema

from inferencepool.api.v1alpha1 import SPEC_RULES, InferencePoolSpec
from inferencepool.builders.common import CHECKSUM_ANNOTATION, PoolRef
from inferencepool.builders.router import router_config

REF = PoolRef("llama-8b", "prod", "uid")
WAIT_MESSAGE = "spec.router.overload.maxQueueMilliseconds must be less than"


def document(**overload: Any) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / "llama-3.1-8b.yaml").read_text())
    loaded["spec"]["router"]["overload"] = overload
    return loaded


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [
        ("maxQueuedRequests", -1, "less than the minimum of 0"),
        ("maxQueuedRequests", 5000, "greater than the maximum of 4096"),
        ("maxQueueMilliseconds", 0, "less than the minimum of 1"),
        ("retryAfterSeconds", 0, "less than the minimum of 1"),
        ("retryAfterSeconds", 7200, "greater than the maximum of 3600"),
        ("enabled", "yes", "is not of type 'boolean'"),
        ("maxQueuedRequest", 8, "Additional properties"),  # misspelt
    ],
)
def test_bad_overload_values_are_refused_naming_the_field(field: str, value: Any, complaint: str) -> None:
    bad = document(**{field: value})
    with pytest.raises(jsonschema.ValidationError, match=re.escape(complaint)) as raised:
        jsonschema.validate(bad, as_kubectl_strict(open_api_schema()))
    path = list(raised.value.absolute_path)
    assert path[:3] == ["spec", "router", "overload"] and path[3:] in ([field], [])
    with pytest.raises(ValidationError, match=re.escape(field)):
        InferencePoolSpec.model_validate(bad["spec"])


def test_a_wait_as_long_as_the_ttft_target_is_refused_by_the_crd_rule_and_the_model() -> None:
    rule = next(r for r in SPEC_RULES if r.field == "router.overload.maxQueueMilliseconds")
    validations = open_api_schema()["properties"]["spec"]["x-kubernetes-validations"]
    assert {
        "rule": rule.cel,
        "message": rule.message,
        "fieldPath": ".router.overload.maxQueueMilliseconds",
    } in [{key: v[key] for key in ("rule", "message", "fieldPath")} for v in validations]
    assert rule.message.startswith(WAIT_MESSAGE)
    for wait in (800, 5000):  # the example's prefill TTFT target is 800 ms
        with pytest.raises(ValidationError, match=re.escape(WAIT_MESSAGE)):
            InferencePoolSpec.model_validate(document(maxQueueMilliseconds=wait)["spec"])
    InferencePoolSpec.model_validate(document(maxQueueMilliseconds=799)["spec"])
    no_target = document(maxQueueMilliseconds=5000)["spec"]
    del no_target["prefill"]["autoscaling"]
    InferencePoolSpec.model_validate(no_target)  # no target to miss


def test_overload_is_off_by_default_and_waits_half_the_ttft_target() -> None:
    config = router_config(load_pool("llama-3.1-8b.yaml"), REF)
    assert not config.overload.enabled
    assert config.overload_wait_seconds() == 0.4  # the prefill pool's TTFT target is 800 ms


def test_the_spec_reaches_the_router_config_and_rolls_the_router() -> None:
    overload = {"enabled": True, "maxQueuedRequests": 16, "maxQueueMilliseconds": 300, "retryAfterSeconds": 2}
    config = router_config(load_pool("llama-3.1-8b.yaml", router__overload=overload), REF)
    assert config.overload.enabled and config.overload.max_queued_requests == 16
    assert config.overload.retry_after_seconds == 2 and config.overload_wait_seconds() == 0.3

    def checksum(**changes: Any) -> str:
        pool = load_pool("llama-3.1-8b.yaml", **changes)
        deployment = child(pool, "Deployment", f"{pool.metadata['name']}-router")
        annotation: str = deployment["spec"]["template"]["metadata"]["annotations"][CHECKSUM_ANNOTATION]
        return annotation

    before = checksum()
    assert checksum(router__overload=copy.deepcopy(overload)) != before
    assert checksum(router__overload={"enabled": False}) == before  # the defaults, written out
