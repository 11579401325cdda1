"""Every `vllm serve` command line the operator generates is one vLLM 0.33.0 accepts: each flag exists
with the shape it is used in, and --kv-transfer-config holds only KVTransferConfig fields, allowed values,
registered connectors and the extra-config keys its connector reads. The fake engine's list of vLLM flags is
the wheel's."""

from __future__ import annotations

import ast
import json
from typing import Any

import pytest

from inferencepool.api.v1alpha1 import POOL_ROLES, PoolRole
from inferencepool.builders import engine
from inferencepool.engine_sim import vllm_flags
from tests.contract.pools import POOLS
from tests.contract.vllm_source import (
    Wheel,
    extra_config_keys,
    kv_transfer_config_fields,
    serve_flags,
)

NIXL_MODULES = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/"
LMCACHE_ADAPTER = "lmcache/integration/vllm/vllm_v1_adapter.py"
FACTORY = "vllm/distributed/kv_transfer/kv_connector/factory.py"


def registered_connectors(wheel: Wheel) -> set[str]:
    names = set()
    for node in ast.walk(wheel.tree(FACTORY)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "register_connector"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(str(node.args[0].value))
    return names


def command_lines() -> list[tuple[str, PoolRole, list[str]]]:
    return [(name, role, engine.vllm_args(pool, role)) for name, pool in POOLS.items() for role in POOL_ROLES]


def parse_flags(args: list[str], flags: dict[str, str]) -> dict[str, list[str]]:
    """args after the MODEL positional -> {flag: values}, as vLLM's argparse shapes them; fails on misuse."""
    parsed: dict[str, list[str]] = {}
    index = 0
    while index < len(args):
        flag = args[index]
        assert flag.startswith("--"), f"{flag!r} is not a flag (a value without its flag?)"
        assert flag in flags, f"vLLM 0.33 has no flag {flag}"
        kind = flags[flag]
        values: list[str] = []
        index += 1
        if kind in ("value", "values", "optional"):
            while index < len(args) and not args[index].startswith("--"):
                values.append(args[index])
                index += 1
                if kind != "values":
                    break
            if kind != "optional":
                assert values, f"{flag} takes a value"
        parsed[flag] = values
    return parsed


def test_the_fake_engines_flag_list_is_vllms(vllm_wheel: Wheel) -> None:
    assert serve_flags(vllm_wheel) == vllm_flags.SERVE_FLAGS, (
        "engine_sim/vllm_flags.py is stale: run `python -m tests.contract.vllm_source WHEEL`"
    )
    assert kv_transfer_config_fields(vllm_wheel) == vllm_flags.KV_TRANSFER_CONFIG_FIELDS


def test_flag_reading_finds_what_vllm_declares(vllm_wheel: Wheel) -> None:
    """The reader itself: flags declared three different ways, and two that vLLM 0.33 removed."""
    flags = serve_flags(vllm_wheel)
    assert flags["--port"] == "value"  # a FrontendArgs field
    assert flags["--served-model-name"] == "values"  # **model_kwargs["served_model_name"], a list field
    assert flags["--enable-prefix-caching"] == flags["--no-enable-prefix-caching"] == "bool"
    assert flags["--headless"] == "switch"  # store_true in make_arg_parser
    assert "--swap-space" not in flags and "--disable-log-requests" not in flags


@pytest.mark.parametrize(
    ("pool", "role", "args"), command_lines(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_generated_flag_is_a_vllm_flag(
    vllm_wheel: Wheel, pool: str, role: PoolRole, args: list[str]
) -> None:
    assert not args[0].startswith("-")  # the model_tag positional
    parsed = parse_flags(args[1:], serve_flags(vllm_wheel))
    assert int(parsed["--tensor-parallel-size"][0]) == POOLS[pool].spec.tensor_parallel_size(role)
    assert int(parsed["--shutdown-timeout"][0]) > 0
    assert 0 < float(parsed["--gpu-memory-utilization"][0]) <= 1


def connector_configs(config: dict[str, Any]) -> list[dict[str, Any]]:
    if config.get("kv_connector") == "MultiConnector":
        children: list[dict[str, Any]] = config["kv_connector_extra_config"]["connectors"]
        return [config, *children]
    return [config]


@pytest.mark.parametrize(
    ("pool", "role", "args"), command_lines(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_kv_transfer_config_is_one_vllm_and_its_connectors_read(
    vllm_wheel: Wheel, lmcache_wheel: Wheel, pool: str, role: str, args: list[str]
) -> None:
    fields = kv_transfer_config_fields(vllm_wheel)
    connectors = registered_connectors(vllm_wheel)
    extra_keys = {
        "NixlConnector": extra_config_keys(vllm_wheel, NIXL_MODULES),
        "LMCacheConnectorV1": extra_config_keys(lmcache_wheel, LMCACHE_ADAPTER),
        "MultiConnector": {"connectors"},
    }
    config = json.loads(args[args.index("--kv-transfer-config") + 1])
    for connector in connector_configs(config):
        assert set(connector) <= set(fields), set(connector) - set(fields)
        for name, allowed in fields.items():
            if allowed is not None and name in connector:
                assert connector[name] in allowed, (name, connector[name], allowed)
        assert connector["kv_connector"] in connectors
        assert connector.get("kv_role") is not None  # KVTransferConfig.__post_init__ requires it
        extra = set(connector.get("kv_connector_extra_config", {}))
        assert extra <= extra_keys[connector["kv_connector"]], extra - extra_keys[connector["kv_connector"]]
        if connector["kv_connector"] == "NixlConnector":
            # kv_both is deprecated for NixlConnector in 0.33 (nixl/connector.py)
            assert connector["kv_role"] == ("kv_producer" if role == "prefill" else "kv_consumer")


def test_nixl_reads_the_lease_the_drain_waits_for(vllm_wheel: Wheel) -> None:
    assert "kv_lease_duration" in extra_config_keys(vllm_wheel, NIXL_MODULES)
    source = vllm_wheel.source("vllm/engine/arg_utils.py")
    assert (
        '"--shutdown-timeout"' in source and "default=0" in source.split('"--shutdown-timeout"', 1)[1][:200]
    )


def test_vllm_warns_that_kv_both_is_deprecated_for_nixl(vllm_wheel: Wheel) -> None:
    """Why the builder emits producer/consumer roles: the warning is in the released connector."""
    source = vllm_wheel.source(NIXL_MODULES + "connector.py")
    assert "Using kv_role='kv_both' with NixlConnector is deprecated" in source


def test_what_the_nixl_role_changes_is_what_the_fake_engine_and_the_router_assume(vllm_wheel: Wheel) -> None:
    """docs/engine-contract.md section 3, "Roles and lent work": the refusals the fake copies
    (engine_sim/cli.py:_check_nixl_parallel), the consumer-only block-free deferral that keeps the router from
    asking a producer to load KV, and the scheduler acting on kv_transfer_params, not on the role."""
    connector = vllm_wheel.source(NIXL_MODULES + "connector.py")
    assert "NixlConnector PCP currently supports kv_producer only" in connector
    assert 'kv_role in ("kv_consumer", "kv_both")' in connector
    assert "consumer (decode) does not support" in vllm_wheel.source(NIXL_MODULES + "base_worker.py")
    scheduler = vllm_wheel.source("vllm/v1/core/sched/scheduler.py")
    assert "multiple_inflight_batches and kv_transfer_config.is_kv_consumer" in scheduler
    pull = vllm_wheel.source(NIXL_MODULES + "pull_scheduler.py")
    assert 'params.get("do_remote_prefill")' in pull and "kv_role" not in pull
