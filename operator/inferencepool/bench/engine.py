"""`inferencepool bench engine`: how many concurrent streams one fake engine sustains on this machine.

The fake engine runs as its own process; this process is the load: `c` closed-loop clients, each streaming one
request after another (short prompt, fixed output length), for each `c` of a ramp. The baseline comes from the
same run: the engine's own timing model played in virtual time with the same closed loop (what the engine
would deliver with an infinitely fast CPU). At each level the observed token throughput and median ITL are
compared with that prediction; the engine "sustains" a level while throughput stays within `--tolerance` of
the prediction and the median ITL is no more than `--tolerance` above it. Single-stream ratios are printed too
(the c=1 level).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inferencepool.bench import harness

DEFAULT_LEVELS = "1,4,16,64,128,256,512,1024"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="llama-3.1-8b-h100", help="engine profile to load")
    parser.add_argument("--levels", default=DEFAULT_LEVELS, help="comma-separated concurrency ramp")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds per level before measuring")
    parser.add_argument("--duration", type=float, default=4.0, help="measured seconds per level")
    parser.add_argument("--tolerance", type=float, default=0.10, help="allowed shortfall vs the prediction")
    parser.add_argument("--time-scale", type=float, default=1.0, help="passed to the engine")


@dataclass
class Level:
    concurrency: int
    tokens_per_s: float
    predicted_tokens_per_s: float
    itl_p50_ms: float
    predicted_itl_p50_ms: float
    itl_p90_ms: float
    predicted_itl_p90_ms: float
    ttft_p50_ms: float
    engine_cpu_percent: float
    engine_lag_percent: float  # share of the window the engine's steps started late for want of CPU
    errors: int

    @property
    def throughput_ratio(self) -> float:
        return (
            self.tokens_per_s / self.predicted_tokens_per_s if self.predicted_tokens_per_s else float("nan")
        )

    @property
    def itl_ratio(self) -> float:
        return self.itl_p50_ms / self.predicted_itl_p50_ms if self.predicted_itl_p50_ms else float("nan")

    def sustained(self, tolerance: float) -> bool:
        return self.errors == 0 and self.throughput_ratio >= 1 - tolerance and self.itl_ratio <= 1 + tolerance


def _prompt_words(request_number: int, tokens: int) -> list[str]:
    # words of <= 4 characters are one token each for the engine's estimate tokenizer; the first is unique
    return [f"q{request_number % 1000}"] + [f"w{(request_number * 31 + i) % 997}" for i in range(tokens - 1)]


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def predict(args: argparse.Namespace, concurrency: int) -> tuple[float, float, float]:
    """(tokens/s, ITL p50, ITL p90) the timing model predicts for this closed loop, in virtual time."""
    from inferencepool.engine_sim.core import EngineCore, EngineRequest
    from inferencepool.engine_sim.tokenizer import EstimateTokenizer
    from inferencepool.engine_sim.virtual import run_closed_loop
    from inferencepool.perf.profiles import get_profile

    tokenizer = EstimateTokenizer()
    engine = EngineCore(get_profile(args.profile), "predict")

    def make(n: int) -> EngineRequest:
        ids = tokenizer.encode(" ".join(_prompt_words(n, args.prompt_tokens)))
        return EngineRequest(f"r{n}", ids, args.output_tokens)

    start, end = args.warmup, args.warmup + args.duration
    timelines = run_closed_loop(engine, concurrency, make, end, stagger=min(1.0, args.warmup / 2))
    tokens = sum(1 for t in timelines for at in t.token_times if start <= at < end)
    gaps = [
        b - a
        for t in timelines
        for a, b in zip(t.token_times, t.token_times[1:], strict=False)
        if start <= b < end
    ]
    return tokens / args.duration, _quantile(gaps, 0.5), _quantile(gaps, 0.9)


async def _client(
    http: Any,
    url: str,
    args: argparse.Namespace,
    start_at: float,
    stop_at: float,
    ids: Any,
    record: dict[str, Any],
) -> None:
    import aiohttp

    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    while time.monotonic() < stop_at:
        n = next(ids)
        body = {
            "model": "bench",
            "prompt": " ".join(_prompt_words(n, args.prompt_tokens)),
            "max_tokens": args.output_tokens,
            "stream": True,
        }
        sent = time.monotonic()
        last: float | None = None
        try:
            async with http.post(url, json=body) as response:
                if response.status != 200:
                    record["errors"] += 1
                    continue
                async for line in response.content:
                    if not line.startswith(b"data: {"):
                        continue
                    now = time.monotonic()
                    if last is None:
                        record["ttfts"].append((now, now - sent))
                    else:
                        record["gaps"].append((now, now - last))
                    record["token_times"].append(now)
                    last = now
                    if now >= stop_at:
                        return  # leaving the block closes the stream; the engine aborts it
        except (aiohttp.ClientError, TimeoutError):  # a benchmark counts failures instead of stopping
            record["errors"] += 1


async def _schedule_lag(http: Any, metrics_url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(metrics_url) as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fake_engine:schedule_lag_seconds_total":
                return float(sample.value)
    raise RuntimeError(f"{metrics_url} has no fake_engine:schedule_lag_seconds")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    args: argparse.Namespace, url: str, pid: int, concurrency: int
) -> tuple[dict[str, Any], float, float]:
    import itertools

    import aiohttp

    record: dict[str, Any] = {"gaps": [], "ttfts": [], "token_times": [], "errors": 0}
    t0 = time.monotonic()
    measure_from = t0 + args.warmup
    stop_at = measure_from + args.duration
    stagger = min(1.0, args.warmup / 2)
    ids = itertools.count(concurrency * 1_000_000)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
        clients = [
            asyncio.create_task(
                _client(http, url, args, t0 + i * stagger / concurrency, stop_at, ids, record)
            )
            for i in range(concurrency)
        ]
        await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
        metrics_url = url.replace("/v1/completions", "/metrics")
        cpu_start, lag_start = _cpu_seconds(pid), await _schedule_lag(http, metrics_url)
        await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
        cpu = _cpu_seconds(pid) - cpu_start
        lag = await _schedule_lag(http, metrics_url) - lag_start
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    window = lambda pairs: [v for at, v in pairs if measure_from <= at < stop_at]  # noqa: E731
    return (
        {
            "tokens": sum(1 for at in record["token_times"] if measure_from <= at < stop_at),
            "gaps": window(record["gaps"]),
            "ttfts": window(record["ttfts"]),
            "errors": record["errors"],
        },
        cpu / args.duration * 100,
        lag / args.duration * 100,
    )


async def _start_engine(args: argparse.Namespace) -> tuple[asyncio.subprocess.Process, str]:
    process, url = await harness.start(
        [
            sys.executable, "-m", "inferencepool", "fake-engine", "serve", "bench",
            "--host", "127.0.0.1", "--port", "0", "--profile", args.profile,
            "--time-scale", str(args.time_scale), "--log-level", "WARNING",
            "--max-model-len", str(max(2048, args.prompt_tokens + args.output_tokens + 16)),
        ]
    )  # fmt: skip
    return process, url + "/v1/completions"


async def _bench(args: argparse.Namespace, levels: list[int]) -> list[Level]:
    process, url = await _start_engine(args)
    results: list[Level] = []
    try:
        print(
            f"{'streams':>8} {'tok/s':>9} {'pred':>9} {'ratio':>6} {'ITL p50':>8} {'pred':>7} {'ratio':>6} "
            f"{'ITL p90':>8} {'TTFT p50':>9} {'eng CPU':>8} {'lag':>5} {'err':>4}",
            flush=True,
        )
        for concurrency in levels:
            predicted_tps, predicted_p50, predicted_p90 = predict(args, concurrency)
            observed, cpu, lag = await measure(args, url, process.pid, concurrency)
            ttfts = observed["ttfts"]
            level = Level(
                concurrency=concurrency,
                tokens_per_s=observed["tokens"] / args.duration,
                predicted_tokens_per_s=predicted_tps,
                itl_p50_ms=_quantile(observed["gaps"], 0.5) * 1e3,
                predicted_itl_p50_ms=predicted_p50 * args.time_scale * 1e3,
                itl_p90_ms=_quantile(observed["gaps"], 0.9) * 1e3,
                predicted_itl_p90_ms=predicted_p90 * args.time_scale * 1e3,
                ttft_p50_ms=(statistics.median(ttfts) * 1e3) if ttfts else float("nan"),
                engine_cpu_percent=cpu,
                engine_lag_percent=lag,
                errors=observed["errors"],
            )
            level.predicted_tokens_per_s /= args.time_scale
            results.append(level)
            print(
                f"{concurrency:>8} {level.tokens_per_s:>9.0f} {level.predicted_tokens_per_s:>9.0f} "
                f"{level.throughput_ratio:>6.2f} {level.itl_p50_ms:>8.1f} {level.predicted_itl_p50_ms:>7.1f} "
                f"{level.itl_ratio:>6.2f} {level.itl_p90_ms:>8.1f} {level.ttft_p50_ms:>9.1f} "
                f"{level.engine_cpu_percent:>7.0f}% {level.engine_lag_percent:>4.0f}% {level.errors:>4}",
                flush=True,
            )
    finally:
        process.terminate()
        try:
            async with asyncio.timeout(15):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
    return results


def _plot(results: list[Level], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r.concurrency for r in results]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    top.plot(xs, [r.tokens_per_s for r in results], "o-", label="observed")
    top.plot(xs, [r.predicted_tokens_per_s for r in results], "s--", label="timing model (virtual time)")
    top.set_ylabel("output tokens/s")
    top.set_title(f"one fake engine, profile {args.profile}, {os.cpu_count()} CPUs")
    top.legend()
    bottom.plot(xs, [r.itl_p50_ms for r in results], "o-", label="observed ITL p50")
    bottom.plot(xs, [r.predicted_itl_p50_ms for r in results], "s--", label="predicted ITL p50")
    bottom.plot(xs, [r.itl_p90_ms for r in results], "^:", label="observed ITL p90")
    bottom.set_ylabel("ms")
    bottom.set_xlabel("concurrent streams")
    bottom.set_xscale("log", base=2)
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    try:
        levels = sorted({int(x) for x in args.levels.split(",") if x.strip()})
    except ValueError:
        print(f"--levels must be comma-separated integers, got {args.levels!r}", file=sys.stderr)
        return 2
    if not levels or levels[0] < 1:
        print("--levels needs at least one concurrency >= 1", file=sys.stderr)
        return 2
    from inferencepool.perf.profiles import get_profile

    profile = get_profile(args.profile)
    if profile.zero_compute:
        print("the zero profile has no predicted ITL to compare with; pick a timed profile", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"bench engine: profile {args.profile}, prompt {args.prompt_tokens} / output {args.output_tokens} "
        f"tokens, {args.warmup:g}+{args.duration:g} s per level, levels {levels}",
        flush=True,
    )
    results = asyncio.run(_bench(args, levels))
    sustained = [r.concurrency for r in results if r.sustained(args.tolerance)]
    # the highest level below which every level was sustained
    best = 0
    for r in results:
        if not r.sustained(args.tolerance):
            break
        best = r.concurrency
    single = results[0]
    summary = {
        "profile": args.profile,
        "cpus": os.cpu_count(),
        "tolerance": args.tolerance,
        "sustained_streams": best,
        "sustained_levels": sustained,
        "single_stream": {
            "concurrency": single.concurrency,
            "throughput_ratio": single.throughput_ratio,
            "itl_ratio": single.itl_ratio,
        },
        "levels": [
            {**asdict(r), "throughput_ratio": r.throughput_ratio, "itl_ratio": r.itl_ratio} for r in results
        ],
        "settings": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str))},
    }
    (out / "engine.json").write_text(json.dumps(summary, indent=2))
    _plot(results, out / "engine.png", args)
    print(
        f"single stream (c={single.concurrency}): throughput x{single.throughput_ratio:.2f}, "
        f"ITL p50 x{single.itl_ratio:.2f} of the timing model"
    )
    print(
        f"sustained: {best} concurrent streams (throughput >= {1 - args.tolerance:.0%} and ITL p50 <= "
        f"{1 + args.tolerance:.0%} of the timing model)"
    )
    print(f"results in {out / 'engine.json'}, plot {out / 'engine.png'}")
    return 0
