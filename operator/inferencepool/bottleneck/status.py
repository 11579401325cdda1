"""The diagnosis as the operator writes it into the pool's status (pure): `status.bottleneck` and a
`Bottleneck` condition, so `kubectl get pdpool -o wide` shows the limiting phase (printer column
`.status.bottleneck.phase`) and `kubectl describe` the evidence and the first advice."""

from __future__ import annotations

from typing import Any, Final

from inferencepool.api.v1alpha1 import CONDITION_BOTTLENECK, ConditionStatus
from inferencepool.bottleneck.core import Advice, Diagnosis

__all__ = ["CONDITION_BOTTLENECK", "MAX_ADVICE", "bottleneck_condition", "bottleneck_status"]

MAX_ADVICE: Final = 3  # status stays small; the command prints everything
UNKNOWN: Final = "Unknown"  # the phase while the window holds too little traffic to judge
# Advice the what-if confirms or withdraws (core.with_what_if). The operator never runs the replay (it costs
# CPU seconds a round), so status says where to check it.
REPLAYED: Final = ("Threshold", "Colocate", "Disaggregate")
UNREPLAYED: Final = " (not replayed: `inferencepool diagnose` checks it in the simulator)"


def bottleneck_status(diagnosis: Diagnosis, window_seconds: float | None = None) -> dict[str, Any]:
    """`status.bottleneck` (camelCase, as the API server stores it)."""
    document: dict[str, Any] = {
        "phase": diagnosis.verdict if diagnosis.enough_data else UNKNOWN,
        "reason": diagnosis.reason,
        "summary": diagnosis.summary,
        "advice": [_text(advice) for advice in diagnosis.advice[:MAX_ADVICE]],
    }
    if diagnosis.recommended_threshold is not None:
        document["recommendedThresholdTokens"] = diagnosis.recommended_threshold
    if window_seconds is not None:
        document["windowSeconds"] = round(window_seconds)
    return document


def _text(advice: Advice) -> str:
    return advice.text + UNREPLAYED if advice.kind in REPLAYED else advice.text


def bottleneck_condition(diagnosis: Diagnosis) -> tuple[str, ConditionStatus, str, str]:
    """(type, status, reason, message): True while a phase limits the pool, False within targets, Unknown
    when the window held too little traffic to judge."""
    status: ConditionStatus = "True" if diagnosis.verdict != "None" else "False"
    if not diagnosis.enough_data:
        status = "Unknown"
    first = _text(diagnosis.advice[0]) if diagnosis.advice else ""
    message = diagnosis.summary if status != "True" or not first else f"{diagnosis.summary}; {first}"
    return CONDITION_BOTTLENECK, status, diagnosis.reason, message
