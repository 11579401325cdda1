"""Running the operator: kopf settings, login from a kubeconfig, an in-process runner for tests and benches.

The operator uses its own kopf registry (not kopf's global one), so several can run in one process; it logs in
with the same kubeconfig (or in-cluster service account) as its own apply client. (kopf's own
login_via_client reads the process-wide default configuration, not the kubeconfig named here.)
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client as k8s_client

from inferencepool.api import labels
from inferencepool.autoscaler.runner import scrape_session
from inferencepool.builders import CHILD_KINDS
from inferencepool.controller.context import OperatorContext
from inferencepool.controller.handlers import CHILD_FILTER, register
from inferencepool.kube import Kube, load_configuration
from inferencepool.kube.objects import label_selector

# The API server ends a watch after server_timeout; the client gives up on a silent connection a little later
# and reconnects, so a watch that died without a FIN cannot keep the operator blind for long.
WATCH_SERVER_TIMEOUT_SECONDS = 270
WATCH_CLIENT_TIMEOUT_SECONDS = 300
WATCH_CONNECT_TIMEOUT_SECONDS = 30
REQUEST_TIMEOUT_SECONDS = 60


def configure_settings(settings: kopf.OperatorSettings) -> None:
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_SECONDS
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_SECONDS
    settings.watching.connect_timeout = WATCH_CONNECT_TIMEOUT_SECONDS
    settings.networking.request_timeout = REQUEST_TIMEOUT_SECONDS
    # kopf's progress and "last handled" records go into annotations of the pool (never into its spec, and not
    # into its status, where the CRD schema would prune them).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=labels.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=labels.GROUP, key="last-handled-configuration"
    )
    # Events are posted explicitly, for what a user should know; kopf's per-handler chatter stays in the log.
    settings.posting.level = logging.CRITICAL
    settings.execution.max_workers = 8
    # Children are watched (to repair one deleted by hand) through a server-side label selector: the watch
    # streams carry the operator's own objects, not every ConfigMap or Service of the watched namespaces.
    for api_version, kind in CHILD_KINDS:
        settings.watching.label_selectors[api_version, kind] = label_selector(CHILD_FILTER)


def connection_info(configuration: k8s_client.Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials from the official client's loaded configuration (as kopf's own login_via_client)."""
    header = configuration.get_api_key_with_prefix("BearerToken") or configuration.get_api_key_with_prefix(
        "authorization"
    )
    parts = header.split(" ", 1) if header else []
    scheme, token = (
        (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    )
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


@dataclass
class Operator:
    """One operator instance: its registry, settings and context, ready to run in an event loop."""

    registry: kopf.OperatorRegistry
    settings: kopf.OperatorSettings
    context: OperatorContext

    @classmethod
    def create(cls, kubeconfig: str | None = None) -> Operator:
        configuration = load_configuration(kubeconfig)
        context = OperatorContext(kube=Kube(configuration))
        registry = kopf.OperatorRegistry()
        register(registry)

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return connection_info(configuration)

        @kopf.on.startup(registry=registry)
        async def open_session(**_: Any) -> None:
            context.session = scrape_session()  # on kopf's event loop, which uses it

        @kopf.on.cleanup(registry=registry)
        async def close_session(**_: Any) -> None:
            if context.session is not None:
                await context.session.close()
                context.session = None

        settings = kopf.OperatorSettings()
        configure_settings(settings)
        return cls(registry=registry, settings=settings, context=context)

    async def run(
        self,
        namespaces: list[str],
        stop_flag: threading.Event | asyncio.Event | None = None,
        ready_flag: threading.Event | asyncio.Event | None = None,
        liveness_endpoint: str | None = None,
    ) -> None:
        try:
            await kopf.operator(
                registry=self.registry,
                settings=self.settings,
                standalone=True,  # one replica, no peering objects to install
                clusterwide=not namespaces,
                namespaces=namespaces,
                stop_flag=stop_flag,
                ready_flag=ready_flag,
                liveness_endpoint=liveness_endpoint,
                memo=kopf.Memo(operator=self.context),  # each object's memo is a shallow copy of this one
            )
        finally:
            self.context.appliers.shutdown(wait=False, cancel_futures=True)
            self.context.kube.close()


@contextmanager
def operator_in_thread(
    kubeconfig: str, namespaces: list[str], ready_timeout: float = 60.0, retry_seconds: float | None = None
) -> Iterator[OperatorContext]:
    """Run an operator in a background thread (own event loop) until the block exits; yields its context."""
    operator = Operator.create(kubeconfig)
    if retry_seconds is not None:
        operator.context.retry_missing_seconds = operator.context.retry_apply_seconds = retry_seconds
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(operator.run(namespaces, stop_flag=stop, ready_flag=ready))
        except BaseException as error:  # surfaced to the caller below
            failure.append(error)
            ready.set()

    thread = threading.Thread(target=main, name="inferencepool-operator", daemon=True)
    thread.start()
    if not ready.wait(ready_timeout) or failure:
        stop.set()
        thread.join(10)
        raise RuntimeError(f"operator did not become ready: {failure[0] if failure else 'timeout'}")
    try:
        yield operator.context
    finally:
        stop.set()
        thread.join(30)
