"""Shared fixtures. The `cluster` fixture starts the local control plane once per session, on first use.

If it cannot be built or started, the tests that need it fail (with the failing component's log); they are
never skipped. INFERENCEPOOL_TEST_CLUSTER=<state dir> reuses a running cluster instead of a private one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

TESTS = Path(__file__).parent
TIERS = ("unit", "contract", "fuzz", "http", "cluster", "real")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test is marked with its tier, the folder it lives in (`-m "not cluster"` leaves the control plane
    out), and the simulator's tests (test_sim_*.py) `sim`, so the fast tier (`-m "unit and not sim and not
    slow"`, `make test-fast`) leaves out what takes seconds a test."""
    for item in items:
        path = Path(str(item.path))
        tier = path.relative_to(TESTS).parts[0] if TESTS in path.parents else None
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        if path.name.startswith("test_sim_"):
            item.add_marker(pytest.mark.sim)


def _progress_printer(config: pytest.Config) -> Callable[[str], None]:
    """Print even while pytest captures output: a cold build takes minutes and should show it is alive."""
    capture = config.pluginmanager.getplugin("capturemanager")

    def progress(message: str) -> None:
        if capture is None:
            print(f"[cluster] {message}", file=sys.stderr, flush=True)
            return
        with capture.global_and_fixture_disabled():
            print(f"\n[cluster] {message}", file=sys.stderr, flush=True)

    return progress


@pytest.fixture(scope="session")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestCluster]:
    from tests.support import cluster as testing

    scratch = tmp_path_factory.mktemp("control-plane")
    context = testing.session_cluster(scratch, _progress_printer(request.config))
    failure = None
    try:
        started = context.__enter__()
    except Exception as error:
        failure = str(error)
    if failure is not None:
        # Outside the except block, so the report shows the message once, not a chain of tracebacks.
        pytest.fail(failure, pytrace=False)
    try:
        yield started
    finally:
        context.__exit__(None, None, None)


@pytest.fixture(scope="session")
def kubeconfig(cluster: TestCluster) -> Path:
    return cluster.kubeconfig


@pytest.fixture(scope="session")
def kube_api_client(cluster: TestCluster) -> Iterator[Any]:
    """A kubernetes.client.ApiClient for the session cluster."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube_api_client: Any) -> Iterator[str]:
    """A fresh namespace for one test (with its default ServiceAccount), deleted afterwards."""
    from kubernetes import client

    from tests.support.cluster import eventually, namespace_name

    name = namespace_name(request.node.name)
    core = client.CoreV1Api(kube_api_client)
    core.create_namespace({"metadata": {"name": name}})
    # Pods are refused until the controller manager has created the namespace's default ServiceAccount.
    eventually(
        lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items),
        30,
        f"the default ServiceAccount in {name}",
    )
    yield name
    core.delete_namespace(name)
