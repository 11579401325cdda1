"""What admission refuses: pool names whose children Kubernetes cannot name, malformed extraEnv entries.

The same rules live in the CRD (CEL, schema) and in the models; tests/cluster/test_cluster_admission.py checks
the CRD against the real API server, these check the models and that every child name fits.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from inferencepool.api import crd
from inferencepool.api.v1alpha1 import (
    ENV_VAR_VALUE_MESSAGE,
    MAX_POOL_NAME_LENGTH,
    NAME_RULES,
    InferencePool,
    InferencePoolSpec,
)
from inferencepool.builders import pool_children

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
# kube-controller-manager's revision hash (rand.SafeEncodeString of a 32-bit number): at most 10 characters.
REVISION_HASH_LENGTH = 10
HIGHEST_ORDINAL = 999


def example(name: str = "llama-3.1-8b.yaml") -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    document["metadata"].update(namespace="prod", uid="1f0c7a52-0000-4000-8000-000000000001")
    return document


def every_feature(name: str, connector: str) -> InferencePool:
    document = example()
    document["metadata"]["name"] = name
    spec = document["spec"]
    spec["kvTransfer"] = {"connector": connector}
    spec["kvCache"]["disk"] = {"sizeGiB": 10}
    if connector == "LMCachePD":
        spec["kvCache"]["p2p"] = {"enabled": False}
        spec["router"]["replicas"] = 1
    return InferencePool.model_validate(document)


def label_values(manifest: dict[str, Any]) -> list[str]:
    found = list(manifest["metadata"].get("labels", {}).values())
    template = manifest.get("spec", {}).get("template", {})
    found += list(template.get("metadata", {}).get("labels", {}).values())
    return found


@pytest.mark.parametrize("connector", ["Nixl", "LMCachePD"])
def test_the_longest_name_allowed_names_every_child_validly(connector: str) -> None:
    children = pool_children(every_feature("p" * MAX_POOL_NAME_LENGTH, connector))
    kinds = {c["kind"] for c in children}
    assert {"Service", "StatefulSet", "Deployment", "ConfigMap"} <= kinds
    for manifest in children:
        name, kind = manifest["metadata"]["name"], manifest["kind"]
        assert DNS_1123_SUBDOMAIN.match(name) and len(name) <= 253, f"{kind}/{name}"
        if kind in ("Service", "StatefulSet", "Deployment"):
            # Service names are DNS-1035 labels; workload names end up in pod hostnames and label values.
            assert DNS_1035_LABEL.match(name), f"{kind}/{name} is not a DNS-1035 label"
        if kind == "StatefulSet":
            assert len(f"{name}-{'x' * REVISION_HASH_LENGTH}") <= 63, f"{name}: controller-revision-hash"
            assert DNS_1035_LABEL.match(f"{name}-{HIGHEST_ORDINAL}"), f"{name}: pod name"
        for value in label_values(manifest):
            assert LABEL_VALUE.match(value), f"{kind}/{name}: label value {value!r}"


@pytest.mark.parametrize(
    ("name", "complaint"),
    [
        ("p" * (MAX_POOL_NAME_LENGTH + 1), "metadata.name must be at most 44 characters"),
        ("Llama-8b", "metadata.name must be a DNS-1035 label"),
        ("8b-llama", "metadata.name must be a DNS-1035 label"),
        ("llama.8b", "metadata.name must be a DNS-1035 label"),
        ("llama-", "metadata.name must be a DNS-1035 label"),
    ],
)
def test_names_children_cannot_carry_are_refused(name: str, complaint: str) -> None:
    document = example()
    document["metadata"]["name"] = name
    with pytest.raises(ValidationError, match=re.escape(complaint)):
        InferencePool.model_validate(document)


def test_name_rules_reach_the_crd_root_and_agree_with_the_model() -> None:
    schema = crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["x-kubernetes-validations"] == [
        {"rule": r.cel, "message": r.message, "fieldPath": ".metadata.name"} for r in NAME_RULES
    ]
    assert schema["properties"]["metadata"]["properties"]["name"]["type"] == "string"
    for rule in NAME_RULES:
        assert "self.metadata.name" in rule.cel and "metadata.name" in rule.message
    assert all(rule.holds("p" * MAX_POOL_NAME_LENGTH) for rule in NAME_RULES)


def engine_env_spec(*entries: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = example()["spec"]
    spec["engine"]["extraEnv"] = list(entries)
    return spec


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ({"value": "1"}, "spec.engine.extraEnv[0].name: Required value"),
        ({"name": "1BAD", "value": "1"}, "spec.engine.extraEnv[0].name in body should match"),
        ({"name": "A=B", "value": "1"}, "spec.engine.extraEnv[0].name in body should match"),
        ({"name": "VLLM_X"}, ENV_VAR_VALUE_MESSAGE),
        ({"name": "VLLM_X", "vaule": "1"}, "spec.engine.extraEnv[0].vaule: unknown field"),
        (
            {"name": "VLLM_X", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            ENV_VAR_VALUE_MESSAGE,
        ),
        ({"name": "VLLM_X", "value": 1}, "spec.engine.extraEnv[0].value must be a string"),
    ],
)
def test_malformed_extra_env_is_refused_naming_the_entry(entry: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(complaint)):
        InferencePoolSpec.model_validate(engine_env_spec(entry))


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ({"value": "1"}, "'name' is a required property"),
        ({"name": "1BAD", "value": "1"}, "does not match"),
        ({"name": "VLLM_X", "value": 1}, "is not of type 'string'"),
    ],
)
def test_the_crd_schema_refuses_the_same_entries(entry: dict[str, Any], complaint: str) -> None:
    schema = crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    document = example()
    document["spec"]["engine"]["extraEnv"] = [entry]
    with pytest.raises(jsonschema.ValidationError, match=complaint):
        jsonschema.validate(document, schema)


def test_well_formed_extra_env_passes_unchanged() -> None:
    entries = [
        {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
        {"name": "NCCL_DEBUG", "value": ""},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    spec = InferencePoolSpec.model_validate(engine_env_spec(*entries))
    assert spec.engine.extra_env == entries
