"""A tiny Llama-shaped model that a test or the demo can make on the spot: no download, no torch.

The weights are seeded random numbers (the model talks nonsense, deterministically), so the real vLLM engine
has something to load that costs ~7 MB on disk and a few milliseconds per token on a CPU. What matters is the
layout: a Hugging Face model folder that vLLM serves unchanged (config.json, generation_config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with a chat template) and whose tokenizer.json the
router and the fake engine count with, as they count a real model's.

The tokenizer is a byte-level BPE (GPT-2/Llama 3 style) trained with HF `tokenizers` on this package's own
Python sources: text that ships with every install of the project, is fixed for a given checkout (unlike the
Python standard library, which changes with the interpreter), and is mostly English comments and code, so
prompts written in English tokenize at a realistic ~3-4 characters per token. The same checkout and seed
always give the same bytes (tests/unit/test_tiny_model.py).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, IM_START, IM_END]  # ids 0..4, in this order

# ChatML-style turns behind a BOS, as Llama 3 starts its template with one. vLLM renders chat requests with
# this and tokenizes the result without adding specials again.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}" + IM_START + "{{ message['role'] }}\n"
    "{{ message['content'] }}" + IM_END + "\n{% endfor %}"
    "{% if add_generation_prompt %}" + IM_START + "assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyShape:
    """Llama 3's architecture at toy size: grouped-query attention (4 query heads over 2 KV heads)."""

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    # Long enough for prompts of several thousand tokens (the router's length threshold and prefix blocks);
    # the engine's --max-model-len caps what it serves.
    max_position_embeddings: int = 16384
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    # Hugging Face's LlamaConfig default: the standard deviation of every projection's initial weights.
    initializer_range: float = 0.02


def corpus_files() -> list[Path]:
    """The training text: this package's .py files, in a fixed order."""
    package = Path(__file__).resolve().parents[1]
    return sorted(package.rglob("*.py"), key=lambda p: p.relative_to(package).as_posix())


def train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Fed as one in-memory iterator, in file order, so the training sees the same sequence every time.
    texts = [path.read_text(encoding="utf-8") for path in corpus_files()]
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bos_id = tokenizer.token_to_id(BOS)
    # A completion prompt starts with BOS, as Llama's does; the router counts it as the engine does.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def _bf16_bytes(values: np.ndarray) -> bytes:
    """float32 -> bfloat16 (round to nearest even), little-endian, as safetensors' BF16 stores it."""
    bits = values.astype("<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def llama_weights(shape: TinyShape, seed: int) -> dict[str, tuple[list[int], np.ndarray]]:
    """Every tensor LlamaForCausalLM loads, with Hugging Face's initialisation: projections and embeddings
    drawn from N(0, initializer_range), RMSNorm weights 1. Drawn in name order from one seeded generator."""
    h, i, kv = shape.hidden_size, shape.intermediate_size, shape.num_key_value_heads * shape.head_dim
    q = shape.num_attention_heads * shape.head_dim
    shapes: dict[str, list[int]] = {
        "lm_head.weight": [shape.vocab_size, h],
        "model.embed_tokens.weight": [shape.vocab_size, h],
        "model.norm.weight": [h],
    }
    for layer in range(shape.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        shapes |= {
            prefix + "input_layernorm.weight": [h],
            prefix + "post_attention_layernorm.weight": [h],
            prefix + "self_attn.q_proj.weight": [q, h],
            prefix + "self_attn.k_proj.weight": [kv, h],
            prefix + "self_attn.v_proj.weight": [kv, h],
            prefix + "self_attn.o_proj.weight": [h, q],
            prefix + "mlp.gate_proj.weight": [i, h],
            prefix + "mlp.up_proj.weight": [i, h],
            prefix + "mlp.down_proj.weight": [h, i],
        }
    rng = np.random.default_rng(seed)
    weights = {}
    for name in sorted(shapes):
        dims = shapes[name]
        if name.endswith("norm.weight"):
            weights[name] = (dims, np.ones(dims, dtype=np.float32))
        else:
            values = rng.standard_normal(dims, dtype=np.float32) * np.float32(shape.initializer_range)
            weights[name] = (dims, values)
    return weights


def safetensors_bytes(tensors: dict[str, tuple[list[int], np.ndarray]]) -> bytes:
    """The safetensors format by hand (an 8-byte header length, a JSON header, the raw tensors): the format is
    that small, and the `safetensors` package would be one more dependency for one write."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        dims, values = tensors[name]
        blob = _bf16_bytes(values)
        header[name] = {"dtype": "BF16", "shape": dims, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the spec lets the header be padded with spaces; 8-byte alignment
    return struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs)


def config_json(shape: TinyShape, bos_id: int, eos_id: int, pad_id: int) -> dict[str, Any]:
    """config.json as transformers 5 (vLLM 0.32/0.33's) writes it for a LlamaConfig."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "hidden_act": "silu",
        "dtype": "bfloat16",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_parameters": {"rope_theta": shape.rope_theta, "rope_type": "default"},
        "initializer_range": shape.initializer_range,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    }


def tokenizer_config_json(shape: TinyShape) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": shape.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_tiny_model(out: Path, seed: int = 0, shape: TinyShape | None = None) -> Path:
    """Write the model folder to `out` (created; files in it are replaced) and return it."""
    shape = shape or TinyShape()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(shape.vocab_size)
    if tokenizer.get_vocab_size() != shape.vocab_size:
        raise ValueError(f"the corpus gave {tokenizer.get_vocab_size()} tokens, not {shape.vocab_size}")
    bos_id, eos_id, pad_id = (tokenizer.token_to_id(t) for t in (BOS, EOS, PAD))
    (out / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n")
    _write_json(out / "tokenizer_config.json", tokenizer_config_json(shape))
    _write_json(out / "config.json", config_json(shape, bos_id, eos_id, pad_id))
    # vLLM takes its default sampling parameters and stop ids from here.
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id},
    )
    (out / "model.safetensors").write_bytes(safetensors_bytes(llama_weights(shape, seed)))
    return out
