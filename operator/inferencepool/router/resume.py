"""Resuming a stream whose decode engine died mid-answer (pure): from the events already relayed to the
client, the request that makes another decode engine continue the same answer.

vLLM continues a text where it stops: a completion's prompt followed by the text generated so far, or a chat
whose last message is the assistant's partial answer with `continue_final_message` (and no generation
prompt, vLLM refuses both). The continuation asks for the tokens still allowed (max_tokens less the events
sent, one token per event as vLLM streams them). A request that cannot be continued from text alone (token-id
or batched prompts, n > 1, echo, logprobs, best_of) is not resumed.

The continuation's events are rewritten so the client sees one answer (`Continued`): the first answer's id
and created time, no second assistant-role opening, usage counted for the whole answer (the tokens already
sent move from the continuation's prompt back to the completion).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from inferencepool.router.prompt import Endpoint

_NOT_RESUMABLE = ("echo", "logprobs", "top_logprobs", "best_of", "prompt_logprobs", "suffix")
COMPLETION_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default, per request


@dataclass(frozen=True, slots=True)
class Progress:
    """What the client has received of an answer."""

    text: str
    tokens: int  # events that carried text
    finished: bool  # an event carried a finish_reason (only [DONE] is missing)


def progress(events: bytes, endpoint: Endpoint) -> Progress | None:
    """The answer so far from whole SSE events; None when they are not what a one-choice stream sends."""
    pieces: list[str] = []
    tokens = 0
    finished = False
    for event in events.split(b"\n\n"):
        event = event.strip()
        if not event or event.startswith(b":"):
            continue
        if not event.startswith(b"data:"):
            return None
        data = event[5:].strip()
        if data == b"[DONE]":
            finished = True
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(chunk, dict) or "error" in chunk:
            return None
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                return None
            text = (
                choice.get("text")
                if endpoint == "completions"
                else (choice.get("delta") or {}).get("content")
            )
            if isinstance(text, str) and text:
                pieces.append(text)
                tokens += 1
            if choice.get("finish_reason") is not None:
                finished = True
    return Progress("".join(pieces), tokens, finished)


def continuation(body: dict[str, Any], endpoint: Endpoint, done: Progress) -> bytes | None:
    """The body that continues `body`'s answer after `done`, or None when it cannot be continued."""
    if body.get("n", 1) != 1 or any(body.get(key) for key in _NOT_RESUMABLE):
        return None
    resumed = dict(body)
    if endpoint == "completions" and body.get("max_tokens") is None:
        # the continuation would get vLLM's default again: ask for what is left of the first one's
        body = {**body, "max_tokens": COMPLETION_DEFAULT_MAX_TOKENS}
    for key in ("max_tokens", "max_completion_tokens"):
        limit = body.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - done.tokens < 1:
                return None
            resumed[key] = limit - done.tokens
    minimum = body.get("min_tokens")
    if isinstance(minimum, int) and not isinstance(minimum, bool):
        resumed["min_tokens"] = max(0, minimum - done.tokens)
    if endpoint == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return None
        resumed["prompt"] = prompt + done.text
        return orjson.dumps(resumed)
    messages = list(body["messages"])
    last = messages[-1] if messages else None
    if body.get("continue_final_message") and isinstance(last, dict) and last.get("role") == "assistant":
        content = last.get("content")
        if not isinstance(content, str):
            return None
        messages[-1] = {**last, "content": content + done.text}
    else:
        messages.append({"role": "assistant", "content": done.text})
    resumed["messages"] = messages
    resumed["continue_final_message"] = True
    resumed["add_generation_prompt"] = False
    return orjson.dumps(resumed)


@dataclass(frozen=True, slots=True)
class Continued:
    """Rewrites a continuation's events into the answer the client is getting: the first answer's `id` and
    `created`, no second assistant-role opening (chat), and usage with the `done` tokens already sent
    counted as completion, not prompt, tokens."""

    id: object
    created: object
    done: int

    @classmethod
    def of(cls, sent: bytes, done: Progress) -> Continued:
        """From the events the client got (the first that names an id gives it)."""
        for event in sent.split(b"\n\n"):
            event = event.strip()
            if not event.startswith(b"data:") or event[5:].strip() == b"[DONE]":
                continue
            try:
                chunk = orjson.loads(event[5:])
            except orjson.JSONDecodeError:
                continue
            if isinstance(chunk, dict) and "id" in chunk:
                return cls(chunk["id"], chunk.get("created"), done.tokens)
        return cls(None, None, done.tokens)

    def events(self, data: bytes) -> bytes:
        """`data`: whole SSE events of the continuation (the last may lack its blank line when the stream
        ended there)."""
        out: list[bytes] = []
        for event in data.split(b"\n\n"):
            if not event.strip():
                continue
            out.append(self._event(event))
        return b"".join(e + b"\n\n" for e in out if e)

    def _event(self, event: bytes) -> bytes:
        stripped = event.strip()
        if not stripped.startswith(b"data:") or stripped[5:].strip() == b"[DONE]":
            return event
        try:
            chunk = orjson.loads(stripped[5:])
        except orjson.JSONDecodeError:
            return event
        if not isinstance(chunk, dict) or "error" in chunk:
            return event
        if self.id is not None and "id" in chunk:
            chunk["id"] = self.id
        if self.created is not None and "created" in chunk:
            chunk["created"] = self.created
        choices = chunk.get("choices")
        if (
            isinstance(choices, list)
            and len(choices) == 1
            and isinstance(choices[0], dict)
            and _opens_assistant(choices[0])
            and not chunk.get("usage")
        ):
            return b""  # the client's answer is already open
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int) and isinstance(completion, int):
                usage["prompt_tokens"] = max(0, prompt - self.done)
                usage["completion_tokens"] = completion + (prompt - usage["prompt_tokens"])
        return b"data: " + orjson.dumps(chunk)


def _opens_assistant(choice: dict[str, Any]) -> bool:
    """A chat stream's opening chunk: the role and no text, no end."""
    delta = choice.get("delta")
    return (
        isinstance(delta, dict)
        and "role" in delta
        and not delta.get("content")
        and not delta.get("tool_calls")
        and choice.get("finish_reason") is None
    )
