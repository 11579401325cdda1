"""The generated CRD: in sync with its committed copy, structural, and the examples validate against it."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from inferencepool import cli
from inferencepool.api import crd
from inferencepool.api.v1alpha1 import SPEC_RULES

ROOT = Path(__file__).resolve().parents[2]
COMMITTED_CRD = ROOT / "crds" / crd.CRD_FILENAME
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

# Keywords a structural schema may not contain (or that we keep out on purpose, like default).
FORBIDDEN_KEYWORDS = {
    "$ref",
    "$defs",
    "definitions",
    "const",
    "uniqueItems",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "default",
    "title",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
}


def schema_nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node below (and including) `node`, with a readable path."""
    yield path or "<root>", node
    for name, child in node.get("properties", {}).items():
        yield from schema_nodes(child, f"{path}.{name}")
    if "items" in node:
        yield from schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{path}.*")


def open_api_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd.custom_resource_definition()["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"
    ]
    return schema


def as_kubectl_strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as kubectl's strict field validation applies it: unknown fields are errors, not pruned."""
    strict = copy.deepcopy(schema)
    for _, node in schema_nodes(strict):
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
    return strict


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


def test_committed_crd_matches_the_models() -> None:
    assert COMMITTED_CRD.exists(), f"{COMMITTED_CRD} is missing: run `make crd`"
    assert COMMITTED_CRD.read_text() == crd.crd_yaml(), (
        f"{COMMITTED_CRD.relative_to(ROOT)} is out of date with inferencepool/api: regenerate with `make crd`"
    )


