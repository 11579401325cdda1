"""`inferencepool bench router`: what the router costs, against direct-to-engine and the Rust vllm-router.

Fake engines with the zero-compute profile (every model cost is zero, so the engine is bound by its own CPU)
run on loopback: one prefill, one decode. Each target gets the same streamed completions at concurrency 1 and
32:

- direct         : the load generator talks to the decode engine (the round-robin baseline);
- direct-pd      : the load generator runs the NIXL handshake itself, prefill then decode (the P/D baseline);
- router-rr      : this router, policy Colocated (one leg, pick + relay);
- router-pd      : this router, policy AlwaysDisaggregate (the full handshake);
- vllm-router-rr : vllm-router --policy round_robin --worker-urls <decode>;
- vllm-router-pd : vllm-router --vllm-pd-disaggregation --prefill <p> --decode <d> --policy round_robin.

With `--baseline-source DIR` (the `operator/` folder of another checkout, e.g. after
`git archive <commit> operator | tar -x -C /tmp/base`, DIR=/tmp/base/operator), that checkout's router also
runs, as base-router-rr and base-router-pd, against the same engines in the same rounds: the way to tell a
change's cost from the machine's noise.

All targets run side by side and each concurrency level is measured in rounds that visit them in turn, so
drifts in machine load (a shared 2-core machine) hit all of them alike. Added latency is a router's TTFT minus
its baseline's at the same concurrency (p50 and p99). Router CPU per request is the router process's
utime+stime delta (/proc/PID/stat, threads included) over the requests it served. The load generator is one
aiohttp client in this process; engines and routers are separate processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferencepool.router.handshake import nixl_decode_body, nixl_prefill_body

MODEL = "bench"
TARGETS = ("direct", "direct-pd", "router-rr", "router-pd", "vllm-router-rr", "vllm-router-pd")
BASELINE = {
    "router-rr": "direct",
    "router-pd": "direct-pd",
    "base-router-rr": "direct",
    "base-router-pd": "direct-pd",
    "vllm-router-rr": "direct",
    "vllm-router-pd": "direct-pd",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=400, help="requests per target at concurrency 1")
    parser.add_argument("--seconds", type=float, default=6.0, help="time per target at concurrency > 1")
    parser.add_argument("--rounds", type=int, default=4, help="rounds that visit every target in turn")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32], help="concurrency levels")
    parser.add_argument("--max-tokens", type=int, default=16, help="streamed tokens per request")
    parser.add_argument("--prompt-words", type=int, default=64, help="words per prompt")
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument(
        "--baseline-source",
        type=Path,
        default=None,
        help="operator/ folder of another checkout whose router runs beside this one (base-router-rr/pd)",
    )
    parser.add_argument(
        "--event-loops",
        nargs="+",
        choices=("uvloop", "asyncio"),
        default=["uvloop"],
        help="event loops to run this router with (give both to compare the HTTP stack)",
    )


@dataclass
class RunResult:
    target: str
    concurrency: int
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    ttft_ms: list[float] = field(default_factory=list)
    cpu_seconds: float | None = None

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def pct(self, p: float) -> float:
        ordered = sorted(self.ttft_ms)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]

    @property
    def cpu_ms_per_request(self) -> float | None:
        return (
            None if self.cpu_seconds is None or not self.requests else self.cpu_seconds * 1000 / self.requests
        )

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        del data["ttft_ms"]
        data.update(
            rps=round(self.rps, 1),
            ttft_p50_ms=round(self.pct(50), 3),
            ttft_p99_ms=round(self.pct(99), 3),
            cpu_ms_per_request=None if self.cpu_ms_per_request is None else round(self.cpu_ms_per_request, 3),
        )
        return data


# ---- processes ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its live descendants (vllm-router's launcher may fork)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for proc in _tree(pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{proc}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _tree(pid: int) -> Iterator[int]:
    yield pid
    children = Path(f"/proc/{pid}/task/{pid}/children")
    with contextlib.suppress(OSError):
        for child in children.read_text().split():
            yield from _tree(int(child))


class Fleet:
    """Processes started by the benchmark, stopped (SIGTERM, then SIGKILL) by PID at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)


async def wait_http(url: str, seconds: float = 60.0) -> None:
    import aiohttp

    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer 200 within {seconds:.0f}s")
            await asyncio.sleep(0.2)


# ---- load generator ----------------------------------------------------------------------------------------


def make_prompt(words: int, index: int) -> str:
    return f"request {index}: " + " ".join(f"word{(index * 7 + i) % 997}" for i in range(words))


