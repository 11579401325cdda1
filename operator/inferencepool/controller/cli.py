"""`inferencepool operator`: run the operator against the current kubeconfig or in-cluster account."""

from __future__ import annotations

import argparse
import asyncio
import logging


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG or ~/.kube/config)",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        dest="namespaces",
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    parser.add_argument(
        "--liveness",
        default=None,
        metavar="URL",
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the operator's Prometheus metrics on this port (all addresses), at /metrics",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def run(args: argparse.Namespace) -> int:
    from inferencepool.controller.runtime import Operator

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    operator = Operator.create(args.kubeconfig)
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, registry=operator.context.metrics.registry)
    # No stop flag of our own: in the main thread kopf handles SIGINT/SIGTERM itself. A threading.Event
    # here would never be set (kopf's loop handlers replace signal.signal ones), and kopf's thread waiting
    # on it would keep the process alive after kopf stopped, until the kubelet's SIGKILL.
    asyncio.run(operator.run(args.namespaces, liveness_endpoint=args.liveness))
    return 0
