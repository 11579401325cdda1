"""How long one engine step takes: a roofline over the batch, the same formula for every profile.

A step runs every scheduled token through the model once. Its cost has four parts:
- linear layers: reading the weights (memory floor) vs 2 x params FLOPs per token (compute slope), blended
  with a p-norm so the knee between them is smooth, as Vidur's per-operator profiles show;
- attention of prefill chunks: quadratic in the chunk's length (each new token attends to everything before
  it), which is what makes prefill cost grow faster than linearly with the prompt;
- attention of decodes: reading every running sequence's KV cache (memory-bound), so ITL grows with batch size
  and with total context;
- fixed per-step overhead (scheduler, sampling, launches) and tensor-parallel all-reduces.
Prefill chunks and decodes sharing a step pay the sum, so a long prefill stalls every decode in its batch
(chunked-prefill interference).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferencepool.perf.profiles import EngineProfile


@dataclass(frozen=True)
class PrefillChunk:
    new_tokens: int
    context_tokens: int  # tokens already in the KV cache before this chunk (cached prefix or earlier chunks)


def linear_time(profile: EngineProfile, tokens: int) -> float:
    if tokens <= 0:
        return 0.0
    model, hw, tp = profile.model, profile.hardware, profile.tensor_parallel
    memory = (model.weight_bytes / tp) / (hw.hbm_bytes_per_s * profile.bandwidth_efficiency)
    compute = tokens * (2.0 * model.params / tp) / (hw.bf16_flops * profile.flops_efficiency)
    p = profile.roofline_blend
    return float((memory**p + compute**p) ** (1.0 / p))


def prefill_attention_time(profile: EngineProfile, chunks: Sequence[PrefillChunk]) -> float:
    pairs = 0.0
    for chunk in chunks:
        # causal: token i of the chunk attends to context + i + 1 keys
        pairs += chunk.new_tokens * (chunk.context_tokens + (chunk.new_tokens + 1) / 2.0)
    if pairs == 0.0:
        return 0.0
    flops = pairs * profile.model.attention_flops_per_pair / profile.tensor_parallel
    return flops / (profile.hardware.bf16_flops * profile.attention_efficiency)


def decode_attention_time(profile: EngineProfile, total_context_tokens: int) -> float:
    """Reading the KV cache of every decoding sequence once."""
    if total_context_tokens <= 0:
        return 0.0
    kv_bytes = total_context_tokens * profile.model.kv_bytes_per_token / profile.tensor_parallel
    return kv_bytes / (profile.hardware.hbm_bytes_per_s * profile.bandwidth_efficiency)


def step_time(
    profile: EngineProfile,
    prefill_chunks: Sequence[PrefillChunk],
    decode_context_tokens: Sequence[int],
    load_seconds: float = 0.0,
) -> float:
    """Duration of one engine step; `load_seconds` is KV loaded synchronously into this step (LMCache)."""
    if profile.zero_compute:
        return 0.0
    tokens = sum(c.new_tokens for c in prefill_chunks) + len(decode_context_tokens)
    if tokens == 0:
        return 0.0
    return (
        profile.step_overhead_s
        + profile.allreduce_s_per_layer * profile.model.layers
        + linear_time(profile, tokens)
        + prefill_attention_time(profile, prefill_chunks)
        + decode_attention_time(profile, sum(decode_context_tokens))
        + load_seconds
    )


def kv_transfer_time(profile: EngineProfile, tokens: int, bytes_per_s_per_gpu: float) -> float:
    """Moving `tokens` of KV between engines of this profile: each TP rank reads its shard on its own link."""
    if profile.zero_compute or tokens <= 0:
        return 0.0
    kv_bytes = tokens * profile.model.kv_bytes_per_token
    return profile.kv_transfer_latency_s + kv_bytes / (bytes_per_s_per_gpu * profile.tensor_parallel)


def nixl_transfer_time(profile: EngineProfile, tokens: int) -> float:
    return kv_transfer_time(profile, tokens, profile.hardware.kv_link_bytes_per_s)


def device_copy_time(profile: EngineProfile, tokens: int) -> float:
    """KV already on the GPU (LMCache's PD buffer) copied into vLLM's paged cache: read and write in HBM."""
    if profile.zero_compute or tokens <= 0:
        return 0.0
    kv_bytes = tokens * profile.model.kv_bytes_per_token / profile.tensor_parallel
    return 2.0 * kv_bytes / (profile.hardware.hbm_bytes_per_s * profile.bandwidth_efficiency)


def host_load_time(profile: EngineProfile, tokens: int) -> float:
    """LMCache CPU tier -> GPU over the host link."""
    if profile.zero_compute or tokens <= 0:
        return 0.0
    kv_bytes = tokens * profile.model.kv_bytes_per_token
    return kv_bytes / (profile.hardware.host_link_bytes_per_s * profile.tensor_parallel)


def ideal_decode_itl(profile: EngineProfile, batch_size: int, context_tokens_each: int) -> float:
    """ITL of a steady batch of `batch_size` decoding sequences with no prefill interference."""
    return step_time(profile, (), [context_tokens_each] * batch_size)


def ideal_prefill_time(profile: EngineProfile, prompt_tokens: int) -> float:
    """Prefill of one prompt on an idle engine, chunked by max_num_batched_tokens as vLLM does."""
    total = 0.0
    done = 0
    while done < prompt_tokens:
        chunk = min(profile.max_num_batched_tokens, prompt_tokens - done)
        total += step_time(profile, [PrefillChunk(chunk, done)], ())
        done += chunk
    return total
