"""Events about a pool, posted through kopf's event queue (kopf posts them a moment later, in the
background)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from inferencepool.kube.objects import pool_reference


def post_ref_event(ref: dict[str, Any], event_type: str, reason: str, message: str) -> None:
    """Post about the object `ref` names (apiVersion, kind, metadata name/namespace/uid)."""
    kopf.event(kopf.Body(cast(kopf.RawBody, ref)), type=event_type, reason=reason, message=message)


def post_event(body: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
    """Post about the pool whose body (or metadata-bearing snapshot) this is."""
    post_ref_event(pool_reference(body["metadata"]), event_type, reason, message)
