"""Ad hoc snapshots through the running engine: every signal channel and signal form of the seed."""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import orjson
import pytest
from bson import ObjectId
from pymongo import MongoClient
from pymongo.database import Database

from mongocdc_core.coordinator import Engine
from mongocdc_core.dispatcher import ProgressListener
from mongocdc_core.events.records import Record
from mongocdc_core.offsets import FileOffsetStore, MemoryOffsetStore
from mongocdc_core.positions import Position
from mongocdc_core.replay import canonical, differences
from mongocdc_core.source.incremental import IncrementalState

from .support import (
    Background,
    MemorySink,
    engine_config,
    kinds,
    notifications,
    payload,
    read_ids,
    reads,
    replay,
    wait_for,
)

SNAPSHOT = "Incremental Snapshot"


class _Streaming(ProgressListener):
    """Tells when streaming began: its start position is recorded, later writes will be seen."""

    def __init__(self) -> None:
        self.started = threading.Event()

    def streaming_started(self, position: Position | None) -> None:
        self.started.set()


def _start(cfg: Any, sink: MemorySink, offsets: Any = None) -> Background:
    streaming = _Streaming()
    engine = Background(Engine(cfg, sink, offsets or MemoryOffsetStore(), progress=streaming)).start()
    wait_for(streaming.started.is_set, engine)
    return engine


def _execute(collections: list[str], **data: Any) -> dict[str, Any]:
    return {"type": "execute-snapshot", "data": {"data-collections": collections, **data}}


@pytest.mark.parametrize("strategy", ["insert_insert", "insert_delete"])
@pytest.mark.parametrize("with_id", [False, True])
def test_source_channel_signal_runs_an_incremental_snapshot(
    mongo_uri: str, fresh_db: Database[Any], strategy: str, with_id: bool
) -> None:
    db = fresh_db.name
    fresh_db.items.insert_many([{"_id": i, "v": i} for i in range(75)])
    cfg = engine_config(mongo_uri, db, **{
        "incremental.snapshot.chunk.size": 20, "incremental.snapshot.watermarking.strategy": strategy,
    })
    sink = MemorySink()
    engine = _start(cfg, sink)
    try:
        # the seed's insert: without _id (MongoDB assigns one) or with an explicit "id"
        signal = {"id": "ad-hoc-1", **_execute([f'"{db}"."items"'])} if with_id else _execute([f"{db}\\.items"])
        fresh_db.signals.insert_one(signal)
        wait_for(lambda: "COMPLETED" in kinds(sink, SNAPSHOT), engine)
        fresh_db.items.insert_one({"_id": 1000, "v": "after"})
        wait_for(lambda: any(r.op == "c" for r in sink.data(f"{db}.items")), engine)
    finally:
        engine.stop()
    assert read_ids(sink, f"{db}.items") == list(range(75))
    assert {payload(r)["source"]["snapshot"] for r in reads(sink, f"{db}.items")} == {"incremental"}
    assert kinds(sink, SNAPSHOT) == ["STARTED", "IN_PROGRESS", "IN_PROGRESS", "IN_PROGRESS",
                                     "TABLE_SCAN_COMPLETED", "COMPLETED"]
    progress = notifications(sink, SNAPSHOT)[1]["additional_data"]
    assert progress["current_collection_in_progress"] == f"{db}.items" and progress["rows"] == "20"
    snapshot_metrics = engine.engine.metrics.snapshot.as_dict()
    assert snapshot_metrics["RowsScanned"] == {f"{db}.items": 75}
    assert snapshot_metrics["SnapshotCompleted"] and snapshot_metrics["RemainingTableCount"] == 0
    assert sink.data(f"{db}.signals") == []  # signals and watermarks never become data events


