"""How Prometheus finds and labels the operator, the routers and the engines: one definition, rendered as
Prometheus Operator PodMonitors for the chart and as plain Prometheus scrape configs for tests and for people
without the Prometheus Operator.

Engines are relabelled with `pool` and `role` from their pod labels, so vLLM's own metrics (which only carry
model_name and engine) can be told apart per pool and phase. Routers get `pool` only: their own metrics carry
a `role` label (the engine role a request or error concerns), which a `role` target label would rename to
exported_role. Every target also gets `namespace`, `pod`, `container`, `endpoint` and `job`, as the Prometheus
Operator adds them (so a router's `pod` label, naming an engine pod, is kept as `exported_pod`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from inferencepool.api import labels

PORT: Final = "http"
OPERATOR_PORT: Final = "metrics"
PATH: Final = "/metrics"


def pod_label_meta(label: str) -> str:
    """Kubernetes service discovery's meta label for a pod label (every invalid character becomes `_`)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def pod_label_present_meta(label: str) -> str:
    return "__meta_kubernetes_pod_labelpresent_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


@dataclass(frozen=True)
class Relabel:
    """One relabelling: copy `source` (a meta label) into `target`."""

    source: str
    target: str

    def podmonitor(self) -> dict[str, Any]:
        return {"sourceLabels": [self.source], "targetLabel": self.target, "action": "replace"}

    def prometheus(self) -> dict[str, Any]:
        return {"source_labels": [self.source], "target_label": self.target, "action": "replace"}


@dataclass(frozen=True)
class PodTarget:
    """Pods of one kind, selected by labels, scraped on a named container port."""

    name: str
    match_labels: tuple[tuple[str, str], ...]
    match_in: tuple[tuple[str, tuple[str, ...]], ...]
    port: str
    relabelings: tuple[Relabel, ...]
    # The operator's metrics carry the pool's namespace and name as labels: those must win over the target's
    # own `namespace` (the operator's), which would otherwise rename them to exported_namespace.
    honor_labels: bool = False

    def selector(self) -> dict[str, Any]:
        selector: dict[str, Any] = {"matchLabels": dict(self.match_labels)}
        if self.match_in:
            selector["matchExpressions"] = [
                {"key": key, "operator": "In", "values": list(values)} for key, values in self.match_in
            ]
        return selector

    def endpoint(self, interval: str) -> dict[str, Any]:
        endpoint: dict[str, Any] = {"port": self.port, "path": PATH, "interval": interval}
        if self.honor_labels:
            endpoint["honorLabels"] = True
        if self.relabelings:
            endpoint["relabelings"] = [relabel.podmonitor() for relabel in self.relabelings]
        return endpoint


POOL_RELABEL: Final = Relabel(pod_label_meta(labels.LABEL_POOL), "pool")
ROLE_RELABEL: Final = Relabel(pod_label_meta(labels.LABEL_ROLE), "role")

ENGINES: Final = PodTarget(
    name="engines",
    match_labels=((labels.LABEL_NAME, labels.APP_NAME), (labels.LABEL_MANAGED_BY, labels.MANAGED_BY)),
    match_in=((labels.LABEL_ROLE, labels.ENGINE_ROLES),),
    port=PORT,
    relabelings=(POOL_RELABEL, ROLE_RELABEL),
)
ROUTERS: Final = PodTarget(
    name="routers",
    match_labels=(
        (labels.LABEL_NAME, labels.APP_NAME),
        (labels.LABEL_MANAGED_BY, labels.MANAGED_BY),
        (labels.LABEL_ROLE, "router"),
    ),
    match_in=(),
    port=PORT,
    relabelings=(POOL_RELABEL,),
)
# The operator's own pod: its selector is the chart's (release-specific), so only port and relabelings here.
OPERATOR: Final = PodTarget(
    name="operator",
    match_labels=((labels.LABEL_NAME, labels.APP_NAME), (labels.LABEL_COMPONENT, "operator")),
    match_in=(),
    port=OPERATOR_PORT,
    relabelings=(),
    honor_labels=True,
)
POOL_TARGETS: Final = (ENGINES, ROUTERS)


def standard_relabelings(job: str, port: str) -> list[dict[str, Any]]:
    """The target labels the Prometheus Operator adds to every PodMonitor target."""
    return [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": job},
        {"target_label": "endpoint", "replacement": port},
    ]


def selector_relabelings(target: PodTarget) -> list[dict[str, Any]]:
    """Keep only the pods and ports the PodMonitor selects (service discovery returns every pod)."""
    keep = [
        {
            "action": "keep",
            "source_labels": [pod_label_meta(key), pod_label_present_meta(key)],
            "regex": f"({re.escape(value)});true",
        }
        for key, value in target.match_labels
    ]
    keep += [
        {
            "action": "keep",
            "source_labels": [pod_label_meta(key), pod_label_present_meta(key)],
            "regex": "(" + "|".join(re.escape(v) for v in values) + ");true",
        }
        for key, values in target.match_in
    ]
    keep.append(
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": target.port,
        }
    )
    keep.append(
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}
    )
    return keep


def scrape_config(
    target: PodTarget,
    job: str,
    interval: str,
    *,
    kubernetes_sd: dict[str, Any] | None = None,
    file_sd: str | None = None,
    static_targets: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Prometheus scrape config equivalent to the PodMonitor: Kubernetes service discovery, or a file of
    every pod with the meta labels Kubernetes discovery gives (`pod_targets`; Debian's Prometheus is built
    without Kubernetes discovery), both with the selector rules; or static targets carrying those labels."""
    relabel: list[dict[str, Any]] = []
    config: dict[str, Any] = {
        "job_name": job,
        "scrape_interval": interval,
        "metrics_path": PATH,
        "honor_labels": target.honor_labels,
    }
    if kubernetes_sd is not None:
        config["kubernetes_sd_configs"] = [{"role": "pod", **kubernetes_sd}]
        relabel += selector_relabelings(target)
    if file_sd is not None:
        config["file_sd_configs"] = [{"files": [file_sd], "refresh_interval": "2s"}]
        relabel += selector_relabelings(target)
    if static_targets is not None:
        config["static_configs"] = static_targets
    relabel += standard_relabelings(job, target.port)
    relabel += [r.prometheus() for r in target.relabelings]
    config["relabel_configs"] = relabel
    return config


def pod_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Target groups for Prometheus' file discovery, one per container port of every pod with an IP, labelled
    as Kubernetes service discovery (role pod) labels them."""
    groups = []
    for pod in pods:
        meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status") or {}
        ip = status.get("podIP")
        if not ip:
            continue
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        common = {
            "__meta_kubernetes_namespace": meta.get("namespace", ""),
            "__meta_kubernetes_pod_name": meta.get("name", ""),
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_ready": "true" if ready else "false",
        }
        for key, value in (meta.get("labels") or {}).items():
            common[pod_label_meta(key)] = value
            common[pod_label_present_meta(key)] = "true"
        for container in spec.get("containers", []):
            for port in container.get("ports", []):
                labels_ = {
                    **common,
                    "__meta_kubernetes_pod_container_name": container.get("name", ""),
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                }
                groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": labels_})
    return groups
