"""The bottleneck diagnosis on the real control plane: fake engine pods (run by the pod runner) behind the
pool's router, under two scripted workloads. Long prompts at a high rate make the operator write
status.bottleneck.phase Prefill and `inferencepool diagnose` say so; short prompts with long outputs make
both say Decode. The operator diagnoses the pages its autoscaler already reads; the command scrapes its
own."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tests.cluster.kube_helpers import (
    ROOT,
    example,
    get_pool,
    kubectl_ok,
)
from tests.support.cluster import eventually

from inferencepool.api import labels
from inferencepool.api.pods import http_url, is_ready
from inferencepool.controller.context import OperatorContext
from inferencepool.kube import Kube
from inferencepool.perf.profiles import get_profile
from inferencepool.perf.timing import ideal_prefill_time

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster


POOL = "diagnosed"
MODEL = "llama-8b"
THRESHOLD = 1024
LONG_PROMPT_TOKENS = 3000
LONG_PROMPT = "word " * LONG_PROMPT_TOKENS  # through the prefill pool
# Under the time one long prompt takes to prefill on an idle engine (0.4 s on the cpu-demo profile), so the
# router never sends a long prompt to the decode pod because the prefill pool is busy (its bypass wants the
# decode route to meet the target): those would make the decode pod prefill long prompts, and the diagnosis
# say Interference or Prefill by how fast this machine runs the engines today. A slower machine only makes
# the prefill longer, never the target easier.
TTFT_TARGET_MILLISECONDS = 300
# A verdict needs 20 requests in its window (bottleneck.core.MIN_REQUESTS): 40 s hold them even where this
# machine prefills one long prompt a second (2.5 a second at the profile's own speed).
WINDOW_SECONDS = 40


def pool_document(namespace: str) -> dict[str, Any]:
    """demo-cpu.yaml on the small CPU demo device, one engine per role, read every 2 s over 20 s."""
    document = example("demo-cpu.yaml")
    document["metadata"] = {"name": POOL, "namespace": namespace}
    spec = document["spec"]
    spec["engine"]["extraEnv"] = [{"name": "FAKE_ENGINE_PROFILE", "value": "cpu-demo"}]
    targets = {
        "prefill": {"ttftMilliseconds": TTFT_TARGET_MILLISECONDS, "percentile": 90},
        "decode": {"itlMilliseconds": 30},
    }
    for role, target in targets.items():
        spec[role]["replicas"] = 1
        spec[role]["autoscaling"] = {
            "minReplicas": 1,
            "maxReplicas": 1,  # the autoscaler reads, but the pool stays as it is
            "target": {"percentile": 90, **target},
            "windowSeconds": WINDOW_SECONDS,
            "intervalSeconds": 2,
        }
    spec["router"]["prefillThresholdTokens"] = THRESHOLD
    return document


def test_a_long_prompt_alone_misses_the_ttft_target_on_the_demo_profile() -> None:
    """The premise of the verdicts below (see TTFT_TARGET_MILLISECONDS)."""
    prefill_seconds = ideal_prefill_time(get_profile("cpu-demo"), LONG_PROMPT_TOKENS)
    assert prefill_seconds > 1.2 * TTFT_TARGET_MILLISECONDS / 1000, prefill_seconds


def router_url(kube: Kube, namespace: str) -> str | None:
    selector = f"{labels.LABEL_POOL}={POOL},{labels.LABEL_ROLE}=router"
    urls = [
        u for pod in kube.list("v1", "Pod", namespace, selector) if is_ready(pod) and (u := http_url(pod))
    ]
    return urls[0] if urls else None


def stream(url: str, prompt: str, max_tokens: int) -> None:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True})
    request = urllib.request.Request(
        url + "/v1/completions", body.encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


@contextmanager
def clients(count: int, request: Callable[[int], None]) -> Iterator[None]:
    """`count` closed-loop clients, each sending its next request when the last one is answered."""
    stop = threading.Event()

    def loop(index: int) -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):  # the router counts it as it went; the loop goes on
                request(index)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(130)


def engines_ready(kube: Kube, namespace: str) -> bool:
    display = ((get_pool(kube, namespace, POOL) or {}).get("status") or {}).get("display") or {}
    return display.get("prefill") == "1/1" and display.get("decode") == "1/1"


def phase(kube: Kube, namespace: str) -> dict[str, Any]:
    pool = get_pool(kube, namespace, POOL) or {}
    return dict((pool.get("status") or {}).get("bottleneck") or {})


def diagnose(cluster: TestCluster, namespace: str) -> str:
    """`inferencepool diagnose POOL -n NS` over one window of the running workload (no what-if: verdicts
    only)."""
    command = [sys.executable, "-m", "inferencepool", "diagnose", POOL, "-n", namespace]
    command += ["--kubeconfig", str(cluster.kubeconfig), "--seconds", str(WINDOW_SECONDS)]
    command += ["--sample-seconds", "2"]
    result = subprocess.run(
        [*command, "--no-what-if"], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_long_prompts_and_long_outputs_get_opposite_verdicts_in_status_and_diagnose(
    cluster: TestCluster, operator: OperatorContext, admin_kube: Kube, namespace: str
) -> None:
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(pool_document(namespace)))
    url = eventually(lambda: router_url(admin_kube, namespace), 120, "a ready router pod")
    eventually(lambda: engines_ready(admin_kube, namespace), 120, "a ready prefill and decode pod")

    # Long prompts at a high rate: 8 clients keep the one prefill engine's queue full (TTFT ~3 s). Each
    # prompt its own, so no prefix cache makes prefill cheap.
    numbers = itertools.count()
    with clients(8, lambda _: stream(url, f"request {next(numbers)} {LONG_PROMPT}", 4)):
        prefill = eventually(
            lambda: (found := phase(admin_kube, namespace)).get("phase") == "Prefill" and found,
            2 * WINDOW_SECONDS + 60,
            "status.bottleneck.phase Prefill",
        )
        prefill_report = diagnose(cluster, namespace)
    assert prefill["reason"] == "PrefillBound" and prefill["advice"], prefill
    assert prefill_report.startswith(f"pool {namespace}/{POOL}: bottleneck Prefill"), prefill_report
    wide = kubectl_ok(cluster, "get", "pdpool", POOL, "-n", namespace, "-o", "wide")
    assert wide.splitlines()[0].split()[-2:] == ["BOTTLENECK", "AGE"], wide
    assert wide.splitlines()[1].split()[-2] == "Prefill", wide

    # Short prompts with long outputs: 48 streams straight to the one decode engine (ITL ~45 ms).
    with clients(48, lambda i: stream(url, "say hi", 120)):
        decode = eventually(
            lambda: (found := phase(admin_kube, namespace)).get("phase") == "Decode" and found,
            2 * WINDOW_SECONDS + 60,
            "status.bottleneck.phase Decode",
        )
        decode_report = diagnose(cluster, namespace)
    assert decode["reason"] == "DecodeBound", decode
    assert decode_report.startswith(f"pool {namespace}/{POOL}: bottleneck Decode"), decode_report
    pool = get_pool(admin_kube, namespace, POOL) or {}
    conditions = {c["type"]: c for c in pool["status"]["conditions"]}
    bottleneck = conditions["Bottleneck"]
    assert (bottleneck["status"], bottleneck["reason"]) == ("True", "DecodeBound"), bottleneck
    assert bottleneck["message"].startswith("first token fast, streaming slow"), bottleneck
