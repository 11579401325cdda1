"""The NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_HOST:VLLM_NIXL_SIDE_CHANNEL_PORT, 5600 by default), both
ends.

Real vLLM answers a ZMQ handshake there and then reads KV blocks by RDMA; the fake answers HTTP on the same
address. Serving end (a prefill engine): POST /nixl/read_blocks names the engine, request and blocks from
kv_transfer_params and releases the engine's lease on them (or fails: wrong engine, unknown or expired
request). Reading end (a decode engine): performs the reads the core asks for, then the core pays the
modelled transfer time. (LMCache p2p has sockets of its own: lmcache_p2p.py.)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from aiohttp import ClientError, web

from inferencepool.engine_sim import protocol
from inferencepool.engine_sim.core import RemotePrefill, RemoteRead
from inferencepool.engine_sim.host import EngineHost
from inferencepool.engine_sim.httputil import app_runner, bound_port, error_response, json_response, url_host
from inferencepool.engine_sim.nixl_compat import HandshakePayload, handshake_error
from inferencepool.perf import timing

log = logging.getLogger("inferencepool.fake_engine")


class SideChannel:
    def __init__(self, engine: EngineHost) -> None:
        self.engine = engine
        self._peers: set[str] = set()  # prefill engines handshaken with (vLLM's _remote_agents)

    async def start(self) -> tuple[web.AppRunner, int]:
        """Listen on the configured side-channel address; returns the runner and the bound port."""
        config = self.engine.config
        app = web.Application()
        app.add_routes(
            [
                web.get("/nixl/handshake", self._handle_handshake),
                web.post("/nixl/read_blocks", self._handle_read_blocks),
            ]
        )
        runner = await app_runner(app)
        site = web.TCPSite(runner, config.side_channel_host, config.side_channel_port)
        try:
            await site.start()
        except OSError as exc:
            # Two fake engines on one address (a laptop, not a pod) would both want 5600; vLLM would fail
            # here.
            log.warning(
                "side channel port %s unavailable (%s); using an ephemeral port",
                config.side_channel_port,
                exc,
            )
            site = web.TCPSite(runner, config.side_channel_host, 0)
            await site.start()
        return runner, bound_port(site)

    # ----- serving end -----

    async def _handle_handshake(self, request: web.Request) -> web.Response:
        return json_response(self.engine.config.handshake_payload().document())

    async def _handle_read_blocks(self, request: web.Request) -> web.Response:
        engine = self.engine
        try:
            body = protocol.parse_json_body(await request.read())
            release = engine.core.release_hold(
                str(body["request_id"]),
                str(body["engine_id"]),
                engine.model_now(),
                tuple(int(b) for b in body.get("block_ids", [])),
            )
        except protocol.ApiError as exc:
            return json_response(exc.body(), exc.status)
        except (KeyError, TypeError, ValueError) as exc:
            return error_response(400, "BadRequestError", f"malformed read request: {exc}")
        except LookupError as exc:
            return error_response(404, "NotFoundError", str(exc.args[0]))
        engine.wake()
        return json_response({"prompt_tokens": release.prompt_tokens, "engine_id": engine.config.engine_id})

    # ----- reading end -----

    async def _handshake(self, source: RemotePrefill) -> str | None:
        """vLLM's handshake with a prefill engine first read from: its payload, checked before any read;
        why it is refused (None: accepted, and remembered for the engine's later reads)."""
        if source.engine_id in self._peers:
            return None
        url = f"http://{url_host(source.host)}:{source.port}/nixl/handshake"
        async with self.engine.session.get(url) as response:
            if response.status != 200:
                return f"NIXL handshake with {source.host}:{source.port} failed: HTTP {response.status}"
            remote = HandshakePayload.of(await response.json(content_type=None))
        local = self.engine.config.handshake_payload()
        if not self.engine.config.enforce_handshake_compat:
            local = dataclasses.replace(local, compatibility_hash=remote.compatibility_hash)
        error = handshake_error(local, remote, source.engine_id)
        if error is None:
            self._peers.add(source.engine_id)
        else:
            log.error("NIXL handshake with engine %s failed: %s", source.engine_id, error)
        return error

    async def _read(self, url: str, payload: Mapping[str, object], source: RemotePrefill) -> str | None:
        async with self.engine.session.post(url, json=payload) as response:
            if response.status == 200:
                return None
            detail = (await response.json(content_type=None)).get("error", {}).get("message", "")
            return (
                f"KV transfer from engine {source.engine_id} at {source.host}:{source.port} failed: {detail}"
            )

    async def remote_read(self, read: RemoteRead) -> None:
        engine = self.engine
        source = read.source
        url = f"http://{url_host(source.host)}:{source.port}/nixl/read_blocks"
        payload = {
            "engine_id": source.engine_id,
            "request_id": source.request_id,
            "block_ids": list(source.block_ids),
        }
        error: str | None = None
        try:
            error = await self._handshake(source)
            if error is None:
                error = await self._read(url, payload, source)
        except (ClientError, TimeoutError, ValueError) as exc:
            error = (
                f"KV transfer from engine {source.engine_id} at {source.host}:{source.port} failed: "
                f"cannot reach its NIXL side channel ({exc.__class__.__name__}: {exc})"
            )
        core = engine.core
        seconds = timing.nixl_transfer_time(core.profile, read.tokens)
        if error is None and engine.metrics.nixl is not None:
            # Observed as the transfer starts (vLLM records it as it completes; the duration is the same).
            engine.metrics.nixl.observe_read(
                seconds * engine.config.time_scale, read.tokens * core.profile.model.kv_bytes_per_token
            )
        failure = core.remote_read_done(read.request_id, engine.model_now(), error, transfer_seconds=seconds)
        if failure is not None:
            engine.deliver(failure)
        engine.wake()
