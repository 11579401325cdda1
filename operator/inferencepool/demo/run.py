"""`inferencepool demo`: the whole product on this machine, no GPU, no cloud, no Docker.

Starts the local control plane (built from Go modules on first use), installs the CRD, runs the operator,
applies examples/demo-cpu.yaml (fake engines with an H100 timing profile), waits until the pool is Ready, then
sends a short and a long prompt through the pool's router and shows which route each took, its TTFT, and
`kubectl get pdpool`; then a load step (step.py): long prompts from one client, then from eight, and the SLA
planner scaling the prefill pool as it happens (its decision and figures, the new pods Ready, TTFT against the
target), plotted into out/demo/load-step.png; then loads the pool until the operator reports each pool's
latency and the bottleneck, and ends with `inferencepool diagnose` on that traffic (the evidence, and the
simulator's what-if). Everything it started is stopped at the end unless --keep, which also starts a
Prometheus scraping the pool and the operator (prometheus.py) when one is installed.

With --engine vllm (real.py) the engines are real vLLM on this CPU instead: the local pod runner's engine mode
runs the operator's vLLM pods with a tiny model, the long prompt's hand-off shows in the decode engine's own
NIXL counters, and the planner and `inferencepool diagnose` read the real engines' metrics. The H100-profile
load step and the LMCache step need the fake engine's timing model and LMCache, so they are left out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferencepool.api import labels
from inferencepool.api.pods import http_url, is_ready
from inferencepool.demo import real
from inferencepool.demo.p2p import run_p2p_step
from inferencepool.demo.step import run_load_step

DEFAULT_POOL_FILE = Path("examples/demo-cpu.yaml")
DEFAULT_OUT = Path("out/demo")
DEFAULT_TIMEOUT_SECONDS = 300.0
SHORT_PROMPT = "Explain in one sentence why decode is memory-bound."
LONG_PROMPT = " ".join(f"Paragraph {i} of a long design document." for i in range(600))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=("fake", "vllm"),
        default="fake",
        help="fake (default): the fake engine with an H100 timing profile; vllm: real vLLM on this CPU "
        "(needs make real-engine; ~4.2 GiB and minutes per engine, 3 engines at most)",
    )
    parser.add_argument(
        "--pool-file",
        type=Path,
        default=None,
        help=f"InferencePool to apply (default {DEFAULT_POOL_FILE}, or {real.POOL_FILE} with --engine vllm)",
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="cluster state directory")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds to wait for the pool to be Ready (default {DEFAULT_TIMEOUT_SECONDS:g}, "
        f"{real.READY_TIMEOUT_SECONDS:g} with --engine vllm)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the cluster, operator and pool running at the end, with a Prometheus scraping them",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="folder for the load step's plot and samples"
    )


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


@dataclass
class Kubectl:
    binary: str
    kubeconfig: Path

    def __call__(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [self.binary, *args],
            input=input_text,
            capture_output=True,
            text=True,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))


def wait_for(what: str, check: Callable[[], bool], timeout: float, show: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    last_shown = ""
    while time.monotonic() < deadline:
        if check():
            return
        shown = show()
        if shown and shown != last_shown:
            print(f"    {shown}", flush=True)
            last_shown = shown
        time.sleep(2.0)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def pool_ready(pool: dict[str, Any]) -> bool:
    conditions = pool.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def router_address(kubectl: Kubectl, namespace: str, pool_name: str) -> str:
    """The router pod's IP: Services get no endpoints on loopback pod IPs, so go to the pod (see README)."""
    selector = f"{labels.LABEL_POOL}={pool_name},{labels.LABEL_ROLE}=router"
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]
    urls = [url for pod in pods if is_ready(pod) and (url := http_url(pod)) is not None]
    if not urls:
        raise RuntimeError(f"no Ready router pod for pool {pool_name}")
    return urls[0]


@dataclass(frozen=True)
class StreamResult:
    ttft_s: float
    total_s: float
    chunks: int
    text: str


