"""`inferencepool bench overload`: twice the load a pool can hold, with and without shedding.

Fake decode engines (`--engines`, each its own process, profile cpu-demo at `--time-scale`, at most
`--max-num-seqs` running each, so the pool holds engines x max-num-seqs streams) sit behind this router (its
own process, policy Colocated). `--load` times that many clients send streamed requests back to back for
`--warmup-seconds` (not counted) and then `--seconds`; a client answered 429 waits the Retry-After before its
next request, as OpenAI's clients do.

Two modes in the same run: `queue` (overload off: every request waits inside the engines, the baseline)
and `shed` (overload on: a queue per pool in the router, at most `--max-queued-requests`, waits of at most
half the TTFT target `--ttft-target-ms`). Per mode: requests answered, the share answered 429, the time to
first event of the admitted ones (p50, p90) and the share of them within the target; the shed mode's TTFT
as a ratio of the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferencepool.bench.harness import MODEL, fake_engine, processes, start_router

MODES = ("queue", "shed")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=8, help="streams each engine runs at once")
    parser.add_argument(
        "--load", type=float, default=2.0, help="clients, as a multiple of what the pool holds"
    )
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=10.0,
        help="requests sent this early are not counted: the first burst reaches the engines before the "
        "router has learned what they run, and waits there in both modes",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=32, help="mean answer length (each from half to 1.5 times it)"
    )
    parser.add_argument(
        "--max-queued-requests", type=int, default=64, help="most queued per pool (shed mode)"
    )
    parser.add_argument(
        "--ttft-target-ms", type=int, default=800, help="the TTFT target (the router's queue waits half)"
    )
    parser.add_argument("--time-scale", type=float, default=5.0, help="engine time scale (> 1 is slower)")


@dataclass
class Result:
    mode: str
    answered: int = 0
    shed: int = 0
    failed: int = 0
    first_event_s: list[float] = field(default_factory=list)

    target_s: float = 0.8

    def summary(self) -> dict[str, float]:
        ttft = sorted(self.first_event_s)
        within = sum(1 for seconds in ttft if seconds <= self.target_s)
        return {
            "answered": self.answered,
            "shed_share": self.shed / max(1, self.answered + self.shed),
            "ttft_p50_ms": 1000 * statistics.median(ttft) if ttft else float("nan"),
            "ttft_p90_ms": 1000 * ttft[int(0.9 * (len(ttft) - 1))] if ttft else float("nan"),
            "within_target_share": within / len(ttft) if ttft else float("nan"),
        }


async def _client(
    http: Any, router: str, args: argparse.Namespace, counted: float, stop: float, result: Result, i: int
) -> None:
    import aiohttp

    n = 0
    lengths = random.Random(i)  # the same lengths in both modes
    while time.monotonic() < stop:
        n += 1
        body = {
            "model": MODEL,
            "prompt": f"client {i} request {n}",
            "max_tokens": lengths.randint(args.max_tokens // 2, args.max_tokens * 3 // 2),
            "stream": True,
        }
        began = time.monotonic()
        count = began >= counted
        first: float | None = None
        try:
            async with http.post(router + "/v1/completions", json=body) as response:
                if response.status == 429:
                    result.shed += count
                    await response.read()
                    await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                    continue
                if response.status != 200:
                    result.failed += 1
                    continue
                async for piece in response.content.iter_any():
                    if first is None and b"data:" in piece:
                        first = time.monotonic() - began
        except (aiohttp.ClientError, TimeoutError):
            result.failed += 1
            continue
        if not count:
            continue
        result.answered += 1
        if first is not None:
            result.first_event_s.append(first)


async def one_run(args: argparse.Namespace, mode: str, http: Any) -> Result:
    result = Result(mode, target_s=args.ttft_target_ms / 1000)
    engine_flags = ("--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", "2048")
    async with processes() as started:
        urls = [
            (await fake_engine(started, *engine_flags, time_scale=args.time_scale)).url
            for _ in range(args.engines)
        ]
        config = {
            "static": {"prefill": [], "decode": urls},
            "servedModelName": MODEL,
            "policy": "Colocated",
            "adaptiveThreshold": {"ttftTargetMilliseconds": args.ttft_target_ms},
            "overload": {"enabled": mode == "shed", "maxQueuedRequests": args.max_queued_requests},
        }
        router = (await start_router(started, config)).url
        clients = round(args.load * args.engines * args.max_num_seqs)
        counted = time.monotonic() + args.warmup_seconds
        stop = counted + args.seconds
        await asyncio.gather(*(_client(http, router, args, counted, stop, result, i) for i in range(clients)))
    return result


async def _bench(args: argparse.Namespace) -> list[Result]:
    import aiohttp

    results = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as http:
        for mode in MODES:
            result = await one_run(args, mode, http)
            results.append(result)
            s = result.summary()
            print(
                f"{mode:>6}: {s['answered']:.0f} answered, {100 * s['shed_share']:.1f}% answered 429, "
                f"{result.failed} failed; first event of those admitted p50 {s['ttft_p50_ms']:.0f} ms, "
                f"p90 {s['ttft_p90_ms']:.0f} ms, {100 * s['within_target_share']:.1f}% within the "
                f"{args.ttft_target_ms} ms target",
                flush=True,
            )
    base, shed = (r.summary() for r in results)
    print(
        f"shed / queue: TTFT p50 x{shed['ttft_p50_ms'] / base['ttft_p50_ms']:.2f}, "
        f"p90 x{shed['ttft_p90_ms'] / base['ttft_p90_ms']:.2f}; "
        f"requests answered x{shed['answered'] / max(1, base['answered']):.2f}"
    )
    return results


def run(args: argparse.Namespace) -> int:
    results = asyncio.run(_bench(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "args": {k: v for k, v in vars(args).items() if isinstance(v, int | float | str)},
        "results": [{**asdict(r), "summary": r.summary()} for r in results],
    }
    (out / "overload.json").write_text(json.dumps(document, indent=2))
    print(f"wrote {out / 'overload.json'}")
    return 0
