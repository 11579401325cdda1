"""The demo's load step: a few clients of long prompts, then many, through the pool's router; the SLA planner
sizes the prefill pool from the load it measures, and the demo shows it as it happens: the planner's decision
with its figures (status.<role>.lastScaling and the ScaledUp event), the new pods becoming Ready, the observed
TTFT against the target. Status is sampled every couple of seconds into out/demo/load-step.json and plotted
into out/demo/load-step.png (plot.py).

The fake engines load no model, so a new pod serves seconds after the decision: the step sets the pool's
modelLoadSeconds to 10 (the default of 120 is a real vLLM's image pull and load), so the planner sizes for the
load 10 s ahead, as it would for minutes on GPUs.
"""

from __future__ import annotations

import datetime
import json
import random
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from inferencepool.api import labels
from inferencepool.api.pods import is_ready
from inferencepool.demo import plot as demo_plot

MODEL_LOAD_SECONDS = 10
SAMPLE_SECONDS = 2.0
CLIENT_SECONDS = 10.0  # the clients' own TTFT percentile is shown over this long
PLOT_BUCKET_SECONDS = 5.0  # ... and plotted per bucket of this many seconds of request starts


class Kubectl(Protocol):
    def __call__(self, *args: str, input_text: str | None = None, check: bool = True) -> str: ...

    def json(self, *args: str) -> Any: ...


@dataclass(frozen=True)
class StepLoad:
    """Long prompts (past the router's 4,096-token threshold: they go through the prefill pool), each unique
    so the prefix cache does not serve them, a few output tokens each. At the H100 profile one 6,000-token
    prompt prefills in ~0.17 s: 10 clients at up to one prompt a second each offer up to ~1.7 engine-seconds
    of prefill a second, more than one prefill pod carries within the 800 ms TTFT target (the planner's
    capacity: ~0.88), and within it on two or three. What one pod cannot take in time the router sends
    straight to the decode pods (its load-aware bypass), where it costs ITL: the planner scales whichever
    pool misses or would miss its target, and the demo shows which and why."""

    prompt_words: int = 6000
    baseline_clients: int = 1
    step_clients: int = 10
    period_seconds: float = 1.0
    max_tokens: int = 4
    baseline_seconds: float = 25.0
    scale_timeout_seconds: float = 150.0
    ready_timeout_seconds: float = 150.0
    recover_timeout_seconds: float = 120.0


