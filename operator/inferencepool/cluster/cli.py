"""`inferencepool cluster build|up|down|status`: a real Kubernetes control plane on loopback.

`up` prints progress on stderr and the kubeconfig path as the last line on stdout, so
`export KUBECONFIG=$(inferencepool cluster up)` works.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inferencepool.cluster.paths import ENV_STATE_DIR, default_state_dir
from inferencepool.cluster.vllm_cpu import CpuEngine


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("build", help="build (or find cached) etcd, kube-*, kwok and helm; print their directory")
    up = sub.add_parser("up", help="start the cluster if it is not running; print the kubeconfig path last")
    up.add_argument("--nodes", type=int, default=1, help="fake nodes to create (default 1)")
    up.add_argument(
        "--gpus-per-node", type=int, default=8, help="nvidia.com/gpu capacity of each node (default 8)"
    )
    up.add_argument(
        "--engine",
        choices=("fake", "vllm"),
        default=None,
        help="vllm: run pods of vLLM's image as real `vllm serve` on this CPU (opt-in; needs make "
        "real-engine and a model, ~4.2 GiB and minutes per engine); fake: leave them to kwok again; "
        "default: keep the running cluster's mode",
    )
    up.add_argument(
        "--vllm-venv",
        type=Path,
        default=Path(".venv-vllm"),
        help="the venv holding vllm-cpu (default .venv-vllm, as make real-engine installs it)",
    )
    up.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model folder the real engines serve (default out/tiny-model, from inferencepool model tiny)",
    )
    down = sub.add_parser("down", help="stop every process the cluster started and delete its data")
    down.add_argument("--purge", action="store_true", help="also delete the logs (the whole state directory)")
    sub.add_parser("status", help="show each component's PID and health; exit 1 unless all are healthy")
    runner = sub.add_parser("runner", help="(started by `up`) run the local processes of this project's pods")
    for sub_parser in (up, down, sub.choices["status"], runner):
        sub_parser.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            help=f"state directory (default ${ENV_STATE_DIR} or ~/.cache/inferencepool/cluster)",
        )


def run(args: argparse.Namespace) -> int:
    from inferencepool.cluster import build, controlplane
    from inferencepool.cluster.components import Layout

    state_dir: Path = (
        (args.state_dir or default_state_dir()).absolute() if hasattr(args, "state_dir") else Path()
    )
    try:
        if args.action == "build":
            bin_dir = build.ensure_binaries()
            for line in build.describe(bin_dir):
                print(line, file=sys.stderr)
            print(bin_dir)
            return 0
        if args.action == "up":
            if args.nodes < 1 or args.nodes > 256:
                print("error: --nodes must be between 1 and 256", file=sys.stderr)
                return 2
            if args.gpus_per_node < 0:
                print("error: --gpus-per-node must not be negative", file=sys.stderr)
                return 2
            engine = None
            if args.engine == "vllm":
                try:
                    engine = engine_mode(args.vllm_venv, args.model or DEFAULT_MODEL_DIR)
                except ValueError as error:
                    print(f"error: {error}", file=sys.stderr)
                    return 2
            kubeconfig = controlplane.up(state_dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node)
            if args.engine is not None:
                from inferencepool.cluster.runner import write_engine

                write_engine(Layout(state_dir).engine_file, engine)
            print(kubeconfig)
            return 0
        if args.action == "down":
            controlplane.down(state_dir, purge=args.purge)
            return 0
        if args.action == "status":
            return _print_status(state_dir)
        if args.action == "runner":
            from inferencepool.cluster import runner

            return runner.run_forever(Layout(state_dir))
    except build.BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except controlplane.ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        tail = error.log_tail()
        if tail:
            print(f"--- last lines of {error.log} ---\n{tail}", file=sys.stderr)
        return 1
    raise AssertionError(f"unhandled action {args.action}")


DEFAULT_MODEL_DIR = Path("out/tiny-model")


def engine_mode(venv: Path, model: Path) -> CpuEngine:
    """The runner's engine mode for this venv and model, both checked to exist (absolute paths: the runner
    runs elsewhere)."""
    engine = CpuEngine(venv=str(venv.absolute()), model=str(model.absolute()))
    if not Path(engine.binary).is_file():
        raise ValueError(f"{engine.binary} not found: `make real-engine` installs vLLM's CPU build there")
    if not (model / "config.json").is_file():
        raise ValueError(f"{model} holds no model: `inferencepool model tiny --out {model}` makes one")
    return engine


def _print_status(state_dir: Path) -> int:
    from inferencepool.cluster import controlplane
    from inferencepool.cluster.components import Layout

    rows = controlplane.status(state_dir)
    all_healthy = True
    for row in rows:
        if not row.alive:
            state = "stopped"
        elif row.healthy is None:
            state = "running"
        else:
            state = "healthy" if row.healthy else "UNHEALTHY"
        all_healthy = all_healthy and row.alive and row.healthy is not False
        print(f"{row.name:<24} {state:<10} pid {row.pid if row.pid else '-'}")
    print(f"state: {state_dir}")
    from inferencepool.cluster.runner import read_engine

    engine = read_engine(Layout(state_dir).engine_file)
    if engine is not None:
        scope = ", ".join(engine.namespaces) or "all namespaces"
        print(f"engine mode: vLLM pods run as `{engine.binary} serve {engine.model}` ({scope})")
    if all_healthy:
        print(f"kubeconfig: {Layout(state_dir).kubeconfig}")
    return 0 if all_healthy else 1
