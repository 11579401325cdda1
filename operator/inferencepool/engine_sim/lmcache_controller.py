"""A stand-in for LMCache 0.5.6's controller (`lmcache_controller`), wire-compatible with its engines.

Why not LMCache's own: its controller imports the token database (lmcache/v1/token_database.py imports
torch and transformers) and fastapi/uvicorn at start, so it cannot run in the CPU-only local cluster; its
protocol is small, so this module speaks it instead, on the same sockets and with the same bytes
(lmcache_wire.py):

- PULL socket, bound at --monitor-ports "pull" (controller_pull_url): DeRegisterMsg and BatchedKVOperationMsg
  from the engines' PUSH sockets (admit/evict of chunk hashes per instance, worker and location, each with a
  sequence number; a gap counts a discontinuity as LMCache does, utils.py WorkerNode).
- ROUTER socket, bound at "reply" (controller_reply_url): RegisterMsg -> RegisterRetMsg, HeartbeatMsg ->
  HeartbeatRetMsg, BatchedP2PLookupMsg -> BatchedP2PLookupRetMsg [(instance, location, hit chunks, peer
  init url)], anything else -> ErrorMsg, frames [identity, "", payload] as controller_manager.py
  handle_batched_req_request reads them.
- HTTP on --port: POST /lookup {"tokens": [...]} -> {"event_id", "layout_info": {instance: [location,
  tokens]}} as LMCache's api_server does; GET /controller/workers; GET /metrics with LMCache's controller
  gauges (lmcache:cache_controller_*).

The lookup semantics are kv_controller.py's: a p2p lookup finds the first registered instance other than the
asker holding the first hash (instances in registration order), then counts the leading hashes that same
worker and location hold.

Run: `python -m inferencepool.engine_sim.lmcache_controller --host H --port 9000 --monitor-ports
'{"pull": 8300, "reply": 8400}'` (the fake-engine image ships it as `lmcache_controller`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferencepool.engine_sim import lmcache_wire as wire
from inferencepool.engine_sim.httputil import app_runner, bound_port, error_response, json_response
from inferencepool.engine_sim.kv import CHUNK_TOKENS, lmcache_chunk_keys

log = logging.getLogger("inferencepool.lmcache_controller")

PUSH_MESSAGES = ("DeRegisterMsg", "BatchedKVOperationMsg", "FullSyncBatchMsg", "FullSyncEndMsg")
REQUEST_MESSAGES = (
    "RegisterMsg",
    "HeartbeatMsg",
    "BatchedP2PLookupMsg",
    "FullSyncStartMsg",
    "FullSyncStatusMsg",
)
NO_HIT = ("", "", 0, "")


@dataclass
class Worker:
    ip: str
    port: int
    peer_init_url: str | None
    registered_at: float
    last_heartbeat: float
    kv: dict[str, set[int]] = field(default_factory=dict)  # location -> chunk hashes
    seq: dict[str, int] = field(default_factory=dict)  # location -> last sequence number


class ControllerState:
    """The controller's registry (pure): instances in registration order, each with its workers' chunks."""

    def __init__(self) -> None:
        self.instances: dict[str, dict[int, Worker]] = {}
        self.seq_discontinuities = 0
        self.p2p_lookups = 0

    def register(
        self, instance_id: str, worker_id: int, ip: str, port: int, peer_init_url: str | None
    ) -> None:
        workers = self.instances.setdefault(instance_id, {})
        existing = workers.get(worker_id)
        if existing is not None:
            # as registration_controller.py: a duplicate keeps the worker and forgets its chunks
            existing.kv.clear()
            return
        now = time.time()
        workers[worker_id] = Worker(ip, port, peer_init_url, now, now)

    def deregister(self, instance_id: str, worker_id: int) -> None:
        workers = self.instances.get(instance_id)
        if workers is None:
            return
        workers.pop(worker_id, None)
        if not workers:
            del self.instances[instance_id]

    def heartbeat(self, instance_id: str, worker_id: int) -> bool:
        worker = self.instances.get(instance_id, {}).get(worker_id)
        if worker is None:
            return False
        worker.last_heartbeat = time.time()
        return True

    def kv_operations(
        self, instance_id: str, worker_id: int, location: str, operations: Sequence[Any]
    ) -> bool:
        worker = self.instances.get(instance_id, {}).get(worker_id)
        if worker is None:
            return False  # LMCache drops operations of an unregistered worker (and logs it)
        keys = worker.kv.setdefault(location, set())
        gap = False
        for op in operations:
            if not isinstance(op, dict) or op.get("op_type") not in (wire.ADMIT, wire.EVICT):
                raise wire.WireError(f"bad KVOpEvent {op!r}")
            key, seq = int(op["key"]), int(op["seq_num"])
            if op["op_type"] == wire.ADMIT:
                keys.add(key)
            else:
                keys.discard(key)
            last = worker.seq.get(location)
            if last is not None and seq != last + 1:
                gap = True
            worker.seq[location] = seq
        if not keys:
            worker.kv.pop(location, None)
        if gap:
            self.seq_discontinuities += 1
        return True

    def _find(self, key: int, exclude: str | None) -> tuple[str, Worker, str] | None:
        for instance_id, workers in list(self.instances.items()):
            if instance_id == exclude:
                continue
            for worker in list(workers.values()):
                for location, keys in worker.kv.items():
                    if key in keys:
                        return instance_id, worker, location
        return None

    def p2p_lookup(self, hashes: Sequence[int], instance_id: str) -> tuple[str, str, int, str]:
        """kv_controller.py batched_p2p_lookup: one peer, the leading run of hashes it holds."""
        self.p2p_lookups += 1
        if not hashes:
            return NO_HIT
        found = self._find(hashes[0], exclude=instance_id)
        if found is None:
            return NO_HIT
        holder, worker, location = found
        if worker.peer_init_url is None:
            return NO_HIT
        held = worker.kv.get(location, set())
        hits = 0
        for key in hashes:
            if key not in held:
                break
            hits += 1
        return holder, location, hits, worker.peer_init_url

    def lookup(
        self, token_ids: Sequence[int], chunk_tokens: int = CHUNK_TOKENS
    ) -> dict[str, tuple[str, int]]:
        """kv_controller.py lookup: per instance, the end of the longest prefix found (any instance)."""
        layout: dict[str, tuple[str, int]] = {}
        for index, key in enumerate(lmcache_chunk_keys(token_ids, chunk_tokens)):
            found = self._find(wire.chunk_hash(key), exclude=None)
            if found is None:
                break
            end = min((index + 1) * chunk_tokens, len(token_ids))
            layout[found[0]] = (found[2], end)
        return layout

    def key_count(self) -> int:
        return sum(
            len(keys)
            for workers in self.instances.values()
            for w in workers.values()
            for keys in w.kv.values()
        )

    def worker_count(self) -> int:
        return sum(len(workers) for workers in self.instances.values())


def handle_request(state: ControllerState, frame: bytes) -> bytes:
    """One REQ message -> its reply bytes (ErrorMsg for anything the controller would refuse)."""
    try:
        tag, msg = wire.decode(frame)
    except wire.WireError as exc:
        return wire.encode("ErrorMsg", error=str(exc))
    if tag not in REQUEST_MESSAGES:
        return wire.encode("ErrorMsg", error=f"Unknown message type: {tag}")
    if tag == "RegisterMsg":
        state.register(msg["instance_id"], msg["worker_id"], msg["ip"], msg["port"], msg["peer_init_url"])
        log.info(
            "registered %s worker %s at %s:%s", msg["instance_id"], msg["worker_id"], msg["ip"], msg["port"]
        )
        return wire.encode("RegisterRetMsg", extra_config={})
    if tag == "HeartbeatMsg":
        if not state.heartbeat(msg["instance_id"], msg["worker_id"]):
            state.register(msg["instance_id"], msg["worker_id"], msg["ip"], msg["port"], msg["peer_init_url"])
        return wire.encode("HeartbeatRetMsg", commands=[])
    if tag == "BatchedP2PLookupMsg":
        hashes = [int(h) for h in msg["hashes"]]
        return wire.encode(
            "BatchedP2PLookupRetMsg", layout_info=[list(state.p2p_lookup(hashes, msg["instance_id"]))]
        )
    return wire.encode("ErrorMsg", error=f"{tag} (full sync) is not modelled by the fake controller")


def handle_push(state: ControllerState, frame: bytes) -> None:
    try:
        tag, msg = wire.decode(frame, accepted=PUSH_MESSAGES)
        if tag == "DeRegisterMsg":
            state.deregister(msg["instance_id"], msg["worker_id"])
            log.info("deregistered %s worker %s", msg["instance_id"], msg["worker_id"])
        elif tag == "BatchedKVOperationMsg":
            if not state.kv_operations(
                msg["instance_id"], msg["worker_id"], msg["location"], msg["operations"]
            ):
                log.warning(
                    "KV operations from unregistered %s worker %s", msg["instance_id"], msg["worker_id"]
                )
        else:
            log.warning("%s (full sync) is not modelled by the fake controller", tag)
    except (wire.WireError, KeyError, TypeError, ValueError) as exc:
        log.error("dropped a malformed push message: %s", exc)


class _ControllerCollector(Collector):
    def __init__(self, state: ControllerState) -> None:
        self._state = state

    def collect(self) -> list[Metric]:
        gauges: list[Metric] = []
        for name, doc, value in (
            ("lmcache:cache_controller_kv_pool_keys_count", "Total number of KV keys in the controller pool",
             self._state.key_count()),
            ("lmcache:cache_controller_registered_workers_count", "Number of registered workers",
             self._state.worker_count()),
            ("lmcache:cache_controller_kv_op_seq_discontinuity_count",
             "Number of KV operation batches with a sequence number gap", self._state.seq_discontinuities),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(name, doc, labels=["role"])
            gauge.add_metric(["controller"], value)
            gauges.append(gauge)
        return gauges


class FakeLMCacheController:
    def __init__(self, host: str, port: int, pull_port: int, reply_port: int) -> None:
        self.state = ControllerState()
        self.host, self.port, self.pull_port, self.reply_port = host, port, pull_port, reply_port
        self.registry = CollectorRegistry()
        self.registry.register(_ControllerCollector(self.state))
        self._context = zmq.asyncio.Context()
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self._sockets: list[zmq.asyncio.Socket] = []

    async def start(self) -> None:
        pull = self._bind(zmq.PULL, self.pull_port)
        reply = self._bind(zmq.ROUTER, self.reply_port)
        self._tasks = [
            asyncio.create_task(self._pull_loop(pull)),
            asyncio.create_task(self._reply_loop(reply)),
        ]
        app = web.Application()
        app.add_routes(
            [
                web.post("/lookup", self._handle_lookup),
                web.get("/controller/workers", self._handle_workers),
                web.get("/metrics", self._handle_metrics),
            ]
        )
        self._runner = await app_runner(app)
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = bound_port(site)
        log.info(
            "fake LMCache controller on %s: http %s, pull %s, reply %s",
            self.host,
            self.port,
            self.pull_port,
            self.reply_port,
        )

    def _bind(self, kind: int, port: int) -> zmq.asyncio.Socket:
        socket = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        if ":" in self.host:
            socket.setsockopt(zmq.IPV6, 1)
        address = f"[{self.host}]" if ":" in self.host else self.host
        if port == 0:
            bound = socket.bind_to_random_port(f"tcp://{address}")
            if kind == zmq.PULL:
                self.pull_port = bound
            else:
                self.reply_port = bound
        else:
            socket.bind(f"tcp://{address}:{port}")
        self._sockets.append(socket)
        return socket

    async def _pull_loop(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            for frame in await socket.recv_multipart():  # one push may carry several messages
                handle_push(self.state, frame)

    async def _reply_loop(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            if len(frames) < 3:
                log.error("Invalid ROUTER message format, expected >= 3 frames, got %d", len(frames))
                continue
            await socket.send_multipart([frames[0], b"", handle_request(self.state, frames[2])])

    async def _handle_lookup(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
            tokens = [int(t) for t in body["tokens"]]
        except (ValueError, KeyError, TypeError) as exc:
            return error_response(422, "ValidationError", f'lookup needs {{"tokens": [int, ...]}}: {exc}')
        layout = self.state.lookup(tokens)
        return json_response(
            {"event_id": f"Lookup{uuid.uuid4()}", "layout_info": {k: list(v) for k, v in layout.items()}}
        )

    async def _handle_workers(self, request: web.Request) -> web.Response:
        workers = [
            {
                "instance_id": instance_id,
                "worker_id": worker_id,
                "ip": worker.ip,
                "port": worker.port,
                "peer_init_url": worker.peer_init_url,
                "registration_time": worker.registered_at,
                "last_heartbeat_time": worker.last_heartbeat,
                "key_count": sum(len(keys) for keys in worker.kv.values()),
            }
            for instance_id, members in self.state.instances.items()
            for worker_id, worker in members.items()
        ]
        return json_response({"total_count": len(workers), "workers": workers})

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain", charset="utf-8")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._runner is not None:
            await self._runner.cleanup()
        for socket in self._sockets:
            socket.close()
        self._context.term()


def build_parser() -> argparse.ArgumentParser:
    # lmcache/v1/api_server/__main__.py's flags
    parser = argparse.ArgumentParser(prog="lmcache_controller", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", default=None, help="controller YAML (controller_host, controller_port, ...)"
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument(
        "--monitor-ports", type=json.loads, default=None, help='e.g. \'{"pull": 8300, "reply": 8400}\''
    )
    parser.add_argument(
        "--monitor-port", type=int, default=9001, help="pull port when --monitor-ports is absent"
    )
    parser.add_argument("--health-check-interval", type=int, default=-1)
    parser.add_argument("--lmcache-worker-timeout", type=int, default=300)
    return parser


def apply_config_file(args: argparse.Namespace) -> None:
    """LMCache's --config file (cache_controller/config.py): its keys, where the command line left the
    defaults (LMCache lets the command line override the file)."""
    if not args.config:
        return
    import yaml

    try:
        loaded = yaml.safe_load(Path(args.config).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"lmcache_controller: --config {args.config}: {exc}") from None
    defaults = build_parser().parse_args([])
    for key, attribute in (
        ("controller_host", "host"),
        ("controller_port", "port"),
        ("controller_monitor_ports", "monitor_ports"),
    ):
        if key in loaded and getattr(args, attribute) == getattr(defaults, attribute):
            setattr(args, attribute, loaded[key])


def ports(args: argparse.Namespace) -> tuple[int, int]:
    if args.monitor_ports is None:
        raise SystemExit("lmcache_controller: the fake controller needs --monitor-ports with pull and reply")
    try:
        return int(args.monitor_ports["pull"]), int(args.monitor_ports["reply"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SystemExit(
            f"lmcache_controller: --monitor-ports needs integer pull and reply ports ({exc})"
        ) from None


async def serve(args: argparse.Namespace) -> None:
    pull, reply = ports(args)
    controller = FakeLMCacheController(args.host, args.port, pull, reply)
    await controller.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await controller.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args, _unknown = build_parser().parse_known_args(argv)  # LMCache takes extra key=value settings too
    apply_config_file(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
