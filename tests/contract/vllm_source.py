"""vLLM 0.33.0's and LMCache 0.5.6's own definitions, read from their released wheels with `ast` (no torch).

The wheels are read as zip files, nothing is imported from them:
- `serve_flags(wheel)`: every option `vllm serve` accepts and its kind, from the argparse calls of
  `make_arg_parser` (vllm/entrypoints/common/cli_args.py), `FrontendArgs`/`BaseFrontendArgs` fields and
  `EngineArgs.add_cli_args` (vllm/engine/arg_utils.py), with the field types of the config classes the
  `**get_kwargs(Config)["field"]` calls refer to, classified as vLLM's `_compute_kwargs` does;
- `kv_transfer_config_fields(wheel)`: `KVTransferConfig`'s fields (vllm/config/kv_transfer.py; extra fields
  are forbidden by vLLM's `@config`) and the values its Literal fields allow;
- `extra_config_keys(wheel, folder)`: the `kv_connector_extra_config` keys a connector reads
  (`get_from_extra_config("key", ...)` calls).

`python -m tests.contract.vllm_source WHEEL` rewrites operator/inferencepool/engine_sim/vllm_flags.py, the
list the fake engine refuses unknown flags with; tests/contract checks that file against the wheel.
"""

from __future__ import annotations

import ast
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

FlagKind = Literal["bool", "switch", "value", "values", "optional"]

ARG_UTILS = "vllm/engine/arg_utils.py"
CLI_ARGS = "vllm/entrypoints/common/cli_args.py"
KV_TRANSFER = "vllm/config/kv_transfer.py"
VENDORED = Path(__file__).resolve().parents[2] / "operator/inferencepool/engine_sim/vllm_flags.py"


class Wheel:
    """Python sources of a wheel, parsed on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zip = zipfile.ZipFile(path)
        self._trees: dict[str, ast.Module] = {}

    def names(self) -> list[str]:
        return self._zip.namelist()

    def source(self, name: str) -> str:
        return self._zip.read(name).decode()

    def tree(self, name: str) -> ast.Module:
        if name not in self._trees:
            self._trees[name] = ast.parse(self.source(name), filename=name)
        return self._trees[name]

    def classes(self, prefixes: tuple[str, ...]) -> dict[str, ast.ClassDef]:
        found: dict[str, ast.ClassDef] = {}
        for name in self.names():
            if name.endswith(".py") and name.startswith(prefixes):
                for node in ast.walk(self.tree(name)):
                    if isinstance(node, ast.ClassDef):
                        found.setdefault(node.name, node)
        return found


def _fields(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> dict[str, ast.expr]:
    """Annotated class attributes, base classes' first (the dataclass field order)."""
    fields: dict[str, ast.expr] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            fields |= _fields(classes[base.id], classes)
    for item in cls.body:
        if (
            isinstance(item, ast.AnnAssign)
            and isinstance(item.target, ast.Name)
            and not (isinstance(item.annotation, ast.Name) and item.annotation.id == "ClassVar")
        ):
            fields[item.target.id] = item.annotation
    return fields


def _union_members(annotation: ast.expr) -> list[ast.expr]:
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _union_members(annotation.left) + _union_members(annotation.right)
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _union_members(ast.parse(annotation.value, mode="eval").body)
    return [annotation]


def _base_name(member: ast.expr) -> str:
    node = member.value if isinstance(member, ast.Subscript) else member
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def classify(annotation: ast.expr) -> FlagKind:
    """The argparse shape vLLM's `_compute_kwargs` gives a config field of this type."""
    names = {_base_name(m) for m in _union_members(annotation)}
    if names == {"bool", "str", "None"}:
        return "optional"  # bare flag means True, else a string
    if "bool" in names:
        return "bool"  # argparse.BooleanOptionalAction: --x and --no-x
    if names & {"list", "tuple", "set"}:
        return "values"  # nargs "+"
    return "value"


def _kwargs_sources(function: ast.FunctionDef) -> dict[str, tuple[str, str | None]]:
    """`x = get_kwargs(Config)` -> {"x": ("Config", None)}; `x = get_kwargs(C)["f"]` -> {"x": (C, f)}."""
    sources: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(function):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target, value = node.targets[0], node.value
        if not isinstance(target, ast.Name):
            continue
        field: str | None = None
        if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):
            field, value = str(value.slice.value), value.value
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "get_kwargs"
            and value.args
            and isinstance(value.args[0], ast.Name)
        ):
            sources[target.id] = (value.args[0].id, field)
    return sources


def _add_argument_calls(tree: ast.AST) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            yield node


def _explicit_kind(call: ast.Call) -> FlagKind | None:
    for keyword in call.keywords:
        value = keyword.value
        if keyword.arg == "action":
            if isinstance(value, ast.Attribute) and value.attr == "BooleanOptionalAction":
                return "bool"
            if isinstance(value, ast.Constant) and value.value in ("store_true", "store_false"):
                return "switch"
            if isinstance(value, ast.Constant) and value.value == "append":
                return "value"
        if keyword.arg == "nargs" and isinstance(value, ast.Constant):
            return {"+": "values", "*": "values", "?": "optional"}.get(str(value.value), "value")
    return None


