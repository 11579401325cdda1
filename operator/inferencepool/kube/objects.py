"""References to a pool as the API server takes them (events' involvedObject, conditional status writes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import API_VERSION


def pool_reference(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """apiVersion, kind and the identity of a pool. With its uid, a status apply fails (409) rather than land
    on a new pool of the same name."""
    return {
        "apiVersion": API_VERSION,
        "kind": labels.KIND,
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata.get("uid"),
        },
    }


def label_selector(match: Mapping[str, str]) -> str:
    """The string form of an equality label selector, as list calls take it."""
    return ",".join(f"{key}={value}" for key, value in match.items())
