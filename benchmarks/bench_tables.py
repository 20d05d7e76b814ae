"""The lakehouse tables against plain Delta baselines, in one Spark session, printed as ratios.

Landing files are written by the connector's own converter and Parquet sink (every column as a
deployment lands it, the payload text and the full ``source`` block included), from documents with
numbers, a decimal, a date, an array and a sub-document.

1. Full build: ``refresh_changelog`` + ``refresh_current_state`` from about 1M landing records (a
   snapshot of half of them, then updates with full documents, inserts and deletes, laid out as the
   connector writes them: one snapshot file, then slices of disjoint position windows), against a plain
   Delta write of the same landing rows (read the Parquet files, write one Delta table), reported; the
   goal (issue 39) is against the hand-written build below: <= 1.25x.
   Medians of 3 interleaved rounds, after an untimed round on 10k records, so the baseline (timed
   first) does not pay the session's warm-up alone. The floor row times writing the two finished
   tables again (a Delta read and write of each, the changelog partitioned as it is): the least any
   full build writes, before it derives, deduplicates, folds or types anything. The hand-written row
   times the least build of the same two tables a user would write in Spark SQL: the changelog as
   the landing columns with the key and a date partition, current_state as each key's latest event
   (deletes dropped) typed by ``from_json`` with the schema given and the document as a VARIANT; no
   idempotence, no inference, no metadata columns, no checks.
2. Incremental refresh of 10k changes into current_state tables of 100k and of 1M rows, against a
   hand-written Delta MERGE of the same 10k rows (already typed) into a copy of the table. Goal <= 1.2x,
   and the refresh time flat as the table grows. Medians of 3 interleaved rounds, each with its own
   10k changes (both tables gain the same history; the first round alone pays Spark's warm-up).

3. Many collections, few changes: a refresh cycle (``refresh_collections``, several collections at once)
   over 20 and 100 collections that got one change each, against one collection's refresh of as many
   changes (goal <= 3x), and against the hand-written refresh of the same collections' changes (each
   collection's new landing rows appended to a changelog and each key's latest event, typed by ``from_json``,
   MERGEd into current_state, as many collections at once; with the same refresh of one collection's
   changes it is the goal's floor: what per-table Delta MERGEs cost whatever a refresh derives), and the
   Spark jobs each collection's refresh started against that one refresh's
   (current_state's share of them, and how far the collections' refreshes overlapped), and the Delta commits
   each table's refresh made (goal: one, its data with the refresh's state); then the same
   cycle with nothing new: seconds, and Spark jobs started (goal: none). At CI size only 3 collections: the
   first builds of many collections' tables take minutes of the CI stage for rows that mean nothing at that
   size (tests/tables/test_cycle.py proves that a quiet cycle starts no Spark job).

``--only build|refresh|cycle`` (repeatable) measures only those sections.
``MONGOCDC_BENCH_SMALL=1``: 5k records, tables of 2k and 5k rows, 200 changes, 3 collections x 1 change, one
round of each and no warm-up round.
"""

from __future__ import annotations

import datetime
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import bson
from bson import Decimal128, Timestamp
from bson.codec_options import CodecOptions
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from benchmarks import harness
from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.raw import RawDocuments
from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position
from mongocdc_core.sinks.parquet import ParquetSink
from mongocdc_core.tables import (
    CollectionRefresh,
    CollectionTables,
    refresh_changelog,
    refresh_collections,
    refresh_current_state,
)
from mongocdc_core.tables.changelog import LANDING_SPARK_SCHEMA, PARTITION_COLUMN, latest_version
from mongocdc_core.tables.collection import concurrently
from mongocdc_core.tables.current_state import sized_shuffles
from mongocdc_core.tables.session import spark_session

NAMESPACE = "bench.items"
DB, COLL = NAMESPACE.split(".")
FILES = 8
CYCLE_KEYS = 200  # documents of each collection in the many-collections rows
ROUNDS = 3
WARM_UP = 10_000  # landing records of the untimed round before the timed ones
CHUNK = 2048  # records per batch handed to the Parquet sink (the connector's max.batch.size)
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
SNAPSHOT_POSITION = Position(1_700_000_000, 1)
NAME = "tables"
#: The benchmark's groups of rows (``--only``): the full build, the incremental refreshes, the cycles.
PARTS = ("build", "refresh", "cycle")
BASELINE = "plain Delta in the same Spark session: a Delta write of the same landing rows, a hand-written MERGE of the same changes"


