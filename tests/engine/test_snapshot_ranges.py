"""Range splitting of huge collections: every document in exactly one range, whatever its ``_id`` type."""

from __future__ import annotations

import datetime
import uuid
from collections import Counter
from typing import Any

import pytest
from bson import Binary, Decimal128, Int64, ObjectId, Regex, Timestamp, json_util
from bson.binary import UuidRepresentation
from bson.max_key import MaxKey
from bson.min_key import MinKey
from pymongo.database import Database

from mongocdc_core.source.ranges import IdRange, bracket_of, plan_ranges

IDENTITY = json_util.CANONICAL_JSON_OPTIONS.with_options(uuid_representation=UuidRepresentation.STANDARD)
MIXED_IDS: list[Any] = [
    MinKey(),
    None,
    *range(-5, 40),
    Int64(2**40),
    2.5,
    Decimal128("7.25"),
    *(f"s-{i:03d}" for i in range(40)),
    {"a": 1, "b": "two"},
    {"b": "two", "a": 1},
    {"a": 2},
    Binary(b"\x00\x01", 0),
    Binary(uuid.UUID(int=7).bytes, 4),
    *(ObjectId(f"{i:024x}") for i in range(1, 30)),
    False,
    True,
    *(datetime.datetime(2020, 1, 1) + datetime.timedelta(days=i) for i in range(20)),
    Timestamp(5, 1),
    Timestamp(6, 2),
    Regex("^a"),
    MaxKey(),
]


def _identity(value: Any) -> str:
    return json_util.dumps({"k": value}, json_options=IDENTITY)


@pytest.mark.parametrize("split_size", [1, 7, 40, 1000])
def test_ranges_cover_every_id_type_exactly_once(fresh_db: Database, split_size: int) -> None:
    coll = fresh_db.mixed
    coll.insert_many([{"_id": value, "n": i} for i, value in enumerate(MIXED_IDS)])
    ranges = plan_ranges(coll, split_size)
    if split_size >= len(MIXED_IDS):
        assert ranges == [IdRange()]
    else:
        assert len(ranges) > 1
    seen: Counter[str] = Counter()
    for id_range in ranges:
        for doc in coll.find(id_range.query(), {"_id": 1}):
            seen[_identity(doc["_id"])] += 1
    expected = Counter(_identity(v) for v in MIXED_IDS)
    assert seen == expected


def test_a_range_resumed_after_a_key_reads_only_what_follows(fresh_db: Database) -> None:
    coll = fresh_db.resume
    ids: list[Any] = [*range(10), *(f"k{i}" for i in range(10)), *(ObjectId(f"{i:024x}") for i in range(1, 6))]
    coll.insert_many([{"_id": v} for v in ids])
    whole = IdRange(None, "k5")
    read = [d["_id"] for d in coll.find(whole.query()).sort("_id", 1)]
    assert read == [*range(10), "k0", "k1", "k2", "k3", "k4"]
    rest = whole.after(7)
    assert [d["_id"] for d in coll.find(rest.query()).sort("_id", 1)] == [8, 9, "k0", "k1", "k2", "k3", "k4"]
    tail = IdRange("k8", None).after("k8")
    assert [d["_id"] for d in coll.find(tail.query()).sort("_id", 1)] == ["k9", *ids[20:]]


def test_ranges_survive_the_offsets_round_trip() -> None:
    for id_range in (IdRange(), IdRange(None, 5), IdRange(ObjectId(), "x", low_exclusive=True), IdRange({"a": 1}, None)):
        assert IdRange.from_json(id_range.to_json()) == id_range


def test_values_that_cannot_bound_a_range_are_refused() -> None:
    assert bracket_of(Regex("x")) is None and bracket_of(MinKey()) is None and bracket_of(None) is None
    with pytest.raises(ValueError, match="cannot be bounded"):
        IdRange(Regex("x"), None).query()


