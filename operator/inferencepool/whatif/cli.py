"""`inferencepool diagnose POOL [-n NS]`: which phase limits the pool, the evidence, what fits, and what the
simulator predicts for the alternatives, from snapshots of the pool's own metrics over --seconds.

Live, it finds the pool's engine and router pods through the Kubernetes API (ready pods with an `http` port,
as the autoscaler does) and reads each one's /metrics by pod IP, at the start, every --sample-seconds (for the
gauges) and at the end; `--save DIR` keeps the snapshots. `--from-files A ... B` reads saved snapshots
instead, so no cluster is needed. A snapshot file is the pods' pages one after the other, each after a line
`# inferencepool-diagnose pod=NAME role=prefill|decode|router`, the file starting with
`# inferencepool-diagnose at=UNIX_SECONDS` (else the file's modification time). A file without pod lines is
one page: a router's if it holds router metrics, else one colocated engine's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

HEADER: Final = "# inferencepool-diagnose "
ROLES: Final = ("prefill", "decode", "router")
RawSnapshot = tuple[float, list[tuple[str, str, str]]]  # at, [(pod, role, page text)]


class SnapshotFileError(ValueError):
    """A snapshot file that cannot be read (the message names the file and line)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pool", nargs="?", help="the InferencePool's name (not needed with --from-files)")
    parser.add_argument("-n", "--namespace", default="default", help="its namespace. Default: default")
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig (default: $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="seconds between the first and last snapshot. Default: 30"
    )
    parser.add_argument(
        "--sample-seconds", type=float, default=5.0,
        help="read the gauges (queue, batch, KV cache) this often in between. Default: 5",
    )  # fmt: skip
    parser.add_argument(
        "--from-files", nargs="+", metavar="FILE", type=Path, default=None,
        help="read saved snapshots instead of scraping: the first and last make the window, any in "
        "between give the gauges",
    )  # fmt: skip
    parser.add_argument("--save", type=Path, default=None, help="write the snapshots into this folder")
    parser.add_argument(
        "--pool-file", type=Path, default=None,
        help="the InferencePool as YAML, for its settings with --from-files (else the flags below)",
    )  # fmt: skip
    figures = parser.add_argument_group("targets and layout (override the pool's, or stand in for it)")
    figures.add_argument(
        "--ttft-slo-ms", type=int, default=None, help="TTFT target. Default: the pool's, or 800"
    )
    figures.add_argument(
        "--itl-slo-ms", type=int, default=None, help="ITL target. Default: the pool's, or 40"
    )
    figures.add_argument(
        "--percentile", type=int, default=None, help="of the targets. Default: the pool's, or 90"
    )
    figures.add_argument(
        "--policy", choices=("LengthAware", "AlwaysDisaggregate", "Colocated"), default=None,
        help="routing policy, with --from-files and no --pool-file. Default: Colocated without prefill pages",
    )  # fmt: skip
    figures.add_argument(
        "--threshold", type=int, default=None, help="prefill threshold. Default: the router's"
    )
    sim = parser.add_argument_group("what-if")
    sim.add_argument("--no-what-if", action="store_true", help="skip the simulator replay")
    sim.add_argument(
        "--profile", default=None,
        help="engine profile to simulate. Default: the pool's FAKE_ENGINE_PROFILE, else llama-3.1-8b-h100",
    )  # fmt: skip
    sim.add_argument(
        "--what-if-seconds", type=float, default=120.0, help="seconds of traffic to replay. Default: 120"
    )


# --- snapshot files (pure)


def parse_snapshot_text(text: str, source: str, default_at: float) -> RawSnapshot:
    at = default_at
    pages: list[tuple[str, str, str]] = []
    current: tuple[str, str] | None = None
    lines: list[str] = []
    headerless: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith(HEADER):
            (lines if current is not None else headerless).append(line)
            continue
        fields = dict(part.split("=", 1) for part in line[len(HEADER) :].split() if "=" in part)
        if "at" in fields:
            try:
                at = float(fields["at"])
            except ValueError:
                raise SnapshotFileError(
                    f"{source}, line {number}: at={fields['at']!r} is not a number"
                ) from None
            continue
        pod, role = fields.get("pod"), fields.get("role")
        if not pod or role not in ROLES:
            raise SnapshotFileError(
                f"{source}, line {number}: expected '{HEADER}pod=NAME role=prefill|decode|router'"
            )
        if current is not None:
            pages.append((*current, "\n".join(lines) + "\n"))
        current, lines = (pod, role), []
    if current is not None:
        pages.append((*current, "\n".join(lines) + "\n"))
    elif any(line.strip() for line in headerless):
        body = "\n".join(headerless) + "\n"
        role = "router" if "inferencepool_router_" in body else "decode"
        pages.append((Path(source).stem, role, body))
    if not pages:
        raise SnapshotFileError(f"{source}: no metrics page in the file")
    return at, pages


