"""current_state from converter-made landing files: order-independent, incremental, typed, without ghosts."""

from __future__ import annotations

import random
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from bson.timestamp import Timestamp
from delta.exceptions import ConcurrentAppendException
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mongocdc_core.positions import Position
from mongocdc_core.tables import (
    CollectionTables,
    TableOptions,
    changelog,
    collection,
    current_state,
    read_current_state,
    refresh_changelog,
    refresh_current_state,
)
from mongocdc_core.tables.changelog import TableInputError, latest_version, look

from .support import build, comparable, read_file
from .workload import DB, Event, Workload, converter, slice_records, snapshot_records, write_landing


def _docs(spark: SparkSession, tables: CollectionTables) -> list[tuple[Any, ...]]:
    return comparable(read_current_state(spark, tables.current_state).select("__key", "__doc"))


def _expected(spark: SparkSession, tmp: Path, wl: Workload, coll: str) -> list[tuple[Any, ...]]:
    """The model's documents, through a snapshot file into a table of their own."""
    tables = CollectionTables.under(str(tmp / f"expected-{coll}"), f"{DB}.{coll}")
    build(spark, tables, write_landing(tmp / f"expected-{coll}.parquet", snapshot_records(converter("change_streams"), wl, coll)))
    return _docs(spark, tables)


def _scenario(tmp: Path, capture_mode: str, seed: int) -> tuple[Workload, dict[str, Path]]:
    """Landing files: snapshot after some history, then three slices (transactions included)."""
    rng = random.Random(seed)
    wl = Workload(rng, collections=("orders",), full_document=capture_mode != "change_streams")
    conv = converter(capture_mode)
    files: dict[str, Path] = {}
    a0, a1 = wl.run(25)
    files["slice0"] = write_landing(tmp / "slice0.parquet", slice_records(conv, wl.events[a0:a1]))
    files["snap"] = write_landing(tmp / "snapshot.parquet", snapshot_records(conv, wl, "orders"))
    for i in (1, 2, 3):
        s0, s1 = wl.run(25)
        files[f"slice{i}"] = write_landing(tmp / f"slice{i}.parquet", slice_records(conv, wl.events[s0:s1]))
    return wl, files


# Each step is one refresh. Both plans land slices before their snapshot and re-deliver a slice at the end.
PLANS: dict[str, list[list[str]]] = {
    "change_streams_update_full": [["slice3"], ["slice1", "snap"], ["slice2"], ["slice1"]],
    "change_streams": [["slice2"], ["slice1", "slice3"], ["snap"], ["slice2"]],
}


@pytest.mark.parametrize("capture_mode", sorted(PLANS))
def test_current_state_is_the_same_in_any_order(spark: SparkSession, tmp_path: Path, capture_mode: str) -> None:
    wl, files = _scenario(tmp_path / "landing", capture_mode, seed=len(capture_mode))
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    plan = PLANS[capture_mode]
    delivered: list[Path] = []
    pending = 0
    for step in plan:
        delivered += [files[n] for n in step]
        refresh_changelog(spark, tables, [str(f) for f in delivered])
        result = refresh_current_state(spark, tables)
        pending = max(pending, result.pending_keys)
    if capture_mode == "change_streams":  # updates whose full document had not landed yet waited
        assert pending > 0
    assert result.pending_keys == 0
    assert _docs(spark, tables) == _expected(spark, tmp_path, wl, "orders")
    assert result.row_count == len(wl.docs["orders"])


def _changes(tmp: Path, name: str, events: list[Event]) -> Path:
    return write_landing(tmp / f"{name}.parquet", slice_records(converter("change_streams_update_full"), events))


def _event(op: str, doc_id: Any, position: Position, doc: dict[str, Any] | None = None) -> Event:
    change: dict[str, Any] = {
        "operationType": op, "ns": {"db": DB, "coll": "orders"}, "documentKey": {"_id": doc_id},
        "clusterTime": Timestamp(position.seconds, position.increment),
    }
    if doc is not None:
        change["fullDocument"] = doc
    if op == "update":
        change["updateDescription"] = {"updatedFields": {k: v for k, v in (doc or {}).items() if k != "_id"},
                                       "removedFields": [], "truncatedArrays": []}
    return Event(change, position)


