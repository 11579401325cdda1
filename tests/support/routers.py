"""A router serving on loopback that discovers its pool's engine pods from the API server, as in a cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from inferencepool.router.config import RouterConfig
from inferencepool.router.discovery import PodWatcher
from inferencepool.router.server import Router, serve
from inferencepool.router.tokens import EstimateCounter


@contextlib.asynccontextmanager
async def discovering_router(config: RouterConfig) -> AsyncIterator[tuple[Router, str]]:
    """Yield the router and its base URL; its endpoint table follows the pool's Pods through a PodWatcher."""
    assert config.pool is not None
    router = Router(config, EstimateCounter())
    watcher = PodWatcher(config.pool, config.namespace, "http", router.pods.apply, asyncio.get_running_loop())
    watcher.start()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(serve(router, "127.0.0.1", 0, on_listening=bound.set_result, stop=stop))
    try:
        yield router, f"http://127.0.0.1:{await bound}"
    finally:
        stop.set()
        watcher.stop()
        await asyncio.wait_for(task, 30)
