"""The changelog: idempotent per event, before-images kept, partitioned by change date, recorded position."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from bson import Timestamp
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from mongocdc_core.positions import Position
from mongocdc_core.tables import CollectionTables, changelog, read_changelog, refresh_changelog
from mongocdc_core.tables.changelog import may_repeat, snapshot_part, table_properties

from .support import read_file
from .workload import DB, Event, Workload, converter, slice_records, write_landing


def test_delivering_the_same_files_twice_adds_nothing(spark: SparkSession, tmp_path: Path) -> None:
    wl = Workload(random.Random(1), collections=("orders", "users"), full_document=True, pre_images=True)
    conv = converter("change_streams_update_full_with_pre_image")
    wl.run(30)
    mixed = write_landing(tmp_path / "slice.parquet", slice_records(conv, wl.events))  # two collections
    copy = write_landing(tmp_path / "copy.parquet", slice_records(conv, wl.events))  # the same events again
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    first = refresh_changelog(spark, tables, [mixed])
    expected = sum(1 for e in wl.events if e.change["ns"]["coll"] == "orders")
    assert first.files_read == 1 and first.rows_added == first.row_count == expected  # users' rows ignored
    assert sum(first.counts.values()) == expected
    again = refresh_changelog(spark, tables, [mixed, copy])
    assert (again.files_read, again.rows_added, again.row_count) == (1, 0, expected)
    os.utime(mixed)  # a re-written file (new version) is read again, and still adds nothing new
    assert refresh_changelog(spark, tables, [mixed, copy]).files_read == 1
    log = read_changelog(spark, tables.changelog)
    assert log.count() == log.dropDuplicates(["__key", "__position", "__op"]).count() == expected

    # before-images of the with_pre_image capture modes are kept
    updates = log.where(F.col("__op") == "u")
    assert updates.count() > 0 and updates.where(F.col("before").isNull()).count() == 0
    assert log.where(F.col("__op") == "d").where(F.col("before").isNull()).count() == 0

    # partitioned by change date; the table records its collection and last position
    assert DeltaTable.forPath(spark, tables.changelog).detail().first()["partitionColumns"] == ["__change_date"]  # type: ignore[index]
    props = table_properties(spark, tables.changelog)
    assert props["mongocdc.source.collection"] == f"{DB}.orders"
    assert props["mongocdc.position"] == first.position == log.agg(F.max("__position")).first()[0]  # type: ignore[index]
    assert props["delta.enableChangeDataFeed"] == "true"


def test_full_snapshots_are_recognised_by_name_and_complete_plans(spark: SparkSession, tmp_path: Path) -> None:
    assert snapshot_part("/h/landing/snapshot/db.c/snapshot.parquet", "db.c") == ("", 1, 1)
    assert snapshot_part("s3a://b/landing/snapshot/db.c/ranges-ab12/02-of-03.parquet", "db.c") == (
        "db.c/ranges-ab12", 2, 3
    )
    assert snapshot_part("/h/landing/snapshot/db.c/ranges-ab12/range-00000-of-00003.parquet", "db.c") == (
        "db.c/ranges-ab12", 0, 3
    )  # as the Dagster range assets name them
    assert snapshot_part("/h/landing/snapshot/db.c/filtered-1f.parquet", "db.c") is None
    assert snapshot_part("/h/landing/stream_slice/db.c/20260101T000000Z.parquet", "db.c") is None
    assert snapshot_part("/h/landing/snapshot/db.other/snapshot.parquet", "db.c") is None

    tables = CollectionTables.under(str(tmp_path / "tables"), "db.c")
    plan = tmp_path / "landing" / "snapshot" / "db.c" / "ranges-p1"
    one = read_file(plan / "1-of-2.parquet", "db", "c", [{"_id": 1}], Position(100, 5))
    refresh_changelog(spark, tables, [one])
    assert "mongocdc.snapshot.position" not in table_properties(spark, tables.changelog)  # 1 of 2: incomplete
    two = read_file(plan / "2-of-2.parquet", "db", "c", [{"_id": 9}], Position(100, 2))
    refresh_changelog(spark, tables, [one, two])
    assert table_properties(spark, tables.changelog)["mongocdc.snapshot.position"] == Position(100, 2).to_str()


def test_a_snapshot_files_read_position_is_read_from_its_footer_or_else_from_its_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A snapshot file of reads only (as the snapshot assets write it) tells its position in its footer,
    so a build reads its landing files once; one whose footer cannot tell (it also holds a change) is
    aggregated, with the same answer."""
    plan = tmp_path / "landing" / "snapshot" / f"{DB}.c" / "ranges-p1"
    reads = read_file(plan / "1-of-2.parquet", DB, "c", [{"_id": 1}, {"_id": 2}], Position(100, 3))
    assert changelog._footer_read_position(str(reads)) == (True, Position(100, 3).to_str())
    conv = converter("change_streams_update_full")
    insert = {"operationType": "insert", "ns": {"db": DB, "coll": "c"}, "documentKey": {"_id": 7},
              "clusterTime": Timestamp(150, 1), "fullDocument": {"_id": 7}}  # fmt: skip
    mixed = write_landing(plan / "2-of-2.parquet", [
        conv.convert_read({"_id": 9}, DB, "c", Position(100, 2), "true"),
        *slice_records(conv, [Event(insert, Position(150, 1))]),
    ])  # fmt: skip
    assert changelog._footer_read_position(str(mixed)) == (False, None)
    empty = write_landing(tmp_path / "landing" / "snapshot" / f"{DB}.c" / "snapshot.parquet", [])
    assert changelog._footer_read_position(str(empty)) == (True, None)
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.c")
    refresh_changelog(spark, tables, [reads, mixed])
    assert table_properties(spark, tables.changelog)["mongocdc.snapshot.position"] == Position(100, 2).to_str()


