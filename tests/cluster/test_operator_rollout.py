"""A model-revision upgrade of a serving pool on the real control plane: fake engine pods (run by the pod
runner) behind the pool's own router, under steady streamed load from clients of the test's own. Both pools
roll together (a surge pod each, then one old pod at a time), and at no moment does a request fail, a stream
break, a pool drop below its replicas or a request cross revisions: the fake decode engine refuses KV from a
prefill engine of another revision at the NIXL handshake, as vLLM refuses an incompatible peer, and counts
it in vllm:nixl_num_failed_transfers. A change that leaves the KV-compatibility revision alone restarts no
engine.

The figures (requests, failures, broken streams, cross-revision transfers, the rollout's duration) are
printed;
`pytest -s tests/cluster/test_operator_rollout.py -k upgrade` shows them.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.error import HTTPError

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.cluster.kube_helpers import event_reasons, example, get_pool, kubectl_ok, patch_spec
from tests.support.cluster import eventually

from inferencepool.api import labels
from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders.kvcompat import kv_compat_hash
from inferencepool.controller.context import OperatorContext
from inferencepool.kube import Kube

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

POOL = "upgrade"
REPLICAS = 2  # per pool
CLIENTS = 4
PROMPT = "word " * 600
FAILED_TRANSFERS = "vllm:nixl_num_failed_transfers_total"


def pool_document(namespace: str, revision: str, replicas: int = REPLICAS) -> dict[str, Any]:
    document = example("demo-cpu.yaml")
    document["metadata"] = {"name": POOL, "namespace": namespace}
    spec = document["spec"]
    spec["model"]["revision"] = revision
    for role in ("prefill", "decode"):
        spec[role].pop("autoscaling")
        spec[role]["replicas"] = replicas
    spec["router"]["policy"] = "AlwaysDisaggregate"  # every request pairs a prefill pod with a decode pod
    spec["networkPolicy"] = {"enabled": False}
    return document


def pods(kube: Kube, namespace: str, role: str) -> list[dict[str, Any]]:
    selector = f"{labels.LABEL_POOL}={POOL},{labels.LABEL_ROLE}={role}"
    return kube.list("v1", "Pod", namespace, selector)


def is_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def url_of(pod: dict[str, Any]) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    ports = [p for c in pod["spec"]["containers"] for p in c.get("ports", []) if p.get("name") == "http"]
    return f"http://{ip}:{ports[0]['containerPort']}" if ip and ports else None


@dataclass
class Load:
    """Streamed completions through the router from CLIENTS threads, and what became of them."""

    router: str
    sent: int = 0
    failed: list[str] = field(default_factory=list)  # no 200, or the connection failed
    broken: list[str] = field(default_factory=list)  # a 200 stream that ended without [DONE], or an error
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def one(self) -> None:
        body = {
            "model": "llama-8b",
            "prompt": f"{uuid.uuid4().hex} {PROMPT}",
            "max_tokens": 12,
            "stream": True,
        }
        request = urllib.request.Request(
            f"{self.router}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with self.lock:
            self.sent += 1
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                lines = [raw.decode().strip() for raw in response]
        except OSError as error:
            detail = error.read()[:300].decode(errors="replace") if isinstance(error, HTTPError) else ""
            with self.lock:
                self.failed.append(f"{error!r} {detail}")
            return
        chunks = [line[6:] for line in lines if line.startswith("data: ")]
        if not chunks or chunks[-1] != "[DONE]" or any('"error"' in chunk for chunk in chunks):
            with self.lock:
                self.broken.append("\n".join(lines[-3:]))

    def run(self) -> None:
        while not self.stop.is_set():
            self.one()


@dataclass
class Watch:
    """Samples the pods while the rollout runs: the fewest Ready pods per pool, and every engine's failed
    transfers (a pod's counter dies with it, so each is read while it lives)."""

    kube: Kube
    namespace: str
    fewest_ready: dict[str, int] = field(default_factory=lambda: {"prefill": 99, "decode": 99})
    failed_transfers: dict[str, float] = field(default_factory=dict)  # by pod uid
    revisions_seen: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        for role in ("prefill", "decode"):
            found = pods(self.kube, self.namespace, role)
            self.fewest_ready[role] = min(self.fewest_ready[role], sum(map(is_ready, found)))
            for pod in found:
                self.revisions_seen.add(pod["metadata"]["labels"].get(labels.LABEL_KV_COMPAT, ""))
                url = url_of(pod)
                if role != "decode" or url is None or not is_ready(pod):
                    continue
                try:
                    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
                        text = response.read().decode()
                except OSError:
                    continue
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        if sample.name == FAILED_TRANSFERS:
                            uid = pod["metadata"]["uid"]
                            self.failed_transfers[uid] = max(self.failed_transfers.get(uid, 0), sample.value)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            time.sleep(0.2)


def started(target: Any) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def serving(
    cluster: TestCluster, operator: OperatorContext, admin_kube: Kube, namespace: str
) -> Iterator[str]:
    """The pool at revision r1, every pod Ready; yields the router's URL."""
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(pool_document(namespace, "r1")))

    def router() -> str | None:
        if any(sum(map(is_ready, pods(admin_kube, namespace, r))) < REPLICAS for r in ("prefill", "decode")):
            return None
        routers = [url_of(p) for p in pods(admin_kube, namespace, "router") if is_ready(p)]
        return next((u for u in routers if u), None)

    yield eventually(router, 180, "every engine pod and the router Ready")


