"""P/D through the router over real NIXL: the router's length threshold in the model's own tokens, the
decode engine's own evidence that it read the prompt's KV from the prefill engine, output identical to the
colocated answer at temperature 0, and the prefill engine's lease freeing KV no decode engine read."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from inferencepool.builders.kvtransfer import KV_LEASE_SECONDS
from tests.real.engines.client import Answer, call, metric_value, router
from tests.support.real_engines import Fleet, RealEngine

ROUTE = "X-Inferencepool-Route"
_unique = itertools.count()


async def token_count(engine: RealEngine, model: str, prompt: str) -> int:
    answer = await call(engine.url, "/tokenize", {"model": model, "prompt": prompt})
    assert answer.status == 200, answer.body
    return int(answer.body["count"])


async def prompt_of(fleet: Fleet, tokens: int) -> str:
    """A completion prompt of exactly `tokens` tokens as the engine counts them (BOS included), starting
    with a word no other prompt of the run starts with (so no prefix is cached anywhere)."""
    engine, model = next(e for e in fleet.decodes if e.alive()), fleet.served_name
    head = f"Case{next(_unique)}x{time.monotonic_ns()} says"
    base = await token_count(engine, model, head)
    unit = await token_count(engine, model, head + " the") - base
    assert unit == 1, "' the' is one token of the tiny model's vocabulary"
    prompt = head + " the" * (tokens - base)
    assert await token_count(engine, model, prompt) == tokens
    return prompt


async def decode_evidence(fleet: Fleet) -> list[tuple[float, float]]:
    """Each decode engine's (NIXL reads, prompt tokens loaded from an external KV transfer)."""
    found = []
    for engine in fleet.decodes:
        reads = await metric_value(engine, "vllm:nixl_xfer_time_seconds_count")
        tokens = await metric_value(
            engine, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
        )
        found.append((reads, tokens))
    return found


async def test_threshold_is_the_models_own_token_count(fleet: Fleet) -> None:
    threshold = fleet.pool.spec.router.prefill_threshold_tokens
    model = fleet.served_name
    async with router(fleet) as running:
        for tokens, route in ((threshold - 1, "direct"), (threshold, "disaggregated")):
            prompt = await prompt_of(fleet, tokens)
            answer = await call(
                running.url, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 4}
            )
            assert answer.status == 200, answer.body
            assert answer.body["usage"]["prompt_tokens"] == tokens
            assert answer.headers[ROUTE] == route, tokens


def reference_body(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "temperature": 0}


@pytest.mark.parametrize(
    ("path", "stream"),
    [("/v1/completions", False), ("/v1/completions", True), ("/v1/chat/completions", False)],
    ids=["completion", "completion-stream", "chat"],
)
async def test_disaggregated_answer_is_the_colocated_one(fleet: Fleet, path: str, stream: bool) -> None:
    model = fleet.served_name
    prompt = await prompt_of(fleet, 1500)
    if path.endswith("chat/completions"):
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    else:
        body = {"model": model, "prompt": prompt}
    body |= {"max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    before = await decode_evidence(fleet)
    async with router(fleet) as running:
        routed: Answer = await call(running.url, path, body)
    assert routed.status == 200, routed.body
    assert routed.headers[ROUTE] == "disaggregated"
    after = await decode_evidence(fleet)
    deltas = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before, strict=True)]
    (reader,) = [i for i, (reads, _) in enumerate(deltas) if reads > 0]
    assert deltas[reader][0] == 1
    # The whole prompt came over NIXL but its last block, which the decode engine computes itself (vLLM
    # reads only whole blocks; 128 tokens on a CPU).
    assert deltas[reader][1] >= 1500 - 128
    # Colocated, on the other decode engine (the reader now holds the prompt in its prefix cache): it computes
    # the whole prompt itself (no kv_transfer_params).
    colocated = await call(fleet.decodes[1 - reader].url, path, body)
    assert colocated.status == 200, colocated.body
    assert routed.text == colocated.text and len(routed.text) > 0


async def test_lease_frees_kv_no_decode_engine_read(fleet: Fleet) -> None:
    """A prefill leg whose decode leg never comes: after kv_lease_duration the prefill engine releases the
    blocks it held for it (its own counter and log say so) and its KV cache is empty again."""
    prefill, model = fleet.prefill, fleet.served_name
    request_id = f"unpulled-{time.monotonic_ns()}"
    prompt = await prompt_of(fleet, 1000)
    answer = await call(
        prefill.url,
        "/v1/completions",
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
        },
        headers={"X-Request-Id": request_id},
    )
    assert answer.status == 200, answer.body
    held = answer.body["kv_transfer_params"]
    assert held["remote_block_ids"], held
    assert await metric_value(prefill, "vllm:kv_cache_usage_perc") > 0
    # vLLM's own words when it frees them, naming the request (remote_request_id: cmpl-<X-Request-Id>-...).
    released = (
        f"Releasing expired KV blocks for request {held['remote_request_id']} which were retrieved by 0"
    )
    assert request_id in held["remote_request_id"]
    deadline = time.monotonic() + KV_LEASE_SECONDS + 120
    while released not in prefill.log_text():
        assert time.monotonic() < deadline, "the lease did not expire"
        await asyncio.sleep(2)
    assert await metric_value(prefill, "vllm:nixl_num_kv_expired_reqs_total") >= 1
    # Nothing else is held on the prefill engine by then (every other test's legs were read), so its KV
    # cache is empty again.
    while await metric_value(prefill, "vllm:kv_cache_usage_perc") > 0:
        assert time.monotonic() < deadline, "the prefill engine still holds KV"
        await asyncio.sleep(2)