def _document(key: int, version: int) -> dict[str, Any]:
    """A realistic document: numbers, a decimal, a date, an array, a sub-document."""
    return {
        "_id": key, "name": f"item-{key}", "qty": version, "price": Decimal128(f"{key % 1000}.{version % 100:02d}"),
        "when": EPOCH + datetime.timedelta(seconds=1_700_000_000 + key), "tags": ["a", "b", "c"],
        "address": {"city": "Berlin", "zip": f"{key % 100_000:05d}"}, "ok": True,
    }  # fmt: skip


def _converter(db: str = DB) -> EventConverter:
    return EventConverter(EventOptions(topic_prefix=db, rs="rs0"))


def _chunks(numbers: range) -> Iterator[range]:
    """``numbers`` in runs of ``CHUNK``, as the connector batches records for its sinks."""
    return (numbers[i : i + CHUNK] for i in range(0, len(numbers), CHUNK))


def _land(path: Path, records: Iterable[Sequence[Record]]) -> str:
    """The landing file ``path`` written by the connector's Parquet sink from ``records`` (batches)."""
    sink = ParquetSink.to_file(path)
    for batch in records:
        sink.write(batch)
    sink.close()
    return str(path)


def _snapshot(root: Path, keys: int, namespace: str = NAMESPACE) -> str:
    """A full snapshot of ``keys`` documents, converted from raw BSON chunks as the copier delivers them,
    in the one file the snapshot asset writes."""
    db, coll = namespace.split(".")
    converter = _converter(db)
    options: CodecOptions[dict[str, Any]] = CodecOptions(tz_aware=True)
    chunks = (
        converter.convert_reads(RawDocuments(b"".join(bson.encode(_document(k, 0)) for k in ids), options),
                                ["true"] * len(ids), db, coll, SNAPSHOT_POSITION)
        for ids in _chunks(range(keys))
    )  # fmt: skip
    return _land(root / "snapshot" / namespace / "snapshot.parquet", chunks)


