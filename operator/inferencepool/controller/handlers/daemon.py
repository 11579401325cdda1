"""Each pool's daemon: its autoscaler and its status (see controller/observer.py). kopf starts it when it
first sees the pool (again after an operator restart) and stops it when the operator stops; a deleted pool's
daemon stops itself (lifecycle.pool_event)."""

from __future__ import annotations

from typing import Any

import kopf

from inferencepool.controller.context import operator_context, pool_memory
from inferencepool.controller.observer import PoolObserver


async def observe_pool(body: kopf.Body, memo: Any, stopped: kopf.DaemonStopped, **kwargs: Any) -> None:
    # kopf passes each index as a keyword argument named after its function.
    workloads = [kwargs["statefulset_states"], kwargs["deployment_states"]]
    await PoolObserver(operator_context(memo), pool_memory(memo), body, workloads).run(stopped)