@pytest.mark.parametrize("small", [True, False], ids=["small-table", "large-table"])
def test_refresh_merges_only_the_keys_that_changed(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    """A large table's MERGE writes deletion vectors (it copies no untouched row); a small one's rewrites
    the files it touches instead, the jobs deletion vectors take costing more there. Both give the same
    rows and the same change data feed."""
    if not small:
        monkeypatch.setattr(current_state, "_SMALL_TABLE_BYTES", -1)
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    docs = [{"_id": i, "qty": i, "name": f"n{i}"} for i in range(40)]
    snap = read_file(tmp_path / "snap.parquet", DB, "orders", docs, Position(100, 1))
    first = refresh_changelog(spark, tables, [str(snap)])
    built = refresh_current_state(spark, tables)
    assert (built.keys_merged, built.row_count, first.rows_added) == (40, 40, 40)
    assert refresh_current_state(spark, tables).keys_merged == 0  # nothing new: no rebuild, no merge
    versions = DeltaTable.forPath(spark, tables.current_state).history().count()

    events = [_event("update", i, Position(200, i + 1), {"_id": i, "qty": -i, "name": f"n{i}"}) for i in (3, 7)]
    events += [_event("delete", 9, Position(200, 20)), _event("insert", 99, Position(200, 21), {"_id": 99, "qty": 0})]
    refresh_changelog(spark, tables, [str(snap), str(_changes(tmp_path, "s1", events))])
    result = refresh_current_state(spark, tables)
    assert (result.keys_merged, result.upserted, result.deleted, result.row_count) == (4, 3, 1, 40)
    assert result.position == Position(200, 21).to_str()
    history = DeltaTable.forPath(spark, tables.current_state).history()
    merge = history.where(F.col("operation") == "MERGE").orderBy(F.col("version").desc()).first()
    assert merge is not None
    metrics = merge["operationMetrics"]
    # deletion vectors: the untouched rows of the files are not copied; a small table's are rewritten
    assert (int(metrics["numTargetRowsCopied"]) > 0) is small
    assert (sum(int(v) for k, v in metrics.items() if "DeletionVectorsAdded" in k) > 0) is not small
    assert int(metrics["numTargetRowsUpdated"]) + int(metrics["numTargetRowsInserted"]) == 3
    assert history.count() > versions

    # change data feed: downstream jobs read exactly those row changes
    feed = (spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", int(merge["version"])).option("endingVersion", int(merge["version"]))
            .load(tables.current_state))
    changed = {(r["_id"], r["_change_type"]) for r in feed.collect()}
    assert changed == {(3, "update_preimage"), (3, "update_postimage"), (7, "update_preimage"),
                       (7, "update_postimage"), (9, "delete"), (99, "insert")}


def test_delete_and_reinsert_inside_one_transaction(spark: SparkSession, tmp_path: Path) -> None:
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    snap = read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": 1, "v": "old"}, {"_id": 2, "v": "two"}],
                     Position(100, 1))
    tx = [  # one clusterTime, ordered by the ordinal
        _event("delete", 1, Position(200, 1, 0)), _event("insert", 1, Position(200, 1, 1), {"_id": 1, "v": "new"}),
        _event("insert", 3, Position(200, 1, 2), {"_id": 3}), _event("delete", 3, Position(200, 1, 3)),
        _event("delete", 2, Position(200, 1, 4)),
    ]
    state = build(spark, tables, snap, _changes(tmp_path, "tx", tx))
    assert sorted((r["_id"], r["v"]) for r in state.collect()) == [(1, "new")]


def test_a_field_that_changes_type_mid_stream(spark: SparkSession, tmp_path: Path) -> None:
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    snap = read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": 1, "qty": 1}, {"_id": 2, "qty": 2}],
                     Position(100, 1))
    build(spark, tables, snap)
    later = [
        _event("update", 2, Position(200, 1), {"_id": 2, "qty": "two", "extra": True}),
        _event("insert", 3, Position(200, 2), {"_id": 3, "qty": 3.5}),
    ]
    refresh_changelog(spark, tables, [str(snap), str(_changes(tmp_path, "s", later))])
    result = refresh_current_state(spark, tables)
    assert result.schema_changes == ["field qty: bigint -> VARIANT", "added column extra (boolean)"]
    state = read_current_state(spark, tables.current_state)
    assert dict(state.dtypes)["qty"] == "variant"
    rows = {r["_id"]: r for r in state.select("_id", F.to_json("qty").alias("qty"), "extra").collect()}
    assert {k: r["qty"] for k, r in rows.items()} == {1: "1", 2: '"two"', 3: "3.5"}  # no value lost
    assert rows[2]["extra"] is True and rows[1]["extra"] is None


