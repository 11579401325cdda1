"""Prometheus histograms built from values, for tests of what reads them (the bottleneck diagnosis, the
what-if)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

from inferencepool.autoscaler.histogram import Histogram


def histogram(values: Sequence[float], bounds: Sequence[float]) -> Histogram:
    """A cumulative histogram of `values` in Prometheus' buckets (`le` bounds, +Inf last)."""
    edges = (*bounds, math.inf)
    counts = [0] * len(edges)
    for value in values:
        counts[bisect.bisect_left(edges, value)] += 1
    return Histogram(tuple(edges), tuple(float(c) for c in itertools.accumulate(counts)), float(sum(values)))
