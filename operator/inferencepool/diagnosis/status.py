"""The diagnosis as the operator would write it into the pool's status (pure): `status.bottleneck` and a
`Bottleneck` condition, so `kubectl get pdpool -o wide` can show the limiting phase (printer column
`.status.bottleneck.phase`) and `kubectl describe` the evidence and the first advice."""

from __future__ import annotations

from typing import Any, Final

from inferencepool.diagnosis.core import Diagnosis

CONDITION_BOTTLENECK: Final = "Bottleneck"
MAX_ADVICE: Final = 3  # status stays small; the command prints everything


def bottleneck_status(diagnosis: Diagnosis) -> dict[str, Any]:
    """`status.bottleneck` (camelCase, as the API server stores it)."""
    document: dict[str, Any] = {
        "phase": diagnosis.verdict,
        "reason": diagnosis.reason,
        "summary": diagnosis.summary,
        "advice": [advice.text for advice in diagnosis.advice[:MAX_ADVICE]],
    }
    if diagnosis.recommended_threshold is not None:
        document["recommendedThresholdTokens"] = diagnosis.recommended_threshold
    return document


def bottleneck_condition(diagnosis: Diagnosis) -> tuple[str, str, str, str]:
    """(type, status, reason, message): True while a phase limits the pool, False within targets, Unknown
    when the window held too little traffic to judge."""
    status = "True" if diagnosis.verdict != "None" else "False"
    if not diagnosis.enough_data:
        status = "Unknown"
    first = diagnosis.advice[0].text if diagnosis.advice else ""
    message = diagnosis.summary if status != "True" or not first else f"{diagnosis.summary}; {first}"
    return CONDITION_BOTTLENECK, status, diagnosis.reason, message
