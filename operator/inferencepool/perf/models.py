"""Model shapes: what the performance model and the operator's defaults need of a model, from each model's
config.json (num_hidden_layers, hidden_size, num_key_value_heads, head_dim or hidden/heads,
max_position_embeddings) and its parameter count. A model not listed needs the figures that depend on it given
in the spec instead (the LMCache PD receive buffer, engine.maxModelLen)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    max_position: int  # max_position_embeddings: vLLM's default --max-model-len
    bytes_per_param: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, all layers and KV heads, in the weights' dtype (bf16)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def attention_flops_per_pair(self) -> float:
        """FLOPs of QK^T and AV for one (query, key) pair over all layers: 2 matmuls x 2 FLOPs x hidden."""
        return 4.0 * self.layers * self.hidden


LLAMA_31_8B = ModelShape("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 32, 4096, 8, 128, 131072)
LLAMA_31_70B = ModelShape("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 80, 8192, 8, 128, 131072)
# a small imaginary model for demos on a laptop CPU (profiles.py: cpu-demo)
DEMO_MODEL = ModelShape("demo/tiny-0.6b", 0.6e9, 16, 1024, 4, 64, 32768)


def _named(shape: ModelShape, name: str) -> ModelShape:
    return replace(shape, name=name)


KNOWN_MODELS: Final[dict[str, ModelShape]] = {
    shape.name: shape
    for shape in (
        LLAMA_31_8B,
        _named(LLAMA_31_8B, "meta-llama/Llama-3.1-8B"),
        LLAMA_31_70B,
        _named(LLAMA_31_70B, "meta-llama/Llama-3.1-70B"),
        _named(LLAMA_31_70B, "meta-llama/Llama-3.3-70B-Instruct"),
        ModelShape("meta-llama/Llama-3.2-1B-Instruct", 1.24e9, 16, 2048, 8, 64, 131072),
        ModelShape("meta-llama/Llama-3.2-3B-Instruct", 3.21e9, 28, 3072, 8, 128, 131072),
        ModelShape("mistralai/Mistral-7B-Instruct-v0.3", 7.25e9, 32, 4096, 8, 128, 32768),
        ModelShape("Qwen/Qwen2.5-7B-Instruct", 7.62e9, 28, 3584, 4, 128, 32768),
        ModelShape("Qwen/Qwen2.5-72B-Instruct", 72.7e9, 80, 8192, 8, 128, 32768),
    )
}


def model_shape(name: str) -> ModelShape | None:
    return KNOWN_MODELS.get(name)