def snapshot_text(raw: RawSnapshot) -> str:
    at, pages = raw
    parts = [f"{HEADER}at={at:.3f}\n"]
    for pod, role, text in pages:
        parts.append(f"{HEADER}pod={pod} role={role}\n{text.rstrip()}\n")
    return "".join(parts)


def to_snapshot(raw: RawSnapshot, source: str) -> Any:
    from inferencepool.autoscaler.histogram import MetricsError, parse_page
    from inferencepool.bottleneck.window import PodPage, Snapshot

    at, pages = raw
    parsed = []
    for pod, role, text in pages:
        try:
            parsed.append(PodPage(pod, role, parse_page(text)))  # type: ignore[arg-type]
        except MetricsError as error:
            raise SnapshotFileError(f"{source}, pod {pod}: {error}") from None
    return Snapshot(at, tuple(parsed))


def read_snapshot_file(path: Path) -> RawSnapshot:
    try:
        text = path.read_text(encoding="utf-8")
        mtime = path.stat().st_mtime
    except OSError as error:
        raise SnapshotFileError(f"{path}: cannot read: {error.strerror or error}") from None
    return parse_snapshot_text(text, str(path), mtime)


# --- live snapshots


async def scrape_pods(pods: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    import aiohttp

    from inferencepool.api import labels
    from inferencepool.api.pods import http_url, is_ready

    targets = [
        (str(pod["metadata"]["name"]), role, url)
        for pod in pods
        if (role := (pod["metadata"].get("labels") or {}).get(labels.LABEL_ROLE)) in ROLES
        and is_ready(pod)
        and (url := http_url(pod)) is not None
    ]

    async def fetch(session: aiohttp.ClientSession, url: str) -> str | None:
        try:
            async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as response:
                return await response.text() if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None

    async with aiohttp.ClientSession(trust_env=False) as session:
        pages = await asyncio.gather(*(fetch(session, url) for _, _, url in targets))
    return [(name, role, page) for (name, role, _), page in zip(targets, pages, strict=True) if page]


def _live_snapshot(kube: Any, namespace: str, pool: str) -> RawSnapshot:
    from inferencepool.api import labels

    pods = kube.list("v1", "Pod", namespace, f"{labels.LABEL_POOL}={pool}")
    at = time.time()
    return at, asyncio.run(scrape_pods(pods))


# --- the command


def _profile_name(args: argparse.Namespace, pool: Any) -> str:
    if args.profile:
        return str(args.profile)
    if pool is not None:
        for variable in pool.spec.engine.extra_env:
            if variable.get("name") == "FAKE_ENGINE_PROFILE" and variable.get("value"):
                return str(variable["value"])
    return "llama-3.1-8b-h100"


def _settings(args: argparse.Namespace, pool: Any, later: Any) -> Any:
    from dataclasses import replace

    from inferencepool.bottleneck.settings import PoolSettings, settings_from_pool

    found = {role: sum(p.role == role for p in later.pages) for role in ("prefill", "decode")}
    if pool is not None:
        settings = settings_from_pool(
            pool, {r: n for r, n in found.items() if n}, args.ttft_slo_ms, args.itl_slo_ms
        )
    else:
        from inferencepool.autoscaler.capacity import from_profile
        from inferencepool.perf.profiles import get_profile

        policy = args.policy or ("LengthAware" if found["prefill"] else "Colocated")
        settings = PoolSettings(
            ttft_target_ms=args.ttft_slo_ms or 800,
            itl_target_ms=args.itl_slo_ms or 40,
            policy=policy,
            prefill_replicas=found["prefill"] if policy != "Colocated" else 0,
            decode_replicas=max(found["decode"], 1),
            # the planner sizes replicas with the profile's table (with a pool: its engines', as the operator)
            capacity=from_profile(get_profile(_profile_name(args, pool))),
        )
    changes: dict[str, Any] = {}
    if args.percentile is not None:
        changes["percentile"] = args.percentile
    threshold = args.threshold
    if threshold is None and pool is None:
        from inferencepool.bottleneck.window import ROUTER_THRESHOLD

        gauges = [s[2] for p in later.pages if p.role == "router" for s in p.page.get(ROUTER_THRESHOLD, [])]
        threshold = round(sum(gauges) / len(gauges)) if gauges else None
    if threshold is not None:
        changes["threshold_tokens"] = threshold
    return replace(settings, **changes) if changes else settings


def run(args: argparse.Namespace) -> int:
    import yaml
    from pydantic import ValidationError

    from inferencepool.api.v1alpha1 import API_VERSION, InferencePool
    from inferencepool.bottleneck.report import render
    from inferencepool.bottleneck.window import WindowError
    from inferencepool.perf.profiles import get_profile
    from inferencepool.whatif.analysis import analyse

    def fail(message: str) -> int:
        print(f"inferencepool diagnose: {message}", file=sys.stderr)
        return 2

    pool: InferencePool | None = None
    try:
        if args.pool_file is not None:
            pool = InferencePool.model_validate(yaml.safe_load(args.pool_file.read_text(encoding="utf-8")))
        if args.from_files is not None:
            if len(args.from_files) < 2:
                return fail("--from-files needs at least two snapshots (the window's start and end)")
            raws = [read_snapshot_file(path) for path in args.from_files]
            sources = [str(path) for path in args.from_files]
            name = pool.name() if pool is not None else args.pool or sources[-1]
        else:
            if not args.pool:
                return fail("name the pool (inferencepool diagnose POOL -n NAMESPACE), or give --from-files")
            from inferencepool.api import labels
            from inferencepool.kube.client import Kube, KubeError, load_configuration

            kube = Kube(load_configuration(args.kubeconfig))
            try:
                document = kube.get(API_VERSION, labels.KIND, args.namespace, args.pool)
                if document is None:
                    return fail(f"InferencePool {args.namespace}/{args.pool} not found")
                pool = InferencePool.model_validate(document)
                every = f", every {args.sample_seconds:g} s" if args.sample_seconds < args.seconds else ""
                print(
                    f"reading {args.namespace}/{args.pool} for {args.seconds:g} s{every} ...", file=sys.stderr
                )
                raws = [_live_snapshot(kube, args.namespace, args.pool)]
                end = raws[0][0] + args.seconds
                while (left := end - time.time()) > 0:
                    time.sleep(min(left, max(args.sample_seconds, 0.5)))
                    raws.append(_live_snapshot(kube, args.namespace, args.pool))
            except KubeError as error:
                return fail(f"Kubernetes API: {error}")
            finally:
                kube.close()
            if not raws[-1][1]:
                return fail(f"no ready pod of {args.namespace}/{args.pool} answered on /metrics")
            sources = [f"snapshot {n}" for n in range(1, len(raws) + 1)]
            name = f"{args.namespace}/{args.pool}"
        if args.save is not None:
            args.save.mkdir(parents=True, exist_ok=True)
            for number, raw in enumerate(raws, start=1):
                (args.save / f"snapshot-{number:03d}.txt").write_text(snapshot_text(raw), encoding="utf-8")
        snapshots = [to_snapshot(raw, source) for raw, source in zip(raws, sources, strict=True)]
        earlier, later = snapshots[0], snapshots[-1]
        settings = _settings(args, pool, later)
        profile = None
        if not args.no_what_if:
            profile = get_profile(_profile_name(args, pool))
            if pool is not None:
                engine = pool.spec.engine
                profile = profile.with_overrides(
                    tensor_parallel=engine.tensor_parallel_size, max_model_len=engine.max_model_len
                )
        analysis = analyse(
            earlier,
            later,
            settings,
            profile,
            what_if_seconds=args.what_if_seconds,
            during=snapshots[1:-1],
            pool=pool,
        )
    except (OSError, yaml.YAMLError, ValidationError, SnapshotFileError, WindowError, ValueError) as error:
        return fail(str(error))
    note = f"({profile.name}, {args.what_if_seconds:g} s of Poisson arrivals)" if profile is not None else ""
    print(render(name, analysis.diagnosis, settings, analysis.window.seconds, analysis.what_if, note), end="")
    if args.save is not None:
        print(f"snapshots in {args.save}/ (inferencepool diagnose --from-files {args.save}/snapshot-*.txt)")
    return 0
