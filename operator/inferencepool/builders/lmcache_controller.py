"""The LMCache controller (p2p on): one pod that knows which engine holds which prefix, and its Service.

Engines register with it over ZMQ (pull and reply ports) and ask it where a prefix lives; it keeps that index
in memory, so it runs as a single replica that is replaced, never doubled (Recreate).
"""

from __future__ import annotations

from typing import Final

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import lmcache
from inferencepool.builders.common import (
    SCRATCH_PATH,
    Manifest,
    PoolRef,
    lmcache_controller_name,
    metadata,
    python_hash_seed,
    restricted_container_security,
    restricted_pod_security,
    scratch_mount,
    scratch_volume,
    selector_labels,
    tcp_port,
)

ROLE: Final = "lmcache-controller"


def controller_deployment(pool: InferencePool, ref: PoolRef) -> Manifest:
    spec = pool.spec
    name = lmcache_controller_name(ref)
    image = spec.effective_kv_cache().p2p.controller_image or spec.engine.image
    # It has no GET health endpoint; a TCP check on its HTTP port is what it offers.
    tcp_check = {
        "tcpSocket": {"port": "http"},
        "periodSeconds": 10,
        "failureThreshold": 3,
        "timeoutSeconds": 2,
    }
    container: Manifest = {
        "name": "lmcache-controller",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": lmcache.controller_command(),
        "ports": [
            tcp_port("http", lmcache.CONTROLLER_HTTP_PORT),
            tcp_port("pull", lmcache.CONTROLLER_PULL_PORT),
            tcp_port("reply", lmcache.CONTROLLER_REPLY_PORT),
        ],
        # It hashes lookup tokens into chunk keys; they must match the keys the engines report.
        "env": [
            {"name": "PYTHONHASHSEED", "value": python_hash_seed(ref)},
            # It runs the engine image as a non-root user on a read-only root: home and caches go to scratch.
            {"name": "HOME", "value": SCRATCH_PATH},
        ],
        "readinessProbe": {**tcp_check, "successThreshold": 1},
        "livenessProbe": {**tcp_check, "successThreshold": 1},
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "securityContext": restricted_container_security(),
        "volumeMounts": [scratch_mount()],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(ref, name, ROLE),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector_labels(ref, ROLE)},
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": metadata(ref, name, ROLE)["labels"]},
                "spec": {
                    "securityContext": restricted_pod_security(),
                    "containers": [container],
                    "volumes": [scratch_volume()],
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                },
            },
        },
    }


def controller_service(ref: PoolRef) -> Manifest:
    name = lmcache_controller_name(ref)
    ports = [
        ("http", lmcache.CONTROLLER_HTTP_PORT),
        ("pull", lmcache.CONTROLLER_PULL_PORT),
        ("reply", lmcache.CONTROLLER_REPLY_PORT),
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(ref, name, ROLE),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(ref, ROLE),
            "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports],
        },
    }


def controller_children(pool: InferencePool, ref: PoolRef) -> list[Manifest]:
    if not pool.spec.p2p_enabled():
        return []
    return [controller_service(ref), controller_deployment(pool, ref)]
