"""`inferencepool demo` end to end on the session's control plane: the README's first command, as a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from tests.support.cluster import TestCluster

ROOT = Path(__file__).resolve().parents[2]


def test_demo_routes_short_prompts_direct_and_long_ones_through_prefill(
    cluster: TestCluster, namespace: str, tmp_path: Path
) -> None:
    pool = yaml.safe_load((ROOT / "examples" / "demo-cpu.yaml").read_text())
    pool["metadata"]["namespace"] = namespace
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(yaml.safe_dump(pool))

    demo = [sys.executable, "-m", "inferencepool", "demo", "--state-dir", str(cluster.state_dir)]
    result = subprocess.run(
        [*demo, "--pool-file", str(pool_file), "--timeout", "180"],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        cwd=ROOT,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    short = next(line for line in output.splitlines() if "short prompt" in line)
    long = next(line for line in output.splitlines() if "long prompt" in line)
    assert "route=direct" in short, output
    assert "route=disaggregated" in long, output
    # The autoscaler read each pool's latency from the engines' own histograms.
    readings = [line for line in output.splitlines() if "autoscaler:" in line]
    assert any("prefill p90 TTFT" in line and "vs target 800 ms" in line for line in readings), output
    assert any("decode p90 ITL" in line and "vs target 40 ms" in line for line in readings), output
    # Half the demo's load is long prompts: the router's split, read from its metrics, lands in status.
    split = next(line for line in output.splitlines() if "went through the prefill pool" in line)
    assert 20 <= int(split.split("router: ")[1].split("%")[0]) <= 80, split
    # The operator diagnosed the bottleneck of that traffic, and the demo ends with `inferencepool diagnose`.
    assert any(line.startswith("    operator: bottleneck ") for line in output.splitlines()), output
    report = output[output.index(f"pool {namespace}/demo: bottleneck ") :]
    assert "what-if: this window's traffic replayed in the simulator" in report, output
    # The demo leaves a running cluster up, but removes its pool and stops its operator.
    assert cluster.kubectl("get", "pdpool", "-n", namespace, "-o", "name").stdout.strip() == ""
    assert cluster.kubectl("get", "--raw", "/readyz").returncode == 0
