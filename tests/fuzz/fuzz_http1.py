"""Coverage-guided fuzz target for router/http1.py (atheris): request parsing and the relay's response
parsing, checked against the properties in checks.py rather than for crashes alone.

    .venv/bin/python -m tests.fuzz.fuzz_http1 -max_total_time=60 -dict=tests/fuzz/http1.dict \
        <new-corpus-dir> tests/fuzz/corpus/http1

tests/fuzz/test_fuzz.py runs it for a bounded time in the test suite (INFERENCEPOOL_FUZZ_SECONDS, default 30).
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["inferencepool.router", "tests.fuzz"]):
    from tests.fuzz.checks import test_one_input


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
