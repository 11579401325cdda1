"""Events of the pools themselves: a deleted pool's daemon stops (the pool has no finalizer, so kopf sees the
deletion only as this event)."""

from __future__ import annotations

from typing import Any

import kopf

from inferencepool.controller.context import pool_memory


async def pool_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    if event.get("type") == "DELETED":
        memory = pool_memory(memo)
        memory.deleted = True
        memory.request_status(urgent=True)  # wakes the daemon, which sees `deleted` and returns
