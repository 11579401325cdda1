"""Bounds: every typed field of the spec has a limit sized for real use, and no spec the CRD admits is so
large that the copies kopf and kubectl keep of it in annotations (256 KiB for all of an object's) overflow."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from inferencepool.api import crd
from inferencepool.api.v1alpha1 import (
    MAX_EXTRA_ARGS_TOTAL,
    MAX_EXTRA_ENV_TOTAL,
    MAX_REPLICAS,
    MAX_SPEC_BYTES,
    NODE_SELECTOR_MESSAGE,
    SPEC_RULES,
    InferencePoolSpec,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ANNOTATIONS_LIMIT = 256 * 1024
# Pass-through subtrees (Kubernetes types kept whole): bounded at their top level only; the model bounds the
# spec as a whole for them.
FREE_FORM = re.compile(
    r"\.(resources|affinity|tolerations\[\]|extraEnv\[\]\.valueFrom|podSecurityContext|securityContext"
    r"|networkPolicy\.allowFrom\[\])$"
)
# Lists whose total the CRD bounds with a CEL rule, in characters.
TOTALS = {".engine.extraArgs": MAX_EXTRA_ARGS_TOTAL}


def spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd.open_api_schema()["properties"]["spec"]
    return schema


def nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}")
    if "items" in node:
        yield from nodes(node["items"], f"{path}[]")


def gpu_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / "llama-3.1-8b.yaml").read_text())["spec"]
    return spec


def test_every_typed_field_is_bounded() -> None:
    unbounded = []
    for path, node in nodes(spec_schema()):
        if FREE_FORM.search(path):
            continue
        kind = node.get("type")
        if kind == "string" and "enum" not in node and "maxLength" not in node:
            unbounded.append(f"{path}: maxLength")
        elif kind == "integer" and "maximum" not in node:
            unbounded.append(f"{path}: maximum")
        elif kind == "array" and "maxItems" not in node:
            unbounded.append(f"{path}: maxItems")
        elif kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(f"{path}: maxProperties")
    assert not unbounded, unbounded


def largest_json(node: dict[str, Any], path: str = "") -> int:
    """Most characters a value of `node` can take as JSON (free-form subtrees excluded: the model bounds
    them)."""
    if FREE_FORM.search(path):
        return 2
    kind = node.get("type")
    if "enum" in node:
        return max(len(json.dumps(value)) for value in node["enum"])
    if kind == "string":
        return int(node["maxLength"]) + 2
    if kind == "integer":
        return len(str(node["maximum"])) + 1
    if kind == "boolean":
        return 5
    if kind == "array":
        if path in TOTALS:
            return TOTALS[path] + 3 * int(node["maxItems"]) + 2
        return 2 + int(node["maxItems"]) * (largest_json(node["items"], f"{path}[]") + 1)
    if "additionalProperties" in node:  # nodeSelector: keys and values at the label limits (CEL)
        return 2 + int(node["maxProperties"]) * (317 + 63 + 6)
    return 2 + sum(
        len(name) + 4 + largest_json(child, f"{path}.{name}") for name, child in node["properties"].items()
    )


def test_the_largest_typed_spec_fits_the_annotations_twice() -> None:
    largest = largest_json(spec_schema())
    # extraEnv values have their own total (CEL), above what the per-entry bound gives.
    env = spec_schema()["properties"]["engine"]["properties"]["extraEnv"]
    per_entry_values = int(env["maxItems"]) * int(env["items"]["properties"]["value"]["maxLength"])
    largest -= per_entry_values - MAX_EXTRA_ENV_TOTAL
    assert largest <= MAX_SPEC_BYTES
    assert (
        2 * MAX_SPEC_BYTES < ANNOTATIONS_LIMIT
    )  # kopf's copy and kubectl's, with room for other annotations


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (("model", "servedName"), "m" * 300_000, "servedName"),
        (("engine", "extraArgs"), ["--x=" + "y" * 900_000], "extraArgs"),
        (("prefill", "replicas"), MAX_REPLICAS + 1, "replicas"),
        (("router", "replicas"), 1000, "replicas"),
        (("engine", "extraArgs"), [f"--a{i}" for i in range(100)], "extraArgs"),
    ],
)
def test_oversized_fields_are_refused_by_schema_and_model(
    path: tuple[str, ...], value: Any, complaint: str
) -> None:
    spec = gpu_spec()
    spec[path[0]][path[1]] = value
    with pytest.raises(jsonschema.ValidationError) as refused:
        jsonschema.validate(spec, spec_schema())
    assert path[0] in refused.value.absolute_path or path[0] in str(refused.value.json_path)
    with pytest.raises(ValidationError, match=complaint):
        InferencePoolSpec.model_validate(spec)


def test_list_totals_are_cel_rules_the_model_applies_too() -> None:
    fields = {rule.field for rule in SPEC_RULES}
    assert {"engine.extraArgs", "engine.extraEnv"} <= fields
    spec = gpu_spec()
    spec["engine"]["extraArgs"] = ["a" * 4000] * 5
    with pytest.raises(ValidationError, match=r"spec\.engine\.extraArgs must have at most 16384 characters"):
        InferencePoolSpec.model_validate(spec)
    spec = gpu_spec()
    spec["engine"]["extraEnv"] = [{"name": f"V{i}", "value": "v" * 4000} for i in range(5)]
    with pytest.raises(ValidationError, match=r"spec\.engine\.extraEnv values must have at most 16384"):
        InferencePoolSpec.model_validate(spec)


def test_node_selector_keys_and_values_keep_label_limits() -> None:
    spec = gpu_spec()
    spec["prefill"]["scheduling"] = {"nodeSelector": {"gpu": "h" * 64}}
    with pytest.raises(ValidationError, match=re.escape(NODE_SELECTOR_MESSAGE)):
        InferencePoolSpec.model_validate(spec)
    node_selector = spec_schema()["properties"]["prefill"]["properties"]["scheduling"]["properties"][
        "nodeSelector"
    ]
    assert node_selector["x-kubernetes-validations"][0]["message"] == NODE_SELECTOR_MESSAGE


def test_a_huge_free_form_subtree_is_refused_by_the_model() -> None:
    spec = gpu_spec()
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z" * 1000] * 200}]}
    spec["decode"]["scheduling"] = {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    }
    with pytest.raises(ValidationError, match=rf"spec is \d+ bytes as JSON, more than {MAX_SPEC_BYTES}"):
        InferencePoolSpec.model_validate(spec)
