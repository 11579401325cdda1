"""What the API server accepts in a pool but cannot accept in its children, found before anything is applied
(pure). Admission and the models refuse most of it (the name, extraEnv, bounds on sizes), but pass-through
fields and a CRD installed before those bounds can still let it in; then the pool is Degraded with the field
named, instead of failing on every retry.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import Manifest, pool_children
from inferencepool.builders.rollout import RolloutPlan
from inferencepool.controller.status import SpecProblem

# resource.Quantity's form, as the API server checks it (after the CRD let the pass-through subtree in).
QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
# kopf records the last handled spec in an annotation; the API server allows 256 KiB of annotations.
ANNOTATIONS_MAX_BYTES = 256 * 1024
ANNOTATIONS_MARGIN_BYTES = 16 * 1024  # kopf's own progress records, labels, annotations already there


def rendered_children(
    pool: InferencePool, rollout: RolloutPlan | None = None
) -> list[Manifest] | SpecProblem:
    """Every child, or the builders' objection naming the field (e.g. an extraEnv entry without a name)."""
    try:
        return pool_children(pool, rollout)
    except ValueError as error:
        return SpecProblem("InvalidSpec", str(error))


def resources_problem(pool: InferencePool) -> SpecProblem | None:
    """A requests/limits value that is not a Kubernetes quantity (the CRD passes resources through)."""
    sections = {
        "spec.prefill.resources": pool.spec.prefill.resources,
        "spec.decode.resources": pool.spec.decode.resources,
        "spec.router.resources": pool.spec.router.resources,
    }
    for path, resources in sections.items():
        for part in ("requests", "limits"):
            amounts = resources.get(part) or {}
            if not isinstance(amounts, Mapping):
                return SpecProblem("InvalidSpec", f"{path}.{part} must map resource names to quantities")
            for name, amount in amounts.items():
                if isinstance(amount, bool) or not (
                    isinstance(amount, int | float) or (isinstance(amount, str) and QUANTITY.match(amount))
                ):
                    return SpecProblem(
                        "InvalidSpec",
                        f"{path}.{part}.{name}: {amount!r} is not a Kubernetes quantity (e.g. 500m, 2, 16Gi)",
                    )
    return None


def size_problem(spec: Mapping[str, Any]) -> SpecProblem | None:
    """A spec too large for kopf's record of it in the pool's annotations, naming its largest field."""
    size = len(json.dumps(spec, separators=(",", ":")))
    if size <= ANNOTATIONS_MAX_BYTES - ANNOTATIONS_MARGIN_BYTES:
        return None
    path, largest = max(_leaf_sizes(spec, "spec"), key=lambda item: item[1])
    return SpecProblem(
        "SpecTooLarge",
        f"the spec is {size // 1024} KiB, more than the operator can record in the pool's annotations "
        f"(256 KiB in all); the largest field is {path} ({largest // 1024} KiB)",
    )


def _leaf_sizes(value: Any, path: str) -> Iterator[tuple[str, int]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaf_sizes(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaf_sizes(item, f"{path}[{index}]")
    else:
        yield path, len(json.dumps(value))