def _change(n: int, keys: int, first_second: int, fresh: int, namespace: str = NAMESPACE
            ) -> tuple[dict[str, Any], Position]:  # fmt: skip
    """Change ``n`` of a run: an update (80%) with its full document, an insert of a new key (10%, from
    ``keys + fresh`` on) or a delete (10%); ``fresh`` also moves the updated and deleted keys, so each
    run changes other documents."""
    db, coll = namespace.split(".")
    kind = n % 10
    key = keys + fresh + n if kind == 8 else (n * 7919 + fresh) % keys
    ts = Timestamp(first_second + n // 1000, n % 1000 + 1)
    event: dict[str, Any] = {
        "_id": {"_data": f"82{ts.time:08X}{ts.inc:08X}2B022C0100296E5A1004"}, "clusterTime": ts,
        "wallTime": EPOCH + datetime.timedelta(seconds=ts.time), "ns": {"db": db, "coll": coll},
        "documentKey": {"_id": key},
    }  # fmt: skip
    if kind == 8:
        event |= {"operationType": "insert", "fullDocument": _document(key, n + 1)}
    elif kind == 9:
        event |= {"operationType": "delete"}
    else:
        event |= {
            "operationType": "update", "fullDocument": _document(key, n + 1),
            "updateDescription": {"updatedFields": {"qty": n + 1}, "removedFields": [], "truncatedArrays": []},
        }  # fmt: skip
    return event, Position(ts.time, ts.inc)


def _changes(path: Path, numbers: range, keys: int, first_second: int, fresh: int = 0,
             namespace: str = NAMESPACE) -> str:  # fmt: skip
    """Changes ``numbers`` (see :func:`_change`) in position order, in one slice file."""
    converter = _converter(namespace.split(".")[0])

    def batches() -> Iterator[list[Record]]:
        for ids in _chunks(numbers):
            batch: list[Record] = []
            for n in ids:
                batch += converter.convert_change(*_change(n, keys, first_second, fresh, namespace))
            yield batch

    return _land(path, batches())


def _landing_zone(root: Path, records: int) -> list[str]:
    """``records`` landing records as the connector writes them (its converter and Parquet sink) and lays
    them out: a snapshot of half of them in one file named as the snapshot asset names it, then the
    changes in slices of disjoint position windows."""
    keys = records // 2
    count = records - keys
    step = math.ceil(count / (FILES - 1))
    slices = root / "stream_slice" / NAMESPACE
    return [_snapshot(root, keys)] + [
        _changes(slices / f"slice-{i:02d}.parquet", range(lo, min(lo + step, count)), keys, 1_700_000_100)
        for i, lo in enumerate(range(0, count, step))
    ]


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _hand_changelog(spark: SparkSession, files: list[str]) -> DataFrame:
    """The changelog rows a user would write by hand: the landing columns with the key and a date partition."""
    landing = spark.read.schema(LANDING_SPARK_SCHEMA).parquet(*files).where(F.col("op").isin("c", "u", "d", "r"))
    return landing.select(
        F.get_json_object("key", "$.id").alias("__key"), "op", "position", "ts_ms", "before", "after", "updated_fields",
        "removed_fields", "truncated_arrays", "snapshot", "source", F.to_date(F.timestamp_seconds("pos_seconds")).alias("day"),
    )


def _hand_state(events: DataFrame, schema: T.StructType) -> DataFrame:
    """Each key's latest event of ``events``, typed by ``from_json`` with the schema given and the document as a
    VARIANT (``_gone`` marks deletes), as a user would write it by hand."""
    latest = Window.partitionBy("__key").orderBy(F.col("position").desc())
    top = events.select("__key", "op", "position", "after").withColumn("rank", F.row_number().over(latest))
    return top.where(F.col("rank") == 1).select(
        "__key", "position", (F.col("op") == "d").alias("_gone"), F.from_json("after", schema).alias("d"),
        F.parse_json("after").alias("__doc"),
    ).select("__key", "position", "_gone", "d.*", "__doc")


def _hand_build(spark: SparkSession, files: list[str], root: Path, schema: T.StructType) -> None:
    """The two tables as a user would build them by hand in Spark SQL, knowing the documents' ``schema``."""
    _hand_changelog(spark, files).write.format("delta").partitionBy("day").save(str(root / "hand-changelog"))
    state = _hand_state(spark.read.format("delta").load(str(root / "hand-changelog")), schema)
    state.where(~F.col("_gone")).drop("_gone").write.format("delta").save(str(root / "hand-current"))


def _hand_refresh(spark: SparkSession, root: Path, file: str, schema: T.StructType) -> None:
    """A hand-written refresh of the two tables :func:`_hand_build` built under ``root`` from one new landing
    file: its rows appended to the changelog, each key's latest event MERGEd into current_state."""
    events = _hand_changelog(spark, [file])
    events.write.format("delta").mode("append").partitionBy("day").save(str(root / "hand-changelog"))
    _hand_merge(spark, str(root / "hand-current"), _hand_state(events, schema))


def _build(spark: SparkSession, files: list[str], root: Path, schema: T.StructType
           ) -> tuple[float, float, float, float, float]:  # fmt: skip
    """Seconds of the plain Delta write of ``files``, of the changelog refresh and of the current_state
    build from them, of writing the two finished tables again and of the hand-written build (tables
    under ``root``, removed after)."""
    baseline = _timed(lambda: spark.read.schema(LANDING_SPARK_SCHEMA).parquet(*files)
                      .write.format("delta").save(str(root / "plain")))
    tables = CollectionTables.under(str(root / "tables"), NAMESPACE)
    log = _timed(lambda: refresh_changelog(spark, tables, files))
    state = _timed(lambda: refresh_current_state(spark, tables))

    def copies() -> None:
        changelog = spark.read.format("delta").load(tables.changelog)
        changelog.write.format("delta").partitionBy(PARTITION_COLUMN).save(str(root / "changelog-copy"))
        spark.read.format("delta").load(tables.current_state).write.format("delta").save(str(root / "state-copy"))

    floor = _timed(copies)
    with sized_shuffles(spark, sum(Path(f).stat().st_size for f in files)):  # the partitions the build uses
        hand = _timed(lambda: _hand_build(spark, files, root, schema))
    shutil.rmtree(root, ignore_errors=True)
    return baseline, log, state, floor, hand


def _documents_schema(spark: SparkSession, files: list[str]) -> T.StructType:
    """The schema a user would give ``from_json``: Spark's inference over a sample of the documents."""
    sample = spark.read.schema(LANDING_SPARK_SCHEMA).parquet(*files).where(F.col("after").isNotNull()).limit(1000)
    return spark.read.json(sample.select("after").rdd.map(lambda row: row[0])).schema


def full_build(spark: SparkSession, root: Path, records: int, rounds_count: int, warm_up_records: int = WARM_UP,
               ) -> list[harness.Row]:  # fmt: skip
    """The full build against the plain write, each table's share of it and the floor (no goal): medians
    of ``rounds_count`` interleaved rounds over the same landing files, after an untimed round on
    ``warm_up_records`` records (the baseline, timed first, would pay the session's warm-up alone; none: no such round)."""
    if warm_up_records:
        warm_up = _landing_zone(root / "warm-up", warm_up_records)
        _build(spark, warm_up, root / "warm-up" / "out", _documents_schema(spark, warm_up))
    files = _landing_zone(root / "landing", records)
    schema = _documents_schema(spark, files)
    rounds = [_build(spark, files, root / f"build-{i}", schema) for i in range(rounds_count)]
    baseline, log, state, floor, hand = (statistics.median(r[i] for r in rounds) for i in range(5))
    build = statistics.median(r[1] + r[2] for r in rounds)
    ratio = statistics.median((r[1] + r[2]) / r[0] for r in rounds)
    plain = f"a plain Delta write of the same landing rows (medians of {rounds_count} rounds)"
    return [
        harness.Row(NAME, f"full build (changelog + current_state) from {records:,} landing records", plain,
                    build, baseline, "s", ratio),
        harness.Row(NAME, "full build: the changelog refresh alone", plain, log, baseline, "s",
                    statistics.median(r[1] / r[0] for r in rounds)),
        harness.Row(NAME, "full build: the current_state build alone", plain, state, baseline, "s",
                    statistics.median(r[2] / r[0] for r in rounds)),
        harness.Row(NAME, "floor: writing the two finished tables again (a Delta copy of each)", plain, floor,
                    baseline, "s", statistics.median(r[3] / r[0] for r in rounds)),
        harness.Row(NAME, "hand-written build of the two tables (schema given; no idempotence, inference, "
                    "metadata or checks)", plain, hand, baseline, "s", statistics.median(r[4] / r[0] for r in rounds)),
        harness.Row(NAME, "full build against the hand-written build of the same landing rows",
                    f"the hand-written build (medians of {rounds_count} rounds)", build, hand, "s",
                    statistics.median((r[1] + r[2]) / r[4] for r in rounds), 1.25, "<="),
    ]  # fmt: skip


def _hand_merge(spark: SparkSession, location: str, rows: DataFrame) -> None:
    """The MERGE a user would write for rows that are already typed (``_gone`` marks deletes)."""
    assignments: dict[str, str | Column] = {f"`{c}`": F.col(f"s.`{c}`") for c in rows.columns if c != "_gone"}
    (DeltaTable.forPath(spark, location).alias("t").merge(rows.alias("s"), "t.__key = s.__key")
     .whenMatchedDelete(condition="s._gone")
     .whenMatchedUpdate(set=assignments)
     .whenNotMatchedInsert(condition="NOT s._gone", values=assignments)
     .execute())  # fmt: skip


def incremental(spark: SparkSession, root: Path, size: int, changes_count: int, rounds_count: int,
                ) -> tuple[float, list[harness.Row]]:
    home = root / f"inc-{size}"
    tables = CollectionTables.under(str(home / "tables"), NAMESPACE)
    files = [_snapshot(home, size)]
    refresh_changelog(spark, tables, files)
    refresh_current_state(spark, tables)
    copy = str(home / "copy")
    spark.sql(f"CREATE TABLE delta.`{copy}` SHALLOW CLONE delta.`{tables.current_state}`")
    logs, states, merges = [], [], []
    for round_ in range(rounds_count):
        version = latest_version(spark, tables.current_state)
        files.append(_changes(home / f"changes-{round_}.parquet", range(changes_count), size,
                              1_700_001_000 + 100_000 * round_, changes_count * round_))  # fmt: skip
        logs.append(_timed(partial(refresh_changelog, spark, tables, list(files))))
        states.append(_timed(partial(refresh_current_state, spark, tables)))

        # the same rows, typed, as a user's hand-written MERGE would get them
        feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version + 1)
                .load(tables.current_state).where(F.col("_change_type").isin("update_postimage", "insert", "delete")))  # fmt: skip
        rows = feed.select(*[c for c in feed.columns if not c.startswith("_c")],
                           (F.col("_change_type") == "delete").alias("_gone")).localCheckpoint()  # fmt: skip
        rows.count()
        merges.append(_timed(partial(_hand_merge, spark, copy, rows)))
    log, state, merge = statistics.median(logs), statistics.median(states), statistics.median(merges)
    what = f"{changes_count:,} changes into {size:,} rows"
    merge_line = f"a hand-written Delta MERGE of the same rows into a copy of the table (medians of {rounds_count} rounds)"
    return state, [
        harness.Row(NAME, f"current_state refresh, {what}", merge_line, state, merge, "s", state / merge, 1.2, "<="),
        harness.Row(NAME, f"changelog + current_state refresh, {what}", merge_line, log + state, merge, "s",
                    (log + state) / merge),
        harness.Row(NAME, f"current_state refresh, {what}, first round only", "the hand-written MERGE's first round",
                    states[0], merges[0], "s", states[0] / merges[0]),
    ]


