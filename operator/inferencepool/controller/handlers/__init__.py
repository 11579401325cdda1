"""The operator's kopf handlers, one module per trigger, attached to a registry by `register`:

- spec.py: create, update (of the spec) and resume of a pool -> reconcile (controller/reconcile.py);
- children.py: events of every child kind: a deleted child is applied again, a workload change refreshes
  the status;
- lifecycle.py: a pool's deletion stops its daemon;
- daemon.py: each pool's daemon, its autoscaler and the one writer of its status (controller/observer.py);
- indices.py: what the others look up (pools, workloads).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import kopf

from inferencepool.api import labels
from inferencepool.builders import CHILD_KINDS
from inferencepool.controller.handlers.children import child_event
from inferencepool.controller.handlers.daemon import observe_pool
from inferencepool.controller.handlers.indices import pools, workload_states
from inferencepool.controller.handlers.lifecycle import pool_event
from inferencepool.controller.handlers.spec import spec_changed

CHILD_FILTER = {labels.LABEL_MANAGED_BY: labels.MANAGED_BY, labels.LABEL_PART_OF: labels.APP_NAME}
POOLS = (labels.GROUP, labels.VERSION, labels.PLURAL)


def register(registry: kopf.OperatorRegistry) -> None:
    """Attach every handler to `registry` (no global registry, so tests and the CLI can run several)."""
    kopf.index(*POOLS, id="pools", registry=registry)(pools)
    for group, version, plural in (("apps", "v1", "statefulsets"), ("apps", "v1", "deployments")):
        index_id = f"{plural[:-1]}_states"  # kopf passes an index to handlers under its id
        kopf.index(group, version, plural, labels=CHILD_FILTER, id=index_id, registry=registry)(
            workload_states
        )
    for decorator in (kopf.on.resume, kopf.on.create):
        decorator(*POOLS, id="reconcile", registry=registry)(spec_changed)
    kopf.on.update(*POOLS, field="spec", id="reconcile", registry=registry)(spec_changed)
    kopf.on.event(*POOLS, id="pool_event", registry=registry)(pool_event)
    for api_version, kind in CHILD_KINDS:
        kopf.on.event(api_version, kind, labels=CHILD_FILTER, id="child", registry=registry)(child_event)
    # Stopping (operator exit): the daemon sees `stopped` within a second and returns; kopf cancels it if not.
    on_daemon = kopf.daemon(
        *POOLS, id="observe", cancellation_backoff=2.0, cancellation_timeout=10.0, registry=registry
    )
    on_daemon(observe_pool)
    _without_finalizer(registry, observe_pool)


def _without_finalizer(registry: kopf.OperatorRegistry, fn: Any) -> None:
    """kopf gives every daemon a finalizer, so that it stops it before the object goes. A pool's children go
    with it by owner references and its daemon stops itself on the deletion event, so nothing outside
    Kubernetes needs cleaning up: no finalizer (else a pool, and its namespace, stick in Terminating while the
    operator is not running). kopf 1.45 has no option for this; the registered handler is replaced."""
    spawning = registry._spawning
    spawning._handlers = [
        dataclasses.replace(handler, requires_finalizer=False) if handler.fn is fn else handler
        for handler in spawning._handlers
    ]
