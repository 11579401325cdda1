"""Reading Pod objects: readiness and the URL of a named port."""

from __future__ import annotations

from typing import Any

from inferencepool.api.pods import http_url, is_ready


def pod(
    ip: str | None = "10.0.0.7", ready: str = "True", ports: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "sidecar"}, {"name": "main", "ports": ports or []}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]},
    }


def test_url_of_the_named_port_in_any_container() -> None:
    named = [{"name": "metrics", "containerPort": 9000}, {"name": "http", "containerPort": 8000}]
    assert http_url(pod(ports=named)) == "http://10.0.0.7:8000"
    assert http_url(pod(ip="fd00::7", ports=named)) == "http://[fd00::7]:8000"
    assert http_url(pod(ports=named), "metrics") == "http://10.0.0.7:9000"


def test_no_ip_or_no_such_port_gives_none_unless_a_default_port_is_given() -> None:
    assert http_url(pod(ip=None, ports=[{"name": "http", "containerPort": 8000}])) is None
    assert http_url(pod()) is None
    assert http_url(pod(), default_port=8000) == "http://10.0.0.7:8000"


def test_ready_is_the_ready_condition() -> None:
    assert is_ready(pod())
    assert not is_ready(pod(ready="False"))
    assert not is_ready({"status": {}})
