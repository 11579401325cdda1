"""`inferencepool bench kill`: a prefill pod and then a decode pod killed under steady P/D load.

Fake engines (`--prefill` and `--decode` pods, each its own process with the NIXL connector, profile cpu-demo
at `--time-scale`) sit behind this router (its own process, policy AlwaysDisaggregate, static pod list).
`--clients` clients send streamed requests of a long prompt back to back for `--seconds`. At
`--kill-prefill-at` one prefill engine gets SIGKILL, and `--down-for` seconds later a new engine process
starts on the same port (a restarted pod: same address, a new NIXL engine id, an empty cache); at
`--kill-decode-at` the same happens to a decode engine.

Reported: requests, those that failed before their first token reached the client (the goal: 0, whatever
died: the router retries a leg that got no answer, serves colocated a decode leg whose KV source died, and
moves a stream whose decode pod died before its first event), those broken mid-stream (resumed on another
decode pod unless that failed too), and for each kill, how long after the restarted engine listened it got a
request again (one running or waiting on its /metrics, polled every 50 ms), which is how long the router kept
it out after the failures it saw while the pod was down. The static pod list has no Pod watch: in a cluster
the watch also reports the restart (a new incarnation), which this run does not exercise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferencepool.bench import harness
from inferencepool.bench.harness import MODEL

PROMPT = "the pool keeps shared prefixes warm, and every request brings its own words: "


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill", type=int, default=2, help="prefill pods")
    parser.add_argument("--decode", type=int, default=2, help="decode pods")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients, each back to back")
    parser.add_argument("--seconds", type=float, default=50.0, help="length of the load")
    parser.add_argument("--kill-prefill-at", type=float, default=8.0)
    parser.add_argument("--kill-decode-at", type=float, default=28.0)
    parser.add_argument(
        "--down-for", type=float, default=3.0, help="seconds before the pod's engine restarts"
    )
    parser.add_argument("--prompt-words", type=int, default=1000, help="prompt length (about one token each)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--time-scale", type=float, default=2.0, help="engine time scale (> 1 is slower)")


@dataclass
class Kill:
    role: str
    killed_at_s: float = 0.0  # into the load
    restarted_at_s: float = 0.0  # the new engine listening
    used_again_after_s: float | None = None  # from restarted_at_s to its first request


@dataclass
class Result:
    requests: int = 0
    answered: int = 0
    failed_before_streaming: int = 0
    broken_mid_stream: int = 0
    routes: dict[str, int] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    router: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


async def _client(
    http: Any, router: str, args: argparse.Namespace, stop: float, result: Result, i: int
) -> None:
    import aiohttp

    n = 0
    while time.monotonic() < stop:
        n += 1
        words = " ".join(f"c{i}-{n}-{k}" for k in range(args.prompt_words))
        body = {"model": MODEL, "prompt": PROMPT + words, "max_tokens": args.max_tokens, "stream": True}
        streaming = ended = False
        problem = ""
        try:
            async with http.post(router + "/v1/completions", json=body) as response:
                route = response.headers.get("X-Inferencepool-Route", "none")
                result.routes[route] = result.routes.get(route, 0) + 1
                if response.status != 200:
                    problem = f"status {response.status}: {(await response.text())[:200]}"
                else:
                    async for piece in response.content.iter_any():
                        if b'"error"' in piece:
                            problem = piece.decode(errors="replace")[:200]
                            break
                        streaming = streaming or b'"text"' in piece
                        ended = ended or b"[DONE]" in piece
        except (aiohttp.ClientError, TimeoutError) as error:
            problem = repr(error)
        result.requests += 1
        if ended and not problem:
            result.answered += 1
            continue
        if streaming:
            result.broken_mid_stream += 1
        else:
            result.failed_before_streaming += 1
        result.failures.append(problem or "no [DONE]")


async def _kill_and_restart(
    http: Any,
    started: list[asyncio.subprocess.Process],
    engine: harness.Started,
    flags: list[str],
    args: argparse.Namespace,
    began: float,
    kill: Kill,
) -> None:
    engine.process.send_signal(signal.SIGKILL)
    kill.killed_at_s = time.monotonic() - began
    await engine.process.wait()
    await asyncio.sleep(args.down_for)
    restarted = await harness.fake_engine(started, *flags, time_scale=args.time_scale, port=engine.port)
    kill.restarted_at_s = time.monotonic() - began
    while time.monotonic() < began + args.seconds + 30:
        if await _given_work(http, restarted.url):
            kill.used_again_after_s = time.monotonic() - began - kill.restarted_at_s
            return
        await asyncio.sleep(0.05)


async def _given_work(http: Any, engine: str) -> bool:
    """Whether the engine has got a request: one running or waiting now, or one finished."""
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:request_success_total"):
        if await harness.metric_sum(http, engine, name) > 0:
            return True
    return False


async def _bench(args: argparse.Namespace) -> Result:
    import aiohttp

    result = Result()
    flags = {role: harness.nixl_flags(role, 30.0) for role in ("prefill", "decode")}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as http,
        harness.processes() as started,
    ):
        engines: dict[str, list[harness.Started]] = {"prefill": [], "decode": []}
        for role, count in (("prefill", args.prefill), ("decode", args.decode)):
            for _ in range(count):
                engines[role].append(
                    await harness.fake_engine(started, *flags[role], time_scale=args.time_scale)
                )
        config = {
            "static": {role: [e.url for e in found] for role, found in engines.items()},
            "servedModelName": MODEL,
            "policy": "AlwaysDisaggregate",
        }
        router = (await harness.start_router(started, config)).url
        began = time.monotonic()
        stop = began + args.seconds
        clients = [
            asyncio.create_task(_client(http, router, args, stop, result, i)) for i in range(args.clients)
        ]
        for role, at in (("prefill", args.kill_prefill_at), ("decode", args.kill_decode_at)):
            await asyncio.sleep(max(0.0, began + at - time.monotonic()))
            kill = Kill(role)
            result.kills.append(kill)
            await _kill_and_restart(http, started, engines[role][0], flags[role], args, began, kill)
        await asyncio.gather(*clients)
        for name, labels in (
            ("inferencepool_router_fallbacks_total", {"reason": "decode_leg_failed"}),
            ("inferencepool_router_fallbacks_total", {"reason": "prefill_failed"}),
            ("inferencepool_router_retries_total", {}),
            ("inferencepool_router_streams_resumed_total", {"outcome": "resumed"}),
            ("inferencepool_router_streams_resumed_total", {"outcome": "broken"}),
        ):
            key = name.removeprefix("inferencepool_router_").removesuffix("_total")
            key += "".join(f"_{v}" for v in labels.values())
            result.router[key] = await harness.metric_sum(http, router, name, **labels)
    result.failures = result.failures[:5]
    return result


def run(args: argparse.Namespace) -> int:
    if min(args.prefill, args.decode) < 2:
        print("--prefill and --decode must be at least 2 (one of each is killed, another serves meanwhile)")
        return 2
    if not args.kill_prefill_at + args.down_for < args.kill_decode_at < args.seconds:
        print("the decode kill must come after the prefill pod restarted, and within --seconds")
        return 2
    print(
        f"bench kill: {args.clients} clients for {args.seconds:g} s over {args.prefill} prefill + "
        f"{args.decode} decode fake engines (cpu-demo, time scale {args.time_scale:g}); a prefill engine "
        f"SIGKILLed at {args.kill_prefill_at:g} s, a decode engine at {args.kill_decode_at:g} s, each "
        f"restarted on its port {args.down_for:g} s later",
        flush=True,
    )
    result = asyncio.run(_bench(args))
    print(
        f"{result.requests} requests: {result.answered} answered, {result.failed_before_streaming} failed "
        f"before their first token, {result.broken_mid_stream} broken mid-stream; routes {result.routes}"
    )
    print("router: " + ", ".join(f"{k} {v:g}" for k, v in result.router.items()))
    for kill in result.kills:
        used = "never" if kill.used_again_after_s is None else f"{kill.used_again_after_s:.2f} s after"
        print(
            f"{kill.role} engine killed at {kill.killed_at_s:.1f} s, restarted at "
            f"{kill.restarted_at_s:.1f} s, got a request again {used} its restart"
        )
    for failure in result.failures:
        print(f"      {failure}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "args": {k: v for k, v in vars(args).items() if isinstance(v, int | float | str)},
        "result": asdict(result),
    }
    (out / "kill.json").write_text(json.dumps(document, indent=2))
    print(f"wrote {out / 'kill.json'}")
    return 1 if result.failed_before_streaming else 0
