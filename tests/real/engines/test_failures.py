"""Real engines dying and draining under P/D traffic (run last: they end the fleet's engines).

1. A decode engine killed mid-stream: the router resumes its streams on the other decode engine; each client
   gets one clean answer that is the unkilled one up to the kill (and, for most streams, after it: the
   continuation re-tokenizes the text so far, see docs/engine-contract.md section 8).
2. A prefill engine killed after its answer, before the decode engine read the KV: the decode engine's NIXL
   read fails (kv_load_failure_policy fail), and the router serves the request colocated, with the colocated
   answer. Restarted on its address (a new NIXL engine id), the decode engine reads from it again.
3. A prefill engine drained (the pod's preStop hook, then SIGTERM with --shutdown-timeout) right after its
   prefill leg answered: the client gets the colocated answer (read from the draining engine, or served
   colocated when that read fails), and the engine exits 0 once its KV is read or its lease expired.
4. A prefill engine of another KV layout (float32 beside the pool's bfloat16, its pod labelled with that
   pool's KV-compatibility hash) beside the pool: the router pairs it with no decode pod of the pool; and
   vLLM itself refuses its KV at the handshake, so a pairing defect would fail requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders.engine import SHUTDOWN_TIMEOUT_SECONDS
from inferencepool.builders.kvcompat import kv_compat_hash
from inferencepool.cluster.vllm_cpu import CpuEngine
from inferencepool.router.pods import PodSpec
from tests.http.router_harness import front, metric_sum, with_addresses
from tests.real.engines.client import TIMEOUT, call, metric_value, operator_router_config, router
from tests.real.engines.test_pd import prompt_of
from tests.support.real_engines import (
    Fleet,
    RealEngine,
    engine_pod,
    make_engines,
    tier_pool,
    wait_healthy,
)

STREAMS = 6
MAX_TOKENS = 160
KILL_AFTER_EVENTS = 4


async def read_stream(
    base: str,
    body: dict[str, Any],
    progressed: asyncio.Event,
    counts: list[int],
    i: int,
    killed: asyncio.Event,
) -> tuple[str, bool, list[str], str]:
    """(text, ended with [DONE], errors, the text received before `killed` was set) of one streamed
    completion; counts[i] events so far."""
    text: list[str] = []
    done, errors, before_kill = False, [], None
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.post(base + "/v1/completions", json=body) as response,
    ):
        assert response.status == 200, await response.text()
        buffer = b""
        async for chunk in response.content.iter_any():
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                data = event.removeprefix(b"data:").strip()
                if not data:
                    continue
                if data == b"[DONE]":
                    done = True
                    continue
                parsed = json.loads(data)
                if "error" in parsed:
                    errors.append(str(parsed["error"]))
                    continue
                if killed.is_set() and before_kill is None:
                    before_kill = "".join(text)
                for choice in parsed.get("choices", []):
                    if choice.get("text"):
                        text.append(choice["text"])
                        counts[i] += 1
                if min(counts) >= KILL_AFTER_EVENTS:
                    progressed.set()
    whole = "".join(text)
    return whole, done, errors, whole if before_kill is None else before_kill


async def running_requests(engine: RealEngine) -> float:
    return await metric_value(engine, "vllm:num_requests_running")


async def test_decode_engine_killed_mid_stream_is_resumed_with_the_unkilled_answer(fleet: Fleet) -> None:
    bodies = []
    for _ in range(STREAMS):
        prompt = await prompt_of(fleet, 600)  # over the threshold: prefill -> NIXL -> decode
        bodies.append(
            {
                "model": fleet.served_name,
                "prompt": prompt,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
        )
    async with router(fleet) as running:
        progressed, killed = asyncio.Event(), asyncio.Event()
        counts = [0] * STREAMS
        streams = [
            asyncio.create_task(read_stream(running.url, body, progressed, counts, i, killed))
            for i, body in enumerate(bodies)
        ]
        await asyncio.wait_for(progressed.wait(), 300)
        # The decode engine serving the most of them dies (the whole pod: API server, engine core, worker).
        busy = [await running_requests(engine) for engine in fleet.decodes]
        doomed = fleet.decodes[busy.index(max(busy))]
        survivor = fleet.decodes[1 - fleet.decodes.index(doomed)]
        assert max(busy) >= 1
        doomed.signal(signal.SIGKILL)
        killed.set()
        answers = await asyncio.gather(*streams)
        resumed = await metric_sum(running.url, "inferencepool_router_streams_resumed", outcome="resumed")
        broken = await metric_sum(running.url, "inferencepool_router_streams_resumed", outcome="broken")
    assert doomed.wait_exit(60) is not None
    # What an unkilled engine answers: the survivor, colocated, whole.
    expected = []
    for body in bodies:
        whole = await call(survivor.url, "/v1/completions", {**body, "stream": False})
        assert whole.status == 200, whole.body
        expected.append(whole.text)
    report = [
        "whole" if (text == want and done and not errors) else "broken" if errors or not done else "other"
        for (text, done, errors, _), want in zip(answers, expected, strict=True)
    ]
    print(f"\n[resume on real engines] {report}; router: resumed {resumed:g}, broken {broken:g}")
    assert resumed >= 1 and broken == 0
    for (text, done, errors, before_kill), want in zip(answers, expected, strict=True):
        # Every client got one clean answer whose text up to the kill is the unkilled answer's (a stream on
        # the other engine may have finished before the kill: then all of it).
        assert done and not errors
        assert want.startswith(before_kill) and text.startswith(before_kill)
    # Token-exact continuation is not guaranteed (docs/engine-contract.md, section 8): the continuation
    # re-tokenizes the text so far, which BPE may split differently from the tokens the engine generated.
    assert report.count("whole") >= 1


@contextlib.contextmanager
def extra_prefill(fleet: Fleet, pool: InferencePool, ordinal: int) -> Iterator[RealEngine]:
    """Prefill pod `ordinal` of `pool` beside the fleet (on cores no live engine of it uses), started, and
    stopped when the block ends."""
    engine = CpuEngine(venv=fleet.prefill.plan.env["VIRTUAL_ENV"], model=str(fleet.model))
    alive = [core for e in fleet.engines if e.alive() for core in e.cores]
    (extra,) = make_engines(pool, [("prefill", ordinal)], engine, fleet.root, alive)
    extra.start()
    try:
        yield extra
    finally:
        extra.stop()


@pytest.fixture(scope="module")
def spare_prefill(fleet: Fleet) -> Iterator[RealEngine]:
    """A second prefill pod (ordinal 1), started when the first test that needs it asks (the fleet's first
    decode engine is dead by then, so three engines run at most), for the drain test."""
    with extra_prefill(fleet, fleet.pool, 1) as spare:
        yield spare


async def test_prefill_engine_killed_before_the_read_is_served_colocated(
    fleet: Fleet, spare_prefill: RealEngine
) -> None:
    decode = next(engine for engine in fleet.decodes if engine.alive())
    prefill = fleet.prefill
    prompt = await prompt_of(fleet, 1500)
    body = {
        "model": fleet.served_name,
        "prompt": prompt,
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
    }

    async def kill() -> None:
        prefill.signal(signal.SIGKILL)
        assert await asyncio.to_thread(prefill.wait_exit, 60) is not None

    failed_before = await metric_value(decode, "vllm:request_success_total", finished_reason="error")
    async with front(prefill.url, kill, TIMEOUT) as address:
        config = operator_router_config(fleet, policy="AlwaysDisaggregate")
        config = with_addresses(config, prefill=[address], decode=[decode.url])
        async with router(fleet, config) as running:
            routed = await call(running.url, "/v1/completions", body)
            fallbacks = await metric_sum(
                running.url, "inferencepool_router_fallbacks", reason="decode_leg_failed"
            )
    assert routed.status == 200, routed.body
    assert routed.headers["X-Inferencepool-Route"] == "fallback"
    assert fallbacks == 1
    # The decode engine's NIXL read of the dead engine's blocks failed; it did not recompute silently.
    assert (
        await metric_value(decode, "vllm:request_success_total", finished_reason="error") == failed_before + 1
    )
    colocated = await call(decode.url, "/v1/completions", body)
    assert routed.text == colocated.text and len(routed.text) > 0


async def test_a_restarted_prefill_engine_is_a_new_peer_the_decode_engine_reads_from(fleet: Fleet) -> None:
    """The prefill pod killed above restarts: same address, a new engine (the operator pins no NIXL
    engine_id, so vLLM draws a new one). The decode engine, which read from the previous engine before,
    sees the new engine id at the same address, hands its old peer state over, and reads the KV from the new
    engine: the answer is the colocated one and no read fails (vLLM #49238's stale peer does not happen)."""
    prefill = fleet.prefill
    decode = next(engine for engine in fleet.decodes if engine.alive())
    assert not prefill.alive()
    prefill.start()
    await asyncio.to_thread(wait_healthy, [prefill])
    body = {
        "model": fleet.served_name,
        "prompt": await prompt_of(fleet, 1500),
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
    }
    reads = await metric_value(decode, "vllm:nixl_xfer_time_seconds_count")
    failed = await metric_value(decode, "vllm:request_success_total", finished_reason="error")
    leg, decoded = await hand_off(prefill, decode, body)
    assert decoded.status == 200, decoded.body
    assert await metric_value(decode, "vllm:nixl_xfer_time_seconds_count") > reads  # read over NIXL
    assert await metric_value(decode, "vllm:request_success_total", finished_reason="error") == failed
    # vLLM's own account of the replacement (nixl/base_worker.py:_track_remote_engine_replacement)
    new_engine = leg.body["kv_transfer_params"]["remote_engine_id"]
    changed = [
        line for line in decode.log_text().splitlines() if "changed from" in line and new_engine in line
    ]
    assert changed, decode.log_tail()
    colocated = await call(decode.url, "/v1/completions", body)
    assert decoded.text == colocated.text and len(colocated.text) > 0


def run_prestop(engine: RealEngine, fleet: Fleet) -> float:
    """The pod's preStop hook as Kubernetes runs it in the engine container; the pod's localhost is its own
    loopback address here. Returns its duration."""
    pod = engine_pod(fleet.pool, engine.role, int(engine.name.rsplit("-", 1)[1]), engine.ip)
    (container,) = pod["spec"]["containers"]
    command = list(container["lifecycle"]["preStop"]["exec"]["command"])
    assert command[:2] == ["python3", "-c"]
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", command[2].replace("127.0.0.1", engine.ip)], check=True, timeout=600
    )
    return time.monotonic() - started


