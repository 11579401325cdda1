"""The fake engine held to the real one: one request set (good and bad, whole and streamed, both P/D legs)
sent to a fake engine (engine_sim, the tiny model's tokenizer) and to a real vLLM engine, and their answers
compared: status codes, JSON shapes (keys and value types, not values), stream event shapes,
kv_transfer_params keys, and /metrics families, types and label names.

Every difference is either gone (fixed in the fake) or listed in KNOWN with its reason, as
docs/engine-contract.md ("Fake and real engine") does; a new difference fails, and so does a listed one
that is gone (the list stays true).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from inferencepool.engine_sim.tokenizer import HFTokenizer
from inferencepool.perf.profiles import get_profile
from tests.real.engines.client import Answer, call, metric_families, shape, stream_shape
from tests.support.engines import RunningEngine, running_engine
from tests.support.real_engines import Fleet

PD_PROMPT = "The prefill engine computes this prompt and the decode engine reads its KV. " * 30


def requests(model: str) -> dict[str, tuple[str, dict[str, Any]]]:
    chat = [{"role": "user", "content": "Name three prime numbers."}]
    stream_usage = {"stream": True, "stream_options": {"include_usage": True}}
    # Greedy and past EOS, so each answer has its full length (its event kinds do not depend on sampling).
    fixed = {"temperature": 0, "ignore_eos": True}
    return {
        "completion": ("/v1/completions", {"model": model, "prompt": "Once upon a time", "max_tokens": 8}),
        "completion-stream": (
            "/v1/completions",
            {"model": model, "prompt": "Once upon a time", "max_tokens": 8, **fixed, **stream_usage},
        ),
        "chat": ("/v1/chat/completions", {"model": model, "messages": chat, "max_tokens": 8, **fixed}),
        "chat-stream": (
            "/v1/chat/completions",
            {"model": model, "messages": chat, "max_tokens": 8, **fixed, **stream_usage},
        ),
        "n-2": (
            "/v1/completions",
            {"model": model, "prompt": "Once", "max_tokens": 4, "n": 2, "temperature": 1},
        ),
        "unknown-model": ("/v1/completions", {"model": "no-such-model", "prompt": "hi", "max_tokens": 4}),
        "too-long": ("/v1/completions", {"model": model, "prompt": "word " * 9000, "max_tokens": 4}),
        "bad-temperature": (
            "/v1/completions",
            {"model": model, "prompt": "hi", "max_tokens": 4, "temperature": "hot"},
        ),
        "negative-max-tokens": ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": -1}),
        "no-messages": ("/v1/chat/completions", {"model": model, "max_tokens": 4}),
        "prefill-leg": (
            "/v1/completions",
            {
                "model": model,
                "prompt": PD_PROMPT,
                "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
            },
        ),
    }


# Differences kept, with why; docs/engine-contract.md ("The fake and the real engine") lists them for readers.
# A whole request whose answers differ:
KNOWN_REQUESTS: dict[str, str] = {
    "n-2": "the fake generates one choice per request and refuses n > 1 (the router never sends n > 1 to a "
    "prefill leg, and resume does not continue n > 1 streams); vLLM answers n choices",
}
# One place in an answer (request, path):
KNOWN: dict[tuple[str, str], str] = {
    ("prefill-leg", ".body.kv_transfer_params.remote_registration_generation"): "vLLM 0.33 adds it "
    "(nixl/pull_scheduler.py); the real engine here is 0.32, which does not send it",
}


@contextlib.asynccontextmanager
async def fake_pair(fleet: Fleet) -> AsyncIterator[tuple[RunningEngine, RunningEngine]]:
    """A fake prefill and a fake decode engine serving the fleet's model name with its tokenizer."""
    profile = dataclasses.replace(get_profile("zero"), max_model_len=fleet.pool.spec.max_model_len() or 8192)
    tokenizer = HFTokenizer(fleet.model / "tokenizer.json")
    async with (
        running_engine(profile, fleet.served_name, nixl=True, role="prefill", tokenizer=tokenizer) as prefill,
        running_engine(profile, fleet.served_name, nixl=True, role="decode", tokenizer=tokenizer) as decode,
    ):
        yield prefill, decode


def answer_shape(answer: Answer) -> Any:
    if answer.events is not None:
        return {"status": answer.status, "stream": stream_shape(answer.events)}
    return {"status": answer.status, "body": shape(answer.body)}


def differences(fake: Any, real: Any, where: str = "") -> list[str]:
    """Paths where the two shapes differ, with what each side has there."""
    if isinstance(fake, dict) and isinstance(real, dict):
        found = []
        for key in sorted(set(fake) | set(real)):
            path = f"{where}.{key}"
            if key not in real:
                found.append(f"{path}: only the fake")
            elif key not in fake:
                found.append(f"{path}: only vLLM")
            else:
                found += differences(fake[key], real[key], path)
        return found
    return [] if fake == real else [f"{where}: fake {json.dumps(fake)} vs vLLM {json.dumps(real)}"]