def test_files_read_together_that_hold_the_same_events_add_each_event_once(spark: SparkSession, tmp_path: Path) -> None:
    """A re-delivered file read in the same refresh as its first copy, into a new table and into an
    existing one: each event once."""
    wl = Workload(random.Random(2), collections=("orders",), full_document=True)
    conv = converter("change_streams_update_full")
    wl.run(25)
    first = [write_landing(tmp_path / f"a{i}.parquet", slice_records(conv, wl.events)) for i in range(2)]
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    made = refresh_changelog(spark, tables, first)
    assert (made.files_read, made.rows_added, made.row_count) == (2, len(wl.events), len(wl.events))
    seen = len(wl.events)
    wl.run(15)
    later = [write_landing(tmp_path / f"b{i}.parquet", slice_records(conv, wl.events[seen:])) for i in range(2)]
    grown = refresh_changelog(spark, tables, first + later)
    assert (grown.files_read, grown.rows_added, grown.row_count) == (2, len(wl.events) - seen, len(wl.events))
    log = read_changelog(spark, tables.changelog)
    assert log.count() == log.dropDuplicates(["__key", "__position", "__op"]).count() == len(wl.events)


def test_files_that_cannot_share_an_event_are_not_deduplicated(tmp_path: Path) -> None:
    """Footer statistics tell when two landing files may hold the same event (then the batch is deduplicated)."""
    conv = converter("change_streams_update_full")
    wl = Workload(random.Random(2), collections=("orders",), full_document=True)
    wl.run(10)
    snap_a = read_file(tmp_path / "a.parquet", DB, "orders", [{"_id": 1}], Position(1_700_000_000, 5))
    snap_b = read_file(tmp_path / "b.parquet", DB, "orders", [{"_id": 2}], Position(1_700_000_000, 9))
    s0 = write_landing(tmp_path / "s0.parquet", slice_records(conv, wl.events[:5]))
    s1 = write_landing(tmp_path / "s1.parquet", slice_records(conv, wl.events[5:]))
    # a snapshot inside a slice's window: a read never repeats a change; disjoint slices share nothing
    assert not may_repeat([str(f) for f in (snap_a, s0, s1)])
    assert not may_repeat([str(snap_a), str(snap_b)])
    assert may_repeat([str(snap_a), str(snap_a)])  # the same snapshot twice
    both = write_landing(tmp_path / "both.parquet", slice_records(conv, wl.events[3:8]))
    assert may_repeat([str(s0), str(both)])  # overlapping windows
    assert may_repeat(["s3a://bucket/x.parquet", str(s0)])  # no statistics to read: deduplicate