def test_a_model_revision_upgrade_under_load_fails_no_request_and_never_crosses_revisions(
    cluster: TestCluster, admin_kube: Kube, namespace: str, serving: str
) -> None:
    load, watch = Load(serving), Watch(admin_kube, namespace)
    clients = [started(load.run) for _ in range(CLIENTS)]
    watcher = started(watch.run)
    eventually(lambda: load.sent >= 2 * CLIENTS, 60, "load flowing")
    target = kv_compat_hash(InferencePool.model_validate(pool_document(namespace, "r2")))

    began = time.monotonic()
    patch_spec(cluster, namespace, POOL, {"model": {"revision": "r2"}})
    progressing: list[str] = []

    def rolled_out() -> bool:
        status = (get_pool(admin_kube, namespace, POOL) or {}).get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions", [])}
        reason = conditions.get("Progressing", {}).get("reason", "")
        if not progressing or progressing[-1] != reason:
            progressing.append(reason)
        engine_pods = pods(admin_kube, namespace, "prefill") + pods(admin_kube, namespace, "decode")
        return (
            status.get("kvCompat") == target
            and "rollout" not in status
            and len(engine_pods) == 2 * REPLICAS
            and all(p["metadata"]["labels"].get(labels.LABEL_KV_COMPAT) == target for p in engine_pods)
            and all(map(is_ready, engine_pods))
        )

    try:
        eventually(rolled_out, 300, "both pools rolled out to r2")
    except AssertionError as error:
        state = {
            role: [(p["metadata"]["name"], p["metadata"]["labels"].get(labels.LABEL_KV_COMPAT), is_ready(p))
                   for p in pods(admin_kube, namespace, role)]
            for role in ("prefill", "decode")
        }  # fmt: skip
        status = (get_pool(admin_kube, namespace, POOL) or {}).get("status")
        raise AssertionError(f"{error}; pods {state}; Progressing {progressing}; status {status}") from error
    seconds = time.monotonic() - began
    time.sleep(3)  # load on the new pods alone
    load.stop.set()
    watch.stop.set()
    for thread in [*clients, watcher]:
        thread.join(70)
    watch.sample()
    crossed = sum(watch.failed_transfers.values())
    print(
        f"\nrevision upgrade of {REPLICAS} prefill + {REPLICAS} decode pods, {CLIENTS} streaming clients: "
        f"{load.sent} requests, {len(load.failed)} failed, {len(load.broken)} broken streams, "
        f"{crossed:g} cross-revision transfers, fewest Ready pods {watch.fewest_ready}, "
        f"rollout {seconds:.1f} s"
    )
    assert not load.failed, load.failed[:5]
    assert not load.broken, load.broken[:5]
    assert crossed == 0, watch.failed_transfers
    assert watch.fewest_ready == {"prefill": REPLICAS, "decode": REPLICAS}, watch.fewest_ready
    assert target in watch.revisions_seen and len(watch.revisions_seen) == 2  # both revisions served
    assert "RollingOutRevision" in progressing, progressing
    status = (get_pool(admin_kube, namespace, POOL) or {})["status"]
    assert status["modelRevision"] == "r2"
    reasons = event_reasons(admin_kube, namespace, POOL)
    assert "RolloutStarted" in reasons and "RolloutComplete" in reasons, reasons
    assert "(model revision r1 -> r2)" in reasons["RolloutStarted"], reasons["RolloutStarted"]


def test_a_change_that_keeps_kv_valid_restarts_no_engine(
    cluster: TestCluster, admin_kube: Kube, namespace: str, serving: str
) -> None:
    uids = {p["metadata"]["uid"] for r in ("prefill", "decode") for p in pods(admin_kube, namespace, r)}
    router_generation = (admin_kube.get("apps/v1", "Deployment", namespace, f"{POOL}-router") or {})[
        "metadata"
    ]["generation"]
    before = kv_compat_hash(InferencePool.model_validate(pool_document(namespace, "r1")))
    # the router's threshold, and autoscaling targets (bounds that pin the counts: nothing scales)
    pinned = {"minReplicas": REPLICAS, "maxReplicas": REPLICAS}
    spec = {
        "router": {"prefillThresholdTokens": 2048, "policy": "LengthAware"},
        "prefill": {"autoscaling": {**pinned, "target": {"ttftMilliseconds": 900}}},
        "decode": {"autoscaling": {**pinned, "target": {"itlMilliseconds": 30}}},
    }
    patch_spec(cluster, namespace, POOL, spec)

    def router_rolled() -> bool:
        deployment = admin_kube.get("apps/v1", "Deployment", namespace, f"{POOL}-router") or {}
        status = deployment.get("status") or {}
        generation = deployment["metadata"]["generation"]
        return (
            generation > router_generation  # its config changed, and with it the template's checksum
            and status.get("observedGeneration") == generation
            and status.get("updatedReplicas") == status.get("readyReplicas") == status.get("replicas") == 1
        )

    eventually(router_rolled, 120, "the router rolled to the new threshold")
    time.sleep(3)  # anything the operator would do to the engines has been applied by now
    after = {p["metadata"]["uid"] for r in ("prefill", "decode") for p in pods(admin_kube, namespace, r)}
    assert after == uids
    status = (get_pool(admin_kube, namespace, POOL) or {})["status"]
    assert status["kvCompat"] == before and "rollout" not in status
