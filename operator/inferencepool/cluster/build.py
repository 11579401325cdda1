"""Build the control-plane binaries from the Go module proxy, once per version set, into a cache.

etcd and the three Kubernetes servers are built as dependencies of the wrapper modules in `gomod/` (their own
go.mod files carry replace directives, which `go install module@version` refuses); kwok and helm have none, so
`go install` builds them directly. Everything lands in `<cache>/bin/<key>/`, where the key hashes the
versions, the wrapper modules and the Go toolchain: a warm machine finds the directory and starts in seconds.
The directory is filled under a temporary name and renamed at the end, so a half-built cache never looks
complete.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from inferencepool.cluster.paths import binaries_root, gomod_dir

KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v4.2.4"
# Bump when the build recipe below changes in a way that changes the binaries.
RECIPE_VERSION = "2"
MINIMUM_GO = (1, 26)

KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
BINARIES = ("etcd", *KUBE_COMMANDS, "kwok", "helm")
# kwok ships no stages of its own; these node stages are copied from its module (pod stages are ours:
# stages.py).
KWOK_NODE_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
)
COMPLETE_MARKER = "build.json"

Progress = Callable[[str], None]


class BuildError(RuntimeError):
    """The control plane could not be built; the message names the step and ends with its log tail."""


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str
    kwok: str = KWOK_VERSION
    helm: str = HELM_VERSION


@dataclass(frozen=True)
class BuildStep:
    label: str
    argv: tuple[str, ...]
    cwd: Path
    outputs: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def required_version(go_mod_text: str, module: str) -> str:
    """The version a go.mod requires of `module` (single-line or block form)."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod_text, re.MULTILINE)
    if match is None:
        raise BuildError(f"go.mod does not require {module}")
    return match.group(1)


def versions_from_gomod(gomod: Path) -> Versions:
    return Versions(
        kubernetes=required_version((gomod / "k8s-build" / "go.mod").read_text(), "k8s.io/kubernetes"),
        etcd=required_version((gomod / "etcd-build" / "go.mod").read_text(), "go.etcd.io/etcd/server/v3"),
    )


def wrapper_files(gomod: Path) -> dict[str, bytes]:
    """go.mod and go.sum of each wrapper module, keyed by their path relative to `gomod`."""
    files: dict[str, bytes] = {}
    for path in sorted(gomod.glob("*/go.*")):
        if path.name in ("go.mod", "go.sum"):
            files[str(path.relative_to(gomod))] = path.read_bytes()
    return files


def cache_key(versions: Versions, files: Mapping[str, bytes], go_env: str) -> str:
    digest = hashlib.sha256()
    digest.update(f"recipe={RECIPE_VERSION}\n{versions!r}\n{go_env}\n".encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name] + b"\0")
    return digest.hexdigest()[:16]


