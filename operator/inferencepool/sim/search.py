"""Searches over simulations: DistServe goodput, the best P:D split, the static-peak pool.

Goodput as DistServe defines it: the highest request rate at which at least `target` of the requests meet
both the TTFT and the ITL (time per output token) SLO. The trace is replayed x times faster: x doubles (or
halves) until attainment crosses the target, then bisects between the last rate that held and the first that
did not. Real traces are bursty, so attainment is not strictly monotone in x; the search reports the rate it
found and every probe it made, so a reader can see the curve. Per GPU divides by the layout's GPUs.

Static peak: the smallest fixed layout (prefill replicas : decode replicas, prefill 0 meaning a colocated
pool) that holds `target` attainment in every window of the trace (5 minutes by default), i.e. sized for the
peak, as an operator without autoscaling would size it. Static min is the smallest layout whose attainment
over the whole trace reaches the target: an oracle that knows the trace and accepts missing the peak.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from inferencepool.perf.profiles import EngineProfile
from inferencepool.sim.cluster import Scenario, ScenarioResult, simulate
from inferencepool.sim.report import Goodput, Probe, Slo
from inferencepool.sim.workload import TraceRequest, shape


def attainment(result: ScenarioResult, slo: Slo) -> float:
    return sum(slo.met(r) for r in result.records) / len(result.records)


def window_attainment(result: ScenarioResult, slo: Slo, window_seconds: float) -> list[float]:
    """Attainment of the requests arriving in each window of the trace (windows with no arrival skipped)."""
    start = result.records[0].arrival
    met: dict[int, list[int]] = {}
    for record in result.records:
        counts = met.setdefault(int((record.arrival - start) // window_seconds), [0, 0])
        counts[0] += slo.met(record)
        counts[1] += 1
    return [good / total for _, (good, total) in sorted(met.items())]


def gpus(scenario: Scenario, profile: EngineProfile) -> int:
    return (scenario.prefill_replicas + scenario.decode_replicas) * profile.tensor_parallel


def _rate(trace: Sequence[TraceRequest]) -> float:
    span = max(trace[-1].arrival - trace[0].arrival, 1e-9)
    return len(trace) / span


def goodput(
    scenario: Scenario,
    profile: EngineProfile,
    trace: Sequence[TraceRequest],
    slo: Slo,
    *,
    target: float = 0.9,
    start: float = 1.0,
    bisections: int = 4,
    max_doublings: int = 8,
    kv_link_bytes_per_s: float | None = None,
) -> Goodput:
    if not 0 < target <= 1:
        raise ValueError(f"target attainment must be within (0, 1], got {target}")
    base = _rate(trace)
    probes: list[Probe] = []

    def holds(speedup: float) -> bool:
        replay = shape(trace, rate=speedup)
        result = simulate(scenario, profile, replay, kv_link_bytes_per_s=kv_link_bytes_per_s)
        share = attainment(result, slo)
        probes.append(Probe(speedup, base * speedup, share))
        return share >= target

    low, high = 0.0, math.inf
    x = start
    if holds(x):
        low = x
        for _ in range(max_doublings):
            x *= 2
            if not holds(x):
                high = x
                break
            low = x
    else:
        high = x
        for _ in range(max_doublings):
            x /= 2
            if holds(x):
                low = x
                break
            high = x
    if low > 0 and math.isfinite(high):
        for _ in range(bisections):
            middle = (low + high) / 2
            if holds(middle):
                low = middle
            else:
                high = middle
    probes.sort(key=lambda p: p.speedup)
    return Goodput(scenario.name, gpus(scenario, profile), low, base * low, tuple(probes))


def best_split(
    layout: Callable[[int, int], Scenario],
    total_replicas: int,
    profile: EngineProfile,
    trace: Sequence[TraceRequest],
    slo: Slo,
    *,
    target: float = 0.9,
    kv_link_bytes_per_s: float | None = None,
) -> tuple[Goodput, list[Goodput]]:
    """Goodput of layout(prefill, decode) for every split of `total_replicas` with one replica or more per
    pool; the best first, then all of them by prefill count."""
    if total_replicas < 2:
        raise ValueError("a P:D split needs at least 2 replicas")
    every = [
        goodput(
            layout(p, total_replicas - p),
            profile,
            trace,
            slo,
            target=target,
            kv_link_bytes_per_s=kv_link_bytes_per_s,
        )
        for p in range(1, total_replicas)
    ]
    return max(every, key=lambda g: g.requests_per_second), every


@dataclass(frozen=True)
class Sized:
    """One static layout tried by the static-peak search."""

    prefill: int
    decode: int
    attainment: float
    worst_window: float
    gpu_seconds: float
    result: ScenarioResult


def static_sizes(
    layout: Callable[[int, int], Scenario],
    profile: EngineProfile,
    trace: Sequence[TraceRequest],
    slo: Slo,
    *,
    target: float = 0.9,
    window_seconds: float = 300.0,
    max_replicas: int = 16,
    kv_link_bytes_per_s: float | None = None,
    focus_seconds: float | None = None,
) -> tuple[Sized | None, Sized | None, list[Sized]]:
    """(static peak, static min among the layouts tried, every layout tried), for up to `max_replicas`
    replicas in all. Assumes attainment does not fall when a decode replica is added.

    With `focus_seconds`, each layout runs first only on the busiest window of the trace (by prompt tokens
    plus 20x output tokens) and the `focus_seconds` before it, so a long trace costs a fraction to search; the
    layout found there is then run on the whole trace, and when some other window of it misses the target
    (the busiest by tokens is not always the hardest: one of longer prompts may be), the search goes on over
    the whole trace. Static peak is then a whole-trace result either way; static min is None (the layouts
    were tried on a slice).
    """
    tried: dict[tuple[int, int], Sized] = {}  # by layout, in the order tried

    def run(prefill: int, decode: int) -> Sized:
        if (prefill, decode) in tried:  # the layout checked after a focused search is not simulated again
            return tried[prefill, decode]
        result = simulate(layout(prefill, decode), profile, trace, kv_link_bytes_per_s=kv_link_bytes_per_s)
        windows = window_attainment(result, slo, window_seconds)
        sized = Sized(prefill, decode, attainment(result, slo), min(windows), result.gpu_seconds, result)
        tried[prefill, decode] = sized
        return sized

    on_slice: list[Sized] = []
    if focus_seconds is not None:
        found, _, on_slice = static_sizes(
            layout,
            profile,
            peak_slice(trace, window_seconds, focus_seconds),
            slo,
            target=target,
            window_seconds=window_seconds,
            max_replicas=max_replicas,
            kv_link_bytes_per_s=kv_link_bytes_per_s,
        )
        if found is None:
            return None, None, on_slice
        checked = run(found.prefill, found.decode)  # on the whole trace
        if checked.worst_window >= target:
            return checked, None, on_slice + list(tried.values())
        # another window missed: the search below runs on the whole trace

    def holds(prefill: int, decode: int) -> bool:
        return run(prefill, decode).worst_window >= target

    # Colocated first: bisect the smallest pool that holds. Then each prefill count p only needs the one
    # layout that would beat the best so far (more decode replicas hold at least as well, fewer worse); when
    # it holds, walk decode down while it still does.
    best_peak: tuple[int, int] | None = None
    low, high = 1, 1
    while high < max_replicas and not holds(0, high):  # doubling, then bisection
        low, high = high + 1, min(2 * high, max_replicas)
    if high < max_replicas or holds(0, high):
        while low < high:
            middle = (low + high) // 2
            if holds(0, middle):
                high = middle
            else:
                low = middle + 1
        best_peak = (0, high)
    for prefill in range(1, max_replicas):
        decode = (best_peak[0] + best_peak[1] - prefill - 1) if best_peak else max_replicas - prefill
        if decode < 1:
            break
        while decode >= 1 and holds(prefill, decode):
            best_peak = (prefill, decode)
            decode -= 1
    held = [s for s in tried.values() if s.attainment >= target]
    smallest = min(held, key=lambda s: (s.prefill + s.decode, -s.attainment), default=None)
    if focus_seconds is not None:
        smallest = None  # not every layout was tried on the whole trace
    return (None if best_peak is None else tried[best_peak]), smallest, on_slice + list(tried.values())


def peak_slice(
    trace: Sequence[TraceRequest], window_seconds: float, before_seconds: float
) -> list[TraceRequest]:
    """The busiest window of the trace and the `before_seconds` before it, re-based to start at 0."""
    start = trace[0].arrival
    load: dict[int, float] = {}
    for request in trace:
        index = int((request.arrival - start) // window_seconds)
        load[index] = load.get(index, 0.0) + request.prompt_tokens + 20 * request.output_tokens
    busiest = max(load, key=load.__getitem__)
    begin = start + busiest * window_seconds - before_seconds
    end = start + (busiest + 1) * window_seconds
    first = max(begin, start)
    return [replace(r, arrival=r.arrival - first) for r in trace if first <= r.arrival < end]
