"""`inferencepool bench hung`: one decode engine frozen (SIGSTOP) under concurrent streams.

Fake decode engines (`--engines`, each its own process, profile cpu-demo at `--time-scale`) sit behind this
router (its own process, policy Colocated, TTFT target `--ttft-target-ms`: the streamed legs' header deadline
derives from it). `--clients` clients each send streamed requests back to back for `--seconds`; in the
`freeze` mode one engine gets SIGSTOP at `--freeze-at` and SIGCONT `--freeze-for` seconds later, as a hung
node or a stopped process leaves a pod: its kernel still accepts connections, nothing answers.

Per mode: requests, failures, and those whose first event came later than twice the TTFT target (the goal
under a freeze: none more than the same load without one, the `baseline` mode, measured in the same run);
in `freeze`, how long after SIGSTOP the router's table showed the pod unresponsive
(inferencepool_router_pods{state="unresponsive"}) and how long after SIGCONT it served again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferencepool.bench import harness
from inferencepool.bench.harness import MODEL

MODES = ("baseline", "freeze")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engines", type=int, default=3, help="decode engines (one of them is frozen)")
    parser.add_argument("--clients", type=int, default=80, help="concurrent clients, each back to back")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the load")
    parser.add_argument("--freeze-at", type=float, default=5.0, help="SIGSTOP this long into the load")
    parser.add_argument("--freeze-for", type=float, default=20.0, help="SIGCONT this long after SIGSTOP")
    parser.add_argument("--ttft-target-ms", type=int, default=800, help="the router's TTFT target")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=1.0, help="engine time scale (> 1 is slower)")


@dataclass
class Result:
    mode: str
    requests: int = 0
    failed: int = 0
    late: int = 0  # first event after twice the TTFT target
    worst_first_event_ms: float = 0.0
    left_after_s: float | None = None  # SIGSTOP to the pod shown unresponsive
    rejoined_after_s: float | None = None  # SIGCONT to the pod serving again
    failures: list[str] = field(default_factory=list)
    late_started_s: list[float] = field(default_factory=list)  # when each late request was sent (load time)


async def _client(
    http: Any, router: str, args: argparse.Namespace, began_at: float, result: Result, i: int
) -> None:
    import aiohttp

    late_after = 2 * args.ttft_target_ms / 1000
    n = 0
    stop = began_at + args.seconds
    while time.monotonic() < stop:
        n += 1
        body = {
            "model": MODEL,
            "prompt": f"client {i} request {n}",
            "max_tokens": args.max_tokens,
            "stream": True,
        }
        began = time.monotonic()
        first: float | None = None
        ok = False
        try:
            async with http.post(router + "/v1/completions", json=body) as response:
                if response.status != 200:
                    result.failures.append(f"status {response.status}: {(await response.text())[:200]}")
                else:
                    async for piece in response.content.iter_any():
                        if first is None and b"data:" in piece:
                            first = time.monotonic() - began
                        if b"[DONE]" in piece:
                            ok = True
        except (aiohttp.ClientError, TimeoutError) as error:
            result.failures.append(repr(error))
        result.requests += 1
        if not ok:
            result.failed += 1
        waited = first if first is not None else time.monotonic() - began
        result.worst_first_event_ms = max(result.worst_first_event_ms, waited * 1000)
        if waited > late_after:
            result.late += 1
            result.late_started_s.append(round(began - began_at, 2))


async def _states(http: Any, router: str) -> tuple[float, float]:
    """(unresponsive, serving) decode pods in the router's table."""
    name = "inferencepool_router_pods"
    return (
        await harness.metric_sum(http, router, name, role="decode", state="unresponsive"),
        await harness.metric_sum(http, router, name, role="decode", state="serving"),
    )


async def one_run(args: argparse.Namespace, mode: str, http: Any) -> Result:
    result = Result(mode)
    async with harness.processes() as started:
        engines = [
            await harness.fake_engine(started, time_scale=args.time_scale) for _ in range(args.engines)
        ]
        config = {
            "static": {"prefill": [], "decode": [engine.url for engine in engines]},
            "servedModelName": MODEL,
            "policy": "Colocated",
            "adaptiveThreshold": {"ttftTargetMilliseconds": args.ttft_target_ms},
        }
        router = (await harness.start_router(started, config)).url
        began = time.monotonic()
        clients = [
            asyncio.create_task(_client(http, router, args, began, result, i)) for i in range(args.clients)
        ]
        if mode == "freeze":
            frozen = engines[0].process
            await asyncio.sleep(args.freeze_at)
            stopped_at = time.monotonic()
            os.kill(frozen.pid, signal.SIGSTOP)
            try:
                while time.monotonic() < stopped_at + args.freeze_for:
                    if result.left_after_s is None and (await _states(http, router))[0] >= 1:
                        result.left_after_s = time.monotonic() - stopped_at
                    await asyncio.sleep(0.05)
            finally:
                os.kill(frozen.pid, signal.SIGCONT)
            continued_at = time.monotonic()
            while time.monotonic() < continued_at + 30:
                unresponsive, serving = await _states(http, router)
                if unresponsive == 0 and serving == args.engines:
                    result.rejoined_after_s = time.monotonic() - continued_at
                    break
                await asyncio.sleep(0.05)
        await asyncio.gather(*clients)
    result.failures = result.failures[:5]
    return result


async def _bench(args: argparse.Namespace) -> list[Result]:
    import aiohttp

    results = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:
        for mode in MODES:
            result = await one_run(args, mode, http)
            results.append(result)
            print(
                f"{mode:>9}: {result.requests} requests, {result.failed} failed, {result.late} with a first "
                f"event after {2 * args.ttft_target_ms} ms (worst {result.worst_first_event_ms:.0f} ms)"
                + (
                    f"; pod out of the table {result.left_after_s:.2f} s after SIGSTOP, serving again "
                    f"{result.rejoined_after_s:.2f} s after SIGCONT"
                    if mode == "freeze"
                    and result.left_after_s is not None
                    and result.rejoined_after_s is not None
                    else ""
                ),
                flush=True,
            )
            if result.late_started_s:
                print(f"      late requests sent at (s into the load): {result.late_started_s[:40]}")
            for failure in result.failures:
                print(f"      {failure}")
    return results


def run(args: argparse.Namespace) -> int:
    results = asyncio.run(_bench(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "args": {k: v for k, v in vars(args).items() if isinstance(v, int | float | str)},
        "results": [asdict(r) for r in results],
    }
    (out / "hung.json").write_text(json.dumps(document, indent=2))
    print(f"wrote {out / 'hung.json'}")
    return 0