def kube_ldflags(kubernetes_version: str) -> str:
    """Stamp the version the way hack/lib/version.sh does, so `--version` and discovery report v1.37.x."""
    match = re.fullmatch(r"v(\d+)\.(\d+)\.\d+.*", kubernetes_version)
    if match is None:
        raise BuildError(f"not a Kubernetes version: {kubernetes_version!r}")
    major, minor = match.groups()
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={kubernetes_version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


def build_steps(versions: Versions, source: Path, out: Path) -> list[BuildStep]:
    """The go commands in order: `source` holds copies of the wrapper modules, `out` gets the binaries."""
    gobin = {"GOBIN": str(out)}
    return [
        BuildStep(
            label=f"{', '.join(KUBE_COMMANDS)} (k8s.io/kubernetes {versions.kubernetes})",
            argv=(
                "go",
                "build",
                "-mod=mod",
                "-ldflags",
                kube_ldflags(versions.kubernetes),
                "-o",
                f"{out}{os.sep}",
                *(f"k8s.io/kubernetes/cmd/{command}" for command in KUBE_COMMANDS),
            ),
            cwd=source / "k8s-build",
            outputs=KUBE_COMMANDS,
        ),
        BuildStep(
            label=f"etcd (go.etcd.io/etcd/server/v3 {versions.etcd})",
            argv=(
                "go",
                "build",
                "-mod=mod",
                "-ldflags",
                "-s -w",
                "-o",
                str(out / "etcd"),
                "go.etcd.io/etcd/server/v3",
            ),
            cwd=source / "etcd-build",
            outputs=("etcd",),
        ),
        BuildStep(
            label=f"kwok (sigs.k8s.io/kwok {versions.kwok})",
            argv=("go", "install", "-ldflags", "-s -w", f"sigs.k8s.io/kwok/cmd/kwok@{versions.kwok}"),
            cwd=source,
            outputs=("kwok",),
            env=gobin,
        ),
        BuildStep(
            label=f"helm (helm.sh/helm/v4 {versions.helm})",
            # Without this stamp `helm version` says only "v4.2" (the Makefile normally sets it).
            argv=(
                "go",
                "install",
                "-ldflags",
                f"-s -w -X helm.sh/helm/v4/internal/version.version={versions.helm}",
                f"helm.sh/helm/v4/cmd/helm@{versions.helm}",
            ),
            cwd=source,
            outputs=("helm",),
            env=gobin,
        ),
    ]


def parse_go_version(text: str) -> tuple[int, int]:
    match = re.search(r"go(\d+)\.(\d+)", text)
    if match is None:
        raise BuildError(f"cannot read the Go version from {text!r}")
    return int(match.group(1)), int(match.group(2))


def go_environment() -> str:
    """`go env` values that change the binaries; fails with a clear message when Go is missing or too old."""
    if shutil.which("go") is None:
        raise BuildError(
            f"the Go toolchain (go{MINIMUM_GO[0]}.{MINIMUM_GO[1]} or newer) is needed to build the control "
            "plane; "
            "install it and make sure `go` is on PATH"
        )
    result = subprocess.run(
        ["go", "env", "GOVERSION", "GOOS", "GOARCH"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise BuildError(f"`go env` failed: {result.stderr.strip()}")
    if parse_go_version(result.stdout) < MINIMUM_GO and os.environ.get("GOTOOLCHAIN", "") in ("", "local"):
        raise BuildError(
            f"Go {result.stdout.split()[0]} is too old: the wrapper modules need "
            f"go{MINIMUM_GO[0]}.{MINIMUM_GO[1]} "
            "(or set GOTOOLCHAIN=auto)"
        )
    return " ".join(result.stdout.split())


def stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def format_duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@contextmanager
def _file_lock(path: Path, progress: Progress, what: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for {what} (lock {path})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _run_step(step: BuildStep, log: Path, progress: Progress, tick_seconds: float) -> float:
    env = {**os.environ, "CGO_ENABLED": "0", **step.env}
    env["GOFLAGS"] = f"{os.environ.get('GOFLAGS', '')} -trimpath -buildvcs=false".strip()
    started = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n$ (cd {step.cwd} && {' '.join(step.argv)})\n")
        out.flush()
        process = subprocess.Popen(step.argv, cwd=step.cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        finished = threading.Event()

        def tick() -> None:
            while not finished.wait(tick_seconds):
                progress(
                    f"      ... still building {step.label}: {format_duration(time.monotonic() - started)}"
                )

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            code = process.wait()
        finally:
            finished.set()
            if process.poll() is None:
                process.kill()
                process.wait()
    if code != 0:
        raise BuildError(f"building {step.label} failed (exit {code}); log {log}:\n{_tail(log)}")
    return time.monotonic() - started


def _copy_kwok_node_stages(kwok_version: str, out: Path, log: Path) -> None:
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kwok@{kwok_version}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=out,
    )
    if result.returncode != 0:
        raise BuildError(f"go mod download sigs.k8s.io/kwok@{kwok_version} failed: {result.stderr.strip()}")
    module_dir = Path(json.loads(result.stdout)["Dir"])
    stages = out / "kwok-node-stages.yaml"
    stages.write_text("\n---\n".join((module_dir / name).read_text() for name in KWOK_NODE_STAGES))
    with log.open("a") as handle:
        handle.write(f"copied {', '.join(KWOK_NODE_STAGES)} from {module_dir} to {stages}\n")


def _check_binaries(out: Path) -> dict[str, str]:
    version_argv = {
        "etcd": ["--version"],
        "kube-apiserver": ["--version"],
        "kube-controller-manager": ["--version"],
        "kube-scheduler": ["--version"],
        "kwok": ["--version"],
        "helm": ["version", "--short"],
    }
    reported: dict[str, str] = {}
    for name in BINARIES:
        result = subprocess.run(
            [str(out / name), *version_argv[name]], capture_output=True, text=True, check=False
        )
        first_line = (result.stdout or result.stderr).strip().splitlines()[:1]
        if result.returncode != 0 or not first_line:
            raise BuildError(f"{out / name} does not run: {(result.stderr or result.stdout).strip()}")
        reported[name] = first_line[0]
    return reported


def ensure_binaries(progress: Progress = stderr_progress, tick_seconds: float = 30.0) -> Path:
    """Return the directory holding every control-plane binary, building it first when the cache is cold."""
    gomod = gomod_dir()
    versions = versions_from_gomod(gomod)
    key = cache_key(versions, wrapper_files(gomod), go_environment())
    root = binaries_root()
    out = root / key
    if (out / COMPLETE_MARKER).is_file():
        return out
    with _file_lock(root / f".{key}.lock", progress, "another build of the same binaries"):
        if (out / COMPLETE_MARKER).is_file():
            return out
        return _build(versions, gomod, root, out, progress, tick_seconds)


def _build(versions: Versions, gomod: Path, root: Path, out: Path, progress: Progress, tick: float) -> Path:
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=root))
    try:
        source = staging / "src"
        shutil.copytree(gomod, source, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
        bin_dir = staging / "bin"
        bin_dir.mkdir()
        log = bin_dir / "build.log"
        steps = build_steps(versions, source, bin_dir)
        progress(f"building the control plane into {out} (cold build: several minutes; log {log})")
        started = time.monotonic()
        timings: dict[str, float] = {}
        for number, step in enumerate(steps, start=1):
            progress(f"[{number}/{len(steps)}] {step.label}")
            timings[step.label] = round(_run_step(step, log, progress, tick), 1)
            progress(f"      done in {format_duration(timings[step.label])}")
        _copy_kwok_node_stages(versions.kwok, bin_dir, log)
        reported = _check_binaries(bin_dir)
        total = time.monotonic() - started
        manifest = {
            "versions": versions.__dict__,
            "go": go_environment(),
            "reported": reported,
            "seconds": timings,
            "total_seconds": round(total, 1),
        }
        (bin_dir / COMPLETE_MARKER).write_text(json.dumps(manifest, indent=2) + "\n")
        try:
            os.rename(bin_dir, out)
        except OSError:
            if not (out / COMPLETE_MARKER).is_file():
                raise
        progress(f"control plane built in {format_duration(total)}: {out}")
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def describe(bin_dir: Path) -> Sequence[str]:
    manifest = json.loads((bin_dir / COMPLETE_MARKER).read_text())
    return [f"{name}: {line}" for name, line in manifest["reported"].items()]
