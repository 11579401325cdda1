"""Request bodies for the two legs of a disaggregated request (pure).

NIXL follows vLLM's own proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py): the prefill leg is
the client body with one output token, not streamed, asking the engine to keep the KV blocks for a remote
decode; the decode leg is the original body plus the kv_transfer_params the prefill engine returned.

LMCache PD mode names the decode pod in a disagg_spec so the prefill engine pushes KV straight to it; the
decode engine finds the pushed chunks by the hashes of its prompt's token chunks, looked up without its last
`skip_last_n_tokens` (1, as LMCache's PD examples run decode engines), and LMCache frees a pushed chunk only
when a request retrieves it (no eviction). So every pushed chunk must be one the decode leg looks up, or the
receiver's buffer fills for good. LMCache's xp1d proxy gets there by sending the decode leg the prompt's ids
plus the prefill's first token (`ret_first_tok`) and stitching that token into the answer. The router does
it the other way round: the prefill leg is the prompt's token ids less the last one (a /v1/completions call,
its one output token thrown away), and the decode leg is the client's own body, byte for byte. The decode
engine looks up exactly the ids that were pushed, computes the last prompt token itself (as it would the
first token in xp1d's scheme) and writes the whole answer, chat included, with no stitching. The ids come
from the decode engine's own /tokenize, which renders chat messages with the same template the chat
endpoint uses.
"""

from __future__ import annotations

from typing import Any

from inferencepool.router.config import LMCachePDConfig

NIXL_PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

# Fields a one-token, non-streamed prefill cannot honour (vLLM rejects min_tokens > max_tokens).
_PREFILL_DROPPED = ("stream_options", "min_tokens", "min_completion_tokens")


def _one_token(body: dict[str, Any]) -> dict[str, Any]:
    leg = {key: value for key, value in body.items() if key not in _PREFILL_DROPPED}
    leg["max_tokens"] = 1
    if "max_completion_tokens" in leg:
        leg["max_completion_tokens"] = 1
    leg["stream"] = False
    return leg


def nixl_prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    leg = _one_token(body)
    leg["kv_transfer_params"] = dict(NIXL_PREFILL_PARAMS)
    return leg


def nixl_decode_body(body: dict[str, Any], prefill_response: object) -> dict[str, Any]:
    """The original body with the prefill engine's kv_transfer_params, unchanged.

    Raises ValueError when the prefill response has none: the decode pod would then prefill again, and the
    router counts that as a failed prefill leg instead of hiding it.
    """
    params = prefill_response.get("kv_transfer_params") if isinstance(prefill_response, dict) else None
    if not isinstance(params, dict) or not params:
        raise ValueError("prefill response carries no kv_transfer_params")
    leg = dict(body)
    leg["kv_transfer_params"] = params
    return leg


def disagg_spec(request_id: str, decode_host: str, ports: LMCachePDConfig) -> dict[str, Any]:
    """LMCache's kv_transfer_params.disagg_spec: push this request's KV to the decode pod at decode_host."""
    return {
        "req_id": request_id,
        "receiver_host": decode_host,
        "receiver_init_port": list(ports.receiver_init_ports),
        "receiver_alloc_port": list(ports.receiver_alloc_ports),
    }


# Fields of a chat request that change how /tokenize (and the chat endpoint) renders its messages
# (vLLM 0.33 TokenizeChatRequest, entrypoints/serve/tokenize/protocol.py).
CHAT_RENDER_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "tools",
    "mm_processor_kwargs",
)


def tokenize_body(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """The /tokenize query that yields the ids the engine's generation endpoint will compute for `body`
    (one text prompt, or chat messages)."""
    if chat:
        query = {"model": body["model"], "messages": body["messages"]}
        query.update((key, body[key]) for key in CHAT_RENDER_FIELDS if key in body)
        return query
    query = {"model": body["model"], "prompt": body["prompt"]}
    if "add_special_tokens" in body:
        query["add_special_tokens"] = body["add_special_tokens"]
    return query


def lmcache_prefill_ids_body(
    body: dict[str, Any], token_ids: list[int], request_id: str, decode_host: str, ports: LMCachePDConfig
) -> dict[str, Any]:
    """The prefill leg (a /v1/completions call) for the prompt's ids less the last, pushed to the decode
    pod."""
    leg: dict[str, Any] = {
        "model": body["model"],
        "prompt": token_ids[:-1],
        "max_tokens": 1,
        "stream": False,
    }
    if "priority" in body:
        leg["priority"] = body["priority"]
    leg["kv_transfer_params"] = {"disagg_spec": disagg_spec(request_id, decode_host, ports)}
    return leg
