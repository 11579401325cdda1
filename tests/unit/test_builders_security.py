"""Pod security of what a pool runs: router and LMCache controller pods meet Pod Security "restricted",
engines what "restricted" asks of privilege escalation, capabilities and seccomp; users may add to both.

tests/cluster/test_cluster_pod_security.py has the API server's PodSecurity admission judge the same pods.
"""

from __future__ import annotations

from typing import Any

from tests.unit.builders_examples import child, load_pool

from inferencepool.api import labels
from inferencepool.builders import pool_children

RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def pod_of(workload: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = workload["spec"]["template"]["spec"]
    return pod


def container_contexts(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c.get("securityContext", {}) for c in pod["containers"] + pod.get("initContainers", [])]


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    found = [f"host namespace {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    found += [f"hostPath volume {v['name']}" for v in pod.get("volumes", []) if "hostPath" in v]
    for container in pod["containers"]:
        context = container.get("securityContext", {})
        if context.get("privileged"):
            found.append(f"{container['name']}: privileged")
        found += [f"{container['name']}: hostPort" for p in container.get("ports", []) if p.get("hostPort")]
    return found


def escalation_violations(pod: dict[str, Any], allowed_caps: set[str]) -> list[str]:
    found = []
    pod_seccomp = pod.get("securityContext", {}).get("seccompProfile", {}).get("type")
    for container, context in zip(pod["containers"], container_contexts(pod), strict=True):
        name = container["name"]
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation != false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{name}: capabilities.drop lacks ALL")
        found += [f"{name}: adds {cap}" for cap in capabilities.get("add", []) if cap not in allowed_caps]
        seccomp = context.get("seccompProfile", {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile {seccomp}")
    return found


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    found = baseline_violations(pod) + escalation_violations(pod, {"NET_BIND_SERVICE"})
    pod_context = pod.get("securityContext", {})
    for container, context in zip(pod["containers"], container_contexts(pod), strict=True):
        name = container["name"]
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            found.append(f"{name}: runAsNonRoot unset")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        if context.get("readOnlyRootFilesystem") is not True:  # beyond the profile: this project's own rule
            found.append(f"{name}: root filesystem writable")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            found.append(f"volume {volume['name']}: {kinds}")
    return found


def workloads(pool: Any) -> dict[str, dict[str, Any]]:
    found = {}
    for manifest in pool_children(pool):
        if manifest["kind"] in ("Deployment", "StatefulSet"):
            found[manifest["metadata"]["labels"][labels.LABEL_ROLE]] = manifest
    return found


def test_router_and_lmcache_controller_pods_meet_restricted() -> None:
    found = workloads(load_pool("llama-3.1-8b.yaml"))
    assert {"router", "lmcache-controller", "prefill", "decode"} <= found.keys()
    for role in ("router", "lmcache-controller"):
        pod = pod_of(found[role])
        assert restricted_violations(pod) == [], role
        # The read-only root has a writable scratch folder.
        (container,) = pod["containers"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        scratch = {v["name"]: v for v in pod["volumes"]}[mounts["/tmp"]]
        assert "emptyDir" in scratch


def test_engines_drop_capabilities_and_escalation_and_use_runtime_default_seccomp() -> None:
    for role, workload in workloads(load_pool("llama-3.1-8b.yaml")).items():
        if role in labels.ENGINE_ROLES:
            pod = pod_of(workload)
            assert baseline_violations(pod) == [], role
            assert escalation_violations(pod, set()) == [], role


def test_rdma_adds_ipc_lock_and_keeps_the_rest() -> None:
    pool = load_pool(
        "llama-3.1-8b.yaml",
        decode__securityContext={"capabilities": {"add": ["IPC_LOCK"]}},
        decode__podSecurityContext={"fsGroup": 1000},
    )
    decode = pod_of(child(pool, "StatefulSet", "llama-8b-decode"))
    (container,) = decode["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
    }
    assert decode["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": 1000}
    assert escalation_violations(decode, {"IPC_LOCK"}) == []
    # The other pool is untouched.
    prefill = pod_of(child(pool, "StatefulSet", "llama-8b-prefill"))
    assert "add" not in prefill["containers"][0]["securityContext"]["capabilities"]


def test_router_security_contexts_are_settable() -> None:
    pool = load_pool(
        "llama-3.1-8b.yaml",
        router__podSecurityContext={"runAsUser": 2000, "runAsGroup": 2000},
        router__securityContext={"readOnlyRootFilesystem": False},
    )
    pod = pod_of(child(pool, "Deployment", "llama-8b-router"))
    assert pod["securityContext"]["runAsUser"] == 2000
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_router_gets_no_hf_token() -> None:
    pool = load_pool("llama-3.1-8b.yaml")
    assert pool.spec.model.token_secret is not None
    router = pod_of(child(pool, "Deployment", "llama-8b-router"))["containers"][0]
    assert "HF_TOKEN" not in {e["name"] for e in router["env"]}
    assert all("secretKeyRef" not in e.get("valueFrom", {}) for e in router["env"])
    engine = pod_of(child(pool, "StatefulSet", "llama-8b-decode"))["containers"][0]
    assert "HF_TOKEN" in {e["name"] for e in engine["env"]}
