"""Streaming: capture modes, filters, cursor pipelines, skipped operations, heartbeats, offsets."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from bson import Timestamp

from mongocdc_core.api import current_cluster_time
from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import FileOffsetStore, MemoryOffsetStore
from mongocdc_core.positions import decode_resume_token_timestamp
from mongocdc_core.source.errors import CdcError
from tests.engine.engine_support import (
    Background,
    MemorySink,
    make_config,
    replay,
    run_engine,
    source_state,
    wait_for,
)


def _pinned(cfg: Any) -> MemoryOffsetStore:
    """An offset store positioned at "now" (a no_data start), so later writes are streamed."""
    offsets = MemoryOffsetStore()
    pin = cfg.with_properties({"snapshot.mode": "no_data"})
    run_engine(pin, MemorySink(), offsets)
    return offsets


def _stream(cfg: Any, offsets: MemoryOffsetStore, **kw: Any) -> MemorySink:
    sink = MemorySink()
    run_engine(cfg.with_properties({"snapshot.mode": "no_data"}), sink, offsets)
    return sink


CAPTURE_MODES = [
    ("change_streams", False, False),
    ("change_streams_update_full", False, True),
    ("change_streams_update_full_with_pre_image", True, True),
    ("change_streams_with_pre_image", True, False),
]


@pytest.mark.parametrize(("mode", "has_before", "has_after"), CAPTURE_MODES)
def test_capture_modes_shape_update_events(
    fresh_db: Any, mongo_uri: str, mode: str, has_before: bool, has_after: bool
) -> None:
    fresh_db.create_collection("a", changeStreamPreAndPostImages={"enabled": True})
    fresh_db.a.insert_many([{"_id": 1, "n": 1}, {"_id": 2, "n": 5}])
    cfg = make_config(mongo_uri, fresh_db.name, **{"capture.mode": mode})
    offsets = _pinned(cfg)
    fresh_db.a.update_one({"_id": 1}, {"$set": {"n": 2}})
    fresh_db.a.delete_one({"_id": 2})  # a later delete of the same document would empty the lookup
    values = _stream(cfg, offsets).values()
    update, delete = values
    assert update["op"] == "u" and delete["op"] == "d"
    assert (update["after"] is not None) is has_after
    assert (update["before"] is not None) is has_before
    if has_after:
        assert orjson.loads(update["after"]) == {"_id": 1, "n": 2}
    if has_before:
        assert orjson.loads(update["before"]) == {"_id": 1, "n": 1}
        assert orjson.loads(delete["before"]) == {"_id": 2, "n": 5}


def test_post_image_full_update_type(fresh_db: Any, mongo_uri: str) -> None:
    fresh_db.create_collection("a", changeStreamPreAndPostImages={"enabled": True})
    fresh_db.a.insert_one({"_id": 1, "n": 1})
    cfg = make_config(mongo_uri, fresh_db.name, **{"capture.mode.full.update.type": "post_image"})
    offsets = _pinned(cfg)
    fresh_db.a.update_one({"_id": 1}, {"$inc": {"n": 1}})
    fresh_db.a.update_one({"_id": 1}, {"$inc": {"n": 1}})
    afters = [orjson.loads(v["after"])["n"] for v in _stream(cfg, offsets).values()]
    assert afters == [2, 3]  # the post-image of each update, not a later lookup


@pytest.mark.parametrize("match_mode", ["regex", "literal"])
def test_include_and_exclude_filters(fresh_db: Any, mongo_uri: str, match_mode: str) -> None:
    db = fresh_db.name
    include = f"{db}\\.keep.*" if match_mode == "regex" else f"{db}.keep1,{db}.keep2"
    cfg = make_config(mongo_uri, db, **{"filters.match.mode": match_mode, "collection.include.list": include})
    offsets = _pinned(cfg)
    for name in ("keep1", "keep2", "other"):
        fresh_db[name].insert_one({"_id": name})
    assert sorted(v["source"]["collection"] for v in _stream(cfg, offsets).values()) == ["keep1", "keep2"]

    excl = make_config(
        mongo_uri,
        db,
        **{
            "filters.match.mode": match_mode,
            "collection.include.list": "",
            "database.include.list": db,
            "collection.exclude.list": f"{db}\\.other" if match_mode == "regex" else f"{db}.other",
        },
    )
    offsets = _pinned(excl)
    for name in ("keep1", "other"):
        fresh_db[name].insert_one({"_id": name + "2"})
    assert [v["source"]["collection"] for v in _stream(excl, offsets).values()] == ["keep1"]


@pytest.mark.parametrize(
    ("order", "pipeline", "expected"),
    [
        ("internal_first", [{"$match": {"fullDocument.keep": True}}], ["c"]),
        ("user_first", [{"$match": {"operationType": "insert"}}], ["c", "c"]),
        ("user_only", [{"$match": {"operationType": {"$in": ["insert", "delete"]}}}], ["c", "c", "d"]),
    ],
)
def test_cursor_pipeline_orders(
    fresh_db: Any, mongo_uri: str, order: str, pipeline: list[dict[str, Any]], expected: list[str]
) -> None:
    cfg = make_config(
        mongo_uri,
        fresh_db.name,
        **{"cursor.pipeline": orjson.dumps(pipeline).decode(), "cursor.pipeline.order": order},
    )
    offsets = _pinned(cfg)
    fresh_db.a.insert_one({"_id": 1, "keep": True})
    fresh_db.a.insert_one({"_id": 2, "keep": False})
    fresh_db.a.update_one({"_id": 1}, {"$set": {"keep": False}})
    fresh_db.a.delete_one({"_id": 2})
    fresh_db.client[fresh_db.name + "_elsewhere"].z.insert_one({"_id": 9})  # never captured
    try:
        assert [v["op"] for v in _stream(cfg, offsets).values()] == expected
    finally:
        fresh_db.client.drop_database(fresh_db.name + "_elsewhere")


def test_skipped_operations(fresh_db: Any, mongo_uri: str) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{"skipped.operations": "u"})
    offsets = _pinned(cfg)
    fresh_db.a.insert_one({"_id": 1})
    fresh_db.a.update_one({"_id": 1}, {"$set": {"x": 1}})
    fresh_db.a.replace_one({"_id": 1}, {"y": 1})
    fresh_db.a.delete_one({"_id": 1})
    assert [v["op"] for v in _stream(cfg, offsets).values()] == ["c", "d"]


def test_max_events_then_restart_continues_exactly(fresh_db: Any, mongo_uri: str, tmp_path: Any) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "no_data"})
    offsets = FileOffsetStore(tmp_path / "offsets.json")
    run_engine(cfg, MemorySink(), offsets)
    fresh_db.a.insert_many([{"_id": i} for i in range(10)])
    with fresh_db.client.start_session() as session, session.start_transaction():
        fresh_db.a.insert_many([{"_id": 100 + i} for i in range(4)], session=session)
    first = MemorySink()
    summary = run_engine(cfg, first, offsets, max_events=6)
    assert summary.stopped_because == "max_events" and summary.events == 6
    second = MemorySink()
    run_engine(cfg, second, offsets, max_events=6)
    third = MemorySink()
    run_engine(cfg, third, offsets)
    ids = [orjson.loads(v["after"])["_id"] for s in (first, second, third) for v in s.values()]
    assert ids == list(range(10)) + [100, 101, 102, 103]  # no duplicates, nothing lost, in order
    positions = [r.position for s in (first, second, third) for r in s.data()]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)


def test_heartbeats_advance_offsets_on_uncaptured_changes(fresh_db: Any, mongo_uri: str) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{"heartbeat.interval.ms": 100, "snapshot.mode": "no_data"})
    offsets = MemoryOffsetStore()
    sink = MemorySink()
    bg = Background(Engine(cfg, sink, offsets)).start()
    wait_for(lambda: offsets.load() is not None)
    start = offsets.load()
    assert start is not None and start.resume_token is not None
    start_ts = decode_resume_token_timestamp(start.resume_token)
    other = fresh_db.client[fresh_db.name + "_uncaptured"]
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            other.x.insert_one({})
            stored = offsets.load()
            assert stored is not None and stored.resume_token is not None
            ts: Timestamp = decode_resume_token_timestamp(stored.resume_token)
            if (ts.time, ts.inc) > (start_ts.time, start_ts.inc) and sink.topic("__debezium-heartbeat.srv"):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("offset did not advance through heartbeats")
    finally:
        bg.stop()
        fresh_db.client.drop_database(other.name)
    assert sink.data() == []
    beat = orjson.loads(sink.topic("__debezium-heartbeat.srv")[0].value or b"{}")
    assert "ts_ms" in beat


def test_without_heartbeats_offsets_stay_on_uncaptured_changes(fresh_db: Any, mongo_uri: str) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "no_data"})
    offsets = _pinned(cfg)
    before = offsets.load()
    other = fresh_db.client[fresh_db.name + "_uncaptured"]
    other.x.insert_one({})
    try:
        sink = _stream(cfg, offsets)
    finally:
        fresh_db.client.drop_database(other.name)
    assert sink.records == [] and offsets.load() == before


def test_transaction_metadata_and_replay(fresh_db: Any, mongo_uri: str) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{"provide.transaction.metadata": "true"})
    offsets = _pinned(cfg)
    fresh_db.a.insert_one({"_id": 0})
    with fresh_db.client.start_session() as session, session.start_transaction():
        fresh_db.a.insert_one({"_id": 1}, session=session)
        fresh_db.b.insert_one({"_id": 2}, session=session)
        fresh_db.a.update_one({"_id": 0}, {"$set": {"t": 1}}, session=session)
    fresh_db.a.insert_one({"_id": 3})
    sink = _stream(cfg, offsets)
    txn = [orjson.loads(r.value or b"{}") for r in sink.topic("srv.transaction")]
    assert [t["status"] for t in txn] == ["BEGIN", "END"]
    assert txn[1]["event_count"] == 3
    in_txn = [v for v in sink.values() if v.get("transaction")]
    assert len(in_txn) == 3
    positions = [r.position for r in sink.data()]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert len({(p.seconds, p.increment) for p in positions}) == 3  # the transaction shares one clusterTime
    for name in ("a", "b"):
        assert replay(sink.records, f"{fresh_db.name}.{name}") == source_state(fresh_db[name])


def test_metrics_are_counted(fresh_db: Any, mongo_uri: str, tmp_path: Any) -> None:
    fresh_db.a.insert_one({"_id": 0})
    cfg = make_config(mongo_uri, fresh_db.name)
    offsets = MemoryOffsetStore()
    engine = Engine(cfg, MemorySink(), offsets, metrics_file=str(tmp_path / "m.json"))
    engine.run(stop_at=current_cluster_time(cfg))
    fresh_db.a.insert_one({"_id": 1})
    fresh_db.a.update_one({"_id": 1}, {"$set": {"x": 1}})
    fresh_db.a.delete_one({"_id": 0})
    engine = Engine(cfg, MemorySink(), offsets, metrics_file=str(tmp_path / "m.json"))
    engine.run(stop_at=current_cluster_time(cfg))
    data = orjson.loads((tmp_path / "m.json").read_bytes())
    streaming = next(v for k, v in data.items() if "context=streaming" in k)
    assert streaming["TotalNumberOfCreateEventsSeen"] == 1
    assert streaming["TotalNumberOfUpdateEventsSeen"] == 1
    assert streaming["TotalNumberOfDeleteEventsSeen"] == 1
    assert streaming["QueueTotalCapacity"] == 8192
    assert f"{fresh_db.name}.a" in streaming["CapturedTables"]


def test_graceful_stop_from_another_thread_leaves_no_duplicates(fresh_db: Any, mongo_uri: str, tmp_path: Any) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "no_data", "offset.flush.interval.ms": 60000})
    offsets = FileOffsetStore(tmp_path / "offsets.json")
    sink = MemorySink()
    bg = Background(Engine(cfg, sink, offsets)).start()
    wait_for(lambda: offsets.load() is not None)
    fresh_db.a.insert_many([{"_id": i} for i in range(20)])
    wait_for(lambda: len(sink.data()) == 20)
    bg.stop()
    fresh_db.a.insert_many([{"_id": i} for i in range(20, 25)])
    again = MemorySink()
    run_engine(cfg, again, offsets)
    assert [orjson.loads(v["after"])["_id"] for v in again.values()] == list(range(20, 25))


@pytest.mark.parametrize("scope", ["database", "collection"])
def test_capture_scope_watches_only_the_target(fresh_db: Any, mongo_uri: str, scope: str) -> None:
    db = fresh_db.name
    target = db if scope == "database" else f"{db}.a"
    cfg = make_config(
        mongo_uri, db, **{"capture.scope": scope, "capture.target": target, "collection.include.list": ""}
    )
    offsets = _pinned(cfg)
    fresh_db.a.insert_one({"_id": 1})
    fresh_db.b.insert_one({"_id": 2})
    other = fresh_db.client[db + "_other"]
    other.a.insert_one({"_id": 3})
    try:
        seen = sorted((v["source"]["db"], v["source"]["collection"]) for v in _stream(cfg, offsets).values())
    finally:
        fresh_db.client.drop_database(other.name)
    assert seen == ([(db, "a"), (db, "b")] if scope == "database" else [(db, "a")])


def test_post_image_without_post_images_says_how_to_enable_them(fresh_db: Any, mongo_uri: str) -> None:
    fresh_db.a.insert_one({"_id": 1, "n": 1})  # created without changeStreamPreAndPostImages
    cfg = make_config(mongo_uri, fresh_db.name, **{"capture.mode.full.update.type": "post_image"})
    offsets = _pinned(cfg)
    fresh_db.a.update_one({"_id": 1}, {"$inc": {"n": 1}})
    with pytest.raises(CdcError) as info:
        _stream(cfg, offsets)
    text = str(info.value)
    assert 'db.runCommand({collMod: "<collection>", changeStreamPreAndPostImages: {enabled: true}})' in text
    assert "post_image" in text and "\n" not in text


class _OutageSink(MemorySink):
    """A sink whose first flush with records pending blocks, as a producer waiting out a Kafka outage."""

    def __init__(self, outage_s: float) -> None:
        super().__init__()
        self.outage_s = outage_s
        self.outages = 0

    def flush(self, timeout: float | None = None) -> None:
        if self.records and not self.outages:
            self.outages += 1
            time.sleep(self.outage_s)
        super().flush(timeout)


def test_time_blocked_on_the_sink_is_not_idle(fresh_db: Any, mongo_uri: str) -> None:
    """--until-idle must not stop while events are still queued behind a blocked sink."""
    cfg = make_config(mongo_uri, fresh_db.name, **{"max.batch.size": 2, "offset.flush.interval.ms": 0})
    offsets = _pinned(cfg)
    fresh_db.a.insert_many([{"_id": i} for i in range(50)])
    sink = _OutageSink(outage_s=1.5)
    summary = Engine(cfg.with_properties({"snapshot.mode": "no_data"}), sink, offsets).run(until_idle=0.5)
    assert sink.outages == 1 and summary.stopped_because == "idle"
    assert summary.events == 50 and len(sink.durable) == 50


def test_server_batches_are_handed_over_within_the_queue_bounds(
    fresh_db: Any, mongo_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader queues a server batch's events together, yet the queue never holds more events than
    ``max.queue.size`` nor more bytes than ``max.queue.size.in.bytes`` (beyond one event alone), and
    every event arrives once, in order, while a slow sink keeps the queue full."""
    from mongocdc_core.source.stream import EventQueue, StreamItem

    peaks = {"events": 0, "bytes": 0}
    put = EventQueue.put

    def watched(queue: EventQueue, item: StreamItem, stop: Any) -> bool:
        accepted = put(queue, item, stop)
        peaks["events"] = max(peaks["events"], queue.pending())
        peaks["bytes"] = max(peaks["bytes"], queue.metrics.CurrentQueueSizeInBytes if queue.metrics else 0)
        return accepted

    monkeypatch.setattr(EventQueue, "put", watched)
    cfg = make_config(mongo_uri, fresh_db.name, **{"max.batch.size": 16, "max.queue.size": 24,
                                                   "max.queue.size.in.bytes": 4000})  # fmt: skip
    offsets = _pinned(cfg)
    fresh_db.items.insert_many([{"_id": i, "pad": "x" * 200} for i in range(120)])

    class SlowSink(MemorySink):
        def write(self, records: Any) -> None:
            time.sleep(0.002)
            super().write(records)

    sink = SlowSink()
    run_engine(cfg.with_properties({"snapshot.mode": "no_data"}), sink, offsets, max_events=120)
    assert [orjson.loads(v["after"])["_id"] for v in sink.values()] == list(range(120))
    assert 0 < peaks["events"] <= 24
    assert 0 < peaks["bytes"] <= 4000
