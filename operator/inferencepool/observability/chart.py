"""The chart's monitoring files and deploy/monitoring/, rendered from this package (`python -m
inferencepool.observability --write`); tests fail when the committed copies drift from what this renders.

Chart templates are Helm templates: Prometheus' own `{{ ... }}` in alert texts is escaped for Helm, and alert
thresholds become `.Values.monitoring.alerts.*`, so `helm template` with default values gives exactly
`alerts.rule_groups(Thresholds())`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import yaml

from inferencepool.observability import alerts, dashboard, scrape

CHART_DIR: Final = Path("charts") / "inferencepool-operator"
DASHBOARD_FILE: Final = "files/grafana/inferencepool.json"
GENERATED: Final = (
    "{{- /* Generated from operator/inferencepool/observability by `make observability`. Do not edit: change "
    "the package and regenerate (a test fails on drift). */ -}}\n"
)
GENERATED_YAML: Final = (
    "# Generated from operator/inferencepool/observability by `make observability`. Do not edit: change the\n"
    "# package and regenerate (a test fails on drift).\n"
)
MONITORING_ON: Final = ".Values.monitoring.enabled"
LABELS: Final = """  labels:
    {{- include "inferencepool-operator.labels" . | nindent 4 }}
    {{- with .Values.monitoring.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}"""


class _Dumper(yaml.SafeDumper):
    pass


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def to_yaml(data: Any, indent: int = 0) -> str:
    # No folding of long lines: a fold inside a template action would put a line break into it.
    text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1_000_000, default_flow_style=False)
    pad = " " * indent
    return "".join(pad + line if line.strip() else line for line in text.splitlines(keepends=True))


def helm_escape(text: str) -> str:
    """Prometheus' own templates (`{{ $labels.pool }}`) as Helm raw strings, printed as they are."""
    escaped = re.sub(r"\{\{.*?\}\}", lambda m: "{{`" + m.group() + "`}}", text)
    if "`}}`" in escaped or escaped.count("{{`") != text.count("{{"):
        raise ValueError("unbalanced or nested templates in alert texts")
    return escaped


def prometheus_rule_template() -> str:
    markers = {name: f"@@{name}@@" for name in alerts.threshold_names()}
    spec = helm_escape(to_yaml(alerts.rule_groups(markers), indent=2))
    for name, marker in markers.items():
        spec = spec.replace(marker, f"{{{{ .Values.monitoring.alerts.{alerts.camel(name)} }}}}")
    return (
        GENERATED
        + f"{{{{- if and {MONITORING_ON} .Values.monitoring.alerts.enabled }}}}\n"
        + "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n"
        + '  name: {{ include "inferencepool-operator.fullname" . }}\n'
        + "  namespace: {{ .Release.Namespace }}\n"
        + LABELS
        + "\nspec:\n"
        + spec
        + "{{- end }}\n"
    )


def _pod_monitor(target: scrape.PodTarget, namespaces: str, selector: str) -> str:
    endpoint = target.endpoint("@@interval@@")
    endpoints = to_yaml([endpoint], indent=4).replace("@@interval@@", "{{ .Values.monitoring.interval }}")
    return (
        "---\napiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata:\n"
        + f'  name: {{{{ include "inferencepool-operator.fullname" . }}}}-{target.name}\n'
        + "  namespace: {{ .Release.Namespace }}\n"
        + LABELS
        + "\nspec:\n  namespaceSelector:\n"
        + namespaces
        + "  selector:\n"
        + selector
        + "  podMetricsEndpoints:\n"
        + endpoints
    )


POOL_NAMESPACES: Final = """    {{- if .Values.monitoring.namespaces }}
    matchNames:
      {{- toYaml .Values.monitoring.namespaces | nindent 6 }}
    {{- else }}
    any: true
    {{- end }}
"""
OPERATOR_NAMESPACE: Final = "    matchNames: [{{ .Release.Namespace | quote }}]\n"
OPERATOR_SELECTOR: Final = """    matchLabels:
      {{- include "inferencepool-operator.selectorLabels" . | nindent 6 }}
"""


def pod_monitors_template() -> str:
    pools = "".join(
        _pod_monitor(target, POOL_NAMESPACES, to_yaml(target.selector(), indent=4))
        for target in scrape.POOL_TARGETS
    )
    operator = _pod_monitor(scrape.OPERATOR, OPERATOR_NAMESPACE, OPERATOR_SELECTOR)
    return (
        GENERATED
        + f"{{{{- if and {MONITORING_ON} .Values.monitoring.podMonitors.enabled }}}}\n"
        + pools
        + operator
        + "{{- end }}\n"
    )


def dashboard_template() -> str:
    return (
        GENERATED
        + f"{{{{- if and {MONITORING_ON} .Values.monitoring.dashboard.enabled }}}}\n"
        + "apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
        + '  name: {{ include "inferencepool-operator.fullname" . }}-dashboard\n'
        + "  namespace: {{ .Values.monitoring.dashboard.namespace | default .Release.Namespace }}\n"
        + """  labels:
    {{- include "inferencepool-operator.labels" . | nindent 4 }}
    {{- with .Values.monitoring.dashboard.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.monitoring.dashboard.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
data:
"""
        + f"  inferencepool.json: |-\n    {{{{- .Files.Get {DASHBOARD_FILE!r} | nindent 4 }}}}\n".replace(
            "'", '"'
        )
        + "{{- end }}\n"
    )


def scrape_configs_file() -> str:
    """Plain Prometheus scrape configs (Kubernetes service discovery), for Prometheus without the Operator."""
    jobs = [
        scrape.scrape_config(target, f"inferencepool-{target.name}", "15s", kubernetes_sd={})
        for target in scrape.POOL_TARGETS
    ]
    return (
        GENERATED_YAML
        + "# Add these to scrape_configs in prometheus.yml; Prometheus needs RBAC to list and watch pods.\n"
        + to_yaml({"scrape_configs": jobs})
    )


def rules_file() -> str:
    return GENERATED_YAML + to_yaml(alerts.rule_groups(alerts.Thresholds()))


def rendered() -> dict[Path, str]:
    """Every generated file, by its path from the repository root."""
    return {
        CHART_DIR / DASHBOARD_FILE: dashboard.dashboard_json(),
        CHART_DIR / "templates" / "monitoring-dashboard.yaml": dashboard_template(),
        CHART_DIR / "templates" / "monitoring-podmonitors.yaml": pod_monitors_template(),
        CHART_DIR / "templates" / "monitoring-prometheusrule.yaml": prometheus_rule_template(),
        Path("deploy") / "monitoring" / "prometheus-rules.yaml": rules_file(),
        Path("deploy") / "monitoring" / "scrape-configs.yaml": scrape_configs_file(),
    }


def write(root: Path) -> list[Path]:
    written = []
    for path, text in rendered().items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(target)
    return written