async def one_request(session: Any, target: str, base: str, prefill: str, body: dict[str, Any]) -> float:
    """Returns TTFT in ms (send -> first streamed event), after reading the whole stream."""
    started = time.perf_counter()
    payload = body
    if target == "direct-pd":
        # The same pure leg builders the router uses, so the baseline differs only in who drives them.
        async with session.post(prefill + "/v1/completions", json=nixl_prefill_body(body)) as response:
            answer = await response.json()
            if response.status != 200:
                raise RuntimeError(f"prefill leg {response.status}: {answer}")
        payload = nixl_decode_body(body, answer)
    ttft = None
    async with session.post(base + "/v1/completions", json=payload) as response:
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {(await response.read())[:200]!r}")
        async for chunk in response.content.iter_any():
            if ttft is None and b"data:" in chunk:
                ttft = (time.perf_counter() - started) * 1000
    if ttft is None:
        raise RuntimeError("stream carried no event")
    return ttft


class LoadGenerator:
    """One aiohttp client (in this process) driving any target; slices of a run add up in a RunResult."""

    def __init__(self, args: argparse.Namespace, prefill: str) -> None:
        self.args = args
        self.prefill = prefill
        self._index = 0

    def body(self) -> dict[str, Any]:
        self._index += 1
        return {
            "model": MODEL,
            "prompt": make_prompt(self.args.prompt_words, self._index),
            "max_tokens": self.args.max_tokens,
            "stream": True,
            "ignore_eos": True,
        }

    async def warm(self, session: Any, target: Target, concurrency: int) -> None:
        """Open connections and warm code paths so the first slice measures steady state."""

        async def one() -> None:
            for _ in range(2):
                await one_request(session, target.kind, target.base, self.prefill, self.body())

        await asyncio.gather(*(one() for _ in range(max(10, concurrency))))

    async def slice(
        self,
        session: Any,
        target: Target,
        concurrency: int,
        result: RunResult,
        requests: int | None,
        seconds: float,
    ) -> None:
        """Run `requests` requests (or for `seconds`) at `concurrency` and add them to `result`."""
        import aiohttp

        budget = requests
        deadline = time.perf_counter() + seconds
        cpu_before = cpu_seconds(target.pid) if target.pid else None
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal budget
            while True:
                if budget is not None:
                    if budget <= 0:
                        return
                    budget -= 1
                elif time.perf_counter() >= deadline:
                    return
                try:
                    body = self.body()
                    result.ttft_ms.append(
                        await one_request(session, target.kind, target.base, self.prefill, body)
                    )
                    result.requests += 1
                except (aiohttp.ClientError, RuntimeError, TimeoutError):
                    result.errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.seconds += time.perf_counter() - started
        if target.pid and cpu_before is not None:
            result.cpu_seconds = (result.cpu_seconds or 0.0) + cpu_seconds(target.pid) - cpu_before


@dataclass
class Target:
    label: str
    kind: str  # one of TARGETS: decides how a request is sent
    base: str
    pid: int | None = None


# ---- the run -----------------------------------------------------------------------------------------------


def python_cmd(*argv: str) -> list[str]:
    return [sys.executable, "-m", "inferencepool", *argv]


def engine_cmd(port: int, role: str) -> list[str]:
    return python_cmd(
        "fake-engine", "serve", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--profile", "zero", "--role", role, "--served-model-name", MODEL,
    )  # fmt: skip


def router_cmd(target: str, port: int, prefill: str, decode: str, loop: str) -> list[str]:
    policy = "AlwaysDisaggregate" if target == "router-pd" else "Colocated"
    return python_cmd(
        "router", "--host", "127.0.0.1", "--port", str(port), "--prefill", prefill, "--decode", decode,
        "--policy", policy, "--served-model-name", MODEL, "--event-loop", loop, "--log-level", "WARNING",
    )  # fmt: skip


