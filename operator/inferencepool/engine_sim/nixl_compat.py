"""The NIXL handshake's compatibility check, as vLLM makes it (vLLM 0.32/0.33,
vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py compute_nixl_compatibility_hash and
base_worker.py's handshake): the decode engine asks the prefill engine for its handshake payload the first
time it reads from it, compares the payload's compatibility hash with its own before anything else, and on a
mismatch fails with "NIXL compatibility hash mismatch" (RuntimeError). The requests waiting on that
handshake fail their KV load (kv_load_failure_policy), and the failure counts in
vllm:nixl_num_failed_transfers. Then, at registration, the block sizes must divide (kv_connector/utils.py
TransferTopology.block_size_ratio) and the engine id must be the one kv_transfer_params named.

One factor more than vLLM: the model revision (--revision). vLLM hashes the model *name*, so a decode
engine of one revision reads a prefill engine of another without complaint and decodes from KV computed by
other weights. A real pool then answers with wrong tokens, which no test can see; the fake refuses instead,
with vLLM's words at vLLM's place, so a request that crossed revisions fails visibly.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final

from inferencepool.perf.profiles import EngineProfile

VLLM_VERSION: Final = "0.33.0"  # the vLLM release whose API this fake reproduces
NIXL_CONNECTOR_VERSION: Final = 14  # vLLM 0.33's nixl/metadata.py
ATTENTION_BACKEND: Final = "FLASH_ATTN"  # the backend vLLM picks for these models on H100


@dataclass(frozen=True)
class HandshakePayload:
    """What the prefill engine answers on its side channel (NixlHandshakePayload and the agent metadata the
    decode side checks)."""

    compatibility_hash: str
    engine_id: str
    block_size: int
    tp_size: int

    def document(self) -> dict[str, Any]:
        return {
            "compatibility_hash": self.compatibility_hash,
            "engine_id": self.engine_id,
            "block_size": self.block_size,
            "tp_size": self.tp_size,
        }

    @classmethod
    def of(cls, document: dict[str, Any]) -> HandshakePayload:
        return cls(
            compatibility_hash=str(document["compatibility_hash"]),
            engine_id=str(document["engine_id"]),
            block_size=int(document["block_size"]),
            tp_size=int(document["tp_size"]),
        )


def compatibility_hash(
    vllm_version: str,
    model: str,
    revision: str | None,
    dtype: str,
    cache_dtype: str,
    profile: EngineProfile,
    transfer_mode: str = "pull",
) -> str:
    """vLLM's factors (compute_nixl_compatibility_hash), and the revision (see the module)."""
    shape = profile.model
    factors = {
        "vllm_version": vllm_version,
        "nixl_connector_version": NIXL_CONNECTOR_VERSION,
        "model": model,
        "dtype": dtype,
        "num_kv_heads": shape.kv_heads,
        "head_size": shape.head_dim,
        "num_hidden_layers": shape.layers,
        "attn_backend_name": ATTENTION_BACKEND,
        "cache_dtype": cache_dtype,
        "is_hma_enabled": False,
        "speculative_config": None,
        "transfer_mode": transfer_mode,
        "revision": revision,
    }
    return hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()


def handshake_error(local: HandshakePayload, remote: HandshakePayload, expected_engine_id: str) -> str | None:
    """Why vLLM would refuse this peer, in its words; None when it would not."""
    if remote.compatibility_hash != local.compatibility_hash:
        return (
            f"NIXL compatibility hash mismatch. Local: {local.compatibility_hash}, Remote: "
            f"{remote.compatibility_hash}. Prefill and decode instances have incompatible configurations. "
            "This may be due to: different vLLM versions, models, dtypes, KV cache layouts, attention "
            "backends, etc. Both instances must use identical configurations.Disable this check using "
            '--kv-transfer-config \'{"kv_connector_extra_config": {"enforce_handshake_compat": false}}\''
        )
    if remote.engine_id != expected_engine_id:
        return (
            "Remote NIXL agent engine ID mismatch. "
            f"Expected {expected_engine_id},received {remote.engine_id}."
        )
    if local.block_size % remote.block_size != 0:
        return (
            f"Local block size {local.block_size} is not divisible by remote block size "
            f"{remote.block_size} or vice versa."
        )
    if max(local.tp_size, remote.tp_size) % min(local.tp_size, remote.tp_size) != 0:
        return (
            f"Remote tensor parallel size {remote.tp_size} is not divisible by local tensor parallel size "
            f"{local.tp_size}."
        )
    return None
