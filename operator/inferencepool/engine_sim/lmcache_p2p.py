"""LMCache p2p (enable_p2p with its controller) on the wire: the fake engine's LMCache workers, one per TP
rank.

As LMCache 0.5.6 does (docs/engine-contract.md, "LMCache p2p"), each rank:

- registers with the controller (RegisterMsg on a DEALER socket to controller_reply_url; one try that waits
  up to 30 s for the answer, cache_controller/worker.py register: a worker that could not register never
  starts pushing, so its chunks stay unknown to the controller);
- reports every chunk its CPU tier stores or evicts (BatchedKVOperationMsg on a PUSH socket to
  controller_pull_url, batched every kv_msg_batch_timeout, sequence numbers from 0 per rank:
  storage_backend/batched_message_sender.py);
- answers peers on its p2p sockets: the transfer channel's handshake on p2p_init_ports (NixlInitRequest,
  NixlMemRegRequest, then P2PInitSideMsg -> the lookup URL: transfer_channel/nixl_channel.py) and
  BatchedLookupAndGetMsg on p2p_lookup_ports (how many of the asked chunks it still holds, which it then
  writes into the asker's buffers: p2p_backend.py _handle_batched_lookup_and_get), timing each transfer in
  lmcache:p2p_time_to_transfer and lmcache:p2p_transfer_speed as LMCache does on the serving side;
- answers the controller's health checks on lmcache_worker_ports (HealthWorkerMsg).

A request's lookup (p2p_backend.py batched_async_contains) asks the controller for the chunks beyond the
leading run this engine's own CPU tier holds (BatchedP2PLookupMsg -> one peer and its hit count), then asks
that peer for them (BatchedLookupAndGetMsg); the chunks the peer confirms are what the core loads from it,
at the modelled transfer cost. A NIXL decode leg is only looked up: NIXL loads it (server.py
before_admission). The lookup runs before the request enters the engine (LMCache's lookup runs
while vLLM schedules it, the transfer when it loads: the cost is charged at admission either way). Lookups
and transfers go through rank 0 only; the other ranks register and report like it (each rank's shard moves
in parallel in LMCache, which the transfer time already models).

The controller's host resolves through the local cluster's Service table when the pod runner provides one
(INFERENCEPOOL_LOCAL_HOSTS), since there is no cluster DNS on the local control plane; elsewhere the name is
dialled as given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from prometheus_client import Histogram

from inferencepool.engine_sim import lmcache_wire as wire
from inferencepool.engine_sim.config import P2PConfig
from inferencepool.engine_sim.host import EngineHost
from inferencepool.engine_sim.kv import chunk_hashes
from inferencepool.perf import timing

log = logging.getLogger("inferencepool.fake_engine")

LOCAL_HOSTS_ENV = "INFERENCEPOOL_LOCAL_HOSTS"
HOLDERS_KEPT = 65536  # peer holdings remembered from lookups (a lookup refreshes those it covers)
# lmcache/observability.py: p2p_time_to_transfer and p2p_transfer_speed buckets
P2P_TIME_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
P2P_SPEED_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class ControllerIndex:
    """The core's view of p2p through a controller (a kv.PrefixIndex): what the CPU tier stores or evicts
    becomes admit/evict operations to report; which peer holds a chunk is what this engine's lookups
    learned."""

    def __init__(self) -> None:
        self._ops: list[tuple[str, int]] = []
        self._holders: OrderedDict[bytes, str] = OrderedDict()

    def add(self, engine_id: str, key: bytes) -> None:
        self._ops.append((wire.ADMIT, wire.chunk_hash(key)))

    def remove(self, engine_id: str, key: bytes) -> None:
        self._ops.append((wire.EVICT, wire.chunk_hash(key)))

    def holder(self, key: bytes, excluding: str) -> str | None:
        return self._holders.get(key)

    def take_ops(self) -> list[tuple[str, int]]:
        ops, self._ops = self._ops, []
        return ops

    def learned(self, held: Sequence[bytes], holder: str, missing: Sequence[bytes]) -> None:
        for key in held:
            self._holders[key] = holder
            self._holders.move_to_end(key)
        for key in missing:
            self._holders.pop(key, None)
        while len(self._holders) > HOLDERS_KEPT:
            self._holders.popitem(last=False)


def resolve_host(host: str, env: dict[str, str] | None = None) -> str | None:
    """The address to dial for `host`: from the local cluster's Service table when there is one (None while
    the Service has no ready endpoint there), else `host` itself."""
    environ = os.environ if env is None else env
    path = environ.get(LOCAL_HOSTS_ENV)
    if not path:
        return host
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    for name in (host, host.removesuffix(".cluster.local")):
        addresses = table.get(name)
        if addresses:
            return str(addresses[0])
    return host if host not in table and not host.endswith(".svc") else None


def split_url(url: str) -> tuple[str, int]:
    host, _, port = url.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"LMCache settings: {url!r} is not host:port")
    return host.strip("[]"), int(port)


def tcp(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class P2PWorker:
    def __init__(self, engine: EngineHost, p2p: P2PConfig, index: ControllerIndex) -> None:
        self.engine = engine
        self.p2p = p2p
        self.index = index
        self.ranks = engine.config.profile.tensor_parallel
        self._context = zmq.asyncio.Context()
        self._sockets: list[zmq.asyncio.Socket] = []
        self.init_ports: list[int] = []
        self.lookup_ports: list[int] = []
        self.worker_ports: list[int] = []
        self._receivers: set[str] = set()  # peers whose handshake registered their buffers here
        self._peers: dict[str, str] = {}  # peer init url -> its lookup url, once handshaken
        self._push: zmq.asyncio.Socket | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._dealer_lock = asyncio.Lock()
        self.registered = asyncio.Event()
        self.registration_failed: str | None = None
        self._seq = [0] * self.ranks
        registry, labels = (
            engine.metrics.registry,
            (engine.config.model, "worker", engine.config.served_model_names[0]),
        )
        names = ("model_name", "role", "served_model_name", "worker_id")
        self.time_to_transfer = Histogram(
            "lmcache:p2p_time_to_transfer", "Time to transfer via P2P (seconds)", names,
            buckets=P2P_TIME_BUCKETS, registry=registry,
        )  # fmt: skip
        self.transfer_speed = Histogram(
            "lmcache:p2p_transfer_speed", "P2P transfer speed (tokens per second)", names,
            buckets=P2P_SPEED_BUCKETS, registry=registry,
        )  # fmt: skip
        self._labels = labels

    # ----- start and stop -----

    async def start(self) -> None:
        p2p = self.p2p
        for rank in range(self.ranks):
            init = self._bind(zmq.REP, p2p.init_ports[rank])
            lookup = self._bind(zmq.REP, p2p.lookup_ports[rank])
            worker = self._bind(zmq.REP, p2p.worker_ports[rank])
            self.init_ports.append(self._port(init))
            self.lookup_ports.append(self._port(lookup))
            self.worker_ports.append(self._port(worker))
            self.engine.spawn(self._serve(init, self._handle_init, rank))
            self.engine.spawn(self._serve(lookup, self._handle_lookup, rank))
            self.engine.spawn(self._serve(worker, self._handle_worker, rank))
        self.engine.spawn(self._register_and_report())
        log.info(
            "LMCache p2p on %s: init ports %s, lookup ports %s, worker ports %s; controller %s / %s",
            p2p.host, self.init_ports, self.lookup_ports, self.worker_ports, p2p.controller_pull,
            p2p.controller_reply,
        )  # fmt: skip

    def _bind(self, kind: int, port: int) -> zmq.asyncio.Socket:
        socket = self._socket(kind)
        host = self.p2p.host
        if port == 0:
            socket.bind_to_random_port(tcp(host, 0).rsplit(":", 1)[0])
        else:
            socket.bind(tcp(host, port))  # a busy port fails the engine, as LMCache's bind would
        return socket

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        socket = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.IPV6, 1)
        self._sockets.append(socket)
        return socket

    @staticmethod
    def _port(socket: zmq.asyncio.Socket) -> int:
        endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(endpoint, bytes)
        return int(endpoint.rsplit(b":", 1)[1])

    def init_url(self, rank: int) -> str:
        return f"{self.p2p.host}:{self.init_ports[rank]}"

    async def close(self) -> None:
        """Deregister every rank (LMCacheWorker.close), then close the sockets."""
        if self._push is not None and self.registered.is_set():
            for rank in range(self.ranks):
                with contextlib.suppress(zmq.ZMQError):
                    await self._push.send(self._deregister(rank), flags=zmq.NOBLOCK)
            await asyncio.sleep(0.05)  # let the PUSH socket hand the messages over
        for socket in self._sockets:
            socket.close(linger=0)
        self._context.term()

    def _deregister(self, rank: int) -> bytes:
        return wire.encode(
            "DeRegisterMsg",
            instance_id=self.p2p.instance_id,
            worker_id=rank,
            ip=self.p2p.host,
            port=self.worker_ports[rank],
        )

    # ----- the controller -----

    async def _connect(self) -> None:
        """Dial the controller; on the local cluster, wait until its Service has an address (LMCache's
        sockets would retry DNS the same way, within the registration timeout)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.p2p.recv_timeout_s
        pull_host, pull_port = split_url(self.p2p.controller_pull)
        reply_host, reply_port = split_url(self.p2p.controller_reply)
        while True:
            pull, reply = resolve_host(pull_host), resolve_host(reply_host)
            if pull is not None and reply is not None:
                break
            if loop.time() > deadline:
                raise TimeoutError(f"the LMCache controller Service {reply_host} has no address")
            await asyncio.sleep(0.5)
        self._push = self._socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDTIMEO, int(self.p2p.send_timeout_s * 1000))
        self._push.connect(tcp(pull, pull_port))
        self._dealer = self._socket(zmq.DEALER)
        self._dealer.connect(tcp(reply, reply_port))

    async def _request(self, frame: bytes) -> tuple[str, dict[str, Any]]:
        """One request on the DEALER socket and its answer; the socket is recreated after a timeout, as
        LMCache does (worker.py async_put_and_wait_msg)."""
        async with self._dealer_lock:
            assert self._dealer is not None
            try:
                async with asyncio.timeout(
                    self.p2p.send_timeout_s
                ):  # not wait_for (3.11, see router/http1.py)
                    await self._dealer.send_multipart([b"", frame])
                async with asyncio.timeout(self.p2p.recv_timeout_s):
                    frames = await self._dealer.recv_multipart()
            except (TimeoutError, zmq.ZMQError):
                self._dealer.close(linger=0)
                self._dealer = self._socket(zmq.DEALER)
                self._dealer.connect(tcp(*self._reply_address()))
                raise
        return wire.decode(frames[-1])

    def _reply_address(self) -> tuple[str, int]:
        host, port = split_url(self.p2p.controller_reply)
        return resolve_host(host) or host, port

    async def _register_and_report(self) -> None:
        try:
            await self._connect()
            for rank in range(self.ranks):
                tag, answer = await self._request(
                    wire.encode(
                        "RegisterMsg",
                        instance_id=self.p2p.instance_id,
                        worker_id=rank,
                        ip=self.p2p.host,
                        port=self.worker_ports[rank],
                        peer_init_url=self.init_url(rank),
                    )
                )
                if tag != "RegisterRetMsg":
                    raise wire.WireError(f"the controller answered {tag} {answer}")
        except (TimeoutError, zmq.ZMQError, wire.WireError, ValueError) as exc:
            # LMCache 0.5.6 logs this and its worker stops: no admit/evict reports, so no peer ever fetches
            # from this engine (lookups of its own still go to the controller).
            self.registration_failed = f"{exc.__class__.__name__}: {exc}"
            log.error(
                "LMCache worker of instance %s could not register with the controller at %s: %s; it reports "
                "no chunks (restart the engine once the controller is up)",
                self.p2p.instance_id, self.p2p.controller_reply, self.registration_failed,
            )  # fmt: skip
            return
        self.registered.set()
        log.info("LMCache instance %s registered %d worker(s)", self.p2p.instance_id, self.ranks)
        while True:
            await asyncio.sleep(self.p2p.batch_timeout_s)
            ops = self.index.take_ops()
            if ops:
                await self._report(ops)

    async def _report(self, ops: list[tuple[str, int]]) -> None:
        assert self._push is not None
        frames = []
        for rank in range(self.ranks):
            operations = []
            for op_type, key in ops:
                operations.append({"op_type": op_type, "key": key, "seq_num": self._seq[rank]})
                self._seq[rank] += 1
            frames.append(
                wire.encode(
                    "BatchedKVOperationMsg",
                    instance_id=self.p2p.instance_id,
                    worker_id=rank,
                    location=wire.CPU_LOCATION,
                    operations=operations,
                )
            )
        try:
            await self._push.send_multipart(frames)
        except zmq.ZMQError as exc:
            log.error("LMCache KV operations not reported to the controller: %s", exc)

    # ----- a request's lookup (the fetching side) -----

    async def lookup(self, prompt_token_ids: Sequence[int], fetch: bool = True) -> None:
        """Find the prompt's chunks beyond this engine's CPU tier at a peer; what the peer confirms, the core
        loads from it. Without `fetch` (another connector loads this request) only the controller is asked."""
        core = self.engine.core
        chunk = core.pool.chunk_tokens
        if core.cpu_store is None or core.lmcache is None or not core.lmcache.load:
            return
        keys = chunk_hashes(prompt_token_ids, chunk, limit_tokens=len(prompt_token_ids) - 1)
        start = 0
        while start < len(keys) and keys[start] in core.cpu_store:
            start += 1
        wanted = keys[start:]
        if not wanted or self._dealer is None:
            return
        lookup_id = uuid.uuid4().hex
        try:
            tag, answer = await self._request(
                wire.encode(
                    "BatchedP2PLookupMsg",
                    hashes=[wire.chunk_hash(k) for k in wanted],
                    instance_id=self.p2p.instance_id,
                    worker_id=0,
                )
            )
            if tag != "BatchedP2PLookupRetMsg":
                raise wire.WireError(f"the controller answered {tag} {answer}")
            holder, _location, hits, peer_init_url = answer["layout_info"][0]
            if not fetch:
                return
            confirmed = await self._fetch(lookup_id, str(peer_init_url), wanted[: int(hits)]) if hits else 0
        except (TimeoutError, zmq.ZMQError, wire.WireError, ValueError, KeyError, IndexError) as exc:
            log.warning("LMCache p2p lookup failed, computing the prompt locally: %s", exc)
            return
        self.index.learned(wanted[:confirmed], str(holder), wanted[confirmed:])

    async def _fetch(self, lookup_id: str, peer_init_url: str, keys: Sequence[bytes]) -> int:
        """The peer's own count of the chunks it still holds (it writes them into this engine's buffers)."""
        lookup_url = self._peers.get(peer_init_url) or await self._handshake(peer_init_url)
        config = self.engine.config
        message = wire.encode(
            "BatchedLookupAndGetMsg",
            lookup_id=lookup_id,
            receiver_id=self.init_url(0),
            keys=[wire.cache_engine_key(config.model, self.ranks, 0, k) for k in keys],
            mem_indexes=list(range(len(keys))),
        )
        tag, answer = await self._exchange(lookup_url, [message])
        if tag != "BatchedLookupAndGetRetMsg":
            self._peers.pop(peer_init_url, None)  # LMCache re-handshakes after an error (force_update)
            raise wire.WireError(f"peer {peer_init_url} answered {tag} {answer}")
        return min(int(answer["num_hit_chunks"]), len(keys))

    async def _handshake(self, peer_init_url: str) -> str:
        """The transfer channel's lazy init (nixl_channel.py async_lazy_init_peer_connection), then the p2p
        side message that names the peer's lookup URL."""
        own = self.init_url(0)
        _, first = await self._exchange(
            peer_init_url,
            [wire.encode("NixlInitRequest", local_meta_bytes=b"fake-nixl-agent:" + own.encode())],
        )
        frames = [
            wire.encode(
                "NixlMemRegRequest",
                remote_agent_name=first.get("remote_agent_name", b""),
                local_id=own,
                local_xfer_dlist_bytes=b"",
            ),
            wire.encode("P2PInitSideMsg"),
        ]
        tag, answer = await self._exchange(peer_init_url, frames)
        if tag != "P2PInitSideRetMsg":
            raise wire.WireError(f"peer {peer_init_url} answered the p2p init with {tag} {answer}")
        self._peers[peer_init_url] = str(answer["peer_lookup_url"])
        return self._peers[peer_init_url]

    async def _exchange(self, url: str, frames: Sequence[bytes]) -> tuple[str, dict[str, Any]]:
        """Send each frame on one REQ socket, in turn, and return the last answer."""
        host, port = split_url(url)
        socket = self._socket(zmq.REQ)
        try:
            socket.connect(tcp(host, port))
            answer: tuple[str, dict[str, Any]] = ("", {})
            for frame in frames:
                async with asyncio.timeout(self.p2p.send_timeout_s):
                    await socket.send(frame)
                async with asyncio.timeout(self.p2p.recv_timeout_s):
                    answer = wire.decode(await socket.recv())
            return answer
        finally:
            socket.close(linger=0)
            self._sockets.remove(socket)

    # ----- the serving side -----

    async def _serve(self, socket: zmq.asyncio.Socket, handle: Any, rank: int) -> None:
        while True:
            frame = await socket.recv()
            try:
                reply = handle(frame, rank)
            except Exception as exc:  # a REP socket must answer whatever happened
                log.error("LMCache p2p request failed: %s", exc)
                reply = wire.encode("P2PErrorMsg", error_code=wire.P2P_SERVER_ERROR)
            await socket.send(reply)

    def _handle_init(self, frame: bytes, rank: int) -> bytes:
        tag, msg = wire.decode(frame)
        if tag == "NixlInitRequest":
            return wire.encode(
                "NixlInitResponse",
                remote_agent_name=wire.agent_name(self.init_url(rank)),
                remote_meta_bytes=b"fake-nixl-agent:" + self.init_url(rank).encode(),
            )
        if tag == "NixlMemRegRequest":
            self._receivers.add(str(msg["local_id"]))
            return wire.encode("NixlMemRegResponse", remote_xfer_dlist_bytes=b"")
        if tag == "P2PInitSideMsg":
            return wire.encode(
                "P2PInitSideRetMsg", peer_lookup_url=f"{self.p2p.host}:{self.lookup_ports[rank]}"
            )
        return wire.encode("P2PErrorMsg", error_code=wire.UNKNOWN_MSG_TYPE)

    def _handle_lookup(self, frame: bytes, rank: int) -> bytes:
        tag, msg = wire.decode(frame)
        if tag != "BatchedLookupAndGetMsg":
            return wire.encode("P2PErrorMsg", error_code=wire.UNKNOWN_MSG_TYPE)
        if msg["receiver_id"] not in self._receivers:
            return wire.encode("P2PErrorMsg", error_code=wire.REMOTE_XFER_HANDLER_NOT_INITIALIZED)
        core = self.engine.core
        store = core.cpu_store
        held = {wire.chunk_hash(k) for k in store.chunks()} if store is not None else set()
        hits = 0
        for key in msg["keys"]:
            if int(str(key).split("@")[3], 16) not in held:
                break
            hits += 1
        tokens = hits * core.pool.chunk_tokens
        seconds = timing.nixl_transfer_time(core.profile, tokens) * self.engine.config.time_scale
        labels = (*self._labels, str(rank))
        self.time_to_transfer.labels(*labels).observe(seconds)
        if seconds > 0:
            self.transfer_speed.labels(*labels).observe(tokens / seconds)
        core.stats.lmcache_p2p_served_tokens += tokens
        return wire.encode("BatchedLookupAndGetRetMsg", num_hit_chunks=hits)

    def _handle_worker(self, frame: bytes, rank: int) -> bytes:
        tag, _ = wire.decode(frame)
        if tag == "HealthWorkerMsg":
            return wire.encode("HealthWorkerRetMsg", error_code=0)
        return wire.encode("ErrorMsg", error=f"{tag} is not modelled by the fake engine")
