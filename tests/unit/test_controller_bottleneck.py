"""The bottleneck in the status the operator writes: the autoscaler's readings (real fake-engine and router
pages) in, status.bottleneck, the Bottleneck condition and the `-o wide` column out. No cluster needed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from tests.unit.builders_examples import load_pool
from tests.unit.test_bottleneck_window import Engine, Router

from inferencepool.api import crd, labels
from inferencepool.api.v1alpha1 import InferencePool, InferencePoolStatus
from inferencepool.autoscaler.histogram import Reading, parse_page
from inferencepool.autoscaler.runner import PoolAutoscaler
from inferencepool.bottleneck.settings import settings_from_pool
from inferencepool.bottleneck.sizing import size
from inferencepool.bottleneck.window import PodPage, Snapshot
from inferencepool.controller.status import (
    Bottleneck,
    Observed,
    ReconcileOutcome,
    StatusInputs,
    WorkloadState,
    _pod_role,
    bottleneck_of,
    status_document,
)
from inferencepool.scheduling.decider import Route

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


class Pool:
    """One prefill engine, one decode engine and a router, read as the autoscaler reads them."""

    def __init__(self) -> None:
        self.prefill, self.decode, self.router = Engine(), Engine(), Router()

    def reading(self, at: float) -> Reading:
        pages = (
            ("prefill", "demo-prefill-0", self.prefill.page()),
            ("decode", "demo-decode-0", self.decode.page()),
            ("router", "demo-router-0", self.router.page()),
        )
        return at, tuple((role, pod, parse_page(text)) for role, pod, text in pages)

    def long_prompts(self, requests: int) -> None:
        """Slow first tokens (2 s against 800 ms) of long prompts through the prefill pool, fast streaming."""
        for _ in range(requests):
            self.prefill.serve(2.0, [], 6000, 1)
            self.router.route(Route.DISAGGREGATED, 6000, 2.1, [0.02] * 8)
            self.decode.serve(0.05, [0.02] * 8, 6000, 9, cached=6000)

    def long_outputs(self, requests: int) -> None:
        """Short prompts straight to decode, fast first tokens, slow streaming (90 ms against 40 ms)."""
        for _ in range(requests):
            self.router.route(Route.DIRECT, 20, 0.1, [0.09] * 60)
            self.decode.serve(0.1, [0.09] * 60, 20, 61)


def compose(pool: InferencePool, bottleneck: Bottleneck | None, now: datetime = NOW) -> dict[str, Any]:
    state = WorkloadState("StatefulSet", "x", 1, 1, 1, 1, 1, 1, "r1", "r1")
    observed = Observed(
        {"prefill": state, "decode": state, "router": WorkloadState("Deployment", "r", 1, 1, 1, 1, 1, 1)}
    )
    endpoint = "http://demo.default.svc"
    inputs = StatusInputs(
        pool, 1, ReconcileOutcome(1), observed, endpoint, now, bottleneck=bottleneck, previous=pool.status
    )
    return status_document(inputs)


def condition(document: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in document["conditions"] if c["type"] == "Bottleneck")


def test_long_prompts_make_the_status_say_prefill_and_long_outputs_say_decode() -> None:
    pool = load_pool("demo-cpu.yaml")
    engines = Pool()
    start = engines.reading(0)
    engines.long_prompts(30)
    prefill = bottleneck_of(pool, [start, engines.reading(15), engines.reading(30)])
    assert prefill is not None
    document = compose(pool, prefill)
    assert document["bottleneck"]["phase"] == "Prefill"
    assert document["bottleneck"]["reason"] == "PrefillBound"
    assert document["bottleneck"]["windowSeconds"] == 30
    assert 1 <= len(document["bottleneck"]["advice"]) <= 3
    assert (condition(document)["status"], condition(document)["reason"]) == ("True", "PrefillBound")
    assert condition(document)["message"].startswith("first token slow, streaming fast")
    # What is written reads back through the API model (the CRD schema is generated from it).
    stored = InferencePoolStatus.model_validate(document)
    assert stored.bottleneck is not None and stored.bottleneck.phase == "Prefill"

    engines = Pool()
    start = engines.reading(100)
    engines.long_outputs(30)
    decode = bottleneck_of(pool, [start, engines.reading(130)])
    assert decode is not None
    assert compose(pool, decode)["bottleneck"]["phase"] == "Decode"
    # Advice only the what-if can confirm says where it is checked (the operator does not replay).
    colocate = [text for text in decode.document["advice"] if "serve the pool Colocated" in text]
    assert colocate and colocate[0].endswith(
        "(not replayed: `inferencepool diagnose` checks it in the simulator)"
    )
    assert all("not replayed" not in text for text in decode.document["advice"] if "decode replicas" in text)
    assert condition(compose(pool, decode))["reason"] == "DecodeBound"


def test_the_replicas_advised_are_what_the_planner_sizes_from_the_same_pages() -> None:
    """The diagnosis holds no sizing rule of its own: the prefill replicas it advises are the planner's
    (`bottleneck.sizing`, through the operator's feed), so they follow the load, not the latency ratio (2.9x
    the target at every load here)."""
    pool = load_pool("demo-cpu.yaml")
    settings = settings_from_pool(pool, {"prefill": 1, "decode": 1})
    advised: dict[int, int] = {}
    for requests in (30, 300):
        engines = Pool()
        start = engines.reading(0)
        engines.long_prompts(requests)
        end = engines.reading(30)
        bottleneck = bottleneck_of(pool, [start, end])
        assert bottleneck is not None and bottleneck.document["phase"] == "Prefill"
        snapshots = [
            Snapshot(at, tuple(PodPage(pod, _pod_role(role), page) for role, pod, page in pages))
            for at, pages in (start, end)
        ]
        sizing = size(snapshots[0], snapshots[1], settings)
        assert sizing is not None and sizing.prefill.forecast > 0
        [text] = [a for a in bottleneck.document["advice"] if a.startswith("prefill replicas")]
        advised[requests] = max(2, sizing.prefill.wanted)  # at least one more: the pool misses its target
        ceiling = settings.max_replicas["prefill"]  # demo-cpu: 3
        assert text.startswith(f"prefill replicas 1 -> {min(advised[requests], ceiling)} (")
        assert f"the planner sizes this load at {sizing.prefill.wanted}:" in text
    assert advised[300] > advised[30] >= 2  # ten times the load: more replicas, at the same latency ratio


def test_the_window_is_the_readings_within_it_and_quiet_pools_are_unknown() -> None:
    pool = load_pool("demo-cpu.yaml")
    engines = Pool()
    assert bottleneck_of(pool, []) is None
    assert bottleneck_of(pool, [engines.reading(0)]) is None  # one reading is no window
    old = engines.reading(0)
    engines.long_prompts(30)  # all of it before the window below
    recent = [engines.reading(50), engines.reading(60)]
    quiet = bottleneck_of(pool, [old, *recent], window_seconds=30)
    assert quiet is not None
    assert quiet.document["phase"] == "Unknown" and quiet.document["windowSeconds"] == 10
    assert (quiet.condition.status, quiet.condition.reason) == ("Unknown", "NotEnoughTraffic")
    whole = bottleneck_of(pool, [old, *recent])  # no limit: from the oldest reading
    assert whole is not None and whole.document["phase"] == "Prefill"
    gone = bottleneck_of(pool, [(0.0, ()), (10.0, ())])  # no pod answered
    assert gone is not None and (gone.document["phase"], gone.condition.reason) == ("Unknown", "NoMetrics")


def test_the_last_diagnosis_stands_until_a_new_window_is_read() -> None:
    pool = load_pool("demo-cpu.yaml")
    engines = Pool()
    start = engines.reading(0)
    engines.long_prompts(30)
    first = compose(pool, bottleneck_of(pool, [start, engines.reading(30)]))
    pool.status = InferencePoolStatus.model_validate(first)
    later = NOW + timedelta(minutes=5)
    carried = compose(pool, None, later)  # e.g. just after an operator restart: nothing read yet
    assert carried["bottleneck"] == first["bottleneck"]
    assert condition(carried) == condition(first)
    # Still True with another reason: the transition time stays; False moves it.
    engines = Pool()
    start = engines.reading(0)
    engines.long_outputs(30)
    decode = compose(pool, bottleneck_of(pool, [start, engines.reading(30)]), later)
    assert condition(decode)["reason"] == "DecodeBound"
    assert condition(decode)["lastTransitionTime"] == condition(first)["lastTransitionTime"]
    # A pool never diagnosed has neither the field nor the condition.
    fresh = load_pool("demo-cpu.yaml")
    document = compose(fresh, None)
    assert "bottleneck" not in document
    assert all(c["type"] != "Bottleneck" for c in document["conditions"])


def test_kubectl_get_wide_shows_the_phase() -> None:
    columns = crd.custom_resource_definition()["spec"]["versions"][0]["additionalPrinterColumns"]
    column = next(c for c in columns if c["name"] == "Bottleneck")
    assert column["jsonPath"] == ".status.bottleneck.phase" and column["priority"] == 1
    status = crd.open_api_schema()["properties"]["status"]
    assert "phase" in status["properties"]["bottleneck"]["properties"]


class StubKube:
    """The API server as the autoscaler reads it: one ready pod per role, StatefulSets at one replica."""

    def __init__(self) -> None:
        self.pods = {
            role: {
                "metadata": {"name": f"demo-{role}-0", "labels": {labels.LABEL_ROLE: role}},
                "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8000}]}]},
                "status": {"podIP": f"127.0.0.{n}", "conditions": [{"type": "Ready", "status": "True"}]},
            }
            for n, role in enumerate(("prefill", "decode", "router"), start=1)
        }

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"replicas": 1}, "status": {"readyReplicas": 1}}

    def list(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        return [pod for role, pod in self.pods.items() if f"{labels.LABEL_ROLE}={role}" in selector]

    def apply(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("min = max replicas: nothing to scale")


async def test_each_round_keeps_every_roles_page_once_over_the_window() -> None:
    """The autoscaler reads each pod once a round, whether its role autoscales or not, and keeps those
    pages over its window: what the status composer diagnoses."""
    pool = load_pool("demo-cpu.yaml")
    spec = pool.spec
    assert spec.decode.autoscaling is not None
    decode = spec.decode.autoscaling.model_copy(
        update={"min_replicas": 1, "max_replicas": 1, "interval_seconds": 2, "window_seconds": 6}
    )
    pool = pool.model_copy(
        update={
            "spec": spec.model_copy(
                update={
                    "prefill": spec.prefill.model_copy(update={"autoscaling": None}),  # not autoscaled
                    "decode": spec.decode.model_copy(update={"autoscaling": decode}),
                }
            )
        }
    )
    engines, now = Pool(), [0.0]
    pages = {"127.0.0.1": engines.prefill, "127.0.0.2": engines.decode, "127.0.0.3": engines.router}
    scraped: list[str] = []

    async def scrape(url: str) -> str:
        host = url.removeprefix("http://").rsplit(":", 1)[0]
        scraped.append(host)
        return pages[host].page()

    scaler = PoolAutoscaler(cast(Any, StubKube()), pool, cast(Any, None), lambda *_: None, lambda: now[0])
    scaler._scrape = scrape  # type: ignore[method-assign]
    for second in range(0, 12, 2):
        now[0] = float(second)
        engines.long_prompts(10)
        await scaler.tick()
        assert sorted(scraped) == sorted(pages), scraped  # each pod once, this round
        scraped.clear()
    readings = scaler.readings()
    assert [at for at, _ in readings] == [4.0, 6.0, 8.0, 10.0]  # the window: 6 s back from the last
    assert all(
        sorted(role for role, _, _ in pages) == ["decode", "prefill", "router"] for _, pages in readings
    )
    found = bottleneck_of(pool, readings)
    assert found is not None and found.document["phase"] == "Prefill"
    assert found.document["windowSeconds"] == 6