async def hand_off(prefill: RealEngine, decode: RealEngine, body: dict[str, Any]) -> tuple[Any, Any]:
    """The two legs as the router sends them: (the prefill leg's answer, the decode leg's)."""
    leg = await call(
        prefill.url,
        "/v1/completions",
        {
            **body,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
        },
    )
    assert leg.status == 200, leg.body
    decoded = await call(
        decode.url, "/v1/completions", {**body, "kv_transfer_params": leg.body["kv_transfer_params"]}
    )
    return leg, decoded


async def test_prefill_drained_with_a_hand_off_in_flight_serves_the_request_then_exits(
    fleet: Fleet, spare_prefill: RealEngine
) -> None:
    """The pod is deleted right after its prefill leg answered: preStop (no running or waiting request: it
    returns), then SIGTERM to the container's main process, vLLM's drain holding the KV for the decode
    engine. The client gets the colocated answer either way: read over NIXL from the draining engine, or, when
    that read fails, served colocated by the router (vLLM 0.32 on CPUs does both, see the contract); and the
    engine exits 0 once the KV is read or its lease expired, not before."""
    prefill, decode = spare_prefill, next(engine for engine in fleet.decodes if engine.alive())
    await asyncio.to_thread(wait_healthy, [prefill])
    model = fleet.served_name
    # The pods have worked together before (the decode engine holds the prefill engine's NIXL metadata), as
    # in a pool that has run for a while.
    _, first = await hand_off(
        prefill, decode, {"model": model, "prompt": await prompt_of(fleet, 600), "max_tokens": 2}
    )
    assert first.status == 200, first.body
    body = {"model": model, "prompt": await prompt_of(fleet, 1500), "max_tokens": 24, "temperature": 0}
    body["ignore_eos"] = True

    async def drain() -> None:
        await asyncio.to_thread(run_prestop, prefill, fleet)
        assert prefill.process is not None
        prefill.process.send_signal(signal.SIGTERM)

    async with front(prefill.url, drain, TIMEOUT) as address:
        config = operator_router_config(fleet, policy="AlwaysDisaggregate")
        config = with_addresses(config, prefill=[address], decode=[decode.url])
        async with router(fleet, config) as running:
            routed = await call(running.url, "/v1/completions", body)
    assert routed.status == 200, routed.body
    route = routed.headers["X-Inferencepool-Route"]
    assert route in ("disaggregated", "fallback")
    code = await asyncio.to_thread(prefill.wait_exit, SHUTDOWN_TIMEOUT_SECONDS + 60)
    assert code == 0, prefill.log_tail()
    log = prefill.log_text()
    assert "mode=drain" in log
    if route == "disaggregated":
        assert "Releasing expired KV blocks" not in log
    else:  # the read failed; the engine held the KV to the end of its lease, then left
        assert "Releasing expired KV blocks" in log
    print(f"\n[drain with a hand-off in flight] route {route}")
    colocated = await call(decode.url, "/v1/completions", body)
    assert routed.text == colocated.text and len(routed.text) > 0


