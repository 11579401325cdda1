"""The InferencePool CustomResourceDefinition, generated from the pydantic models.

`inferencepool crd` prints it; `inferencepool crd --write crds/` (or `make crd`) writes the committed file.

Pydantic's JSON schema is not what the API server accepts, so it is rewritten into a structural schema:
$ref/$defs inlined, Optional's anyOf-with-null collapsed to the type, no title/default (defaults are applied
in code, so GitOps tools see no drift), no additionalProperties (the API server prunes unknown fields), and
free-form objects (resources, tolerations, affinity, extra env) kept whole with
x-kubernetes-preserve-unknown-fields.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import (
    NAME_RULES,
    SPEC_RULES,
    InferencePool,
    InferencePoolSpec,
    InferencePoolStatus,
)

CRD_NAME: Final = f"{labels.PLURAL}.{labels.GROUP}"
CRD_FILENAME: Final = f"{CRD_NAME}.yaml"

# Keywords that only annotate (title) or that must not reach the CRD (default: defaults are applied in code).
_DROPPED: Final = frozenset({"title", "default"})
# Keywords a structural schema forbids or the API server rejects; a model that produces one must be changed.
_REJECTED: Final = frozenset(
    {
        "const",
        "uniqueItems",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "oneOf",
        "allOf",
        "not",
        "$defs",
        "discriminator",
    }
)

# Keyword order in the generated YAML: what a node is, then its constraints, then its children.
_KEY_ORDER: Final = (
    "type",
    "description",
    "enum",
    "format",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "maxItems",
    "maxProperties",
    "items",
    "additionalProperties",
    "properties",
    "required",
)

_HEADER: Final = (
    "# Generated from operator/inferencepool/api/v1alpha1.py by `make crd`.\n"
    "# Do not edit by hand: change the models and regenerate.\n"
)


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema (camelCase field names), rewritten as a Kubernetes structural schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.pop("$defs", {})
    return _rewrite(raw, definitions, where=model.__name__)


def _rewrite(node: dict[str, Any], definitions: dict[str, Any], where: str) -> dict[str, Any]:
    if "$ref" in node:
        # A field's own keys (its description) take precedence over those of the referenced model.
        own = {key: value for key, value in node.items() if key != "$ref"}
        referenced = definitions[node["$ref"].rsplit("/", 1)[-1]]
        return _rewrite({**referenced, **own}, definitions, where)
    if "anyOf" in node:
        branches = [branch for branch in node["anyOf"] if branch != {"type": "null"}]
        if len(branches) != 1:
            raise ValueError(f"{where}: only Optional[X] unions are supported in the CRD schema")
        own = {key: value for key, value in node.items() if key != "anyOf"}
        return _rewrite({**branches[0], **own}, definitions, where)

    rejected = _REJECTED.intersection(node)
    if rejected:
        raise ValueError(f"{where}: the API server rejects {sorted(rejected)} in a CRD schema")

    result: dict[str, Any] = {}
    free_form = False
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "additionalProperties":
            # True (pydantic's dict[str, Any]) means a pass-through object; False is implied by pruning.
            if isinstance(value, dict) and value:
                result[key] = _rewrite(value, definitions, f"{where}.*")
            else:
                free_form = value is True or value == {}
        elif key == "properties":
            result[key] = {name: _rewrite(sub, definitions, f"{where}.{name}") for name, sub in value.items()}
        elif key == "items":
            result[key] = _rewrite(value, definitions, f"{where}[]")
        else:
            result[key] = value
    if free_form and "properties" not in result:
        result["x-kubernetes-preserve-unknown-fields"] = True
    return _in_reading_order(result)


def _in_reading_order(node: dict[str, Any]) -> dict[str, Any]:
    def rank(key: str) -> int:
        return _KEY_ORDER.index(key) if key in _KEY_ORDER else len(_KEY_ORDER)

    return {key: node[key] for key in sorted(node, key=rank)}


def spec_validations() -> list[dict[str, str]]:
    """The cross-field rules as CEL, evaluated with `self` bound to the spec."""
    return [{"rule": rule.cel, "message": rule.message, "fieldPath": f".{rule.field}"} for rule in SPEC_RULES]


def name_validations() -> list[dict[str, str]]:
    """The rules on metadata.name as CEL at the schema's root (the one place CEL may read metadata.name)."""
    return [{"rule": rule.cel, "message": rule.message, "fieldPath": ".metadata.name"} for rule in NAME_RULES]


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {
            "name": "Prefill",
            "type": "string",
            "jsonPath": ".status.display.prefill",
            "description": "ready/desired",
        },
        {
            "name": "Decode",
            "type": "string",
            "jsonPath": ".status.display.decode",
            "description": "ready/desired",
        },
        {
            "name": "TTFT",
            "type": "string",
            "jsonPath": ".status.display.ttft",
            "description": "observed/target",
        },
        {
            "name": "ITL",
            "type": "string",
            "jsonPath": ".status.display.itl",
            "description": "observed/target",
        },
        {"name": "Policy", "type": "string", "jsonPath": ".spec.router.policy", "priority": 1},
        {"name": "Revision", "type": "string", "jsonPath": ".status.modelRevision", "priority": 1},
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.router.endpoint", "priority": 1},
        {
            "name": "Bottleneck",
            "type": "string",
            "jsonPath": ".status.bottleneck.phase",
            "priority": 1,
            "description": "the limiting phase over the last window (describe: the Bottleneck condition)",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def open_api_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the InferencePool resource."""
    spec = structural_schema(InferencePoolSpec)
    spec["x-kubernetes-validations"] = spec_validations()
    return {
        "type": "object",
        "description": InferencePool.__doc__,
        "properties": {
            "apiVersion": {"type": "string", "description": "serving.inferencepool.dev/v1alpha1"},
            "kind": {"type": "string", "description": "InferencePool"},
            # Declaring name (the one field besides generateName a CRD may say anything about) lets the name
            # rules point at it: the API server then reports `metadata.name: Invalid value: ...`.
            "metadata": {
                "type": "object",
                "properties": {"name": {"type": "string", "description": "The pool's name."}},
            },
            "spec": spec,
            "status": structural_schema(InferencePoolStatus),
        },
        "required": ["spec"],
        "x-kubernetes-validations": name_validations(),
    }


def custom_resource_definition() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": labels.GROUP,
            "names": {
                "kind": labels.KIND,
                "listKind": f"{labels.KIND}List",
                "plural": labels.PLURAL,
                "singular": labels.SINGULAR,
                "shortNames": [labels.SHORT_NAME],
                "categories": [labels.CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": labels.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {"openAPIV3Schema": open_api_schema()},
                }
            ],
        },
    }


class _PlainDumper(yaml.SafeDumper):
    """Writes repeated subtrees out in full: anchors and aliases would puzzle a reader of the CRD."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def crd_yaml() -> str:
    body = yaml.dump(
        custom_resource_definition(), Dumper=_PlainDumper, sort_keys=False, width=110, allow_unicode=True
    )
    return _HEADER + body


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--write", metavar="DIR", type=Path, help=f"write {CRD_FILENAME} into DIR instead of printing it"
    )


def run(args: argparse.Namespace) -> int:
    text = crd_yaml()
    if args.write is None:
        sys.stdout.write(text)
        return 0
    directory: Path = args.write
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CRD_FILENAME
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return 0