async def test_fake_engine_answers_in_vllms_shapes(fleet: Fleet) -> None:
    real = fleet.decodes[0]
    found: dict[tuple[str, str], str] = {}
    async with fake_pair(fleet) as (fake_prefill, fake_decode):
        for name, (path, body) in requests(fleet.served_name).items():
            on_prefill = name.startswith("prefill")
            fake = await call((fake_prefill if on_prefill else fake_decode).url, path, body)
            vllm = await call((fleet.prefill if on_prefill else real).url, path, body)
            pairs = [(name, fake, vllm)]
            if on_prefill:
                # The decode leg, each side with its own prefill leg's kv_transfer_params (it reads the KV, so
                # none is left held on the prefill engine).
                legs = [
                    await call(
                        engine.url,
                        path,
                        {**body, "max_tokens": 4, "kv_transfer_params": leg.body["kv_transfer_params"]},
                    )
                    for engine, leg in ((fake_decode, fake), (real, vllm))
                ]
                pairs.append(("decode-leg", *legs))
            for pair_name, fake_answer, vllm_answer in pairs:
                for difference in differences(answer_shape(fake_answer), answer_shape(vllm_answer)):
                    found[(pair_name, difference.split(":")[0])] = difference
    whole = {name for name, _ in found if name in KNOWN_REQUESTS}
    assert whole == set(KNOWN_REQUESTS), (
        f"listed requests that now answer alike: {set(KNOWN_REQUESTS) - whole}"
    )
    found = {key: text for key, text in found.items() if key[0] not in KNOWN_REQUESTS}
    unexplained = {key: text for key, text in found.items() if key not in KNOWN}
    gone = sorted(set(KNOWN) - set(found))
    assert not unexplained, "\n".join(f"{name}{text}" for (name, _), text in sorted(unexplained.items()))
    assert not gone, f"listed differences that are gone (remove them here and in the contract): {gone}"


def family_shapes(families: dict[str, Any]) -> dict[str, tuple[str, frozenset[str]]]:
    """vllm:* family -> (type, label names), label names over all its samples but a histogram's `le`."""
    shapes = {}
    for name, family in families.items():
        # (prometheus_client's parser reads a counter's _created samples as a family of their own)
        if name.startswith("vllm:") and not name.endswith("_created"):
            labels = frozenset(k for sample in family.samples for k in sample.labels if k != "le")
            shapes[name] = (family.type, labels)
    return shapes


# Families only the real engine exports: the fake models what the operator, router, autoscaler, diagnosis,
# dashboards and alerts read, not every family vLLM has (docs/engine-contract.md says which and why).
REAL_ONLY = {
    "vllm:cache_config_info",
    "vllm:engine_sleep_state",
    "vllm:estimated_flops_per_gpu",
    "vllm:estimated_read_bytes_per_gpu",
    "vllm:estimated_write_bytes_per_gpu",
    "vllm:mm_cache_hits",
    "vllm:mm_cache_queries",
    "vllm:admission_rejections",
    "vllm:num_requests_waiting_by_reason",
    "vllm:num_requests_kv_fetch_by_stage",
    "vllm:prompt_tokens_by_source",
    "vllm:prompt_tokens_cached_by_source",
    "vllm:prompt_tokens_cached",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_max_num_generation_tokens",
    "vllm:request_num_preemptions",
    "vllm:request_params_max_tokens",
    "vllm:request_params_n",
    "vllm:request_prefill_kv_computed_tokens",
    "vllm:request_prefill_time_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_generation_tokens",
    "vllm:request_prompt_tokens",
    "vllm:iteration_tokens_total",
    "vllm:nixl_post_time_seconds",
    "vllm:nixl_num_descriptors",
    "vllm:nixl_num_failed_notifications",
    "vllm:nixl_num_notifications_after_expiry",
}
# Families both export whose type or labels differ: (family) -> why.
KNOWN_FAMILIES: dict[str, str] = {}


async def test_fake_engine_exports_vllms_metric_families(fleet: Fleet) -> None:
    async with fake_pair(fleet) as (fake_prefill, fake_decode):
        # Both legs once, so every labelled child exists on both sides.
        for base in (fake_prefill.url, fake_decode.url):
            await call(base, "/v1/completions", {"model": fleet.served_name, "prompt": "hi", "max_tokens": 2})
        fake = family_shapes(await metric_families(fake_prefill.url)) | family_shapes(
            await metric_families(fake_decode.url)
        )
    real = family_shapes(await metric_families(fleet.prefill)) | family_shapes(
        await metric_families(fleet.decodes[0])
    )
    only_fake = sorted(set(fake) - set(real))
    assert not only_fake, f"families the fake exports and vLLM does not: {only_fake}"
    only_real = set(real) - set(fake)
    assert only_real == REAL_ONLY, (
        f"new: {sorted(only_real - REAL_ONLY)}, gone: {sorted(REAL_ONLY - only_real)}"
    )
    differing = {
        name: f"fake {fake[name]} vs vLLM {real[name]}"
        for name in set(fake) & set(real)
        if fake[name] != real[name] and name not in KNOWN_FAMILIES
    }
    assert not differing, differing
