"""The contract tier: what the operator generates, checked against vLLM 0.33.0's and LMCache 0.5.6's own
definitions, read from their released wheels (never imported: they need torch and CUDA).

The wheels are looked for in $INFERENCEPOOL_WHEELS (default ~/.cache/inferencepool/wheels) and fetched there
with pip on first use (`pip download --no-deps vllm==0.33.0 lmcache==0.5.6`, about 340 MB).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.vllm_source import Wheel

PINS = {"vllm": "0.33.0", "lmcache": "0.5.6"}


def wheel_dir() -> Path:
    return Path(os.environ.get("INFERENCEPOOL_WHEELS", Path.home() / ".cache/inferencepool/wheels"))


def released_wheel(package: str) -> Path:
    folder, version = wheel_dir(), PINS[package]
    found = sorted(folder.glob(f"{package}-{version}-*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            f"{package}=={version}", "-d", str(folder),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        found = sorted(folder.glob(f"{package}-{version}-*.whl"))
        if not found:
            pytest.fail(
                f"the contract tests read {package} {version}'s released wheel; "
                f"`{' '.join(command)}` failed:\n{result.stderr[-2000:]}"
            )
    return found[-1]


@pytest.fixture(scope="session")
def vllm_wheel() -> Iterator[Wheel]:
    yield Wheel(released_wheel("vllm"))


@pytest.fixture(scope="session")
def lmcache_wheel() -> Iterator[Wheel]:
    yield Wheel(released_wheel("lmcache"))
