"""`inferencepool cluster build|up|down|status`: a real Kubernetes control plane on loopback.

`up` prints progress on stderr and the kubeconfig path as the last line on stdout, so
`export KUBECONFIG=$(inferencepool cluster up)` works.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inferencepool.cluster.paths import ENV_STATE_DIR, default_state_dir


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("build", help="build (or find cached) etcd, kube-*, kwok and helm; print their directory")
    up = sub.add_parser("up", help="start the cluster if it is not running; print the kubeconfig path last")
    up.add_argument("--nodes", type=int, default=1, help="fake nodes to create (default 1)")
    up.add_argument(
        "--gpus-per-node", type=int, default=8, help="nvidia.com/gpu capacity of each node (default 8)"
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
            print(controlplane.up(state_dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node))
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
    if all_healthy:
        print(f"kubeconfig: {Layout(state_dir).kubeconfig}")
    return 0 if all_healthy else 1
