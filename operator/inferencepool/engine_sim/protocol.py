"""vLLM's OpenAI-compatible request and response shapes, as pure functions (no HTTP library here).

Shapes follow vllm/entrypoints/openai (CompletionResponse, ChatCompletionResponse, their stream chunks,
ErrorResponse from vllm/entrypoints/serve/utils/error_response.py): errors are `{"error": {"message", "type",
"param", "code"}}` with code the HTTP status; an unknown model is 404 NotFoundError with param "model"
(OpenAIModelRegistry.check_model); a body that does not parse is 400 with type "Bad Request" (vLLM's
RequestValidationError handler); sampling-parameter and length errors are 400 BadRequestError.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass
from typing import Any, Literal

from inferencepool.engine_sim.core import DisaggSpec, RemotePrefill
from inferencepool.engine_sim.nixl_compat import VLLM_VERSION
from inferencepool.engine_sim.tokenizer import Tokenizer, continued_answer, render_chat

Kind = Literal["completion", "chat"]
COMPLETION_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest default


class ApiError(Exception):
    def __init__(self, status: int, err_type: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.err_type, self.message, self.param)


def error_body(status: int, err_type: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, "BadRequestError", message, param)


@dataclass(frozen=True)
class GenerationRequest:
    kind: Kind
    model: str
    prompt_token_ids: list[int]
    output_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool
    remote_prefill: RemotePrefill | None
    remote_decode: bool
    seed: int
    disagg: DisaggSpec | None = None  # LMCache PD: push the prompt's KV to this decode engine
    ret_first_tok: bool = False  # LMCache PD: answer the first token's id in kv_transfer_params
    answered: int = 0  # output pieces the prompt already holds (a continued answer goes on from there)


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, "Bad Request", f"JSON decode error: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "Bad Request", "the request body must be a JSON object")
    return body


def check_model(body: dict[str, Any], served_names: list[str]) -> str:
    model = body.get("model")
    if model is None or model == "":
        return served_names[0]
    if not isinstance(model, str) or model not in served_names:
        raise ApiError(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
    return model


# Sampling fields vLLM's request models type as numbers. FastAPI refuses a value pydantic cannot read as one
# (a numeric string passes, as pydantic's lax mode parses it) with its own 400, before the handler runs.
_NUMBER_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
_INTEGER_FIELDS = ("top_k", "seed", "n")


def _readable(value: Any, kind: type) -> bool:
    if not isinstance(value, bool | int | float | str):
        return False
    try:
        number = float(value)
    except ValueError:
        return False
    return kind is float or number.is_integer()


def check_field_types(body: dict[str, Any]) -> None:
    for key, kind, error in [(k, float, "float_parsing") for k in _NUMBER_FIELDS] + [
        (k, int, "int_parsing") for k in _INTEGER_FIELDS
    ]:
        value = body.get(key)
        if value is not None and not _readable(value, kind):
            described = "a valid number" if kind is float else "a valid integer"
            message = (
                f"1 validation error:\n  {{'type': '{error}', 'loc': 'body.{key}', 'msg': 'Input should be "
                f"{described}, unable to parse string as a number', 'input': {value!r}}}"
            )
            raise ApiError(400, "Bad Request", message, f"body.{key}")


def parse_generation(
    kind: Kind,
    body: dict[str, Any],
    served_names: list[str],
    tokenizer: Tokenizer,
    max_model_len: int,
) -> GenerationRequest:
    check_field_types(body)
    model = check_model(body, served_names)
    if kind == "completion":
        prompt_ids = _completion_prompt_ids(body, tokenizer)
        max_tokens = _optional_int(body, "max_tokens")
    else:
        prompt_ids = tokenizer.encode(_render(body))
        max_tokens = _optional_int(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _optional_int(body, "max_tokens")
    n = body.get("n", 1)
    if n != 1:
        raise bad_request("the fake engine generates one choice per request (n must be 1)", "n")
    if not prompt_ids:
        raise bad_request("The prompt cannot be empty.", "prompt")

    prompt_len = len(prompt_ids)
    if prompt_len >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input messages.",
            "input_tokens",
        )
    seed, answered = continued_answer(tokenizer, prompt_ids)
    if max_tokens is not None:
        if max_tokens < 1:
            raise bad_request(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        if prompt_len + max_tokens > max_model_len:
            raise bad_request(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{max_tokens} output tokens and your prompt contains at least {prompt_len} input tokens, "
                f"for a total of at least {prompt_len + max_tokens} tokens. Please reduce the length of the "
                "input prompt or the number of requested output tokens.",
                "max_tokens",
            )
        output_tokens, finish_reason = max_tokens, "length"
    elif kind == "completion":
        output_tokens = min(COMPLETION_DEFAULT_MAX_TOKENS, max_model_len - prompt_len)
        finish_reason = "length"
    else:
        # A model stops on its own; the fake picks a deterministic natural length for this answer.
        output_tokens = min(max(1, 32 + seed % 97 - answered), max_model_len - prompt_len)
        finish_reason = "stop"

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("stream must be a boolean", "stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    if stream_options and not stream:
        raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
    remote_prefill, remote_decode = parse_kv_transfer_params(body.get("kv_transfer_params"))
    disagg, ret_first_tok = parse_lmcache_pd_params(body.get("kv_transfer_params"))
    return GenerationRequest(
        kind=kind,
        model=model,
        prompt_token_ids=prompt_ids,
        output_tokens=output_tokens,
        finish_reason=finish_reason,
        stream=stream,
        include_usage=bool(stream_options.get("include_usage", False)),
        remote_prefill=remote_prefill,
        remote_decode=remote_decode,
        seed=seed,
        disagg=disagg,
        ret_first_tok=ret_first_tok,
        answered=answered,
    )


def _render(body: dict[str, Any]) -> str:
    """The chat prompt as the template renders it; `continue_final_message` leaves the last message open
    (and, as vLLM and transformers' apply_chat_template, refuses a generation prompt beside it)."""
    continue_final = body.get("continue_final_message", False)
    add_generation_prompt = body.get("add_generation_prompt", True)
    for key, value in (
        ("continue_final_message", continue_final),
        ("add_generation_prompt", add_generation_prompt),
    ):
        if not isinstance(value, bool):
            raise ApiError(400, "Bad Request", f"{key} must be a boolean", key)
    if continue_final and add_generation_prompt:
        raise bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    return render_chat(_messages(body), add_generation_prompt, continue_final)


def parse_kv_transfer_params(params: object) -> tuple[RemotePrefill | None, bool]:
    """NixlConnector's fields: do_remote_decode on a prefill leg; do_remote_prefill + where on a decode leg.

    Incomplete decode-leg params are ignored (the request is prefilled locally), as NixlConnectorScheduler
    does with a warning ("Got invalid KVTransferParams").
    """
    if params is None:
        return None, False
    if not isinstance(params, dict):
        raise bad_request("kv_transfer_params must be an object", "kv_transfer_params")
    if params.get("do_remote_prefill"):
        try:
            block_ids = _flatten_block_ids(params["remote_block_ids"])
            remote = RemotePrefill(
                engine_id=str(params["remote_engine_id"]),
                request_id=str(params["remote_request_id"]),
                host=str(params["remote_host"]),
                port=int(params["remote_port"]),
                block_ids=block_ids,
                tp_size=int(params.get("tp_size") or 1),
            )
        except (KeyError, TypeError, ValueError):
            return None, False
        return remote, False
    return None, bool(params.get("do_remote_decode"))


def parse_lmcache_pd_params(params: object) -> tuple[DisaggSpec | None, bool]:
    """LMCacheConnectorV1's fields: `disagg_spec` (where to push the KV) and `ret_first_tok`.

    LMCache reads disagg_spec["req_id"], ["receiver_host"], ["receiver_init_port"][rank] and
    ["receiver_alloc_port"][rank] (vllm_v1_adapter.py update_state_after_alloc, pd_backend_async.py); a spec
    without them breaks its scheduler or worker, so the fake answers 400 naming the field instead.
    """
    if not isinstance(params, dict):
        return None, False
    ret_first_tok = "ret_first_tok" in params  # LMCache checks presence, not value
    spec = params.get("disagg_spec")
    if spec is None:
        return None, ret_first_tok
    param = "kv_transfer_params.disagg_spec"
    if not isinstance(spec, dict):
        raise bad_request(f"{param} must be an object", param)
    req_id, host = spec.get("req_id"), spec.get("receiver_host")
    if not isinstance(req_id, str) or not req_id:
        raise bad_request(f"{param}.req_id must be a non-empty string", f"{param}.req_id")
    if not isinstance(host, str) or not host:
        raise bad_request(f"{param}.receiver_host must be a non-empty string", f"{param}.receiver_host")
    ports: list[tuple[int, ...]] = []
    for key in ("receiver_init_port", "receiver_alloc_port"):
        value = spec.get(key)
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 for p in value)
        ):
            raise bad_request(
                f"{param}.{key} must be a non-empty list of ports, one per TP rank; got {value!r}",
                f"{param}.{key}",
            )
        ports.append(tuple(value))
    return DisaggSpec(req_id, host, ports[0], ports[1]), ret_first_tok


