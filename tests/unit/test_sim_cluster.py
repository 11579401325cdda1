"""The simulated pool in virtual time: conservation, hand-checked timings and goodput, routing shares,
autoscaling with a provisioning delay, and the scenario comparison's structure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferencepool.autoscaler.planner import FORECAST_UP, LATENCY_GUARD, PlannerSettings, RoleBounds
from inferencepool.cli import main
from inferencepool.perf import timing
from inferencepool.perf.profiles import get_profile
from inferencepool.sim.cluster import PlannerScaling, Scenario, ScenarioResult, simulate
from inferencepool.sim.compare import SCENARIO_NAMES, SEARCHED, Budget, build_scenarios, compare
from inferencepool.sim.report import Slo, summarize, table, to_json
from inferencepool.sim.workload import TraceRequest

H100 = get_profile("llama-3.1-8b-h100")
EXAMPLE = Path(__file__).parents[2] / "examples" / "llama-3.1-8b.yaml"


def assert_conserved(result: ScenarioResult) -> None:
    for record in result.records:
        assert record.finishes == 1, f"request {record.index} finished {record.finishes} times"
        assert record.completed, f"request {record.index}: {record.error}"
        assert record.tokens_received == record.output_tokens
        assert record.first_token is not None and record.finish is not None
        assert record.arrival < record.first_token <= record.finish


def mixed_trace(count: int, spacing: float) -> list[TraceRequest]:
    prompts = (300, 1500, 5000, 9000, 700, 4096)
    return [TraceRequest(i * spacing, prompts[i % len(prompts)], 20 + (i * 7) % 60) for i in range(count)]


@pytest.mark.parametrize("name", ["colocated", "colocated-tuned", "static-pd"])
def test_every_request_finishes_exactly_once(name: str) -> None:
    [scenario] = build_scenarios(Budget(replicas=3, prefill_replicas=1), Slo(0.8, 0.04), [name])
    result = simulate(scenario, H100, mixed_trace(120, 0.05))
    assert_conserved(result)
    assert result.gpu_seconds == pytest.approx(3 * result.makespan)


def test_hand_checked_timings_and_goodput() -> None:
    """Requests far apart on idle engines: every figure follows from the timing formulas alone."""
    trace = [TraceRequest(0.0, 1000, 5), TraceRequest(10.0, 6000, 5), TraceRequest(20.0, 3000, 1)]
    result = simulate(Scenario("one", "Colocated", 0, 1), H100, trace)
    assert_conserved(result)

    def prefill(tokens: int) -> float:
        return timing.step_time(H100, [timing.PrefillChunk(tokens, 0)], ())

    def mean_itl(prompt: int, output: int) -> float:
        return sum(timing.step_time(H100, (), [prompt + j]) for j in range(output - 1)) / (output - 1)

    a, b, c = result.records
    assert a.ttft == pytest.approx(prefill(1000)) and b.ttft == pytest.approx(prefill(6000))
    assert c.ttft == pytest.approx(prefill(3000))
    assert a.mean_itl == pytest.approx(mean_itl(1000, 5)) and c.mean_itl == 0.0
    # TTFT SLO admits A and C (not B); an ITL SLO just under A's mean ITL drops A, not C (one token)
    tight = summarize(result, Slo(prefill(3000) * 1.000001, mean_itl(1000, 5) * 0.999))
    assert (tight.good, tight.goodput_rps, tight.slo_attainment_percent) == (
        1,
        1 / 20,
        pytest.approx(100 / 3),
    )
    loose = summarize(result, Slo(prefill(3000) * 1.000001, mean_itl(1000, 5) * 1.000001))
    assert (loose.good, loose.goodput_rps) == (2, 2 / 20)
    assert loose.ttft_ms["p50"] == pytest.approx(prefill(3000) * 1000)  # nearest rank: the middle one
    assert loose.gpu_seconds == pytest.approx(result.makespan) and loose.disaggregated_percent == 0


def test_disaggregated_ttft_is_prefill_then_kv_transfer_then_one_token() -> None:
    result = simulate(Scenario("pd", "AlwaysDisaggregate", 1, 1), H100, [TraceRequest(0.0, 4000, 3)])
    assert_conserved(result)
    [record] = result.records
    expected = (
        timing.step_time(H100, [timing.PrefillChunk(4000, 0)], ())  # the prefill leg on the prefill engine
        + timing.nixl_transfer_time(H100, 4000)  # the decode engine reads every prompt token's KV
        + timing.step_time(H100, [timing.PrefillChunk(1, 3999)], ())  # and recomputes the last one
    )
    assert record.route == "disaggregated"
    assert record.ttft == pytest.approx(expected)
    assert (record.prefill_pod, record.decode_pod) == ("prefill-0", "decode-0")


def test_routing_share_follows_the_threshold() -> None:
    """Prompts of the threshold and over go through the prefill pool, shorter ones direct, except where the
    router's load-aware bypass says why not (the reason names it)."""
    trace = mixed_trace(60, 0.2)  # prompts cycle through 300, 1500, 5000, 9000, 700, 4096
    shares = {}
    for scenario in (
        Scenario("co", "Colocated", 0, 2),
        Scenario("pd", "AlwaysDisaggregate", 1, 1),
        Scenario("la", "LengthAware", 1, 1, threshold_tokens=4096),
        Scenario("la-high", "LengthAware", 1, 1, threshold_tokens=6000),
    ):
        result = simulate(scenario, H100, trace)
        assert_conserved(result)
        for record in result.records:
            if scenario.policy != "LengthAware":
                wanted = "disaggregated" if scenario.policy == "AlwaysDisaggregate" else "direct"
                assert (record.route, record.reason) == (wanted, "policy")
                continue
            long = record.prompt_tokens >= scenario.threshold_tokens
            expected = {
                "long": (True, "disaggregated"),
                "prefill_busy": (True, "direct"),
                "short": (False, "direct"),
                "decode_busy": (False, "disaggregated"),
                "prefill_idle": (False, "disaggregated"),
            }[record.reason]
            assert (long, record.route) == expected, record
        shares[scenario.name] = summarize(result, Slo(1, 1)).disaggregated_percent
    assert shares["co"] == 0 and shares["pd"] == 100
    assert shares["la"] >= 50 > shares["la-high"] >= 100 / 6


