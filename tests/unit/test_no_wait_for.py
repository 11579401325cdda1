"""No `asyncio.wait_for` in the product or its tools: on Python 3.11 (the floor in pyproject.toml) it can
swallow a cancellation that lands as the awaited thing completes (3.12 rebuilt it on `asyncio.timeout`), and
a task cancelled then runs on: the fake engine's stop() and the router's stop() hung forever that way under
load. `async with asyncio.timeout(...)` is the form to use."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "inferencepool"


def wait_for_calls(source: str) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "wait_for"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "asyncio"
    ]


def test_the_scan_finds_a_wait_for() -> None:
    assert wait_for_calls("import asyncio\nasync def f(x):\n    await asyncio.wait_for(x, 1)\n") == [3]


def test_no_module_awaits_with_asyncio_wait_for() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in wait_for_calls(path.read_text())
    ]
    assert found == []