def test_crd_identity() -> None:
    body = crd.custom_resource_definition()
    assert body["metadata"]["name"] == "inferencepools.serving.inferencepool.dev"
    names = body["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
        "InferencePool",
        "inferencepools",
        ["pdpool"],
        ["inference"],
    )
    version = body["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    columns = crd.custom_resource_definition()["spec"]["versions"][0]["additionalPrinterColumns"]
    default_view = [c["name"] for c in columns if c.get("priority", 0) == 0]
    assert default_view == ["Ready", "Prefill", "Decode", "TTFT", "ITL", "Age"]
    status = open_api_schema()["properties"]["status"]
    for column in columns:
        if column["jsonPath"].startswith(".status.display."):
            field = column["jsonPath"].rsplit(".", 1)[1]
            assert field in status["properties"]["display"]["properties"], column


def test_schema_is_structural() -> None:
    for path, node in schema_nodes(open_api_schema()):
        assert (
            "type" in node
            or node.get("x-kubernetes-preserve-unknown-fields")
            or node.get("x-kubernetes-int-or-string")
        ), f"{path} has no type"
        assert not FORBIDDEN_KEYWORDS.intersection(node), (
            f"{path} has {FORBIDDEN_KEYWORDS.intersection(node)}"
        )
        assert node.get("additionalProperties") is not False, f"{path} has additionalProperties: false"
        assert not ("properties" in node and "additionalProperties" in node), f"{path} has both"
        if "properties" in node or "additionalProperties" in node:
            assert node["type"] == "object", path
        if "items" in node:
            assert node["type"] == "array", path
        for required in node.get("required", []):
            assert required in node["properties"], f"{path} requires unknown field {required}"


def test_pass_through_subtrees_keep_unknown_fields() -> None:
    spec = open_api_schema()["properties"]["spec"]["properties"]
    pool = spec["prefill"]["properties"]
    assert pool["resources"] == {
        "type": "object",
        "description": pool["resources"]["description"],
        "x-kubernetes-preserve-unknown-fields": True,
    }
    assert pool["scheduling"]["properties"]["affinity"]["x-kubernetes-preserve-unknown-fields"] is True
    tolerations = pool["scheduling"]["properties"]["tolerations"]
    assert (
        tolerations["type"] == "array"
        and tolerations["items"]["x-kubernetes-preserve-unknown-fields"] is True
    )
    extra_env = spec["engine"]["properties"]["extraEnv"]
    assert extra_env["type"] == "array" and extra_env["items"]["x-kubernetes-preserve-unknown-fields"] is True
    # Typed maps stay typed, not free-form.
    assert pool["scheduling"]["properties"]["nodeSelector"]["additionalProperties"] == {"type": "string"}


def test_descriptions_reach_the_schema() -> None:
    """kubectl explain shows these; every spec field should say what it is."""
    spec = open_api_schema()["properties"]["spec"]
    for path, node in schema_nodes(spec, ".spec"):
        if not path.endswith(("[]", ".*")):
            assert node.get("description"), f"{path} has no description"


def test_conditions_are_a_map_keyed_by_type() -> None:
    conditions = open_api_schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


def test_no_defaults_reach_the_schema_even_where_the_model_has_them() -> None:
    router = open_api_schema()["properties"]["spec"]["properties"]["router"]["properties"]
    assert "default" not in router["prefillThresholdTokens"]
    assert "4096" in router["prefillThresholdTokens"]["description"]


def test_cel_rules_name_their_field() -> None:
    validations = open_api_schema()["properties"]["spec"]["x-kubernetes-validations"]
    assert len(validations) == len(SPEC_RULES) >= 9
    spec = open_api_schema()["properties"]["spec"]
    for validation, rule in zip(validations, SPEC_RULES, strict=True):
        assert validation["rule"] == rule.cel
        assert f"spec.{rule.field}" in validation["message"]
        assert f"self.{rule.field}" in validation["rule"], "a rule should test the field its message names"
        # fieldPath must name a field the schema has, or the API server rejects the CRD.
        node = spec
        for part in validation["fieldPath"].lstrip(".").split("."):
            node = node["properties"][part]
        assert validation["rule"].count("(") == validation["rule"].count(")")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_crd_schema(example: Path) -> None:
    jsonschema.validate(load(example), as_kubectl_strict(open_api_schema()))


def test_both_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {"llama-3.1-8b.yaml", "demo-cpu.yaml"}


@pytest.mark.parametrize(
    ("field_path", "value", "complaint"),
    [
        (("spec", "prefill", "autoscaling", "target", "percentile"), 120, "greater than the maximum of 99"),
        (("spec", "router", "prefillThresholdTokens"), 0, "less than the minimum of 1"),
        (("spec", "router", "prefillThresholdTokens"), -5, "less than the minimum of 1"),
        (("spec", "router", "policy"), "Random", "is not one of"),
        (("spec", "kvTransfer", "connector"), "Mooncake", "is not one of"),
        (("spec", "decode", "replicas"), 1.5, "is not of type 'integer'"),
        (("spec", "router", "prefilThresholdTokens"), 4096, "Additional properties"),
    ],
)
def test_schema_rejects_single_field_errors(field_path: tuple[str, ...], value: Any, complaint: str) -> None:
    document = load(ROOT / "examples" / "llama-3.1-8b.yaml")
    parent = document
    for key in field_path[:-1]:
        parent = parent[key]
    parent[field_path[-1]] = value
    with pytest.raises(jsonschema.ValidationError, match=complaint) as raised:
        jsonschema.validate(document, as_kubectl_strict(open_api_schema()))
    # The error points at the field (or, for an unknown field, at the object holding it).
    assert ".".join(field_path).startswith(".".join(map(str, raised.value.absolute_path)))
    assert len(raised.value.absolute_path) >= len(field_path) - 1


def test_schema_requires_the_model() -> None:
    document = load(ROOT / "examples" / "demo-cpu.yaml")
    del document["spec"]["model"]
    with pytest.raises(jsonschema.ValidationError, match="'model' is a required property"):
        jsonschema.validate(document, open_api_schema())


def test_status_written_by_the_model_fits_the_schema() -> None:
    from datetime import UTC, datetime

    from inferencepool.api.v1alpha1 import InferencePoolStatus, PoolStatus, RouterStatus, ScalingDecision

    now = datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)
    status = InferencePoolStatus(
        observed_generation=3,
        prefill=PoolStatus(
            replicas=2,
            ready_replicas=2,
            desired_replicas=3,
            observed_milliseconds=912,
            target_milliseconds=800,
            percentile=90,
            last_scaling=ScalingDecision(
                from_replicas=2, replicas=3, reason="ForecastUp", message="p90 912ms > 800ms", time=now
            ),
        ),
        router=RouterStatus(endpoint="http://llama-8b.default.svc:8000", prefill_threshold_tokens=4096),
    )
    status.set_condition(
        "Ready", "True", "AllReplicasReady", "2/2 prefill, 4/4 decode", now, observed_generation=3
    )
    body = status.with_display().model_dump(mode="json", by_alias=True, exclude_none=True)
    jsonschema.validate(body, as_kubectl_strict(open_api_schema()["properties"]["status"]))
    assert body["conditions"][0]["lastTransitionTime"] == "2025-06-01T12:00:00Z"


def test_generator_refuses_keywords_the_api_server_rejects() -> None:
    from pydantic import BaseModel, Field

    class Bad(BaseModel):
        ratio: int = Field(gt=0)

    with pytest.raises(ValueError, match="exclusiveMinimum"):
        crd.structural_schema(Bad)


def test_cli_prints_and_writes_the_crd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["crd"]) == 0
    assert capsys.readouterr().out == crd.crd_yaml()
    assert cli.main(["crd", "--write", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / crd.CRD_FILENAME).read_text() == crd.crd_yaml()
    assert yaml.safe_load(crd.crd_yaml())["kind"] == "CustomResourceDefinition"
