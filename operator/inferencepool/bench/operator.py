"""`inferencepool bench operator`: how fast the operator turns a pool into its children, and what 100 cost.

Runs the real operator (`inferencepool operator`, a separate process so its memory can be read from /proc)
against the local control plane. The clock for a pool runs from the create call until the pool's status shows
the operator has applied every child (status.observedGeneration is written right after the last apply); the
children are then counted to make sure they all exist.

Baseline, measured in the same run: one pool at a time (median of --samples). Then --pools pools created
back to back: total time to all applied, the per-pool cost against the one-pool case, and the operator's RSS
before, after one pool and after all of them (per-pool memory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferencepool.builders import CHILD_KINDS

if TYPE_CHECKING:
    from inferencepool.kube import Kube

# Not one of this project's images: kwok simulates these pods, so the benchmark measures the operator rather
# than hundreds of local router processes.
SIMULATED_ROUTER_IMAGE = "registry.invalid/router-simulated:0"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pools", type=int, default=100, help="pools created back to back (default 100)")
    parser.add_argument("--samples", type=int, default=5, help="one-pool runs for the baseline (default 5)")
    parser.add_argument(
        "--state-dir",
        default=None,
        help="use (or start) the local cluster in this state directory and leave it running; "
        "default: a private cluster that is removed afterwards",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")


@dataclass
class Results:
    pools: int
    samples: int
    children_per_pool: int
    single_pool_seconds: list[float] = field(default_factory=list)
    single_pool_median_seconds: float = 0.0
    create_calls_seconds: float = 0.0
    all_pools_seconds: float = 0.0
    per_pool_amortized_seconds: float = 0.0
    per_pool_vs_single_ratio: float = 0.0
    all_vs_single_ratio: float = 0.0
    rss_idle_mib: float = 0.0
    rss_one_pool_mib: float = 0.0
    rss_all_pools_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_per_pool_kib: float = 0.0
    rss_all_vs_idle_ratio: float = 0.0
    cpu_one_pool_seconds: float = 0.0  # operator CPU for the baseline pools, per pool
    cpu_per_pool_seconds: float = 0.0  # operator CPU during the batch, per pool
    timeline: list[tuple[float, int, float]] = field(default_factory=list)  # seconds, pools applied, RSS MiB


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat fields 14 and 15, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def bench_pool(name: str, namespace: str) -> dict[str, Any]:
    """The GPU example's shape (NIXL + LMCache p2p, both pools autoscaled: 17 children) with pods that kwok
    runs without GPUs or local processes."""
    from inferencepool.api.v1alpha1 import API_VERSION

    def pool(target: dict[str, int]) -> dict[str, Any]:
        scaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 4, "target": target}
        return {"replicas": 1, "gpusPerReplica": 0, "autoscaling": scaling}

    return {
        "apiVersion": API_VERSION,
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"},
            "engine": {"image": "vllm/vllm-openai:v0.33.0", "maxModelLen": 32768},
            "prefill": pool({"ttftMilliseconds": 800, "percentile": 90}),
            "decode": pool({"itlMilliseconds": 40, "percentile": 90}),
            "kvTransfer": {"connector": "Nixl"},
            "kvCache": {"chunkSize": 256, "cpuOffloadGiB": 20, "p2p": {"enabled": True}},
            "router": {"replicas": 1, "image": SIMULATED_ROUTER_IMAGE},
        },
    }


def applied(pool: dict[str, Any] | None) -> bool:
    status = (pool or {}).get("status") or {}
    return status.get("observedGeneration") == (pool or {}).get("metadata", {}).get("generation")


def count_children(kube: Kube, namespace: str, selector: str) -> int:
    return sum(len(kube.list(api_version, kind, namespace, selector)) for api_version, kind in CHILD_KINDS)


def children_by_pool(kube: Kube, namespace: str) -> dict[str, int]:
    from collections import Counter

    from inferencepool.api import labels

    selector = f"{labels.LABEL_MANAGED_BY}={labels.MANAGED_BY}"
    counts: Counter[str] = Counter()
    for api_version, kind in CHILD_KINDS:
        for item in kube.list(api_version, kind, namespace, selector):
            counts[item["metadata"]["labels"].get(labels.LABEL_POOL, "?")] += 1
    return dict(counts)


class Bench:
    def __init__(self, kube: Kube, namespace: str, operator_pid: int, timeout: float) -> None:
        self.kube, self.namespace, self.pid, self.deadline = (
            kube,
            namespace,
            operator_pid,
            time.monotonic() + timeout,
        )

    def check_time(self, what: str) -> None:
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"benchmark timed out while {what}")

    def one_pool(self, name: str) -> float:
        from inferencepool.api import labels
        from inferencepool.api.v1alpha1 import API_VERSION

        started = time.monotonic()
        self.kube.create(bench_pool(name, self.namespace))
        while not applied(self.kube.get(API_VERSION, labels.KIND, self.namespace, name)):
            self.check_time(f"waiting for {name}")
            time.sleep(0.01)
        return time.monotonic() - started

    def delete_pool(self, name: str) -> None:
        from inferencepool.api import labels
        from inferencepool.api.v1alpha1 import API_VERSION

        self.kube.delete(API_VERSION, labels.KIND, self.namespace, name)
        selector = f"{labels.LABEL_POOL}={name}"
        while count_children(self.kube, self.namespace, selector):
            self.check_time(f"waiting for the children of {name} to be collected")
            time.sleep(0.5)

    def many_pools(self, count: int, results: Results) -> None:
        import threading

        from inferencepool.api import labels
        from inferencepool.api.v1alpha1 import API_VERSION

        names = [f"pool-{i:03d}" for i in range(count)]
        started = time.monotonic()

        def create_all() -> None:
            for name in names:
                self.kube.create(bench_pool(name, self.namespace))
            results.create_calls_seconds = time.monotonic() - started

        creator = threading.Thread(target=create_all, name="create-pools")
        creator.start()
        done = 0
        while done < count:
            self.check_time(f"waiting for {count} pools ({done} applied)")
            time.sleep(0.5)
            pools = self.kube.list(API_VERSION, labels.KIND, self.namespace, "")
            done = sum(1 for pool in pools if applied(pool))
            elapsed, rss = time.monotonic() - started, rss_mib(self.pid)
            results.timeline.append((round(elapsed, 2), done, round(rss, 1)))
            results.rss_peak_mib = max(results.rss_peak_mib, rss)
            print(
                f"  {elapsed:6.1f}s  {done:4d}/{count} pools applied  operator RSS {rss:6.1f} MiB", flush=True
            )
        results.all_pools_seconds = time.monotonic() - started
        creator.join()
        found = children_by_pool(self.kube, self.namespace)
        short = {
            name: found.get(name, 0) for name in names if found.get(name, 0) != results.children_per_pool
        }
        if short:
            raise RuntimeError(f"pools without exactly {results.children_per_pool} children: {short}")


def start_operator(kubeconfig: Path, namespace: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    from inferencepool.cluster.controlplane import free_port

    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    command = [sys.executable, "-m", "inferencepool", "operator", "--kubeconfig", str(kubeconfig)]
    command += ["-n", namespace, "--liveness", liveness]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    return process, liveness


def wait_live(url: str, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the operator exited with {process.returncode} before it became live")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the operator's liveness endpoint {url} never answered")


def run(args: argparse.Namespace) -> int:
    from inferencepool.api.crd import custom_resource_definition
    from inferencepool.cluster import controlplane
    from inferencepool.kube import Kube, load_configuration

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    own_cluster = args.state_dir is None
    state_dir = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="bench-operator-"))
    print(f"control plane: {state_dir} ({'private' if own_cluster else 'shared'})", flush=True)
    kubeconfig = controlplane.up(state_dir, nodes=2)
    kube = Kube(load_configuration(str(kubeconfig)))
    namespace = f"bench-operator-{uuid.uuid4().hex[:6]}"
    process: subprocess.Popen[bytes] | None = None
    try:
        kube.apply(custom_resource_definition(), "inferencepool-bench")
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        process, liveness = start_operator(kubeconfig, namespace, out / "operator-bench.log")
        wait_live(liveness, process)
        time.sleep(2)  # let the initial (empty) listings settle
        from inferencepool.builders import pool_children

        probe = bench_pool("probe", namespace)
        probe["metadata"]["uid"] = "0"
        from inferencepool.api.v1alpha1 import InferencePool

        results = Results(
            pools=args.pools,
            samples=args.samples,
            children_per_pool=len(pool_children(InferencePool.model_validate(probe))),
        )
        results.rss_idle_mib = rss_mib(process.pid)
        bench = Bench(kube, namespace, process.pid, args.timeout)
        cpu_before = cpu_seconds(process.pid)
        print(f"baseline: {args.samples} pools one at a time ({results.children_per_pool} children each)")
        for sample in range(args.samples):
            seconds = bench.one_pool(f"single-{sample}")
            results.single_pool_seconds.append(round(seconds, 4))
            if sample == 0:
                results.rss_one_pool_mib = rss_mib(process.pid)
            print(
                f"  pool {sample + 1}/{args.samples}: all children applied in {seconds * 1000:.0f} ms",
                flush=True,
            )
            bench.delete_pool(f"single-{sample}")
        results.single_pool_median_seconds = statistics.median(results.single_pool_seconds)
        # includes the deletes and their garbage collection events
        results.cpu_one_pool_seconds = (cpu_seconds(process.pid) - cpu_before) / args.samples
        cpu_before = cpu_seconds(process.pid)
        print(f"{args.pools} pools created back to back:")
        bench.many_pools(args.pools, results)
        results.cpu_per_pool_seconds = (cpu_seconds(process.pid) - cpu_before) / args.pools
        time.sleep(5)
        results.rss_all_pools_mib = rss_mib(process.pid)
        single = results.single_pool_median_seconds
        results.per_pool_amortized_seconds = results.all_pools_seconds / args.pools
        results.per_pool_vs_single_ratio = results.per_pool_amortized_seconds / single
        results.all_vs_single_ratio = results.all_pools_seconds / single
        results.rss_per_pool_kib = (results.rss_all_pools_mib - results.rss_idle_mib) * 1024 / args.pools
        results.rss_all_vs_idle_ratio = results.rss_all_pools_mib / results.rss_idle_mib
        report(results, out)
        return 0
    finally:
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        try:
            kube.delete("v1", "Namespace", "", namespace)
        finally:
            kube.close()
            if own_cluster:
                controlplane.down(state_dir, purge=True)


def report(results: Results, out: Path) -> None:
    single = results.single_pool_median_seconds
    runs = ", ".join(f"{s * 1000:.0f}" for s in results.single_pool_seconds)
    amortized_ms = results.per_pool_amortized_seconds * 1000
    busy = results.cpu_per_pool_seconds * results.pools / results.all_pools_seconds
    lines = [
        f"one pool, create -> all {results.children_per_pool} children applied: "
        f"median {single * 1000:.0f} ms "
        f"(runs: {runs} ms)",
        f"{results.pools} pools: all applied in {results.all_pools_seconds:.1f} s "
        f"(create calls {results.create_calls_seconds:.1f} s); {amortized_ms:.0f} ms per pool = "
        f"{results.per_pool_vs_single_ratio:.2f}x the one-pool latency; whole batch = "
        f"{results.all_vs_single_ratio:.1f}x one pool",
        f"operator RSS: idle {results.rss_idle_mib:.1f} MiB, one pool {results.rss_one_pool_mib:.1f} MiB, "
        f"{results.pools} pools {results.rss_all_pools_mib:.1f} MiB (peak {results.rss_peak_mib:.1f}); "
        f"{results.rss_per_pool_kib:.0f} KiB per pool; {results.rss_all_vs_idle_ratio:.2f}x idle",
        f"operator CPU: {results.cpu_per_pool_seconds * 1000:.0f} ms per pool in the batch "
        f"({busy:.0%} of one core while it ran); "
        f"{results.cpu_one_pool_seconds * 1000:.0f} ms per baseline pool (create + delete)",
    ]
    print("\n".join(lines))
    (out / "operator.json").write_text(json.dumps(asdict(results), indent=2))
    plot(results, out / "operator.png")
    print(f"results: {out / 'operator.json'}, plot: {out / 'operator.png'}")


def plot(results: Results, path: Path) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = [t for t, _, _ in results.timeline]
    figure, (applied_axis, rss_axis) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    applied_axis.plot(seconds, [n for _, n, _ in results.timeline], label="pools applied")
    ideal = [min(results.pools, t / results.single_pool_median_seconds) for t in seconds]
    applied_axis.plot(seconds, ideal, linestyle="--", label="one at a time at the one-pool latency")
    applied_axis.set_ylabel("pools applied")
    applied_axis.legend()
    rss_axis.plot(seconds, [r for _, _, r in results.timeline], color="tab:red")
    rss_axis.axhline(results.rss_idle_mib, linestyle=":", color="grey", label="idle")
    rss_axis.set_ylabel("operator RSS (MiB)")
    rss_axis.set_xlabel("seconds since the first create")
    rss_axis.legend()
    figure.suptitle(f"{results.pools} InferencePools, {results.children_per_pool} children each")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
