"""Every vLLM metric family the product reads (autoscaler, diagnosis, dashboards, alerts, the router's engine
load, the real demo) exists on the real engines with the type its readers assume and the engine's own labels
(model_name, engine) the autoscaler's histograms are keyed by. The names are taken from the readers' source,
so a new read of a family vLLM lacks fails here."""

from __future__ import annotations

import re
from pathlib import Path

from tests.real.engines.client import call, metric_families
from tests.support.real_engines import Fleet

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "inferencepool"
READERS = [
    "autoscaler",
    "bottleneck",
    "observability/dashboard.py",
    "observability/alerts.py",
    "router/engine_load.py",
    "demo/real.py",
    "builders/engine.py",  # the preStop drain script
]
NAME = re.compile(r"vllm:[a-z0-9_]+")
SUFFIXES = {"_bucket": "histogram", "_sum": "histogram", "_count": "histogram", "_total": "counter"}


def names_read() -> set[str]:
    found: set[str] = set()
    for reader in READERS:
        path = PACKAGE / reader
        for source in [path] if path.is_file() else sorted(path.rglob("*.py")):
            found |= set(NAME.findall(source.read_text()))
    return found


def test_the_scan_finds_the_planners_reads() -> None:
    names = names_read()
    assert {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"} <= names
    assert "vllm:num_requests_running" in names


async def test_every_family_the_product_reads_is_on_the_real_engines(fleet: Fleet) -> None:
    for engine in fleet.engines:  # every family has samples once an engine has served something
        answer = await call(
            engine.url, "/v1/completions", {"model": fleet.served_name, "prompt": "hi", "max_tokens": 2}
        )
        assert answer.status == 200
    by_role = {
        "prefill": await metric_families(fleet.prefill),
        "decode": await metric_families(fleet.decodes[0]),
    }
    missing = []
    for name in sorted(names_read()):
        if name.endswith("_"):  # a prefix the reader completes (vllm:external_prefix_cache_...)
            if not any(f.startswith(name) for families in by_role.values() for f in families):
                missing.append(name)
            continue
        family, kind = name, None
        for suffix, suffix_kind in SUFFIXES.items():
            if name.endswith(suffix) and name.removesuffix(suffix) in by_role["decode"]:
                family, kind = name.removesuffix(suffix), suffix_kind
        for role, families in by_role.items():
            if family not in families:
                missing.append(f"{name} ({role})")
                continue
            metric = families[family]
            if kind is not None:
                assert metric.type == kind, f"{name}: vLLM's {family} is a {metric.type}"
            labels = {k for sample in metric.samples for k in sample.labels}
            assert {"model_name", "engine"} <= labels, f"{family} on {role}: labels {labels}"
    assert not missing, f"read by the product, absent on the real engine: {missing}"
