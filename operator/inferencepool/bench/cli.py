"""`inferencepool bench NAME`: each benchmark measures its baseline in the same run and prints ratios.

A benchmark module provides `configure(parser)` and `run(args) -> int`, like a top-level command, and keeps
its top-level imports light (heavy ones go inside `run`).
"""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, tuple[str, str]] = {
    "engine": ("inferencepool.bench.engine", "concurrent streams one fake engine sustains on this machine"),
    "router": ("inferencepool.bench.router", "router overhead vs direct and vs vllm-router, on fake engines"),
    "operator": ("inferencepool.bench.operator", "apply-to-children latency; 100 pools: total time, memory"),
    "resume": (
        "inferencepool.bench.resume",
        "streams whole, resumed and broken when a decode engine is killed",
    ),
    "hung": (
        "inferencepool.bench.hung",
        "streams' first events and the endpoint table while a decode engine is frozen (SIGSTOP)",
    ),
    "aborts": (
        "inferencepool.bench.aborts",
        "long P/D requests aborted by their clients at random points: every pod's KV back to idle, how soon",
    ),
    "kill": (
        "inferencepool.bench.kill",
        "a prefill and a decode engine killed and restarted under P/D load: failed requests, reuse",
    ),
    "overload": (
        "inferencepool.bench.overload",
        "twice the load a pool holds: the share answered 429 and the admitted requests' TTFT",
    ),
}


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, (module_name, help_text) in BENCHMARKS.items():
        bench_parser = sub.add_parser(name, help=help_text, description=help_text)
        bench_parser.add_argument("--out", default="out/bench", help="folder for JSON results and plots")
        module = importlib.import_module(module_name)
        module.configure(bench_parser)
        bench_parser.set_defaults(bench_run=module.run)


def run(args: argparse.Namespace) -> int:
    result: int = args.bench_run(args)
    return result
