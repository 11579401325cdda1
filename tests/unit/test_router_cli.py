"""`inferencepool router` flags, config file and $INFERENCEPOOL_ROUTER_CONFIG become one RouterConfig."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from inferencepool.router import cli
from inferencepool.router.config import ENV_CONFIG, ConfigError, RouterConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return parser.parse_args(list(argv))


def test_static_flags() -> None:
    config = cli.build_config(
        parse(
            "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--decode", "http://127.0.0.1:3",
            "--policy", "AlwaysDisaggregate", "--threshold", "512", "--adaptive-threshold", "256:2048",
            "--no-prefix-affinity", "--served-model-name", "m",
        )
    )  # fmt: skip
    assert config.static is not None and config.static.decode == ["http://127.0.0.1:2", "http://127.0.0.1:3"]
    assert config.policy == "AlwaysDisaggregate" and config.prefill_threshold_tokens == 512
    assert (config.adaptive_threshold.enabled, config.adaptive_threshold.min_tokens) == (True, 256)
    assert not config.prefix_affinity.enabled and config.served_model_name == "m"


def test_config_file_then_flags_on_top(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(RouterConfig(pool="llama", namespace="ml", prefill_threshold_tokens=2048).to_yaml())
    config = cli.build_config(parse("--config", str(path), "--threshold", "3000"))
    assert (config.pool, config.namespace, config.prefill_threshold_tokens) == ("llama", "ml", 3000)


def test_config_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CONFIG, '{"pool": "p", "namespace": "n", "policy": "Colocated"}')
    config = cli.build_config(parse())
    assert (config.pool, config.policy) == ("p", "Colocated")


def test_bad_flags_name_the_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    with pytest.raises(ConfigError, match="MIN:MAX"):
        cli.build_config(parse("--decode", "http://x:1", "--adaptive-threshold", "lots"))
    with pytest.raises(ConfigError, match="either `pool`"):
        cli.build_config(parse())
    args = parse("--decode", "ftp://x")
    args.log_level = "WARNING"
    assert cli.run(args) == 2
