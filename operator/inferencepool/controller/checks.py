"""What the API server accepts in a pool but cannot accept in its children, found before anything is applied
(pure). Admission refuses most of it (CEL on the name and extraEnv, bounds on sizes), but a CRD installed
before those rules, or a pass-through field, can still let it in; then the pool is Degraded with the field
named, instead of failing on every retry.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import Manifest, pool_children
from inferencepool.controller.status import SpecProblem

DNS_LABEL_MAX = 63
# A StatefulSet labels its pods `controller-revision-hash: <name>-<hash of up to 10 characters>`, a label
# value of at most 63 characters.
STATEFULSET_NAME_MAX = DNS_LABEL_MAX - 11
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# kopf records the last handled spec in an annotation; the API server allows 256 KiB of annotations.
ANNOTATIONS_MAX_BYTES = 256 * 1024
ANNOTATIONS_MARGIN_BYTES = 16 * 1024  # kopf's own progress records, labels, annotations already there


def rendered_children(pool: InferencePool) -> list[Manifest] | SpecProblem:
    """Every child, or the builders' objection naming the field (e.g. an extraEnv entry without a name)."""
    try:
        return pool_children(pool)
    except ValueError as error:
        return SpecProblem("InvalidSpec", str(error))


def name_problem(pool: InferencePool, children: list[Manifest]) -> SpecProblem | None:
    """A pool name that makes a child's name one Kubernetes refuses (Services are DNS-1035 labels)."""
    name = pool.name()
    limits = {"Service": DNS_LABEL_MAX, "StatefulSet": STATEFULSET_NAME_MAX}
    fits = min(
        limit - (len(c["metadata"]["name"]) - len(name))
        for c in children
        if (limit := limits.get(c["kind"])) is not None
    )
    for child in children:
        child_name, limit = child["metadata"]["name"], limits.get(child["kind"])
        if limit is not None and len(child_name) > limit:
            return SpecProblem(
                "NameTooLong",
                f"metadata.name {name!r} is too long for its children: {child['kind']} {child_name!r} would "
                f"have {len(child_name)} characters (at most {limit}); a pool name of at most {fits} "
                "characters fits",
            )
        if child["kind"] == "Service" and not DNS_1035_LABEL.match(child_name):
            return SpecProblem(
                "InvalidName",
                f"metadata.name {name!r} cannot name a Service ({child_name!r}): it must start with a "
                "lowercase letter and hold only lowercase letters, digits and '-'",
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
