"""The demo's LMCache p2p step: a prompt prefilled on one decode pod, then a prompt sharing its prefix sent to
another decode pod, which fetches those chunks from the first through the pool's LMCache controller instead
of computing them; the engines' own counters show it.

If the pool runs without p2p it is turned on first (`kvCache.p2p.enabled`): the operator adds the LMCache
controller (a Deployment and its Service) and rolls the engines onto the p2p settings.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from inferencepool.api import labels
from inferencepool.api.pods import http_url, is_ready

CONTROLLER_ROLE = "lmcache-controller"
CONTROLLER_HTTP_PORT = 9000  # builders/lmcache.py CONTROLLER_HTTP_PORT, the controller pod's "http" port
DOCUMENT = " ".join(f"Clause {i} of the shared contract under review." for i in range(400))


class Kubectl(Protocol):
    def __call__(self, *args: str, input_text: str | None = None, check: bool = True) -> str: ...

    def json(self, *args: str) -> Any: ...


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def counters(url: str) -> dict[str, float]:
    """Every sample of an engine's /metrics page, summed over labels, by sample name."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def complete(url: str, model: str, prompt: str) -> float:
    """One completion straight to an engine; its wall time in seconds."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 8}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
    return time.monotonic() - started


def controller_workers(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/controller/workers", timeout=10) as response:
        workers: dict[str, Any] = json.loads(response.read())
    return workers


def p2p_enabled(pool: Mapping[str, Any]) -> bool:
    return bool(((pool.get("spec") or {}).get("kvCache") or {}).get("p2p", {}).get("enabled"))


def _on_p2p(pod: Mapping[str, Any]) -> bool:
    """Running the p2p settings (the engines' pod template after the roll-out), Ready, not going away."""
    env = [e.get("name") for c in (pod.get("spec") or {}).get("containers") or [] for e in c.get("env") or []]
    return "LMCACHE_P2P_HOST" in env and is_ready(pod) and not pod["metadata"].get("deletionTimestamp")


def _wait(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(2.0)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def run_p2p_step(kubectl: Kubectl, namespace: str, pool_name: str, model: str, timeout: float) -> None:
    pool = kubectl.json("get", "pdpool", pool_name, "-n", namespace)
    if not p2p_enabled(pool):
        say(
            "turning LMCache p2p on (kvCache.p2p.enabled): the operator adds the LMCache controller "
            "and rolls the engines onto it"
        )
        patch = {"spec": {"kvCache": {"p2p": {"enabled": True}}}}
        kubectl("patch", "pdpool", pool_name, "-n", namespace, "--type", "merge", "-p", json.dumps(patch))
    selector = f"{labels.LABEL_POOL}={pool_name}"

    def pods(role: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = kubectl.json(
            "get", "pods", "-n", namespace, "-l", f"{selector},{labels.LABEL_ROLE}={role}"
        )["items"]
        return sorted(found, key=lambda p: str(p["metadata"]["name"]))

    def ready() -> tuple[list[dict[str, Any]], str] | None:
        controllers = [p for p in pods(CONTROLLER_ROLE) if is_ready(p)]
        engines = pods("prefill") + pods("decode")
        decode = [p for p in pods("decode") if _on_p2p(p)]
        if not controllers or len(decode) < 2 or not all(_on_p2p(p) for p in engines):
            return None
        url = http_url(controllers[0], default_port=CONTROLLER_HTTP_PORT)
        if url is None or controller_workers(url).get("total_count", 0) < len(engines):
            return None  # not every engine has registered with the controller yet
        return decode, url

    say("waiting for the LMCache controller and every engine on p2p (registered with the controller)")
    decode, controller = _wait("the engines on LMCache p2p", ready, timeout)
    first, second = decode[0], decode[1]
    first_url, second_url = http_url(first), http_url(second)
    assert first_url is not None and second_url is not None
    first_name, second_name = first["metadata"]["name"], second["metadata"]["name"]
    document = f"{uuid.uuid4().hex} {DOCUMENT}"  # a prefix nobody holds yet

    say(f"LMCache p2p: a long prompt on {first_name}, then one sharing its prefix on {second_name}")
    before = counters(second_url)
    served_before = counters(first_url)
    cold = complete(first_url, model, f"{document} Question: who signs first?")
    known = controller_workers(controller)
    held = next((w["key_count"] for w in known["workers"] if w["instance_id"] == first_name), 0)
    print(f"    {first_name} computed it in {cold * 1000:.0f} ms; the controller knows {held} of its chunks")
    warm = complete(second_url, model, f"{document} Question: when does it end?")
    after = counters(second_url)
    served_after = counters(first_url)

    def delta(name: str, new: Mapping[str, float], old: Mapping[str, float]) -> int:
        return round(new.get(name, 0.0) - old.get(name, 0.0))

    fetched = delta("fake_engine:lmcache_p2p_hit_tokens_total", after, before)
    hits = delta("lmcache:num_hit_tokens_total", after, before)
    requested = delta("lmcache:num_requested_tokens_total", after, before)
    own = delta("vllm:prefix_cache_hits_total", after, before)
    transfers = delta("lmcache:p2p_time_to_transfer_count", served_after, served_before)
    served = delta("fake_engine:lmcache_p2p_served_tokens_total", served_after, served_before)
    print(
        f"    {second_name}: {fetched} prompt tokens fetched from a peer, {own} from its own prefix cache; "
        f"answered in {warm * 1000:.0f} ms"
    )
    print(f"    {second_name}: lmcache:num_hit_tokens +{hits} of lmcache:num_requested_tokens +{requested}")
    print(f"    {first_name}: served {transfers} p2p transfer(s) of {served} tokens (lmcache:p2p_*)")
    if fetched <= 0:
        raise RuntimeError(f"{second_name} fetched nothing from {first_name}: LMCache p2p did not work")
    say(f"the shared prefix was computed once, on {first_name}, and fetched by {second_name}")
