"""Through the router, a real engine's answers are the engine's own: the same request sent to the router (its
direct route) and to a decode engine gives the same status and the same body, field for field, apart from
the response id and creation time. Completions and chat, whole and streamed, usage, stop, `n`, and the bad
requests a client sends (unknown model, a prompt over --max-model-len, bad parameters)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.real.engines.client import Answer, call, router
from tests.support.real_engines import Fleet

VARYING = ("id", "created")
LONG = "The pool keeps shared prefixes warm on the decode engines. "


def cases(model: str, max_model_len: int) -> dict[str, tuple[str, dict[str, Any]]]:
    chat = [{"role": "user", "content": "Name three prime numbers."}]
    greedy = {"temperature": 0}  # vLLM samples at temperature 1 by default: two answers would differ
    too_long = LONG * (max_model_len // 8)  # ~12 tokens a sentence: well over the limit
    return {
        "completion": (
            "/v1/completions",
            {"model": model, "prompt": "Once upon a time", "max_tokens": 12, **greedy},
        ),
        "completion-stream-usage": (
            "/v1/completions",
            {
                "model": model,
                "prompt": "Once upon a time",
                "max_tokens": 12,
                "stream": True,
                "stream_options": {"include_usage": True},
                **greedy,
            },
        ),
        "chat": ("/v1/chat/completions", {"model": model, "messages": chat, "max_tokens": 12, **greedy}),
        "chat-stream": (
            "/v1/chat/completions",
            {"model": model, "messages": chat, "max_tokens": 12, "stream": True, **greedy},
        ),
        "stop": (
            "/v1/completions",
            {"model": model, "prompt": "Once upon a time", "max_tokens": 30, "stop": [" the", "e"], **greedy},
        ),
        "n-seeded": (
            "/v1/completions",
            {
                "model": model,
                "prompt": "Once upon a time",
                "max_tokens": 8,
                "n": 2,
                "seed": 7,
                "temperature": 1,
            },
        ),
        "unknown-model": ("/v1/completions", {"model": "no-such-model", "prompt": "hi", "max_tokens": 4}),
        "prompt-over-max-model-len": (
            "/v1/completions",
            {"model": model, "prompt": too_long, "max_tokens": 4},
        ),
        "bad-temperature": (
            "/v1/completions",
            {"model": model, "prompt": "hi", "max_tokens": 4, "temperature": "hot"},
        ),
        "negative-max-tokens": ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": -1}),
        "chat-without-messages": ("/v1/chat/completions", {"model": model, "max_tokens": 4}),
    }


CASE_NAMES = list(cases("m", 8192))
# Requests the router refuses itself, before any engine, because it cannot route them (it reads `messages` to
# count the prompt): the status and the OpenAI error shape are vLLM's, the wording is the router's (vLLM's is
# FastAPI's validation dump). docs/engine-contract.md lists them.
ROUTER_REFUSES = {"chat-without-messages"}


def without_varying(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_varying(v) for k, v in value.items() if k not in VARYING}
    if isinstance(value, list):
        return [without_varying(v) for v in value]
    return value


def comparable(answer: Answer) -> Any:
    if answer.events is not None:
        # How many tokens vLLM puts in one event depends on timing, so two runs of one stream are compared by
        # text and the finishing and usage events (the router relays the engine's bytes; the event shapes are
        # test_differential.py's).
        finishes = [
            (c.get("index"), c.get("finish_reason"), c.get("stop_reason"))
            for e in answer.events
            if isinstance(e, dict)
            for c in e.get("choices", [])
            if c.get("finish_reason")
        ]
        usage = [e["usage"] for e in answer.events if isinstance(e, dict) and e.get("usage")]
        return {"status": answer.status, "text": answer.text, "finish": finishes, "usage": usage}
    return {"status": answer.status, "body": without_varying(answer.body)}


@pytest.mark.parametrize("case", CASE_NAMES)
async def test_router_answers_as_the_engine_does(fleet: Fleet, case: str) -> None:
    path, body = cases(fleet.served_name, fleet.pool.spec.max_model_len() or 0)[case]
    direct = await call(fleet.decodes[0].url, path, body)
    async with router(fleet, policy="Colocated") as running:
        routed = await call(running.url, path, body)
    if case in ROUTER_REFUSES:
        assert routed.status == direct.status
        assert set(routed.body["error"]) == set(direct.body["error"]) == {"message", "type", "param", "code"}
        return
    assert comparable(routed) == comparable(direct)
    if case in ("completion", "chat", "stop", "n-seeded"):
        assert direct.status == 200
    if case.startswith(("unknown", "prompt-over", "bad", "negative", "chat-without")):
        assert direct.status in (400, 404) and "error" in direct.body
