"""The fake LMCache controller's registry and its wire format (pure): what LMCache 0.5.6's controller answers
(kv_controller.py, registration_controller.py, controller_manager.py), in msgspec's msgpack layout."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack  # type: ignore[import-untyped]
import pytest

from inferencepool.engine_sim import lmcache_wire as wire
from inferencepool.engine_sim.kv import chunk_hashes
from inferencepool.engine_sim.lmcache_controller import ControllerState, handle_push, handle_request
from inferencepool.engine_sim.lmcache_p2p import ControllerIndex, resolve_host


def register(state: ControllerState, instance: str, worker: int = 0, url: str | None = "h:1") -> bytes:
    return handle_request(
        state,
        wire.encode(
            "RegisterMsg", instance_id=instance, worker_id=worker, ip="10.0.0.1", port=8500, peer_init_url=url
        ),
    )


def admit(
    state: ControllerState, instance: str, keys: list[int], first_seq: int = 0, op: str = wire.ADMIT
) -> None:
    operations = [{"op_type": op, "key": k, "seq_num": first_seq + i} for i, k in enumerate(keys)]
    handle_push(
        state,
        wire.encode(
            "BatchedKVOperationMsg",
            instance_id=instance,
            worker_id=0,
            location="LocalCPUBackend",
            operations=operations,
        ),
    )


def p2p_lookup(state: ControllerState, asker: str, hashes: list[int]) -> list[object]:
    frame = handle_request(
        state, wire.encode("BatchedP2PLookupMsg", hashes=hashes, instance_id=asker, worker_id=0)
    )
    tag, body = wire.decode(frame)
    assert tag == "BatchedP2PLookupRetMsg"
    return list(body["layout_info"][0])


def test_messages_are_msgspec_tagged_maps_in_field_order() -> None:
    frame = wire.encode(
        "RegisterMsg", instance_id="pod-0", worker_id=1, ip="10.0.0.1", port=8501, peer_init_url=None
    )
    body = msgpack.unpackb(frame)
    assert list(body) == ["type", "instance_id", "worker_id", "ip", "port", "peer_init_url"]
    assert body["type"] == "RegisterMsg" and body["peer_init_url"] is None
    # defaults are written, as msgspec writes them
    assert msgpack.unpackb(wire.encode("RegisterRetMsg")) == {"type": "RegisterRetMsg", "extra_config": {}}
    # the controller also takes the same map as JSON
    assert wire.decode(json.dumps({"type": "ErrorMsg", "error": "x"}).encode()) == (
        "ErrorMsg",
        {"error": "x"},
    )


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (msgpack.packb({"type": "RegisterMsg", "instance_id": "a"}), "missing required field `worker_id`"),
        (msgpack.packb({"type": "NoSuchMsg"}), "Invalid value 'NoSuchMsg'"),
        (msgpack.packb([1, 2]), 'with a "type" tag'),
        (b"\xc1", "undecodable frame"),
        (
            msgpack.packb({"type": "BatchedP2PLookupRetMsg", "layout_info": "nope"}),
            "Expected `list`, got `str` - at `$.layout_info`",
        ),
        (msgpack.packb({"type": "HealthWorkerRetMsg", "error_code": True}), "got `bool`"),
    ],
)
def test_frames_lmcache_would_refuse_are_refused_with_msgspecs_words(frame: bytes, error: str) -> None:
    with pytest.raises(wire.WireError, match=error.replace("$", r"\$").replace("[", r"\[")):
        wire.decode(frame)


def test_the_reply_socket_answers_errors_as_error_messages() -> None:
    state = ControllerState()
    tag, body = wire.decode(handle_request(state, msgpack.packb({"type": "RegisterMsg"})))
    assert tag == "ErrorMsg" and "instance_id" in body["error"]
    tag, body = wire.decode(handle_request(state, wire.encode("HealthWorkerRetMsg", error_code=0)))
    assert (tag, body["error"]) == ("ErrorMsg", "Unknown message type: HealthWorkerRetMsg")


def test_p2p_lookup_finds_another_instance_and_counts_its_leading_run() -> None:
    state = ControllerState()
    assert wire.decode(register(state, "a", url="10.0.0.1:8200"))[0] == "RegisterRetMsg"
    register(state, "b", url="10.0.0.2:8200")
    admit(state, "a", [1, 2, 3, 5])
    assert p2p_lookup(state, "b", [1, 2, 3, 4, 5]) == ["a", "LocalCPUBackend", 3, "10.0.0.1:8200"]
    # the asker's own chunks are never offered back to it
    assert p2p_lookup(state, "a", [1, 2]) == ["", "", 0, ""]
    # the first hash decides the peer: a miss there is a miss, whatever comes after
    assert p2p_lookup(state, "b", [9, 1, 2]) == ["", "", 0, ""]
    assert p2p_lookup(state, "b", []) == ["", "", 0, ""]


def test_evictions_deregistration_and_duplicate_registration_forget_chunks() -> None:
    state = ControllerState()
    register(state, "a")
    admit(state, "a", [1, 2, 3])
    admit(state, "a", [2], first_seq=3, op=wire.EVICT)
    assert p2p_lookup(state, "b", [1, 2, 3])[2] == 1
    assert state.seq_discontinuities == 0
    admit(state, "a", [7], first_seq=9)  # seq 4..8 never arrived
    assert state.seq_discontinuities == 1
    register(state, "a")  # registering again keeps the worker, forgets its chunks (registration_controller)
    assert state.key_count() == 0 and state.worker_count() == 1
    admit(state, "a", [1])
    handle_push(state, wire.encode("DeRegisterMsg", instance_id="a", worker_id=0, ip="10.0.0.1", port=8500))
    assert state.worker_count() == 0 and p2p_lookup(state, "b", [1])[2] == 0


def test_a_worker_without_a_p2p_url_is_not_a_peer_and_unknown_workers_report_nothing() -> None:
    state = ControllerState()
    register(state, "a", url=None)
    admit(state, "a", [1])
    assert p2p_lookup(state, "b", [1]) == ["", "", 0, ""]
    admit(state, "ghost", [5])  # never registered: dropped, as LMCache drops it
    assert state.key_count() == 1


def test_http_lookup_reports_the_longest_prefix_per_instance() -> None:
    state = ControllerState()
    register(state, "a")
    tokens = list(range(700))
    keys = [wire.chunk_hash(k) for k in chunk_hashes(tokens, 256)]
    admit(state, "a", keys)  # two whole chunks; the 188-token tail is not stored (whole chunks only)
    assert state.lookup(tokens) == {"a": ("LocalCPUBackend", 512)}
    assert state.lookup(list(range(1000, 1300))) == {}


def test_the_engine_reports_what_its_cpu_tier_stores_and_learns_holders_from_lookups() -> None:
    index = ControllerIndex()
    index.add("e", b"k1" * 8)
    index.remove("e", b"k0" * 8)
    assert index.take_ops() == [
        (wire.ADMIT, wire.chunk_hash(b"k1" * 8)),
        (wire.EVICT, wire.chunk_hash(b"k0" * 8)),
    ]
    assert index.take_ops() == []
    index.learned([b"x"], "peer-a", [b"y"])
    assert index.holder(b"x", "e") == "peer-a" and index.holder(b"y", "e") is None
    index.learned([], "peer-a", [b"x"])  # a later lookup found it gone
    assert index.holder(b"x", "e") is None


def test_service_names_resolve_through_the_local_clusters_table(tmp_path: Path) -> None:
    table = tmp_path / "hosts.json"
    table.write_text(json.dumps({"ctl.default.svc": ["127.0.0.9"], "idle.default.svc": []}))
    env = {"INFERENCEPOOL_LOCAL_HOSTS": str(table)}
    assert resolve_host("ctl.default.svc", env) == "127.0.0.9"
    assert resolve_host("ctl.default.svc.cluster.local", env) == "127.0.0.9"
    assert resolve_host("idle.default.svc", env) is None  # no ready endpoint yet: wait
    assert resolve_host("other.default.svc", env) is None
    assert resolve_host("127.0.0.3", env) == "127.0.0.3"
    assert resolve_host("ctl.default.svc", {}) == "ctl.default.svc"  # elsewhere DNS does it
