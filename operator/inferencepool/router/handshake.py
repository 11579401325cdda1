"""Request bodies for the two legs of a disaggregated request (pure).

NIXL follows vLLM's own proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py): the prefill leg is
the client body with one output token, not streamed, asking the engine to keep the KV blocks for a remote
decode; the decode leg is the original body plus the kv_transfer_params the prefill engine returned. LMCache
PD mode (LMCache's examples/disagg_prefill proxy) names the decode pod in a disagg_spec so the prefill engine
pushes KV straight to it; the decode leg is the original body, and the decode engine finds the pushed KV by
the prompt's token-chunk hashes (req_id only ties the push to its ProxyNotif). LMCache's own xp1d proxy
also asks for `ret_first_tok` and sends the decode leg token ids plus that token; the router does not, as that
needs the model's tokenizer and cannot express a chat request: the decode engine recomputes the last partial
chunk instead (at most chunk_size - 1 tokens).
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


def lmcache_prefill_body(
    body: dict[str, Any], request_id: str, decode_host: str, ports: LMCachePDConfig
) -> dict[str, Any]:
    leg = _one_token(body)
    leg["kv_transfer_params"] = {
        "disagg_spec": {
            "req_id": request_id,
            "receiver_host": decode_host,
            "receiver_init_port": list(ports.receiver_init_ports),
            "receiver_alloc_port": list(ports.receiver_alloc_ports),
        },
    }
    return leg


def lmcache_decode_body(body: dict[str, Any]) -> dict[str, Any]:
    # The decode engine (kv_consumer) finds the pushed KV by the prompt's token-chunk hashes; nothing to add.
    return dict(body)
