"""`inferencepool sim`: what a pool spec buys on a trace, against what a user would run instead.

Every scenario replays the same trace in virtual time through the live router's scheduling core and the
real autoscaler decisions on simulated engines. With `--pool FILE.yaml` the spec, mapped as the operator maps
it, is the `deployed` scenario (`sim/pool.py`); the table compares it with the baselines of the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferencepool.perf.profiles import EngineProfile
    from inferencepool.sim.cluster import Scenario, ScenarioResult
    from inferencepool.sim.compare import Budget
    from inferencepool.sim.report import Slo
    from inferencepool.sim.workload import TraceRequest


def configure(parser: argparse.ArgumentParser) -> None:
    from inferencepool.sim.compare import EXTRA_SCENARIOS, SCENARIO_NAMES
    from inferencepool.sim.workload import VENDORED

    trace = parser.add_argument_group("workload")
    trace.add_argument(
        "--trace",
        default="azure-code",
        help=f"vendored trace ({', '.join(sorted(VENDORED))}) or a path to an Azure 2023 .csv or Mooncake "
        ".jsonl (maybe .gz). Default: azure-code",
    )
    trace.add_argument("--start", type=float, default=0.0, help="skip this many seconds of the trace")
    trace.add_argument(
        "--duration",
        type=float,
        default=600.0,
        help="seconds of the trace to replay (before --rate). Default: 600",
    )
    trace.add_argument("--rate", type=float, default=1.0, help="replay this many times faster. Default: 1")
    trace.add_argument(
        "--max-requests", type=int, default=None, help="cut the trace after this many requests"
    )
    trace.add_argument(
        "--load",
        choices=("trace", "diurnal", "bursty"),
        default="trace",
        help="replay the trace, or build a synthetic load of --duration seconds from its (prompt, output) "
        "pairs: diurnal (a day compressed into the duration, --mean-rate, --swing) or bursty (--mean-rate "
        "with bursts at --burst-rate). Default: trace",
    )
    trace.add_argument("--mean-rate", type=float, default=5.0, help="synthetic load req/s. Default: 5")
    trace.add_argument("--swing", type=float, default=0.7, help="diurnal: peak/mean - 1. Default: 0.7")
    trace.add_argument("--burst-rate", type=float, default=20.0, help="bursty: req/s in a burst. Default: 20")
    trace.add_argument("--burst-seconds", type=float, default=60.0, help="bursty: burst length. Default: 60")
    trace.add_argument("--burst-gap", type=float, default=600.0, help="bursty: mean gap s. Default: 600")
    trace.add_argument("--seed", type=int, default=0, help="synthetic load seed. Default: 0")
    trace.add_argument(
        "--copies",
        type=int,
        default=1,
        help="superpose this many copies of the load (the same shape at N times the load). Default: 1",
    )
    trace.add_argument(
        "--copy-shift", type=float, default=7.0, help="seconds between superposed copies. Default: 7"
    )

    pool = parser.add_argument_group("pool")
    pool.add_argument(
        "--pool",
        type=Path,
        default=None,
        help="an InferencePool manifest: the `deployed` scenario, mapped as the operator maps it (policy, "
        "threshold, adaptive threshold, chunks, max-num-seqs, autoscaling, LMCache, TP); the baselines get "
        "its initial GPU count unless --replicas says otherwise",
    )
    pool.add_argument(
        "--profile", default="llama-3.1-8b-h100", help="engine profile. Default: llama-3.1-8b-h100"
    )
    pool.add_argument(
        "--max-model-len", type=int, default=None, help="vLLM --max-model-len (profile's by default)"
    )
    pool.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="engines in each static scenario. Default: the --pool spec's initial replicas, else 4",
    )
    pool.add_argument(
        "--prefill",
        type=int,
        default=None,
        help="prefill replicas of the P/D scenarios. Default: half, rounded down",
    )
    pool.add_argument(
        "--threshold", type=int, default=4096, help="LengthAware prefill threshold tokens. Default: 4096"
    )
    pool.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help="--max-num-batched-tokens of prefill pods in P/D scenarios (profile's by default)",
    )
    pool.add_argument(
        "--decode-chunk",
        type=int,
        default=None,
        help="--max-num-batched-tokens of decode pods (and of colocated-tuned, colocated-prefix). Default: "
        "the largest chunk whose prefill step fits the ITL target (512 at 25 ms, 1024 at 40 ms on H100)",
    )
    pool.add_argument(
        "--lmcache-cpu-gib",
        type=float,
        default=0.0,
        help="LMCache on every engine: a CPU tier of this many GiB per replica, loaded over the host link "
        "(prefixes evicted from the GPU cache). Default: 0 (no LMCache)",
    )
    pool.add_argument(
        "--p2p",
        action="store_true",
        help="with --lmcache-cpu-gib: LMCache p2p, a prefix any engine's CPU tier holds is fetched over the "
        "KV link instead of recomputed",
    )
    pool.add_argument(
        "--kv-link-gbps",
        type=float,
        default=None,
        help="KV link per GPU in GB/s, shared by concurrent transfers (profile's by default, 40 on H100)",
    )

    slo = parser.add_argument_group("service level objectives (goodput and autoscaling targets)")
    slo.add_argument("--ttft-slo-ms", type=int, default=800, help="time to first token. Default: 800")
    slo.add_argument("--itl-slo-ms", type=int, default=40, help="time per output token. Default: 40")
    slo.add_argument(
        "--percentile", type=int, default=90, help="autoscaling/adaptive percentile. Default: 90"
    )

    scaling = parser.add_argument_group("the planner (scenario planner; --pool: deployed)")
    scaling.add_argument("--max-replicas", type=int, default=None, help="per pool. Default: --replicas")
    scaling.add_argument(
        "--model-load-seconds",
        type=float,
        default=120.0,
        help="a new replica serves after this. Default: 120",
    )
    scaling.add_argument("--interval", type=int, default=15, help="seconds between decisions. Default: 15")
    scaling.add_argument("--window", type=int, default=60, help="latency window in seconds. Default: 60")
    scaling.add_argument(
        "--scale-down-stabilization", type=int, default=300, help="seconds. Default: 300 (the API's default)"
    )
    scaling.add_argument(
        "--planner-headroom",
        type=float,
        default=None,
        help="planner: size for the forecast times this. Default: the planner's (1.0)",
    )
    scaling.add_argument(
        "--planner-prefill-min", type=int, default=0, help="planner: prefill minReplicas. Default: 0"
    )
    scaling.add_argument(
        "--planner-recent-seconds",
        type=float,
        default=None,
        help="planner: hold the mean load of this many seconds. Default: the planner's (60)",
    )
    scaling.add_argument("--gpu-budget", type=int, default=None, help="planner: GPUs across both pools")

    searched = parser.add_argument_group("searches")
    searched.add_argument(
        "--goodput",
        action="store_true",
        help="DistServe goodput instead of one rate: the highest replay speed-up at which >= 90%% of "
        "requests meet both SLOs, per scenario (static ones), per GPU",
    )
    searched.add_argument(
        "--splits",
        action="store_true",
        help="with --goodput: also search every P:D split of --replicas for each P/D scenario",
    )
    searched.add_argument(
        "--peak-window",
        type=float,
        default=300.0,
        help="static-peak holds the target in every window this long. Default: 300",
    )
    searched.add_argument(
        "--peak-focus",
        type=float,
        default=None,
        help="search static-peak on the busiest window and this many seconds before it only (faster on "
        "long traces; the layout found then runs on the whole trace; static-min is not searched)",
    )

    parser.add_argument(
        "--scenarios",
        default=None,
        help=f"comma-separated subset of deployed (with --pool), {','.join(SCENARIO_NAMES)} (the default), "
        f"or of {','.join(EXTRA_SCENARIOS)}",
    )
    parser.add_argument("--out", default="out/sim", help="folder for sim.json and plots. Default: out/sim")
    parser.add_argument("--no-plots", action="store_true", help="skip the matplotlib plots")


def _requests(args: argparse.Namespace) -> list[TraceRequest]:
    from inferencepool.sim import workload

    source = workload.load(args.trace)
    if args.load == "trace":
        requests = workload.shape(
            source, start=args.start, duration=args.duration, rate=args.rate, max_requests=args.max_requests
        )
    elif args.load == "diurnal":
        requests = workload.diurnal(
            source, duration=args.duration, mean_rate=args.mean_rate, swing=args.swing, seed=args.seed
        )
    else:
        requests = workload.bursty(
            source,
            duration=args.duration,
            base_rate=args.mean_rate,
            burst_rate=args.burst_rate,
            burst_seconds=args.burst_seconds,
            mean_gap_seconds=args.burst_gap,
            seed=args.seed,
        )
    if args.copies != 1:
        requests = workload.superpose(requests, args.copies, args.copy_shift)
    if not requests:
        raise ValueError("the load has no requests")
    return requests


def run(args: argparse.Namespace) -> int:
    from inferencepool.perf.profiles import get_profile
    from inferencepool.sim import report, search, workload
    from inferencepool.sim.compare import (
        DEPLOYED,
        SCENARIO_NAMES,
        SEARCHED,
        Budget,
        build_scenarios,
        compare,
        static_layout,
    )
    from inferencepool.sim.pool import deployed_profile, deployed_scenario, load_pool

    started = time.monotonic()
    try:
        profile = get_profile(args.profile)
        if args.max_model_len is not None:
            profile = profile.with_overrides(max_model_len=args.max_model_len)
        requests = _requests(args)
        slo = report.Slo(args.ttft_slo_ms / 1000, args.itl_slo_ms / 1000)
        deployed = None
        if args.pool is not None:
            pool = load_pool(args.pool)
            profile = deployed_profile(pool, profile)
            # goodput is defined for a fixed pool: the spec's initial layout, its autoscaling off
            deployed = deployed_scenario(
                pool, autoscale=not args.goodput, model_load_seconds=args.model_load_seconds
            )
        default_names = (DEPLOYED, *SCENARIO_NAMES) if deployed is not None else SCENARIO_NAMES
        names = [n.strip() for n in (args.scenarios or ",".join(default_names)).split(",") if n.strip()]
        if DEPLOYED in names and deployed is None:
            raise ValueError("the deployed scenario is a pool spec: give it with --pool FILE.yaml")
        replicas = args.replicas
        if replicas is None:
            replicas = deployed.prefill_replicas + deployed.decode_replicas if deployed is not None else 4
        prefill = args.prefill
        if prefill is None and deployed is not None and 1 <= deployed.prefill_replicas < replicas:
            prefill = deployed.prefill_replicas
        budget = Budget(
            replicas=replicas,
            prefill_replicas=prefill if prefill is not None else max(1, replicas // 2),
            threshold_tokens=args.threshold,
            max_replicas_per_pool=args.max_replicas,
            model_load_seconds=args.model_load_seconds,
            interval_seconds=args.interval,
            window_seconds=args.window,
            scale_down_stabilization_seconds=args.scale_down_stabilization,
            percentile=args.percentile,
            prefill_chunk_tokens=args.prefill_chunk,
            decode_chunk_tokens=args.decode_chunk,
            planner_headroom=args.planner_headroom,
            planner_prefill_min=args.planner_prefill_min,
            planner_recent_seconds=args.planner_recent_seconds,
            gpu_budget=args.gpu_budget,
            lmcache_cpu_gib=args.lmcache_cpu_gib,
            lmcache_p2p=args.p2p,
        )
        scenarios = build_scenarios(budget, slo, names)
        if deployed is not None and DEPLOYED in names:
            scenarios.insert(0, deployed)
        link = None if args.kv_link_gbps is None else args.kv_link_gbps * 1e9
        if link is not None and link <= 0:
            raise ValueError(f"--kv-link-gbps must be > 0, got {args.kv_link_gbps}")
    except (ValueError, OSError) as error:  # TraceError, bad profile or spec: the message names the problem
        print(f"inferencepool sim: {error}", file=sys.stderr)
        return 2

    print(f"trace {args.trace} ({args.load}): {next(workload.summary(requests, args.threshold))}")
    print(
        f"profile {profile.name} (TP{profile.tensor_parallel}), {budget.replicas} replicas "
        f"({budget.prefill_replicas} prefill + {budget.replicas - budget.prefill_replicas} decode in P/D), "
        f"SLO TTFT <= {args.ttft_slo_ms} ms and ITL <= {args.itl_slo_ms} ms"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        key: value
        for key, value in vars(args).items()
        if isinstance(value, (str, int, float, bool, type(None)))
    }
    if args.goodput:
        return _goodput(args, scenarios, budget, profile, requests, slo, link, out, settings, started)

    span = requests[-1].arrival
    clock = {"start": time.monotonic()}

    def progress(name: str, reached: float, total: float) -> None:
        elapsed = time.monotonic() - clock["start"]
        where = (
            f"{reached:.0f}/{total:.0f}"
            if reached <= total
            else f"{reached:.0f} (draining after {total:.0f})"
        )
        print(
            f"  {name}: {where} virtual s ({elapsed:.1f} s wall)",
            file=sys.stderr,
            flush=True,
        )

    results = []
    summaries = []
    searched = [n for n in names if n in SEARCHED]
    if searched:
        clock["start"] = time.monotonic()
        peak, smallest, tried = search.static_sizes(
            static_layout(budget),
            profile,
            requests,
            slo,
            window_seconds=args.peak_window,
            max_replicas=2 * (args.max_replicas or budget.replicas),
            kv_link_bytes_per_s=link,
            focus_seconds=args.peak_focus,
        )
        if args.peak_focus is not None:
            smallest = None
        for sized in tried:
            print(
                f"  static {sized.prefill}P+{sized.decode}D: {100 * sized.attainment:.1f}% SLO, worst "
                f"{args.peak_window:.0f} s window {100 * sized.worst_window:.1f}% "
                f"({time.monotonic() - clock['start']:.1f} s wall)",
                file=sys.stderr,
                flush=True,
            )
        for name, found in (("static-peak", peak), ("static-min", smallest)):
            if name not in searched:
                continue
            if found is None:
                print(f"  {name}: no layout of up to the search bound held the target", file=sys.stderr)
                continue
            renamed = dataclasses.replace(
                found.result.scenario, name=f"{name} {found.prefill}P+{found.decode}D"
            )
            result = dataclasses.replace(found.result, scenario=renamed)  # a whole-trace run either way
            results.append(result)
            summaries.append(report.summarize(result, slo, args.peak_window))
    for scenario in scenarios:
        clock["start"] = time.monotonic()
        if scenario.policy == "AlwaysDisaggregate" and scenario.name == "static-pd":
            result = _best_split(scenario, budget.replicas, profile, requests, slo, link)
            results.append(result)
            summaries.append(report.summarize(result, slo, args.peak_window))
            continue
        [result], _ = compare(
            [scenario],
            profile,
            requests,
            slo,
            progress=progress,
            progress_every=span / 4,
            kv_link_bytes_per_s=link,
        )
        print(
            f"  {scenario.name}: done in {time.monotonic() - clock['start']:.1f} s wall "
            f"({result.engine_steps} engine steps)",
            file=sys.stderr,
            flush=True,
        )
        results.append(result)
        summaries.append(report.summarize(result, slo, args.peak_window))
    baseline = next((s.scenario for s in summaries if s.scenario.startswith("static-peak")), "colocated")
    summaries = report.with_ratios(summaries, baseline)

    print()
    print(report.table(summaries, "peak" if baseline != "colocated" else "coloc"))
    report.write_json(out / "sim.json", report.to_json(summaries, results, settings))
    written = [] if args.no_plots else report.plot(results, summaries, slo, out)
    print(f"\nresults in {out / 'sim.json'}" + "".join(f", {p}" for p in written))
    print(f"total {time.monotonic() - started:.1f} s wall")
    return 0


def _best_split(
    base: Scenario,
    replicas: int,
    profile: EngineProfile,
    requests: list[TraceRequest],
    slo: Slo,
    link: float | None,
) -> ScenarioResult:
    """Always-disaggregate at its best P:D split of the budget: the highest SLO attainment, then goodput."""
    from inferencepool.sim.compare import compare

    best: tuple[tuple[float, float], ScenarioResult] | None = None
    for prefill in range(1, replicas):
        layout = dataclasses.replace(
            base,
            name=f"{base.name} {prefill}P:{replicas - prefill}D",
            prefill_replicas=prefill,
            decode_replicas=replicas - prefill,
        )
        [result], [summary] = compare([layout], profile, requests, slo, kv_link_bytes_per_s=link)
        rank = (summary.slo_attainment_percent, summary.goodput_rps)
        print(f"  {layout.name}: {rank[0]:.1f}% SLO, {rank[1]:.2f} r/s", file=sys.stderr, flush=True)
        if best is None or rank > best[0]:
            best = (rank, result)
    assert best is not None
    return best[1]


def _goodput(
    args: argparse.Namespace,
    scenarios: list[Scenario],
    budget: Budget,
    profile: EngineProfile,
    requests: list[TraceRequest],
    slo: Slo,
    link: float | None,
    out: Path,
    settings: dict[str, Any],
    started: float,
) -> int:
    from inferencepool.sim import report, search

    found: list[report.Goodput] = []
    for scenario in scenarios:
        if scenario.planner is not None:
            print(f"  {scenario.name}: skipped (goodput is defined for a fixed pool)", file=sys.stderr)
            continue
        clock = time.monotonic()
        result = search.goodput(scenario, profile, requests, slo, kv_link_bytes_per_s=link)
        found.append(result)
        print(f"  {scenario.name}: {time.monotonic() - clock:.1f} s wall", file=sys.stderr, flush=True)
    for base in scenarios:
        if args.splits or base.name == "static-pd":
            if base.policy == "Colocated" or base.planner is not None:
                continue
            clock = time.monotonic()

            def layout(prefill: int, decode: int, base: Scenario = base) -> Scenario:
                return dataclasses.replace(
                    base,
                    name=f"{base.name} {prefill}P:{decode}D",
                    prefill_replicas=prefill,
                    decode_replicas=decode,
                )

            _, every = search.best_split(
                layout, budget.replicas, profile, requests, slo, kv_link_bytes_per_s=link
            )
            found.extend(
                g
                for g in every
                if g.scenario != f"{base.name} {base.prefill_replicas}P:{base.decode_replicas}D"
            )
            print(f"  {base.name} splits: {time.monotonic() - clock:.1f} s wall", file=sys.stderr, flush=True)
    print()
    print(report.goodput_table(found))
    report.write_json(out / "goodput.json", report.goodput_json(found, settings))
    print(f"\nresults in {out / 'goodput.json'}")
    print(f"total {time.monotonic() - started:.1f} s wall")
    return 0
