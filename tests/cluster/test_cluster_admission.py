"""The real API server refuses what the operator could not apply, with a message naming the field.

Names whose children Kubernetes cannot name, malformed extraEnv entries, and specs so large that kopf's and
kubectl's copies of them would overflow the object's annotations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.cluster import TestCluster

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import ENV_VAR_VALUE_MESSAGE, MAX_POOL_NAME_LENGTH

REPO = Path(__file__).resolve().parents[2]
CRD_NAME = f"{labels.PLURAL}.{labels.GROUP}"


@pytest.fixture(scope="module")
def crd_applied(cluster: TestCluster) -> None:
    result = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    assert result.returncode == 0, result.stderr
    established = cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    assert established.returncode == 0, established.stderr


def demo_pool(name: str) -> dict[str, Any]:
    pool: dict[str, Any] = yaml.safe_load((REPO / "examples" / "demo-cpu.yaml").read_text())
    pool["metadata"]["name"] = name
    return pool


def create(cluster: TestCluster, namespace: str, pool: dict[str, Any]) -> tuple[int, str]:
    # `create`, not `apply`: kubectl's own last-applied annotation would fail first on the huge specs.
    result = cluster.kubectl("create", "-n", namespace, "-f", "-", input_text=yaml.safe_dump(pool))
    return result.returncode, result.stderr


def stored_names(cluster: TestCluster, namespace: str) -> str:
    listed = cluster.kubectl("get", CRD_NAME, "-n", namespace, "-o", "name")
    assert listed.returncode == 0, listed.stderr
    return listed.stdout


@pytest.mark.usefixtures("crd_applied")
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("p" * (MAX_POOL_NAME_LENGTH + 1), "metadata.name must be at most 44 characters"),
        ("llama.8b", "metadata.name must be a DNS-1035 label"),
        ("8b-llama", "metadata.name must be a DNS-1035 label"),
    ],
)
def test_names_children_cannot_carry_are_refused(
    cluster: TestCluster, namespace: str, name: str, message: str
) -> None:
    code, stderr = create(cluster, namespace, demo_pool(name))
    assert code != 0
    assert f"metadata.name: Invalid value: {message}" in stderr, stderr
    assert name not in stored_names(cluster, namespace)


@pytest.mark.usefixtures("crd_applied")
def test_the_longest_allowed_name_is_accepted(cluster: TestCluster, namespace: str) -> None:
    name = "p" * MAX_POOL_NAME_LENGTH
    result = cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input_text=yaml.safe_dump(demo_pool(name))
    )
    assert result.returncode == 0, result.stderr


def _without_name(spec: dict[str, Any]) -> None:
    spec["engine"]["extraEnv"] = [{"value": "1"}]


def _bad_name(spec: dict[str, Any]) -> None:
    spec["engine"]["extraEnv"] = [{"name": "1-BAD", "value": "1"}]


def _misspelt_value(spec: dict[str, Any]) -> None:
    spec["engine"]["extraEnv"] = [{"name": "VLLM_X", "vaule": "1"}]


def _value_and_value_from(spec: dict[str, Any]) -> None:
    source = {"fieldRef": {"fieldPath": "status.podIP"}}
    spec["engine"]["extraEnv"] = [{"name": "VLLM_X", "value": "1", "valueFrom": source}]


@pytest.mark.usefixtures("crd_applied")
@pytest.mark.parametrize(
    ("mutate", "messages"),
    [
        (_without_name, ["spec.engine.extraEnv[0].name", "Required value"]),
        (_bad_name, ["spec.engine.extraEnv[0].name", "should match"]),
        (_misspelt_value, ["spec.engine.extraEnv[0]", ENV_VAR_VALUE_MESSAGE]),
        (_value_and_value_from, ["spec.engine.extraEnv[0]", ENV_VAR_VALUE_MESSAGE]),
    ],
    ids=["without-name", "bad-name", "misspelt-value", "value-and-value-from"],
)
def test_malformed_extra_env_is_refused_naming_the_entry(
    cluster: TestCluster, namespace: str, mutate: Callable[[dict[str, Any]], None], messages: list[str]
) -> None:
    pool = demo_pool("bad-env")
    mutate(pool["spec"])
    code, stderr = create(cluster, namespace, pool)
    assert code != 0
    for message in messages:
        assert message in stderr, stderr
    assert "bad-env" not in stored_names(cluster, namespace)


def _huge_served_name(spec: dict[str, Any]) -> None:
    spec["model"]["servedName"] = "m" * 300_000


def _huge_extra_arg(spec: dict[str, Any]) -> None:
    spec["engine"]["extraArgs"] = ["--x=" + "y" * 900_000]


def _many_extra_args(spec: dict[str, Any]) -> None:
    spec["engine"]["extraArgs"] = ["a" * 4000] * 5


def _too_many_replicas(spec: dict[str, Any]) -> None:
    spec["prefill"]["replicas"] = 100_000


@pytest.mark.usefixtures("crd_applied")
@pytest.mark.parametrize(
    ("mutate", "messages"),
    [
        (_huge_served_name, ["spec.model.servedName", "Too long"]),
        (_huge_extra_arg, ["spec.engine.extraArgs[0]", "Too long"]),
        (_many_extra_args, ["spec.engine.extraArgs must have at most 16384 characters in all"]),
        (_too_many_replicas, ["spec.prefill.replicas", "should be less than or equal to 512"]),
    ],
    ids=["servedName-300KB", "extraArg-900KB", "extraArgs-total", "replicas"],
)
def test_oversized_specs_are_refused_naming_the_field(
    cluster: TestCluster, namespace: str, mutate: Callable[[dict[str, Any]], None], messages: list[str]
) -> None:
    pool = demo_pool("too-big")
    mutate(pool["spec"])
    code, stderr = create(cluster, namespace, pool)
    assert code != 0
    for message in messages:
        assert message in stderr, stderr[:2000]
    assert "too-big" not in stored_names(cluster, namespace)


@pytest.mark.usefixtures("crd_applied")
@pytest.mark.parametrize(
    ("overload", "messages"),
    [
        (
            {"enabled": True, "maxQueueMilliseconds": 800},  # the example's prefill TTFT target
            ["spec.router.overload.maxQueueMilliseconds must be less than"],
        ),
        (
            {"maxQueuedRequests": 5000},
            ["spec.router.overload.maxQueuedRequests", "should be less than or equal to 4096"],
        ),
        ({"retryAfterSeconds": 0}, ["spec.router.overload.retryAfterSeconds", "should be greater than"]),
    ],
    ids=["wait-as-long-as-the-ttft-target", "queue-bound", "retry-after"],
)
def test_bad_overload_settings_are_refused_naming_the_field(
    cluster: TestCluster, namespace: str, overload: dict[str, Any], messages: list[str]
) -> None:
    pool = demo_pool("bad-overload")
    pool["spec"]["router"]["overload"] = overload
    code, stderr = create(cluster, namespace, pool)
    assert code != 0
    for message in messages:
        assert message in stderr, stderr[:2000]
    assert "bad-overload" not in stored_names(cluster, namespace)
