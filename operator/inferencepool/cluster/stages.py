"""kwok Stages for pods: Running at once, Ready only while the pod runner says its process listens.

kwok's stock `pod-ready` stage makes every pod Ready the moment it is scheduled, and when several stages match
a pod kwok picks one at random, so the stock pod stages are replaced by these, whose selectors never overlap:

- pod-start: Pending -> Running with a pod IP, Ready False (reason ProcessNotReady).
- pod-ready-on-signal: Running, annotation process-ready="true", not Ready -> Ready True.
- pod-unready-on-signal: Running, Ready True, annotation not "true" -> Ready False (the process exited).
- pod-delete: deleted and annotation not "true" -> gone. The runner keeps the annotation while the process
  drains after SIGTERM and removes it once the process has exited, so a deleted pod stays Terminating while it
  drains, as it would with a kubelet.
- pod-steady-ready / pod-steady-not-ready: the two remaining Running states, with a patch that changes
  nothing. kwok learns which IPs are taken only when it plays a stage for a pod, so without these a restarted
  kwok would hand the IP of a settled pod to the next new one.
The pod IP comes from kwok's `PodIPsWith`, called only in pod-start: every call hands out a new address.
"""

from __future__ import annotations

from typing import Any

import yaml

from inferencepool.api.labels import ANNOTATION_PROCESS_READY

STAGE_API_VERSION = "kwok.x-k8s.io/v1alpha1"
_NOT_DELETED = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
_READY_STATUS = '.status.conditions.[] | select( .type == "Ready" ) | .status'
_ANNOTATION = f'.metadata.annotations["{ANNOTATION_PROCESS_READY}"]'

_POD_START = """\
{{ $now := Now }}
conditions:
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "False", reason: ProcessNotReady, lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "False", reason: ProcessNotReady, lastTransitionTime: {{ $now | Quote }}}
containerStatuses:
{{ range .spec.containers }}
- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, started: true, restartCount: 0, \
state: {running: {startedAt: {{ $now | Quote }}}}}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, restartCount: 0, \
state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, \
finishedAt: {{ $now | Quote }}}}}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
hostIPs: [{ip: {{ index . 0 | Quote }}}]
{{ end }}
{{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) \
( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ index . 0 | Quote }}
podIPs: [{ip: {{ index . 0 | Quote }}}]
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""


# A patch equal to what the pod already has: kwok skips the API call but still records the pod's IP as taken.
_UNCHANGED = "phase: Running\n"


def _ready_template(ready: bool, reason: str | None = None) -> str:
    flag = "true" if ready else "false"
    status = '"True"' if ready else '"False"'
    # null removes the reason pod-start set: the conditions are merged into the pod's by type.
    reason_part = f", reason: {reason}" if reason else ", reason: null"
    return (
        "{{ $now := Now }}\n"
        "conditions:\n"
        f"- {{type: Ready, status: {status}{reason_part}, lastTransitionTime: {{{{ $now | Quote }}}}}}\n"
        f"- {{type: ContainersReady, status: {status}{reason_part}, "
        "lastTransitionTime: {{ $now | Quote }}}\n"
        "containerStatuses:\n"
        "{{ range .spec.containers }}\n"
        f"- {{name: {{{{ .name | Quote }}}}, image: {{{{ .image | Quote }}}}, ready: {flag}, started: true, "
        "restartCount: 0, state: {running: {startedAt: {{ $now | Quote }}}}}\n"
        "{{ end }}\n"
    )


def _stage(name: str, selector: dict[str, Any], next_: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": STAGE_API_VERSION,
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {"resourceRef": {"apiGroup": "v1", "kind": "Pod"}, "selector": selector, "next": next_},
    }


def pod_stages() -> list[dict[str, Any]]:
    running = {"key": ".status.phase", "operator": "In", "values": ["Running"]}
    return [
        _stage(
            "pod-start",
            {
                "matchExpressions": [
                    _NOT_DELETED,
                    {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                ]
            },
            {"statusTemplate": _POD_START},
        ),
        _stage(
            "pod-ready-on-signal",
            {
                "matchAnnotations": {ANNOTATION_PROCESS_READY: "true"},
                "matchExpressions": [
                    _NOT_DELETED,
                    running,
                    {"key": _READY_STATUS, "operator": "NotIn", "values": ["True"]},
                ],
            },
            {"statusTemplate": _ready_template(True)},
        ),
        _stage(
            "pod-unready-on-signal",
            {
                "matchExpressions": [
                    _NOT_DELETED,
                    running,
                    {"key": _READY_STATUS, "operator": "In", "values": ["True"]},
                    {"key": _ANNOTATION, "operator": "NotIn", "values": ["true"]},
                ]
            },
            {"statusTemplate": _ready_template(False, "ProcessExited")},
        ),
        _stage(
            "pod-steady-ready",
            {
                "matchAnnotations": {ANNOTATION_PROCESS_READY: "true"},
                "matchExpressions": [
                    _NOT_DELETED,
                    running,
                    {"key": _READY_STATUS, "operator": "In", "values": ["True"]},
                ],
            },
            {"statusTemplate": _UNCHANGED},
        ),
        _stage(
            "pod-steady-not-ready",
            {
                "matchExpressions": [
                    _NOT_DELETED,
                    running,
                    {"key": _READY_STATUS, "operator": "NotIn", "values": ["True"]},
                    {"key": _ANNOTATION, "operator": "NotIn", "values": ["true"]},
                ]
            },
            {"statusTemplate": _UNCHANGED},
        ),
        _stage(
            "pod-delete",
            {
                "matchExpressions": [
                    {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                    {"key": _ANNOTATION, "operator": "NotIn", "values": ["true"]},
                ]
            },
            {"delete": True},
        ),
    ]


class _LiteralDumper(yaml.SafeDumper):
    """Writes multi-line strings (the Go templates) as literal blocks, so the file reads like kwok's own."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _represent_str)


def kwok_config_yaml(node_stages_yaml: str) -> str:
    """kwok's --config file: our pod stages after kwok's own node stages (copied at build time)."""
    ours = yaml.dump_all(pod_stages(), Dumper=_LiteralDumper, sort_keys=False, width=1000)
    return node_stages_yaml.rstrip() + "\n---\n" + ours
