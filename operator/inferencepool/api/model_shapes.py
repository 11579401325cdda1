"""What the operator knows of a few common models: KV cache bytes per token and context length.

Used for defaults that depend on the model (LMCache PD's receive buffer). KV bytes per token in bf16 are
2 (K and V) x layers x KV heads x head dim x 2 bytes, from each model's config.json; a model not listed here
needs the size given in the spec instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ModelShape:
    kv_bytes_per_token: int  # all layers, all KV heads, bf16
    max_model_len: int  # max_position_embeddings: vLLM's default --max-model-len


def _kv(layers: int, kv_heads: int, head_dim: int) -> int:
    return 2 * layers * kv_heads * head_dim * 2


KNOWN_MODELS: Final[dict[str, ModelShape]] = {
    "meta-llama/Llama-3.1-8B-Instruct": ModelShape(_kv(32, 8, 128), 131072),
    "meta-llama/Llama-3.1-8B": ModelShape(_kv(32, 8, 128), 131072),
    "meta-llama/Llama-3.1-70B-Instruct": ModelShape(_kv(80, 8, 128), 131072),
    "meta-llama/Llama-3.1-70B": ModelShape(_kv(80, 8, 128), 131072),
    "meta-llama/Llama-3.3-70B-Instruct": ModelShape(_kv(80, 8, 128), 131072),
    "meta-llama/Llama-3.2-1B-Instruct": ModelShape(_kv(16, 8, 64), 131072),
    "meta-llama/Llama-3.2-3B-Instruct": ModelShape(_kv(28, 8, 128), 131072),
    "mistralai/Mistral-7B-Instruct-v0.3": ModelShape(_kv(32, 8, 128), 32768),
    "Qwen/Qwen2.5-7B-Instruct": ModelShape(_kv(28, 4, 128), 32768),
    "Qwen/Qwen2.5-72B-Instruct": ModelShape(_kv(80, 8, 128), 32768),
}


def model_shape(name: str) -> ModelShape | None:
    return KNOWN_MODELS.get(name)
