"""The fuzz tier: the committed corpus keeps every property, and a coverage-guided run of the atheris target
for a bounded time (INFERENCEPOOL_FUZZ_SECONDS, default 30) finds nothing new."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.checks import test_one_input as check_one_input

HERE = Path(__file__).parent
CORPUS = HERE / "corpus" / "http1"
ROOT = HERE.parent.parent


def corpus_files() -> list[Path]:
    return sorted(CORPUS.iterdir())


def test_the_committed_corpus_keeps_every_property() -> None:
    files = corpus_files()
    assert len(files) >= 40  # the seeds (tests/fuzz/seeds.py) and what earlier runs found
    for path in files:
        check_one_input(path.read_bytes())


def test_fuzzing_http1_for_a_bounded_time_finds_nothing(tmp_path: Path) -> None:
    try:
        import atheris  # noqa: F401
    except ImportError:
        pytest.fail("atheris is not installed: `pip install -e '.[dev]'` (the fuzz tier needs it)")
    seconds = int(os.environ.get("INFERENCEPOOL_FUZZ_SECONDS", "30"))
    found = tmp_path / "found"
    found.mkdir()
    command = [
        sys.executable,
        "-m",
        "tests.fuzz.fuzz_http1",
        f"-max_total_time={seconds}",
        "-timeout=10",
        "-rss_limit_mb=1024",
        f"-dict={HERE / 'http1.dict'}",
        f"-artifact_prefix={tmp_path}/",
        str(found),  # new inputs go here, the committed corpus stays as it is
        str(CORPUS),
    ]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
    crashes = sorted(tmp_path.glob("crash-*")) + sorted(tmp_path.glob("timeout-*"))
    log = "\n".join(line for line in run.stderr.splitlines() if not line.startswith("INFO: Instrumenting"))
    assert run.returncode == 0 and not crashes, (
        f"the fuzzer found an input breaking a property: {[c.name for c in crashes]}\n{log[-4000:]}"
    )
    assert "Done" in log, log[-2000:]