def show_autoscaler(
    kubectl: Kubectl,
    namespace: str,
    pool_name: str,
    base_url: str,
    model: str,
    prompts: list[str],
    timeout: float,
    kubeconfig: Path,
    settle_seconds: float = 0.0,
) -> None:
    """Keep both pools busy until the autoscaler has read each one's latency from the engines' histograms and
    the operator has diagnosed the bottleneck, then run `inferencepool diagnose` on the same traffic. The
    readings count only `settle_seconds` after the load began (the window of earlier traffic to pass)."""
    say("load from 6 clients until the operator reports each pool's latency, routing split and bottleneck")
    stop = threading.Event()
    began = time.monotonic()

    def client(index: int) -> None:
        while not stop.is_set():
            # A distinct first word: the router sends a prompt whose prefix a decode pod holds straight
            # there, so repeating the long prompt would soon route it all direct.
            prompt = f"{uuid.uuid4().hex} {prompts[index % len(prompts)]}"
            with contextlib.suppress(OSError):
                stream_chat(base_url, model, prompt, max_tokens=48)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(6)]
    for thread in threads:
        thread.start()

    def figures() -> dict[str, Any]:
        return dict(kubectl.json("get", "pdpool", pool_name, "-n", namespace).get("status", {}))

    def all_read(status: dict[str, Any]) -> bool:
        pools_read = all("observedMilliseconds" in (status.get(role) or {}) for role in ("prefill", "decode"))
        diagnosed = (status.get("bottleneck") or {}).get("phase", "Unknown") != "Unknown"
        settled = time.monotonic() - began >= settle_seconds
        return settled and pools_read and diagnosed and "disaggregatedPercent" in (status.get("router") or {})

    try:
        wait_for(
            "the autoscaler's first readings, the router's split and the bottleneck",
            lambda: all_read(figures()),
            timeout,
            lambda: kubectl("get", "pdpool", pool_name, "-n", namespace, "--no-headers").strip(),
        )
        status = figures()
        show_readings(status)
        print(kubectl("get", "pdpool", "-n", namespace, "-o", "wide"))
        diagnose(namespace, pool_name, kubeconfig)
    finally:
        stop.set()
        for thread in threads:
            thread.join(130)


DIAGNOSE_SECONDS = 15


def diagnose(namespace: str, pool_name: str, kubeconfig: Path) -> None:
    """`inferencepool diagnose` on the traffic running now: the command a user runs, as they run it."""
    command = ["inferencepool", "diagnose", pool_name, "-n", namespace, "--seconds", str(DIAGNOSE_SECONDS)]
    command += ["--what-if-seconds", "60"]
    say(f"{' '.join(command)}: the evidence, and the what-if on this traffic")
    result = subprocess.run(
        [sys.executable, "-m", *command],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=DIAGNOSE_SECONDS + 120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"inferencepool diagnose failed: {(result.stderr or result.stdout).strip()}")
    print(result.stdout, end="", flush=True)


def show_readings(status: dict[str, Any]) -> None:
    """What the operator wrote: each pool's latency and last scaling, the router's split, the bottleneck."""
    for role, metric in (("prefill", "TTFT"), ("decode", "ITL")):
        pool = status[role]
        last = pool.get("lastScaling")
        decision = (
            f"; last scaling {last['fromReplicas']} -> {last['replicas']} ({last['reason']})" if last else ""
        )
        print(
            f"    autoscaler: {role} p{pool['percentile']} {metric} {pool['observedMilliseconds']} ms "
            f"vs target {pool['targetMilliseconds']} ms, {pool['readyReplicas']}/{pool['desiredReplicas']} "
            f"replicas{decision}"
        )
    share = status["router"]["disaggregatedPercent"]
    print(
        f"    router: {share}% of recent requests went through the prefill pool (the rest straight to decode)"
    )
    bottleneck = status["bottleneck"]
    print(
        f"    operator: bottleneck {bottleneck['phase']} ({bottleneck['reason']}) over the last "
        f"{bottleneck.get('windowSeconds', '?')} s: {bottleneck['summary']}"
    )
    for advice in bottleneck.get("advice", []):
        print(f"      - {advice}")


def stream_chat(base_url: str, model: str, prompt: str, max_tokens: int) -> StreamResult:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"{base_url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    first: float | None = None
    chunks, text = 0, []
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta", {}).get("content") or ""
            if delta:
                first = first if first is not None else time.perf_counter()
                chunks += 1
                text.append(delta)
    ended = time.perf_counter()
    return StreamResult((first or ended) - started, ended - started, chunks, "".join(text))


