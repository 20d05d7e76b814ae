"""Reconciliation at the table's position: passes while a writer keeps writing, fails on corrupted rows."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bson import json_util
from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.database import Database
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.sinks.parquet import ParquetSink
from mongocdc_core.tables import (
    CollectionTables,
    read_source_at,
    reconcile,
    reconcile_at_position,
    refresh_changelog,
    refresh_current_state,
)
from mongocdc_core.tables.changelog import table_properties
from mongocdc_core.tables.current_state import KINDS_PROPERTY
from tests.dagster.time_travel import travelling_replica_set

from .support import build


def _after(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1)


class Writer(threading.Thread):
    """Keeps changing the collection until stopped (inserts, updates, deletes of its own keys >= 1000)."""

    def __init__(self, uri: str, db: str) -> None:
        super().__init__(daemon=True)
        self.client: MongoClient = MongoClient(uri)
        self.coll = self.client[db]["orders"]
        self.stop = threading.Event()
        self.writes = 0

    def run(self) -> None:
        n = 1000
        while not self.stop.is_set():
            self.coll.insert_one({"_id": n, "qty": n})
            self.coll.update_one({"_id": n - 1}, {"$inc": {"qty": 1}})
            self.coll.delete_one({"_id": n - 2})
            n += 1
            self.writes += 3

    def finish(self) -> None:
        self.stop.set()
        self.join()
        self.client.close()


@pytest.mark.parametrize("read", ["snapshot_read", "stream_fallback"])
def test_reconciliation_at_the_tables_position(
    spark: SparkSession, tmp_path: Path, mongo_uri: str, fresh_db: Database, read: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both ways of reading the source at the table's position: a snapshot read at that cluster time,
    and, where the server no longer holds that time, a read now with the keys changed since left out."""
    namespace = f"{fresh_db.name}.orders"
    cfg = ConnectorConfig.from_dict({
        "mongodb.connection.string": mongo_uri, "topic.prefix": "dbz", "collection.include.list": namespace,
    })
    fresh_db.orders.insert_many(
        [{"_id": i, "qty": i, "tags": ["a"], "o": {"k": i}} for i in range(20)]
        + [{"_id": {"a": 1, "b": "two"}, "order": 1}, {"_id": {"b": "two", "a": 1}, "order": 2}]
    )
    landing = tmp_path / "landing"
    snap_path = landing / "snapshot" / namespace / "snapshot.parquet"
    sink = ParquetSink.to_file(snap_path)
    snap = api.snapshot_collection(cfg, namespace, sink)
    sink.close()
    fresh_db.orders.update_one({"_id": 1}, {"$set": {"qty": "one"}})
    fresh_db.orders.delete_one({"_id": 2})
    end = _after(api.current_cluster_time(cfg))
    slice_path = landing / "stream_slice" / namespace / "1.parquet"
    out = ParquetSink.to_file(slice_path)
    api.stream_window(cfg, namespace, snap.position.timestamp, end, out)
    out.close()
    tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
    build(spark, tables, snap_path, slice_path, add_fields=("op",))

    fresh_db.orders.update_one({"_id": 3}, {"$set": {"qty": 333}})  # after the table's position
    fresh_db.orders.insert_one({"_id": 500})
    if read == "stream_fallback":  # as a server answers once the position left its history window
        monkeypatch.setattr(api, "snapshot_collection", _history_lost(api.snapshot_collection))
    writer = Writer(mongo_uri, fresh_db.name)
    writer.start()
    try:
        result = reconcile_at_position(spark, tables, cfg)
    finally:
        writer.finish()
    assert result.matches and result.keys_compared > 0, result  # it compared something, and found it equal
    assert result.table_rows == 21
    if read == "snapshot_read":
        assert result.method.startswith("snapshot read at") and result.keys_excluded == 0, result
        assert result.passed and result.coverage == 1.0, result
    else:  # _id 3 and 500 changed after the position, and the writer's keys, when they existed then
        assert result.method.startswith("keys changed since") and result.keys_excluded >= 2, result

    table = f"delta.`{tables.current_state}`"
    spark.sql(f"UPDATE {table} SET qty = parse_json('999') WHERE _id = '4'")  # a typed column
    spark.sql(f"UPDATE {table} SET __op = 'c' WHERE _id = '5'")  # metadata
    spark.sql(f"UPDATE {table} SET __position = '0000000000001.0000000001.000000' WHERE _id = '6'")
    said: list[str] = []
    corrupted = reconcile_at_position(spark, tables, cfg, progress=said.append)
    assert said[-1].startswith(f"reconciliation of {tables.namespace}: done in ") and " Spark job(s), " in said[-1]
    assert not corrupted.matches and set(corrupted.mismatching_keys) == {"4", "5", "6"}, corrupted


