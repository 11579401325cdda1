"""Engine profiles: a model shape on a hardware type, plus the efficiencies that turn peak figures into time.

Every profile goes through the same roofline formulas in `timing.py`; profiles differ only in numbers.

Sources for the numbers (public figures):
- H100 SXM5: 80 GB HBM3 at 3.35 TB/s, 989 TFLOPS dense BF16 (NVIDIA H100 Tensor Core GPU datasheet).
- H200 SXM: 141 GB HBM3e at 4.8 TB/s, same 989 TFLOPS dense BF16 as H100 (NVIDIA H200 datasheet).
- One ConnectX-7 400 Gb/s NIC per GPU in a DGX/HGX H100/H200 node (NVIDIA DGX H100 user guide): 50 GB/s peak
  per GPU for NIXL's RDMA reads; we assume 80% of it (40 GB/s) is reached for large KV block reads.
- PCIe Gen5 x16 host link, 64 GB/s peak; LMCache's CPU tier is loaded over it at well under peak (chunked
  copies), we assume 25 GB/s.
- Llama-3.1-8B: 8.03 B parameters, 32 layers, hidden 4096, 8 KV heads of dim 128, 128 K context
  (meta-llama/Llama-3.1-8B config.json). KV per token = 2 (K,V) x 32 x 8 x 128 x 2 bytes = 128 KiB.
- Llama-3.1-70B: 70.6 B parameters, 80 layers, hidden 8192, 8 KV heads of dim 128 (config.json); 320
  KiB/token.
- Efficiencies are calibrated on Vidur's per-operator profiles (/work/shared/traces/vidur_*.csv, MIT, from
  microsoft/vidur), summed over the linear operators of one decoder layer:
  * H100, Llama-2-7B, TP1: 0.175 ms/layer at 1 token (405 MB of weights per layer -> 2.3 TB/s, 69% of peak
    bandwidth) and 0.63 us/token/layer at 4096 tokens (405 MFLOP/token/layer -> 640 TFLOPS, 65% of peak).
  * H100, Llama-2-70B, TP4: 0.179 ms/layer at 1 token (71% of bandwidth), 0.68 us/token/layer at 4096 tokens
    (428 MFLOP/token/layer/GPU -> 632 TFLOPS, 64%).
  * A100, Llama-3-8B (GQA, same shapes as 3.1), TP1: 2.08 us/token/layer at 4096 tokens -> 67% of 312 TFLOPS.
  Vidur runs kernels eagerly; vLLM decodes under CUDA graphs, so for bandwidth we take 0.75 (between Vidur's
  0.69-0.71 and the ~0.8 that GEMV kernels reach), which gives Llama-3.1-8B/H100 a single-stream ITL of ~7 ms.
  The blend between the memory floor and the compute slope (`roofline_blend`) is fitted to the same Vidur
  rows: a p-norm with p=1.5 reproduces the 7B/H100 layer time within 7% from 128 to 1024 tokens.
- Attention runs at 50% of peak FLOPS: FlashAttention-3 reports 75% of H100 peak in its best case and
  FlashAttention-2 35%; vLLM on Hopper uses FA3 kernels with paging overheads.
- KV capacity follows vLLM's own rule: gpu_memory_utilization x HBM - weights - activation reserve, divided by
  KV bytes per token; for Llama-3.1-8B on one H100 at 0.9 that is ~400 K tokens, the order of magnitude
  vLLM's start-up log reports ("GPU KV cache size"); the 3 GiB activation reserve is an assumption.
- vLLM V1 defaults on >= 70 GB GPUs for the OpenAI server: max_num_batched_tokens 8192, max_num_seqs 1024
  (vllm/engine/arg_utils.py), block size 16.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from inferencepool.perf.models import DEMO_MODEL, LLAMA_31_8B, LLAMA_31_70B, ModelShape

GB = 1e9
GIB = float(1 << 30)


@dataclass(frozen=True)
class Hardware:
    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    kv_link_bytes_per_s: float  # per GPU, the RDMA NIC NIXL and LMCache p2p read through
    host_link_bytes_per_s: float  # per GPU, host memory <-> GPU (LMCache CPU tier)


@dataclass(frozen=True)
class EngineProfile:
    name: str
    model: ModelShape
    hardware: Hardware
    tensor_parallel: int = 1
    flops_efficiency: float = 0.65
    attention_efficiency: float = 0.5
    bandwidth_efficiency: float = 0.75
    roofline_blend: float = 1.5
    step_overhead_s: float = 0.0006
    allreduce_s_per_layer: float = 0.0  # two all-reduces per layer under TP; latency-bound at decode sizes
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 3.0 * GIB
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    kv_block_tokens: int = 16
    max_model_len: int = 32768
    kv_transfer_latency_s: float = 0.002  # NIXL read setup + completion notification
    zero_compute: bool = False  # every cost is zero: the engine is bound only by its own CPU (router benches)

    @property
    def kv_capacity_tokens(self) -> int:
        per_gpu_free = (
            self.gpu_memory_utilization * self.hardware.hbm_bytes
            - self.model.weight_bytes / self.tensor_parallel
            - self.activation_reserve_bytes
        )
        if per_gpu_free <= 0:
            raise ValueError(f"profile {self.name}: the weights do not fit on {self.tensor_parallel} GPU(s)")
        per_gpu_kv_per_token = self.model.kv_bytes_per_token / self.tensor_parallel
        return int(per_gpu_free / per_gpu_kv_per_token)

    @property
    def kv_capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // self.kv_block_tokens

    def with_overrides(
        self,
        *,
        tensor_parallel: int | None = None,
        max_model_len: int | None = None,
        gpu_memory_utilization: float | None = None,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        kv_block_tokens: int | None = None,
    ) -> EngineProfile:
        """The same profile under vLLM serve flags that change its shape (the pod spec wins)."""
        changes: dict[str, object] = {}
        if tensor_parallel is not None:
            changes["tensor_parallel"] = tensor_parallel
        if max_model_len is not None:
            changes["max_model_len"] = max_model_len
        if gpu_memory_utilization is not None:
            changes["gpu_memory_utilization"] = gpu_memory_utilization
        if max_num_batched_tokens is not None:
            changes["max_num_batched_tokens"] = max_num_batched_tokens
        if max_num_seqs is not None:
            changes["max_num_seqs"] = max_num_seqs
        if kv_block_tokens is not None:
            changes["kv_block_tokens"] = kv_block_tokens
        profile = dataclasses.replace(self, **changes)  # type: ignore[arg-type]
        profile.validate()
        return profile

    def validate(self) -> None:
        if self.tensor_parallel < 1:
            raise ValueError(f"profile {self.name}: tensor parallel size must be >= 1")
        if self.max_model_len < 1 or self.max_model_len > self.model.max_position:
            raise ValueError(
                f"profile {self.name}: max_model_len {self.max_model_len} must be within "
                f"1..{self.model.max_position}"
            )
        if self.kv_block_tokens < 1:
            raise ValueError(f"profile {self.name}: block size must be >= 1")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError(f"profile {self.name}: max_num_batched_tokens and max_num_seqs must be >= 1")
        if self.kv_capacity_tokens < self.max_model_len:
            raise ValueError(
                f"profile {self.name}: KV capacity {self.kv_capacity_tokens} tokens is below max_model_len "
                f"{self.max_model_len} (vLLM refuses to start in this case too)"
            )


H100_SXM = Hardware(
    name="H100-SXM",
    hbm_bytes=80 * GB,
    hbm_bytes_per_s=3.35e12,
    bf16_flops=989e12,
    kv_link_bytes_per_s=40 * GB,
    host_link_bytes_per_s=25 * GB,
)
H200_SXM = Hardware(
    name="H200-SXM",
    hbm_bytes=141 * GB,
    hbm_bytes_per_s=4.8e12,
    bf16_flops=989e12,
    kv_link_bytes_per_s=40 * GB,
    host_link_bytes_per_s=25 * GB,
)
# A deliberately small imaginary accelerator so demos on a laptop CPU show the same shapes (batching,
# queueing, prefill/decode interference) at human-visible speeds: ~22 ms ITL, ~0.12 ms per prompt token, ~80 K
# tokens of KV.
DEMO_DEVICE = Hardware(
    name="demo-device",
    hbm_bytes=3 * GB,
    hbm_bytes_per_s=80 * GB,
    bf16_flops=16e12,
    kv_link_bytes_per_s=4 * GB,
    host_link_bytes_per_s=2 * GB,
)

PROFILES: dict[str, EngineProfile] = {
    "llama-3.1-8b-h100": EngineProfile(name="llama-3.1-8b-h100", model=LLAMA_31_8B, hardware=H100_SXM),
    "llama-3.1-8b-h200": EngineProfile(name="llama-3.1-8b-h200", model=LLAMA_31_8B, hardware=H200_SXM),
    "llama-3.1-70b-h100-tp4": EngineProfile(
        name="llama-3.1-70b-h100-tp4",
        model=LLAMA_31_70B,
        hardware=H100_SXM,
        tensor_parallel=4,
        # NCCL all-reduce of a few hundred KB over NVLink is latency-bound at ~10 us; two per layer.
        allreduce_s_per_layer=20e-6,
    ),
    "llama-3.1-70b-h200-tp4": EngineProfile(
        name="llama-3.1-70b-h200-tp4",
        model=LLAMA_31_70B,
        hardware=H200_SXM,
        tensor_parallel=4,
        allreduce_s_per_layer=20e-6,
    ),
    "cpu-demo": EngineProfile(
        name="cpu-demo",
        model=DEMO_MODEL,
        hardware=DEMO_DEVICE,
        step_overhead_s=0.002,
        activation_reserve_bytes=0.2 * GB,
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        max_model_len=16384,
        kv_transfer_latency_s=0.001,
    ),
    "zero": EngineProfile(
        name="zero",
        model=DEMO_MODEL,
        hardware=H200_SXM,  # only for a KV capacity that never limits a benchmark
        max_num_batched_tokens=1 << 20,
        max_num_seqs=1 << 16,
        max_model_len=16384,
        zero_compute=True,
    ),
}

DEFAULT_PROFILE = "cpu-demo"


def get_profile(name: str) -> EngineProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown engine profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