def test_no_ghosts_after_a_re_snapshot(spark: SparkSession, tmp_path: Path) -> None:
    home = tmp_path / "landing" / "snapshot" / f"{DB}.orders"
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    marked = CollectionTables.under(str(tmp_path / "marked"), f"{DB}.orders")
    first = read_file(home / "snapshot.parquet", DB, "orders", [{"_id": i} for i in range(1, 6)], Position(100, 1))
    build(spark, tables, first)
    build(spark, marked, first, delete_handling="rewrite")
    # history lost; 4 and 5 were deleted during the gap. A newer full snapshot (as ranges) misses them.
    plan = home / "ranges-p2"
    second = [
        read_file(plan / "1-of-2.parquet", DB, "orders", [{"_id": 1}, {"_id": 2}], Position(300, 1)),
        read_file(plan / "2-of-2.parquet", DB, "orders", [{"_id": 3}, {"_id": 6}], Position(300, 2)),
    ]
    late = _changes(tmp_path, "late", [_event("update", 5, Position(200, 1), {"_id": 5, "x": 1})])
    state = build(spark, tables, first, *second, late)  # a slice older than the new snapshot lands with it
    assert sorted(r["_id"] for r in state.collect()) == [1, 2, 3, 6]
    kept = build(spark, marked, first, *second, late, delete_handling="rewrite")
    assert sorted((r["_id"], r["__deleted"]) for r in kept.collect()) == [
        (1, False), (2, False), (3, False), (4, True), (5, True), (6, False)
    ]


def test_a_tiny_batch_merges_deletes_replaces_a_key_changed_twice_and_a_new_field(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A refresh of a few changes (the usual one of a quiet collection) leaves the table equal, column for
    column, to one built from a snapshot of the documents it should hold."""
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    docs: dict[int, dict[str, Any]] = {i: {"_id": i, "qty": i, "name": f"n{i}"} for i in range(6)}
    snap = read_file(tmp_path / "snap.parquet", DB, "orders", list(docs.values()), Position(100, 1))
    build(spark, tables, snap)
    batch = [
        _event("update", 1, Position(200, 1), {"_id": 1, "qty": 10, "name": "n1"}),
        _event("update", 1, Position(200, 2), {"_id": 1, "qty": 11, "name": "n1"}),  # the same key twice
        _event("replace", 2, Position(200, 3), {"_id": 2, "label": "two"}),  # fields gone, a new one
        _event("delete", 3, Position(200, 4)),
        _event("insert", 7, Position(200, 5), {"_id": 7, "qty": 7, "name": "n7", "tags": {"new": True}}),
        _event("insert", 8, Position(200, 6), {"_id": 8, "qty": 8}),
        _event("delete", 8, Position(200, 7)),  # inserted and deleted in the batch: never a row
    ]
    refresh_changelog(spark, tables, [str(snap), str(_changes(tmp_path, "tiny", batch))])
    result = refresh_current_state(spark, tables)
    assert (result.keys_merged, result.upserted, result.deleted, result.row_count) == (5, 3, 1, 6)
    assert sorted(c.split(" (")[0] for c in result.schema_changes) == ["added column label", "added column tags"]
    final = docs | {1: {"_id": 1, "qty": 11, "name": "n1"}, 2: {"_id": 2, "label": "two"},
                    7: {"_id": 7, "qty": 7, "name": "n7", "tags": {"new": True}}}
    del final[3]
    expected = CollectionTables.under(str(tmp_path / "expected"), f"{DB}.orders")
    want = build(spark, expected, read_file(tmp_path / "expected.parquet", DB, "orders", list(final.values()),
                                            Position(300, 1)))
    got = read_current_state(spark, tables.current_state)
    assert comparable(got, drop=("__position",)) == comparable(want, drop=("__position",))
    assert len(comparable(got)) == 7  # the column names and six rows were compared


def test_deletes_kept_marked_and_metadata_columns(spark: SparkSession, tmp_path: Path) -> None:
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    snap = read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": 1, "v": 1}, {"_id": 2, "v": 2}], Position(100, 1))
    gone = _changes(tmp_path, "gone", [_event("delete", 2, Position(200, 7))])
    options = {"delete_handling": "rewrite", "add_fields": ("op", "source_ts_ms", "position", "collection")}
    state = build(spark, tables, snap, gone, **options)
    assert state.columns[-5:] == ["__position", "__op", "__source_ts_ms", "__collection", "__deleted"]
    rows = {r["_id"]: r for r in state.collect()}
    assert (rows[2]["__deleted"], rows[2]["__op"], rows[2]["v"], rows[2]["__position"]) == (
        True, "d", None, Position(200, 7).to_str()
    )
    assert (rows[1]["__deleted"], rows[1]["__op"], rows[1]["__collection"]) == (False, "r", f"{DB}.orders")
    assert rows[1]["__source_ts_ms"] is not None
    plain = refresh_current_state(spark, tables, TableOptions())  # other options: the table is rebuilt
    assert plain.row_count == 1 and "__deleted" not in read_current_state(spark, tables.current_state).columns


def test_shuffle_partitions_are_sized_from_the_data(spark: SparkSession, tmp_path: Path) -> None:
    """A cluster's default of 200 shuffle partitions must not turn a small merge into 200 tasks and files."""
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "200")
    try:
        tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
        snap = read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": i} for i in range(50)], Position(1, 1))
        build(spark, tables, snap)
        files = DeltaTable.forPath(spark, tables.current_state).detail().first()["numFiles"]  # type: ignore[index]
        assert files <= 4
        assert spark.conf.get("spark.sql.shuffle.partitions") == "200"  # the session's own setting is restored
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


