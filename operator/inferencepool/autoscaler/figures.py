"""What the autoscaler tells the status composer (pure records): per role the latency it observed, the last
scaling it made and what it recommends; the routers' split and live threshold; and whether a role cannot get
the replicas its target needs (the ScalingLimited condition)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inferencepool.api.v1alpha1 import PoolRole, ScalingDecision


@dataclass(frozen=True)
class ScalingLimits:
    """The ScalingLimited condition's value: whether a pool cannot get the replicas its target needs."""

    limited: bool
    reason: str  # PodsUnschedulable, AtMaxReplicas, AtGpuBudget, AtRatioBound (spec.scaling) or WithinLimits
    message: str


@dataclass(frozen=True)
class RoleFigures:
    observed_milliseconds: int | None = None
    last_scaling: ScalingDecision | None = None
    recommended_replicas: int | None = None


@dataclass(frozen=True)
class AutoscalerFigures:
    roles: Mapping[PoolRole, RoleFigures] = field(default_factory=dict)  # the roles that autoscale
    disaggregated_percent: int | None = None  # of the routers' requests over the window (None: none)
    threshold_tokens: int | None = None  # the routers' live threshold, while it adapts
    limits: ScalingLimits | None = None  # None: nothing autoscales
    lent_percent: int | None = None  # of the routers' requests, served whole on prefill pods (role lending)
    peer_prefill_percent: int | None = (
        None  # of the routers' requests, prefilled on a peer decode pod (lending)
    )
