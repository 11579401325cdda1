"""The pod runner's translation of Pod objects into local processes (pure, no cluster)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from inferencepool.cluster import podspec
from inferencepool.cluster.podspec import PlanError, Probe

PYTHON = "/venv/bin/python"
KUBECONFIG = "/state/kubeconfig"
VOLUMES = "/state/runner/pods/u-1/volumes"


class FakeLookup:
    def __init__(
        self,
        config_maps: Mapping[str, Mapping[str, str]] | None = None,
        secrets: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.config_maps = dict(config_maps or {})
        self.secrets = dict(secrets or {})

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return self.config_maps.get(f"{namespace}/{name}")

    def secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return self.secrets.get(f"{namespace}/{name}")


def engine_pod(**container: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "engine",
        "image": "inferencepool/fake-engine:0.1.0",
        "command": ["vllm", "serve"],
        "args": ["meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "8000"],
        "ports": [{"name": "http", "containerPort": 8000}],
    }
    base.update(container)
    return {
        "metadata": {"name": "pool-decode-0", "namespace": "ns1", "uid": "u-1", "labels": {"role": "decode"}},
        "spec": {
            "nodeName": "inferencepool-node-0",
            "containers": [base],
            "terminationGracePeriodSeconds": 45,
        },
        "status": {"phase": "Running", "podIP": "127.20.0.7", "podIPs": [{"ip": "127.20.0.7"}]},
    }


def plan(pod: Mapping[str, Any], lookup: FakeLookup | None = None) -> podspec.PodPlan:
    return podspec.plan_pod(
        pod, PYTHON, lookup or FakeLookup(), {"PATH": "/usr/bin", "SECRET": "x"}, KUBECONFIG, VOLUMES
    )


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("inferencepool/fake-engine:0.1.0", "fake-engine"),
        ("registry.local:5000/team/inferencepool/router:0.1.0", "router"),
        ("inferencepool/router@sha256:abcdef", "router"),
        ("registry.local:5000/fake-engine", "fake-engine"),
        ("vllm/vllm-openai:v0.33.0", None),
        ("lmcache/lmcache-controller:latest", None),
        ("inferencepool/operator:0.1.0", None),
    ],
)
def test_images_of_this_project_run_locally(image: str, expected: str | None) -> None:
    assert podspec.local_image_kind(image) == expected


def test_vllm_command_becomes_the_fake_engine_bound_to_the_pod_ip() -> None:
    result = plan(engine_pod())
    assert result.ip == "127.20.0.7"
    assert result.grace_seconds == 45
    assert result.restart is True
    (container,) = result.containers
    assert container.argv == (
        PYTHON,
        "-m",
        "inferencepool",
        "fake-engine",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host",
        "127.20.0.7",
        "--port",
        "8000",
    )
    assert container.port == 8000
    assert container.probe == Probe("tcp", 8000)


def test_host_is_added_when_missing_and_port_comes_from_the_container_port() -> None:
    pod = engine_pod(
        command=["inferencepool", "router"], args=["--config", "/etc/r.yaml"], image="x/router:1"
    )
    pod["spec"]["containers"][0]["ports"] = [
        {"name": "metrics", "containerPort": 9000},
        {"containerPort": 8080},
    ]
    (container,) = plan(pod).containers
    assert container.argv[:4] == (PYTHON, "-m", "inferencepool", "router")
    assert container.argv[4:] == ("--config", "/etc/r.yaml", "--host", "127.20.0.7", "--port", "9000")
    assert container.port == 9000


def test_host_equals_form_is_rewritten_and_python_module_commands_are_understood() -> None:
    pod = engine_pod(
        command=["python3", "-m", "inferencepool", "fake-engine"], args=["--host=0.0.0.0", "--port=8100"]
    )
    (container,) = plan(pod).containers
    assert container.argv[4:] == ("--host=127.20.0.7", "--port=8100")
    assert container.port == 8100

    pod = engine_pod(command=["python3", "-m", "vllm.entrypoints.openai.api_server"], args=["--port", "8001"])
    (container,) = plan(pod).containers
    assert container.argv[:4] == (PYTHON, "-m", "inferencepool", "fake-engine")


def test_image_entrypoint_and_cmd_apply_as_in_kubernetes() -> None:
    pod = engine_pod(args=["my-model", "--port", "8000"])
    del pod["spec"]["containers"][0]["command"]
    (container,) = plan(pod).containers
    assert container.argv[3:6] == ("fake-engine", "serve", "my-model")

    # The router image: ENTRYPOINT ["inferencepool"], CMD ["router", "--host", "0.0.0.0", "--port", "8000"].
    router = {"name": "router", "image": "inferencepool/router:0.1.0"}
    assert podspec.container_argv(router, "router") == [
        "inferencepool",
        "router",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
    ]
    with_args = {**router, "args": ["router", "--config", "/c.yaml"]}
    assert podspec.container_argv(with_args, "router") == ["inferencepool", "router", "--config", "/c.yaml"]
    with_command = {**router, "command": ["inferencepool", "router"]}
    assert podspec.container_argv(with_command, "router") == ["inferencepool", "router"]


def test_unsupported_command_is_refused_with_the_container_named() -> None:
    pod = engine_pod(command=["sh", "-c", "vllm serve x"], args=[])
    with pytest.raises(PlanError, match=r"container 'engine'.*not 'sh -c vllm serve x'"):
        plan(pod)


def test_env_is_resolved_like_a_kubelet_would() -> None:
    pod = engine_pod(
        env=[
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
            {"name": "URL", "value": "http://$(POD_IP):8000/$(UNKNOWN)/$$(POD_IP)"},
            {"name": "CONFIG", "valueFrom": {"configMapKeyRef": {"name": "router", "key": "config.yaml"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}},
            {
                "name": "MAYBE",
                "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": True}},
            },
            {"name": "KUBECONFIG", "value": "/in/cluster/path"},
        ],
        envFrom=[{"configMapRef": {"name": "lmcache"}, "prefix": "LMC_"}],
        args=["--served-model-name", "$(POD_NAME)", "--port", "8000"],
    )
    lookup = FakeLookup(
        config_maps={"ns1/router": {"config.yaml": "pool: p"}, "ns1/lmcache": {"CHUNK": "256"}},
        secrets={"ns1/hf": {"HF_TOKEN": "hf_abc"}},
    )
    (container,) = plan(pod, lookup).containers
    env = container.env
    assert env["POD_IP"] == "127.20.0.7"
    assert env["POD_NAME"] == "pool-decode-0"
    assert env["NS"] == "ns1"
    assert env["ROLE"] == "decode"
    assert env["URL"] == "http://127.20.0.7:8000/$(UNKNOWN)/$(POD_IP)"
    assert env["CONFIG"] == "pool: p"
    assert env["TOKEN"] == "hf_abc"
    assert env["LMC_CHUNK"] == "256"
    assert "MAYBE" not in env
    # Only the basics of the runner's environment are inherited; KUBECONFIG always points at the cluster.
    assert "SECRET" not in env
    assert env["PATH"] == "/usr/bin"
    assert env["KUBECONFIG"] == KUBECONFIG
    assert "pool-decode-0" in container.argv


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            [{"name": "C", "valueFrom": {"configMapKeyRef": {"name": "missing", "key": "k"}}}],
            r"env C: ConfigMap ns1/missing not found",
        ),
        (
            [{"name": "C", "valueFrom": {"configMapKeyRef": {"name": "present", "key": "nokey"}}}],
            r"env C: ConfigMap ns1/present has no key 'nokey'",
        ),
        (
            [{"name": "F", "valueFrom": {"fieldRef": {"fieldPath": "spec.priority"}}}],
            r"fieldRef 'spec.priority' is not supported",
        ),
        (
            [{"name": "R", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}],
            r"env R: only fieldRef, configMapKeyRef and secretKeyRef",
        ),
    ],
)
def test_env_errors_name_the_variable(env: list[dict[str, Any]], message: str) -> None:
    lookup = FakeLookup(config_maps={"ns1/present": {"k": "v"}})
    with pytest.raises(PlanError, match=message):
        plan(engine_pod(env=env), lookup)


def test_readiness_probe_of_the_pod_is_honoured() -> None:
    pod = engine_pod(readinessProbe={"httpGet": {"path": "/health", "port": "http"}})
    (container,) = plan(pod).containers
    assert container.probe == Probe("http", 8000, "/health")
    pod = engine_pod(readinessProbe={"tcpSocket": {"port": 8000}})
    assert plan(pod).containers[0].probe == Probe("tcp", 8000)
    pod = engine_pod(readinessProbe={"httpGet": {"path": "/health", "port": "grpc"}})
    with pytest.raises(PlanError, match="probe port 'grpc' names no container port"):
        plan(pod)


def test_pods_of_other_images_need_no_process() -> None:
    pod = engine_pod(image="vllm/vllm-openai:v0.33.0")
    result = plan(pod)
    assert result.containers == ()
    assert not podspec.runs_locally(pod)


def test_pod_without_ip_cannot_be_planned_and_never_restart_policy_is_kept() -> None:
    pod = engine_pod()
    pod["spec"]["restartPolicy"] = "Never"
    assert plan(pod).restart is False
    del pod["status"]["podIP"]
    with pytest.raises(PlanError, match="has no pod IP yet"):
        plan(pod)


def test_missing_port_everywhere_is_an_error() -> None:
    pod = engine_pod(args=["model"], ports=[])
    with pytest.raises(PlanError, match="no --port argument and no TCP containerPort"):
        plan(pod)


def pod_with_volumes(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]], **container: Any) -> dict:
    pod = engine_pod(volumeMounts=mounts, **container)
    pod["spec"]["volumes"] = volumes
    return pod


def test_config_map_volume_becomes_local_files_and_paths_under_its_mount_are_rewritten() -> None:
    pod = pod_with_volumes(
        [{"name": "lmcache", "configMap": {"name": "pool-lmcache"}}, {"name": "shm", "emptyDir": {}}],
        [{"name": "lmcache", "mountPath": "/etc/lmcache"}, {"name": "shm", "mountPath": "/dev/shm"}],
        env=[
            {"name": "LMCACHE_CONFIG_FILE", "value": "/etc/lmcache/lmcache.yaml"},
            {"name": "UNRELATED", "value": "/etc/lmcache-other/x"},
        ],
        args=["m", "--port", "8000", "--config", "/etc/lmcache/extra.yaml"],
    )
    lookup = FakeLookup(config_maps={"ns1/pool-lmcache": {"lmcache.yaml": "chunk_size: 256\n"}})
    (container,) = plan(pod, lookup).containers
    assert container.env["LMCACHE_CONFIG_FILE"] == f"{VOLUMES}/lmcache/lmcache.yaml"
    assert container.env["UNRELATED"] == "/etc/lmcache-other/x"  # a prefix of the name is not a mount
    assert f"{VOLUMES}/lmcache/extra.yaml" in container.argv
    by_name = {v.name: v for v in container.volumes}
    assert by_name["lmcache"].files == {"lmcache.yaml": "chunk_size: 256\n"}
    assert by_name["lmcache"].local_dir == f"{VOLUMES}/lmcache"
    assert by_name["shm"].files == {}


def test_volume_items_sub_path_and_secrets() -> None:
    pod = pod_with_volumes(
        [
            {"name": "cfg", "configMap": {"name": "c", "items": [{"key": "k", "path": "dir/file.yaml"}]}},
            {"name": "token", "secret": {"secretName": "s"}},
        ],
        [
            {"name": "cfg", "mountPath": "/etc/app/config.yaml", "subPath": "dir/file.yaml"},
            {"name": "token", "mountPath": "/var/run/token/"},
        ],
        env=[{"name": "A", "value": "/etc/app/config.yaml"}, {"name": "T", "value": "/var/run/token/HF"}],
    )
    lookup = FakeLookup(config_maps={"ns1/c": {"k": "v", "other": "x"}}, secrets={"ns1/s": {"HF": "hf_x"}})
    (container,) = plan(pod, lookup).containers
    assert container.env["A"] == f"{VOLUMES}/cfg/dir/file.yaml"
    assert container.env["T"] == f"{VOLUMES}/token/HF"
    by_name = {v.name: v for v in container.volumes}
    assert by_name["cfg"].files == {"dir/file.yaml": "v"}
    assert by_name["token"].files == {"HF": "hf_x"}


def test_missing_config_map_volume_names_it_unless_optional() -> None:
    mounts = [{"name": "cfg", "mountPath": "/etc/cfg"}]
    with pytest.raises(PlanError, match=r"volume 'cfg': ConfigMap ns1/absent not found"):
        plan(pod_with_volumes([{"name": "cfg", "configMap": {"name": "absent"}}], mounts))
    optional = [{"name": "cfg", "configMap": {"name": "absent", "optional": True}}]
    (container,) = plan(pod_with_volumes(optional, mounts)).containers
    assert container.volumes[0].files == {}


def test_mount_without_a_volume_is_an_error() -> None:
    with pytest.raises(PlanError, match=r"volumeMount 'ghost' has no volume"):
        plan(pod_with_volumes([], [{"name": "ghost", "mountPath": "/x"}]))
