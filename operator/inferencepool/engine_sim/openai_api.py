"""vLLM's OpenAI-compatible API on the fake engine's --port: /v1/completions, /v1/chat/completions, /tokenize,
/v1/models, /health, /version, /metrics. Requests go to the engine core; tokens come back through the
engine's streams (see server.py) as SSE chunks or one JSON answer, shaped by protocol.py."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inferencepool import __version__
from inferencepool.engine_sim import protocol
from inferencepool.engine_sim.core import EngineRequest, RequestFailed
from inferencepool.engine_sim.host import EngineHost, Stream
from inferencepool.engine_sim.httputil import json_response
from inferencepool.engine_sim.nixl_compat import VLLM_VERSION


class OpenAIApi:
    def __init__(self, engine: EngineHost) -> None:
        self.engine = engine
        self._ids = itertools.count()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.engine.draining else 200)

    async def _version(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "version": VLLM_VERSION,
                "fake_engine": {
                    "inferencepool": __version__,
                    "profile": self.engine.config.profile.name,
                    "tokenizer": self.engine.config.tokenizer.name,
                    "engine_id": self.engine.config.engine_id,
                    "role": self.engine.config.role,
                },
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.engine.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": self.engine.config.model,
                "parent": None,
                "max_model_len": self.engine.config.profile.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.engine.config.served_model_names
        ]
        return json_response({"object": "list", "data": data})

    async def _tokenize(self, request: web.Request) -> web.Response:
        try:
            body = protocol.parse_json_body(await request.read())
            result = protocol.tokenize(
                body,
                self.engine.config.served_model_names,
                self.engine.config.tokenizer,
                self.engine.config.profile.max_model_len,
            )
        except protocol.ApiError as exc:
            return json_response(exc.body(), exc.status)
        return json_response(result)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate("completion", request)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate("chat", request)

    def _new_request_id(self, request: web.Request, kind: protocol.Kind) -> str:
        base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        request_id = protocol.response_id(kind, base)
        if request_id in self.engine.streams or self.engine.core.has_request(request_id):
            request_id = f"{request_id}-{next(self._ids)}"
        return request_id

    async def _generate(self, kind: protocol.Kind, request: web.Request) -> web.StreamResponse:
        if self.engine.draining:
            return json_response(
                protocol.error_body(503, "ServiceUnavailableError", "The engine is shutting down."), 503
            )
        arrival_wall = time.monotonic()
        try:
            body = protocol.parse_json_body(await request.read())
            req = protocol.parse_generation(
                kind,
                body,
                self.engine.config.served_model_names,
                self.engine.config.tokenizer,
                self.engine.config.profile.max_model_len,
            )
            self._check_disagg(req)
        except protocol.ApiError as exc:
            return json_response(exc.body(), exc.status)
        request_id = self._new_request_id(request, kind)
        stream = Stream(queue=asyncio.Queue(), arrival_wall=arrival_wall)
        self.engine.streams[request_id] = stream
        finished = False
        try:
            await self.engine.before_admission(req)
            self.engine.core.add_request(
                EngineRequest(
                    request_id=request_id,
                    prompt_token_ids=req.prompt_token_ids,
                    output_tokens=req.output_tokens,
                    finish_reason=req.finish_reason,
                    remote_prefill=req.remote_prefill,
                    remote_decode=req.remote_decode,
                    disagg=req.disagg,
                ),
                self.engine.model_now(),
            )
            self.engine.wake()
            headers = {"X-Request-Id": request.headers.get("X-Request-Id", request_id)}
            response: web.StreamResponse
            if req.stream:
                response, finished = await self._stream_response(request, req, request_id, stream, headers)
            else:
                response, finished = await self._full_response(req, request_id, stream, headers)
            return response
        finally:
            del self.engine.streams[request_id]
            if not finished:
                self.engine.core.abort(request_id)
                self.engine.wake()

    def _check_disagg(self, req: protocol.GenerationRequest) -> None:
        tp = self.engine.config.profile.tensor_parallel
        pd = self.engine.config.pd
        if req.disagg is None or pd is None or pd.role != "sender":
            return
        if min(len(req.disagg.receiver_init_ports), len(req.disagg.receiver_alloc_ports)) < tp:
            param = "kv_transfer_params.disagg_spec"
            raise protocol.bad_request(
                f"{param} needs one receiver_init_port and receiver_alloc_port per TP rank ({tp})", param
            )

    def _first_token_id(self, req: protocol.GenerationRequest) -> int:
        ids = self.engine.config.tokenizer.encode(
            self.engine.config.tokenizer.output_piece(req.seed, req.answered)
        )
        return ids[0] if ids else 0

    async def _full_response(
        self, req: protocol.GenerationRequest, request_id: str, stream: Stream, headers: dict[str, str]
    ) -> tuple[web.Response, bool]:
        pieces: list[str] = []
        while True:
            event = await stream.queue.get()
            if isinstance(event, RequestFailed):
                return json_response(
                    protocol.error_body(500, "InternalServerError", event.message), 500, headers
                ), True
            pieces.append(self.engine.config.tokenizer.output_piece(req.seed, req.answered + event.index))
            if event.finish_reason is None:
                continue
            kv_params = None
            if event.kv_hold is not None:
                kv_params = protocol.kv_transfer_params_for(
                    self.engine.config.engine_id,
                    request_id,
                    event.kv_hold.block_ids,
                    self.engine.config.side_channel_host,
                    self.engine.side_channel_port or self.engine.config.side_channel_port,
                    self.engine.config.profile.tensor_parallel,
                    event.kv_hold.prompt_tokens,
                )
            elif req.ret_first_tok:
                kv_params = {"first_tok": self._first_token_id(req)}  # LMCache's request_finished
            body = protocol.full_response(
                req, request_id, "".join(pieces), len(pieces), event.finish_reason, kv_params
            )
            return json_response(body, 200, headers), True

    async def _stream_response(
        self,
        request: web.Request,
        req: protocol.GenerationRequest,
        request_id: str,
        stream: Stream,
        headers: dict[str, str],
    ) -> tuple[web.StreamResponse, bool]:
        response = web.StreamResponse(
            headers={
                **headers,
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        await response.prepare(request)
        encoder = protocol.StreamEncoder(req, request_id)
        write: Callable[[bytes], Awaitable[None]] = response.write
        tokens = 0
        try:
            role = encoder.role_chunk()
            if role is not None:
                await write(role)
            while True:
                event = await stream.queue.get()
                if isinstance(event, RequestFailed):
                    await write(encoder.error_chunk(500, "InternalServerError", event.message))
                    await write(encoder.done())
                    return response, True
                tokens += 1
                piece = self.engine.config.tokenizer.output_piece(req.seed, req.answered + event.index)
                if event.finish_reason is None:
                    await write(encoder.token_chunk(piece))
                    continue
                await write(encoder.final_chunk(piece, event.finish_reason))
                if req.include_usage:
                    await write(encoder.usage_chunk(tokens))
                await write(encoder.done())
                return response, True
        except ConnectionResetError:
            return response, False  # the client went away; the caller aborts the request