class PacedClients:
    """Client threads that each send one prompt per period (after the previous one answered), of which the
    first `active` send and the rest wait."""

    def __init__(self, base_url: str, model: str, load: StepLoad, count: int, t0: float) -> None:
        self._url = f"{base_url}/v1/completions"
        self._t0 = t0
        self.ttfts: list[tuple[float, float]] = []
        self._model, self._load = model, load
        self._active = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)]
        for thread in self._threads:
            thread.start()

    def set_active(self, count: int) -> None:
        self._active = count

    def _send(self) -> float | None:
        """One streamed prompt; its TTFT as the client sees it (None if it failed)."""
        # a distinct first word: no prompt is a prefix-cache hit of another
        prompt = f"{uuid.uuid4().hex} " + "word " * self._load.prompt_words
        body = {"model": self._model, "prompt": prompt, "max_tokens": self._load.max_tokens, "stream": True}
        request = urllib.request.Request(
            self._url, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        started = time.monotonic()
        first: float | None = None
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                for raw in response:
                    line = raw.decode().strip()
                    if first is None and line.startswith("data: ") and line != "data: [DONE]":
                        first = time.monotonic()
        except OSError:
            return None
        return None if first is None else first - started

    def _run(self, index: int) -> None:
        pace = random.Random(index)  # jitter, not security
        while not self._stop.is_set():
            if index >= self._active:
                self._stop.wait(0.2)
                continue
            started = time.monotonic()
            ttft = self._send()
            with self._lock:
                self.sent += 1
                if ttft is None:
                    self.failed += 1
                else:
                    self.ttfts.append((started - self._t0, ttft))
            # jitter keeps the clients from sending in lockstep
            period = self._load.period_seconds * pace.uniform(0.8, 1.2)
            self._stop.wait(max(0.0, started + period - time.monotonic()))

    def ttft_samples(self) -> list[tuple[float, float]]:
        """(seconds since the clients started, TTFT seconds) of every answered prompt, by start time."""
        with self._lock:
            return sorted(self.ttfts)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(70)


@dataclass
class _Watch:
    """What the step has shown so far, so each line is printed once."""

    start: float
    decisions: set[str] = field(default_factory=set)
    events: set[str] = field(default_factory=set)
    pods: dict[str, bool] = field(default_factory=dict)
    reading: str = ""
    scaled_at: float | None = None
    decided_at: datetime.datetime | None = None  # the latest scale-up's time, as status says
    ready_at: float | None = None
    recovered: bool = False

    def t(self) -> float:
        return time.monotonic() - self.start


def _line(t: float, text: str) -> None:
    print(f"    t={t:4.0f}s  {text}", flush=True)


def _reading(status: dict[str, Any], clients: int) -> str:
    parts = []
    for role, metric in (("prefill", "TTFT"), ("decode", "ITL")):
        figures = status.get(role) or {}
        observed = figures.get("observedMilliseconds")
        seen = "-" if observed is None else f"{observed} ms"
        parts.append(
            f"{role} p{figures.get('percentile', '?')} {metric} {seen} vs target "
            f"{figures.get('targetMilliseconds', '?')} ms, "
            f"{figures.get('readyReplicas', 0)}/{figures.get('desiredReplicas', 0)} ready"
        )
    return "; ".join(parts) + f" ({clients} client{'s' if clients != 1 else ''})"


def _decision_key(role: str, last: dict[str, Any]) -> str:
    return f"{role} {last.get('fromReplicas')} -> {last.get('replicas')} at {last.get('time')}"


def _show_decisions(status: dict[str, Any], watch: _Watch, print_new: bool) -> None:
    for role in ("prefill", "decode"):
        last = (status.get(role) or {}).get("lastScaling")
        if not last:
            continue
        key = _decision_key(role, last)
        if key in watch.decisions:
            continue
        watch.decisions.add(key)
        if not print_new:
            continue
        _line(watch.t(), f"planner: {role} {last.get('message', '')}")
        figures = (
            f"demand {last.get('demandMilliEngines', '?')}, forecast {last.get('forecastMilliEngines', '?')} "
            f"milli-engines vs {last.get('capacityMilliEnginesPerReplica', '?')} per replica; "
            f"observed {last.get('observedMilliseconds', '-')} ms vs target "
            f"{last.get('targetMilliseconds', '?')} ms"
        )
        print(f"             status.{role}.lastScaling: reason {last.get('reason')}, {figures}", flush=True)
        if last.get("replicas", 0) > last.get("fromReplicas", 0):
            watch.decided_at = _timestamp(last.get("time"))
            if watch.scaled_at is None:
                watch.scaled_at = watch.t()


def _show_events(kubectl: Kubectl, namespace: str, pool_name: str, watch: _Watch, print_new: bool) -> None:
    selector = f"involvedObject.name={pool_name},reason=ScaledUp"
    items = kubectl.json("get", "events", "-n", namespace, "--field-selector", selector).get("items", [])
    for event in items:
        key = f"{event['metadata'].get('uid')}/{event.get('count', 1)}"
        if key in watch.events:
            continue
        watch.events.add(key)
        if print_new:
            message = str(event.get("message", ""))
            short = message.split("):", 1)[0] + ")" if "):" in message else message
            _line(watch.t(), f"event {event.get('type')} {event.get('reason')} on pool {pool_name}: {short}")


def _timestamp(value: Any) -> datetime.datetime | None:
    """An API server timestamp (RFC 3339, e.g. 2026-12-01T13:55:39Z) as an aware datetime."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _ready_since(pod: dict[str, Any]) -> datetime.datetime | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready" and c.get("status") == "True"), None)
    return None if ready is None else _timestamp(ready.get("lastTransitionTime"))


def _show_pods(kubectl: Kubectl, namespace: str, pool_name: str, watch: _Watch, print_new: bool) -> None:
    """New engine pods and their readiness, timed from the API server's own timestamps (the decision's,
    the pod's creation and its Ready condition), so the figures do not depend on how often the demo looks."""
    selector = f"{labels.LABEL_POOL}={pool_name},{labels.LABEL_ROLE} in (prefill,decode)"
    for pod in kubectl.json("get", "pods", "-n", namespace, "-l", selector).get("items", []):
        name = str(pod["metadata"]["name"])
        ready = is_ready(pod)
        before = watch.pods.get(name)
        watch.pods[name] = ready
        if not print_new or before == ready:
            continue
        created = _timestamp(pod["metadata"].get("creationTimestamp"))
        if ready:
            since = _ready_since(pod)
            timing = []
            if watch.decided_at is not None and created is not None and since is not None:
                # API timestamps have whole seconds: a pod made in the decision's second reads as 0, not -1
                after = max(0.0, (created - watch.decided_at).total_seconds())
                timing.append(f"created {after:.0f} s after the decision")
                timing.append(
                    f"Ready {max(after, (since - watch.decided_at).total_seconds()):.0f} s after it"
                )
            elif created is not None and since is not None:
                timing.append(f"Ready {(since - created).total_seconds():.0f} s after it was created")
            suffix = f" ({', '.join(timing)})" if timing else ""
            _line(watch.t(), f"pod {name} Ready: the router sends it prompts{suffix}")
        elif before is None:
            _line(watch.t(), f"pod {name} created: the fake engine is starting")
        else:
            _line(watch.t(), f"pod {name} not Ready")


def _all_ready(status: dict[str, Any]) -> bool:
    """Every engine pod each role asks for is Ready."""
    figures = [status.get(role) or {} for role in demo_plot.ROLES]
    return all(f.get("readyReplicas", 0) >= f.get("desiredReplicas", 0) for f in figures)


def _over_target(status: dict[str, Any]) -> list[str]:
    """The roles whose observed percentile is over their target now."""
    over = []
    for role in demo_plot.ROLES:
        figures = status.get(role) or {}
        observed, target = figures.get("observedMilliseconds"), figures.get("targetMilliseconds")
        if observed is not None and target is not None and observed > target:
            over.append(role)
    return over


def run_load_step(
    kubectl: Kubectl,
    namespace: str,
    pool_name: str,
    base_url: str,
    model: str,
    out_dir: Path,
    load: StepLoad = StepLoad(),
    say: Callable[[str], None] = print,
) -> Path:
    """The step, shown as it happens; returns the plot's path. Raises TimeoutError when the planner does not
    scale up, or the new pods are not Ready, in time (the figures it had are in the message)."""

    def status() -> dict[str, Any]:
        return dict(kubectl.json("get", "pdpool", pool_name, "-n", namespace).get("status") or {})

    patch = {
        "spec": {
            role: {"autoscaling": {"modelLoadSeconds": MODEL_LOAD_SECONDS}} for role in ("prefill", "decode")
        }
    }
    kubectl("patch", "pdpool", pool_name, "-n", namespace, "--type", "merge", "-p", json.dumps(patch))
    say(
        f"load step: modelLoadSeconds {MODEL_LOAD_SECONDS} (a fake engine loads in seconds), then long "
        f"prompts (~{load.prompt_words} tokens, each unique) from {load.baseline_clients} client, then "
        f"{load.step_clients}"
    )
    watch = _Watch(time.monotonic())
    samples: list[demo_plot.StatusSample] = []
    marks: list[demo_plot.Decision] = []
    clients = PacedClients(base_url, model, load, load.step_clients, watch.start)
    active = load.baseline_clients
    clients.set_active(active)

    def tick(print_new: bool = True) -> dict[str, Any]:
        current = status()
        samples.append(demo_plot.sample_from_status(watch.t(), current))
        _show_decisions(current, watch, print_new)
        _show_events(kubectl, namespace, pool_name, watch, print_new)
        _show_pods(kubectl, namespace, pool_name, watch, print_new)
        reading = _reading(current, active)
        if reading != watch.reading:
            recent = [
                ttft for started, ttft in clients.ttft_samples() if started >= watch.t() - CLIENT_SECONDS
            ]
            seen = demo_plot.percentile(recent, 0.9)
            _line(
                watch.t(), reading if seen is None else f"{reading}; clients' p90 TTFT {seen * 1000:.0f} ms"
            )
            watch.reading = reading
        return current

    def wait(what: str, done: Callable[[dict[str, Any]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(tick()):
                return True
            time.sleep(SAMPLE_SECONDS)
        return False

    try:
        tick(print_new=False)  # what is there already is history, not the step's
        wait("the baseline", lambda _: watch.t() >= load.baseline_seconds, load.baseline_seconds + 30)
        active = load.step_clients
        clients.set_active(active)
        marks.append(demo_plot.Decision(watch.t(), f"{active} clients"))
        say(f"step: {active} clients, one long prompt a second each")
        if not wait("a scale-up", lambda _: watch.scaled_at is not None, load.scale_timeout_seconds):
            raise TimeoutError(
                f"the planner did not scale up within {load.scale_timeout_seconds:.0f} s of the step; "
                f"status: {json.dumps(status())}"
            )
        if not wait("the new pods", _all_ready, load.ready_timeout_seconds):
            raise TimeoutError(
                f"the new pods were not Ready within {load.ready_timeout_seconds:.0f} s of the decision; "
                f"status: {json.dumps(status())}"
            )
        watch.ready_at = watch.t()
        _line(watch.t(), "every pod the planner asked for is Ready; the percentiles cover the last window")

        def settled(current: dict[str, Any]) -> bool:
            # a later decision (another pod asked for) starts the wait for readiness over
            if not _all_ready(current):
                watch.ready_at = None
                return False
            if watch.ready_at is None:
                watch.ready_at = watch.t()
            return watch.t() > watch.ready_at + SAMPLE_SECONDS and not _over_target(current)

        watch.recovered = wait("the latency under target", settled, load.recover_timeout_seconds)
        current = status()
        figures = "; ".join(
            f"{role} p{f.get('percentile')} {demo_plot.METRIC[role]} {f.get('observedMilliseconds', '-')} ms "
            f"vs target {f.get('targetMilliseconds')} ms with {f.get('readyReplicas')} replicas"
            for role in demo_plot.ROLES
            if (f := current.get(role) or {})
        )
        if watch.recovered:
            _line(watch.t(), f"under target: {figures}")
        else:
            over = ", ".join(_over_target(current)) or "no pod set"
            _line(
                watch.t(),
                f"{over} still over target after {load.recover_timeout_seconds:.0f} s ({figures}): this "
                "machine's CPUs may be busy (the fake engines' timing slips when they get no CPU)",
            )
    finally:
        clients.stop()
    out_dir.mkdir(parents=True, exist_ok=True)
    series = demo_plot.build_series(samples)
    seen = demo_plot.client_series(clients.ttft_samples(), PLOT_BUCKET_SECONDS, end=watch.t())
    demo_plot.write_json(out_dir / "load-step.json", series, marks, seen)
    path = demo_plot.plot(
        series,
        out_dir / "load-step.png",
        f"pool {namespace}/{pool_name}: a load step, the SLA planner's scaling",
        marks,
        seen,
    )
    print(
        f"    {len(samples)} status samples over {watch.t():.0f} s, {clients.sent} prompts sent "
        f"({clients.failed} failed): {path}",
        flush=True,
    )
    return path
