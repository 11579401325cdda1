"""The demo's load-step record: status samples -> series per role -> a PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferencepool.demo import plot as demo_plot

pytestmark = pytest.mark.slow


def role(
    desired: int,
    ready: int,
    observed: int | None = None,
    last: dict[str, Any] | None = None,
    target: int = 800,
) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "desiredReplicas": desired,
        "readyReplicas": ready,
        "targetMilliseconds": target,
        "percentile": 90,
    }
    if observed is not None:
        figures["observedMilliseconds"] = observed
    if last is not None:
        figures["lastScaling"] = last
    return figures


def scaling(before: int, after: int, reason: str, time: str) -> dict[str, Any]:
    return {"fromReplicas": before, "replicas": after, "reason": reason, "time": time, "message": "..."}


def test_a_sample_reads_each_roles_figures_and_leaves_out_what_status_lacks() -> None:
    status = {"prefill": role(2, 1, 1200, scaling(1, 2, "ForecastUp", "t1")), "router": {"replicas": 1}}
    sample = demo_plot.sample_from_status(12.5, status)
    assert sample.seconds == 12.5
    assert set(sample.roles) == {"prefill"}
    prefill = sample.roles["prefill"]
    assert (prefill.desired, prefill.ready, prefill.observed_ms, prefill.target_ms) == (2, 1, 1200, 800)
    assert prefill.last_scaling == "1 -> 2 (ForecastUp) at t1"
    # before the autoscaler's first reading: no latency, no decision
    empty = demo_plot.sample_from_status(0, {"decode": {"desiredReplicas": 2}}).roles["decode"]
    assert (empty.desired, empty.ready, empty.observed_ms, empty.last_scaling) == (2, 0, None, None)


def test_series_follow_the_samples_with_gaps_and_mark_each_new_decision_once() -> None:
    history = scaling(2, 1, "ForecastDown", "t0")  # there before the recording: not the step's
    statuses = [
        {"prefill": role(1, 1, None, history), "decode": role(2, 2, 10, target=40)},
        {"prefill": role(1, 1, 450, history), "decode": role(2, 2, 11, target=40)},
        {"prefill": role(2, 1, 2200, scaling(1, 2, "ForecastUp", "t1")), "decode": role(2, 2, 9, target=40)},
        {"prefill": role(2, 2, 2200, scaling(1, 2, "ForecastUp", "t1")), "decode": role(2, 2, 9, target=40)},
        {"prefill": role(3, 2, 2100, scaling(2, 3, "LatencyGuard", "t2"))},
        {"prefill": role(3, 3, 700, scaling(2, 3, "LatencyGuard", "t2"))},
        # the same counts as an earlier decision, decided later: a decision of its own
        {"prefill": role(3, 3, 650, scaling(2, 3, "LatencyGuard", "t3"))},
    ]
    samples = [demo_plot.sample_from_status(2.0 * i, s) for i, s in enumerate(statuses)]
    series = demo_plot.build_series(samples)
    prefill, decode = series["prefill"], series["decode"]
    assert prefill.seconds == (0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0)
    assert prefill.observed_ms == (None, 450, 2200, 2200, 2100, 700, 650)
    assert prefill.desired == (1, 1, 2, 2, 3, 3, 3)
    assert prefill.ready == (1, 1, 1, 2, 2, 3, 3)
    assert [(d.seconds, d.text) for d in prefill.decisions] == [
        (4.0, "prefill 1 -> 2 (ForecastUp)"),
        (8.0, "prefill 2 -> 3 (LatencyGuard)"),
        (12.0, "prefill 2 -> 3 (LatencyGuard)"),
    ]
    assert prefill.over_target() == (None, False, True, True, True, False, False)
    assert (prefill.metric, prefill.percentile, prefill.target_ms) == ("TTFT", 90, 800)
    # a role is followed over the samples that have it
    assert decode.seconds == (0.0, 2.0, 4.0, 6.0)
    assert (decode.metric, decode.target_ms, decode.decisions) == ("ITL", 40, ())
    assert demo_plot.build_series([demo_plot.sample_from_status(0, {})]) == {}


def test_the_plot_is_a_png_and_the_series_are_written_beside_it(tmp_path: Path) -> None:
    statuses = [
        {"prefill": role(1, 1, 400), "decode": role(2, 2, 10, target=40)},
        {"prefill": role(2, 1, 2000, scaling(1, 2, "ForecastUp", "t1")), "decode": role(2, 2, 12, target=40)},
        {"prefill": role(2, 2, 600, scaling(1, 2, "ForecastUp", "t1")), "decode": role(2, 2, 12, target=40)},
    ]
    series = demo_plot.build_series(
        [demo_plot.sample_from_status(5.0 * i, s) for i, s in enumerate(statuses)]
    )
    marks = [demo_plot.Decision(2.0, "8 clients")]
    path = demo_plot.plot(series, tmp_path / "sub" / "step.png", "a step", marks)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    demo_plot.write_json(tmp_path / "step.json", series, marks)
    document = json.loads((tmp_path / "step.json").read_text())
    assert document["marks"] == [{"seconds": 2.0, "text": "8 clients"}]
    assert document["roles"]["prefill"]["desired"] == [1, 2, 2]
    assert document["roles"]["prefill"]["decisions"] == [
        {"seconds": 5.0, "text": "prefill 1 -> 2 (ForecastUp)"}
    ]
    with pytest.raises(ValueError, match="nothing to plot"):
        demo_plot.plot({}, tmp_path / "none.png", "nothing")


def test_the_clients_ttft_is_a_percentile_per_bucket_of_start_times() -> None:
    assert demo_plot.percentile([], 0.9) is None
    assert demo_plot.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert demo_plot.percentile([float(i) for i in range(1, 11)], 0.9) == 9.0  # nearest rank
    samples = [(0.5, 0.2), (3.0, 0.4), (9.9, 0.3), (25.0, 2.0), (29.0, 1.0)]
    seen = demo_plot.client_series(samples, 10.0, q=90)
    assert seen.seconds == (10.0, 20.0, 30.0)
    assert seen.ttft_ms == (pytest.approx(400.0), None, pytest.approx(2000.0))  # an empty bucket: no figure
    assert seen.counts == (3, 0, 2)
    # up to the recording's end, even past the last answer
    assert demo_plot.client_series(samples, 10.0, end=41.0).counts == (3, 0, 2, 0, 0)
    assert demo_plot.client_series([], 10.0).counts == (0,)
    with pytest.raises(ValueError, match="bucket_seconds"):
        demo_plot.client_series(samples, 0)
