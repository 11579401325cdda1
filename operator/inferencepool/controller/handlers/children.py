"""Events of the pools' children: a deleted child is applied again (every kind the operator creates), and a
workload change asks the pool's daemon to recompose the status."""

from __future__ import annotations

from typing import Any

import kopf

from inferencepool.api import labels
from inferencepool.controller.context import operator_context
from inferencepool.controller.handlers.indices import PoolEntry
from inferencepool.controller.reconcile import reconcile

WORKLOAD_KINDS = ("StatefulSet", "Deployment")


async def child_event(
    event: kopf.RawEvent,
    namespace: str | None,
    body: kopf.Body,
    resource: kopf.Resource,
    memo: Any,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    key = (namespace or "", body.metadata.labels.get(labels.LABEL_POOL, ""))
    pools: kopf.Index[Any, PoolEntry] = kwargs["pools"]  # kopf passes each index under its id
    entry = next(iter(pools.get(key, [])), None)
    if entry is None:
        return  # not a pool's child, or the pool is gone or going: garbage collection removes its children
    if event.get("type") == "DELETED":
        logger.info(
            "%s %s of %s was deleted; applying the pool again", resource.kind, body.metadata.name, key[1]
        )
        try:
            await reconcile(operator_context(memo), entry.memory, entry.body, "repair", logger)
        except (kopf.TemporaryError, kopf.PermanentError) as error:
            logger.warning("repair of %s incomplete: %s", key[1], error)
    elif resource.kind in WORKLOAD_KINDS:
        entry.memory.request_status()
