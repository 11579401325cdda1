"""One fleet of real engines for every test in this package: prefill-0, decode-0 and decode-1 of the tier's
pool (tests/support/real_engines.py), started together (3-5 minutes), warmed with one request each and one
P/D hand-off, stopped when the package is done (before the other real tests, which start their own).

Tests that kill or drain engines are in test_failures.py, which runs last (see pytest_collection_modifyitems).
INFERENCEPOOL_REAL_FLEET=DIR adopts a fleet that `python -m tests.support.real_engines up DIR` left running
(development only: it is left running too).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferencepool.builders.engine import HTTP_PORT
from tests.support.real_engines import Fleet, adopt_fleet, plan_fleet, post_json, wait_healthy

HERE = Path(__file__).parent
LAST = ("test_failures.py",)
ENV_FLEET = "INFERENCEPOOL_REAL_FLEET"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that kill engines run after every other test of the fleet."""
    ours = [i for i in items if HERE in Path(str(i.path)).parents]
    if not ours:
        return
    first = items.index(ours[0])
    rest = [i for i in items if i not in ours]
    ordered = [i for i in ours if Path(str(i.path)).name not in LAST]
    ordered += [i for i in ours if Path(str(i.path)).name in LAST]
    items[:] = rest[:first] + ordered + rest[first:]


def warm_up(fleet: Fleet) -> None:
    """The first request an engine serves is slow (lazy initialisation), the first NIXL read more so."""
    for engine in fleet.engines:
        status, body = post_json(
            engine.url + "/v1/completions", {"model": fleet.served_name, "prompt": "warm up", "max_tokens": 2}
        )
        assert status == 200, body
    prompt = "the first hand-off opens the NIXL connection " * 20
    for decode in fleet.decodes:
        status, prefilled = post_json(
            fleet.prefill.url + "/v1/completions",
            {
                "model": fleet.served_name,
                "prompt": prompt,
                "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
            },
        )
        assert status == 200, prefilled
        status, body = post_json(
            decode.url + "/v1/completions",
            {
                "model": fleet.served_name,
                "prompt": prompt,
                "max_tokens": 2,
                "kv_transfer_params": prefilled["kv_transfer_params"],
            },
        )
        assert status == 200, body


@pytest.fixture(scope="package")
def fleet(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    adopted = os.environ.get(ENV_FLEET)
    if adopted:
        found = adopt_fleet(Path(adopted) / "model", Path(adopted))
        wait_healthy(found.engines)
        yield found
        return
    fleet = plan_fleet(tiny_model, tmp_path_factory.mktemp("fleet"))
    assert all(engine.plan.port == HTTP_PORT for engine in fleet.engines)
    try:
        for engine in fleet.engines:
            engine.start()
        wait_healthy(fleet.engines)
        warm_up(fleet)
        yield fleet
    finally:
        for engine in fleet.engines:
            engine.stop()
