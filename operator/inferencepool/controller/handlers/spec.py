"""create, update (of the spec) and resume of a pool: reconcile it."""

from __future__ import annotations

from typing import Any

import kopf

from inferencepool.controller.context import operator_context, pool_memory
from inferencepool.controller.reconcile import reconcile


async def spec_changed(body: kopf.Body, reason: str, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    await reconcile(operator_context(memo), pool_memory(memo), body, str(reason), logger)
