"""The KV-compatibility revision of a pool: a hash of everything that must match for a prefill pod's KV to be
valid on a decode pod. Every engine pod carries it as labels.LABEL_KV_COMPAT; the router pairs only pods of
equal value, and a change of it rolls both pools together (builders/rollout.py).

What vLLM itself compares when a decode engine first meets a prefill engine (vLLM 0.32/0.33,
vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py compute_nixl_compatibility_hash, checked in
base_worker.py before the agent metadata is decoded, "NIXL compatibility hash mismatch"): the vLLM and NIXL
connector versions, the model *name*, dtype, KV heads, head size, layers, attention backend, KV cache dtype,
hybrid KV cache manager, speculative config and the transfer mode. Then at registration (add_remote_agent,
kv_connector/utils.py TransferTopology): TP sizes that divide one another, a decode block size divisible by
the prefill's. Not compared at all: the model's revision. Two revisions of one model id pass vLLM's check and
the decode engine reads KV computed by other weights, silently. So the hash here covers vLLM's factors as the
spec sets them (image for the version, the model, every engine argument and variable, which is where dtype,
KV cache dtype, block size and attention backend are set), the revision and tokenizer, both pools' TP sizes
(the layout rule) and the connector with its settings. It is coarser than vLLM's: a change of an unrelated
engine argument also rolls both pools together, which costs a surge pod, never a bad pairing.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from inferencepool.api.v1alpha1 import POOL_ROLES, InferencePool
from inferencepool.builders.kvtransfer import KV_LEASE_SECONDS, kv_transfer_config

HASH_LENGTH: Final = 16  # hex digits: a label value, and a name a user can compare by eye


def kv_compat_factors(pool: InferencePool) -> dict[str, Any]:
    """What the hash is made of, one entry per reason; the same for both roles, so pods of both carry one
    value."""
    spec = pool.spec
    return {
        "model": spec.model.name,
        "revision": spec.model.revision,
        "tokenizer": spec.model.tokenizer,
        "image": spec.engine.image,
        "engine_args": list(spec.engine.extra_args),
        "engine_env": list(spec.engine.extra_env),
        "tensor_parallel": {role: spec.tensor_parallel_size(role) for role in POOL_ROLES},
        "connector": spec.kv_transfer.connector,
        "kv_transfer": {
            role: kv_transfer_config(role, spec.kv_transfer.connector, spec.uses_lmcache())
            for role in POOL_ROLES
        },
        "kv_lease_seconds": KV_LEASE_SECONDS,
        "kv_cache": spec.kv_cache.model_dump(mode="json", by_alias=True) if spec.kv_cache else None,
    }


def kv_compat_hash(pool: InferencePool) -> str:
    """The pool's KV-compatibility revision (16 hex digits)."""
    canonical = json.dumps(kv_compat_factors(pool), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]
