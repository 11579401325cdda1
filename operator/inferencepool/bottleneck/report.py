"""The diagnosis as a readable text report (pure): verdict, latencies, evidence, advice, a text histogram of
prompt lengths, and the what-if table."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

from inferencepool.autoscaler.histogram import Histogram
from inferencepool.bottleneck.core import Diagnosis, Latency, WhatIfRow
from inferencepool.bottleneck.settings import PoolSettings

BAR_WIDTH = 40
WIDTH = 110


def _item(marker: str, text: str) -> list[str]:
    """A list item wrapped to the report's width, continuation lines under its text."""
    return textwrap.wrap(text, WIDTH, initial_indent=marker, subsequent_indent=" " * len(marker))


# What the what-if would need from the router to replay the traffic as it is rather than as a sketch.
ROUTER_WISHES = (
    "a joint prompt x output length histogram (output lengths are drawn independently of prompt lengths "
    "from the decode engines' mean today)",
    "a prefix-reuse rate measured where requests arrive (the engines' hit rate only counts reuse that the "
    "caches kept)",
)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}"


def _tokens(value: float) -> str:
    if math.isinf(value):
        return "+Inf"
    return f"{value / 1024:.0f}K" if value >= 1024 and value % 1024 == 0 else f"{value:.0f}"


def prompt_histogram(prompt: Histogram, threshold: int | None = None, width: int = BAR_WIDTH) -> list[str]:
    """One line per bucket: range, bar, count; the bucket holding the threshold is marked."""
    rows: list[tuple[str, float, bool]] = []
    lower, previous = 0.0, 0.0
    for bound, cumulative in zip(prompt.bounds, prompt.counts, strict=True):
        count = cumulative - previous
        label = f"{_tokens(lower)}-{_tokens(bound)}" if not math.isinf(bound) else f">{_tokens(lower)}"
        holds = threshold is not None and lower < threshold <= bound
        rows.append((label, count, holds))
        lower, previous = bound, cumulative
    # drop empty buckets at both ends
    while rows and rows[-1][1] == 0 and not rows[-1][2]:
        rows.pop()
    start = next((i for i, row in enumerate(rows) if row[1] > 0 or row[2]), len(rows))
    rows = rows[start:]
    peak = max((count for _, count, _ in rows), default=0.0)
    label_width = max((len(label) for label, _, _ in rows), default=0)
    lines = []
    for label, count, holds in rows:
        bar = "#" * (round(width * count / peak) if peak else 0)
        if count and not bar:
            bar = "."
        mark = f"  <- threshold {threshold}" if holds else ""
        lines.append(f"  {label:>{label_width}} tokens |{bar:<{width}} {count:.0f}{mark}")
    return lines


def _latency_rows(latencies: Sequence[Latency], percentile: int) -> list[str]:
    header = f"  {'':12} {'measured at':34} {'p50':>7} {'p90':>7} {'p99':>7} {'target':>8} {'count':>7}"
    lines = [header]
    for line in latencies:
        figures = line.figures
        target = f"{_ms(line.target)}" if line.target is not None else "-"
        lines.append(
            f"  {line.metric:12} {line.where:34} {_ms(figures.p50):>7} {_ms(figures.p90):>7} "
            f"{_ms(figures.p99):>7} {target:>8} {figures.count:>7.0f}"
        )
    lines.append(f"  (milliseconds; targets are held at p{percentile})")
    return lines


def what_if_table(rows: Sequence[WhatIfRow], recommended: int | None = None) -> list[str]:
    lines = [
        f"  {'scenario':13} {'policy':19} {'P+D':>5} {'threshold':>9} {'goodput r/s':>11} {'SLO %':>6} "
        f"{'TTFT p90':>8} {'ITL p90':>8} {'disagg %':>8}"
    ]
    base = next((r.goodput_rps for r in rows if r.scenario == "current"), None)
    for row in rows:
        engines = f"{row.prefill_replicas}+{row.decode_replicas}"
        threshold = str(row.threshold_tokens) if row.threshold_tokens is not None else "-"
        ratio = f" ({row.goodput_rps / base:.2f}x)" if base and row.scenario != "current" else ""
        if row.scenario == "threshold" and row.threshold_tokens == recommended:
            ratio += "  <- recommended"
        lines.append(
            f"  {row.scenario:13} {row.policy:19} {engines:>5} {threshold:>9} {row.goodput_rps:>11.2f} "
            f"{row.slo_attainment_percent:>6.1f} {_ms(row.ttft_p90_ms and row.ttft_p90_ms / 1000):>8} "
            f"{_ms(row.itl_p90_ms and row.itl_p90_ms / 1000):>8} {row.disaggregated_percent:>8.0f}{ratio}"
        )
    return lines


def render(
    pool: str,
    diagnosis: Diagnosis,
    settings: PoolSettings,
    seconds: float,
    what_if: Sequence[WhatIfRow] | None = None,
    what_if_note: str = "",
) -> str:
    t = diagnosis.traffic
    layout = (
        f"{settings.prefill_replicas} prefill + {settings.decode_replicas} decode engines, "
        f"{settings.policy}, threshold {settings.threshold_tokens}"
        if settings.disaggregated
        else f"{settings.decode_replicas} engines, Colocated"
    )
    lines = [
        f"pool {pool}: bottleneck {diagnosis.verdict} ({diagnosis.reason}): {diagnosis.summary}",
        f"window {seconds:.0f} s: {t.requests:.0f} requests ({t.rate:.2f}/s); {layout}",
        "",
        "latency",
        *_latency_rows(diagnosis.latencies, settings.percentile),
        *_item("  ", diagnosis.itl_definition),
        "",
        "evidence",
        *(wrapped for line in diagnosis.evidence for wrapped in _item("  - ", line)),
        "",
        "advice",
        *(
            wrapped
            for n, advice in enumerate(diagnosis.advice, start=1)
            for wrapped in _item(f"  {n}. ", advice.text)
        ),
    ]
    if diagnosis.notes:
        lines += ["", "notes", *(wrapped for note in diagnosis.notes for wrapped in _item("  - ", note))]
    if t.prompt is not None and t.prompt.count:
        lines += ["", "prompt lengths (router-counted tokens, requests per bucket)"]
        lines += prompt_histogram(t.prompt, settings.threshold_tokens if settings.disaggregated else None)
    if what_if is not None:
        lines += ["", f"what-if: this window's traffic replayed in the simulator {what_if_note}".rstrip()]
        if what_if:
            lines += what_if_table(what_if, diagnosis.recommended_threshold)
            lines += _item(
                "  ",
                "goodput: requests/s meeting both targets (TTFT, and each request's mean ITL: TPOT); the "
                "sketch draws output lengths independently of prompt lengths",
            )
        else:
            lines.append("  no sketch: the window has no router prompt histogram or no decoded tokens")
        lines.append("  the router should add, for a faithful replay:")
        lines += [wrapped for wish in ROUTER_WISHES for wrapped in _item("    - ", wish)]
    return "\n".join(lines) + "\n"
