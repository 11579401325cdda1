"""aiohttp helpers the fake engine's listeners share."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from inferencepool.engine_sim import protocol

# drain() already waited for streams; on cleanup, whatever is still open is cut after this
CUT_OPEN_STREAMS_AFTER_S = 0.5


def json_response(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=json.dumps(body).encode(), status=status, content_type="application/json", headers=headers
    )


def error_response(status: int, err_type: str, message: str) -> web.Response:
    return json_response(protocol.error_body(status, err_type, message), status)


def bound_port(site: web.TCPSite) -> int:
    server = site._server
    assert server is not None and isinstance(server, asyncio.base_events.Server)
    port: int = server.sockets[0].getsockname()[1]
    return port


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def app_runner(app: web.Application, cancel_on_disconnect: bool = False) -> web.AppRunner:
    """A set-up runner that cuts open connections shortly after cleanup starts; with `cancel_on_disconnect`,
    a handler whose client closed its connection is cancelled (vLLM's API server: `with_cancellation`)."""
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=CUT_OPEN_STREAMS_AFTER_S,
        handler_cancellation=cancel_on_disconnect,
    )
    await runner.setup()
    return runner
