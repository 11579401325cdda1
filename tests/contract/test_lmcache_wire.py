"""The fake LMCache controller and the fake engine's p2p workers speak LMCache 0.5.6's messages: every message
they write or read has the fields of LMCache's own msgspec class (names, order, which have defaults), the
classes are tagged structs, and the controller takes LMCache's command line. Read from the released wheel."""

from __future__ import annotations

import ast

import pytest

from inferencepool.engine_sim import lmcache_controller, lmcache_wire
from tests.contract.vllm_source import Wheel

MODULES = (
    "lmcache/v1/cache_controller/message.py",
    "lmcache/v1/cache_controller/commands/",
    "lmcache/v1/storage_backend/p2p_backend.py",
    "lmcache/v1/transfer_channel/transfer_utils.py",
    "lmcache/v1/transfer_channel/nixl_channel.py",
)


def classes(wheel: Wheel) -> dict[str, ast.ClassDef]:
    found: dict[str, ast.ClassDef] = {}
    for name in wheel.names():
        if name.endswith(".py") and name.startswith(MODULES):
            for node in ast.walk(wheel.tree(name)):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, node)
    return found


def fields(cls: ast.ClassDef, known: dict[str, ast.ClassDef]) -> list[tuple[str, bool]]:
    """(name, has a default) in msgspec's order: base classes' fields first."""
    result: list[tuple[str, bool]] = []
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in known:
            result += fields(known[base.id], known)
    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            result.append((item.target.id, item.value is not None))
    return result


def tagged(cls: ast.ClassDef, known: dict[str, ast.ClassDef]) -> bool:
    if any(
        k.arg == "tag" and isinstance(k.value, ast.Constant) and k.value.value is True for k in cls.keywords
    ):
        return True
    return any(isinstance(b, ast.Name) and b.id in known and tagged(known[b.id], known) for b in cls.bases)


@pytest.mark.parametrize("tag", sorted(lmcache_wire.FIELDS))
def test_each_message_has_lmcache_s_fields(lmcache_wheel: Wheel, tag: str) -> None:
    known = classes(lmcache_wheel)
    assert tag in known, f"LMCache 0.5.6 has no message class {tag}"
    cls = known[tag]
    assert tagged(cls, known), f"{tag} is not a tagged msgspec Struct"
    theirs = fields(cls, known)
    assert [name for name, _ in theirs] == [name for name, _ in lmcache_wire.FIELDS[tag]]
    with_defaults = {name for name, default in theirs if default}
    assert set(lmcache_wire.DEFAULTS.get(tag, {})) <= with_defaults


def test_p2p_error_codes_and_op_types_are_lmcache_s_values(lmcache_wheel: Wheel) -> None:
    known = classes(lmcache_wheel)
    members = [
        item.targets[0].id
        for item in known["P2PErrorCode"].body
        if isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name)
    ]
    # enum.auto() numbers members from 1, in order
    assert members.index("P2P_SERVER_ERROR") + 1 == lmcache_wire.P2P_SERVER_ERROR
    assert members.index("UNKNOWN_MSG_TYPE") + 1 == lmcache_wire.UNKNOWN_MSG_TYPE
    assert (
        members.index("REMOTE_XFER_HANDLER_NOT_INITIALIZED") + 1
        == lmcache_wire.REMOTE_XFER_HANDLER_NOT_INITIALIZED
    )
    op_types = {
        item.targets[0].id: item.value.value
        for item in known["OpType"].body
        if isinstance(item, ast.Assign)
        and isinstance(item.targets[0], ast.Name)
        and isinstance(item.value, ast.Constant)
    }
    assert op_types == {"ADMIT": lmcache_wire.ADMIT, "EVICT": lmcache_wire.EVICT}
    assert "LocalCPUBackend" in classes_in(lmcache_wheel, "lmcache/v1/storage_backend/local_cpu_backend.py")


def classes_in(wheel: Wheel, module: str) -> set[str]:
    return {n.name for n in ast.walk(wheel.tree(module)) if isinstance(n, ast.ClassDef)}


def test_the_controller_takes_lmcache_s_command_line(lmcache_wheel: Wheel) -> None:
    theirs = set()
    for node in ast.walk(lmcache_wheel.tree("lmcache/v1/api_server/__main__.py")):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            theirs.add(str(node.args[0].value))
    ours = {
        option for action in lmcache_controller.build_parser()._actions for option in action.option_strings
    }
    assert theirs <= ours
    entry_points = lmcache_wheel.source("lmcache-0.5.6.dist-info/entry_points.txt")
    assert "lmcache_controller = lmcache.v1.api_server.__main__:main" in entry_points