def _flatten_block_ids(value: object) -> tuple[int, ...]:
    # one list per KV cache group in recent vLLM, a flat list in older ones
    if not isinstance(value, list):
        raise TypeError("remote_block_ids must be a list")
    flat: list[int] = []
    for item in value:
        if isinstance(item, list):
            flat.extend(int(x) for x in item)
        else:
            flat.append(int(item))
    return tuple(flat)


def kv_transfer_params_for(
    engine_id: str,
    request_id: str,
    block_ids: tuple[int, ...],
    host: str,
    port: int,
    tp_size: int,
    prompt_tokens: int,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """What a prefill leg returns: vLLM 0.33's pull-mode NixlConnectorScheduler.request_finished
    (nixl/pull_scheduler.py: no expiry time on a prefill node, the computed prompt as remote_num_tokens) and
    the scheduler's remote_prefill_cached_tokens (v1/core/sched/scheduler.py)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [list(block_ids)],
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": tp_size,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": prompt_tokens,
        "remote_blocks_expiry_time": None,
        "remote_registration_generation": 0,
        "transfer_mode": "pull",
        "remote_prefill_cached_tokens": cached_tokens,
    }


def _completion_prompt_ids(body: dict[str, Any], tokenizer: Tokenizer) -> list[int]:
    if "prompt" not in body or body["prompt"] is None:
        raise ApiError(400, "Bad Request", "Field required: prompt", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list):
        raise bad_request("the fake engine takes one prompt per request (no batched prompts)", "prompt")
    raise ApiError(
        400,
        "Bad Request",
        "prompt must be a string, a list of token ids, or a list of one of those",
        "prompt",
    )


def _messages(body: dict[str, Any]) -> list[dict[str, object]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "Bad Request", "Field required: messages (a non-empty list)", "messages")
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise ApiError(400, "Bad Request", "each message must be an object with a role", "messages")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ApiError(
                400, "Bad Request", "message content must be a string or a list of parts", "messages"
            )
    return messages


def _optional_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, "Bad Request", f"{key} must be an integer", key)
    return value


def tokenize(
    body: dict[str, Any], served_names: list[str], tokenizer: Tokenizer, max_model_len: int
) -> dict[str, Any]:
    check_model(body, served_names)
    if "messages" in body:
        ids = tokenizer.encode(_render(body))
    elif isinstance(body.get("prompt"), str):
        ids = tokenizer.encode(body["prompt"])
    else:
        raise ApiError(400, "Bad Request", "Field required: prompt (a string) or messages", "prompt")
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None}


def system_fingerprint(model: str) -> str:
    """vLLM's is `vllm-<version>-<8 hex>` (a hash of the engine's config); the fake hashes the model name."""
    return f"vllm-{VLLM_VERSION}-{zlib.crc32(model.encode()):08x}"


def usage(prompt_tokens: int, completion_tokens: int, stream: bool = False) -> dict[str, Any]:
    """vLLM's UsageInfo; a stream's usage event leaves the (unset) details out, a whole answer has them."""
    counts = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    return counts if stream else {**counts, "prompt_tokens_details": None, "completion_tokens_details": None}


def response_id(kind: Kind, request_id: str) -> str:
    return f"{'cmpl' if kind == 'completion' else 'chatcmpl'}-{request_id}"


def full_response(
    req: GenerationRequest,
    response_id_: str,
    text: str,
    completion_tokens: int,
    finish_reason: str,
    kv_transfer_params: dict[str, Any] | None,
    created: int | None = None,
) -> dict[str, Any]:
    created = int(time.time()) if created is None else created
    # Field for field (and in order) what vLLM serializes: CompletionResponse / ChatCompletionResponse and
    # their choices, unset optional fields as null.
    if req.kind == "completion":
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
        }
        obj = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            },
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": None,
            "routed_experts": None,
        }
        obj = "chat.completion"
    response: dict[str, Any] = {
        "id": response_id_,
        "object": obj,
        "created": created,
        "model": req.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": system_fingerprint(req.model),
        "usage": usage(len(req.prompt_token_ids), completion_tokens),
    }
    if req.kind == "chat":
        response |= {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
    return response | {"kv_transfer_params": kv_transfer_params, "ec_transfer_params": None, "metrics": None}


class StreamEncoder:
    """SSE chunks for one streamed request; a token chunk is two constant byte strings around the text."""

    def __init__(self, req: GenerationRequest, response_id_: str, created: int | None = None) -> None:
        self.req = req
        created = int(time.time()) if created is None else created
        self._head = {"id": response_id_, "created": created, "model": req.model}
        if req.kind == "completion":
            self._object = "text_completion"
            self._prefix = (
                f'data: {{"id":{json.dumps(response_id_)},"object":"text_completion","created":{created},'
                f'"model":{json.dumps(req.model)},"choices":[{{"index":0,"text":'
            ).encode()
            self._suffix = (
                b',"logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,'
                b'"token_ids":null}]}\n\n'
            )
        else:
            self._object = "chat.completion.chunk"
            self._prefix = (
                f'data: {{"id":{json.dumps(response_id_)},"object":"chat.completion.chunk",'
                f'"created":{created},'
                f'"model":{json.dumps(req.model)},"choices":[{{"index":0,"delta":{{"content":'
            ).encode()
            self._suffix = b'},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'

    def _event(self, payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def role_chunk(self) -> bytes | None:
        """Chat streams open with the assistant role (vLLM sends it before any content)."""
        if self.req.kind != "chat":
            return None
        return self._event(
            {
                **self._head,
                "object": self._object,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                "prompt_token_ids": None,
                "prompt_text": None,
            }
        )

    def token_chunk(self, text: str) -> bytes:
        return self._prefix + json.dumps(text).encode() + self._suffix

    def final_chunk(self, text: str, finish_reason: str) -> bytes:
        """The last token's event; without a usage event to follow it carries the system fingerprint."""
        if self.req.kind == "completion":
            choice: dict[str, Any] = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        else:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "token_ids": None,
            }
        event = {**self._head, "object": self._object, "choices": [choice]}
        if not self.req.include_usage:
            event["system_fingerprint"] = system_fingerprint(self.req.model)
        return self._event(event)

    def usage_chunk(self, completion_tokens: int) -> bytes:
        return self._event(
            {
                **self._head,
                "object": self._object,
                "choices": [],
                "usage": usage(len(self.req.prompt_token_ids), completion_tokens, stream=True),
                "system_fingerprint": system_fingerprint(self.req.model),
            }
        )

    def error_chunk(self, status: int, err_type: str, message: str) -> bytes:
        return self._event(error_body(status, err_type, message))

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"
