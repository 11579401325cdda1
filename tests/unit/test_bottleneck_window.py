"""A diagnosis window from two snapshots of real metrics pages (the fake engine's vLLM names, the router's
own), the snapshot file format of `inferencepool diagnose --from-files`, and the engine settings read from the
generated `vllm serve` arguments."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from inferencepool import cli
from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.autoscaler.histogram import parse_page
from inferencepool.bottleneck.settings import engine_settings, settings_from_pool
from inferencepool.bottleneck.window import PodPage, Snapshot, WindowError, window
from inferencepool.engine_sim.core import EngineCore
from inferencepool.engine_sim.metrics import EngineMetrics
from inferencepool.perf.profiles import get_profile
from inferencepool.router.metrics import LiveState, RouterMetrics
from inferencepool.router.pods import PodSet
from inferencepool.scheduling.decider import Route
from inferencepool.whatif.cli import (
    SnapshotFileError,
    parse_snapshot_text,
    snapshot_text,
    to_snapshot,
)


class Engine:
    """A fake engine's metrics registry: the real collector over a real (idle) engine core."""

    def __init__(self) -> None:
        self.core = EngineCore(get_profile("cpu-demo"), "e0")
        self.metrics = EngineMetrics(self.core, "m")

    def serve(self, ttft: float, gaps: list[float], prompt: int, output: int, cached: int = 0) -> None:
        self.metrics.ttft.observe(ttft)
        for gap in gaps:
            self.metrics.itl.observe(gap)
        self.metrics.e2e.observe(ttft + sum(gaps))
        stats = self.core.stats
        stats.prompt_tokens += prompt
        stats.generation_tokens += output
        stats.prefix_cache_queries += prompt
        stats.prefix_cache_hits += cached
        stats.request_success["length"] = stats.request_success.get("length", 0) + 1

    def page(self) -> str:
        return generate_latest(self.metrics.registry).decode()


class Router:
    def __init__(self) -> None:
        state = LiveState(PodSet(), lambda: 2048, lambda: "estimate", lambda: "", lambda: 4.0, dict)
        self.metrics = RouterMetrics(state)

    def route(self, route: Route, prompt: int, ttft: float, gaps: list[float]) -> None:
        self.metrics.requests_by_route[route].inc()
        self.metrics.prompt_tokens.observe(prompt)
        self.metrics.ttft_by_route[route].observe(ttft)
        for gap in gaps:
            self.metrics.itl_by_route[route].observe(gap)

    def page(self) -> str:
        return generate_latest(self.metrics.registry).decode()


def snapshot(at: float, pages: list[tuple[str, str, str]]) -> Snapshot:
    return Snapshot(at, tuple(PodPage(pod, role, parse_page(text)) for pod, role, text in pages))


def test_a_window_is_what_happened_between_the_snapshots() -> None:
    prefill, decode, router = Engine(), Engine(), Router()
    prefill.serve(1.0, [], 5000, 1)  # before the window: not counted
    router.route(Route.DISAGGREGATED, 5000, 1.2, [0.02])
    earlier = snapshot(0, [("p", "prefill", prefill.page()), ("d", "decode", decode.page())])
    earlier = Snapshot(0, (*earlier.pages, *snapshot(0, [("r", "router", router.page())]).pages))
    for _ in range(3):
        prefill.serve(2.0, [], 6000, 1, cached=3000)
        router.route(Route.DISAGGREGATED, 6000, 2.1, [0.02, 0.03])
        decode.serve(0.05, [0.02, 0.03], 6000, 3)
    router.route(Route.DIRECT, 100, 0.1, [0.02])
    decode.serve(0.1, [0.02], 100, 2)
    later = snapshot(
        30, [("p", "prefill", prefill.page()), ("d", "decode", decode.page()), ("r", "router", router.page())]
    )
    measured = window(earlier, later)
    assert measured.seconds == 30
    assert measured.prefill is not None and measured.decode is not None and measured.router is not None
    assert measured.prefill.ttft is not None and measured.prefill.ttft.count == 3
    assert measured.prefill.counter("vllm:prompt_tokens") == 18000
    assert measured.prefill.computed_prompt_tokens == 9000  # half of each prompt came from the prefix cache
    assert measured.decode.requests == 4
    assert measured.decode.itl is not None and measured.decode.itl.count == 7
    assert measured.decode.in_flight(30) == pytest.approx((3 * 0.1 + 0.12) / 30)  # Little's law
    assert measured.router.requests == {"direct": 1, "disaggregated": 3, "fallback": 0, "lent": 0}
    assert measured.router.prompt_tokens is not None and measured.router.prompt_tokens.count == 4
    assert set(measured.router.ttft) == {"direct", "disaggregated"}
    assert measured.router.ttft["disaggregated"].count == 3
    assert measured.router.threshold_tokens == 2048
    assert measured.decode.waiting is not None and measured.decode.waiting.max == 0