def float32_pool() -> InferencePool:
    """The tier's pool but for `--dtype float32` (the model is bfloat16): another KV-compatibility hash."""
    return tier_pool(engine__extraArgs=["--dtype", "float32"])


@pytest.fixture(scope="module")
def float32_prefill(fleet: Fleet) -> Iterator[RealEngine]:
    """A prefill pod of `float32_pool`, as a pod of a rollout's other revision would be. Started after the
    drain test, so three engines run at most."""
    assert kv_compat_hash(float32_pool()) != kv_compat_hash(fleet.pool)
    with extra_prefill(fleet, float32_pool(), 2) as other:
        wait_healthy([other])
        yield other


async def test_a_prefill_engine_of_another_kv_layout_is_never_paired_and_vllm_refuses_its_kv(
    fleet: Fleet, float32_prefill: RealEngine
) -> None:
    prefill, other = fleet.prefill, float32_prefill
    decode = next(engine for engine in fleet.decodes if engine.alive())
    assert prefill.alive(), "the restarted prefill engine of the test above"
    body = {"model": fleet.served_name, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    ours, theirs = kv_compat_hash(fleet.pool), kv_compat_hash(float32_pool())
    # The router, as the Pod watch would feed it: a prefill pod of each hash, the pool's decode pod.
    config = operator_router_config(fleet, policy="AlwaysDisaggregate")
    async with router(fleet, config) as running:
        running.router.pods.apply(
            [
                PodSpec("prefill-0", prefill.url, "prefill", kv_compat=ours),
                PodSpec("prefill-2", other.url, "prefill", kv_compat=theirs),
                PodSpec("decode-1", decode.url, "decode", kv_compat=ours),
            ]
        )
        served_before = await metric_value(other, "vllm:request_success_total", finished_reason="length")
        for k in range(4):
            routed = await call(
                running.url, "/v1/completions", {**body, "prompt": await prompt_of(fleet, 600 + k)}
            )
            assert routed.status == 200, routed.body
            assert routed.headers["X-Inferencepool-Route"] == "disaggregated"
    assert await metric_value(other, "vllm:request_success_total", finished_reason="length") == served_before
    # The pairing the router refuses, made by hand: the float32 engine prefills, the decode engine's NIXL
    # handshake with it fails on vLLM's own check (nixl/metadata.py compute_nixl_compatibility_hash: dtype).
    leg, decoded = await hand_off(other, decode, {**body, "prompt": await prompt_of(fleet, 900)})
    assert leg.status == 200, leg.body
    assert decoded.status != 200 or not decoded.text, decoded.body
    assert "NIXL compatibility hash mismatch" in decode.log_text(), decode.log_tail()
    # The refused peer leaves the decode engine serving: the pool's own prefill engine still hands off.
    _, after = await hand_off(prefill, decode, {**body, "prompt": await prompt_of(fleet, 700)})
    assert after.status == 200 and after.text, after.body
