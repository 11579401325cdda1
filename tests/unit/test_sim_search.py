"""Synthetic loads from real length distributions, DistServe goodput by search, the best P:D split and the
static-peak pool."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from inferencepool.cli import main
from inferencepool.perf.profiles import get_profile
from inferencepool.sim import search, workload
from inferencepool.sim.cluster import Scenario
from inferencepool.sim.report import Goodput, Slo, goodput_table
from inferencepool.sim.workload import TraceRequest

H100 = get_profile("llama-3.1-8b-h100")


def test_diurnal_load_follows_the_cosine_and_draws_real_pairs() -> None:
    source = [TraceRequest(0, 100 * (i + 1), i + 1) for i in range(10)]
    load = workload.diurnal(source, duration=3600, mean_rate=5, swing=0.8, seed=1)
    assert abs(len(load) - 5 * 3600) < 4 * math.sqrt(5 * 3600)
    quarter = [sum(1 for r in load if q * 900 <= r.arrival < (q + 1) * 900) for q in range(4)]
    assert quarter[1] > 2 * quarter[0] and quarter[2] > 2 * quarter[3]  # busiest in the middle
    pairs = {(r.prompt_tokens, r.output_tokens) for r in source}
    assert {(r.prompt_tokens, r.output_tokens) for r in load} <= pairs
    assert load == workload.diurnal(source, duration=3600, mean_rate=5, swing=0.8, seed=1)  # seeded
    with pytest.raises(ValueError, match="0 <= swing < 1"):
        workload.diurnal(source, duration=10, mean_rate=1, swing=1)


def test_bursty_load_has_bursts_at_the_burst_rate() -> None:
    source = [TraceRequest(0, 500, 10)]
    load = workload.bursty(
        source, duration=3600, base_rate=1, burst_rate=20, burst_seconds=30, mean_gap_seconds=300, seed=3
    )
    per_10s = [sum(1 for r in load if s <= r.arrival < s + 10) for s in range(0, 3600, 10)]
    assert max(per_10s) > 120 and sorted(per_10s)[len(per_10s) // 2] < 25
    with pytest.raises(ValueError, match="burst_rate >= base_rate"):
        workload.bursty(source, duration=10, base_rate=2, burst_rate=1)


def test_superpose_multiplies_the_load_and_keeps_copies_apart() -> None:
    trace = [TraceRequest(0.0, 1024, 1, (1, 2)), TraceRequest(10.0, 1024, 1, (1, 3))]
    merged = workload.superpose(trace, 3, shift_seconds=1.0)
    assert [r.arrival for r in merged] == [0.0, 1.0, 2.0, 10.0]  # shifted past the span (11, 12): cut
    blocks = [r.block_ids[0] for r in merged if r.arrival < 5]
    assert len(set(blocks)) == 3  # each copy has block ids of its own


def test_goodput_search_brackets_the_rate_where_attainment_crosses_the_target() -> None:
    trace = [TraceRequest(i * 0.5, 2000, 50) for i in range(60)]
    slo = Slo(0.8, 0.04)
    found = search.goodput(Scenario("co", "Colocated", 0, 1), H100, trace, slo, bisections=3)
    assert found.speedup > 1 and found.gpus == 1 and found.per_gpu == found.requests_per_second
    held = [p for p in found.probes if p.attainment >= 0.9]
    failed = [p for p in found.probes if p.attainment < 0.9]
    assert held and failed
    assert max(p.speedup for p in held) == found.speedup
    # the rate found holds and the next probe above it does not (resolution: the last bisection step)
    above = min(p.speedup for p in failed if p.speedup > found.speedup)
    assert above - found.speedup <= found.speedup / 2
    assert found.requests_per_second == pytest.approx(found.speedup * 60 / 29.5)


def test_best_split_and_static_sizes() -> None:
    trace = [TraceRequest(i * 0.1, 6000 if i % 3 == 0 else 800, 40) for i in range(150)]
    slo = Slo(0.8, 0.04)

    def layout(prefill: int, decode: int) -> Scenario:
        if prefill == 0:
            return Scenario(f"co {decode}", "Colocated", 0, decode)
        return Scenario(f"la {prefill}:{decode}", "LengthAware", prefill, decode, 4096)

    best, every = search.best_split(layout, 3, H100, trace, slo)
    assert [g.scenario for g in every] == ["la 1:2", "la 2:1"]
    assert best.requests_per_second == max(g.requests_per_second for g in every)
    peak, smallest, tried = search.static_sizes(layout, H100, trace, slo, window_seconds=5, max_replicas=4)
    assert peak is not None and smallest is not None
    assert peak.worst_window >= 0.9 and smallest.attainment >= 0.9
    assert smallest.prefill + smallest.decode <= peak.prefill + peak.decode
    # nothing smaller than the peak layout held every window
    size = peak.prefill + peak.decode
    assert all(t.worst_window < 0.9 for t in tried if t.prefill + t.decode < size)


def test_a_focused_static_peak_search_is_checked_on_the_whole_trace() -> None:
    """The busiest window by tokens is not always the hardest: here it is one request with a long answer
    (easy for one pod), and a later window of eight 6,000-token prompts at once misses TTFT on one pod.
    The layout found on the slice must hold on the whole trace, or the search goes on there."""
    trace = [TraceRequest(0.0, 100, 3000)]  # 60k "tokens" by the slice's measure, one stream
    trace += [TraceRequest(30.0 + 0.01 * i, 6000, 1) for i in range(8)]  # 48k, a TTFT burst
    slo = Slo(0.8, 0.04)

    def layout(prefill: int, decode: int) -> Scenario:
        if prefill == 0:
            return Scenario(f"co {decode}", "Colocated", 0, decode)
        return Scenario(f"la {prefill}:{decode}", "LengthAware", prefill, decode, 4096)

    assert search.peak_slice(trace, 10, 0)[0].output_tokens == 3000  # the slice is the long answer alone
    peak, smallest, tried = search.static_sizes(
        layout, H100, trace, slo, window_seconds=10, max_replicas=4, focus_seconds=0
    )
    assert peak is not None and smallest is None
    assert len(peak.result.records) == len(trace)  # a whole-trace result, not the slice's
    assert peak.worst_window >= 0.9 and peak.prefill + peak.decode > 1
    assert any(t.prefill + t.decode == 1 and t.worst_window < 0.9 for t in tried)  # one pod failed the burst


def test_peak_slice_is_the_busiest_window_and_what_came_before() -> None:
    trace = [TraceRequest(float(t), 100, 10) for t in range(0, 900, 10)]
    trace += [TraceRequest(600 + i * 0.5, 100, 10) for i in range(100)]  # busy from 600 to 650
    trace.sort(key=lambda r: r.arrival)
    sliced = search.peak_slice(trace, window_seconds=300, before_seconds=120)
    assert sliced[0].arrival == 0.0 and sliced[-1].arrival < 420  # 480..900 re-based to 0..420
    assert len(sliced) == len([r for r in trace if 480 <= r.arrival < 900])


def test_cli_goodput_and_static_peak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gp"
    args = ["sim", "--max-requests", "60", "--replicas", "2", "--out", str(out), "--no-plots"]
    assert main([*args, "--goodput", "--splits", "--scenarios", "colocated,static-pd,planner"]) == 0
    printed = capsys.readouterr()
    assert "planner: skipped" in printed.err and "vs best of coloc/P-D" in printed.out
    document = json.loads((out / "goodput.json").read_text())
    assert [g["scenario"] for g in document["goodput"]] == ["colocated", "static-pd"]  # 1:1 is the only split
    assert main([*args, "--scenarios", "static-peak,planner", "--load", "diurnal", "--duration", "120"]) == 0
    printed = capsys.readouterr()
    assert "static-peak " in printed.out and "vs peak" in printed.out and "static 0P+1D" in printed.err


def test_goodput_ratios_are_against_the_best_colocated_or_always_disaggregated_pool() -> None:
    found = [
        Goodput("colocated", 4, 1.0, 4.0, ()),
        Goodput("colocated-tuned", 4, 2.0, 8.0, ()),  # its chunk for the ITL target: the baseline here
        Goodput("static-pd 1P:3D", 4, 1.5, 6.0, ()),
        Goodput("deployed", 4, 3.0, 12.0, ()),
        Goodput("planner", 4, 4.0, 16.0, ()),  # not a baseline
    ]
    rows = {line.split()[0]: line.split()[-1] for line in goodput_table(found).splitlines()[2:]}
    assert rows == {
        "colocated": "0.50x",
        "colocated-tuned": "1.00x",
        "static-pd": "0.75x",
        "deployed": "1.50x",
        "planner": "2.00x",
    }