def router_routes(base_url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    routes: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "inferencepool_router_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    routes[sample.labels["route"]] = sample.value
    return routes


def run(args: argparse.Namespace) -> int:
    from inferencepool.api.crd import crd_yaml
    from inferencepool.cluster import controlplane
    from inferencepool.cluster.components import Layout
    from inferencepool.cluster.paths import default_state_dir, kubectl_binary
    from inferencepool.cluster.runner import read_engine, write_engine

    on_vllm = args.engine == "vllm"
    pool_file = args.pool_file or (real.POOL_FILE if on_vllm else DEFAULT_POOL_FILE)
    timeout = args.timeout or (real.READY_TIMEOUT_SECONDS if on_vllm else DEFAULT_TIMEOUT_SECONDS)
    pool_doc = yaml.safe_load(pool_file.read_text())
    pool_name = pool_doc["metadata"]["name"]
    namespace = pool_doc["metadata"].get("namespace", "default")
    engine = real.prepare(namespace, say=say) if on_vllm else None
    model = pool_doc["spec"]["model"].get("servedName") or pool_doc["spec"]["model"]["name"]
    state_dir = (args.state_dir or default_state_dir()).absolute()

    say("starting the local control plane (etcd, kube-apiserver, controllers, kwok; first run builds them)")
    was_running = all(controlplane.running_components(Layout(state_dir)).values())
    kubeconfig = controlplane.up(state_dir)
    kubectl = Kubectl(kubectl_binary(), kubeconfig)
    print(f"    KUBECONFIG={kubeconfig}")
    engine_file = Layout(state_dir).engine_file
    engine_before = read_engine(engine_file)
    if engine is not None:
        say(f"the pod runner's engine mode: vLLM pods run as `{engine.binary} serve {engine.model}`")
        write_engine(engine_file, engine)

    say("installing the InferencePool CRD (server-side apply)")
    kubectl("apply", "--server-side", "-f", "-", input_text=crd_yaml())
    kubectl("wait", "--for=condition=Established", "crd/inferencepools.serving.inferencepool.dev")

    say("starting the operator")
    operator_log = (state_dir / "demo-operator.log").open("w")
    # Watching only the pool's namespace keeps the demo from touching pools another operator owns.
    operator_command = [sys.executable, "-m", "inferencepool", "operator", "--namespace", namespace]
    metrics_port = free_port() if args.keep else None
    if metrics_port is not None:
        operator_command += ["--metrics-port", str(metrics_port)]
    operator = subprocess.Popen(
        operator_command,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        stdout=operator_log,
        stderr=subprocess.STDOUT,
    )
    print(f"    pid {operator.pid}, log {operator_log.name}")
    try:
        say(f"applying {pool_file}")
        print("    " + kubectl("apply", "-f", str(pool_file)).strip())
        say("waiting for the pool to be Ready (kubectl get pdpool)")

        def show() -> str:
            row = kubectl("get", "pdpool", pool_name, "-n", namespace, "--no-headers", check=False).split()
            return " ".join(row[:-1])  # without AGE, so a line is printed only when something changed

        wait_for(
            "the pool to be Ready",
            lambda: pool_ready(kubectl.json("get", "pdpool", pool_name, "-n", namespace)),
            timeout,
            show,
        )
        print(kubectl("get", "pdpool", "-n", namespace, "-o", "wide"))
        print(kubectl("get", "pods", "-n", namespace, "-l", f"{labels.LABEL_POOL}={pool_name}", "-o", "wide"))

        base_url = router_address(kubectl, namespace, pool_name)
        threshold = pool_doc["spec"].get("router", {}).get("prefillThresholdTokens", 4096)
        say(f"sending requests through the router at {base_url} (prefill threshold {threshold} tokens)")
        prompts = {
            "short prompt": SHORT_PROMPT,
            "long prompt": real.LONG_PROMPT if on_vllm else LONG_PROMPT,
        }
        pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"{labels.LABEL_POOL}={pool_name}")["items"]
        engine_urls, roles = real.engine_urls(pods)
        for label, prompt in prompts.items():
            before = router_routes(base_url)
            evidence_before = real.read_evidence(engine_urls) if on_vllm else {}
            result = stream_chat(base_url, model, prompt, max_tokens=32)
            after = router_routes(base_url)
            route = next((r for r, v in after.items() if v > before.get(r, 0.0)), "?")
            print(
                f"    {label:13s} ({len(prompt):5d} chars): route={route:14s} "
                f"TTFT {result.ttft_s * 1000:7.1f} ms, "
                f"{result.chunks} chunks in {result.total_s * 1000:7.1f} ms"
            )
            if on_vllm:
                found = real.handoffs(evidence_before, real.read_evidence(engine_urls), roles)
                for handoff in found:
                    print(f"      {real.describe(handoff)}")
                if label == "long prompt" and not real.decode_pulled_kv(found):
                    raise RuntimeError(
                        "no decode engine's counters show a KV read over NIXL for the long prompt"
                    )
        say("the long prompt took prefill -> KV transfer -> decode; the short one went straight to decode")
        plot = (
            None
            if on_vllm
            else run_load_step(kubectl, namespace, pool_name, base_url, model, args.out.absolute(), say=say)
        )
        show_autoscaler(
            kubectl,
            namespace,
            pool_name,
            base_url,
            model,
            list(prompts.values()),
            timeout,
            kubeconfig,
            settle_seconds=max_window_seconds(pool_doc),
        )
        if plot is not None:
            run_p2p_step(kubectl, namespace, pool_name, model, timeout)
            say(f"the load step's plot (TTFT and ITL against their targets, replicas over time): {plot}")
        return 0
    finally:
        if args.keep:
            if metrics_port is not None:
                start_prometheus(kubectl, kubeconfig, namespace, state_dir, metrics_port)
            say(f"left running (--keep); stop with: inferencepool cluster down --state-dir {state_dir}")
        else:
            say("cleaning up")
            kubectl("delete", "-f", str(pool_file), "--wait=true", "--timeout=60s", check=False)
            stop_process(operator, grace_seconds=30.0)
            write_engine(engine_file, engine_before)
            if not was_running:
                controlplane.down(state_dir)
        operator_log.close()


