"""What a scenario bought: goodput against SLOs, latency percentiles, GPU time; the table, JSON and plots.

Goodput counts requests that met BOTH targets: time to first token within the TTFT SLO, and time per output
token after the first (the request's mean inter-token latency, DistServe's TPOT) within the ITL SLO; a
one-token answer has no inter-token latency to miss. Rejected and failed requests count as missed. Goodput
here is per second of the trace's arrival span at the one offered rate, so scenarios on the same trace compare
directly; DistServe's goodput (the highest rate that holds the SLOs) is `search.goodput`, `--goodput` on the
CLI. The worst window is the lowest attainment among the requests arriving in any window (5 minutes by
default): what a peak does to a pool. GPU time is every replica from its creation (the scale-up decision: it
holds its GPUs while its model loads) to its removal, or to the last token of the run. Percentiles are
nearest-rank (the router's `percentile`), so a small case can be checked by hand.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inferencepool.sim.cluster import REJECTED, RequestRecord, ScenarioResult

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Slo:
    ttft_seconds: float
    itl_seconds: float

    def met(self, record: RequestRecord) -> bool:
        ttft = record.ttft
        return (
            record.completed
            and ttft is not None
            and ttft <= self.ttft_seconds
            and record.mean_itl <= self.itl_seconds
        )


@dataclass(frozen=True)
class Probe:
    speedup: float  # the trace replayed this many times faster
    requests_per_second: float
    attainment: float  # fraction of requests meeting both SLOs


@dataclass(frozen=True)
class Goodput:
    """DistServe goodput of one scenario, as `search.goodput` found it."""

    scenario: str
    gpus: int
    speedup: float  # the fastest replay found to hold the target (0: none did)
    requests_per_second: float
    probes: tuple[Probe, ...]

    @property
    def per_gpu(self) -> float:
        return self.requests_per_second / self.gpus if self.gpus else 0.0


@dataclass(frozen=True)
class Summary:
    scenario: str
    policy: str
    autoscaled: bool
    requests: int
    completed: int
    rejected: int
    failed: int
    good: int
    goodput_rps: float
    slo_attainment_percent: float
    ttft_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    gpu_seconds: float
    good_per_gpu_hour: float
    disaggregated_percent: float
    trace_seconds: float
    makespan_seconds: float
    engine_steps: int
    preemptions: int
    scaling_decisions: int
    final_threshold: int
    worst_window_percent: float | None = None
    goodput_ratio: float | None = None  # against the baseline of the same run (colocated, or static peak)
    gpu_seconds_ratio: float | None = None
    good_per_gpu_hour_ratio: float | None = None
    lent_percent: float = 0.0  # served whole on a prefill pod (role lending)


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """Nearest-rank, as the router's `percentile`, from one sort (an hour of gaps is millions of values)."""
    ordered = sorted(values)
    return {
        f"p{p}": (ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1] * 1000 if ordered else None)
        for p in PERCENTILES
    }


