"""`inferencepool bench router`: the arithmetic of its report (no timing is asserted)."""

from __future__ import annotations

import os

from inferencepool.bench.router import RunResult, cpu_seconds, report


def run(target: str, ttft: float, rps_requests: int, cpu: float | None = None) -> RunResult:
    return RunResult(target, 32, requests=rps_requests, seconds=1.0, ttft_ms=[ttft] * 10, cpu_seconds=cpu)


def test_report_subtracts_the_matching_baseline_and_compares_routers() -> None:
    results = [
        run("direct", 10.0, 100),
        run("direct-pd", 20.0, 80),
        run("router-pd", 25.0, 60, cpu=0.12),
        run("vllm-router-pd", 24.0, 50, cpu=0.08),
    ]
    summary = report(results)
    rows = {row["target"]: row for row in summary["rows"]}
    assert rows["router-pd"]["added_p50_ms"] == 5.0 and rows["vllm-router-pd"]["added_p50_ms"] == 4.0
    assert rows["router-pd"]["cpu_ms_per_request"] == 2.0
    assert "direct" not in {k for k, v in rows.items() if "added_p50_ms" in v}
    (line,) = summary["ratios"]
    assert "CPU/req 2.000 vs 1.600 ms (x1.25)" in line and "req/s x1.20" in line


def test_cpu_seconds_reads_this_process() -> None:
    before = cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert cpu_seconds(os.getpid()) > before
