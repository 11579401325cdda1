"""`bench aborts` and `bench kill` refuse settings that cannot measure what they report."""

from __future__ import annotations

import argparse

from inferencepool.bench import aborts, harness, kill
from inferencepool.engine_sim import cli as engine_cli


def parser_for(module: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out/bench")
    module.configure(parser)  # type: ignore[attr-defined]
    return parser


def test_settings_that_cannot_measure_are_refused() -> None:
    assert aborts.run(parser_for(aborts).parse_args(["--decode", "0"])) == 2
    parser = parser_for(kill)
    assert kill.run(parser.parse_args(["--prefill", "1"])) == 2  # nothing would serve while it is down
    # the decode kill while the prefill pod is still down, or after the load
    assert (
        kill.run(parser.parse_args(["--kill-prefill-at", "8", "--down-for", "3", "--kill-decode-at", "10"]))
        == 2
    )
    assert kill.run(parser.parse_args(["--seconds", "20", "--kill-decode-at", "28"])) == 2


def test_the_fake_engines_hold_kv_for_the_lease_the_bench_asks_for() -> None:
    """The flags as the engine process parses them: its role, NIXL on, the lease (what the bench reports
    expiries against)."""
    parser = argparse.ArgumentParser()
    engine_cli.configure(parser)
    args = parser.parse_args(["serve", harness.MODEL, *harness.nixl_flags("prefill", 7.5)])
    config = engine_cli.build_config(args, {})
    assert (config.role, config.nixl, config.kv_lease_s) == ("prefill", True, 7.5)
