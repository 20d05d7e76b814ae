"""Incremental snapshots of one collection (the standalone API): watermarks, chunks, types, restart."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp, json_util
from pymongo import MongoClient
from pymongo.database import Database

from mongocdc_core.api import incremental_snapshot_collection
from mongocdc_core.source.errors import CdcError
from mongocdc_core.source.incremental import (
    IncrementalState,
    bson_bracket,
    key_identity,
    past_maximum,
)

from .support import MemorySink, cluster_time, make_config, payload, reads


def _close_times(client: MongoClient[Any], db: str, start: Timestamp, strategy: str) -> list[tuple[int, int]]:
    """clusterTimes of the window-closing events in the signaling collection since ``start``."""
    found = []
    with client[db]["signals"].watch([], start_at_operation_time=start, max_await_time_ms=100) as stream:
        while (event := stream.try_next()) is not None:
            doc_id = event["documentKey"]["_id"]
            closing = (event["operationType"] == "insert" and doc_id.endswith("-close")) or (
                event["operationType"] == "delete" and doc_id.endswith("-open")
            )
            if closing:
                found.append((event["clusterTime"].time, event["clusterTime"].inc))
    return found


@pytest.mark.parametrize("strategy", ["insert_insert", "insert_delete"])
def test_chunks_between_watermarks(mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any], strategy: str) -> None:
    db = fresh_db.name
    fresh_db.items.insert_many([{"_id": i, "v": f"value {i}"} for i in range(230)])
    cfg = make_config(mongo_uri, db, **{
        "incremental.snapshot.chunk.size": 50, "incremental.snapshot.watermarking.strategy": strategy,
    })
    start = cluster_time(mongo_client)
    sink = MemorySink()
    result = incremental_snapshot_collection(cfg, f"{db}.items", sink)

    records = reads(sink, f"{db}.items")
    assert result.documents == len(records) == 230
    values = [payload(r) for r in records]
    assert [orjson.loads(v["after"])["_id"] for v in values] == list(range(230))
    assert {v["op"] for v in values} == {"r"} and {v["source"]["snapshot"] for v in values} == {"incremental"}
    # each chunk's reads carry the position of its closing watermark
    positions = sorted({(r.position.seconds, r.position.increment) for r in records})
    assert positions == _close_times(mongo_client, db, start, strategy)
    assert len(positions) == 5
    assert result.first_position is not None and result.last_position is not None
    assert (result.first_position.seconds, result.first_position.increment) == positions[0]
    left = list(fresh_db.signals.find({}, {"_id": 1}))
    if strategy == "insert_insert":
        assert len(left) == 10  # an open and a close document per window
    else:
        assert left == []  # insert_delete removes each open watermark, writes no close


MIXED_IDS: list[Any] = [
    None, -2.5, 0, Int64(1), 1.5, Decimal128("2.25"), 3, "", "$looks.like.a.path", "a", "b", "zz",
    {"a": 1}, {"a": 1, "b": 2}, {"b": 0}, Binary(b"\x00"), Binary(b"\x01\x02"), ObjectId("000000000000000000000001"),
    ObjectId(), False, True, datetime.datetime(1999, 1, 1), datetime.datetime(2030, 6, 1), Timestamp(5, 1),
    Timestamp(6, 0), MinKey(), MaxKey(),
]


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_mixed_id_types_in_server_order(mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any], chunk: int) -> None:
    db = fresh_db.name
    fresh_db.items.insert_many([{"_id": i, "n": n} for n, i in enumerate(MIXED_IDS)])
    server_order = [key_identity(d["_id"]) for d in fresh_db.items.find().sort("_id", 1)]
    cfg = make_config(mongo_uri, db, **{"incremental.snapshot.chunk.size": chunk})
    sink = MemorySink()
    incremental_snapshot_collection(cfg, f"{db}.items", sink)
    got = [key_identity(json_util.loads(orjson.loads(r.key or b"{}")["id"])) for r in reads(sink, f"{db}.items")]
    assert got == server_order  # every key once, nothing skipped across type brackets


def test_additional_condition_selects_a_subset(mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any]) -> None:
    db = fresh_db.name
    fresh_db.products.insert_many(
        [{"_id": i, "color": "blue" if i % 3 == 0 else "red", "brand": "MyBrand" if i % 2 else "Other"} for i in range(60)]
    )
    cfg = make_config(mongo_uri, db, **{"incremental.snapshot.chunk.size": 8})
    sink = MemorySink()
    result = incremental_snapshot_collection(
        cfg, f"{db}.products", sink, filter={"$and": [{"color": "blue"}, {"brand": "MyBrand"}]}
    )
    ids = sorted(orjson.loads(p["after"])["_id"] for p in sink.values(f"{db}.products"))
    assert ids == [i for i in range(60) if i % 3 == 0 and i % 2]
    assert result.documents == len(ids)


def test_empty_collection_completes(mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any]) -> None:
    fresh_db.create_collection("nothing")
    cfg = make_config(mongo_uri, fresh_db.name)
    result = incremental_snapshot_collection(cfg, f"{fresh_db.name}.nothing", MemorySink())
    assert result.documents == 0 and result.first_position is None


def test_restart_continues_with_the_next_chunk(
    mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any], tmp_path: Path
) -> None:
    db = fresh_db.name
    fresh_db.items.insert_many([{"_id": i, "v": i} for i in range(100)])
    cfg = make_config(mongo_uri, db, **{"incremental.snapshot.chunk.size": 20})
    state = tmp_path / "items.state.json"
    # flush 1 records the start, flush 2 the first chunk; flush 3 (second chunk) fails: a crash
    failing = MemorySink(fail_on_flush=3)
    with pytest.raises(OSError, match="injected"):
        incremental_snapshot_collection(cfg, f"{db}.items", failing, state_path=state)
    saved = IncrementalState.from_json(orjson.loads(state.read_bytes()))
    assert saved.last_keys == {f"{db}.items": (19,)}
    durable = [orjson.loads(payload(r)["after"])["_id"] for r in failing.durable if r.op == "r"]
    assert durable == list(range(20))

    sink = MemorySink()
    result = incremental_snapshot_collection(cfg, f"{db}.items", sink, state_path=state)
    assert result.resumed
    again = [orjson.loads(p["after"])["_id"] for p in sink.values(f"{db}.items")]
    assert again == list(range(20, 100))  # continues after the last completed chunk, nothing re-read
    assert not state.exists()  # completed: the next run starts a new snapshot


def test_state_file_of_another_collection_is_refused(
    mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any], tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    state.write_bytes(orjson.dumps(IncrementalState("x", [f"{fresh_db.name}.other"]).to_json()))
    cfg = make_config(mongo_uri, fresh_db.name)
    with pytest.raises(CdcError, match="belongs to"):
        incremental_snapshot_collection(cfg, f"{fresh_db.name}.items", MemorySink(), state_path=state)


def test_signal_collection_is_required(mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any]) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{"signal.data.collection": ""})
    with pytest.raises(CdcError, match="signal.data.collection"):
        incremental_snapshot_collection(cfg, f"{fresh_db.name}.items", MemorySink())


# -- units -------------------------------------------------------------------------------------------------


def test_brackets_follow_mongodb_type_order() -> None:
    ordered = [None, 1, "a", {"a": 1}, Binary(b"x"), ObjectId(), True, datetime.datetime(2000, 1, 1), Timestamp(1, 1)]
    brackets = [bson_bracket(v) for v in ordered]
    assert None not in brackets
    known = [b for b in brackets if b is not None]
    assert known == sorted(known) and len(set(known)) == len(known)
    assert bson_bracket(Int64(5)) == bson_bracket(2.5) == bson_bracket(Decimal128("1")) == bson_bracket(7)
    assert bson_bracket(MinKey()) is None and bson_bracket(MaxKey()) is None and bson_bracket(Code("f")) is None


@pytest.mark.parametrize(
    ("key", "maximum", "past"),
    [
        (5, 5, True), (4, 5, False), (Decimal128("5.5"), 5, True), (6.0, Int64(7), False),
        ("b", "a", True), ("a", 9, True), (9, "a", False), (ObjectId(), "zz", True),
        (True, False, True), (Timestamp(1, 2), Timestamp(1, 1), True), ({"a": 2}, {"a": 1}, False),
        (float("nan"), 1, False), (MaxKey(), 1, False),
    ],
)
def test_past_maximum(key: Any, maximum: Any, past: bool) -> None:
    assert past_maximum(key, maximum) is past


def test_state_round_trips_keys_of_every_type() -> None:
    state = IncrementalState(
        "sig", ["d.a", "d.b", "d.c"], filters={"d.a": {"qty": {"$gt": Int64(3)}}},
        last_keys={"d.a": (ObjectId("000000000000000000000001"),), "d.b": (None,), "d.c": ({"k": Decimal128("1.5")},)},
        max_keys={"d.a": (Timestamp(1, 2),), "d.b": None}, rows={"d.a": 5}, completed=["d.c"], paused=True,
    )
    loaded = IncrementalState.from_json(orjson.loads(orjson.dumps(state.to_json())))
    assert loaded == state
    assert loaded.remaining == ["d.a", "d.b"]


def test_unreadable_state_is_a_clear_error() -> None:
    with pytest.raises(CdcError, match="not readable"):
        IncrementalState.from_json({"collections": []})