def max_window_seconds(pool_doc: dict[str, Any]) -> float:
    """The longest autoscaling window of the pool's roles (how long old traffic stays in its readings)."""
    windows = [
        float(((pool_doc["spec"].get(role) or {}).get("autoscaling") or {}).get("windowSeconds", 60))
        for role in ("prefill", "decode")
    ]
    return max(windows)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_prometheus(
    kubectl: Kubectl, kubeconfig: Path, namespace: str, state_dir: Path, metrics_port: int
) -> subprocess.Popen[bytes] | None:
    """--keep: a Prometheus (Debian's package) scraping the namespace's pods and the operator, in a process of
    its own that outlives the demo (returned); skipped, with the reason, when none is installed or it does not
    start (None)."""
    from inferencepool.demo import prometheus as demo_prometheus
    from inferencepool.observability import localprom, metrics

    try:
        localprom.prometheus_binary()
    except FileNotFoundError as error:
        say(f"no Prometheus for the kept pool: {error}")
        return None
    workdir = state_dir / "demo-prometheus"
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / "log").open("w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "inferencepool.demo.prometheus",
                "--kubectl",
                kubectl.binary,
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                namespace,
                "--workdir",
                str(workdir),
                "--operator",
                f"127.0.0.1:{metrics_port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not stopped by the terminal's Ctrl-C to the demo
        )
    try:
        url = demo_prometheus.wait_for_url(workdir, process, timeout=60)
    except RuntimeError as error:
        say(f"no Prometheus for the kept pool: {error}")
        stop_process(process, grace_seconds=10)
        return None
    say(f"Prometheus scraping the pool and the operator: {url} (pid {process.pid})")
    print(f"    stop it with: kill {process.pid}", flush=True)
    print(f"    e.g. {url}/graph?g0.expr={metrics.RECOMMENDED_REPLICAS}", flush=True)
    return process


def stop_process(process: subprocess.Popen[bytes], grace_seconds: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within the grace period."""
    process.terminate()
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        print(f"    pid {process.pid} ignored SIGTERM for {grace_seconds:.0f}s; killing it", flush=True)
        process.kill()
        process.wait()
