"""No ghosts: ``mongocdc.snapshot.delete.missing.keys`` ends a full re-snapshot with deletes for the keys
downstream still holds that the source no longer has.

Documents deleted while the connector was away and whose delete events left the oplog ("history
lost", re-snapshot under ``snapshot.mode=when_needed``) would otherwise stay downstream forever. The
sink reads its own records back (JSON Lines files, the Parquet landing zone, Kafka topics): every key
it held before the snapshot began that neither the snapshot read nor the stream touched since is
gone from the source, and gets a delete event and a tombstone.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from bson import ObjectId
from pymongo.database import Database

from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import FileOffsetStore
from mongocdc_core.receiver import ProgressListener
from mongocdc_core.replay import Replayer, canonical
from mongocdc_core.sinks.base import KeyScan
from mongocdc_core.sinks.jsonl import JsonlSink
from mongocdc_core.sinks.parquet import ParquetSink
from mongocdc_core.source.errors import CdcError
from tests.engine.engine_support import MemorySink, make_config, run_engine, source_state

DELETE_MISSING = "mongocdc.snapshot.delete.missing.keys"


def _jsonl_pairs(out: Path, topic: str) -> list[tuple[bytes, bytes | None]]:
    pairs = []
    for line in (out / f"{topic}.jsonl").read_bytes().splitlines():
        item = orjson.loads(line)
        pairs.append((orjson.dumps(item["key"]), orjson.dumps(item["value"]) if item["value"] is not None else None))
    return pairs


def _rebuilt(out: Path, topic: str, namespace: str) -> list[str]:
    return canonical(Replayer().apply_all(_jsonl_pairs(out, topic)).documents(namespace))


def _lose_history(db: Database[Any]) -> None:
    """Changes made while the connector is stopped, then purged from the oplog."""
    db.a.delete_many({"_id": {"$in": [3, 4, "s", ObjectId("0" * 24)]}})
    db.a.update_one({"_id": 5}, {"$set": {"n": -5}})
    db.a.insert_one({"_id": 100})
    db.client.admin.command("mongocdcTruncateOplog", before=db.client.admin.command("hello")["$clusterTime"]["clusterTime"])


def _seed(db: Database[Any]) -> None:
    db.a.insert_many([{"_id": i, "n": i} for i in range(8)] + [{"_id": "s"}, {"_id": ObjectId("0" * 24)}])


@pytest.mark.fault  # history loss is provoked with the emulator's oplog truncation
@pytest.mark.parametrize("enabled", [True, False], ids=["deletes", "ghosts"])
def test_a_re_snapshot_after_history_loss_deletes_the_keys_it_no_longer_finds(
    fresh_db: Database[Any], mongo_uri: str, emulator: Any, tmp_path: Path, enabled: bool
) -> None:
    _seed(fresh_db)
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "when_needed", DELETE_MISSING: str(enabled).lower()})
    out, offsets = tmp_path / "out", FileOffsetStore(tmp_path / "offsets.json")
    sink = JsonlSink(out)
    run_engine(cfg, sink, offsets)
    sink.close()
    _lose_history(fresh_db)
    sink = JsonlSink(out)
    summary = run_engine(cfg, sink, offsets)
    sink.close()
    assert summary.snapshot_performed
    topic = cfg.data_topic(fresh_db.name, "a")
    rebuilt = _rebuilt(out, topic, f"{fresh_db.name}.a")
    if not enabled:
        assert len(rebuilt) == len(source_state(fresh_db.a)) + 4  # the four ghosts stay downstream
        return
    assert rebuilt == source_state(fresh_db.a)
    values = [orjson.loads(v) if v else None for _, v in _jsonl_pairs(out, topic)]
    deletes = [v for v in values if v is not None and v["op"] == "d"]
    assert len(deletes) == 4 and values.count(None) == 4  # each delete followed by its tombstone


class _StopAfterFirstChunk(ProgressListener):
    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.stopped = threading.Event()

    def snapshot_progress(self, namespace: str, copied: int, total: int | None) -> None:
        if self.engine is not None and not self.stopped.is_set():
            self.stopped.set()
            self.engine.stop()


@pytest.mark.fault
def test_a_resumed_re_snapshot_deletes_only_what_is_gone(
    fresh_db: Database[Any], mongo_uri: str, emulator: Any, tmp_path: Path
) -> None:
    """Reads of the interrupted first attempt count as read: the resumed copy does not re-read them."""
    _seed(fresh_db)
    cfg = make_config(mongo_uri, fresh_db.name, **{
        "snapshot.mode": "when_needed", DELETE_MISSING: "true", "max.batch.size": 2, "offset.flush.interval.ms": 0,
    })
    out, offsets = tmp_path / "out", FileOffsetStore(tmp_path / "offsets.json")
    sink = JsonlSink(out)
    run_engine(cfg, sink, offsets)
    sink.close()
    _lose_history(fresh_db)

    stopper = _StopAfterFirstChunk()
    sink = JsonlSink(out)
    stopper.engine = Engine(cfg, sink, offsets, progress=stopper)
    first = stopper.engine.run()
    sink.close()
    assert stopper.stopped.is_set() and not first.snapshot_completed
    stored = offsets.load()
    assert stored is not None and stored.snapshot is not None and stored.snapshot.marks

    sink = JsonlSink(out)
    second = run_engine(cfg, sink, offsets)
    sink.close()
    assert second.snapshot_completed and second.snapshot_documents < len(source_state(fresh_db.a))
    topic = cfg.data_topic(fresh_db.name, "a")
    assert _rebuilt(out, topic, f"{fresh_db.name}.a") == source_state(fresh_db.a)
    values = [orjson.loads(v) for _, v in _jsonl_pairs(out, topic) if v]
    assert sum(v["op"] == "d" for v in values) == 4


@pytest.mark.fault
def test_the_parquet_landing_zone_reads_its_keys_back(fresh_db: Database[Any], mongo_uri: str, emulator: Any,
                                                      tmp_path: Path) -> None:
    _seed(fresh_db)
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "when_needed", DELETE_MISSING: "true"})
    offsets = FileOffsetStore(tmp_path / "offsets.json")
    sink = ParquetSink(tmp_path / "landing")
    run_engine(cfg, sink, offsets)
    sink.close()
    _lose_history(fresh_db)
    sink = ParquetSink(tmp_path / "landing")
    run_engine(cfg, sink, offsets)
    topic = cfg.data_topic(fresh_db.name, "a")
    scan = sink.scan_keys(topic, None, _far_future())
    sink.close()
    assert scan is not None
    expected = {orjson.loads(k)["id"] for k in _keys_of(fresh_db)}
    assert scan.present == expected  # the ghosts were deleted in the landing zone too


def _far_future() -> Any:
    from mongocdc_core.positions import Position

    return Position(2**32 - 1, 0)


def _keys_of(db: Database[Any]) -> list[bytes]:
    from mongocdc_core.events import EventConverter, EventOptions

    converter = EventConverter(EventOptions.from_config(make_config("mongodb://h/?replicaSet=rs0", db.name), rs="rs0"))
    return [converter.convert_read(d, db.name, "a", _far_future(), "true").key or b"" for d in db.a.find()]


def test_a_sink_that_cannot_read_back_is_refused_before_anything_starts(
    mongo_uri: str, fresh_db: Database[Any], tmp_path: Path
) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{DELETE_MISSING: "true"})
    with pytest.raises(CdcError, match="mongocdc.snapshot.delete.missing.keys=true needs a sink"):
        run_engine(cfg, MemorySink(), FileOffsetStore(tmp_path / "offsets.json"))
    assert not (tmp_path / "offsets.json").exists()


def test_the_jsonl_scan_splits_at_the_mark_and_ignores_a_torn_tail(tmp_path: Path) -> None:
    def line(key: Mapping[str, Any] | None, value: Mapping[str, Any] | None) -> bytes:
        return orjson.dumps({"key": key, "value": value}) + b"\n"

    def k(i: int) -> dict[str, Any]:
        return {"schema": {"type": "struct"}, "payload": {"id": str(i)}}

    before = (line(k(1), {"payload": {"op": "r"}}) + line(k(2), {"payload": {"op": "r"}})
              + line(k(2), {"payload": {"op": "d"}}) + line(k(2), None) + line(k(3), {"payload": {"op": "c"}})
              + line({"payload": {"serverName": "x"}}, {"payload": {"ts_ms": 1}}))
    after = line(k(3), {"payload": {"op": "r"}}) + b'{"key":{"payload":{"id":"9"}},"val'
    path = tmp_path / "t.jsonl"
    path.write_bytes(before + after)
    from mongocdc_core.positions import Position

    sink = JsonlSink(tmp_path)
    scan = sink.scan_keys("t", len(before), Position(1, 1))
    assert scan == KeyScan(present={"1", "3"}, touched={"3"})
    assert scan.missing() == ["1"]
    assert sink.scan_keys("t", len(before) * 10, Position(1, 1)) is None  # the file shrank: cannot tell


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_compressed_file_is_read_back_split_at_the_mark_without_its_torn_member(
    tmp_path: Path, compression: str
) -> None:
    """Marks of compressed files fall between members (taking one ends the open member)."""
    from mongocdc_core.events.records import Record
    from mongocdc_core.positions import Position

    def record(i: int, op: str | None) -> Record:
        value = None if op is None else orjson.dumps({"op": op})  # records without the schema part
        return Record("t", orjson.dumps({"id": str(i)}), value, Position(1, i), "db.t", op)

    sink = JsonlSink(tmp_path, compression=compression)
    sink.write([record(1, "r"), record(2, "r"), record(2, "d"), record(2, None), record(3, "c")])
    mark = sink.key_mark("t")  # not flushed before: taking the mark ends the member
    sink.write([record(3, "r"), record(4, "c")])
    sink.flush()
    sink.close()
    path = sink.path("t")
    whole = path.read_bytes()
    with open(path, "ab") as torn:  # kill -9 in the middle of writing the next member
        torn.write(whole[mark : mark + (len(whole) - mark) // 2])
    scan = JsonlSink(tmp_path, compression=compression).scan_keys("t", mark, Position(1, 1))
    assert scan == KeyScan(present={"1", "3"}, touched={"3", "4"})
    assert scan is not None and scan.missing() == ["1"]



def test_a_blocking_snapshot_deletes_keys_downstream_holds_but_the_source_lacks(
    fresh_db: Database[Any], mongo_uri: str, tmp_path: Path
) -> None:
    """Deletes a first configuration skipped (``skipped.operations=d``) are caught up by a blocking snapshot."""
    fresh_db.a.insert_many([{"_id": i} for i in range(6)])
    fresh_db.signals.insert_one({"_id": "warmup"})
    base = {"signal.data.collection": f"{fresh_db.name}.signals", DELETE_MISSING: "true"}
    out, offsets = tmp_path / "out", FileOffsetStore(tmp_path / "offsets.json")
    skipping = make_config(mongo_uri, fresh_db.name, **base, **{"skipped.operations": "d"})
    sink = JsonlSink(out)
    run_engine(skipping, sink, offsets)  # the initial snapshot: 6 reads
    fresh_db.a.delete_many({"_id": {"$in": [1, 4]}})
    run_engine(skipping, sink, offsets)  # both deletes skipped: 1 and 4 stay downstream
    sink.close()
    fresh_db.signals.insert_one({"type": "execute-snapshot", "data": {
        "type": "blocking", "data-collections": [f"{fresh_db.name}.a"]}})
    sink = JsonlSink(out)
    run_engine(make_config(mongo_uri, fresh_db.name, **base), sink, offsets)
    sink.close()
    topic = skipping.data_topic(fresh_db.name, "a")
    assert _rebuilt(out, topic, f"{fresh_db.name}.a") == source_state(fresh_db.a)
    ops = [orjson.loads(v)["op"] for _, v in _jsonl_pairs(out, topic) if v]
    assert ops.count("d") == 2 and ops.count("r") == 6 + 4
