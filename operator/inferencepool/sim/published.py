"""The simulator's prefill/decode interference against a published measurement: DistServe's Figure 1 (Zhong
et al., "DistServe: Disaggregating Prefill and Decoding for Goodput-optimized Large Language Model Serving",
OSDI 2024, section 1).

Their setup: a 13B model (OPT-13B) on NVIDIA A100 80GB GPUs, a synthetic load of Poisson arrivals with 512
prompt and 64 output tokens, SLO P90 TTFT 0.4 s and P90 TPOT 0.04 s. Their figures (rps): one colocated vLLM
engine 1.6; one GPU given prefill only 5.6, decode only 10; so two prefill GPUs and one decode GPU serve
10 rps, 3.3 per GPU, 2.1x the colocated engine. Here: the same model shape and GPU through the simulator's
timing model (`perf.timing`, the efficiencies every profile uses), the same load, and the same four
measurements with the simulator's DistServe goodput (`search.goodput`: the highest rate at which 90% of
requests meet both targets, TPOT as each request's mean ITL). The P/D layouts always disaggregate, over
NVLink (DistServe places both phases of a request in one node).

    PYTHONPATH=operator python -m inferencepool.sim.published

Model and GPU figures: OPT-13B config.json (40 layers, hidden 5120, 40 attention heads of dim 128, no GQA,
2048 positions), 12.85 B parameters; A100 SXM4 80GB datasheet (2.039 TB/s HBM2e, 312 TFLOPS dense BF16),
NVLink 3 at 600 GB/s per GPU (half of it assumed reached by KV block reads).
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass

from inferencepool.perf.models import ModelShape
from inferencepool.perf.profiles import GB, EngineProfile, Hardware
from inferencepool.sim.cluster import Scenario
from inferencepool.sim.report import Goodput, Slo
from inferencepool.sim.search import goodput
from inferencepool.sim.workload import TraceRequest

OPT_13B = ModelShape("facebook/opt-13b", 12.85e9, 40, 5120, 40, 128, 2048)
A100_SXM_80GB = Hardware(
    name="A100-SXM-80GB",
    hbm_bytes=80 * GB,
    hbm_bytes_per_s=2.039e12,
    bf16_flops=312e12,
    kv_link_bytes_per_s=300 * GB,  # NVLink within the node
    host_link_bytes_per_s=25 * GB,
)
# vLLM's max_num_seqs of the time (256); its chunk is the profile's default
PROFILE = EngineProfile("opt-13b-a100", OPT_13B, A100_SXM_80GB, max_model_len=2048, max_num_seqs=256)
SLO = Slo(ttft_seconds=0.4, itl_seconds=0.04)
NONE = 1e9  # no target
# DistServe's Figure 1, in requests per second (whole layout)
PUBLISHED = {"colocated": 1.6, "prefill-only": 5.6, "decode-only": 10.0, "2P+1D": 10.0}


def poisson_trace(requests: int = 400, rate: float = 1.0, seed: int = 0) -> list[TraceRequest]:
    rng = random.Random(seed)
    now, trace = 0.0, []
    for _ in range(requests):
        now += rng.expovariate(rate)
        trace.append(TraceRequest(now, 512, 64))
    return trace


@dataclass(frozen=True)
class Row:
    name: str
    gpus: int
    simulated: float  # rps of the layout
    published: float

    def line(self) -> str:
        return (
            f"{self.name:<13} {self.gpus} GPU  simulated {self.simulated:6.2f} rps "
            f"({self.simulated / self.gpus:5.2f}/GPU)  DistServe {self.published:5.1f} rps "
            f"({self.published / self.gpus:4.2f}/GPU)"
        )


def reproduce(trace: list[TraceRequest] | None = None) -> list[Row]:
    """The four measurements of DistServe's Figure 1, in the simulator."""
    replay = trace or poisson_trace()
    cases: list[tuple[str, Scenario, Slo]] = [
        ("colocated", Scenario("colocated", "Colocated", 0, 1), SLO),
        # one prefill GPU against its TTFT target (decode given room), one decode GPU against its TPOT target
        (
            "prefill-only",
            Scenario("prefill-only", "AlwaysDisaggregate", 1, 2),
            Slo(SLO.ttft_seconds, NONE),
        ),
        ("decode-only", Scenario("decode-only", "AlwaysDisaggregate", 2, 1), Slo(NONE, SLO.itl_seconds)),
        ("2P+1D", Scenario("2P+1D", "AlwaysDisaggregate", 2, 1), SLO),
    ]
    rows = []
    for name, scenario, slo in cases:
        found: Goodput = goodput(scenario, PROFILE, replay, slo, bisections=5)
        gpus = 1 if name in ("prefill-only", "decode-only") else found.gpus  # the phase's own GPU
        rows.append(Row(name, gpus, found.requests_per_second, PUBLISHED[name]))
    return rows


def main() -> int:
    rows = reproduce()
    for row in rows:
        print(row.line())
    by = {row.name: row for row in rows}
    for label, value in (("simulated", "simulated"), ("DistServe", "published")):
        colocated = getattr(by["colocated"], value)
        pd = getattr(by["2P+1D"], value) / by["2P+1D"].gpus
        prefill, decode = getattr(by["prefill-only"], value), getattr(by["decode-only"], value)
        print(
            f"{label}: 2P+1D per GPU / colocated {pd / colocated:.2f}x; colocated / prefill-only "
            f"{colocated / prefill:.2f}, colocated / decode-only {colocated / decode:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
