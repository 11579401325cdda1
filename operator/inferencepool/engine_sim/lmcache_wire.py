"""LMCache 0.5.6's controller and p2p messages as bytes on the wire, without msgspec.

LMCache encodes its messages with msgspec (lmcache/v1/cache_controller/message.py, MsgBase and its
subclasses; p2p_backend.py, P2PMsgBase; transfer_channel/transfer_utils.py and nixl_channel.py for the p2p
handshake): every message is a msgspec.Struct with tag=True, which msgspec.msgpack.encode writes as a msgpack
map whose first key is "type" (the class name), then every field in definition order, base classes' first,
defaults included; enums as their values, tuples as arrays, bytes as bin. The controller also accepts the same
map as JSON (controller_manager.py, handle_batched_push_request: a frame starting with "{"). This module
writes and reads exactly that with msgpack, and checks decoded messages as msgspec would: a known tag, every
required field present with a value of the right type (tests/contract/test_lmcache_wire.py checks the field
lists against the wheel's classes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # ships no type hints

TAG: Final = "type"
# Where LMCache's CPU tier reports its chunks from (LocalCPUBackend.__str__ is the class name).
CPU_LOCATION: Final = "LocalCPUBackend"

_STR, _INT, _OPT_STR, _LIST, _DICT, _BYTES = (str,), (int,), (str, type(None)), (list,), (dict,), (bytes,)

# Message name -> its fields in definition order (base classes first) with the Python types msgspec accepts
# for them (bool is refused where an int is due, as msgspec does).
FIELDS: Final[Mapping[str, tuple[tuple[str, tuple[type, ...]], ...]]] = {
    # engine -> controller, REQ (DEALER to the controller's ROUTER reply socket)
    "RegisterMsg": (
        ("instance_id", _STR), ("worker_id", _INT), ("ip", _STR), ("port", _INT), ("peer_init_url", _OPT_STR),
    ),
    "HeartbeatMsg": (
        ("instance_id", _STR), ("worker_id", _INT), ("ip", _STR), ("port", _INT), ("peer_init_url", _OPT_STR),
    ),
    "BatchedP2PLookupMsg": (("hashes", _LIST), ("instance_id", _STR), ("worker_id", _INT)),
    "FullSyncStartMsg": (
        ("instance_id", _STR), ("worker_id", _INT), ("location", _STR), ("sync_id", _STR),
        ("total_keys", _INT), ("batch_count", _INT),
    ),
    "FullSyncStatusMsg": (("instance_id", _STR), ("worker_id", _INT), ("sync_id", _STR)),
    # engine -> controller, PUSH (to the controller's PULL socket)
    "DeRegisterMsg": (("instance_id", _STR), ("worker_id", _INT), ("ip", _STR), ("port", _INT)),
    "BatchedKVOperationMsg": (
        ("instance_id", _STR), ("worker_id", _INT), ("location", _STR), ("operations", _LIST),
    ),
    "FullSyncBatchMsg": (
        ("instance_id", _STR), ("worker_id", _INT), ("location", _STR), ("sync_id", _STR),
        ("batch_id", _INT), ("keys", _LIST),
    ),
    "FullSyncEndMsg": (
        ("instance_id", _STR), ("worker_id", _INT), ("location", _STR), ("sync_id", _STR),
        ("actual_total_keys", _INT),
    ),
    # controller -> engine, replies
    "RegisterRetMsg": (("extra_config", _DICT),),
    "HeartbeatRetMsg": (("commands", _LIST),),
    "BatchedP2PLookupRetMsg": (("layout_info", _LIST),),
    "ErrorMsg": (("error", _STR),),
    # controller -> engine worker socket (REQ to the worker's REP on lmcache_worker_ports)
    "HealthWorkerMsg": (("worker_event_id", _STR),),
    "HealthWorkerRetMsg": (("error_code", _INT),),
    # engine -> engine: the p2p transfer channel's handshake on p2p_init_ports (NIXL, then the side message)
    "NixlInitRequest": (("local_meta_bytes", _BYTES),),
    "NixlInitResponse": (("remote_agent_name", _BYTES), ("remote_meta_bytes", _BYTES)),
    "NixlMemRegRequest": (
        ("remote_agent_name", _BYTES), ("local_id", _STR), ("local_xfer_dlist_bytes", _BYTES),
    ),
    "NixlMemRegResponse": (("remote_xfer_dlist_bytes", _BYTES),),
    "P2PInitSideMsg": (),
    "P2PInitSideRetMsg": (("peer_lookup_url", _STR),),
    # engine -> engine: lookup-and-get on p2p_lookup_ports
    "BatchedLookupAndGetMsg": (
        ("lookup_id", _STR), ("receiver_id", _STR), ("keys", _LIST), ("mem_indexes", _LIST),
    ),
    "BatchedLookupAndGetRetMsg": (("num_hit_chunks", _INT),),
    "P2PErrorMsg": (("error_code", _INT),),
}  # fmt: skip
# Fields with a default in LMCache's classes: absent from a decoded map, they take it.
DEFAULTS: Final[Mapping[str, Mapping[str, Any]]] = {
    "RegisterRetMsg": {"extra_config": {}},
    "HeartbeatRetMsg": {"commands": []},
}
# P2PErrorCode (p2p_backend.py, enum.auto()): msgspec writes an enum as its value.
P2P_SERVER_ERROR: Final = 1
UNKNOWN_MSG_TYPE: Final = 2
REMOTE_XFER_HANDLER_NOT_INITIALIZED: Final = 3
# OpType values (message.py)
ADMIT: Final = "admit"
EVICT: Final = "evict"


class WireError(ValueError):
    """A frame that is not a message LMCache would decode; the text says what is wrong (msgspec's words)."""


def encode(tag: str, **fields: Any) -> bytes:
    """One message as msgspec.msgpack.encode writes it: the tag, then every field in definition order."""
    spec = FIELDS.get(tag)
    if spec is None:
        raise WireError(f"unknown message type {tag!r}")
    names = [name for name, _ in spec]
    extra = set(fields) - set(names)
    if extra:
        raise WireError(f"{tag} has no field(s) {', '.join(sorted(extra))}")
    body: dict[str, Any] = {TAG: tag}
    defaults = DEFAULTS.get(tag, {})
    for name in names:
        if name in fields:
            body[name] = fields[name]
        elif name in defaults:
            body[name] = defaults[name]
        else:
            raise WireError(f"{tag} needs field {name!r}")
    return bytes(msgpack.packb(body, use_bin_type=True))


def decode(frame: bytes, accepted: Sequence[str] | None = None) -> tuple[str, dict[str, Any]]:
    """(tag, fields) of one frame: msgpack, or JSON when it starts with "{" (the controller accepts both)."""
    try:
        if frame.startswith(b"{"):
            body = json.loads(frame)
        else:
            body = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise WireError(f"undecodable frame: {exc.__class__.__name__}: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get(TAG), str):
        raise WireError(f'Expected `object` with a "{TAG}" tag')
    tag = body.pop(TAG)
    spec = FIELDS.get(tag)
    if spec is None or (accepted is not None and tag not in accepted):
        raise WireError(f"Invalid value {tag!r} - at `$.{TAG}`")
    defaults = DEFAULTS.get(tag, {})
    for name, types in spec:
        if name not in body:
            if name in defaults:
                body[name] = defaults[name]
                continue
            raise WireError(f"Object missing required field `{name}`")
        value = body[name]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise WireError(f"Expected `{types[0].__name__}`, got `{type(value).__name__}` - at `$.{name}`")
    return tag, body


def chunk_hash(key: bytes) -> int:
    """An engine's chunk key as LMCache's int chunk_hash (a signed 64-bit int fits msgpack's int64)."""
    return int.from_bytes(key[:8], "big", signed=True)


def cache_engine_key(model: str, world_size: int, worker_id: int, key: bytes, dtype: str = "bfloat16") -> str:
    """CacheEngineKey.to_string (lmcache/utils.py): model@world_size@worker_id@chunk_hash_hex@dtype."""
    return f"{model}@{world_size}@{worker_id}@{chunk_hash(key):x}@{dtype}"


def agent_name(peer_init_url: str) -> bytes:
    """A stable stand-in for a NIXL agent name (real ones are uuids the agent picks)."""
    return hashlib.blake2b(peer_init_url.encode(), digest_size=8).hexdigest().encode()
