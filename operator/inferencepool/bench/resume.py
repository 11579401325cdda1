"""`inferencepool bench resume`: how many streams survive a decode engine killed mid-answer.

Fake decode engines (`--engines`, each its own process, profile cpu-demo slowed by `--time-scale` so answers
take seconds) sit behind this router (its own process, policy Colocated). `--streams` concurrent streamed
requests go through the router, a mix of chat and completions, with and without a token limit (a chat then
stops on its own, a completion gets vLLM's default 16) and with and without `stream_options.include_usage`.
Once every stream has received `--kill-after` events, one engine gets SIGKILL, as a crashed pod's engine does.

Each stream is judged against the answer an unkilled engine gives to the same request (the fake engine is
deterministic): whole (the same text, one id, one finish_reason, the same usage, [DONE], no error), broken (an
error event or no end), or wrong (it ended cleanly but is not that answer: duplicated or missing tokens, a
second id, wrong usage). The router's inferencepool_router_streams_resumed counter says how many of the
killed engine's streams it resumed and how many it gave up on. The baseline is the same run with
`resumeStreams: false`: every stream of the killed engine breaks. `--rounds` repeats both (fresh engines).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferencepool.bench import harness
from inferencepool.bench.harness import MODEL

MODES = ("resume", "no-resume")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engines", type=int, default=3, help="decode engines (one of them is killed)")
    parser.add_argument("--streams", type=int, default=60, help="concurrent streams per round")
    parser.add_argument("--max-tokens", type=int, default=48, help="limit of the streams that set one")
    parser.add_argument(
        "--kill-after", type=int, default=4, help="events every stream has when the kill comes"
    )
    parser.add_argument("--rounds", type=int, default=1, help="kills per mode (each on fresh engines)")
    parser.add_argument("--time-scale", type=float, default=5.0, help="engine time scale (> 1 is slower)")


def request_for(i: int, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The i-th stream's path and body: chat or completion, a token limit or not, usage asked for or not."""
    text = f"request {i}: how does a pool split prefill and decode"
    body: dict[str, Any] = {"model": MODEL, "stream": True}
    if i % 3 == 0:
        body["stream_options"] = {"include_usage": True}
    if i % 4 < 2:  # the rest: a chat stops on its own, a completion gets vLLM's default 16 tokens
        body["max_tokens"] = max_tokens
    if i % 2:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": text}]}
    return "/v1/completions", {**body, "prompt": text}


@dataclass
class Answer:
    """What a client made of one stream."""

    text: str = ""
    ids: set[str] = field(default_factory=set)
    finish_reasons: list[str] = field(default_factory=list)
    usages: list[dict[str, Any]] = field(default_factory=list)
    roles: int = 0
    events: int = 0
    done: bool = False
    error: str | None = None
    times: list[float] = field(default_factory=list)  # when each event arrived (monotonic)

    def gap_across(self, instant: float) -> float | None:
        """Seconds from the last event before `instant` to the first after it (None without both)."""
        before = [t for t in self.times if t <= instant]
        after = [t for t in self.times if t > instant]
        return after[0] - before[-1] if before and after else None

    def add(self, event: bytes, chat: bool) -> None:
        data = event.strip().removeprefix(b"data:").strip()
        if data == b"[DONE]":
            self.done = True
            return
        chunk = json.loads(data)
        if "error" in chunk:
            self.error = str(chunk["error"].get("message"))
            return
        self.events += 1
        if "id" in chunk:
            self.ids.add(chunk["id"])
        if chunk.get("usage"):
            self.usages.append({k: chunk["usage"][k] for k in ("prompt_tokens", "completion_tokens")})
        for choice in chunk.get("choices") or ():
            if chat:
                delta = choice.get("delta") or {}
                self.roles += "role" in delta
                self.text += delta.get("content") or ""
            else:
                self.text += choice.get("text") or ""
            if choice.get("finish_reason") is not None:
                self.finish_reasons.append(choice["finish_reason"])

    def matches(self, reference: Answer) -> bool:
        return (
            self.done
            and self.error is None
            and self.text == reference.text
            and len(self.ids) == 1
            and self.finish_reasons == reference.finish_reasons
            and self.usages == reference.usages
            and self.roles == reference.roles
        )

    def verdict(self, reference: Answer) -> str:
        if self.error is not None or not self.done:
            return "broken"
        return "whole" if self.matches(reference) else "wrong"


