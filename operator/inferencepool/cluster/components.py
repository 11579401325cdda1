"""Pure description of the local cluster: its state-dir layout, ports, command lines, nodes and kubeconfig.

Flags follow kwokctl v0.8.0's binary runtime (pkg/kwokctl/components/*.go), with the 1.37 change kwok adopted
after v0.8.0: `--endpoint-reconciler-type=none`, because kube-apiserver 1.37 refuses a loopback advertise
address for the `lease` reconciler.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SERVICE_CIDR = "10.96.0.0/16"
NODE_ANNOTATION_SELECTOR = "kwok.x-k8s.io/node=fake"
NODE_NAME_PREFIX = "inferencepool-node-"
# kube-scheduler keeps a node's pod count under this, so one node's /24 pod range never runs out.
PODS_PER_NODE = 250
NODE_LEASE_SECONDS = 40
DISABLED_CONTROLLERS = (
    "endpoints-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
)
# Start order; `down` stops them in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "pod-runner")


@dataclass(frozen=True)
class ClusterConfig:
    """What `up` decides once per start: ports on 127.0.0.1 and the 127.<octet>.0.0/16 pod range."""

    etcd_client_port: int
    etcd_peer_port: int
    apiserver_port: int
    controller_manager_port: int
    scheduler_port: int
    pod_octet: int

    @property
    def pod_cidr(self) -> str:
        return f"127.{self.pod_octet}.0.0/16"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterConfig:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Layout:
    """Files under the state directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def kwok_config(self) -> Path:
        return self.root / "kwok.yaml"

    @property
    def kwok_home(self) -> Path:
        # kwok reads ~/.kwok/kwok.yaml before --config; a private HOME keeps a user's file out of our cluster.
        return self.root / "kwok-home"

    @property
    def runner(self) -> Path:
        return self.root / "runner"

    @property
    def engine_file(self) -> Path:
        """The runner's engine mode (vllm_cpu.CpuEngine as JSON); absent: vLLM's image is left to kwok."""
        return self.runner / "engine.json"

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    @property
    def bin_link(self) -> Path:
        return self.root / "bin"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def pid_file(self, component: str) -> Path:
        return self.pids / f"{component}.json"


def service_ip(service_cidr: str = SERVICE_CIDR) -> str:
    """The first address of the service range: the `kubernetes` Service, which the serving cert must name."""
    return str(next(ipaddress.ip_network(service_cidr).hosts()))


def node_name(index: int) -> str:
    return f"{NODE_NAME_PREFIX}{index}"


def node_pod_cidr(pod_octet: int, index: int) -> str:
    """Node `index` hands out 127.<octet>.<index>.1-254; kwok takes a node's podCIDR before its --cidr."""
    if not 0 <= index <= 255:
        raise ValueError(
            f"node index {index} out of range 0..255 (one /24 of 127.{pod_octet}.0.0/16 per node)"
        )
    return f"127.{pod_octet}.{index}.0/24"


def node_manifest(
    index: int, pod_octet: int, gpus: int, cpu: str = "256", memory: str = "2Ti"
) -> dict[str, Any]:
    """A node kwok manages. Capacity is set here: kwok's node-initialize stage keeps what a node has."""
    resources = {
        "cpu": cpu,
        "memory": memory,
        "pods": str(PODS_PER_NODE),
        "ephemeral-storage": "10Ti",
        "nvidia.com/gpu": str(gpus),
    }
    name = node_name(index)
    cidr = node_pod_cidr(pod_octet, index)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
            },
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {"capacity": resources, "allocatable": resources},
    }


def kubeconfig_text(server: str, layout: Layout) -> str:
    pki = layout.pki
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "inferencepool",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": "inferencepool-admin",
                "user": {"client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")},
            }
        ],
        "contexts": [
            {"name": "inferencepool", "context": {"cluster": "inferencepool", "user": "inferencepool-admin"}}
        ],
        "current-context": "inferencepool",
    }
    return json.dumps(config, indent=2) + "\n"


def component_argv(
    component: str, bin_dir: Path, layout: Layout, config: ClusterConfig, python: str
) -> list[str]:
    pki = layout.pki
    kubeconfig = str(layout.kubeconfig)

    def controller_flags(secure_port: int) -> list[str]:
        """What kube-controller-manager and kube-scheduler share: the admin kubeconfig, no leader election,
        HTTPS on loopback with open health endpoints."""
        return [
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={secure_port}",
            f"--tls-cert-file={pki / 'admin.crt'}",
            f"--tls-private-key-file={pki / 'admin.key'}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        ]

    if component == "etcd":
        client = f"http://127.0.0.1:{config.etcd_client_port}"
        peer = f"http://127.0.0.1:{config.etcd_peer_port}"
        return [
            str(bin_dir / "etcd"),
            "--name=node0",
            f"--data-dir={layout.etcd_data}",
            # A throwaway cluster: losing the last writes on a power cut is fine, waiting on fsync is not.
            "--unsafe-no-fsync",
            "--auto-compaction-retention=1",
            "--quota-backend-bytes=8589934592",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=node0={peer}",
        ]
    if component == "kube-apiserver":
        return [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{config.etcd_client_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            f"--secure-port={config.apiserver_port}",
            f"--tls-cert-file={pki / 'admin.crt'}",
            f"--tls-private-key-file={pki / 'admin.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'admin.key'}",
            f"--service-account-signing-key-file={pki / 'admin.key'}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--cert-dir={layout.root / 'apiserver-certs'}",
        ]
    if component == "kube-controller-manager":
        return [
            str(bin_dir / "kube-controller-manager"),
            *controller_flags(config.controller_manager_port),
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'admin.key'}",
            # Every default controller (statefulset, garbage collector, serviceaccount, ...) except those that
            # write pod IPs into Endpoints/EndpointSlices: the API server refuses loopback addresses there, so
            # they would only retry and emit Warning events forever. Pods are discovered from Pod objects.
            "--controllers=*," + ",".join(f"-{name}" for name in DISABLED_CONTROLLERS),
        ]
    if component == "kube-scheduler":
        return [
            str(bin_dir / "kube-scheduler"),
            *controller_flags(config.scheduler_port),
        ]
    if component == "kwok":
        return [
            str(bin_dir / "kwok"),
            f"--kubeconfig={kubeconfig}",
            f"--config={layout.kwok_config}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION_SELECTOR}",
            f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
            f"--cidr={config.pod_cidr}",
            "--node-ip=127.0.0.1",
        ]
    if component == "pod-runner":
        return [python, "-m", "inferencepool", "cluster", "runner", "--state-dir", str(layout.root)]
    raise ValueError(f"unknown component {component!r}; known: {', '.join(COMPONENTS)}")
