"""`inferencepool demo --engine vllm` end to end on the session's control plane, with real vLLM engines
on this CPU (the pod runner's engine mode): the long prompt's hand-off shows in the decode engine's own NIXL
counters, the planner reads the real engines' latency, and `inferencepool diagnose` runs on their traffic."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from inferencepool.cluster.components import Layout
from inferencepool.demo import real

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

ROOT = Path(__file__).resolve().parents[2]


def test_demo_on_real_engines_hands_the_long_prompt_over_nixl(
    cluster: TestCluster, namespace: str, tmp_path: Path
) -> None:
    pool = yaml.safe_load((ROOT / real.POOL_FILE).read_text())
    pool["metadata"]["namespace"] = namespace
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(yaml.safe_dump(pool))
    engine_file = Layout(cluster.state_dir).engine_file
    mode_before = engine_file.read_text() if engine_file.exists() else None

    command = [sys.executable, "-m", "inferencepool", "demo", "--engine", "vllm"]
    result = subprocess.run(
        [*command, "--state-dir", str(cluster.state_dir), "--pool-file", str(pool_file)],
        capture_output=True,
        text=True,
        timeout=2400,
        check=False,
        cwd=ROOT,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    lines = output.splitlines()
    short = next(line for line in lines if "short prompt" in line)
    long = next(line for line in lines if "long prompt" in line)
    assert "route=direct" in short and "route=disaggregated" in long, output
    # After the long prompt, the decode engine's own counters: a NIXL read, and prompt tokens not computed.
    after_long = lines[lines.index(long) + 1 :]
    decode = next(line for line in after_long if line.strip().startswith("decode demo-decode-"))
    reads = re.search(r"NIXL reads \+(\d+)", decode)
    external = re.search(r"prompt tokens from an external KV transfer \+(\d+)", decode)
    assert reads and int(reads.group(1)) >= 1, decode
    assert external and int(external.group(1)) > pool["spec"]["router"]["prefillThresholdTokens"], decode
    prefill = next(line for line in after_long if line.strip().startswith("prefill demo-prefill-"))
    assert "prompt tokens computed locally +" in prefill, prefill
    # The planner read each pool's latency from the real engines' histograms; the operator and diagnose ran.
    readings = [line for line in lines if "autoscaler:" in line]
    assert any("prefill p90 TTFT" in line and "vs target 2000 ms" in line for line in readings), output
    assert any("decode p90 ITL" in line and "vs target 200 ms" in line for line in readings), output
    assert any(line.startswith("    operator: bottleneck ") for line in lines), output
    assert f"pool {namespace}/demo: bottleneck " in output, output
    # The demo removed its pool and put the runner's mode back as it found it.
    assert cluster.kubectl("get", "pdpool", "-n", namespace, "-o", "name").stdout.strip() == ""
    assert (engine_file.read_text() if engine_file.exists() else None) == mode_before