def vllm_router_cmd(target: str, port: int, prefill: str, decode: str) -> list[str]:
    binary = shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))
    # Each instance exports its own Prometheus port (a fixed default otherwise, so two would collide).
    common = [
        "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin", "--log-level", "warning",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    if target == "vllm-router-pd":
        return [binary, *common, "--vllm-pd-disaggregation", "--prefill", prefill, "--decode", decode]
    return [binary, *common, "--worker-urls", decode]


async def bench(args: argparse.Namespace, out: Path) -> list[RunResult]:
    """Every target runs side by side; each concurrency level is measured in rounds that visit the targets in
    turn, so slow drifts in machine load (other processes on a shared machine) hit all of them alike."""
    import aiohttp

    fleet = Fleet(out)
    results: list[RunResult] = []
    try:
        prefill_port, decode_port = free_port(), free_port()
        prefill = f"http://127.0.0.1:{prefill_port}"
        decode = f"http://127.0.0.1:{decode_port}"
        fleet.start("engine-prefill", engine_cmd(prefill_port, "prefill"))
        fleet.start("engine-decode", engine_cmd(decode_port, "decode"))
        await wait_http(prefill + "/health")
        await wait_http(decode + "/health")
        print(f"fake engines up (profile zero): prefill {prefill}, decode {decode}", flush=True)
        targets: list[Target] = []
        for kind in args.targets:
            loops = args.event_loops if kind.startswith("router-") else [""]
            for loop in loops:
                label = f"{kind}({loop})" if loop and len(args.event_loops) > 1 else kind
                if not kind.startswith(("router-", "vllm-router-")):
                    targets.append(Target(label, kind, decode))
                    continue
                port = free_port()
                argv = (
                    router_cmd(kind, port, prefill, decode, loop)
                    if kind.startswith("router-")
                    else vllm_router_cmd(kind, port, prefill, decode)
                )
                proc = fleet.start(label, argv)
                targets.append(Target(label, kind, f"http://127.0.0.1:{port}", proc.pid))
                if args.baseline_source is not None and kind.startswith("router-"):
                    base_port = free_port()
                    env = {**os.environ, "PYTHONPATH": str(Path(args.baseline_source).resolve())}
                    base_label = f"base-{label}"
                    base = fleet.start(base_label, router_cmd(kind, base_port, prefill, decode, loop), env)
                    targets.append(Target(base_label, kind, f"http://127.0.0.1:{base_port}", base.pid))
        for target in targets:
            if target.pid:
                await wait_http(target.base + "/health", 90)
        print(f"targets up: {', '.join(t.label for t in targets)}", flush=True)
        generator = LoadGenerator(args, prefill)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=60)
        ) as session:
            for concurrency in args.concurrency:
                level = {t.label: RunResult(target=t.label, concurrency=concurrency) for t in targets}
                for target in targets:
                    await generator.warm(session, target, concurrency)
                requests = max(1, args.requests // args.rounds) if concurrency == 1 else None
                for round_index in range(args.rounds):
                    order = targets[round_index % len(targets) :] + targets[: round_index % len(targets)]
                    for target in order:
                        await generator.slice(
                            session,
                            target,
                            concurrency,
                            level[target.label],
                            requests,
                            args.seconds / args.rounds,
                        )
                    print(
                        f"concurrency {concurrency}: round {round_index + 1}/{args.rounds} done", flush=True
                    )
                for target in targets:
                    result = level[target.label]
                    results.append(result)
                    cpu = result.cpu_ms_per_request
                    print(
                        f"  {target.label:<22} c{concurrency:<3} {result.rps:8.1f} req/s"
                        f"  TTFT p50 {result.pct(50):7.2f} ms  p99 {result.pct(99):7.2f} ms"
                        + (f"  CPU {cpu:.3f} ms/req" if cpu is not None else "")
                        + (f"  ({result.errors} errors)" if result.errors else ""),
                        flush=True,
                    )
    finally:
        fleet.stop_all()
    return results


def report(results: list[RunResult]) -> dict[str, Any]:
    by_key = {(r.target, r.concurrency): r for r in results}
    rows: list[dict[str, Any]] = []
    for r in results:
        row = r.summary()
        base_name = BASELINE.get(r.target.split("(")[0])
        baseline = by_key.get((base_name, r.concurrency)) if base_name else None
        if baseline is not None:
            row["added_p50_ms"] = round(r.pct(50) - baseline.pct(50), 3)
            row["added_p99_ms"] = round(r.pct(99) - baseline.pct(99), 3)
            row["rps_vs_baseline"] = round(r.rps / baseline.rps, 3) if baseline.rps else None
        rows.append(row)
    ratios: list[str] = []
    for mode, prefix in (("rr", "vllm-router-"), ("pd", "vllm-router-"), ("rr", "base-"), ("pd", "base-")):
        for r in results:
            if not r.target.startswith(f"router-{mode}"):
                continue
            theirs_name = f"{prefix}{r.target}" if prefix == "base-" else f"{prefix}{mode}"
            theirs = by_key.get((theirs_name, r.concurrency))
            mine = next(
                row for row in rows if row["target"] == r.target and row["concurrency"] == r.concurrency
            )
            other = next(
                (row for row in rows if row["target"] == theirs_name and row["concurrency"] == r.concurrency),
                None,
            )
            if theirs is None or other is None:
                continue
            parts = [f"{r.target} vs {theirs_name} @c{r.concurrency}:"]
            parts.append(f"added p50 {mine.get('added_p50_ms')} vs {other.get('added_p50_ms')} ms")
            if r.cpu_ms_per_request and theirs.cpu_ms_per_request:
                parts.append(
                    f"CPU/req {r.cpu_ms_per_request:.3f} vs {theirs.cpu_ms_per_request:.3f} ms "
                    f"(x{r.cpu_ms_per_request / theirs.cpu_ms_per_request:.2f})"
                )
            if theirs.rps:
                parts.append(f"req/s x{r.rps / theirs.rps:.2f}")
            ratios.append("  ".join(parts))
    return {"rows": rows, "ratios": ratios}


def plot(results: list[RunResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted({r.concurrency for r in results})
    targets = list(dict.fromkeys(r.target for r in results))
    by_key = {(r.target, r.concurrency): r for r in results}
    fig, axes = plt.subplots(1, len(levels) + 2, figsize=(5 * (len(levels) + 2), 4.5))
    for axis, level in zip(axes, levels, strict=False):
        p50 = [by_key[(t, level)].pct(50) if (t, level) in by_key else 0 for t in targets]
        p99 = [by_key[(t, level)].pct(99) if (t, level) in by_key else 0 for t in targets]
        xs = range(len(targets))
        axis.bar([x - 0.2 for x in xs], p50, width=0.4, label="p50")
        axis.bar([x + 0.2 for x in xs], p99, width=0.4, label="p99")
        axis.set_xticks(list(xs), targets, rotation=40, ha="right", fontsize=8)
        axis.set_ylabel("TTFT (ms)")
        axis.set_title(f"TTFT at concurrency {level}")
        axis.legend()
    axis = axes[-1]
    routers = [
        t for t in targets if any(by_key[(t, lv)].cpu_ms_per_request for lv in levels if (t, lv) in by_key)
    ]
    width = 0.8 / len(levels)
    for index, level in enumerate(levels):
        cpu = [(by_key[(t, level)].cpu_ms_per_request or 0) if (t, level) in by_key else 0 for t in routers]
        axis.bar(
            [x + index * width for x in range(len(routers))], cpu, width=width, label=f"concurrency {level}"
        )
    axis.set_xticks(list(range(len(routers))), routers, rotation=40, ha="right", fontsize=8)
    axis.set_ylabel("router CPU ms per request")
    axis.set_title("Router CPU per request")
    axis.legend()
    axis = axes[-2]
    top = max(levels)
    rps = [by_key[(t, top)].rps if (t, top) in by_key else 0 for t in targets]
    axis.bar(range(len(targets)), rps, color="tab:green")
    axis.set_xticks(list(range(len(targets))), targets, rotation=40, ha="right", fontsize=8)
    axis.set_ylabel("requests/s")
    axis.set_title(f"Throughput at concurrency {top}")
    fig.suptitle("Router overhead on zero-compute fake engines (loopback)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out) / "router"
    out.mkdir(parents=True, exist_ok=True)
    runner: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    started = time.time()
    results = runner(bench(args, out))
    summary = report(results)
    summary["settings"] = {
        "requests_at_c1": args.requests,
        "seconds_per_run": args.seconds,
        "max_tokens": args.max_tokens,
        "prompt_words": args.prompt_words,
        "cpus": os.cpu_count(),
        "wall_seconds": round(time.time() - started, 1),
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    plot(results, out / "router.png")
    print("\nadded latency vs baseline (direct for rr, client-side handshake for pd):")
    for row in summary["rows"]:
        if "added_p50_ms" in row:
            print(
                f"  {row['target']:<22} c{row['concurrency']:<3} +{row['added_p50_ms']:.3f} ms p50  "
                f"+{row['added_p99_ms']:.3f} ms p99  req/s x{row['rps_vs_baseline']}"
            )
    print("\nthis router vs vllm-router (and vs --baseline-source), same run:")
    for line in summary["ratios"]:
        print("  " + line)
    print(f"\nwrote {out / 'results.json'} and {out / 'router.png'}")
    return 0
