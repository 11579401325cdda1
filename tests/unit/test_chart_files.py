"""The Helm chart's files against the rest of the repository (no helm binary: tests/cluster/test_chart_*.py
render it)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import yaml

from inferencepool.api import crd
from inferencepool.controller import cli as operator_cli

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "inferencepool-operator"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_chart_crds_are_the_repository_crds_byte_for_byte() -> None:
    repository = {path.name: path.read_bytes() for path in (ROOT / "crds").glob("*.yaml")}
    chart = {path.name: path.read_bytes() for path in (CHART / "crds").glob("*.yaml")}
    assert set(chart) == set(repository) == {crd.CRD_FILENAME}
    assert chart == repository, "charts/inferencepool-operator/crds/ drifted from crds/: run `make crd`"


def test_chart_metadata() -> None:
    chart = load(CHART / "Chart.yaml")
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == CHART.name
    assert chart["version"] == chart["appVersion"] == "0.1.0"


def test_default_image_is_the_operator_image_the_dockerfile_builds() -> None:
    values = load(CHART / "values.yaml")
    chart = load(CHART / "Chart.yaml")
    dockerfile = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    built = re.search(r"-t (\S+)", dockerfile)
    assert built is not None
    # An empty tag means the chart's appVersion.
    assert values["image"]["tag"] == ""
    assert built.group(1) == f"{values['image']['repository']}:{chart['appVersion']}"


def test_every_value_is_declared_in_the_schema_and_the_reverse() -> None:
    values = load(CHART / "values.yaml")
    schema = json.loads((CHART / "values.schema.json").read_text())
    # additionalProperties false: an undeclared value would be rejected by helm itself.
    assert schema["additionalProperties"] is False
    assert set(values) == set(schema["properties"])
    for key in ("image", "serviceAccount"):
        assert set(values[key]) == set(schema["properties"][key]["properties"]), key
    assert values["logLevel"] in schema["properties"]["logLevel"]["enum"]


def test_the_liveness_port_is_the_one_the_image_serves() -> None:
    dockerfile = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.MULTILINE)
    assert entrypoint is not None
    argv = json.loads(entrypoint.group(1))
    liveness = argv[argv.index("--liveness") + 1]
    template = (CHART / "templates" / "deployment.yaml").read_text()
    port = re.search(r"containerPort: (\d+)", template)
    path = re.search(r"path: (\S+)", template)
    assert port is not None and path is not None
    assert liveness == f"http://0.0.0.0:{port.group(1)}{path.group(1)}"


def test_the_flags_the_chart_passes_exist_in_the_operator_cli() -> None:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    flags = set(re.findall(r'"(--[a-z-]+)', helpers))
    assert flags == {"--namespace", "--verbose"}
    parser = argparse.ArgumentParser()
    operator_cli.configure(parser)
    args = parser.parse_args(["--liveness", "http://0.0.0.0:8080/healthz", "--namespace=a", "--verbose"])
    assert args.namespaces == ["a"]
    assert args.verbose is True


def test_deploy_namespace_file_is_the_namespace_rbac_yaml_starts_with() -> None:
    namespace = load(ROOT / "deploy" / "operator" / "00-namespace.yaml")
    first = next(yaml.safe_load_all((ROOT / "deploy" / "operator" / "rbac.yaml").read_text()))
    assert namespace == first
    assert namespace["kind"] == "Namespace"
    # Sorted first, so `kubectl apply -f deploy/operator/` creates the namespace before anything in it.
    assert (
        sorted(path.name for path in (ROOT / "deploy" / "operator").glob("*.yaml"))[0] == "00-namespace.yaml"
    )
