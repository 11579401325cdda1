"""The project's example pools, given the identity the API server would add, for the builder tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import pool_children

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_pool(example: str, **spec_changes: Any) -> InferencePool:
    document = yaml.safe_load((EXAMPLES / example).read_text())
    document["metadata"].update(namespace="prod", uid="1f0c7a52-0000-4000-8000-000000000001")
    for path, value in spec_changes.items():
        node = document["spec"]
        *parents, leaf = path.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return InferencePool.model_validate(document)


def child(pool: InferencePool, kind: str, name: str) -> dict[str, Any]:
    matches = [c for c in pool_children(pool) if c["kind"] == kind and c["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name} rendered {len(matches)} times"
    return matches[0]