def test_a_landing_file_torn_by_kill_9_is_repaired_before_appending(tmp_path: Any) -> None:
    from mongocdc_core.events.records import Record
    from mongocdc_core.positions import Position
    from mongocdc_core.sinks.jsonl import JsonlSink

    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"key":1,"value":2}\n{"key":3,"val')
    sink = JsonlSink(tmp_path)
    sink.write([Record("t", b"3", b"4", Position(1, 1, 0), None, None)])
    sink.close()
    assert path.read_bytes().splitlines() == [b'{"key":1,"value":2}', b'{"key":3,"value":4}']


def test_snapshotting_each_planned_range_alone_gives_the_same_records_as_one_snapshot(
    fresh_db: Database, mongo_uri: str
) -> None:
    import orjson

    from mongocdc_core import api
    from tests.engine.engine_support import MemorySink, make_config

    fresh_db.parts.insert_many([{"_id": v, "n": i} for i, v in enumerate(MIXED_IDS) if bracket_of(v) is not None])
    cfg = make_config(mongo_uri, fresh_db.name, **{"mongocdc.snapshot.split.size": 9})
    ns = f"{fresh_db.name}.parts"
    ranges = api.plan_snapshot_ranges(cfg, ns)
    assert len(ranges) > 5

    def reads(sink: MemorySink) -> list[bytes]:
        return sorted(orjson.dumps(orjson.loads(v["after"])) for v in sink.values())

    whole = MemorySink()
    api.snapshot_collection(cfg, ns, whole)
    pieces: list[bytes] = []
    for id_range in ranges:
        sink = MemorySink()
        result = api.snapshot_collection(cfg, ns, sink, id_range=id_range)
        assert result.documents == len(sink.values())
        pieces += reads(sink)
    assert sorted(pieces) == reads(whole) and len(reads(whole)) == fresh_db.parts.count_documents({})


@pytest.mark.parametrize("threads", [1, 3])
def test_markers_stay_debeziums_whatever_order_the_ranges_finish_in(
    fresh_db: Database, mongo_uri: str, threads: int
) -> None:
    """``first``/``last`` and ``*_in_data_collection`` mark the first and last record delivered, even when
    the range that finishes last is empty (a filter keeps nothing of it) or a whole collection is."""
    import orjson

    from mongocdc_core.offsets import MemoryOffsetStore
    from tests.engine.engine_support import MemorySink, make_config, run_engine

    db = fresh_db.name
    for name in ("a", "b", "empty"):
        fresh_db[name].insert_many([{"_id": i, "n": i} for i in range(120)])
    keep = {"_id": {"$lt": 47}}  # the ranges above 47 hold nothing once filtered
    cfg = make_config(mongo_uri, db, **{
        "snapshot.mode": "initial_only", "snapshot.max.threads": threads, "mongocdc.snapshot.split.size": 10,
        "snapshot.fetch.size": 4, "snapshot.collection.filter.overrides": f"{db}.a,{db}.empty",
        f"snapshot.collection.filter.overrides.{db}.a": orjson.dumps(keep).decode(),
        f"snapshot.collection.filter.overrides.{db}.empty": '{"_id": {"$lt": -1}}',
    })
    sink = MemorySink()
    run_engine(cfg, sink, MemoryOffsetStore())
    delivered = [(r.collection, v["source"]["snapshot"]) for r, v in zip(sink.data(), sink.values(), strict=True)]
    markers = [marker for _, marker in delivered]
    assert markers[0] == "first" and markers[-1] == "last"
    assert markers.count("first") == markers.count("last") == 1
    for coll, count in ((f"{db}.a", 47), (f"{db}.b", 120)):
        own = [marker for ns, marker in delivered if ns == coll]
        assert len(own) == count
        assert own[0] in ("first", "first_in_data_collection") and own[-1] in ("last", "last_in_data_collection")
        assert set(own[1:-1]) == {"true"}
    assert f"{db}.empty" not in {ns for ns, _ in delivered}
