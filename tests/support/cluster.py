"""The session's control plane for tests/conftest.py, and polling helpers for the cluster tests.

By default a test session starts its own cluster in a temporary state directory and stops and deletes it at
the end. Setting INFERENCEPOOL_TEST_CLUSTER to a state directory reuses (or starts) the cluster there and
leaves it running, for quick iterations: `inferencepool cluster up --state-dir D` once, then
`INFERENCEPOOL_TEST_CLUSTER=D pytest tests/cluster`.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from inferencepool.cluster import build, controlplane
from inferencepool.cluster.paths import kubectl_binary

ENV_TEST_CLUSTER = "INFERENCEPOOL_TEST_CLUSTER"
T = TypeVar("T")
# Two 8-GPU nodes: room for a couple of GPU pools applied by tests whose namespaces are still being deleted.
TEST_NODES = 2


@dataclass(frozen=True)
class TestCluster:
    __test__ = False  # a fixture value, not a test class for pytest to collect

    state_dir: Path
    kubeconfig: Path
    kubectl_binary: str
    owned: bool

    @property
    def bin_dir(self) -> Path:
        """etcd, kube-*, kwok and helm as built for this cluster."""
        return self.state_dir / "bin"

    def kubectl(
        self, *args: str, input_text: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; the caller checks returncode, stdout and stderr."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        return subprocess.run(
            [self.kubectl_binary, *args],
            input=input_text,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )


@contextmanager
def session_cluster(scratch: Path, progress: build.Progress) -> Iterator[TestCluster]:
    shared = os.environ.get(ENV_TEST_CLUSTER)
    state_dir = Path(shared).absolute() if shared else scratch / "cluster"
    owned = not shared
    try:
        kubeconfig = controlplane.up(state_dir, nodes=TEST_NODES, progress=progress)
        binary = kubectl_binary()
    except BaseException as error:
        message = describe_failure(error)
        if owned:
            # Stopped, but the logs stay in pytest's temporary directory for a post-mortem.
            controlplane.down(state_dir, progress=progress)
            message += f"\n(logs kept in {state_dir / 'logs'})"
        raise controlplane.ClusterError(message) from error
    try:
        yield TestCluster(state_dir, kubeconfig, binary, owned)
    finally:
        if owned:
            controlplane.down(state_dir, purge=True, progress=progress)


def namespace_name(test_name: str) -> str:
    """A valid, unique namespace name derived from a test's name."""
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{uuid.uuid4().hex[:6]}"


def describe_failure(error: BaseException) -> str:
    lines: Sequence[str] = [f"the local control plane could not be started: {error}"]
    if isinstance(error, controlplane.ClusterError) and error.log_tail():
        lines = [*lines, f"--- last lines of {error.log} ---", error.log_tail()]
    return "\n".join(lines)


def eventually(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll `check` until it returns something truthy and return that; fail naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
