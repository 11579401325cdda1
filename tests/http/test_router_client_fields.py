"""What a client may put in a request: only valid token ids, and nothing that only the router may set."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from tests.http.router_harness import (
    LONG_PROMPT,
    MODEL,
    SHORT_PROMPT,
    complete,
    config_for,
    engine_requests,
    engines,
    running_router,
)


@pytest.mark.parametrize(
    ("prompt", "where", "bad"),
    [
        ([2**40] * 300, "`prompt`", 2**40),
        ([-1] * 300, "`prompt`", -1),
        ([[1, 2, 3], [5, 2**32]], "`prompt[1]`", 2**32),
    ],
)
async def test_token_ids_outside_32_bits_are_a_400_naming_the_field(
    prompt: list[Any], where: str, bad: int
) -> None:
    async with engines(["decode"]) as (decode,), running_router(config_for([], [decode])) as router:
        async with (
            aiohttp.ClientSession() as http,
            http.post(router.url + "/v1/completions", json={"model": MODEL, "prompt": prompt}) as response,
        ):
            error = (await response.json())["error"]
        assert response.status == 400, error
        assert error["param"] == "prompt" and error["type"] == "BadRequestError"
        assert where in error["message"] and str(bad) in error["message"]
        # The largest id that fits still goes through.
        status, _, _ = await complete(router.url, [2**32 - 1] * 5)  # type: ignore[arg-type]
        assert status == 200
        assert await engine_requests(decode) == 1


ROUTER_ONLY = [
    ("kv_transfer_params", {"do_remote_prefill": True, "remote_host": "10.0.0.9", "remote_port": 5600}),
    ("kv_transfer_params", {"disagg_spec": {"req_id": "x", "receiver_host": "10.0.0.9"}}),
    ("ec_transfer_params", {"do_remote_encode": True}),
    ("disagg_spec", {"req_id": "x", "receiver_host": "10.0.0.9"}),
]


@pytest.mark.parametrize("transfer_mode", ["Nixl", "LMCachePD"])
async def test_fields_only_the_router_sets_are_refused_on_every_route(transfer_mode: str) -> None:
    """Direct (short prompt), disaggregated (long prompt) and chat: each refused before any engine sees it."""
    async with engines(["prefill", "decode"]) as (prefill, decode):
        config = config_for(
            [prefill],
            [decode],
            prefillThresholdTokens=100,
            transferMode=transfer_mode,
            lmcachePd={"proxyPort": 0},
            timeouts={"kvPushSeconds": 1},  # these engines push nothing: the last request falls back
        )
        async with running_router(config) as router, aiohttp.ClientSession() as http:
            for name, value in ROUTER_ONLY:
                for path, body in (
                    ("/v1/completions", {"model": MODEL, "prompt": SHORT_PROMPT}),
                    ("/v1/completions", {"model": MODEL, "prompt": LONG_PROMPT, "stream": True}),
                    (
                        "/v1/chat/completions",
                        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                    ),
                ):
                    async with http.post(router.url + path, json={**body, name: value}) as response:
                        error = (await response.json())["error"]
                    assert response.status == 400, (name, path, error)
                    assert error["param"] == name and f"`{name}`" in error["message"]
            # vLLM hands vllm_xargs to the connector in the same place as kv_transfer_params.
            body = {"model": MODEL, "prompt": LONG_PROMPT, "vllm_xargs": {"kv_transfer_params": "x"}}
            async with http.post(router.url + "/v1/completions", json=body) as response:
                error = (await response.json())["error"]
            assert response.status == 400 and error["param"] == "vllm_xargs.kv_transfer_params"
            assert (await engine_requests(prefill), await engine_requests(decode)) == (0, 0)
            status, _, _ = await complete(router.url, LONG_PROMPT)
            assert status == 200
