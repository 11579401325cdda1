"""`inferencepool bench aborts`: long requests whose clients go away at random points; does any KV stay held?

Fake engines (`--prefill` and `--decode` pods, each its own process with the NIXL connector and a KV lease of
`--lease-seconds`, profile cpu-demo at `--time-scale`) sit behind this router (its own process, policy
AlwaysDisaggregate: every request has a prefill leg, a KV hand-off and a decode leg). `--concurrency` clients
send `--requests` streamed requests of a long prompt between them.

Two modes in the same run: `complete` (every client reads its answer to the end: the baseline, and the
durations the abort points are drawn from) and `abort` (each client goes away at a point drawn uniformly
between 0 and the complete mode's 90th-percentile duration: during the prefill leg, between the legs or
mid-decode). Per mode: where the clients went away (before the first token, mid-stream, or not at all: the
answer ended first), then, after the last client ended, how long until every pod's `vllm:kv_cache_usage_perc`
and running and waiting requests read 0, and what freed the KV: aborted requests, leases expired
(`vllm:nixl_num_kv_expired_reqs`: KV held for a decode leg that never read it, the leak the lease bounds) and
the router's release legs. A pod that does not go idle within the lease and 30 s more is reported as leaking.
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

from inferencepool.bench import harness
from inferencepool.bench.harness import MODEL

MODES = ("complete", "abort")
PROMPT = "the pool keeps shared prefixes warm, and every request brings its own words: "


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill", type=int, default=2, help="prefill pods")
    parser.add_argument("--decode", type=int, default=2, help="decode pods")
    parser.add_argument("--requests", type=int, default=500, help="requests per mode")
    parser.add_argument("--concurrency", type=int, default=40, help="clients, each back to back")
    parser.add_argument("--prompt-words", type=int, default=1500, help="prompt length (about one token each)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lease-seconds", type=float, default=30.0, help="kv_lease_duration (vLLM's: 30)")
    parser.add_argument("--time-scale", type=float, default=2.0, help="engine time scale (> 1 is slower)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the abort points")


@dataclass
class Pod:
    role: str
    url: str
    idle_after_s: float | None = None  # the last client's end to KV usage, running and waiting all 0
    peak_kv_usage: float = 0.0
    aborted: float = 0.0  # vllm:request_success{finished_reason="abort"}
    leases_expired: float = 0.0  # vllm:nixl_num_kv_expired_reqs
    kv_usage_at_end: float = 0.0


@dataclass
class Result:
    mode: str
    requests: int = 0
    gone_before_first_token: int = 0
    gone_mid_stream: int = 0
    answered_whole: int = 0  # complete mode: all of them; abort mode: the answer ended before the abort point
    failed: int = 0  # an error answer or event, or a broken stream, in the complete mode
    durations_s: list[float] = field(default_factory=list)
    kv_releases: float = 0.0  # the router's decode legs sent for clients gone between the legs
    client_disconnects: float = 0.0
    all_idle_after_s: float | None = None
    pods: list[Pod] = field(default_factory=list)


async def _one(
    http: Any, router: str, body: dict[str, Any], abort_after: float | None, result: Result
) -> None:
    import aiohttp

    began = time.monotonic()
    first = False
    ended = False
    try:
        async with asyncio.timeout(abort_after), http.post(router + "/v1/completions", json=body) as response:
            if response.status != 200:
                result.failed += 1
                return
            async for piece in response.content.iter_any():
                first = first or b'"text"' in piece
                if b'"error"' in piece:
                    result.failed += 1
                    return
                if b"[DONE]" in piece:
                    ended = True
    except TimeoutError:
        if abort_after is None:
            result.failed += 1
        elif first:
            result.gone_mid_stream += 1
        else:
            result.gone_before_first_token += 1
        return
    except aiohttp.ClientError:
        result.failed += 1
        return
    if ended:
        result.answered_whole += 1
        result.durations_s.append(time.monotonic() - began)
    else:
        result.failed += 1


async def _watch_peaks(http: Any, pods: list[Pod], stop: asyncio.Event) -> None:
    while not stop.is_set():
        for pod in pods:
            usage = await harness.metric_sum(http, pod.url, "vllm:kv_cache_usage_perc")
            pod.peak_kv_usage = max(pod.peak_kv_usage, usage)
        await asyncio.sleep(0.25)


async def _busy(http: Any, pod: Pod) -> bool:
    for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        if await harness.metric_sum(http, pod.url, name) > 0:
            return True
    return False


async def one_run(args: argparse.Namespace, mode: str, abort_within: float, http: Any) -> Result:
    result = Result(mode)
    rng = random.Random(args.seed)
    flags = {role: harness.nixl_flags(role, args.lease_seconds) for role in ("prefill", "decode")}
    async with harness.processes() as started:
        for role, count in (("prefill", args.prefill), ("decode", args.decode)):
            for _ in range(count):
                engine = await harness.fake_engine(started, *flags[role], time_scale=args.time_scale)
                result.pods.append(Pod(role, engine.url))
        config = {
            "static": {
                role: [p.url for p in result.pods if p.role == role] for role in ("prefill", "decode")
            },
            "servedModelName": MODEL,
            "policy": "AlwaysDisaggregate",
        }
        router = (await harness.start_router(started, config)).url
        stop_watching = asyncio.Event()
        watcher = asyncio.create_task(_watch_peaks(http, result.pods, stop_watching))
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(args.requests):
            queue.put_nowait(i)

        async def client() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                # a prompt of its own per request: no prefix cache hides what a request holds
                words = " ".join(f"w{i}-{n}" for n in range(args.prompt_words))
                body = {"model": MODEL, "prompt": f"{PROMPT}{words}", "max_tokens": args.max_tokens}
                body.update(stream=True, ignore_eos=True)
                abort_after = rng.uniform(0, abort_within) if mode == "abort" else None
                await _one(http, router, body, abort_after, result)
                result.requests += 1

        await asyncio.gather(*(client() for _ in range(args.concurrency)))
        ended = time.monotonic()
        stop_watching.set()
        await watcher
        limit = args.lease_seconds + 30
        while time.monotonic() < ended + limit:
            now = time.monotonic()
            for pod in result.pods:
                if pod.idle_after_s is None and not await _busy(http, pod):
                    pod.idle_after_s = now - ended
            if all(pod.idle_after_s is not None for pod in result.pods):
                break
            await asyncio.sleep(0.05)
        idle = [pod.idle_after_s for pod in result.pods]
        result.all_idle_after_s = None if None in idle else max(t for t in idle if t is not None)
        for pod in result.pods:
            pod.kv_usage_at_end = await harness.metric_sum(http, pod.url, "vllm:kv_cache_usage_perc")
            pod.aborted = await harness.metric_sum(
                http, pod.url, "vllm:request_success_total", finished_reason="abort"
            )
            pod.leases_expired = await harness.metric_sum(
                http, pod.url, "vllm:nixl_num_kv_expired_reqs_total"
            )
        result.kv_releases = await harness.metric_sum(
            http, router, "inferencepool_router_kv_releases_total", outcome="read"
        )
        result.client_disconnects = await harness.metric_sum(
            http, router, "inferencepool_router_client_disconnects_total"
        )
    return result


def _report(result: Result, lease: float) -> str:
    lines = [
        f"{result.mode:>8}: {result.requests} requests: {result.gone_before_first_token} gone before the "
        f"first token, {result.gone_mid_stream} gone mid-stream, {result.answered_whole} answered whole, "
        f"{result.failed} failed; router: {result.client_disconnects:g} client disconnects, "
        f"{result.kv_releases:g} KV release legs read"
    ]
    for pod in result.pods:
        idle = "NOT idle (leak)" if pod.idle_after_s is None else f"idle {pod.idle_after_s:.2f} s after"
        lines.append(
            f"          {pod.role:>7} {pod.url}: peak KV {100 * pod.peak_kv_usage:.1f}%, {idle} the last "
            f"client (KV {100 * pod.kv_usage_at_end:.1f}% then), {pod.aborted:g} aborted, "
            f"{pod.leases_expired:g} leases of {lease:g} s expired"
        )
    return "\n".join(lines)


async def _bench(args: argparse.Namespace) -> list[Result]:
    import aiohttp

    results: list[Result] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as http:
        abort_within = 0.0
        for mode in MODES:
            result = await one_run(args, mode, abort_within, http)
            results.append(result)
            if mode == "complete":
                durations = sorted(result.durations_s)
                abort_within = durations[int(0.9 * (len(durations) - 1))] if durations else 5.0
                print(
                    f"complete: request duration p50 {statistics.median(durations or [0]):.2f} s, p90 "
                    f"{abort_within:.2f} s: the abort points are drawn from [0, {abort_within:.2f}] s",
                    flush=True,
                )
            print(_report(result, args.lease_seconds), flush=True)
    return results


def run(args: argparse.Namespace) -> int:
    if min(args.prefill, args.decode, args.requests, args.concurrency) < 1:
        print("--prefill, --decode, --requests and --concurrency must be at least 1")
        return 2
    print(
        f"bench aborts: {args.requests} requests of ~{args.prompt_words} prompt tokens and {args.max_tokens} "
        f"output tokens from {args.concurrency} clients, {args.prefill} prefill + {args.decode} decode fake "
        f"engines (cpu-demo, time scale {args.time_scale:g}, KV lease {args.lease_seconds:g} s)",
        flush=True,
    )
    results = asyncio.run(_bench(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "args": {k: v for k, v in vars(args).items() if isinstance(v, int | float | str)},
        "results": [{**asdict(r), "durations_s": None} for r in results],
    }
    (out / "aborts.json").write_text(json.dumps(document, indent=2))
    print(f"wrote {out / 'aborts.json'}")
    aborted = results[-1]
    leaked = [p for p in aborted.pods if p.idle_after_s is None or p.leases_expired]
    return 1 if leaked else 0
