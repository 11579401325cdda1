"""One entry point, `inferencepool <command>`.

Each command lives in its component's own module, which provides
`configure(parser: argparse.ArgumentParser) -> None` and `run(args: argparse.Namespace) -> int`.
Only the chosen command's module is imported, so `inferencepool crd` does not pay for kopf or aiohttp.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "crd": ("inferencepool.api.crd", "print the InferencePool CRD as YAML (or write it with --write)"),
    "cluster": ("inferencepool.cluster.cli", "build, start, stop or inspect the local control plane"),
    "operator": ("inferencepool.controller.cli", "run the operator against the current kubeconfig"),
    "router": ("inferencepool.router.cli", "run the prefill/decode router"),
    "fake-engine": ("inferencepool.engine_sim.cli", "run a CPU-only stand-in for a vLLM engine"),
    "model": ("inferencepool.model.cli", "write a tiny model that real vLLM serves on a CPU (no download)"),
    "bench": ("inferencepool.bench.cli", "run a benchmark and print ratios against its baseline"),
    "sim": ("inferencepool.sim.cli", "compare a pool spec with what a user would run instead, on a trace"),
    "diagnose": ("inferencepool.whatif.cli", "say which phase limits a pool, why, and the fix that fits"),
    "demo": ("inferencepool.demo.run", "run the local demo: control plane, operator, router, fake engines"),
}


def build_parser(chosen: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferencepool", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.configure(command_parser)
            command_parser.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else None)
    args = parser.parse_args(args_list)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
