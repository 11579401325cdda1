"""Every kubectl command the project prints or documents names our resource so that it cannot be confused with
the Gateway API Inference Extension's InferencePool (inference.networking.k8s.io): with both CRDs installed,
`kubectl get inferencepools` resolves by discovery order, while `pdpool` and
`inferencepools.serving.inferencepool.dev` are ours alone (checked on a live API server by
tests/cluster/test_beside_gateway_inference_extension.py)."""

from __future__ import annotations

import re
from pathlib import Path

from inferencepool.api import labels

ROOT = Path(__file__).resolve().parents[2]
VERBS = r"(?:get|describe|explain|edit|patch|delete|wait|label|annotate|apply|scale)"
# `kubectl VERB [flags] inferencepool(s)` in text, and ("VERB", "inferencepool(s)") in code
SHELL = re.compile(
    rf"kubectl(?:\s+-\S+(?:\s+[^\s-]\S*)?)*\s+{VERBS}\s+(?:-\S+\s+)*inferencepools?(?=[\s/\"'`,]|$)"
)
CODE = re.compile(rf"[\"']{VERBS}[\"'],\s*[\"']inferencepools?[\"']")


def documents() -> list[Path]:
    found = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("charts/**/NOTES.txt")]
    found += [*ROOT.glob("operator/**/*.py"), *ROOT.glob("e2e/**/*.py"), *ROOT.glob("examples/**/*.yaml")]
    return [path for path in found if path.is_file()]


def test_no_command_names_the_ambiguous_plural() -> None:
    offending = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in documents()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SHELL.search(line) or CODE.search(line)
    ]
    assert not offending, "use pdpool or inferencepools.serving.inferencepool.dev:\n" + "\n".join(offending)


def test_the_check_catches_the_ambiguous_forms() -> None:
    for line in (
        "kubectl get inferencepools -A",
        "    $ kubectl -n prod describe inferencepool llama",
        'run(["kubectl", "get", "inferencepool", name])',
        "kubectl get inferencepool/llama -o yaml",
    ):
        assert SHELL.search(line) or CODE.search(line), line
    for line in (
        f"kubectl get {labels.SHORT_NAME} -w",
        f"kubectl get {labels.RESOURCE} -A",
        "kubectl apply -f deploy/operator/",
        "image: inferencepool/router:0.1.0",
    ):
        assert not (SHELL.search(line) or CODE.search(line)), line