def test_the_merge_leaves_the_sessions_settings_as_they_were(spark: SparkSession, tmp_path: Path) -> None:
    """The MERGE skips Delta's copy of its (checkpointed) source, and a small table's refresh plans without
    adaptive execution and broadcasts and runs interpreted, for its own work only: a user's setting of each, or
    its absence, is the same after a refresh."""
    keys = ("spark.databricks.delta.merge.materializeSource", *current_state._SMALL_PLANS, *changelog._INTERPRETED)
    user = dict(zip(keys, ("auto", "true", "1048576", "true", "true", "FALLBACK"), strict=True))
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    snap = read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": i, "qty": i} for i in range(5)], Position(100, 1))
    build(spark, tables, snap)
    files = [str(snap)]
    before = {key: spark.conf.get(key, None) for key in keys}
    try:
        for round_, settings in enumerate(({key: None for key in keys}, user)):
            for key, value in settings.items():
                spark.conf.unset(key) if value is None else spark.conf.set(key, value)
            files.append(str(_changes(tmp_path, f"s{round_}", [_event("update", 1, Position(200 + round_, 1),
                                                                       {"_id": 1, "qty": 10 + round_})])))  # fmt: skip
            refresh_changelog(spark, tables, files)
            assert refresh_current_state(spark, tables).upserted == 1  # a MERGE ran
            assert {key: spark.conf.get(key, None) for key in keys} == settings
    finally:
        for key, value in before.items():
            spark.conf.unset(key) if value is None else spark.conf.set(key, value)


