"""The Argo CD health check (Lua) on pool objects in each state, run by a real Lua interpreter (Lua 5.1, as
Argo CD's gopher-lua, and 5.4), the way Argo CD runs it: the script's body with `obj` set, returning `hs`."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.unit import recorded_pools

from inferencepool.observability import health

ROOT = Path(__file__).resolve().parents[2]
INTERPRETERS = ("lua5.1", "lua5.4")


def lua_literal(value: Any) -> str:
    """A JSON-like value as a Lua table constructor (null fields left out, as Argo CD's conversion does)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string literal is a valid Lua string literal for these texts
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(item) for item in value) + "}"
    if isinstance(value, dict):
        fields = (
            f"[{json.dumps(key)}] = {lua_literal(item)}" for key, item in value.items() if item is not None
        )
        return "{" + ", ".join(fields) + "}"
    raise TypeError(type(value))


def run_health(interpreter: str, obj: dict[str, Any], tmp_path: Path) -> tuple[str, str]:
    script = health.argocd_health_lua()
    program = (
        f"obj = {lua_literal(obj)}\n"
        f"local hs = (function()\n{script}\nend)()\n"
        'io.write(hs.status, "\\n", hs.message or "", "\\n")\n'
    )
    path = tmp_path / "health.lua"
    path.write_text(program)
    result = subprocess.run([interpreter, str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    status, message = result.stdout.split("\n", 1)
    return status, message.strip()


@pytest.fixture(params=INTERPRETERS)
def lua(request: pytest.FixtureRequest) -> str:
    interpreter: str = request.param
    if shutil.which(interpreter) is None:
        pytest.skip(f"{interpreter} not installed (Debian: apt-get install -y {interpreter})")
    return interpreter


@pytest.mark.parametrize(
    ("state", "expected", "says"),
    [
        ("new", "Progressing", "Waiting for the operator"),
        ("loading", "Progressing", "no ready"),
        ("ready", "Healthy", "ready: prefill 1/1, decode 2/2, router 1/1"),
        ("degraded", "Degraded", "MissingSecret: Secret 'hf-token'"),
        ("limited", "Healthy", "ScalingLimited AtMaxReplicas: prefill wants 5 replicas"),
        ("spec_changed", "Progressing", "observe generation 2"),
    ],
)
def test_health_of_each_recorded_state(
    lua: str, state: str, expected: str, says: str, tmp_path: Path
) -> None:
    status, message = run_health(lua, recorded_pools.STATES[state](), tmp_path)
    assert status == expected, message
    assert says in message


def test_a_rollout_of_the_latest_generation_is_progressing(lua: str, tmp_path: Path) -> None:
    obj = recorded_pools.ready()
    for condition in obj["status"]["conditions"]:
        if condition["type"] == "Progressing":
            condition |= {
                "status": "True",
                "reason": "RollingOut",
                "message": "rolling out generation 1 to decode",
            }
    assert run_health(lua, obj, tmp_path) == ("Progressing", "RollingOut: rolling out generation 1 to decode")


def test_the_chart_readme_ships_the_same_script() -> None:
    readme = (ROOT / "charts" / "inferencepool-operator" / "README.md").read_text()
    assert health.ARGOCD_HEALTH_KEY in readme
    indented = "\n".join(f"    {line}" if line else "" for line in health.argocd_health_lua().splitlines())
    assert indented in readme, "the chart README's health check drifted from argocd_health.lua"