def worst_window(result: ScenarioResult, slo: Slo, window_seconds: float) -> float:
    """Lowest attainment (%) among the requests arriving in each window of the trace."""
    start = result.records[0].arrival
    met: dict[int, list[int]] = {}
    for record in result.records:
        counts = met.setdefault(int((record.arrival - start) // window_seconds), [0, 0])
        counts[0] += slo.met(record)
        counts[1] += 1
    return min(100 * good / total for good, total in met.values())


def summarize(result: ScenarioResult, slo: Slo, window_seconds: float = 300.0) -> Summary:
    records = result.records
    completed = [r for r in records if r.completed]
    good = sum(slo.met(r) for r in records)
    served = [r for r in records if r.route != REJECTED]
    disaggregated = sum(r.route == "disaggregated" for r in served)
    span = max(result.trace_span, 1e-9)
    hours = result.gpu_seconds / 3600
    return Summary(
        scenario=result.scenario.name,
        policy=result.scenario.policy,
        autoscaled=result.scenario.planner is not None,
        requests=len(records),
        completed=len(completed),
        rejected=sum(r.route == REJECTED for r in records),
        failed=sum(r.error is not None and r.route != REJECTED for r in records),
        good=good,
        goodput_rps=good / span,
        slo_attainment_percent=100 * good / len(records),
        ttft_ms=_percentiles([r.ttft for r in completed if r.ttft is not None]),
        itl_ms=_percentiles(result.itl_gaps),
        gpu_seconds=result.gpu_seconds,
        good_per_gpu_hour=good / hours if hours else 0.0,
        disaggregated_percent=100 * disaggregated / len(served) if served else 0.0,
        lent_percent=100 * sum(r.route == "lent" for r in served) / len(served) if served else 0.0,
        trace_seconds=result.trace_span,
        makespan_seconds=result.makespan,
        engine_steps=result.engine_steps,
        preemptions=result.preemptions,
        scaling_decisions=len(result.scaling),
        final_threshold=result.thresholds[-1][1],
        worst_window_percent=worst_window(result, slo, window_seconds),
    )


def with_ratios(summaries: Sequence[Summary], baseline: str) -> list[Summary]:
    """Each summary with its ratios against the named baseline (None where the baseline has zero)."""
    base = next((s for s in summaries if s.scenario == baseline), None)
    if base is None:
        return list(summaries)

    def ratio(value: float, reference: float) -> float | None:
        return value / reference if reference else None

    return [
        Summary(
            **{
                **asdict(s),
                "goodput_ratio": ratio(s.goodput_rps, base.goodput_rps),
                "gpu_seconds_ratio": ratio(s.gpu_seconds, base.gpu_seconds),
                "good_per_gpu_hour_ratio": ratio(s.good_per_gpu_hour, base.good_per_gpu_hour),
            }
        )
        for s in summaries
    ]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(summaries: Sequence[Summary], baseline: str = "coloc") -> str:
    versus = f"vs {baseline}"
    header: tuple[str, ...] = (
        "scenario",
        "goodput r/s",
        versus,
        "SLO %",
        "worst 5m %",
        "TTFT p50/p90/p99 ms",
        "ITL p50/p90/p99 ms",
        "GPU-h",
        versus,
        "good/GPU-h",
        versus,
        "disagg %",
    )
    rows: list[tuple[str, ...]] = [
        (
            s.scenario,
            f"{s.goodput_rps:.2f}",
            _x(s.goodput_ratio),
            f"{s.slo_attainment_percent:.1f}",
            "-" if s.worst_window_percent is None else f"{s.worst_window_percent:.1f}",
            "/".join(_ms(s.ttft_ms[f"p{p}"]) for p in PERCENTILES),
            "/".join(_ms(s.itl_ms[f"p{p}"]) for p in PERCENTILES),
            f"{s.gpu_seconds / 3600:.3f}",
            _x(s.gpu_seconds_ratio),
            f"{s.good_per_gpu_hour:.0f}",
            _x(s.good_per_gpu_hour_ratio),
            f"{s.disaggregated_percent:.0f}",
        )
        for s in summaries
    ]
    if any(s.lent_percent for s in summaries):  # role lending: how much the prefill pods served whole
        header = (*header, "lent %")
        rows = [(*row, f"{s.lent_percent:.0f}") for row, s in zip(rows, summaries, strict=True)]
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    lines = [
        "  ".join(
            str(cell).ljust(w) if i == 0 else str(cell).rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in (header, *rows)
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def to_json(
    summaries: Sequence[Summary], results: Sequence[ScenarioResult], settings: dict[str, Any]
) -> dict[str, Any]:
    by_name = {r.scenario.name: r for r in results}
    return {
        "settings": settings,
        "scenarios": [
            {
                **asdict(s),
                "replicas": [
                    {
                        "time": t,
                        "prefillReady": pr,
                        "prefillDesired": pd,
                        "decodeReady": dr,
                        "decodeDesired": dd,
                    }
                    for t, pr, pd, dr, dd in by_name[s.scenario].replicas
                ],
                "thresholds": [{"time": t, "tokens": v} for t, v in by_name[s.scenario].thresholds],
                "scaling": [asdict(e) for e in by_name[s.scenario].scaling],
            }
            for s in summaries
        ],
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n")


def plot(results: Sequence[ScenarioResult], summaries: Sequence[Summary], slo: Slo, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []

    fig, (ttft_ax, itl_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for result in results:
        ttfts = sorted(r.ttft for r in result.records if r.completed and r.ttft is not None)
        gaps = sorted(result.itl_gaps)
        for axis, values in ((ttft_ax, ttfts), (itl_ax, gaps)):
            if values:
                step = max(1, len(values) // 2000)  # a few thousand points draw the same curve
                xs = [v * 1000 for v in values[::step]]
                ys = [(i * step + 1) / len(values) for i in range(len(xs))]
                axis.plot(xs, ys, label=result.scenario.name)
    ttft_ax.axvline(slo.ttft_seconds * 1000, color="grey", linestyle="--", label="SLO")
    itl_ax.axvline(slo.itl_seconds * 1000, color="grey", linestyle="--", label="SLO")
    for axis, title in ((ttft_ax, "time to first token"), (itl_ax, "inter-token latency (every gap)")):
        axis.set_xscale("log")
        axis.set_xlabel("milliseconds")
        axis.set_ylabel("fraction")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "latency_cdf.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axis = plt.subplots(figsize=(8, 4))
    names = [s.scenario for s in summaries]
    axis.bar(names, [s.goodput_rps for s in summaries], color="tab:blue")
    axis.set_ylabel("goodput (requests/s meeting TTFT and ITL SLOs)")
    axis.set_title(
        f"goodput (TTFT <= {slo.ttft_seconds * 1000:.0f} ms, ITL <= {slo.itl_seconds * 1000:.0f} ms)"
    )
    axis.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    written.append(out / "goodput.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    scaled = [r for r in results if r.scenario.planner is not None]
    if scaled:
        fig, axes = plt.subplots(len(scaled), 1, figsize=(10, 3.5 * len(scaled)), squeeze=False)
        for axis, result in zip(axes[:, 0], scaled, strict=True):
            end = result.makespan
            times = [entry[0] for entry in result.replicas] + [end]
            for column, label, style in (
                (2, "prefill desired", "--"),
                (1, "prefill ready", "-"),
                (4, "decode desired", "--"),
                (3, "decode ready", "-"),
            ):
                values = [entry[column] for entry in result.replicas]
                axis.step(times, [*values, values[-1]], where="post", linestyle=style, label=label)
            arrivals = [r.arrival for r in result.records]
            load = axis.twinx()
            load.hist(arrivals, bins=max(10, int(end // 10)), color="grey", alpha=0.2)
            load.set_ylabel("arrivals per bin")
            axis.set_xlabel("virtual seconds")
            axis.set_ylabel("replicas")
            axis.set_title(f"{result.scenario.name}: replicas per pool")
            axis.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        written.append(out / "replicas.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def goodput_table(found: Sequence[Goodput]) -> str:
    """DistServe goodput per scenario, with the ratio per GPU against the best of colocated (vLLM's default
    chunk, or colocated-tuned's chunk for the ITL target, when run) and AlwaysDisaggregate (static-pd at any
    split searched) found in the same run."""
    bases = [
        g.per_gpu
        for g in found
        if g.scenario in ("colocated", "colocated-tuned", "static-pd") or g.scenario.startswith("static-pd ")
    ]
    base = max(bases, default=0.0)
    header = ("scenario", "GPUs", "speed-up", "goodput r/s", "per GPU", "vs best of coloc/P-D")
    rows = [
        (
            g.scenario,
            str(g.gpus),
            f"{g.speedup:.3g}x",
            f"{g.requests_per_second:.2f}",
            f"{g.per_gpu:.2f}",
            _x(g.per_gpu / base if base else None),
        )
        for g in found
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in (header, *rows)
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def goodput_json(found: Sequence[Goodput], settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "settings": settings,
        "goodput": [{**asdict(g), "perGpu": g.per_gpu} for g in found],
    }
