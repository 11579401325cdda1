"""`inferencepool sim`: what disaggregation, the length-aware threshold and per-pool autoscaling buy on a
trace.

Every scenario replays the same trace in virtual time through the real router policy and autoscaler decisions
on simulated engines, and the table compares them with the colocated baseline of the same run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    from inferencepool.sim.compare import SCENARIO_NAMES
    from inferencepool.sim.workload import VENDORED

    trace = parser.add_argument_group("workload")
    trace.add_argument(
        "--trace",
        default="azure-code",
        help=f"vendored slice ({', '.join(sorted(VENDORED))}) or a path to an Azure 2023 .csv or Mooncake "
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

    pool = parser.add_argument_group("pool")
    pool.add_argument(
        "--profile", default="llama-3.1-8b-h100", help="engine profile. Default: llama-3.1-8b-h100"
    )
    pool.add_argument(
        "--max-model-len", type=int, default=None, help="vLLM --max-model-len (profile's by default)"
    )
    pool.add_argument("--replicas", type=int, default=4, help="engines in each static scenario. Default: 4")
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
        "--adaptive-min", type=int, default=1024, help="adaptive threshold lower bound. Default: 1024"
    )
    pool.add_argument(
        "--adaptive-max", type=int, default=16384, help="adaptive threshold upper bound. Default: 16384"
    )

    slo = parser.add_argument_group("service level objectives (goodput and autoscaling targets)")
    slo.add_argument("--ttft-slo-ms", type=int, default=800, help="time to first token. Default: 800")
    slo.add_argument("--itl-slo-ms", type=int, default=40, help="time per output token. Default: 40")
    slo.add_argument(
        "--percentile", type=int, default=90, help="autoscaling/adaptive percentile. Default: 90"
    )

    scaling = parser.add_argument_group("autoscaled scenario")
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

    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIO_NAMES),
        help=f"comma-separated subset of {','.join(SCENARIO_NAMES)}",
    )
    parser.add_argument("--out", default="out/sim", help="folder for sim.json and plots. Default: out/sim")
    parser.add_argument("--no-plots", action="store_true", help="skip the matplotlib plots")


def run(args: argparse.Namespace) -> int:
    from inferencepool.engine_sim.profiles import get_profile
    from inferencepool.sim import report, workload
    from inferencepool.sim.compare import Budget, build_scenarios, compare

    started = time.monotonic()
    try:
        profile = get_profile(args.profile)
        if args.max_model_len is not None:
            profile = profile.with_overrides(max_model_len=args.max_model_len)
        requests = workload.shape(
            workload.load(args.trace),
            start=args.start,
            duration=args.duration,
            rate=args.rate,
            max_requests=args.max_requests,
        )
        slo = report.Slo(args.ttft_slo_ms / 1000, args.itl_slo_ms / 1000)
        budget = Budget(
            replicas=args.replicas,
            prefill_replicas=args.prefill if args.prefill is not None else max(1, args.replicas // 2),
            threshold_tokens=args.threshold,
            adaptive_min_tokens=args.adaptive_min,
            adaptive_max_tokens=args.adaptive_max,
            max_replicas_per_pool=args.max_replicas,
            model_load_seconds=args.model_load_seconds,
            interval_seconds=args.interval,
            window_seconds=args.window,
            scale_down_stabilization_seconds=args.scale_down_stabilization,
            percentile=args.percentile,
        )
        scenarios = build_scenarios(budget, slo, [n.strip() for n in args.scenarios.split(",") if n.strip()])
    except ValueError as error:  # TraceError, bad profile, bad bounds: the message names the problem
        print(f"inferencepool sim: {error}", file=sys.stderr)
        return 2

    print(f"trace {args.trace}: {next(workload.summary(requests, args.threshold))}")
    print(
        f"profile {profile.name} (TP{profile.tensor_parallel}), {budget.replicas} replicas "
        f"({budget.prefill_replicas} prefill + {budget.replicas - budget.prefill_replicas} decode in P/D), "
        f"SLO TTFT <= {args.ttft_slo_ms} ms and ITL <= {args.itl_slo_ms} ms"
    )
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
    for scenario in scenarios:
        clock["start"] = time.monotonic()
        [result], [summary] = compare(
            [scenario], profile, requests, slo, progress=progress, progress_every=span / 4
        )
        print(
            f"  {scenario.name}: done in {time.monotonic() - clock['start']:.1f} s wall "
            f"({result.engine_steps} engine steps)",
            file=sys.stderr,
            flush=True,
        )
        results.append(result)
        summaries.append(summary)
    summaries = report.with_ratios(summaries, "colocated")

    print()
    print(report.table(summaries))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        key: value
        for key, value in vars(args).items()
        if isinstance(value, (str, int, float, bool, type(None)))
    }
    report.write_json(out / "sim.json", report.to_json(summaries, results, settings))
    written = [] if args.no_plots else report.plot(results, summaries, slo, out)
    print(f"\nresults in {out / 'sim.json'}" + "".join(f", {p}" for p in written))
    print(f"total {time.monotonic() - started:.1f} s wall")
    return 0