def test_a_one_change_refresh_of_a_small_table_runs_seven_spark_jobs(spark: SparkSession, tmp_path: Path) -> None:
    """Each Spark job costs its scheduling whatever it carries (0.1-0.5 s on a loaded laptop), so a refresh of
    one change costs its jobs, counted here exactly: the changelog's append and its manifest entry (2);
    current_state's merge source and Delta's MERGE of a small table, which plans without adaptive execution or
    broadcasts (each a job of its own) and rewrites the file it touches instead of writing deletion vectors
    (three jobs more): its snapshot's state, two scans for the touched files and the write (5). 10 while
    that MERGE wrote deletion vectors."""
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    files = [read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": i, "qty": i} for i in range(200)], Position(100, 1))]
    build(spark, tables, *files)
    files.append(_changes(tmp_path, "one", [_event("update", 7, Position(200, 1), {"_id": 7, "qty": -7})]))
    started = spark._jsc.sc().dagScheduler().nextJobId  # type: ignore[union-attr]
    before = started()
    assert refresh_changelog(spark, tables, [str(f) for f in files]).rows_added == 1
    middle = started()
    assert refresh_current_state(spark, tables).upserted == 1
    assert (middle - before, started() - middle) == (2, 5)
    rows = read_current_state(spark, tables.current_state).where("_id BETWEEN 6 AND 8").collect()
    assert {r["_id"]: r["qty"] for r in rows} == {6: 6, 7: -7, 8: 8}


def test_a_small_refresh_compiles_no_code(spark: SparkSession, tmp_path: Path) -> None:
    """A refresh of a few changes into a small table runs its expressions interpreted: compiling the Java code
    of its plans, each of the table's own shape, cost more than the rows it carries (69 classes and a
    quarter of a one-change refresh's time, in a fresh JVM as every Dagster run's, or once Spark's cache of
    compiled classes had dropped them). Counted by Spark's metric of compilations, for a table with a field
    no other test's table has, so no compiled class of another refresh could serve it."""
    field = f"f_{uuid.uuid4().hex[:10]}"
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    files = [read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": i, field: i} for i in range(200)], Position(100, 1))]
    build(spark, tables, *files)
    files.append(_changes(tmp_path, "one", [_event("update", 7, Position(200, 1), {"_id": 7, field: -7})]))
    compiled = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount  # type: ignore[union-attr]
    before = compiled()
    assert refresh_changelog(spark, tables, [str(f) for f in files]).rows_added == 1
    assert refresh_current_state(spark, tables).upserted == 1
    assert compiled() - before <= 5  # 3 here; 69 when Spark compiled code for these plans
    rows = read_current_state(spark, tables.current_state).where("_id BETWEEN 6 AND 8").collect()
    assert {r["_id"]: r[field] for r in rows} == {6: 6, 7: -7, 8: 8}


def test_a_bulk_load_into_a_small_table_is_not_planned_as_a_small_refresh(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without broadcast joins both sides of the MERGE are shuffled, into one partition for a small table:
    a collection snapshotted nearly empty and then fed an import must keep the plan that scales with the
    changes. (The bound is lowered to this table's size, so that a few thousand changes count as a bulk load.)"""
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    files = [read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": i, "qty": i} for i in range(200)], Position(100, 1))]
    build(spark, tables, *files)
    monkeypatch.setattr(current_state, "_SMALL_TABLE_BYTES", look(spark, tables.current_state).size_bytes)
    bulk = [_event("insert", 1000 + i, Position(200, i + 1), {"_id": 1000 + i, "qty": i, "note": "x" * 40})
            for i in range(3000)]  # fmt: skip
    files.append(_changes(tmp_path, "bulk", bulk))
    refresh_changelog(spark, tables, [str(f) for f in files])
    seen: list[str | None] = []
    original = current_state._merge

    def watched(session: SparkSession, *args: Any, **kwargs: Any) -> Any:
        seen.append(session.conf.get("spark.sql.adaptive.enabled", None))
        return original(session, *args, **kwargs)

    monkeypatch.setattr(current_state, "_merge", watched)
    assert refresh_current_state(spark, tables).upserted == 3000
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"  # the session's own
    assert seen == ["true"]  # planned with it, not as a small refresh
    assert read_current_state(spark, tables.current_state).count() == 3200


def test_every_core_gets_a_shuffle_partition_once_the_data_is_worth_it(spark: SparkSession) -> None:
    """A 60 MB table in one partition left a core idle through a full build's fold and write."""
    cores = spark.sparkContext.defaultParallelism
    mb = 1024 * 1024
    sizes = {1024: 1, 60 * mb: max(1, min(cores, 7)), 100_000 * mb: 4 * cores}
    for nbytes, expected in sizes.items():
        with current_state.sized_shuffles(spark, nbytes) as partitions:
            assert partitions == expected, nbytes
            assert spark.conf.get("spark.sql.shuffle.partitions") == str(expected)


def test_a_refresh_that_loses_a_commit_to_another_writer_is_tried_again(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    snap = read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": i, "qty": i} for i in range(10)], Position(100, 1))
    build(spark, tables, snap)
    later = [_event("update", 2, Position(200, 1), {"_id": 2, "qty": 20, "note": "new field"}),
             _event("insert", 30, Position(200, 2), {"_id": 30, "qty": 30})]  # fmt: skip
    refresh_changelog(spark, tables, [str(snap), str(_changes(tmp_path, "s", later))])

    original = current_state._apply
    lost: list[int] = []

    def another_writer_first(*args: Any) -> None:
        if not lost:  # the first attempt added the column `note`, then another writer committed first
            lost.append(1)
            DeltaTable.forPath(spark, tables.current_state).update(F.col("_id") == 5, {"qty": F.lit(-5)})
            raise ConcurrentAppendException("[DELTA_CONCURRENT_APPEND] a concurrent UPDATE added data")
        original(*args)

    monkeypatch.setattr(current_state, "_apply", another_writer_first)
    result = refresh_current_state(spark, tables)
    assert lost, "the first attempt did not reach its MERGE"
    assert (result.keys_merged, result.upserted, result.row_count) == (2, 2, 11)
    rows = {r["_id"]: (r["qty"], r["note"]) for r in read_current_state(spark, tables.current_state).collect()}
    assert rows[2] == (20, "new field") and rows[30] == (30, None)
    assert rows[5] == (-5, None)  # the other writer's commit stands
    assert refresh_current_state(spark, tables).keys_merged == 0  # the retried attempt recorded its version


def test_the_row_count_is_kept_without_counting_and_counted_after_another_writer(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    snap = read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": i, "qty": i} for i in range(20)], Position(100, 1))
    files = [snap]
    frame = type(spark.range(1))
    original = frame.count
    counted: list[int] = []

    def counting(self: DataFrame) -> int:
        counted.append(1)
        return original(self)

    def refresh(name: str, events: list[Event]) -> tuple[int, bool]:
        """The refreshed row count (checked against the table) and whether the refresh counted the table."""
        files.append(_changes(tmp_path, name, events))
        refresh_changelog(spark, tables, [str(f) for f in files])
        before = len(counted)
        rows = refresh_current_state(spark, tables).row_count
        recounted = len(counted) > before
        assert rows == read_current_state(spark, tables.current_state).count(), name
        return rows, recounted

    assert build(spark, tables, snap).count() == 20
    monkeypatch.setattr(frame, "count", counting)
    assert refresh("a", [_event("insert", 50, Position(200, 1), {"_id": 50}), _event("delete", 3, Position(200, 2))]) == (20, False)
    assert refresh("b", [_event("insert", 51, Position(201, 1), {"_id": 51, "new": True})]) == (21, False)  # and a column
    DeltaTable.forPath(spark, tables.current_state).delete(F.col("_id") < 5)  # another writer: 4 rows gone
    assert refresh("c", [_event("insert", 52, Position(202, 1), {"_id": 52})]) == (18, True)
    assert refresh("d", [_event("delete", 52, Position(203, 1))]) == (17, False)
    DeltaTable.forPath(spark, tables.current_state).delete(F.col("_id") == 5)  # another writer, then a MERGE
    assert refresh("e", [_event("delete", 999, Position(204, 1))]) == (16, True)  # that changes nothing
    before = len(counted)
    assert refresh_current_state(spark, tables).row_count == 16 and len(counted) == before  # nothing new


def test_a_column_an_interrupted_refresh_added_with_another_type_is_rewritten(spark: SparkSession, tmp_path: Path) -> None:
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    snap = read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": i, "qty": i} for i in range(5)], Position(100, 1))
    build(spark, tables, snap)
    # an attempt that saw fewer events added `note` as a number, then stopped before recording its shape
    spark.sql(f"ALTER TABLE delta.`{tables.current_state}` ADD COLUMNS (note BIGINT AFTER qty)")
    later = [_event("update", 2, Position(200, 1), {"_id": 2, "qty": 2, "note": "a text"})]
    refresh_changelog(spark, tables, [str(snap), str(_changes(tmp_path, "s", later))])
    refresh_current_state(spark, tables)
    state = read_current_state(spark, tables.current_state)
    assert dict(state.dtypes)["note"] == "string"
    assert {r["_id"]: r["note"] for r in state.collect()} == {0: None, 1: None, 2: "a text", 3: None, 4: None}


@pytest.mark.parametrize("leftover", ["empty log", "half removed", "someone's file"])
def test_what_an_interrupted_first_refresh_left_is_cleared_and_nothing_else(
    spark: SparkSession, tmp_path: Path, leftover: str
) -> None:
    """A run killed inside ``CREATE TABLE`` leaves an empty ``_delta_log`` (Delta then refuses to create the
    table there); one killed while removing a mistyped first build leaves some of its files. The next refresh
    builds the table; a location holding anyone else's file is an error that names it and deletes nothing."""
    docs = [{"_id": i, "qty": i} for i in range(5)]
    snap = read_file(tmp_path / "snap.parquet", DB, "orders", docs, Position(100, 1))
    reference = CollectionTables.under(str(tmp_path / "reference"), f"{DB}.orders")
    build(spark, reference, snap)
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    location = Path(tables.current_state)
    (location / "_delta_log").mkdir(parents=True)
    if leftover == "half removed":
        for part in Path(reference.current_state).glob("*part-*.parquet*"):
            shutil.copy(part, location / part.name)
        (location / "_delta_log" / ".00000000000000000001.json.crc").write_text("")
    elif leftover == "someone's file":
        (location / "notes.txt").write_text("mine")
    refresh_changelog(spark, tables, [str(snap)])
    if leftover == "someone's file":
        with pytest.raises(TableInputError, match=r"is not a Delta table but holds other files \(notes.txt\)"):
            refresh_current_state(spark, tables)
        assert (location / "notes.txt").read_text() == "mine"
        return
    refresh_current_state(spark, tables)
    assert _docs(spark, tables) == _docs(spark, reference)

    def operations(t: CollectionTables) -> list[str]:
        return [r.operation for r in DeltaTable.forPath(spark, t.current_state).history().orderBy("version").collect()]

    assert operations(tables) == operations(reference)  # built as if nothing had been there


def test_a_refresh_that_keeps_losing_its_commit_fails_with_the_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    this_thread, real_sleep = threading.get_ident(), time.sleep

    def sleep(seconds: float) -> None:
        """The refresh's pauses are counted, not slept; any other thread of the process (a driver's
        monitor left by an earlier test) sleeps as before."""
        if threading.get_ident() == this_thread:
            calls.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(collection.time, "sleep", sleep)

    def always_second() -> None:
        raise ConcurrentAppendException("[DELTA_CONCURRENT_APPEND] a concurrent MERGE added data")

    with pytest.raises(ConcurrentAppendException):
        collection._retrying_conflicts("shop.orders: current_state refresh", always_second)
    assert len(calls) == collection.CONFLICT_ATTEMPTS - 1  # a pause between attempts, none after the last
    assert all(0 < pause <= 30 for pause in calls) and calls[-1] > calls[0]


def test_log_checkpoints_do_not_fall_on_every_fifth_refresh(spark: SparkSession, tmp_path: Path) -> None:
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    files = [read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": i, "qty": i} for i in range(5)], Position(100, 1))]
    build(spark, tables, *files)
    logs = {"changelog": tables.changelog, "current_state": tables.current_state}
    for n in range(10):  # each refresh commits once to each table: its data, with its state
        files.append(_changes(tmp_path, f"s{n}", [_event("update", n % 5, Position(200 + n, 1), {"_id": n % 5, "qty": -n})]))
        built = {name: latest_version(spark, location) for name, location in logs.items()}
        refresh_changelog(spark, tables, [str(f) for f in files])
        assert refresh_current_state(spark, tables).keys_merged == 1
        assert {name: latest_version(spark, location) for name, location in logs.items()} == {
            name: version + 1 for name, version in built.items()}
    assert all(latest_version(spark, location) >= 10 for location in logs.values())  # Delta's default: one there
    assert {name: sorted(p.name for p in Path(location, "_delta_log").glob("*.checkpoint*"))
            for name, location in logs.items()} == {"changelog": [], "current_state": []}  # fmt: skip
    assert {r["_id"]: r["qty"] for r in read_current_state(spark, tables.current_state).collect()} == {
        0: -5, 1: -6, 2: -7, 3: -8, 4: -9
    }
