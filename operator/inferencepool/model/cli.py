"""`inferencepool model tiny --out DIR`: write the tiny Llama-shaped model (model/tiny.py) that a real vLLM
engine on a CPU serves in the real-engine tests and demo. Deterministic: the same checkout and seed give the
same files. Prints the folder on stdout."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    tiny = sub.add_parser(
        "tiny",
        help="a 3.3M-parameter Llama (2 layers, hidden 256, vocab 4096), random weights, byte-level BPE",
    )
    tiny.add_argument("--out", type=Path, required=True, help="folder to write (created)")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")


def run(args: argparse.Namespace) -> int:
    from inferencepool.model.tiny import write_tiny_model

    started = time.monotonic()
    out = write_tiny_model(args.out, seed=args.seed)
    print(f"tiny model written in {time.monotonic() - started:.1f} s", file=sys.stderr)
    print(out)
    return 0
