"""The simulator's interference check against DistServe's Figure 1 (`sim/published.py`) runs and keeps the
published result's direction: each phase alone serves more than a colocated engine, and two prefill GPUs with
one decode GPU serve more per GPU than the colocated engine."""

from __future__ import annotations

import pytest

from inferencepool.sim.published import poisson_trace, reproduce

pytestmark = [pytest.mark.sim]


def test_disaggregation_beats_the_colocated_engine_per_gpu_on_distserves_setup() -> None:
    rows = {row.name: row for row in reproduce(poisson_trace(requests=120))}
    colocated = rows["colocated"].simulated
    assert colocated > 0
    assert rows["prefill-only"].simulated > colocated
    assert rows["decode-only"].simulated > colocated
    assert rows["2P+1D"].simulated / rows["2P+1D"].gpus > colocated