def burst_then_quiet() -> list[TraceRequest]:
    burst = [
        TraceRequest(i * 0.1, 2000 + i, 600) for i in range(300)
    ]  # decode-heavy, all under the threshold
    trickle = [TraceRequest(40.0 + i * 10, 500, 20) for i in range(20)]
    return burst + trickle


def test_decode_pool_scales_up_under_a_burst_and_down_after_with_the_load_delay() -> None:
    scaling = PlannerScaling(
        PlannerSettings(
            ttft_target_seconds=0.8,
            itl_target_seconds=0.02,
            prefill=RoleBounds(1, 4),
            decode=RoleBounds(1, 4),
            model_load_seconds=20.0,
            interval_seconds=5,
            scale_down_delay_seconds=30,
            warmup_seconds=30,
        ),
        window_seconds=10,
    )
    scenario = Scenario("auto", "LengthAware", 1, 1, planner=scaling)
    result = simulate(scenario, H100, burst_then_quiet())
    assert_conserved(result)

    decode_events = [e for e in result.scaling if e.role == "decode"]
    ups = [e for e in decode_events if e.replicas > e.from_replicas]
    downs = [e for e in decode_events if e.replicas < e.from_replicas]
    assert ups and ups[0].reason in (FORECAST_UP, LATENCY_GUARD) and ups[0].from_replicas == 1
    assert downs and downs[-1].replicas == 1 and downs[0].time > ups[-1].time
    first_up = ups[0].time
    # desired rises at the decision; ready only after the model load delay, never before
    desired_at_decision = [row for row in result.replicas if row[0] == first_up]
    assert desired_at_decision and desired_at_decision[-1][4] > desired_at_decision[-1][3]
    ready_rise = next(row for row in result.replicas if row[3] > 1)
    assert ready_rise[0] == pytest.approx(first_up + 20.0)
    # no scale-down within the scale-down delay (scaleDownStabilizationSeconds) of a scale-up
    assert downs[0].time - ups[-1].time >= 30
    # the added replicas held GPUs from the decision on: more GPU time than the static pool of 2
    assert result.gpu_seconds > 2 * result.makespan
    assert result.records[-1].decode_pod is not None


