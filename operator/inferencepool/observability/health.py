"""GitOps health of an InferencePool: the Argo CD health check (Lua, a file next to this module)."""

from __future__ import annotations

from importlib.resources import files
from typing import Final

ARGOCD_HEALTH_KEY: Final = "resource.customizations.health.serving.inferencepool.dev_InferencePool"


def argocd_health_lua() -> str:
    return files("inferencepool.observability").joinpath("argocd_health.lua").read_text()