def test_members_read_without_a_parser_are_those_a_parser_reads(spark: SparkSession) -> None:
    """The text searches for ``key.id``, ``source.ts_ms`` and ``transaction.id`` give JSONPath's
    answer for every spelling, the connector's and others (where they cannot be sure, they parse)."""
    keys = [
        '{"id":"37247"}', '{"id":"-5"}', '{"id":""}', '{"id":"\\"sku-1\\""}',
        '{"id":"{\\"$oid\\": \\"65a1b2c3d4e5f60718293a4b\\"}"}', '{"id":"{\\"a\\": 1, \\"b\\": \\"two\\"}"}',
        '{"id":"\\"line\\nbreak\\""}', '{"id":"\\"back\\\\\\\\slash\\""}', '{"id":"\\"\\u00e9\\""}',
        '{"id": "7"}', '{ "id":"7"}', '{"id":"7","x":"y"}', '{"x":"1","id":"7"}', '{"id":7}', '{"id":null}',
        '{"id":"}', '{"id":"a"}garbage"}', '{}', "not json", None,
    ]
    sources = [
        '{"version":"2.7.0.Final","connector":"mongodb","name":"p","ts_ms":1700000000000,"snapshot":"false"}',
        '{"ts_ms": 1700000000000,"ord": 1}', '{"ord":1,"ts_ms":-3}', '{"ts_ms":12.5,"ord":1}', '{"ts_ms":"9"}',
        '{"db":"a{b","ts_ms":5}', '{"db":"x\\",\\"ts_ms\\":1","ts_ms":2}', '{"xts_ms":1,"ts_ms":2}',
        '{"nested":{"ts_ms":1},"ts_ms":2}', '{"ts_ms":null}', '{"ord":1}', '{}', "[1]", None,
        '{"version":"0.1.0","name":"b","ts_ms":17,"ts_us":17000,"ts_ns":17000000,"snapshot":"true","ord":1}',
        '{"ts_ms":7,"ord":1}', '{"ord":1,"ts_ms":8}', 'x{"ord":1,"ts_ms":9}', '{"ord":1,"ts_ms":3,"n":{"a":1}}',
        '{"ord":1,"n":{"x":1,"ts_ms":4},"ts_ms":5}', '{"ord":1,"ts_ms":6 }', '{"ord":"{","ts_ms":10}',
    ]
    values = [
        '{"op":"c","transaction":null}', '{"op":"c","transaction":{"id":"t1:2","total_order":1}}',
        '{"op":"c","transaction" : { "id" : "t2"}}', '{"op":"c","after":"{\\"transaction\\": {\\"id\\": 1}}"}',
        '{"op":"c","nested":{"transaction":{"id":"inner"}}}', '{"transaction":{"total_order":1}}', None,
        '{"op":"c","nested":{"transaction":{"id":"inner"}},"transaction":null}',
        '{"transaction":{"id":"t3"},"x":{"transaction":null}}', '{"transaction":{"id":"t4"},"x":"\\"transaction\\":null"}',
    ]
    rows = [(k, s, v) for k in keys for s in sources[:2] for v in values[:1]]
    rows += [(keys[0], s, v) for s in sources for v in values]
    frame = spark.createDataFrame(rows, "key string, source string, value string")
    got = frame.select(
        changelog._key_id(F.col("key")).alias("fast_key"), F.get_json_object("key", "$.id").alias("key"),
        changelog._source_ts_ms(F.col("source")).alias("fast_ts"), F.get_json_object("source", "$.ts_ms").alias("ts"),
        changelog._transaction_id(F.col("value")).alias("fast_txn"),
        F.get_json_object("value", "$.transaction.id").alias("txn"),
    ).collect()
    for row in got:
        assert (row["fast_key"], row["fast_ts"], row["fast_txn"]) == (row["key"], row["ts"], row["txn"]), row
    assert {r["fast_txn"] for r in got} >= {"t1:2", "t2", "t3", "t4"} and {r["fast_ts"] for r in got} >= {"1700000000000", "2", "17", "8", "5"}