def _jobs_started(spark: SparkSession) -> int:
    """Spark jobs the SparkContext has started so far (its scheduler's next job id)."""
    return int(spark._jsc.sc().dagScheduler().nextJobId())  # type: ignore[union-attr]


def _versions(spark: SparkSession, home: Path, namespaces: Sequence[str]) -> int:
    """The latest Delta versions of the collections' tables under ``home``, summed (commits made since: their
    difference)."""
    tables = [CollectionTables.under(str(home / "tables"), ns) for ns in namespaces]
    return sum(latest_version(spark, t.changelog) + latest_version(spark, t.current_state) for t in tables)


def many_collections(spark: SparkSession, root: Path, count: int) -> list[harness.Row]:
    """A refresh cycle (``refresh_collections``) over ``count`` collections of ``CYCLE_KEYS`` documents
    that got one change each, against one such collection's refresh of ``count`` changes, with what each
    collection's refresh cost (its Spark jobs, current_state's share of them, how far the collections
    overlapped); then a cycle over the same collections with nothing new (seconds, and Spark jobs
    started: goal none)."""
    home = root / f"cycle-{count}"
    one = "bench.one"
    namespaces = [f"bench.c{i:03d}" for i in range(count)]
    files = {ns: [_snapshot(home, CYCLE_KEYS, ns)] for ns in [one, *namespaces]}

    def cycle(names: list[str]) -> list[CollectionRefresh]:
        work = [(CollectionTables.under(str(home / "tables"), ns), files[ns]) for ns in names]
        done = list(refresh_collections(spark, work))
        for refreshed in done:
            if refreshed.error is not None:
                raise refreshed.error
        return done

    built = _timed(lambda: cycle(namespaces))  # the first builds, of the collections the quiet cycle reads
    cycle([one])
    baseline = f"one collection's refresh of {count} changes (changelog + current_state)"
    files[one].append(_changes(home / "one.parquet", range(count), CYCLE_KEYS, 1_700_002_000, namespace=one))
    started = _jobs_started(spark)
    single = _timed(lambda: cycle([one]))
    single_jobs = _jobs_started(spark) - started
    for ns in namespaces:
        files[ns].append(_changes(home / f"{ns}.parquet", range(1), CYCLE_KEYS, 1_700_002_000, namespace=ns))
    started = _jobs_started(spark)
    committed = _versions(spark, home, namespaces)
    done: list[CollectionRefresh] = []
    many = _timed(lambda: done.extend(cycle(namespaces)))
    many_jobs = _jobs_started(spark) - started
    commits = (_versions(spark, home, namespaces) - committed) / (2 * count)
    state_jobs = sum(r.current_state.work.jobs for r in done if r.current_state is not None)
    busy = sum(r.changelog.work.seconds + r.current_state.work.seconds
               for r in done if r.changelog is not None and r.current_state is not None)  # fmt: skip
    started = _jobs_started(spark)
    quiet = _timed(lambda: cycle(namespaces))
    jobs = _jobs_started(spark) - started
    hand_single, hand_many = _hand_cycles(spark, home, files, one, namespaces)
    shutil.rmtree(home, ignore_errors=True)
    return [
        harness.Row(NAME, f"cycle over {count} collections x 1 change against 1 collection x {count} changes",
                    baseline, many, single, "s", many / single, 3.0, "<="),
        harness.Row(NAME, f"hand-written: {count} tables' MERGEs x 1 change against 1 table's MERGE of {count} changes",
                    f"the hand-written refresh of one collection's {count} changes (append + MERGE)", hand_many,
                    hand_single, "s", hand_many / hand_single),
        harness.Row(NAME, f"cycle over {count} collections x 1 change against the hand-written cycle of the same changes",
                    f"the hand-written refreshes of the {count} collections (append + MERGE each, as many at once)",
                    many, hand_many, "s", many / hand_many),
        harness.Row(NAME, f"Spark jobs per collection in a cycle over {count} collections x 1 change",
                    f"the Spark jobs of one collection's refresh of {count} changes", many_jobs / count,
                    single_jobs, "jobs", many_jobs / count / single_jobs),
        harness.Row(NAME, f"current_state's Spark jobs per collection in a cycle over {count} collections x 1 change",
                    "all the Spark jobs per collection (changelog + current_state)", state_jobs / count,
                    many_jobs / count, "jobs", state_jobs / many_jobs),
        harness.Row(NAME, f"Delta commits per table in a cycle over {count} collections x 1 change",
                    "one commit (its data, with the refresh's state)", commits, 1, "commits", commits, 1.0, "<="),
        harness.Row(NAME, f"overlap in a cycle over {count} collections x 1 change: their refreshes' seconds "
                    "summed against the cycle's", "the cycle's seconds", busy, many, "s", busy / many),
        harness.Row(NAME, f"nothing new: a cycle over {count} collections", baseline, quiet, single, "s",
                    quiet / single),
        harness.Row(NAME, f"nothing new: a cycle over {count} collections against the cycle that built them",
                    "the first cycle (building every collection's two tables)", quiet, built, "s", quiet / built),
        harness.Row(NAME, f"nothing new: Spark jobs per collection in a cycle over {count} collections",
                    f"{count} collections", jobs, count, "jobs", jobs / count, 0.0, "<="),
    ]  # fmt: skip


