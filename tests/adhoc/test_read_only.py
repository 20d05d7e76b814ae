"""Read-only incremental snapshots (``incremental.snapshot.watermarking.strategy=read_only``).

Watermarks are cluster times, so the connector writes nothing to the source: no signaling
collection, no oplog entry of its own, no write command on the wire. De-duplication under
concurrent writes is shown by tests/adhoc/test_generated.py for every strategy; here the running
connector, with the signal coming through the file channel.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from bson import Timestamp
from pymongo import MongoClient, monitoring
from pymongo.database import Database

from mongocdc_core.api import incremental_snapshot_collection
from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import MemoryOffsetStore
from mongocdc_core.positions import Position
from mongocdc_core.receiver import ProgressListener
from mongocdc_core.replay import canonical, differences
from mongocdc_core.source import connection, incremental

from .support import (
    Background,
    MemorySink,
    cluster_time,
    engine_config,
    kinds,
    make_config,
    read_ids,
    replay,
    wait_for,
)

WRITE_COMMANDS = frozenset({
    "insert", "update", "delete", "findAndModify", "bulkWrite", "create", "createIndexes", "drop", "dropIndexes",
    "dropDatabase", "collMod", "renameCollection",
})  # fmt: skip
SNAPSHOT = "Incremental Snapshot"


class _Commands(monitoring.CommandListener):
    """Every command the connector's own clients send."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        with self._lock:
            self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        """Only what was sent matters."""

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        """Only what was sent matters."""

    def writes(self) -> set[str]:
        with self._lock:
            return set(self.names) & WRITE_COMMANDS


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> _Commands:
    """Records the commands of every client the connector opens from now on."""
    recorder = _Commands()

    def client(uri: str, event_listeners: list[Any] | None = None, **kwargs: Any) -> MongoClient[Any]:
        return MongoClient(uri, event_listeners=[*(event_listeners or []), recorder], **kwargs)

    monkeypatch.setattr(connection, "MongoClient", client)
    return recorder


def _oplog_writes(client: MongoClient[Any], since: Timestamp) -> list[dict[str, Any]]:
    """Oplog entries after ``since`` other than the server's periodic no-ops."""
    return list(client.local["oplog.rs"].find({"ts": {"$gt": since}, "op": {"$ne": "n"}}))


@pytest.mark.parametrize("strategy", ["read_only", "insert_delete"])
def test_read_only_watermarks_write_nothing_to_the_source(
    mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any], commands: _Commands, strategy: str
) -> None:
    db = fresh_db.name
    fresh_db.items.insert_many([{"_id": i, "v": i} for i in range(95)])
    cfg = make_config(mongo_uri, db, **{
        "incremental.snapshot.chunk.size": 10, "incremental.snapshot.watermarking.strategy": strategy,
        **({"signal.data.collection": ""} if strategy == "read_only" else {}),
    })
    before = cluster_time(mongo_client)
    sink = MemorySink()
    result = incremental_snapshot_collection(cfg, f"{db}.items", sink)
    assert result.documents == 95 and read_ids(sink, f"{db}.items") == list(range(95))
    if strategy == "read_only":
        assert commands.writes() == set(), "a read-only snapshot sent a write command"
        assert _oplog_writes(mongo_client, before) == [], "a read-only snapshot left an entry in the oplog"
        assert "signals" not in fresh_db.list_collection_names()
        assert "find" in commands.names and "ping" in commands.names
    else:  # the control: written watermarks are seen by both checks
        assert "insert" in commands.writes() and "delete" in commands.writes()
        assert {entry["ns"] for entry in _oplog_writes(mongo_client, before)} >= {f"{db}.signals"}