def test_later_files_skip_the_lookup_only_while_the_recorded_position_is_the_tables(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A file later than the position the changelog recorded is appended without looking up its events in
    the table; once a writer has appended without recording (the streaming job, a refresh stopped before
    its properties commit), the recorded position may be older than the table's events: looked up again."""
    wl = Workload(random.Random(5), collections=("orders",), full_document=True)
    conv = converter("change_streams_update_full")
    wl.run(12)
    total = len(wl.events)
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    s0 = write_landing(tmp_path / "s0.parquet", slice_records(conv, wl.events[:6]))
    assert refresh_changelog(spark, tables, [str(s0)]).row_count == 6
    s1 = write_landing(tmp_path / "s1.parquet", slice_records(conv, wl.events[6:9]))
    assert changelog.later_than([str(s1)], table_properties(spark, tables.changelog)["mongocdc.position"])
    assert not changelog.later_than([str(s0), str(s1)], table_properties(spark, tables.changelog)["mongocdc.position"])
    later = refresh_changelog(spark, tables, [str(s0), str(s1)])
    assert (later.files_read, later.rows_added, later.row_count) == (1, 3, 9)

    # events appended as the streaming job appends them, not recorded in the table's properties; then a
    # landing file holding them and more: each event once
    s2 = write_landing(tmp_path / "s2.parquet", slice_records(conv, wl.events[9:]))
    rows = changelog.changelog_rows(
        spark.read.schema(changelog.LANDING_SPARK_SCHEMA).parquet(str(s2)), F.lit("kafka:t:0"), f"{DB}.orders",
    ).orderBy("__position").limit(2)
    assert changelog.append_events(spark, tables.changelog, f"{DB}.orders", rows).rows == 2
    caught_up = refresh_changelog(spark, tables, [str(s0), str(s1), str(s2)])
    assert (caught_up.files_read, caught_up.rows_added, caught_up.row_count) == (1, total - 11, total)
    log = read_changelog(spark, tables.changelog)
    assert log.count() == log.dropDuplicates(["__key", "__position", "__op"]).count() == total


def test_files_later_than_the_table_are_told_new_by_its_properties_without_the_manifest(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual refresh (the files the last one was given, unchanged, and files later than the table's
    position) decides what is new from the table's properties, without reading the manifest; it still
    records the new files there, so a refresh the properties cannot decide (an older file, a re-written
    one) reads each file once and adds each event once."""
    wl = Workload(random.Random(8), collections=("orders",), full_document=True)
    conv = converter("change_streams_update_full")
    wl.run(12)
    total = len(wl.events)
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    s0 = str(write_landing(tmp_path / "s0.parquet", slice_records(conv, wl.events[:6])))
    assert refresh_changelog(spark, tables, [s0]).row_count == 6
    reads: list[str] = []
    manifest = changelog._manifest
    monkeypatch.setattr(changelog, "_manifest", lambda s, loc: reads.append(loc) or manifest(s, loc))

    s1 = str(write_landing(tmp_path / "s1.parquet", slice_records(conv, wl.events[6:9])))
    later = refresh_changelog(spark, tables, [s0, s1])
    assert (later.files_read, later.rows_added, later.row_count, reads) == (1, 3, 9, [])
    listed = spark.read.format("delta").load(f"{tables.changelog}/{changelog.MANIFEST_DIR}").select("path").collect()
    assert sorted(r["path"] for r in listed) == [s0, s1]

    # a late file of older events (some already in the table) and a later one: the manifest decides
    late = str(write_landing(tmp_path / "late.parquet", slice_records(conv, wl.events[2:7])))
    s2 = str(write_landing(tmp_path / "s2.parquet", slice_records(conv, wl.events[9:])))
    mixed = refresh_changelog(spark, tables, [s0, s1, late, s2])
    assert (mixed.files_read, mixed.rows_added, mixed.row_count, len(reads)) == (2, total - 9, total, 1)
    os.utime(s1)  # a re-written file: the digest differs, the manifest decides (nothing new in it)
    assert refresh_changelog(spark, tables, [s0, s1, late, s2]).files_read == 1
    log = read_changelog(spark, tables.changelog)
    assert sorted(r["__position"] for r in log.select("__position").collect()) == sorted(e.position.to_str() for e in wl.events)
    assert log.count() == log.dropDuplicates(["__key", "__position", "__op"]).count() == total
