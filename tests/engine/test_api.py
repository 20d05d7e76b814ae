"""The orchestrator API: collections, snapshots of one collection, stream windows, oplog window."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from bson import Timestamp

from mongocdc_core import api
from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position
from tests.engine.engine_support import MemorySink, make_config, replay, source_state


def _stable(records: list[Record]) -> list[tuple[Any, ...]]:
    """Records without the processing-time fields (``ts_ms/ts_us/ts_ns`` of the envelope)."""
    out = []
    for r in records:
        value = orjson.loads(r.value) if r.value is not None else None
        if isinstance(value, dict):
            payload = value.get("payload", value)
            for f in ("ts_ms", "ts_us", "ts_ns"):
                payload.pop(f, None)
        out.append((r.topic, r.key, value, r.position, r.collection, r.op))
    return out


def _now(client: Any) -> Timestamp:
    ts = client.admin.command("hello")["$clusterTime"]["clusterTime"]
    assert isinstance(ts, Timestamp)
    return ts


def _after(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1)


def test_list_captured_collections(fresh_db: Any, mongo_uri: str) -> None:
    for name in ("b", "a", "system_like", "c"):
        fresh_db[name].insert_one({})
    cfg = make_config(mongo_uri, fresh_db.name, **{"collection.include.list": f"{fresh_db.name}\\.[ab]"})
    assert api.list_captured_collections(cfg) == [f"{fresh_db.name}.a", f"{fresh_db.name}.b"]


def test_snapshot_collection_records_position_before_the_copy(fresh_db: Any, mongo_uri: str) -> None:
    fresh_db.a.insert_many([{"_id": i, "n": i} for i in range(5)])
    cfg = make_config(mongo_uri, fresh_db.name)
    before = _now(fresh_db.client)
    sink = MemorySink()
    result = api.snapshot_collection(cfg, f"{fresh_db.name}.a", sink, filter={"n": {"$lt": 3}})
    assert result.documents == 3 and result.bytes > 0 and result.resume_token is not None
    assert (result.position.seconds, result.position.increment) >= (before.time, before.inc)
    assert {r.position for r in sink.durable} == {result.position}
    markers = [orjson.loads(r.value or b"{}")["source"]["snapshot"] for r in sink.durable]
    assert markers == ["first", "true", "last"]


def test_stream_window_is_idempotent_and_windows_tile(fresh_db: Any, mongo_uri: str) -> None:
    client = fresh_db.client
    cfg = make_config(mongo_uri, fresh_db.name)
    ns = f"{fresh_db.name}.a"
    fresh_db.a.insert_one({"_id": 0})
    t0 = _after(_now(client))  # the window start is inclusive
    fresh_db.a.insert_one({"_id": 1})
    with client.start_session() as session, session.start_transaction():
        fresh_db.a.insert_one({"_id": 2}, session=session)
        fresh_db.a.update_one({"_id": 1}, {"$set": {"x": 1}}, session=session)
    tm = _after(_now(client))
    fresh_db.a.delete_one({"_id": 0})
    fresh_db.b.insert_one({"_id": 9})  # other collection: not in a one-collection window
    t1 = _after(_now(client))

    first, second = MemorySink(), MemorySink()
    r1 = api.stream_window(cfg, ns, t0, t1, first)
    r2 = api.stream_window(cfg, ns, t0, t1, second)
    assert _stable(first.durable) == _stable(second.durable)
    assert r1.counts == {"c": 2, "u": 1, "d": 1} and r1.events == 4 and r1 == r2
    assert r1.first_position is not None and r1.last_position is not None
    assert r1.first_position >= Position.from_timestamp(t0)

    left, right = MemorySink(), MemorySink()
    api.stream_window(cfg, ns, t0, tm, left)
    api.stream_window(cfg, ns, tm, t1, right)
    assert _stable(left.durable + right.durable) == _stable(first.durable)

    whole = MemorySink()
    everything = api.stream_window(cfg, None, t0, t1, whole)
    assert everything.events == 5


def test_stream_window_waits_for_a_future_end(fresh_db: Any, mongo_uri: str) -> None:
    cfg = make_config(mongo_uri, fresh_db.name)
    start = _now(fresh_db.client)
    end = Timestamp(start.time + 2, 0)
    fresh_db.a.insert_one({"_id": 1})
    began = time.time()
    sink = MemorySink()
    result = api.stream_window(cfg, f"{fresh_db.name}.a", start, end, sink)
    assert result.events == 1
    assert time.time() >= end.time - 1  # it did not return before the cluster time reached the end
    # the end only passes with later writes (or the server's periodic no-op)
    assert time.time() - began < 60


def test_bad_windows_are_refused(fresh_db: Any, mongo_uri: str) -> None:
    cfg = make_config(mongo_uri, fresh_db.name)
    with pytest.raises(api.CdcError, match="empty window"):
        api.stream_window(cfg, f"{fresh_db.name}.a", Timestamp(10, 1), Timestamp(10, 1), MemorySink())
    with pytest.raises(api.CdcError, match="namespace"):
        api.snapshot_collection(cfg, "nodot", MemorySink())


def test_oplog_window_and_cluster_time(fresh_db: Any, mongo_uri: str) -> None:
    cfg = make_config(mongo_uri, fresh_db.name)
    fresh_db.a.insert_one({})
    window = api.oplog_window(cfg)
    now = api.current_cluster_time(cfg)
    assert (window.first.time, window.first.inc) <= (window.last.time, window.last.inc) <= (now.time, now.inc)
    assert window.size_bytes >= 0 and window.hours >= 0


@pytest.mark.fault
def test_stream_window_history_lost(fresh_db: Any, mongo_uri: str, emulator: Any) -> None:
    cfg = make_config(mongo_uri, fresh_db.name)
    client = fresh_db.client
    fresh_db.a.insert_one({"_id": 1})
    t0 = _now(client)
    fresh_db.a.insert_one({"_id": 2})
    t1 = _after(_now(client))
    fresh_db.a.insert_one({"_id": 3})
    client.admin.command("mongocdcTruncateOplog", before=_now(client))
    with pytest.raises(api.HistoryLostError, match="history lost"):
        api.stream_window(cfg, f"{fresh_db.name}.a", t0, t1, MemorySink())


def test_snapshot_then_windows_rebuild_the_collection(fresh_db: Any, mongo_uri: str) -> None:
    """docs/architecture.md section 3: for each key the highest position wins, whatever the materialisation order."""
    cfg = make_config(mongo_uri, fresh_db.name)
    ns = f"{fresh_db.name}.a"
    fresh_db.a.insert_many([{"_id": i} for i in range(3)])
    t0 = _now(fresh_db.client)
    fresh_db.a.update_one({"_id": 1}, {"$set": {"v": 1}})
    snap = MemorySink()
    result = api.snapshot_collection(cfg, ns, snap)
    fresh_db.a.delete_one({"_id": 2})
    t1 = _after(_now(fresh_db.client))
    window = MemorySink()
    api.stream_window(cfg, ns, t0, t1, window)
    merged = sorted(snap.durable + window.durable, key=lambda r: r.position)
    assert replay(merged, ns) == source_state(fresh_db.a)
    assert result.position > Position.from_timestamp(t0)
