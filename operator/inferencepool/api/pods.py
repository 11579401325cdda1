"""Reading Pod objects as the API server serializes them (camelCase dicts): readiness and the URL of a named
container port (pure). Used wherever a component talks to pods directly: the router's discovery, the
autoscaler's scrapes, the demo."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def is_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True."""
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in (pod.get("status") or {}).get("conditions") or []
    )


def http_url(pod: Mapping[str, Any], port_name: str = "http", default_port: int | None = None) -> str | None:
    """`http://<pod IP>:<container port named port_name>`; None without an IP, or without such a port and no
    default."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    named = (
        int(port["containerPort"])
        for container in (pod.get("spec") or {}).get("containers") or []
        for port in container.get("ports") or []
        if port.get("name") == port_name and port.get("containerPort")
    )
    port = next(named, default_port)
    if port is None:
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"
