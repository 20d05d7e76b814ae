"""Kafka -> Structured Streaming -> the same per-collection tables as the landing path, exactly once."""

from __future__ import annotations

import datetime
import random
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from bson.timestamp import Timestamp
from delta.tables import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position
from mongocdc_core.sinks.kafka import KafkaSink, KafkaSinkSettings
from mongocdc_core.tables import (
    CollectionTables,
    changelog,
    read_changelog,
    read_current_state,
    refresh_changelog,
)
from mongocdc_core.tables.changelog import table_properties
from mongocdc_core.tables.streaming import StreamSettings, _parts, _write_collection, start_stream

from .support import build, comparable
from .workload import DB, Workload, converter, slice_records, snapshot_records, write_landing

_LANDING_ONLY = ("__origin", "__ingested_at")


def _produce(bootstrap: str, records: list[Record]) -> None:
    """Through mongocdc's own Kafka sink (it sets the position header)."""
    sink = KafkaSink(KafkaSinkSettings.from_config(bootstrap))
    sink.write(records)
    sink.flush()
    sink.close()


def _stream(spark: SparkSession, bootstrap: str, topics: list[str], root: Path, checkpoint: Path,
            pattern: bool = False) -> None:
    settings = StreamSettings(
        bootstrap_servers=bootstrap, topics=topics, root=str(root), checkpoint_location=str(checkpoint),
        pattern=pattern, available_now=True, max_offsets_per_trigger=60,
    )
    query: StreamingQuery = start_stream(spark, settings)
    query.awaitTermination(900)
    assert query.exception() is None


def _crafted(conv: Any, position: Position) -> list[Record]:
    """A snapshot read taken at ``position`` whose wall-clock read time (T+1.2 s) is later than changes made
    after the snapshot began, at (T+1, 10) and (T+1, 11): by position the changes win."""
    t = position.seconds
    read_at = datetime.datetime.fromtimestamp(t + 1.2, datetime.UTC)
    records = [conv.convert_read({"_id": k, "v": "stale"}, DB, "orders", position, "true", read_at) for k in ("r1", "r2")]
    for op, pos, extra in (("update", Position(t + 1, 10), {"fullDocument": {"_id": "r1", "v": "fresh"}}),
                           ("delete", Position(t + 1, 11), {})):
        change = {"operationType": op, "ns": {"db": DB, "coll": "orders"}, "clusterTime": Timestamp(t + 1, pos.increment),
                  "documentKey": {"_id": "r1" if op == "update" else "r2"}, **extra}
        if op == "update":
            change["updateDescription"] = {"updatedFields": {"v": "fresh"}, "removedFields": [], "truncatedArrays": []}
        records += conv.convert_change(change, pos)
    return records


def test_both_paths_build_identical_tables_exactly_once(
    spark: SparkSession, tmp_path: Path, kafka_bootstrap: str
) -> None:
    wl = Workload(random.Random(5), collections=("orders",), full_document=False)
    conv = converter("change_streams")  # no full documents: update descriptions are folded
    wl.run(5)
    first = snapshot_records(conv, wl, "orders")
    start = len(wl.events)
    wl.run(40)
    first += slice_records(conv, wl.events[start:])
    later_start = len(wl.events)
    wl.run(30)
    later = slice_records(conv, wl.events[later_start:]) + _crafted(conv, wl.position())
    topic = first[0].topic

    # Kafka path: two runs of the stream over one checkpoint (a restart), with records re-produced
    # in between (as an at-least-once producer does after a crash)
    _produce(kafka_bootstrap, first)
    root, checkpoint = tmp_path / "kafka", tmp_path / "checkpoint"
    _stream(spark, kafka_bootstrap, [topic], root, checkpoint)
    _produce(kafka_bootstrap, first[-10:] + later)
    _stream(spark, kafka_bootstrap, [topic], root, checkpoint)

    # landing path: the same events as files
    files = [write_landing(tmp_path / "a.parquet", first), write_landing(tmp_path / "b.parquet", later)]
    landing = CollectionTables.under(str(tmp_path / "landing"), f"{DB}.orders")
    build(spark, landing, *files)

    kafka = CollectionTables.under(str(root), f"{DB}.orders")
    assert comparable(read_current_state(spark, kafka.current_state)) == comparable(
        read_current_state(spark, landing.current_state)
    )
    events = sum(1 for r in first + later if r.op is not None)
    kafka_log = read_changelog(spark, kafka.changelog)
    assert kafka_log.count() == events  # exactly once, despite the re-produced records and the restart
    assert comparable(kafka_log, _LANDING_ONLY) == comparable(read_changelog(spark, landing.changelog), _LANDING_ONLY)
    state = {r["_id"]: r for r in read_current_state(spark, kafka.current_state).collect()}
    assert "r2" not in state and state["r1"]["__doc"].toJson() == '{"_id":"r1","v":"fresh"}'  # no resurrection

    # a collection added while the job runs: a new topic matching the pattern gets its own tables
    users = [conv.convert_read({"_id": 1, "n": "x"}, DB, "users", Position(5, 1), "true")]
    _produce(kafka_bootstrap, users)
    _stream(spark, kafka_bootstrap, [r"dbz\.shop\..*"], root, tmp_path / "pattern-checkpoint", pattern=True)
    added = CollectionTables.under(str(root), f"{DB}.users")
    assert [r["n"] for r in read_current_state(spark, added.current_state).collect()] == ["x"]
    assert read_changelog(spark, kafka.changelog).count() == events  # a second reader of orders added nothing


