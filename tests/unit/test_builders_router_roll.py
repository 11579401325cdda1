"""The router Deployment rolls on what the router reads, and only on that: editing a pool's autoscaling
(bounds, window, policy, or a target the router does not use) leaves the router's pods alone."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from tests.unit.builders_examples import EXAMPLES, child, load_pool

from inferencepool.builders.common import CHECKSUM_ANNOTATION, PoolRef
from inferencepool.builders.router import router_config


def router_parts(example: str, **changes: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    pool = load_pool(example, **changes)
    name = f"{pool.metadata['name']}-router"
    return child(pool, "Deployment", name), child(pool, "ConfigMap", name)


def autoscaling(example: str, role: str) -> dict[str, Any]:
    spec = yaml.safe_load((EXAMPLES / example).read_text())["spec"]
    return copy.deepcopy(spec[role]["autoscaling"])


def edited(scaling: dict[str, Any], **changes: Any) -> dict[str, Any]:
    scaling = copy.deepcopy(scaling)
    for key, value in changes.items():
        if key in ("itlMilliseconds", "ttftMilliseconds", "percentile"):
            scaling["target"][key] = value
        else:
            scaling[key] = value
    return scaling


# demo-cpu: the adaptive threshold is off; llama-3.1-8b: it adapts (LengthAware).
@pytest.mark.parametrize(
    ("example", "role", "change"),
    [
        ("demo-cpu.yaml", "decode", {"maxReplicas": 5}),
        ("demo-cpu.yaml", "decode", {"minReplicas": 2}),
        ("demo-cpu.yaml", "decode", {"windowSeconds": 45, "intervalSeconds": 15}),
        ("demo-cpu.yaml", "decode", {"scaleDownStabilizationSeconds": 60, "modelLoadSeconds": 300}),
        ("demo-cpu.yaml", "decode", {"enabled": False}),
        ("demo-cpu.yaml", "decode", {"itlMilliseconds": 55}),  # only an adapting threshold reads it
        ("demo-cpu.yaml", "decode", {"percentile": 99}),
        ("demo-cpu.yaml", "prefill", {"percentile": 99}),
        ("llama-3.1-8b.yaml", "decode", {"maxReplicas": 12, "minReplicas": 3}),
        (
            "llama-3.1-8b.yaml",
            "decode",
            {"percentile": 95},
        ),  # the prefill target's percentile is the one read
    ],
)
def test_autoscaling_edits_the_router_does_not_read_leave_it_alone(
    example: str, role: str, change: dict[str, Any]
) -> None:
    before = router_parts(example)
    after = router_parts(example, **{f"{role}__autoscaling": edited(autoscaling(example, role), **change)})
    assert after == before


@pytest.mark.parametrize(
    ("example", "role", "change"),
    [
        ("demo-cpu.yaml", "prefill", {"ttftMilliseconds": 650}),  # routes are costed against the TTFT target
        ("llama-3.1-8b.yaml", "decode", {"itlMilliseconds": 55}),  # the adapting threshold reads ITL
        ("llama-3.1-8b.yaml", "prefill", {"percentile": 95}),
    ],
)
def test_autoscaling_edits_the_router_reads_roll_it(example: str, role: str, change: dict[str, Any]) -> None:
    deployment, configmap = router_parts(example)
    changed = edited(autoscaling(example, role), **change)
    new_deployment, new_configmap = router_parts(example, **{f"{role}__autoscaling": changed})
    assert new_configmap != configmap
    annotation = lambda d: d["spec"]["template"]["metadata"]["annotations"][CHECKSUM_ANNOTATION]  # noqa: E731
    assert annotation(new_deployment) != annotation(deployment)


@pytest.mark.parametrize("lending", [False, True])
def test_the_router_lends_roles_where_the_spec_asks(lending: bool) -> None:
    pool = load_pool("llama-3.1-8b.yaml", router__roleLending=lending)
    config = router_config(pool, PoolRef("llama-8b", "default", "uid"))
    assert config.role_lending is lending and config.scheduling().lending is lending


@pytest.mark.parametrize(
    "changes",
    [
        {"router__policy": "AlwaysDisaggregate"},
        {"router__policy": "Colocated"},
        {"router__replicas": 1, "kvTransfer": {"connector": "LMCachePD"}, "kvCache": None},
    ],
)
def test_role_lending_is_refused_where_it_cannot_lend(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"spec\.router\.roleLending needs spec\.router\.policy LengthAware"):
        load_pool("llama-3.1-8b.yaml", router__roleLending=True, **changes)
