"""The demo's load-step record: pool status sampled over time, as series per role, and its plot.

Pure except `plot` (which writes a PNG with matplotlib): `sample_from_status` reads what the operator wrote
into status (observed latency percentile and target, desired and ready replicas, the last scaling decision),
`build_series` turns a list of samples into one series per role, gaps where a figure was not there yet.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROLES = ("prefill", "decode")
METRIC = {"prefill": "TTFT", "decode": "ITL"}


@dataclass(frozen=True)
class RoleSample:
    desired: int
    ready: int
    observed_ms: int | None  # the target percentile over the autoscaler's window; None before a reading
    target_ms: int | None
    percentile: int | None
    last_scaling: str | None  # "1 -> 2 (ForecastUp)" at a decision's time, to tell decisions apart


@dataclass(frozen=True)
class StatusSample:
    seconds: float  # since the recording started
    roles: Mapping[str, RoleSample]


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def sample_from_status(seconds: float, status: Mapping[str, Any]) -> StatusSample:
    """One sample of a pool's status (the `status` object of an InferencePool); roles absent from it are
    left out, missing figures are None (replica counts 0)."""
    roles: dict[str, RoleSample] = {}
    for role in ROLES:
        figures = status.get(role)
        if not isinstance(figures, Mapping):
            continue
        last = figures.get("lastScaling")
        decision = None
        if isinstance(last, Mapping):
            decision = f"{last.get('fromReplicas')} -> {last.get('replicas')} ({last.get('reason')})"
            decision += f" at {last.get('time')}"
        roles[role] = RoleSample(
            desired=_int(figures.get("desiredReplicas")) or 0,
            ready=_int(figures.get("readyReplicas")) or 0,
            observed_ms=_int(figures.get("observedMilliseconds")),
            target_ms=_int(figures.get("targetMilliseconds")),
            percentile=_int(figures.get("percentile")),
            last_scaling=decision,
        )
    return StatusSample(seconds, roles)


@dataclass(frozen=True)
class Decision:
    seconds: float
    text: str  # "prefill 1 -> 2 (ForecastUp)"


@dataclass(frozen=True)
class RoleSeries:
    role: str
    metric: str  # TTFT or ITL
    percentile: int | None
    target_ms: int | None  # the latest target seen (the spec's)
    seconds: tuple[float, ...]
    observed_ms: tuple[int | None, ...]
    desired: tuple[int, ...]
    ready: tuple[int, ...]
    decisions: tuple[Decision, ...]  # each new lastScaling, at the first sample that showed it

    def over_target(self) -> tuple[bool | None, ...]:
        """Per sample, whether the observed percentile was over the target (None: not known)."""
        if self.target_ms is None:
            return tuple(None for _ in self.observed_ms)
        return tuple(None if o is None else o > self.target_ms for o in self.observed_ms)


def build_series(samples: Sequence[StatusSample]) -> dict[str, RoleSeries]:
    """One series per role present in any sample, over the samples where the role is in status; decisions
    are the changes of lastScaling after the first sample (the one there at the start is history)."""
    series: dict[str, RoleSeries] = {}
    for role in ROLES:
        seen = [(s.seconds, s.roles[role]) for s in samples if role in s.roles]
        if not seen:
            continue
        decisions: list[Decision] = []
        previous = seen[0][1].last_scaling
        for seconds, sample in seen[1:]:
            if sample.last_scaling is not None and sample.last_scaling != previous:
                decisions.append(Decision(seconds, f"{role} {sample.last_scaling.split(' at ')[0]}"))
            previous = sample.last_scaling
        targets = [r.target_ms for _, r in seen if r.target_ms is not None]
        percentiles = [r.percentile for _, r in seen if r.percentile is not None]
        series[role] = RoleSeries(
            role=role,
            metric=METRIC[role],
            percentile=percentiles[-1] if percentiles else None,
            target_ms=targets[-1] if targets else None,
            seconds=tuple(t for t, _ in seen),
            observed_ms=tuple(r.observed_ms for _, r in seen),
            desired=tuple(r.desired for _, r in seen),
            ready=tuple(r.ready for _, r in seen),
            decisions=tuple(decisions),
        )
    return series


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank q-quantile (0 < q <= 1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@dataclass(frozen=True)
class ClientSeries:
    """What the clients saw: the q-quantile of their TTFT per bucket of request start times."""

    percentile: int
    bucket_seconds: float
    seconds: tuple[float, ...]  # each bucket's end
    ttft_ms: tuple[float | None, ...]
    counts: tuple[int, ...]


def client_series(
    ttfts: Sequence[tuple[float, float]], bucket_seconds: float, q: int = 90, end: float | None = None
) -> ClientSeries:
    """(start seconds, TTFT seconds) samples in buckets of `bucket_seconds` from 0 to `end` (the last
    sample by default); an empty bucket has no figure."""
    if bucket_seconds <= 0:
        raise ValueError("bucket_seconds must be > 0")
    last = max((t for t, _ in ttfts), default=0.0) if end is None else end
    buckets = max(1, math.ceil(last / bucket_seconds))
    grouped: list[list[float]] = [[] for _ in range(buckets)]
    for started, ttft in ttfts:
        grouped[min(buckets - 1, max(0, int(started // bucket_seconds)))].append(ttft * 1000)
    return ClientSeries(
        percentile=q,
        bucket_seconds=bucket_seconds,
        seconds=tuple((i + 1) * bucket_seconds for i in range(buckets)),
        ttft_ms=tuple(percentile(values, q / 100) for values in grouped),
        counts=tuple(len(values) for values in grouped),
    )


def series_document(
    series: Mapping[str, RoleSeries], marks: Sequence[Decision] = (), clients: ClientSeries | None = None
) -> dict[str, Any]:
    """The series as JSON-ready data (written next to the plot)."""
    return {
        "marks": [asdict(m) for m in marks],
        "roles": {role: asdict(s) for role, s in series.items()},
        "clients": None if clients is None else asdict(clients),
    }


def write_json(
    path: Path,
    series: Mapping[str, RoleSeries],
    marks: Sequence[Decision] = (),
    clients: ClientSeries | None = None,
) -> None:
    path.write_text(json.dumps(series_document(series, marks, clients), indent=2) + "\n")


def plot(
    series: Mapping[str, RoleSeries],
    path: Path,
    title: str,
    marks: Sequence[Decision] = (),
    clients: ClientSeries | None = None,
) -> Path:
    """One panel per role: the observed percentile against its target (left axis, ms), desired and ready
    replicas (right axis, steps), the planner's decisions and `marks` (the load step) as vertical lines; on
    the prefill panel also the clients' own TTFT (end to end, through the router), when given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roles = [series[role] for role in ROLES if role in series]
    if not roles:
        raise ValueError("no role in the samples: nothing to plot")
    fig, axes = plt.subplots(len(roles), 1, figsize=(10, 3.6 * len(roles)), sharex=True, squeeze=False)
    for axis, role in zip(axes[:, 0], roles, strict=True):
        observed = [float("nan") if v is None else v for v in role.observed_ms]
        label = f"p{role.percentile} {role.metric}" if role.percentile else role.metric
        # status holds a reading until the next one: steps, not lines between samples
        axis.step(role.seconds, observed, where="post", color="tab:blue", label=f"observed {label}")
        if clients is not None and role.role == "prefill":
            axis.plot(
                list(clients.seconds),  # at each bucket's end: what was seen by then
                [float("nan") if v is None else v for v in clients.ttft_ms],
                marker=".",
                color="grey",
                label=f"clients' p{clients.percentile} TTFT per {clients.bucket_seconds:.0f} s (end to end)",
            )
        if role.target_ms is not None:
            axis.axhline(role.target_ms, color="tab:red", linestyle="--", label=f"target {role.target_ms} ms")
        axis.set_ylabel(f"{role.metric} (ms)")
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        replicas = axis.twinx()
        replicas.step(
            role.seconds, role.ready, where="post", color="tab:green", linewidth=4, alpha=0.35, label="ready"
        )
        replicas.step(
            role.seconds, role.desired, where="post", color="tab:green", linestyle="--", label="desired"
        )
        replicas.set_ylabel("replicas")
        replicas.set_ylim(0, max([*role.desired, *role.ready, 1]) + 1)
        replicas.yaxis.get_major_locator().set_params(integer=True)
        for mark in marks:
            axis.axvline(mark.seconds, color="grey", linestyle=":")
            axis.annotate(
                mark.text,
                (mark.seconds, 0),
                xycoords=("data", "axes fraction"),
                xytext=(3, 3),
                textcoords="offset points",
                fontsize=8,
            )
        for decision in role.decisions:
            axis.axvline(decision.seconds, color="tab:purple", alpha=0.6)
            axis.annotate(
                decision.text,
                (decision.seconds, 0.5),
                xycoords=("data", "axes fraction"),
                xytext=(3, 0),
                textcoords="offset points",
                rotation=90,
                va="center",
                fontsize=8,
                color="tab:purple",
            )
        lines = axis.get_legend_handles_labels()
        more = replicas.get_legend_handles_labels()
        axis.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
        axis.set_title(f"{role.role}: {label} against its target, replicas")
    axes[-1, 0].set_xlabel("seconds since the recording began")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
