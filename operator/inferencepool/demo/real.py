"""The demo on real engines (`inferencepool demo --engine vllm`): what differs from the fake-engine demo.

The pool (examples/demo-vllm-cpu.yaml) uses the operator's own vLLM image; the local pod runner's engine mode
runs each engine pod as a real `vllm serve` on this CPU (cluster/vllm_cpu.py) with the tiny test model. The
demo shows the decode engine's own evidence of the P/D hand-off: its NIXL counters and the prompt tokens it
took from an external KV transfer, read from its /metrics before and after the long prompt.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferencepool.cluster.cli import engine_mode
from inferencepool.cluster.vllm_cpu import CpuEngine

POOL_FILE = Path("examples/demo-vllm-cpu.yaml")
VENV = Path(".venv-vllm")
MODEL_DIR = Path("out/tiny-model")
# Engines start in 3-5 minutes each on a loaded 2-core machine, several at once.
READY_TIMEOUT_SECONDS = 1200.0
# Sized for the tiny model (4096 positions): ~760 tokens, over the pool's 256-token prefill threshold.
LONG_PROMPT = " ".join(f"Paragraph {i} of a long design document." for i in range(60))

# (what it says, metric family, sample name, labels the sample must have)
EVIDENCE: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("NIXL reads", "vllm:nixl_xfer_time_seconds_count", {}),
    ("NIXL bytes", "vllm:nixl_bytes_transferred_sum", {}),
    (
        "prompt tokens from an external KV transfer",
        "vllm:prompt_tokens_by_source_total",
        {"source": "external_kv_transfer"},
    ),
    ("prompt tokens computed locally", "vllm:prompt_tokens_by_source_total", {"source": "local_compute"}),
)


def prepare(
    namespace: str, venv: Path = VENV, model: Path = MODEL_DIR, say: Callable[[str], None] = print
) -> CpuEngine:
    """The engine mode for the demo's namespace: the real engine's venv must exist; the tiny model is made
    if missing."""
    if not (model / "config.json").is_file():
        say(f"making the tiny test model in {model} (inferencepool model tiny; seeded, no download)")
        command = [sys.executable, "-m", "inferencepool", "model", "tiny", "--out", str(model)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"inferencepool model tiny failed: {(result.stderr or result.stdout).strip()}")
    return dataclasses.replace(engine_mode(venv, model), namespaces=(namespace,))


def sample_values(text: str) -> dict[str, float]:
    """The EVIDENCE samples in one /metrics page, keyed by what they say (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {label: 0.0 for label, _, _ in EVIDENCE}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for label, name, wanted in EVIDENCE:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items()):
                    values[label] += sample.value
    return values


def read_evidence(urls: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Each engine pod's EVIDENCE samples, by pod name (`urls`: pod name -> http://ip:port)."""
    evidence = {}
    for pod, url in urls.items():
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
            evidence[pod] = sample_values(response.read().decode())
    return evidence


@dataclass(frozen=True)
class Handoff:
    pod: str
    role: str
    deltas: dict[str, float]
    after: dict[str, float]


def handoffs(
    before: Mapping[str, Mapping[str, float]],
    after: Mapping[str, Mapping[str, float]],
    roles: Mapping[str, str],
) -> list[Handoff]:
    return [
        Handoff(
            pod,
            roles.get(pod, "?"),
            {label: after[pod][label] - before.get(pod, {}).get(label, 0.0) for label in after[pod]},
            dict(after[pod]),
        )
        for pod in sorted(after)
    ]


def describe(handoff: Handoff) -> str:
    parts = [
        f"{label} +{delta:g} (now {handoff.after[label]:g})"
        for label, delta in handoff.deltas.items()
        if delta
    ]
    return f"{handoff.role} {handoff.pod}: " + ("; ".join(parts) if parts else "no change")


def decode_pulled_kv(found: list[Handoff]) -> bool:
    """Whether a decode engine read KV over NIXL and took prompt tokens from it (its own counters)."""
    return any(
        h.role == "decode"
        and h.deltas["NIXL reads"] > 0
        and h.deltas["prompt tokens from an external KV transfer"] > 0
        for h in found
    )


def engine_urls(pods: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, str]]:
    """(pod name -> URL, pod name -> role) of the Ready engine pods."""
    from inferencepool.api import labels
    from inferencepool.api.pods import http_url, is_ready

    urls, roles = {}, {}
    for pod in pods:
        role = (pod["metadata"].get("labels") or {}).get(labels.LABEL_ROLE)
        url = http_url(pod)
        if role in ("prefill", "decode") and is_ready(pod) and url is not None:
            urls[pod["metadata"]["name"]] = url
            roles[pod["metadata"]["name"]] = role
    return urls, roles