def test_read_only_chunks_take_positions_after_every_event_dispatched_before_them(
    mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each chunk is read after a write to a key outside it: its reads sort after that event (same
    clusterTime or later), never before it, and before everything the stream delivers next."""
    db = fresh_db.name
    fresh_db.items.insert_many([{"_id": i} for i in range(30)])
    read = incremental.read_chunk

    def write_then_read(collection: Any, last: Any, condition: Any, size: int, session: Any = None) -> Any:
        fresh_db.items.update_one({"_id": 29}, {"$inc": {"n": 1}})  # the last chunk's key: dropped from it
        return read(collection, last, condition, size, session)

    monkeypatch.setattr(incremental, "read_chunk", write_then_read)
    cfg = make_config(mongo_uri, db, **{
        "incremental.snapshot.chunk.size": 7, "incremental.snapshot.watermarking.strategy": "read_only",
    })
    sink = MemorySink()
    result = incremental_snapshot_collection(cfg, f"{db}.items", sink)
    records = sink.data(f"{db}.items")
    assert [r.position for r in records] == sorted(r.position for r in records)  # delivery order = position order
    assert [r.op for r in records].count("u") == 5
    assert read_ids(sink, f"{db}.items") == list(range(29))  # 29 changed inside its window: the event stands
    assert result.end_position is not None and result.end_position >= records[-1].position


class _Streaming(ProgressListener):
    def __init__(self) -> None:
        self.started = threading.Event()

    def streaming_started(self, position: Position | None) -> None:
        self.started.set()


def test_engine_read_only_snapshot_from_the_file_channel_under_concurrent_writes_replays_to_the_source(
    mongo_uri: str, mongo_client: MongoClient[Any], fresh_db: Database[Any], tmp_path: Path, commands: _Commands
) -> None:
    db = fresh_db.name
    fresh_db.create_collection("items", changeStreamPreAndPostImages={"enabled": True})
    fresh_db.items.insert_many([{"_id": i, "v": 0} for i in range(400)])
    fresh_db.create_collection("marker")
    signals = tmp_path / "signals.jsonl"
    cfg = engine_config(mongo_uri, db, **{
        "signal.data.collection": "", "signal.enabled.channels": "file", "signal.file": str(signals),
        "signal.poll.interval.ms": 50, "incremental.snapshot.chunk.size": 7, "snapshot.max.threads": 2,
        "incremental.snapshot.watermarking.strategy": "read_only", "capture.mode.full.update.type": "post_image",
    })
    sink = MemorySink()
    streaming = _Streaming()
    engine = Background(Engine(cfg, sink, MemoryOffsetStore(), progress=streaming)).start()
    halt = threading.Event()
    written = threading.Event()

    def write() -> None:
        rng = random.Random(7)
        while not halt.is_set():
            key = rng.randrange(450)
            choice = rng.random()
            if choice < 0.5:
                fresh_db.items.update_one({"_id": key}, {"$inc": {"v": 1}, "$set": {"w": rng.random()}})
            elif choice < 0.75:
                fresh_db.items.replace_one({"_id": key}, {"r": rng.random()}, upsert=True)
            else:
                fresh_db.items.delete_one({"_id": key})
            written.set()

    writer = threading.Thread(target=write)
    try:
        wait_for(streaming.started.is_set, engine)
        before = cluster_time(mongo_client)
        writer.start()
        signal = {"id": "ro-1", "type": "execute-snapshot", "data": {"data-collections": [f"{db}.items"]}}
        signals.write_bytes(orjson.dumps(signal) + b"\n")
        wait_for(lambda: "COMPLETED" in kinds(sink, SNAPSHOT), engine, timeout=120)
        halt.set()
        writer.join()
        fresh_db.marker.insert_one({"_id": "end"})  # everything before it was dispatched once it arrives
        wait_for(lambda: bool(sink.data(f"{db}.marker")), engine)
    finally:
        halt.set()
        if writer.is_alive():
            writer.join()
        engine.stop()
    rebuilt = replay(sink.records, f"{db}.items")
    source = list(fresh_db.items.find())
    assert canonical(rebuilt) == canonical(source), differences(source, rebuilt)
    assert written.is_set() and any(r.op == "u" for r in sink.data(f"{db}.items"))  # writes overlapped it
    assert len(read_ids(sink, f"{db}.items")) > 0
    assert commands.writes() == set()
    own = [e for e in _oplog_writes(mongo_client, before) if e["ns"] not in (f"{db}.items", f"{db}.marker")]
    assert own == [], "the connector wrote to the source"
