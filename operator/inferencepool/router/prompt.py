"""Reading the prompt out of an OpenAI request body, and answering bad ones with the reason (pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

Endpoint = Literal["completions", "chat"]

# Fields only the router may set: they tell an engine where to read or push KV (vLLM's kv_transfer_params and
# ec_transfer_params, LMCache's disagg_spec). From a client they would let it point a decode engine at an
# address of its choosing or consume another request's KV hold, so a request carrying one is refused (a
# clear 400 rather than a silent strip: a client relying on them learns at once that the router owns them).
# vLLM also copies vllm_xargs into the same extra_args that carry kv_transfer_params to the connector.
ROUTER_ONLY_FIELDS = ("kv_transfer_params", "ec_transfer_params", "disagg_spec")
# vLLM and LMCache keep token ids as 32-bit unsigned integers (the affinity hash packs them so too).
MAX_TOKEN_ID = 2**32 - 1


class BadRequest(ValueError):
    """A request the router refuses; `status` and `error_type` follow OpenAI's error shape."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        error_type: str = "BadRequestError",
        param: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.param = param


@dataclass(frozen=True, slots=True)
class Prompt:
    """What the router needs from a request: the text to count and hash, or token ids when the client sent
    them.

    `texts` holds one entry per prompt of a batched completion (`prompt: [..]`); chat requests render their
    messages into one text. `token_ids` is set when the client sent ids instead of text.
    """

    texts: tuple[str, ...]
    token_ids: tuple[tuple[int, ...], ...]
    message_count: int
    stream: bool


def _chat_text(messages: list[Any]) -> str:
    # Role names and contents in order: close enough to a chat template for counting and for prefix hashing,
    # and the system prompt (the usual shared prefix) comes first as it does in the real template.
    parts: list[str] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{index}] must be an object", param="messages")
        role = message.get("role")
        if not isinstance(role, str):
            raise BadRequest(f"messages[{index}].role must be a string", param="messages")
        content = message.get("content")
        parts.append(role)
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    parts.append(part["text"])
        elif content is not None:
            raise BadRequest(
                f"messages[{index}].content must be a string or a list of parts", param="messages"
            )
    return "\n\n".join(parts)


def _is_token_ids(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and bool(value) and all(isinstance(item, int) for item in value)


def _check_token_range(ids: list[int], where: str) -> None:
    low, high = min(ids), max(ids)
    if low < 0 or high > MAX_TOKEN_ID:
        bad = low if low < 0 else high
        raise BadRequest(
            f"`{where}` holds token id {bad}: token ids must be integers in 0..{MAX_TOKEN_ID}", param="prompt"
        )


def read_prompt(body: object, endpoint: Endpoint, served_model_name: str | None) -> Prompt:
    """Validate the fields the router depends on; the engine validates the rest (sampling params and so
    on)."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    for name in ROUTER_ONLY_FIELDS:
        if name in body:
            raise BadRequest(f"`{name}` is set by the router and may not be sent by clients", param=name)
    xargs = body.get("vllm_xargs")
    if isinstance(xargs, dict):
        for name in ROUTER_ONLY_FIELDS:
            if name in xargs:
                raise BadRequest(
                    f"`vllm_xargs.{name}` is set by the router and may not be sent by clients",
                    param=f"vllm_xargs.{name}",
                )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("`model` is required and must be a non-empty string", param="model")
    if served_model_name is not None and model != served_model_name:
        # vLLM's own words (entrypoints/serve/engine/serving.py _check_model), so a client sees one answer.
        raise BadRequest(
            f"The model `{model}` does not exist. Valid aliases: {served_model_name}.",
            status=404,
            error_type="NotFoundError",
            param="model",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("`stream` must be a boolean", param="stream")
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("`messages` is required and must be a non-empty list", param="messages")
        return Prompt(texts=(_chat_text(messages),), token_ids=(), message_count=len(messages), stream=stream)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return Prompt(texts=(prompt,), token_ids=(), message_count=0, stream=stream)
    if _is_token_ids(prompt):
        _check_token_range(prompt, "prompt")
        return Prompt(texts=(), token_ids=(tuple(prompt),), message_count=0, stream=stream)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(item, str) for item in prompt):
            return Prompt(texts=tuple(prompt), token_ids=(), message_count=0, stream=stream)
        if all(_is_token_ids(item) for item in prompt):
            for index, item in enumerate(prompt):
                _check_token_range(item, f"prompt[{index}]")
            return Prompt(
                texts=(), token_ids=tuple(tuple(item) for item in prompt), message_count=0, stream=stream
            )
    raise BadRequest(
        "`prompt` is required: a string, a list of strings, a list of token ids or a list of such lists",
        param="prompt",
    )