def test_comparison_reports_ratios_against_colocated(tmp_path: Path) -> None:
    slo = Slo(0.8, 0.04)
    budget = Budget(
        replicas=3, prefill_replicas=1, model_load_seconds=5, interval_seconds=5, window_seconds=10
    )
    names = [*(n for n in SCENARIO_NAMES if n not in SEARCHED), "planner"]
    scenarios = build_scenarios(budget, slo, names)
    assert [s.name for s in scenarios] == names
    results, summaries = compare(scenarios, H100, mixed_trace(80, 0.1), slo)
    for result in results:
        assert_conserved(result)
    base = summaries[0]
    assert base.scenario == "colocated" and base.goodput_ratio == pytest.approx(1.0)
    for summary in summaries:
        assert summary.requests == 80 and 0 <= summary.good <= summary.completed == 80
        assert summary.goodput_ratio == pytest.approx(summary.goodput_rps / base.goodput_rps)
        assert summary.gpu_seconds_ratio == pytest.approx(summary.gpu_seconds / base.gpu_seconds)
    rendered = table(summaries)
    assert all(name in rendered for name in names) and "vs coloc" in rendered
    document = json.loads(json.dumps(to_json(summaries, results, {"trace": "test"})))
    assert [s["scenario"] for s in document["scenarios"]] == names
    assert document["scenarios"][3]["replicas"][0]["decodeDesired"] == 2


def test_cli_writes_table_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim"
    code = main(
        ["sim", "--max-requests", "60", "--replicas", "2", "--out", str(out), "--model-load-seconds", "5"]
    )
    assert code == 0
    printed = capsys.readouterr()
    assert "colocated-tuned" in printed.out and "static-peak" in printed.out and "1.00x" in printed.out
    assert "virtual s" in printed.err  # progress
    document = json.loads((out / "sim.json").read_text())
    assert len(document["scenarios"]) == 4 and document["settings"]["trace"] == "azure-code"
    assert "static-pd 1P:1D" in printed.out  # always-disaggregate at its best split (here the only one)
    assert {p.name for p in out.glob("*.png")} == {"latency_cdf.png", "goodput.png"}


def test_cli_runs_a_pool_spec_as_the_deployed_scenario_beside_the_baselines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim"
    args = ["sim", "--trace", "azure-conv", "--max-requests", "80", "--out", str(out), "--pool", str(EXAMPLE)]
    assert main([*args, "--replicas", "3", "--model-load-seconds", "5"]) == 0
    printed = capsys.readouterr()
    document = json.loads((out / "sim.json").read_text())
    names = [s["scenario"] for s in document["scenarios"]]
    assert names[1:4] == ["deployed", "colocated", "colocated-tuned"] and names[0].startswith("static-peak")
    assert names[4].startswith("static-pd ") and "deployed" in printed.out
    assert "replicas.png" in {p.name for p in out.glob("*.png")}  # the spec's planner sizes the pools
    assert main([*args[:-2], "--scenarios", "deployed"]) == 2
    assert "give it with --pool" in capsys.readouterr().err


def test_cli_rejects_bad_input_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0,x,1\n")
    assert main(["sim", "--trace", str(bad), "--out", str(tmp_path)]) == 2
    assert "bad.csv, line 2: field 'ContextTokens' must be an integer" in capsys.readouterr().err
    assert main(["sim", "--prefill", "4", "--replicas", "4", "--out", str(tmp_path)]) == 2
    assert "prefill replicas must be within 1..3" in capsys.readouterr().err


def test_an_azure_trace_over_4095_requests_runs() -> None:
    """Every prompt's ids fit the router's 4-byte affinity packing (it overflowed at request 4,096)."""
    trace = [TraceRequest(i * 0.002, 300, 1) for i in range(5000)]
    result = simulate(Scenario("co", "Colocated", 0, 2), H100, trace)
    assert_conserved(result)


def test_gpu_time_is_charged_to_the_last_token_not_to_a_later_tick() -> None:
    trace = [TraceRequest(0.0, 1000, 5), TraceRequest(1.0, 2000, 5)]
    ticks: list[float] = []
    result = simulate(
        Scenario("co", "Colocated", 0, 2),
        H100,
        trace,
        progress=lambda name, reached, span: ticks.append(reached),
        progress_every=500.0,
    )
    assert ticks and ticks[-1] >= 500  # the loop ran on to the tick...
    last_token = max(r.finish or 0.0 for r in result.records)
    assert last_token < 2
    assert result.gpu_seconds == pytest.approx(2 * last_token)  # ...but GPUs are charged to the last token
    assert result.makespan == pytest.approx(last_token)