async def read_stream(
    http: Any,
    url: str,
    body: dict[str, Any],
    chat: bool,
    progressed: asyncio.Event | None = None,
    after: int = 0,
) -> Answer:
    """One streamed request, read event by event; `progressed` is set once `after` events have come."""
    import aiohttp

    answer = Answer()
    try:
        async with http.post(url, json=body) as response:
            if response.status != 200:
                answer.error = f"status {response.status}"
                return answer
            buffer = b""
            async for piece in response.content.iter_any():
                buffer += piece
                *whole, buffer = buffer.split(b"\n\n")
                for event in whole:
                    if event.strip():
                        answer.add(event, chat)
                        answer.times.append(time.monotonic())
                if progressed is not None and answer.events >= after:
                    progressed.set()
    except (aiohttp.ClientError, TimeoutError) as error:
        answer.error = answer.error or f"connection: {error!r}"
    if progressed is not None:
        progressed.set()
    return answer


@dataclass
class Round:
    mode: str
    streams: int
    whole: int
    broken: int
    wrong: int
    resumed: int  # the router's count of the killed engine's streams it resumed
    router_broken: int  # ... and of those it could not resume
    seconds: float
    wrong_examples: list[str] = field(default_factory=list)
    # Each stream's gap across the kill, largest first: the `resumed` largest are the resumed streams'
    # pause (detecting the death, the continuation's prefill); the rest are the other streams' next token.
    gaps_across_kill_ms: list[float] = field(default_factory=list)

    @property
    def hit(self) -> int:
        """Streams the kill interrupted: the router counts them when it may resume; without resumption
        each of them breaks."""
        return self.resumed + self.router_broken if self.mode == "resume" else self.broken


async def _engine(args: argparse.Namespace, started: list[asyncio.subprocess.Process]) -> tuple[int, str]:
    engine = await harness.fake_engine(started, time_scale=args.time_scale)
    return len(started) - 1, engine.url


async def _router(
    decode: list[str], resume: bool, started: list[asyncio.subprocess.Process]
) -> tuple[asyncio.subprocess.Process, str]:
    config = {
        "static": {"prefill": [], "decode": decode},
        "servedModelName": MODEL,
        "policy": "Colocated",
        "resumeStreams": resume,
    }
    router = await harness.start_router(started, config)
    return router.process, router.url


async def _resumed(http: Any, router: str) -> tuple[int, int]:
    found = await harness.metric_samples(http, router, "inferencepool_router_streams_resumed_total")
    counts = {"resumed": 0.0, "broken": 0.0}
    for labels, value in found:
        counts[labels["outcome"]] += value
    return int(counts["resumed"]), int(counts["broken"])


async def references(http: Any, url: str, args: argparse.Namespace) -> list[Answer]:
    """Each request's answer from an engine nobody kills."""
    requests = [request_for(i, args.max_tokens) for i in range(args.streams)]
    return list(
        await asyncio.gather(
            *(
                read_stream(http, url + path, body, path.endswith("chat/completions"))
                for path, body in requests
            )
        )
    )


async def one_round(args: argparse.Namespace, mode: str, http: Any) -> Round:
    async with harness.processes() as started:
        engines = [await _engine(args, started) for _ in range(args.engines)]
        reference = await references(http, engines[-1][1], args)
        _, router = await _router([url for _, url in engines], mode == "resume", started)
        progressed = [asyncio.Event() for _ in range(args.streams)]
        requests = [request_for(i, args.max_tokens) for i in range(args.streams)]
        began = time.monotonic()
        streams = [
            asyncio.create_task(
                read_stream(
                    http,
                    router + path,
                    body,
                    path.endswith("chat/completions"),
                    progressed[i],
                    args.kill_after,
                )
            )
            for i, (path, body) in enumerate(requests)
        ]
        async with asyncio.timeout(120):
            await asyncio.gather(*(p.wait() for p in progressed))
        doomed = started[engines[0][0]]
        killed_at = time.monotonic()
        doomed.send_signal(signal.SIGKILL)
        async with asyncio.timeout(300):
            answers = await asyncio.gather(*streams)
        seconds = time.monotonic() - began
        resumed, router_broken = await _resumed(http, router)
    verdicts = [a.verdict(r) for a, r in zip(answers, reference, strict=True)]
    wrong = [
        f"{requests[i][0]} #{i}: got {a.text!r} ids={sorted(a.ids)} usage={a.usages}, "
        f"expected {reference[i].text!r} usage={reference[i].usages}"
        for i, (a, v) in enumerate(zip(answers, verdicts, strict=True))
        if v == "wrong"
    ]
    return Round(
        mode=mode,
        streams=args.streams,
        whole=verdicts.count("whole"),
        broken=verdicts.count("broken"),
        wrong=verdicts.count("wrong"),
        resumed=resumed,
        router_broken=router_broken,
        seconds=seconds,
        wrong_examples=wrong[:3],
        gaps_across_kill_ms=sorted(
            (gap * 1e3 for a in answers if (gap := a.gap_across(killed_at)) is not None), reverse=True
        ),
    )


