"""The local cluster runs a p2p pool's LMCache controller and lets engines find it: the pod runner maps the
controller Deployment's `lmcache_controller` command onto the fake controller, and publishes what cluster DNS
would answer for Services (pure, no cluster)."""

from __future__ import annotations

from typing import Any

from tests.unit.builders_examples import child, load_pool

from inferencepool.cluster import podspec
from inferencepool.engine_sim import lmcache_p2p

PYTHON = "/venv/bin/python"


def running(
    pod_spec: dict[str, Any], name: str, ip: str, labels: dict[str, str], ready: bool = True
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"u-{name}", "labels": labels},
        "spec": pod_spec,
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


class NoObjects:
    def config_map(self, namespace: str, name: str) -> None:
        return None

    def secret(self, namespace: str, name: str) -> None:
        return None


def test_the_controller_deployment_runs_the_fake_controller_on_its_pod_ip() -> None:
    pool = load_pool(
        "demo-cpu.yaml", kvCache={"chunkSize": 256, "cpuOffloadGiB": 1, "p2p": {"enabled": True}}
    )
    deployment = child(pool, "Deployment", "demo-lmcache-controller")
    template = deployment["spec"]["template"]
    pod = running(template["spec"], "demo-lmcache-controller-x", "127.30.0.9", template["metadata"]["labels"])
    plan = podspec.plan_pod(pod, PYTHON, NoObjects(), {"PATH": "/usr/bin"}, "/kubeconfig", "/volumes")
    [container] = plan.containers
    assert container.argv[:3] == (PYTHON, "-m", "inferencepool.engine_sim.lmcache_controller")
    assert container.argv[container.argv.index("--host") + 1] == "127.30.0.9"
    assert container.port == 9000 and container.probe == podspec.Probe("tcp", 9000)


def test_service_names_resolve_to_the_ready_pods_they_select() -> None:
    service = {
        "metadata": {"name": "demo-lmcache-controller", "namespace": "default"},
        "spec": {"selector": {"pool": "demo", "role": "lmcache-controller"}},
    }
    headless_like = {"metadata": {"name": "no-selector", "namespace": "default"}, "spec": {}}
    labels = {"pool": "demo", "role": "lmcache-controller", "extra": "x"}
    pods = [
        running({}, "a", "127.0.0.7", labels),
        running({}, "b", "127.0.0.8", labels, ready=False),  # not ready: not an endpoint
        running({}, "c", "127.0.0.9", {"pool": "other", "role": "lmcache-controller"}),
    ]
    table = podspec.service_hosts([service, headless_like], pods)
    assert table == {"demo-lmcache-controller.default.svc": ["127.0.0.7"]}
    assert podspec.service_hosts([service], pods[1:]) == {"demo-lmcache-controller.default.svc": []}


def test_the_runner_and_the_fake_engine_agree_on_the_table_s_variable() -> None:
    assert podspec.LOCAL_HOSTS_ENV == lmcache_p2p.LOCAL_HOSTS_ENV
    assert podspec.LOCAL_HOSTS_ENV in podspec.process_env({podspec.LOCAL_HOSTS_ENV: "/t"}, {}, "/k")
