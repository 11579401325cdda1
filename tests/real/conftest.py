"""The real-engine tier: vLLM's CPU build (`make real-engine` puts it in .venv-vllm/) serving the tiny
model (`inferencepool model tiny`). Everything under tests/real/ is marked `real` (tests/conftest.py);
without .venv-vllm every test here fails with the command that installs it (never skipped: `make test`
installs it first).

Engines take 3-5 minutes to start on a 2-core machine and ~4.2 GiB each: tests/real/engines/ starts one fleet
(a prefill and two decode engines) for all its tests and stops it before the other real tests run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inferencepool.model.tiny import write_tiny_model
from tests.support.real_engines import venv_problem


@pytest.fixture(autouse=True, scope="session")
def real_engine_installed() -> None:
    problem = venv_problem()
    if problem is not None:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield write_tiny_model(tmp_path_factory.mktemp("tiny-model"))