async def _bench(args: argparse.Namespace) -> list[Round]:
    import aiohttp

    rounds: list[Round] = []
    print(
        f"{'round':>5} {'mode':>10} {'streams':>7} {'hit':>4} {'resumed':>7} {'whole':>6} {'broken':>6} "
        f"{'wrong':>5}"
    )
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
        for index in range(args.rounds):
            for mode in MODES:  # both modes in every round: a drift in machine load hits both alike
                result = await one_round(args, mode, http)
                rounds.append(result)
                print(
                    f"{index + 1:>5} {mode:>10} {result.streams:>7} {result.hit:>4} {result.resumed:>7} "
                    f"{result.whole:>6} {result.broken:>6} {result.wrong:>5}",
                    flush=True,
                )
                for example in result.wrong_examples:
                    print(f"      wrong: {example}", flush=True)
    return rounds


def summarize(rounds: list[Round]) -> dict[str, dict[str, int]]:
    totals: dict[str, dict[str, int]] = {}
    for mode in MODES:
        mine = [r for r in rounds if r.mode == mode]
        totals[mode] = {
            key: sum(getattr(r, key) for r in mine)
            for key in ("streams", "hit", "resumed", "router_broken", "whole", "broken", "wrong")
        }
    return totals


def pauses(rounds: list[Round]) -> dict[str, float]:
    """Median gap across the kill of the resumed streams vs the other streams (resume rounds)."""
    import statistics

    resumed = [g for r in rounds if r.mode == "resume" for g in r.gaps_across_kill_ms[: r.resumed]]
    others = [g for r in rounds if r.mode == "resume" for g in r.gaps_across_kill_ms[r.resumed :]]
    nan = float("nan")
    resumed_ms = statistics.median(resumed) if resumed else nan
    others_ms = statistics.median(others) if others else nan
    return {
        "resumed_pause_p50_ms": resumed_ms,
        "other_streams_gap_p50_ms": others_ms,
        "ratio": resumed_ms / others_ms if others_ms else nan,
    }


def _plot(totals: dict[str, dict[str, int]], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("whole", "broken", "wrong", "hit", "resumed")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.38
    for offset, mode in ((-width / 2, "resume"), (width / 2, "no-resume")):
        values = [totals[mode][k] for k in keys]
        bars = ax.bar(
            [i + offset for i in range(len(keys))],
            values,
            width,
            label=f"resumeStreams {mode != 'no-resume'}",
        )
        ax.bar_label(bars)
    ax.set_xticks(
        range(len(keys)), ["whole answers", "broken", "wrong text", "on the killed engine", "resumed"]
    )
    ax.set_ylabel("streams")
    ax.set_title(
        f"{args.streams} streams x {args.rounds} round(s) over {args.engines} decode engines, one SIGKILLed"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if args.engines < 2:
        print("--engines must be at least 2 (one is killed, another resumes)", file=sys.stderr)
        return 2
    if args.streams < 1 or args.rounds < 1 or args.kill_after < 1:
        print("--streams, --rounds and --kill-after must be at least 1", file=sys.stderr)
        return 2
    if args.kill_after >= min(args.max_tokens, 16):
        print(
            "--kill-after must be below --max-tokens and 16 (the default completion length)", file=sys.stderr
        )
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"bench resume: {args.streams} streams over {args.engines} fake decode engines (cpu-demo, time "
        f"scale {args.time_scale:g}), one SIGKILLed after {args.kill_after} events per stream, "
        f"{args.rounds} round(s)",
        flush=True,
    )
    rounds = asyncio.run(_bench(args))
    totals = summarize(rounds)
    paused = pauses(rounds)
    summary = {
        "totals": totals,
        "pause_at_kill": paused,
        "rounds": [{**asdict(r), "hit": r.hit} for r in rounds],
        "settings": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str))},
    }
    (out / "resume.json").write_text(json.dumps(summary, indent=2))
    _plot(totals, out / "resume.png", args)
    for mode in MODES:
        t = totals[mode]
        print(
            f"{mode}: {t['hit']} of {t['streams']} streams were on the killed engine; {t['resumed']} "
            f"resumed, {t['router_broken']} given up; clients got {t['whole']} whole answers, "
            f"{t['broken']} broken, {t['wrong']} wrong"
        )
    print(
        f"a resumed stream paused {paused['resumed_pause_p50_ms']:.0f} ms at the kill (p50), "
        f"x{paused['ratio']:.1f} the other streams' gap across it "
        f"({paused['other_streams_gap_p50_ms']:.0f} ms)"
    )
    print(f"results in {out / 'resume.json'}, plot {out / 'resume.png'}")
    return 0