def test_a_restarted_or_new_pod_counts_what_it_reports() -> None:
    old, new = Engine(), Engine()
    old.serve(0.1, [0.02], 100, 2)
    old.serve(0.1, [0.02], 100, 2)
    earlier = snapshot(0, [("d", "decode", old.page())])
    restarted = Engine()  # the same pod name, counters back near zero
    restarted.serve(0.2, [0.02], 100, 2)
    new.serve(0.3, [0.02], 100, 2)
    later = snapshot(10, [("d", "decode", restarted.page()), ("d2", "decode", new.page())])
    measured = window(earlier, later)
    assert measured.decode is not None and measured.decode.requests == 2 and measured.decode.pods == 2


def test_snapshots_out_of_order_are_refused() -> None:
    page = snapshot(5, [("d", "decode", Engine().page())])
    with pytest.raises(WindowError, match="after the earlier one"):
        window(page, Snapshot(5, page.pages))


def test_snapshot_files_round_trip_and_bad_ones_are_named() -> None:
    engine, router = Engine(), Router()
    raw = (12.5, [("decode-0", "decode", engine.page()), ("router-0", "router", router.page())])
    parsed = parse_snapshot_text(snapshot_text(raw), "a.txt", 0.0)
    assert parsed[0] == 12.5
    assert [(pod, role) for pod, role, _ in parsed[1]] == [("decode-0", "decode"), ("router-0", "router")]
    assert len(to_snapshot(parsed, "a.txt").pages) == 2
    # A bare page (curl http://router/metrics > a.txt) is one pod, its role read from its metrics.
    bare = parse_snapshot_text(router.page(), "r.txt", 7.0)
    assert bare[0] == 7.0 and bare[1][0][1] == "router"
    with pytest.raises(SnapshotFileError, match=r"b.txt, line 1: expected"):
        parse_snapshot_text("# inferencepool-diagnose pod=x role=cache\n", "b.txt", 0.0)
    with pytest.raises(SnapshotFileError, match="no metrics page"):
        parse_snapshot_text("\n", "c.txt", 0.0)
    with pytest.raises(SnapshotFileError, match=r"d\.txt, pod p: metrics page does not parse"):
        to_snapshot((0.0, [("p", "decode", "not a { page\n")]), "d.txt")


def test_the_command_names_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "a.txt"
    good.write_text(snapshot_text((1.0, [("d", "decode", Engine().page())])))
    assert cli.main(["diagnose", "--from-files", str(good), str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt: cannot read" in capsys.readouterr().err
    assert cli.main(["diagnose", "--from-files", str(good)]) == 2
    assert "at least two snapshots" in capsys.readouterr().err


def test_engine_settings_come_from_the_generated_vllm_args() -> None:
    assert engine_settings(["m", "--port", "8000"]).chunked_prefill is True
    off = engine_settings(["--no-enable-chunked-prefill", "--max-num-batched-tokens=4096"])
    assert off.chunked_prefill is False and off.max_num_batched_tokens == 4096
    assert engine_settings(["--enable-chunked-prefill=false"]).chunked_prefill is False
    with pytest.raises(ValueError, match="--max-num-batched-tokens must be an integer"):
        engine_settings(["--max-num-batched-tokens", "lots"])
    pool = InferencePool.model_validate(
        {
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "model": {"name": "m"},
                "engine": {"extraArgs": ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048"]},
                "prefill": {"replicas": 2},
                "decode": {
                    "replicas": 3,
                    "autoscaling": {"maxReplicas": 6, "target": {"itlMilliseconds": 25, "percentile": 95}},
                },
                "kvCache": {"cpuOffloadGiB": 8, "p2p": {"enabled": True}},
                "router": {"prefillThresholdTokens": 2048},
            },
        }
    )
    settings = settings_from_pool(pool, {"decode": 4})
    assert settings.decode_engine.chunked_prefill is False
    assert settings.decode_engine.max_num_batched_tokens == 2048
    assert (settings.itl_target_ms, settings.ttft_target_ms, settings.percentile) == (25, 800, 95)
    assert (settings.prefill_replicas, settings.decode_replicas) == (2, 4)  # pods found win over the spec
    assert settings.lmcache and settings.p2p and settings.cpu_offload_gib == 8
    assert settings.threshold_tokens == 2048 and settings.max_replicas == {"decode": 6}