def _hand_cycles(spark: SparkSession, home: Path, files: dict[str, list[str]], one: str, namespaces: list[str]
                 ) -> tuple[float, float]:  # fmt: skip
    """Seconds of the hand-written refresh (:func:`_hand_refresh`) of ``one``'s last landing file, and of the
    ``namespaces``' last files, as many at once as a cycle refreshes (:func:`concurrently`), each into tables
    built by hand from the collection's earlier files (untimed), then checked to hold what the cycle's tables
    hold (keys and values). The cycle's floor: whatever a refresh derives, it ends in one Delta append and one
    MERGE per collection."""
    schema = _documents_schema(spark, files[one][:1])
    for ns in [one, *namespaces]:
        _hand_build(spark, files[ns][:-1], home / "hand" / ns, schema)

    def refresh(session: SparkSession, ns: str) -> None:
        _hand_refresh(session, home / "hand" / ns, files[ns][-1], schema)

    def every(names: list[str]) -> None:
        for ns, outcome in concurrently(spark, names, refresh):
            if isinstance(outcome, Exception):
                raise RuntimeError(f"the hand-written refresh of {ns} failed") from outcome

    timed = _timed(lambda: every([one])), _timed(lambda: every(namespaces))
    for ns in [one, *namespaces]:  # the same work as the cycle's: its tables end with the same documents
        ours = spark.read.format("delta").load(CollectionTables.under(str(home / "tables"), ns).current_state)
        hand = spark.read.format("delta").load(str(home / "hand" / ns / "hand-current"))
        rows = ours.select("__key", "qty"), hand.select("__key", "qty")
        if rows[0].count() != rows[1].count() or not rows[0].exceptAll(rows[1]).isEmpty():
            raise RuntimeError(f"the hand-written tables of {ns} do not hold the cycle's documents")
    return timed


