"""Every shape of pool the contract tests render: each transfer mode, with and without LMCache sharing, at
several tensor-parallel sizes, the two pools alike and apart."""

from __future__ import annotations

from typing import Any

from inferencepool.api.v1alpha1 import InferencePool
from tests.unit.builders_examples import load_pool

NIXL_TP = [(1, 1), (2, 2), (4, 4), (1, 4), (4, 1), (2, 8)]  # (prefill, decode)
PD_TP = [1, 2, 4]
KV_CACHES: dict[str, dict[str, Any] | None] = {
    "nixl-only": None,
    "offload": {"cpuOffloadGiB": 16},
    "offload-disk": {"cpuOffloadGiB": 16, "disk": {"sizeGiB": 200}},
    "p2p": {"cpuOffloadGiB": 16, "p2p": {"enabled": True}},
}


def _tp(prefill: int, decode: int) -> dict[str, Any]:
    return {
        "prefill__tensorParallelSize": prefill,
        "decode__tensorParallelSize": decode,
        "prefill__gpusPerReplica": None,
        "decode__gpusPerReplica": None,
    }


def contract_pools() -> dict[str, InferencePool]:
    pools: dict[str, InferencePool] = {}
    for name, kv_cache in KV_CACHES.items():
        for prefill, decode in NIXL_TP:
            pools[f"{name}-tp{prefill}x{decode}"] = load_pool(
                "llama-3.1-8b.yaml", kvCache=kv_cache, **_tp(prefill, decode)
            )
    for tp in PD_TP:
        pools[f"lmcache-pd-tp{tp}"] = load_pool(
            "llama-3.1-8b.yaml",
            kvTransfer={"connector": "LMCachePD"},
            kvCache={"chunkSize": 256},
            router={"replicas": 1},
            **_tp(tp, tp),
        )
    pools["demo-cpu"] = load_pool("demo-cpu.yaml")
    # a pinned model revision: --revision and --tokenizer-revision
    pools["revision"] = load_pool(
        "llama-3.1-8b.yaml", model__revision="0e9e39f249a16976918f6564b8830bc894c89659"
    )
    return pools


POOLS = contract_pools()
