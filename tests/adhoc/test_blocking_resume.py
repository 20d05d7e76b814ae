"""Blocking ad hoc snapshots resume after a failed sink or a lost connection, and streaming goes on at the signal.

(Stops by SIGTERM and ``kill -9`` of a real process: tests/engine/test_snapshot_resume.py.)
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from mongocdc_core.coordinator import Engine
from mongocdc_core.events.records import Record
from mongocdc_core.offsets import FileOffsetStore, MemoryOffsetStore
from mongocdc_core.positions import Position
from mongocdc_core.receiver import ProgressListener
from mongocdc_core.replay import canonical, differences
from tests.engine.engine_support import run_engine

from .support import (
    Background,
    MemorySink,
    cluster_time,
    engine_config,
    kinds,
    notifications,
    payload,
    read_ids,
    replay,
    wait_for,
)

DOCS, SPLIT = 2000, 200
SNAPSHOT = "Initial Snapshot"


class _FailingAfterReads(MemorySink):
    """A sink whose flushes fail once it holds ``reads`` snapshot records (a broker gone for good)."""

    def __init__(self, reads: int) -> None:
        super().__init__()
        self.limit = reads

    def flush(self, timeout: float | None = None) -> None:
        if sum(r.op == "r" for r in self.records) >= self.limit:
            raise OSError("sink failure injected")
        super().flush(timeout)


class _Listener(ProgressListener):
    """Streaming began; and, once ``at`` documents were copied, runs ``action`` once."""

    def __init__(self, at: int = 0, action: Any = None) -> None:
        self.streaming = threading.Event()
        self.at = at
        self.action = action

    def streaming_started(self, position: Position | None) -> None:
        self.streaming.set()

    def snapshot_progress(self, namespace: str, copied: int, total: int | None) -> None:
        if self.action is not None and copied >= self.at:
            action, self.action = self.action, None
            action()


def _signal_then_write(db: Database[Any]) -> None:
    """The signal, then changes that the stream must deliver once the snapshot is complete (the copy
    may or may not see the updates already: ``_id`` values stay the same, so the reads are known)."""
    db.signals.insert_one({"type": "execute-snapshot", "data": {"type": "blocking", "data-collections": [f"{db.name}.big"]}})
    db.big.update_many({"_id": {"$in": [3, 1500, 1999]}}, {"$set": {"changed": True}})
    db.other.insert_one({"_id": "late"})
    db.other.delete_one({"_id": "late"})


def _data_ops(records: Sequence[Record], namespace: str) -> list[str]:
    return [r.op for r in records if r.collection == namespace and r.op is not None]


def test_a_failed_sink_resumes_with_the_ranges_not_flushed(fresh_db: Database[Any], mongo_uri: str, tmp_path: Path) -> None:
    db, ns = fresh_db.name, f"{fresh_db.name}.big"
    fresh_db.big.insert_many([{"_id": i, "v": i} for i in range(DOCS)])
    cfg = engine_config(mongo_uri, db, **{
        "mongocdc.snapshot.split.size": SPLIT, "snapshot.max.threads": 2, "snapshot.fetch.size": 50,
        "offset.flush.interval.ms": 600000,
    })
    offsets = FileOffsetStore(tmp_path / "offsets.json")
    failing = _FailingAfterReads(reads=DOCS // 2)
    listener = _Listener()
    engine = Background(Engine(cfg, failing, offsets, progress=listener)).start()
    wait_for(listener.streaming.is_set, engine)
    _signal_then_write(fresh_db)
    with pytest.raises(OSError, match="injected"):
        engine.wait()
    stored = offsets.load()
    assert stored is not None and stored.blocking is not None and stored.blocking.running
    assert 0 < sum(1 for e in stored.blocking.parts[ns] if e["done"]) < len(stored.blocking.parts[ns])
    durable = list(failing.durable)
    assert _data_ops(durable, ns) == ["r"] * len(_data_ops(durable, ns))  # streaming paused at the signal

    resumed = MemorySink()
    run_engine(cfg, resumed, offsets, stop_at=cluster_time(fresh_db.client))
    first, second = read_ids(MemorySinkOf(durable), ns), read_ids(resumed, ns)
    assert first and second
    assert Counter(first + second) == Counter(range(DOCS)), "every document exactly once across the failure"
    ops = _data_ops(resumed.records, ns)
    assert ops == ["r"] * len(second) + ["u", "u", "u"]  # the stream goes on where it paused, once
    assert _data_ops(resumed.records, f"{db}.other") == ["c", "d"]
    rebuilt = replay(durable + resumed.records, ns)
    source = list(fresh_db.big.find())
    assert canonical(rebuilt) == canonical(source), differences(source, rebuilt)
    started = [n for n in notifications(resumed, SNAPSHOT) if n["type"] == "STARTED"]
    assert started and started[0]["additional_data"].get("resumed") == "true"
    final = offsets.load()
    assert final is not None and final.blocking is None


@pytest.mark.fault
def test_a_lost_connection_restarts_the_connector_and_the_snapshot_continues(
    fresh_db: Database[Any], mongo_uri: str, emulator: Any
) -> None:
    db, ns = fresh_db.name, f"{fresh_db.name}.big"
    fresh_db.big.insert_many([{"_id": i, "v": i} for i in range(DOCS)])
    cfg = engine_config(mongo_uri, db, **{
        "mongocdc.snapshot.split.size": SPLIT, "snapshot.max.threads": 1, "snapshot.fetch.size": 50,
        "retriable.restart.connector.wait.ms": 100, "mongodb.heartbeat.frequency.ms": 500,
    })
    admin = fresh_db.client.admin

    def lose_connection() -> None:  # the next range's find (and pymongo's one retry) loses its connection
        admin.command("configureFailPoint", "failCommand", mode={"times": 2},
                      data={"failCommands": ["find"], "closeConnection": True})

    sink = MemorySink()
    listener = _Listener(at=DOCS // 3, action=lose_connection)
    engine = Background(Engine(cfg, sink, MemoryOffsetStore(), progress=listener)).start()
    try:
        wait_for(listener.streaming.is_set, engine)
        _signal_then_write(fresh_db)
        wait_for(lambda: "d" in _data_ops(sink.records, f"{db}.other"), engine, timeout=60)
    finally:
        engine.stop()
        admin.command("configureFailPoint", "failCommand", mode="off")
    assert kinds(sink, SNAPSHOT) == ["STARTED", "ABORTED", "STARTED", "TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert Counter(read_ids(sink, ns)) == Counter(range(DOCS)), "every document exactly once across the restart"
    assert _data_ops(sink.records, ns) == ["r"] * DOCS + ["u", "u", "u"]
    assert _data_ops(sink.records, f"{db}.other") == ["c", "d"]
    markers = Counter(payload(r)["source"]["snapshot"] for r in sink.data(ns) if r.op == "r")
    assert markers["first"] == 1 and markers["last"] == 1 and markers["true"] == DOCS - 2


class MemorySinkOf(MemorySink):
    """A view of a fixed list of records."""

    def __init__(self, records: list[Record]) -> None:
        super().__init__()
        self.records = list(records)