def run(small: bool, parts: Sequence[str] = PARTS) -> list[harness.Row]:
    """The rows of ``parts`` (``--only build``, ``refresh`` or ``cycle``: sections 1, 2 and 3 above)."""
    # at CI size the rows only prove the benchmark runs: one round of each, no warm-up round
    records = 5_000 if small else 1_000_000
    sizes = (2_000, 5_000) if small else (100_000, 1_000_000)
    changes = 200 if small else 10_000
    rounds_count = 1 if small else ROUNDS
    spark = spark_session()
    root = Path(tempfile.mkdtemp(prefix="bench-tables-"))
    rows: list[harness.Row] = []
    times = []
    try:
        if "build" in parts:
            rows += full_build(spark, root, records, rounds_count, 0 if small else WARM_UP)
        if "refresh" in parts:
            for size in sizes:
                elapsed, got = incremental(spark, root, size, changes, rounds_count)
                times.append(elapsed)
                rows += got
        if "cycle" in parts:
            for count in (3,) if small else (20, 100):
                rows += many_collections(spark, root, count)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    if times:
        rows.append(harness.Row(NAME, f"current_state refresh time, {sizes[-1]:,} rows against {sizes[0]:,} (flat: about 1)",
                                f"the same refresh into {sizes[0]:,} rows", times[-1], times[0], "s", times[-1] / times[0]))
    return rows


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run, PARTS)