@pytest.mark.parametrize("read", ["snapshot_read", "stream_fallback"])
def test_a_write_at_the_snapshots_own_position_is_not_in_the_table_built_from_it(
    spark: SparkSession, tmp_path: Path, mongo_client: MongoClient, mongo_uri: str, fresh_db: Database, read: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A blocking snapshot's position is where its change stream starts: mongod's latest operation time
    plus one tick, the very time the next write takes when it comes in the same second. The snapshot's
    reads hold the state before that write, so a table built from them alone matches the source just
    before its position, and the write is one that changed since (seen in CI as "DIFFERS at 1 key(s): 0",
    a writer's first update right after the snapshot). The snapshot is taken again until the write has
    taken its position (decided by the write's operationTime, not by timing)."""
    namespace = f"{fresh_db.name}.orders"
    cfg = ConnectorConfig.from_dict({
        "mongodb.connection.string": mongo_uri, "topic.prefix": "dbz", "collection.include.list": namespace,
    })
    fresh_db.orders.insert_many([{"_id": i, "qty": i} for i in range(20)])
    snap_path = tmp_path / "landing" / "snapshot" / namespace / "snapshot.parquet"
    for _attempt in range(50):  # a no-op or a new second may come between the snapshot and the write
        sink = ParquetSink.to_file(snap_path)
        snap = api.snapshot_collection(cfg, namespace, sink)
        sink.close()
        with mongo_client.start_session() as session:
            mongo_client[fresh_db.name].orders.update_one({"_id": 0}, {"$inc": {"qty": 1}}, session=session)
            written_at = session.operation_time
        if written_at == snap.position.timestamp:
            break
    else:
        pytest.fail("no write took the snapshot's position in 50 attempts")
    tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
    build(spark, tables, snap_path)
    assert table_properties(spark, tables.current_state)["mongocdc.position"] == snap.position.to_str()
    if read == "stream_fallback":
        monkeypatch.setattr(api, "snapshot_collection", _history_lost(api.snapshot_collection))
    result = reconcile_at_position(spark, tables, cfg)
    assert result.matches and result.passed, result
    if read == "snapshot_read":  # the state just before the write, every key compared
        assert result.method.startswith("snapshot read at ") and "the tick before" in result.method, result
        assert (result.keys_compared, result.keys_excluded) == (20, 0), result
    else:  # read now: the write at the snapshot's position is a change since, left out
        assert result.method.startswith("keys changed since"), result
        assert (result.keys_compared, result.keys_excluded) == (19, 1), result


class StampingWriter(threading.Thread):
    """Never stops until told: inserts new keys and updates old ones, each write stamped with its number
    ``w`` in the document, and the cluster time each number took (its session's operationTime)."""

    def __init__(self, uri: str, db: str, keys: int) -> None:
        super().__init__(daemon=True)
        self.client: MongoClient = MongoClient(uri)
        self.coll = self.client[db]["orders"]
        self.keys = keys
        self.stop = threading.Event()
        self.times: dict[int, Timestamp] = {}

    def run(self) -> None:
        w = 0
        with self.client.start_session() as session:
            while not self.stop.is_set():
                w += 1
                if w % 2:
                    self.coll.insert_one({"_id": self.keys + w, "w": w}, session=session)
                else:  # the copy reads these late (the highest keys of the existing ones)
                    self.coll.update_one({"_id": self.keys - 1 - (w // 2) % 50}, {"$set": {"w": w}}, session=session)
                assert session.operation_time is not None
                self.times[w] = session.operation_time

    def finish(self) -> None:
        self.stop.set()
        self.join()
        self.client.close()


def test_a_fuzzy_blocking_snapshot_is_no_difference(
    spark: SparkSession, tmp_path: Path, mongo_uri: str, fresh_db: Database,
) -> None:
    """A blocking snapshot copied while a writer never stops is fuzzy, as Debezium's is: its reads may
    show writes made after its position, which the stream from that position brings again. A table
    built from the copy alone is reconciled at its position with the keys changed since that it holds
    as the copy read them (or lacks) left out and counted, not reported as differences; once the stream
    has caught up past the copy, the table is exact and every key is compared. The snapshot is taken
    again until a read shows a write made at or after its position (decided by the writes' cluster
    times, not by timing)."""
    namespace = f"{fresh_db.name}.orders"
    cfg = ConnectorConfig.from_dict({
        "mongodb.connection.string": mongo_uri, "topic.prefix": "dbz", "collection.include.list": namespace,
    })
    keys = 2000
    fresh_db.orders.insert_many([{"_id": i, "w": 0} for i in range(keys)])
    landing = tmp_path / "landing"
    snap_path = landing / "snapshot" / namespace / "snapshot.parquet"
    writer = StampingWriter(mongo_uri, fresh_db.name, keys)
    writer.start()
    try:
        for _attempt in range(20):
            sink = ParquetSink.to_file(snap_path)
            snap = api.snapshot_collection(cfg, namespace, sink)
            sink.close()
            at = snap.position.timestamp
            read = [json_util.loads(a)["w"] for a in pq.read_table(snap_path, columns=["after"])["after"].to_pylist()]
            later = [w for w in read if w and (writer.times[w].time, writer.times[w].inc) >= (at.time, at.inc)]
            if later:
                break
        else:
            pytest.fail("no read of 20 snapshots showed a write made after the snapshot's position")
    finally:
        writer.finish()
    tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
    build(spark, tables, snap_path)
    fuzzy = reconcile_at_position(spark, tables, cfg, min_coverage=0.0)
    assert fuzzy.matches and fuzzy.passed, fuzzy  # no difference: the keys the copy read late are uncertain
    # exactly the keys whose reads show a later write are left out; every other key is compared and equal
    assert fuzzy.keys_excluded == len(later) and fuzzy.keys_compared > 0, (fuzzy, later)
    assert fuzzy.coverage == fuzzy.keys_compared / (fuzzy.keys_compared + fuzzy.keys_excluded), fuzzy
    assert "the copy may have read them after that time" in fuzzy.method, fuzzy

    end = _after(api.current_cluster_time(cfg))  # the stream catches up past the copy and the writer's last write
    slice_path = landing / "stream_slice" / namespace / "1.parquet"
    out = ParquetSink.to_file(slice_path)
    api.stream_window(cfg, namespace, at, end, out)
    out.close()
    refresh_changelog(spark, tables, [str(snap_path), str(slice_path)])
    refresh_current_state(spark, tables)
    exact = reconcile_at_position(spark, tables, cfg)
    assert exact.passed and exact.keys_excluded == 0 and exact.coverage == 1.0, exact
    assert exact.keys_compared == exact.source_rows == exact.table_rows == fresh_db.orders.count_documents({}), exact


def test_a_blocking_read_made_before_the_tables_time_is_exact_there(
    spark: SparkSession, tmp_path: Path, mongo_client: MongoClient, mongo_uri: str, fresh_db: Database,
) -> None:
    """A copy can only show a write made after the table's time if it read after that time: a table whose
    snapshot finished before its time holds those reads exactly there. A corrupted value of a key it holds
    as the copy read it, and a key the copy lost (in neither the changelog nor the table), are differences
    even when the key changed after the table's time (they were left out as uncertain, and with 2 of 20
    keys left out the check passed). The table's time is a write whose cluster time's second is past the
    copy's newest read by more than the clock skew allowed (decided by the write's operationTime)."""
    namespace = f"{fresh_db.name}.orders"
    cfg = ConnectorConfig.from_dict({
        "mongodb.connection.string": mongo_uri, "topic.prefix": "dbz", "collection.include.list": namespace,
    })
    fresh_db.orders.insert_many([{"_id": i, "qty": i} for i in range(19)] + [{"_id": 19, "qty": "x"}])
    landing = tmp_path / "landing"
    snap_path = landing / "snapshot" / namespace / "snapshot.parquet"
    sink = ParquetSink.to_file(snap_path)
    snap = api.snapshot_collection(cfg, namespace, sink)
    sink.close()
    reads = pq.read_table(snap_path)
    newest_read_ms = max(reads["ts_ms"].to_pylist())
    ids = [json_util.loads(a)["_id"] for a in reads["after"].to_pylist()]
    pq.write_table(reads.filter(pa.array([i != 5 for i in ids])), snap_path)  # the copy lost _id 5
    while True:  # the table's time: a write a whole clock skew past the copy's newest read
        with mongo_client.start_session() as session:
            mongo_client[fresh_db.name].orders.update_one({"_id": 0}, {"$inc": {"qty": 1}}, session=session)
            written_at = session.operation_time
        assert written_at is not None
        if written_at.time * 1000 - reconcile.CLOCK_SKEW_MS > newest_read_ms:
            break
        time.sleep(0.1)  # not a synchronisation: the write's cluster time decides
    slice_path = landing / "stream_slice" / namespace / "1.parquet"
    out = ParquetSink.to_file(slice_path)
    api.stream_window(cfg, namespace, snap.position.timestamp, _after(written_at), out)
    out.close()
    tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
    build(spark, tables, snap_path, slice_path)
    assert table_properties(spark, tables.current_state)["mongocdc.position"].startswith(
        f"{written_at.time:013d}.{written_at.inc:010d}.")
    spark.sql(f"UPDATE delta.`{tables.current_state}` SET qty = parse_json('999') WHERE _id = '4'")
    fresh_db.orders.update_many({"_id": {"$in": [4, 5]}}, {"$inc": {"qty": 1}})  # after the table's time

    result = reconcile_at_position(spark, tables, cfg)
    assert result.method.startswith("snapshot read at"), result
    assert not result.matches and not result.passed and set(result.mismatching_keys) == {"4", "5"}, result
    assert (result.keys_compared, result.keys_excluded) == (20, 0), result


def _history_lost(snapshot_collection: Any) -> Any:
    """``api.snapshot_collection`` as a server answers once a position left its history window."""
    def too_old(*args: Any, at_cluster_time: Timestamp | None = None, **kwargs: Any) -> api.SnapshotResult:
        if at_cluster_time is not None:
            raise api.SnapshotReadUnavailable(f"SnapshotTooOld: {at_cluster_time} is before the history window")
        return snapshot_collection(*args, **kwargs)
    return too_old


@pytest.mark.fault
def test_a_reconciliation_that_compared_too_few_keys_is_no_pass(spark: SparkSession, tmp_path: Path) -> None:
    """The table's position left the server's snapshot history (300 s, as mongod's default) and every key
    changed since: the fallback leaves every key out, so it compared nothing and must not pass. The same
    table reconciled while the server still held its position compares every key. The emulator's clock
    runs behind and jumps past the history window (no waiting)."""
    with travelling_replica_set(behind_s=3600) as (uri, clock):
        client: MongoClient = MongoClient(uri)
        db = client["hist"]
        namespace = "hist.orders"
        cfg = ConnectorConfig.from_dict({
            "mongodb.connection.string": uri, "topic.prefix": "dbz", "collection.include.list": namespace,
        })
        db.orders.insert_many([{"_id": i, "qty": i} for i in range(30)])
        snap_path = tmp_path / "landing" / "snapshot" / namespace / "snapshot.parquet"
        sink = ParquetSink.to_file(snap_path)
        api.snapshot_collection(cfg, namespace, sink)
        sink.close()
        tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
        build(spark, tables, snap_path)

        db.orders.update_many({}, {"$inc": {"qty": 1}})  # every key changes after the table's position
        held = reconcile_at_position(spark, tables, cfg)  # the server still holds the position
        assert held.method.startswith("snapshot read at") and held.passed, held
        assert (held.keys_compared, held.keys_excluded, held.coverage) == (30, 0, 1.0), held

        now = api.current_cluster_time(cfg)
        clock.jump_to(datetime.fromtimestamp(now.time + 400, UTC))  # past the 300 s history window
        db.other.insert_one({"_id": 1})  # the cluster time moves on
        lost = reconcile_at_position(spark, tables, cfg)
        assert lost.method.startswith("keys changed since"), lost
        assert (lost.keys_compared, lost.keys_excluded, lost.coverage) == (0, 30, 0.0), lost
        assert lost.matches and not lost.verified and not lost.passed and lost.verdict == "unverified", lost
        assert "0 of 30 keys compared (0%), below the 90% required: NOT VERIFIED" in lost.summary()
        # the required share is the caller's: with none required, finding no difference is enough
        assert reconcile_at_position(spark, tables, cfg, min_coverage=0.0).passed
        with pytest.raises(ValueError, match="min_coverage must be a share between 0 and 1, got 1.5"):
            reconcile_at_position(spark, tables, cfg, min_coverage=1.5)
        client.close()


def test_a_table_built_before_any_data_takes_its_types_from_the_first_data(
    spark: SparkSession, tmp_path: Path, mongo_uri: str, fresh_db: Database,
) -> None:
    """Tables built empty (automation before a collection's first snapshot), then fed its documents:
    the first keys decide ``_id``'s type, as ``mongocdc.kinds`` records it, and every key reconciles."""
    namespace = f"{fresh_db.name}.customers"
    cfg = ConnectorConfig.from_dict({
        "mongodb.connection.string": mongo_uri, "topic.prefix": "dbz", "collection.include.list": namespace,
    })
    tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
    empty = build(spark, tables)
    assert empty.count() == 0 and empty.schema["_id"].dataType == T.StringType()  # no type known yet

    fresh_db.customers.insert_many([{"_id": 1000 + i, "name": f"c{i}", "meta": {}} for i in range(4)])
    snap_path = tmp_path / "landing" / "snapshot" / namespace / "snapshot.parquet"
    sink = ParquetSink.to_file(snap_path)
    api.snapshot_collection(cfg, namespace, sink)
    sink.close()
    refresh_changelog(spark, tables, [str(snap_path)])
    refreshed = refresh_current_state(spark, tables)
    assert refreshed.schema["_id"].dataType == T.LongType() and "field _id: string -> bigint" in refreshed.schema_changes
    kinds = json.loads(table_properties(spark, tables.current_state)[KINDS_PROPERTY])
    assert kinds["id"] == {"t": "int"}

    result = reconcile_at_position(spark, tables, cfg)
    assert result.matches, result
    assert result.method.startswith("snapshot read at") and result.keys_excluded == 0, result
    assert result.table_rows == result.source_rows == 4, result


@pytest.mark.fault
def test_a_collection_dropped_after_the_tables_position_is_no_difference(spark: SparkSession, tmp_path: Path) -> None:
    """The table's position left the server's snapshot history and the collection was dropped since (the soak
    drops one while its refresh runs): the drop changed every key, though its one event names none, so no
    key is compared with the empty collection read now; before, every key DIFFERED (a blocking failure). Its
    verdict is ``dropped``, a pass, as when discovery found it gone (a soak's run reconciled it between the
    drop and discovery, and was NOT VERIFIED); the metadata is still compared with the changelog."""
    with travelling_replica_set(behind_s=3600) as (uri, clock):
        client: MongoClient = MongoClient(uri)
        cfg, tables = _thirty_orders_built(spark, tmp_path, uri, client.gone)
        client.gone.drop_collection("orders")
        clock.jump_to(datetime.fromtimestamp(api.current_cluster_time(cfg).time + 400, UTC))  # past the history
        client.gone.other.insert_one({"_id": 1})  # the cluster time moves on
        found = reconcile_at_position(spark, tables, cfg)
        assert "the collection was dropped since" in found.method, found
        assert (found.keys_compared, found.keys_excluded, found.mismatching_keys) == (0, 30, []), found
        assert found.verdict == "dropped" and found.passed and "was dropped after" in found.summary(), found
        spark.sql(f"UPDATE delta.`{tables.current_state}` SET __position = '0' WHERE _id = 7")  # not the changelog's
        corrupted = reconcile_at_position(spark, tables, cfg)
        assert corrupted.verdict == "differs" and corrupted.mismatching_keys == ["7"], corrupted
        client.close()


def test_a_collection_dropped_after_the_tables_position_within_the_history_is_compared_key_by_key(
        spark: SparkSession, tmp_path: Path, mongo_uri: str, fresh_db: Database) -> None:
    """The soak's collection dropped while its refresh ran: the server still holds the table's position, and
    mongod 7.0 reads a collection dropped since at that time (its point-in-time catalog), so every key is
    compared and the check passes; a corrupted row still fails it (before, the emulator read nothing there
    and every key DIFFERED)."""
    cfg, tables = _thirty_orders_built(spark, tmp_path, mongo_uri, fresh_db)
    fresh_db.drop_collection("orders")
    found = reconcile_at_position(spark, tables, cfg)
    assert (found.keys_compared, found.keys_excluded, found.mismatching_keys) == (30, 0, []), found
    assert found.passed and found.method.startswith("snapshot read at"), found
    spark.sql(f"UPDATE delta.`{tables.current_state}` SET qty = parse_json('999') WHERE _id = '7'")
    corrupted = reconcile_at_position(spark, tables, cfg)
    assert not corrupted.matches and corrupted.mismatching_keys == ["7"], corrupted


def _thirty_orders_built(spark: SparkSession, tmp_path: Path, uri: str, db: Database,
                         ) -> tuple[ConnectorConfig, CollectionTables]:
    """Thirty documents in ``db.orders``, snapshotted and built into tables under ``tmp_path``."""
    namespace = f"{db.name}.orders"
    cfg = ConnectorConfig.from_dict({
        "mongodb.connection.string": uri, "topic.prefix": "dbz", "collection.include.list": namespace,
    })
    db.orders.insert_many([{"_id": i, "qty": i} for i in range(30)])
    snap_path = tmp_path / "landing" / "snapshot" / namespace / "snapshot.parquet"
    _snapshot_into(cfg, namespace, snap_path)
    tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
    build(spark, tables, snap_path)
    return cfg, tables


def _snapshot_into(cfg: ConnectorConfig, namespace: str, path: Path) -> None:
    sink = ParquetSink.to_file(path)
    api.snapshot_collection(cfg, namespace, sink)
    sink.close()


@pytest.mark.fault
def test_the_source_read_right_after_the_changelog_refresh_verifies_a_position_the_server_no_longer_holds(
    spark: SparkSession, tmp_path: Path,
) -> None:
    """The position current_state gets is known once its changelog is refreshed: the source read then, while
    the server holds it, compares every key after the position left the server's snapshot history and every
    key changed since (read at the check, it compared none), and still finds a corrupted row."""
    with travelling_replica_set(behind_s=3600) as (uri, clock), MongoClient(uri) as client:
        db = client["early"]
        namespace = "early.orders"
        cfg = ConnectorConfig.from_dict({
            "mongodb.connection.string": uri, "topic.prefix": "dbz", "collection.include.list": namespace,
        })
        db.orders.insert_many([{"_id": i, "qty": i} for i in range(29)] + [{"_id": 29, "qty": "x"}])
        snap_path = tmp_path / "landing" / "snapshot" / namespace / "snapshot.parquet"
        _snapshot_into(cfg, namespace, snap_path)
        tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
        refresh_changelog(spark, tables, [str(snap_path)])
        early = read_source_at(spark, tables, cfg)
        refresh_current_state(spark, tables)
        assert early.position == table_properties(spark, tables.current_state)["mongocdc.position"]

        db.orders.update_many({}, {"$set": {"later": 1}})  # every key changes after the table's position
        now = api.current_cluster_time(cfg)
        clock.jump_to(datetime.fromtimestamp(now.time + 400, UTC))  # past the 300 s history window
        db.other.insert_one({"_id": 1})  # the cluster time moves on
        late = reconcile_at_position(spark, tables, cfg)
        assert not late.read_early and late.verdict == "unverified" and late.keys_compared == 0, late

        found = reconcile_at_position(spark, tables, cfg, source=early)
        assert found.read_early and found.method.startswith("snapshot read at"), found
        assert found.passed and (found.keys_compared, found.keys_excluded, found.coverage) == (30, 0, 1.0), found
        spark.sql(f"UPDATE delta.`{tables.current_state}` SET qty = parse_json('999') WHERE _id = '4'")
        corrupted = reconcile_at_position(spark, tables, cfg, source=early)
        assert corrupted.read_early and not corrupted.matches and corrupted.mismatching_keys == ["4"], corrupted


def _ten_orders_snapshotted(
    tmp_path: Path, mongo_uri: str, fresh_db: Database,
) -> tuple[str, ConnectorConfig, Path, Path, api.SnapshotResult]:
    """Ten documents in ``orders``, snapshotted into ``tmp_path/landing``: the namespace, its config, the
    landing zone, the snapshot file and the snapshot's result."""
    namespace = f"{fresh_db.name}.orders"
    cfg = ConnectorConfig.from_dict({
        "mongodb.connection.string": mongo_uri, "topic.prefix": "dbz", "collection.include.list": namespace,
    })
    fresh_db.orders.insert_many([{"_id": i, "qty": i} for i in range(10)])
    landing = tmp_path / "landing"
    snap_path = landing / "snapshot" / namespace / "snapshot.parquet"
    sink = ParquetSink.to_file(snap_path)
    snap = api.snapshot_collection(cfg, namespace, sink)
    sink.close()
    return namespace, cfg, landing, snap_path, snap


def test_a_source_read_for_another_changelog_version_is_not_used(
    spark: SparkSession, tmp_path: Path, mongo_uri: str, fresh_db: Database,
) -> None:
    """A read made after an earlier changelog refresh is for an older position than the table's once more
    landed: the check reads the source itself (compared with the old read, the updated key would differ)."""
    namespace, cfg, landing, snap_path, snap = _ten_orders_snapshotted(tmp_path, mongo_uri, fresh_db)
    tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
    refresh_changelog(spark, tables, [str(snap_path)])
    stale = read_source_at(spark, tables, cfg)

    fresh_db.orders.update_one({"_id": 1}, {"$set": {"qty": 100}})
    slice_path = landing / "stream_slice" / namespace / "1.parquet"
    out = ParquetSink.to_file(slice_path)
    api.stream_window(cfg, namespace, snap.position.timestamp, _after(api.current_cluster_time(cfg)), out)
    out.close()
    build(spark, tables, snap_path, slice_path)
    result = reconcile_at_position(spark, tables, cfg, source=stale)
    assert result.position is not None and stale.position is not None and stale.position < result.position
    assert not result.read_early and result.passed and result.keys_compared == 10, result


def test_an_updates_looked_up_document_that_shows_a_later_write_is_no_difference(
    spark: SparkSession, tmp_path: Path, mongo_uri: str, fresh_db: Database,
) -> None:
    """An update's full document is looked up when the change stream reads the event (``updateLookup``),
    so a slice read after a later write shows that write in the earlier update's document (the soak's
    step-down cut a writer's sequence on a few keys across a window's end, and its table refresh failed on
    them with DIFFERS). Reconciled at the table's position, such a key is left out and counted, not a
    difference; every other key is compared, and a corrupted row is still one."""
    namespace, cfg, landing, snap_path, snap = _ten_orders_snapshotted(tmp_path, mongo_uri, fresh_db)
    fresh_db.orders.update_one({"_id": 1}, {"$set": {"qty": 100}})
    fresh_db.orders.update_one({"_id": 2}, {"$set": {"qty": 200}})
    end = _after(api.current_cluster_time(cfg))  # the slice ends after both updates: the table's time
    fresh_db.orders.update_one({"_id": 1}, {"$set": {"qty": 101}})  # after it, before the stream reads
    slice_path = landing / "stream_slice" / namespace / "1.parquet"
    out = ParquetSink.to_file(slice_path)
    api.stream_window(cfg, namespace, snap.position.timestamp, end, out)
    out.close()
    documents = [json_util.loads(a) for a in pq.read_table(slice_path, columns=["after"])["after"].to_pylist() if a]
    assert {d["_id"]: d["qty"] for d in documents} == {1: 101, 2: 200}  # the first update's document shows the later write

    tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
    build(spark, tables, snap_path, slice_path)
    found = reconcile_at_position(spark, tables, cfg)
    assert found.matches and found.passed, found
    assert (found.keys_compared, found.keys_excluded) == (9, 1), found  # _id 1 uncertain, the others verified
    assert "looked-up document" in found.method, found
    spark.sql(f"UPDATE delta.`{tables.current_state}` SET qty = parse_json('999') WHERE _id = '2'")
    corrupted = reconcile_at_position(spark, tables, cfg)
    assert not corrupted.matches and corrupted.mismatching_keys == ["2"], corrupted
