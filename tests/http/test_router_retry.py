"""A request is served whenever a decode pod could serve it: a failure before its first token reaches the
client is retried colocated (counted as a fallback with its reason), whatever broke the KV hand-off."""

from __future__ import annotations

import dataclasses

import pytest
from tests.http.router_harness import (
    LONG_PROMPT,
    RunningRouter,
    complete,
    config_for,
    engine_requests,
    engines,
    front,
    metric_sum,
    running_router,
    with_addresses,
)
from tests.support.engines import RunningEngine

from inferencepool.engine_sim.server import FakeEngine
from inferencepool.router.pods import PodSpec


@pytest.mark.parametrize("stream", [False, True])
async def test_prefill_pod_dying_after_its_answer_is_served_colocated(stream: bool) -> None:
    """Streaming, the decode engine's error event comes before any token; not streaming, it answers 500.
    Either way nothing reached the client, so a decode pod serves the request by itself."""
    async with (
        engines(["prefill", "decode"]) as (prefill, decode),
        front(prefill.url, prefill.engine.stop) as address,
    ):
        config = with_addresses(config_for([], [decode], policy="AlwaysDisaggregate"), prefill=[address])
        async with running_router(config) as router:
            status, body, headers = await complete(router.url, LONG_PROMPT, stream=stream, max_tokens=8)
            assert status == 200, body
            assert headers["X-Inferencepool-Route"] == "fallback"
            if stream:
                assert '"error"' not in body and body.rstrip().endswith("data: [DONE]")
            reason = "decode_leg_failed"
            assert await metric_sum(router.url, "inferencepool_router_fallbacks", reason=reason) == 1
            assert await metric_sum(router.url, "inferencepool_router_requests", route="fallback") == 1
            assert await metric_sum(router.url, "inferencepool_router_requests") == 1
            # The decode engine failed the first try (the KV was gone) and served the second.
            assert await metric_sum(decode.url, "vllm:request_success", finished_reason="error") == 1
            assert await engine_requests(decode) == 2
            # the prefill pod died and did not come back: not a restarted pod's engine
            assert await metric_sum(router.url, "inferencepool_router_stale_peer_failures") == 0
            pods = router.router.pods.pods.values()
            assert all(pod.outstanding == 0 for pod in pods)


async def test_prefill_pod_restarted_with_a_new_nixl_engine_id_mid_hand_off() -> None:
    """vLLM's fleet failure: a prefill pod restarts (a new NIXL engine id on the same address) while a decode
    engine still has a request naming the old one. That request is retried colocated and counted as a stale
    peer's failure (the Pod watch reported the new incarnation); the next ones go through the new engine (the
    decode engine reads from whatever engine id the prefill leg names)."""
    async with engines(["prefill", "decode"]) as (prefill, decode):
        old = prefill.engine
        restarted: list[FakeEngine] = []
        routers: list[RunningRouter] = []

        async def restart() -> None:
            await old.stop()
            assert old.port is not None and old.side_channel_port is not None
            config = dataclasses.replace(
                old.config,
                port=old.port,
                side_channel_port=old.side_channel_port,
                engine_id=f"{old.config.engine_id}-restarted",
            )
            engine = FakeEngine(config)
            await engine.start()
            restarted.append(engine)
            # what the Pod watch delivers: the same pods, the prefill pod under another incarnation
            pods = routers[0].router.pods
            pods.apply(
                PodSpec(p.name, p.url, p.role, incarnation="restarted" if p.role == "prefill" else "")
                for p in pods.pods.values()
            )

        try:
            async with front(prefill.url, restart) as address:
                config = config_for([], [decode], policy="AlwaysDisaggregate")
                config = with_addresses(config, prefill=[address])
                async with running_router(config) as router:
                    routers.append(router)
                    status, body, headers = await complete(router.url, LONG_PROMPT, stream=True)
                    assert status == 200 and headers["X-Inferencepool-Route"] == "fallback", body
                    assert '"error"' not in body
                    for _ in range(3):
                        status, body, headers = await complete(router.url, LONG_PROMPT + "again", stream=True)
                        assert status == 200 and headers["X-Inferencepool-Route"] == "disaggregated", body
                    reason = "decode_leg_failed"
                    assert await metric_sum(router.url, "inferencepool_router_fallbacks", reason=reason) == 1
                    stale = "inferencepool_router_stale_peer_failures"
                    assert await metric_sum(router.url, stale, role="prefill") == 1
                    assert await metric_sum(router.url, stale, role="decode") == 0
                    assert await engine_requests(RunningEngine(restarted[0])) == 3
        finally:
            for engine in restarted:
                await engine.stop()