@pytest.mark.timeout(2400)
def test_one_query_builds_every_collections_tables_and_picks_up_a_new_topic(
    spark: SparkSession, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """One query for all the connector's topics (not one per collection): each micro-batch writes every
    collection it touched; a collection whose topic appears while the query runs gets its tables; a
    restart over the same checkpoint with re-produced records adds nothing."""
    colls = ("orders", "users", "items")
    wl = Workload(random.Random(11), collections=colls[:2], full_document=True)
    conv = EventConverter(EventOptions(topic_prefix="multi", capture_mode="change_streams_update_full", rs="rs0",
                                       now_ns=lambda: 1))
    wl.run(12)
    first = slice_records(conv, wl.events)
    _produce(kafka_bootstrap, first)

    root, checkpoint = tmp_path / "kafka", tmp_path / "checkpoint"
    settings = StreamSettings(bootstrap_servers=kafka_bootstrap, topics=[r"multi\.shop\..*"], pattern=True,
                              root=str(root), checkpoint_location=str(checkpoint))
    query = start_stream(spark, settings)
    try:
        query.processAllAvailable()
        # a third collection appears while the query runs: its topic is created now
        wl.collections = colls
        wl.docs["items"] = {}
        later_start = len(wl.events)
        wl.run(12)
        later = slice_records(conv, wl.events[later_start:])
        assert "multi.shop.items" in {r.topic for r in later}
        _produce(kafka_bootstrap, later)
        query.processAllAvailable()
        assert [q.id for q in spark.streams.active if q.name == "mongocdc-tables"] == [query.id]
    finally:
        query.stop()
    assert query.exception() is None

    # a restart over the same checkpoint, with records re-produced as an at-least-once producer does
    _produce(kafka_bootstrap, [r for r in first if r.topic == "multi.shop.orders"][-5:])
    _stream(spark, kafka_bootstrap, [r"multi\.shop\..*"], root, checkpoint, pattern=True)

    for coll in colls:
        tables = CollectionTables.under(str(root), f"{DB}.{coll}")
        events = sum(1 for r in first + later if r.topic == f"multi.shop.{coll}" and r.op is not None)
        assert events and read_changelog(spark, tables.changelog).count() == events, coll  # exactly once
        assert read_current_state(spark, tables.current_state).count() == len(wl.docs[coll]), coll


@pytest.mark.timeout(2400)
def test_a_micro_batch_writes_its_collections_at_once_and_one_failing_keeps_the_batch(
    spark: SparkSession, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """One micro-batch touching three collections writes them at the same time (each waits at a barrier
    until all three are being written: one after another, the first would wait alone and fail). One
    collection's tables cannot be written: the others are, the query fails naming it, and the batch's
    offsets are not committed, so a restart over the checkpoint writes that collection, the others once."""
    colls = ("orders", "users", "items")
    wl = Workload(random.Random(21), collections=colls, full_document=True)
    conv = EventConverter(EventOptions(topic_prefix="conc", capture_mode="change_streams_update_full", rs="rs0",
                                       now_ns=lambda: 1))
    wl.run(24)
    records = slice_records(conv, wl.events)
    assert {r.topic for r in records} == {f"conc.shop.{c}" for c in colls}
    _produce(kafka_bootstrap, records)

    root, checkpoint = tmp_path / "kafka", tmp_path / "checkpoint"
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("the users tables cannot be made under a file")
    together = threading.Barrier(len(colls), timeout=300)

    def tables(namespace: str) -> CollectionTables:
        together.wait()  # BrokenBarrierError (a failed collection) unless all three are written at once
        return CollectionTables.under(str(blocked if namespace == f"{DB}.users" else root), namespace)

    settings = StreamSettings(bootstrap_servers=kafka_bootstrap, topics=[r"conc\.shop\..*"], pattern=True,
                              root=str(root), checkpoint_location=str(checkpoint), available_now=True,
                              tables=tables, concurrency=len(colls))
    query = start_stream(spark, settings)
    with pytest.raises(StreamingQueryException) as failed:
        query.awaitTermination(900)
    failure = str(failed.value)
    assert "BatchWriteError: micro-batch 0: the tables of 1 collection(s) failed" in failure, failure[-3000:]
    assert f"\n{DB}.users: org.apache.spark.sql.delta.DeltaIOException: [DELTA_CANNOT_CREATE_LOG_PATH]" in failure
    assert f"{DB}.orders: " not in failure and f"{DB}.items: " not in failure
    assert sorted(p.name for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()) == ["0"]
    assert not [p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]  # batch 0 not committed

    def events(coll: str) -> int:
        return sum(1 for r in records if r.topic == f"conc.shop.{coll}" and r.op is not None)

    for coll in ("orders", "items"):  # written although users failed
        written = CollectionTables.under(str(root), f"{DB}.{coll}")
        assert events(coll) and read_changelog(spark, written.changelog).count() == events(coll), coll
        assert read_current_state(spark, written.current_state).count() == len(wl.docs[coll]), coll

    blocked.unlink()
    _stream(spark, kafka_bootstrap, [r"conc\.shop\..*"], root, checkpoint, pattern=True)
    assert sorted(p.name for p in (checkpoint / "commits").iterdir() if p.name.isdigit()) == ["0"]  # batch 0 again
    for coll in colls:  # the same tables as the landing path builds from the same events
        written = CollectionTables.under(str(root), f"{DB}.{coll}")
        assert events(coll) and read_changelog(spark, written.changelog).count() == events(coll), coll  # once
        landing = CollectionTables.under(str(tmp_path / "landing"), f"{DB}.{coll}")
        build(spark, landing, write_landing(tmp_path / f"{coll}.parquet", [r for r in records if r.topic.endswith(coll)]))
        assert read_current_state(spark, written.current_state).count() == len(wl.docs[coll]), coll
        assert comparable(read_current_state(spark, written.current_state)) == comparable(
            read_current_state(spark, landing.current_state)
        ), coll


@pytest.mark.timeout(2400)
def test_a_micro_batch_of_later_events_is_appended_without_looking_them_up(
    spark: SparkSession, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """Events later than the position a changelog recorded in its latest commit are appended blind (Delta's
    ``isBlindAppend``: the table was not read to find them): a steady micro-batch costs no lookup per
    collection. Records produced again are looked up in the table, and add nothing."""
    wl = Workload(random.Random(31), collections=("orders",), full_document=True)
    conv = EventConverter(EventOptions(topic_prefix="blind", capture_mode="change_streams_update_full", rs="rs0",
                                       now_ns=lambda: 1))
    wl.run(10)
    first = slice_records(conv, wl.events)
    start = len(wl.events)
    wl.run(10)
    later = slice_records(conv, wl.events[start:])
    root, checkpoint, topics = tmp_path / "kafka", tmp_path / "checkpoint", [r"blind\.shop\..*"]
    tables = CollectionTables.under(str(root), f"{DB}.orders")

    def appends() -> list[bool]:
        history = DeltaTable.forPath(spark, tables.changelog).history().where("operation = 'WRITE'")
        return [bool(r["isBlindAppend"]) for r in history.orderBy("version").collect()]

    _produce(kafka_bootstrap, first)
    _stream(spark, kafka_bootstrap, topics, root, checkpoint, pattern=True)
    _produce(kafka_bootstrap, later)
    _stream(spark, kafka_bootstrap, topics, root, checkpoint, pattern=True)
    steady = appends()
    assert len(steady) >= 2 and all(steady), steady  # the table's first write, then the later events': blind

    _produce(kafka_bootstrap, first[-5:] + later[-5:])  # an at-least-once producer's repeats
    _stream(spark, kafka_bootstrap, topics, root, checkpoint, pattern=True)
    assert not any(appends()[len(steady):])  # looked up
    events = sum(1 for r in first + later if r.op is not None)
    assert read_changelog(spark, tables.changelog).count() == events  # exactly once
    assert read_current_state(spark, tables.current_state).count() == len(wl.docs["orders"])


def _micro_batch(spark: SparkSession, root: Path, landing: Path) -> None:
    """The streaming path's write of one micro-batch holding ``landing``'s events (no Kafka: the rows the
    batch would hold, through the same per-collection write)."""
    rows = changelog.changelog_rows(
        spark.read.schema(changelog.LANDING_SPARK_SCHEMA).parquet(str(landing)), F.lit("kafka:t:0"), f"{DB}.orders",
    ).localCheckpoint()
    view = f"mongocdc_batch_{uuid.uuid4().hex}"
    rows.createGlobalTempView(view)
    try:
        settings = StreamSettings(bootstrap_servers="unused:9092", topics=["t"], root=str(root),
                                  checkpoint_location=str(root / "checkpoint"))
        _write_collection(settings, f"global_temp.{view}", _parts(rows), spark, f"{DB}.orders")
    finally:
        spark.catalog.dropGlobalTempView(view)


def _once(spark: SparkSession, tables: CollectionTables, events: int) -> None:
    log = read_changelog(spark, tables.changelog)
    assert log.count() == log.dropDuplicates(["__key", "__position", "__op"]).count() == events


def test_a_replayed_micro_batch_records_the_position_of_the_events_it_was_given(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A batch appended, then the job stopped before recording it: its replay appends nothing, yet the
    table holds its events, so the position it records is theirs; records produced again after it are
    looked up (not appended blind behind a stale position): each event once."""
    wl = Workload(random.Random(41), collections=("orders",), full_document=True)
    conv = converter("change_streams_update_full")
    wl.run(12)
    total = len(wl.events)
    root = tmp_path / "kafka"
    tables = CollectionTables.under(str(root), f"{DB}.orders")
    a = write_landing(tmp_path / "a.parquet", slice_records(conv, wl.events[:6]))
    b = write_landing(tmp_path / "b.parquet", slice_records(conv, wl.events[6:9]))
    c = write_landing(tmp_path / "c.parquet", slice_records(conv, wl.events[7:]))
    _micro_batch(spark, root, a)
    stopped = changelog.changelog_rows(spark.read.schema(changelog.LANDING_SPARK_SCHEMA).parquet(str(b)),
                                       F.lit("kafka:t:0"), f"{DB}.orders")
    assert changelog.append_events(spark, tables.changelog, f"{DB}.orders", stopped).rows == 3  # no record
    _micro_batch(spark, root, b)  # the replay: nothing appended
    assert table_properties(spark, tables.changelog)["mongocdc.position"] == wl.events[8].position.to_str()
    _micro_batch(spark, root, c)  # two records again, and later ones
    _once(spark, tables, total)


def test_a_landing_refresh_after_a_micro_batch_does_not_take_its_commit_for_its_own(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A landing refresh stopped between its append (whose commit records its state) and its manifest,
    then a micro-batch of earlier events (the stream lagging the landing zone) recording its row count:
    the next landing refresh neither takes the batch's commit for its own (the digest) nor the recorded
    position for the table's highest (the batch counted the table, so its position covers the stopped
    append): the file is looked up, each event once."""
    wl = Workload(random.Random(43), collections=("orders",), full_document=True)
    conv = converter("change_streams_update_full")
    wl.run(9)
    total = len(wl.events)
    root = tmp_path / "tables"
    tables = CollectionTables.under(str(root), f"{DB}.orders")
    s0 = str(write_landing(tmp_path / "s0.parquet", slice_records(conv, wl.events[:6])))
    s1 = str(write_landing(tmp_path / "s1.parquet", slice_records(conv, wl.events[6:])))
    assert refresh_changelog(spark, tables, [s0]).row_count == 6

    append = changelog.append_recorded

    def stop(*args: Any, **kwargs: Any) -> None:
        append(*args, **kwargs)
        raise KeyboardInterrupt("stopped after the append, before the manifest")

    with monkeypatch.context() as patched:
        patched.setattr(changelog, "append_recorded", stop)
        with pytest.raises(KeyboardInterrupt):
            refresh_changelog(spark, tables, [s0, s1])
    assert read_changelog(spark, tables.changelog).count() == total  # appended, not recorded
    _micro_batch(spark, root, write_landing(tmp_path / "late.parquet", slice_records(conv, wl.events[3:6])))
    again = refresh_changelog(spark, tables, [s0, s1])
    assert (again.files_read, again.rows_added, again.row_count) == (1, 0, total)
    _once(spark, tables, total)