def _resolve_unpacked(value: ast.expr, resolve: dict[str, FlagKind]) -> FlagKind | None:
    """`**x_kwargs["f"]`, or `**{**x_kwargs["f"], "default": None}` as some calls write it."""
    if isinstance(value, ast.Dict):
        for key, item in zip(value.keys, value.values, strict=True):
            if key is None and (kind := _resolve_unpacked(item, resolve)) is not None:
                return kind
        return None
    return resolve.get(ast.unparse(value))


def _literal_flags(tree: ast.AST, resolve: dict[str, FlagKind] | None = None) -> dict[str, FlagKind]:
    flags: dict[str, FlagKind] = {}
    for call in _add_argument_calls(tree):
        options = [a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
        if not options:
            continue
        kind = _explicit_kind(call)
        if kind is None and resolve is not None:
            for keyword in call.keywords:
                if keyword.arg is None:
                    kind = _resolve_unpacked(keyword.value, resolve) or kind
        for option in options:
            flags[str(option)] = kind or "value"
    return flags


def serve_flags(wheel: Wheel) -> dict[str, FlagKind]:
    """Every option of `vllm serve` (short aliases too), `--no-x` spelled out for boolean ones."""
    classes = wheel.classes(("vllm/config/", CLI_ARGS))
    flags: dict[str, FlagKind] = {}

    cli = wheel.tree(CLI_ARGS)
    flags |= _literal_flags(cli)
    frontend = classes["FrontendArgs"]
    for name, annotation in _fields(frontend, classes).items():
        kind = classify(annotation)
        if name in ("allowed_origins", "allowed_methods", "allowed_headers", "middleware"):
            kind = "value"  # _customize_cli_kwargs: one JSON value each, middleware repeatable
        flags[f"--{name.replace('_', '-')}"] = kind

    engine = wheel.tree(ARG_UTILS)
    for node in ast.walk(engine):
        if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args":
            resolve: dict[str, FlagKind] = {}
            for variable, (class_name, field) in _kwargs_sources(node).items():
                if class_name not in classes:
                    continue
                fields = _fields(classes[class_name], classes)
                if field is not None:
                    resolve[variable] = classify(fields[field]) if field in fields else "value"
                    continue
                for name, annotation in fields.items():
                    resolve[f"{variable}['{name}']"] = classify(annotation)
            flags |= _literal_flags(node, resolve)
    for option, kind in list(flags.items()):
        if kind == "bool" and option.startswith("--"):
            flags[f"--no-{option[2:]}"] = "bool"
    return dict(sorted(flags.items()))


def kv_transfer_config_fields(wheel: Wheel) -> dict[str, tuple[str, ...] | None]:
    """KVTransferConfig's fields; for Literal-typed ones, the values vLLM accepts."""
    tree = wheel.tree(KV_TRANSFER)
    aliases: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            aliases[node.targets[0].id] = _literal_values(node.value, aliases)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KVTransferConfig")
    fields: dict[str, tuple[str, ...] | None] = {}
    for name, annotation in _fields(cls, {}).items():
        values = tuple(v for m in _union_members(annotation) for v in _literal_values(m, aliases))
        fields[name] = values or None
    return fields


def _literal_values(node: ast.expr, aliases: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    if isinstance(node, ast.Name):
        return aliases.get(node.id, ())
    if isinstance(node, ast.Subscript) and _base_name(node) == "Literal":
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        values: list[str] = []
        for item in items:
            if isinstance(item, ast.Constant):
                values.append(str(item.value))
            else:
                values.extend(_literal_values(item, aliases))
        return tuple(values)
    return ()


def extra_config_keys(wheel: Wheel, prefix: str) -> set[str]:
    """Keys read with `get_from_extra_config("key", default)` in the modules under `prefix`."""
    keys: set[str] = set()
    for name in wheel.names():
        if not (name.startswith(prefix) and name.endswith(".py")):
            continue
        for node in ast.walk(wheel.tree(name)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get_from_extra_config"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                keys.add(str(node.args[0].value))
    return keys


def vendored_source(wheel: Wheel) -> str:
    flags = serve_flags(wheel)
    fields = kv_transfer_config_fields(wheel)
    lines = [
        '"""vLLM 0.33.0\'s `vllm serve` options and KVTransferConfig fields, generated from its wheel.',
        "",
        "Do not edit: `python -m tests.contract.vllm_source WHEEL` writes this file, and tests/contract",
        "checks it against the wheel. The fake engine refuses what is not here, as vLLM's parser does.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Final, Literal",
        "",
        'FlagKind = Literal["bool", "switch", "value", "values", "optional"]',
        "",
        "# option -> bool (BooleanOptionalAction), switch (store_true), value, values (nargs +),",
        "# optional (nargs ?)",
        "SERVE_FLAGS: Final[dict[str, FlagKind]] = {",
        *(f'    "{option}": "{kind}",' for option, kind in flags.items()),
        "}",
        "",
        "# field -> the values a Literal field accepts (None: any value of its type)",
        "KV_TRANSFER_CONFIG_FIELDS: Final[dict[str, tuple[str, ...] | None]] = {",
        *(f'    "{name}": {values!r},' for name, values in fields.items()),
        "}",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.contract.vllm_source VLLM_WHEEL", file=sys.stderr)
        return 2
    VENDORED.write_text(vendored_source(Wheel(Path(argv[0]))))
    print(f"wrote {VENDORED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