def test_each_incremental_chunk_carries_the_losses_counted_when_it_was_read(
    mongo_uri: str, fresh_db: Database[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk is handed over when the stream closes its window, long after its read: it carries
    ConnectorMetrics.losses as read before its find, so that handing it over after a loss counted
    meanwhile does not take MongoDB as answering again (see the dispatcher's test of that sequence)."""
    from mongocdc_core.dispatcher import Dispatcher
    from mongocdc_core.receiver import SnapshotChunk

    db = fresh_db.name
    fresh_db.items.insert_many([{"_id": i, "v": i} for i in range(45)])
    cfg = engine_config(mongo_uri, db, **{"incremental.snapshot.chunk.size": 20})
    asked: list[int | None] = []
    handed = Dispatcher.snapshot_chunk

    def spied(self: Dispatcher, chunk: SnapshotChunk, *args: Any) -> None:
        asked.append(chunk.asked)
        handed(self, chunk, *args)

    monkeypatch.setattr(Dispatcher, "snapshot_chunk", spied)
    sink = MemorySink()
    engine = _start(cfg, sink)
    try:
        engine.engine.metrics.losses = 2  # as if two losses had been counted before the snapshot
        fresh_db.signals.insert_one(_execute([f"{db}\\.items"]))
        wait_for(lambda: "COMPLETED" in kinds(sink, SNAPSHOT), engine)
    finally:
        engine.stop()
    assert read_ids(sink, f"{db}.items") == list(range(45))
    assert asked == [2, 2, 2]


def test_file_channel_and_additional_conditions(mongo_uri: str, fresh_db: Database[Any], tmp_path: Path) -> None:
    db = fresh_db.name
    fresh_db.products.insert_many([
        {"_id": i, "color": "blue" if i % 2 else "red", "brand": "MyBrand" if i % 3 == 0 else "Other"} for i in range(40)
    ])
    fresh_db.other.insert_many([{"_id": i} for i in range(5)])
    signals = tmp_path / "file-signals.txt"
    cfg = engine_config(mongo_uri, db, **{
        "signal.enabled.channels": "source,file", "signal.file": str(signals), "signal.poll.interval.ms": 50,
        "incremental.snapshot.chunk.size": 7,
    })
    sink = MemorySink()
    engine = _start(cfg, sink)
    try:
        line = orjson.dumps({"id": "d139b9b7-7777-4547-917d-e1775ea61d41", **_execute(
            [f"{db}.products", f"{db}.other"], type="INCREMENTAL",
            **{"additional-conditions": [{"data-collection": f"{db}.products", "filter": "color='blue' AND brand='MyBrand'"}]},
        )})
        signals.write_bytes(line + b"\n")
        wait_for(lambda: "COMPLETED" in kinds(sink, SNAPSHOT), engine)
    finally:
        engine.stop()
    assert read_ids(sink, f"{db}.products") == [i for i in range(40) if i % 2 and i % 3 == 0]
    assert read_ids(sink, f"{db}.other") == list(range(5))
    assert not signals.exists()


def test_malformed_signals_are_skipped_and_the_stream_goes_on(mongo_uri: str, fresh_db: Database[Any]) -> None:
    db = fresh_db.name
    fresh_db.items.insert_many([{"_id": i} for i in range(3)])
    sink = MemorySink()
    engine = _start(engine_config(mongo_uri, db), sink)
    try:
        fresh_db.signals.insert_many([
            {"type": "no-such-signal", "data": {}},
            {"data": {"data-collections": [f"{db}.items"]}},
            {"type": "execute-snapshot", "data": "{broken json"},
            {"type": "execute-snapshot", "data": {"data-collections": [f"{db}.items"], "type": "full"}},
            {"type": "execute-snapshot", "data": {"data-collections": [f"{db}.items"],
                                                   "additional-conditions": [{"data-collection": f"{db}.items",
                                                                              "filter": "a=1 OR b=2"}]}},
            {"type": "stop-snapshot", "data": {}},
            {"type": "execute-snapshot", "data": {"data-collections": []}},  # names nothing: reported
        ])
        fresh_db.items.insert_one({"_id": 99})
        wait_for(lambda: len(kinds(sink, "Signal")) == 7 and len(sink.data(f"{db}.items")) == 1, engine)
        fresh_db.signals.insert_one(_execute([f"{db}.items"]))
        wait_for(lambda: "COMPLETED" in kinds(sink, SNAPSHOT), engine)
    finally:
        engine.stop()
    reasons = " | ".join(n["additional_data"]["reason"] for n in notifications(sink, "Signal"))
    for expected in ("unknown signal type 'no-such-signal'", "'type' must be a non-empty string",
                     "'data' is not valid JSON", "'incremental' or 'blocking'", "cannot translate",
                     "requires data.type 'incremental'", "'data-collections' is empty"):
        assert expected in reasons
    assert sorted(read_ids(sink, f"{db}.items")) == [0, 1, 2, 99]


def test_pause_resume_and_stop(mongo_uri: str, fresh_db: Database[Any]) -> None:
    db = fresh_db.name
    fresh_db.big.insert_many([{"_id": i} for i in range(1500)])
    cfg = engine_config(mongo_uri, db, **{"incremental.snapshot.chunk.size": 5})
    sink = MemorySink()
    offsets = MemoryOffsetStore()
    engine = _start(cfg, sink, offsets)
    metrics = engine.engine.metrics.snapshot
    try:
        fresh_db.signals.insert_many([_execute([f"{db}.big"]), {"type": "pause-snapshot"}])
        wait_for(lambda: "PAUSED" in kinds(sink, SNAPSHOT), engine)
        assert metrics.SnapshotPaused
        at_pause = len(reads(sink, f"{db}.big"))
        fresh_db.big.insert_one({"_id": "streamed while paused"})
        wait_for(lambda: any(r.op == "c" for r in sink.data(f"{db}.big")), engine)
        assert len(reads(sink, f"{db}.big")) <= at_pause + 5  # at most the window that was open
        fresh_db.signals.insert_one({"type": "resume-snapshot"})
        wait_for(lambda: len(reads(sink, f"{db}.big")) > at_pause + 20, engine)
        assert not metrics.SnapshotPaused
        fresh_db.signals.insert_one({"type": "stop-snapshot", "data": {"type": "incremental"}})
        wait_for(lambda: "ABORTED" in kinds(sink, SNAPSHOT), engine)
        stopped_at = len(reads(sink, f"{db}.big"))
        fresh_db.big.insert_one({"_id": "after stop"})
        wait_for(lambda: sum(r.op == "c" for r in sink.data(f"{db}.big")) == 2, engine)
    finally:
        engine.stop()
    assert kinds(sink, SNAPSHOT)[-1] == "ABORTED" and "RESUMED" in kinds(sink, SNAPSHOT)
    assert stopped_at < 1500 and len(reads(sink, f"{db}.big")) <= stopped_at + 5
    assert metrics.SnapshotAborted and not metrics.SnapshotCompleted
    stored = offsets.load()
    assert stored is not None and stored.incremental is None


def test_stop_some_collections(mongo_uri: str, fresh_db: Database[Any]) -> None:
    db = fresh_db.name
    fresh_db.keep.insert_many([{"_id": i} for i in range(30)])
    fresh_db.drop_me.insert_many([{"_id": i} for i in range(3000)])
    cfg = engine_config(mongo_uri, db, **{"incremental.snapshot.chunk.size": 3, "snapshot.max.threads": 2})
    sink = MemorySink()
    engine = _start(cfg, sink)
    try:
        fresh_db.signals.insert_many([
            _execute([f"{db}.keep", f"{db}.drop_me"]),
            {"type": "stop-snapshot", "data": {"type": "incremental", "data-collections": [f"{db}.drop_me"]}},
        ])
        wait_for(lambda: "COMPLETED" in kinds(sink, SNAPSHOT), engine)
    finally:
        engine.stop()
    assert read_ids(sink, f"{db}.keep") == list(range(30))
    assert len(read_ids(sink, f"{db}.drop_me")) < 3000
    aborted = [n for n in notifications(sink, SNAPSHOT) if n["type"] == "ABORTED"]
    assert aborted[0]["additional_data"]["data_collections"] == f"{db}.drop_me"


def _dispatching_a_change() -> bool:
    """Whether some thread is inside ``Dispatcher.change`` right now."""
    for frame in sys._current_frames().values():
        current: FrameType | None = frame
        while current is not None:
            code = current.f_code
            if code.co_name == "change" and code.co_filename.endswith("dispatcher.py"):
                return True
            current = current.f_back
    return False


class _ReentrySink(MemorySink):
    """Notes snapshot reads written while a change is being dispatched (a re-entered dispatcher)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads_inside_change = 0

    def write(self, records: Sequence[Record]) -> None:
        if any(r.op == "r" for r in records) and _dispatching_a_change():
            self.reads_inside_change += 1
        super().write(records)


def test_blocking_snapshot_pauses_streaming(mongo_uri: str, fresh_db: Database[Any]) -> None:
    db = fresh_db.name
    fresh_db.items.insert_many([{"_id": i, "qty": i} for i in range(50)])
    sink = _ReentrySink()
    engine = _start(engine_config(mongo_uri, db), sink)
    try:
        fresh_db.signals.insert_one({"_id": ObjectId(), "type": "execute-snapshot", "data": {
            "type": "blocking", "data-collections": [f"{db}.items"],
            "additional-conditions": [{"data-collection": f"{db}.items", "filter": {"qty": {"$gte": 10}}}],
        }})
        fresh_db.items.insert_one({"_id": 500, "qty": 500})
        wait_for(lambda: "COMPLETED" in kinds(sink, "Initial Snapshot")
                 and any(r.op == "c" for r in sink.data(f"{db}.items")), engine)
    finally:
        engine.stop()
    data = sink.data(f"{db}.items")
    ops = [r.op for r in data if r.op is not None]
    first_create = ops.index("c")
    assert set(ops[:first_create]) == {"r"}  # the insert waited for the snapshot to finish
    ids = read_ids(sink, f"{db}.items")
    assert sorted(i for i in ids if i != 500) == list(range(10, 50))  # the additional condition
    markers = [payload(r)["source"]["snapshot"] for r in reads(sink, f"{db}.items")]
    assert markers[0] == "first" and markers[-1] == "last" and "incremental" not in markers
    assert len({r.position for r in reads(sink, f"{db}.items")}) == 1  # the position before the copy
    # The pipeline paused streaming and ran the snapshot: it never ran from inside a dispatch.
    assert sink.reads_inside_change == 0


def test_restart_in_the_middle_of_an_incremental_snapshot(
    mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any], tmp_path: Path
) -> None:
    db = fresh_db.name
    fresh_db.items.insert_many([{"_id": i} for i in range(1200)])
    cfg = engine_config(mongo_uri, db, **{"incremental.snapshot.chunk.size": 10, "offset.flush.interval.ms": 50})
    offsets = FileOffsetStore(tmp_path / "offsets.json")
    first = MemorySink()
    engine = _start(cfg, first, offsets)
    try:
        fresh_db.signals.insert_one(_execute([f"{db}.items"]))
        wait_for(lambda: len(reads(first, f"{db}.items")) >= 200, engine)
    finally:
        engine.stop()
    stored = offsets.load()
    assert stored is not None and stored.incremental is not None
    state = IncrementalState.from_json(stored.incremental)
    (last,) = state.last_keys[f"{db}.items"]
    assert 200 <= last + 1 < 1200
    durable = read_ids(MemorySinkView(first.durable), f"{db}.items")
    assert durable == list(range(last + 1))  # progress never runs ahead of flushed reads

    second = MemorySink()
    engine = _start(cfg, second, offsets)
    try:
        wait_for(lambda: "COMPLETED" in kinds(second, SNAPSHOT), engine)
    finally:
        engine.stop()
    assert read_ids(second, f"{db}.items") == list(range(last + 1, 1200))  # continues with the next chunk
    started = notifications(second, SNAPSHOT)[0]
    assert started["type"] == "STARTED" and started["additional_data"]["resumed"] == "true"


class MemorySinkView(MemorySink):
    """A sink holding a fixed list of records (to inspect what a flush made durable)."""

    def __init__(self, records: list[Any]) -> None:
        super().__init__()
        self.records = list(records)


def test_concurrent_writes_during_an_engine_snapshot_replay_to_the_source(
    mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any]
) -> None:
    db = fresh_db.name
    fresh_db.create_collection("items", changeStreamPreAndPostImages={"enabled": True})
    fresh_db.items.insert_many([{"_id": i, "v": 0} for i in range(400)])
    cfg = engine_config(mongo_uri, db, **{
        "incremental.snapshot.chunk.size": 7, "capture.mode.full.update.type": "post_image",
        "incremental.snapshot.watermarking.strategy": "insert_delete",
    })
    sink = MemorySink()
    engine = _start(cfg, sink)
    halt = threading.Event()

    def write() -> None:
        rng = random.Random(3)
        while not halt.is_set():
            key = rng.randrange(450)
            choice = rng.random()
            if choice < 0.5:
                fresh_db.items.update_one({"_id": key}, {"$inc": {"v": 1}, "$set": {"w": rng.random()}})
            elif choice < 0.75:
                fresh_db.items.replace_one({"_id": key}, {"r": rng.random()}, upsert=True)
            else:
                fresh_db.items.delete_one({"_id": key})

    writer = threading.Thread(target=write)
    try:
        writer.start()
        fresh_db.signals.insert_one(_execute([f"{db}.items"]))
        wait_for(lambda: "COMPLETED" in kinds(sink, SNAPSHOT), engine)
        halt.set()
        writer.join()
        fresh_db.marker.insert_one({"_id": "end"})  # everything before it has been dispatched once it arrives
        wait_for(lambda: bool(sink.data(f"{db}.marker")), engine)
    finally:
        halt.set()
        writer.join()
        engine.stop()
    rebuilt = replay(sink.records, f"{db}.items")
    source = list(fresh_db.items.find())
    assert canonical(rebuilt) == canonical(source), differences(source, rebuilt)
    assert any(r.op == "u" for r in sink.data(f"{db}.items"))  # writes really overlapped the snapshot
