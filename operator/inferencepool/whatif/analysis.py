"""Snapshots in, diagnosis and what-if out: the path `inferencepool diagnose` and its tests take (the operator
runs the diagnosis alone, never the replay)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.bottleneck.core import Diagnosis, WhatIfRow, diagnose, with_what_if
from inferencepool.bottleneck.settings import PoolSettings
from inferencepool.bottleneck.sizing import size
from inferencepool.bottleneck.window import PoolWindow, Snapshot, window
from inferencepool.perf.profiles import EngineProfile
from inferencepool.whatif.replay import (
    DEFAULT_MAX_REQUESTS,
    DEFAULT_SECONDS,
    what_if,
)


@dataclass(frozen=True)
class Analysis:
    window: PoolWindow
    diagnosis: Diagnosis
    what_if: list[WhatIfRow] | None  # None when not asked for


def analyse(
    earlier: Snapshot,
    later: Snapshot,
    settings: PoolSettings,
    profile: EngineProfile | None = None,
    *,
    what_if_seconds: float = DEFAULT_SECONDS,
    what_if_max_requests: int = DEFAULT_MAX_REQUESTS,
    during: Sequence[Snapshot] = (),
    pool: InferencePool | None = None,
) -> Analysis:
    """Diagnose the window between two snapshots (gauges from those `during` it); with a profile, replay
    its traffic in the simulator and withdraw advice the replay contradicts (as deployed: the `pool`'s spec
    when given)."""
    measured = window(earlier, later, during)
    diagnosis = diagnose(measured, settings, size(earlier, later, settings))
    if profile is None or not diagnosis.enough_data:
        return Analysis(measured, diagnosis, None)
    table = what_if(
        diagnosis, settings, profile, seconds=what_if_seconds, max_requests=what_if_max_requests, pool=pool
    )
    return Analysis(measured, with_what_if(diagnosis, table, settings), table)
