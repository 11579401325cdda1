"""`--kv-transfer-config` for vLLM 0.33: how a prefill pod hands its KV cache to a decode pod.

Two transfer modes (docs/engine-contract.md, sections 2-3 and "LMCache PD mode"):
- Nixl: vLLM's NixlConnector, `kv_role: kv_producer` on prefill pods and `kv_consumer` on decode pods, as
  vLLM 0.33 asks (`kv_both` is deprecated for it, nixl/connector.py NixlBaseConnector.__init__). Which leg a
  request is stays decided per request by the router through `kv_transfer_params`: a decode pod given no
  params prefills the prompt itself (the router's colocated fallback), whatever its role. With LMCache on
  (CPU offload, and p2p prefix sharing when enabled), vLLM's MultiConnector runs NIXL first (it answers for
  the P->D hand-off) and LMCacheConnectorV1 (kv_both: it stores and loads on every pod) second; each child
  is its own KVTransferConfig with its own kv_role (multi_connector.py _get_connector_classes_and_configs).
- LMCachePD: LMCacheConnectorV1 in LMCache's PD mode, prefill as `kv_producer`, decode as `kv_consumer`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

EngineRole = Literal["prefill", "decode"]
TransferMode = Literal["Nixl", "LMCachePD"]


# How long a prefill engine keeps a finished request's KV blocks for the decode engine that has not read them
# (vLLM's default, made explicit because the pod's drain waits for it).
KV_LEASE_SECONDS = 30


def nixl_connector(role: EngineRole) -> dict[str, Any]:
    # "fail": a decode pod that cannot fetch the blocks errors out instead of silently recomputing the
    # prompt, so the router's fallback (serve colocated) is a visible decision rather than hidden ITL damage.
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        "kv_buffer_device": "cuda",
        "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {"kv_lease_duration": KV_LEASE_SECONDS},
    }


def lmcache_sharing_connector() -> dict[str, Any]:
    return {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}


def lmcache_pd_connector(role: EngineRole) -> dict[str, Any]:
    extra: dict[str, Any] = {"discard_partial_chunks": False}
    if role == "decode":
        # The decode pod recomputes the last prompt token itself, so the producer's partial last chunk is not
        # needed.
        extra["skip_last_n_tokens"] = 1
    return {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        "kv_connector_extra_config": extra,
    }


def kv_transfer_config(role: EngineRole, mode: TransferMode, lmcache: bool) -> dict[str, Any]:
    """The kv-transfer-config document for one engine pool; `lmcache`: the pool has a kvCache block."""
    if mode == "LMCachePD":
        return lmcache_pd_connector(role)
    if not lmcache:
        return nixl_connector(role)
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [nixl_connector(role), lmcache_sharing_connector()]},
    }


def kv_transfer_config_json(role: EngineRole, mode: TransferMode, lmcache: bool) -> str:
    """Canonical JSON (sorted keys, no spaces) so that re-rendering the same spec gives byte-identical
    args."""
    return json.dumps(kv_transfer_config(role, mode, lmcache), sort_keys=True, separators=(",", ":"))
