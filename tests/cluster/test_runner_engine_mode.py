"""The pod runner's engine mode on the session's control plane: a pod of vLLM's image in a namespace the mode
covers starts the venv's `vllm` through the CPU translation, turns Ready on its /health, and stops with its
pod; the same pod elsewhere stays kwok's. The venv here holds a stand-in `vllm` that records what it was
given and answers /health: what the runner starts, not what vLLM does (tests/real/ runs the real one)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.support.cluster import TestCluster, eventually

from inferencepool.cluster import procs
from inferencepool.cluster.components import Layout
from inferencepool.cluster.runner import read_engine, write_engine
from inferencepool.cluster.vllm_cpu import CpuEngine

STAND_IN = """\
import http.server, json, os, sys
args = sys.argv[1:]
host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])
print("STAND-IN " + json.dumps({"argv": sys.argv, "env": dict(os.environ)}), flush=True)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

http.server.HTTPServer((host, port), Health).serve_forever()
"""

CONFIG = {
    "kv_buffer_device": "cuda",
    "kv_connector": "NixlConnector",
    "kv_role": "kv_consumer",
}


def vllm_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.33.0",
                    "command": ["vllm", "serve"],
                    "args": ["org/model", "--port", "8000", "--kv-transfer-config", json.dumps(CONFIG)],
                    "env": [
                        {"name": "UCX_TLS", "value": "tcp,cuda_copy,cuda_ipc"},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    ],
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
                }
            ],
        },
    }


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _records(layout: Layout, uid: str) -> dict[str, Any]:
    path = layout.runner / "pods" / f"{uid}.json"
    return dict(json.loads(path.read_text())["containers"]) if path.is_file() else {}


def test_vllm_pods_run_the_translated_engine_only_where_the_mode_applies(
    cluster: TestCluster, kube_api_client: Any, namespace: str, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    binary = venv / "bin" / "vllm"
    binary.write_text(f"#!{sys.executable}\n{STAND_IN}")
    binary.chmod(0o755)
    layout = Layout(cluster.state_dir)
    before = read_engine(layout.engine_file)
    core = client.CoreV1Api(kube_api_client)
    other = f"{namespace}-x"
    core.create_namespace({"metadata": {"name": other}})
    try:
        write_engine(
            layout.engine_file,
            CpuEngine(venv=str(venv), model=str(tmp_path / "model"), namespaces=(namespace,)),
        )
        eventually(
            lambda: any(
                sa.metadata.name == "default" for sa in core.list_namespaced_service_account(other).items
            ),
            30,
            f"the default ServiceAccount in {other}",
        )
        core.create_namespaced_pod(namespace, vllm_pod("engine"))
        core.create_namespaced_pod(other, vllm_pod("engine"))
        pod = eventually(
            lambda: _ready(p := core.read_namespaced_pod("engine", namespace)) and p,
            120,
            "the engine pod to be Ready on the stand-in's /health",
        )
        log = layout.logs / "pods" / f"{namespace}_engine_vllm.log"
        text = log.read_text()
        assert "--- engine mode: --kv-transfer-config kv_buffer_device: 'cuda' -> 'cpu'" in text, text
        recorded = json.loads(next(line for line in text.splitlines() if line.startswith("STAND-IN "))[9:])
        argv, env = recorded["argv"], recorded["env"]
        assert argv[1:3] == ["serve", str(tmp_path / "model")]
        assert argv[argv.index("--host") + 1] == pod.status.pod_ip
        assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_buffer_device"] == "cpu"
        assert "--enforce-eager" in argv
        assert env["UCX_TLS"] == "tcp" and env["VLLM_TARGET_DEVICE"] == "cpu"
        assert env["VLLM_HOST_IP"] == env["POD_IP"] == pod.status.pod_ip
        assert env["VLLM_CPU_OMP_THREADS_BIND"].isdigit()
        # Outside the mode's namespaces the same pod is kwok's alone: Ready, with no process.
        elsewhere = eventually(
            lambda: _ready(p := core.read_namespaced_pod("engine", other)) and p, 60, "the other pod Ready"
        )
        assert _records(layout, elsewhere.metadata.uid) == {}
        record = procs.ProcessRecord.from_json(json.dumps(_records(layout, pod.metadata.uid)["vllm"]))
        core.delete_namespaced_pod("engine", namespace)
        eventually(lambda: not procs.is_alive(record), 30, "the engine process to stop with its pod")
    finally:
        write_engine(layout.engine_file, before)
        core.delete_namespace(other)
