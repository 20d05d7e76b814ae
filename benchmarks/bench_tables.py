"""The lakehouse tables against plain Delta baselines, in one Spark session, printed as ratios.

1. Full build: ``refresh_changelog`` + ``refresh_current_state`` from about 1M landing records (a
   snapshot of half of them, then updates with full documents, inserts and deletes, laid out as the
   connector writes them: one snapshot file, then slices of disjoint position windows), against a plain
   Delta write of the same landing rows (read the Parquet files, write one Delta table). Goal <= 2x.
   Medians of 3 interleaved rounds, after an untimed round on 10k records, so the baseline (timed
   first) does not pay the session's warm-up alone.
2. Incremental refresh of 10k changes into current_state tables of 100k and of 1M rows, against a
   hand-written Delta MERGE of the same 10k rows (already typed) into a copy of the table. Goal <= 1.5x,
   and the refresh time flat as the table grows. Medians of 3 interleaved rounds, each with its own
   10k changes (both tables gain the same history; the first round alone pays Spark's warm-up).

``MONGOCDC_BENCH_SMALL=1``: 20k records, tables of 5k and 20k rows, 500 changes.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks import harness
from mongocdc_core.tables import CollectionTables, refresh_changelog, refresh_current_state
from mongocdc_core.tables.changelog import LANDING_SPARK_SCHEMA, latest_version
from mongocdc_core.tables.session import spark_session

NAMESPACE = "bench.items"
FILES = 8
ROUNDS = 3
WARM_UP = 10_000  # landing records of the untimed round before the timed ones
NAME = "tables"
BASELINE = "plain Delta in the same Spark session: a Delta write of the same landing rows, a hand-written MERGE of the same changes"


def _document(key: Column, version: Column) -> Column:
    """A realistic document as the connector's strict Extended JSON: numbers, a decimal, a date, an array,
    a sub-document."""
    return F.format_string(
        '{"_id": %d,"name": "item-%d","qty": %d,"price": {"$numberDecimal": "%d.%02d"},'
        '"when": {"$date": %d},"tags": ["a", "b", "c"],"address": {"city": "Berlin","zip": "%05d"},"ok": true}',
        key, key, version, key % 1000, version % 100, F.lit(1_700_000_000_000) + key * 1000, key % 100_000,
    )


def _landing(spark: SparkSession, ids: DataFrame, op: Column, second: Column, increment: Column,
             version: Column) -> DataFrame:
    """Landing-zone rows (``LANDING_SCHEMA``) built in Spark: ``ids`` has ``key`` and ``n``."""
    second = second.cast("bigint")  # milliseconds of it overflow an int (Spark's ANSI mode refuses)
    position = F.format_string("%013d.%010d.%06d", second, increment, F.lit(0))
    after = F.when(op != "d", _document(F.col("key"), version))
    columns = {
        "topic": F.lit("bench.bench.items"),
        "collection": F.lit(NAMESPACE),
        "key": F.format_string('{"id":"%d"}', F.col("key")),
        "op": op,
        "position": position,
        "pos_seconds": second,
        "pos_increment": increment,
        "pos_ordinal": F.lit(0),
        "ts_ms": second * 1000,
        "after": after,
        "updated_fields": F.when(op == "u", F.format_string('{"qty": %d}', version)),
        "snapshot": F.when(op == "r", F.lit("true")).otherwise(F.lit("false")),
        "source": F.format_string('{"ts_ms": %d,"ord": %d}', second * 1000, increment),
    }
    return ids.select(*[
        (columns[f.name] if f.name in columns else F.lit(None)).cast(f.dataType).alias(f.name)
        for f in LANDING_SPARK_SCHEMA.fields
    ])


def _snapshot(spark: SparkSession, keys: int) -> DataFrame:
    ids = spark.range(keys).select(F.col("id").alias("key"), F.col("id").alias("n"))
    return _landing(spark, ids, F.lit("r"), F.lit(1_700_000_000), F.lit(1), F.lit(0))


def _changes(spark: SparkSession, count: int, keys: int, first_second: int, fresh: int = 0) -> DataFrame:
    """Updates (80%), inserts of new keys (10%, from ``keys + fresh`` on) and deletes (10%), in position
    order; ``fresh`` also moves the updated and deleted keys, so each round changes other documents."""
    n = F.col("id")
    kind = n % 10
    key = F.when(kind == 8, F.lit(keys + fresh) + n).otherwise((n * 7919 + fresh) % keys)
    ids = spark.range(count).select(key.alias("key"), n.alias("n"))
    op = F.when(F.col("n") % 10 == 8, "c").when(F.col("n") % 10 == 9, "d").otherwise("u")
    second = F.lit(first_second) + (F.col("n") / 1000).cast("bigint")
    return _landing(spark, ids, op, second, F.col("n") % 1000 + 1, F.col("n") + 1)


def _write(frame: DataFrame, path: Path, files: int) -> list[str]:
    frame.repartition(files).write.mode("overwrite").parquet(str(path))
    return sorted(str(p) for p in path.glob("*.parquet"))


def _landing_zone(spark: SparkSession, root: Path, records: int) -> list[str]:
    """``records`` landing records as the connector lays them out: a snapshot of half of them in one
    file named as the snapshot asset names it, then the changes in slices of disjoint position windows."""
    keys = records // 2
    staged = _write(_snapshot(spark, keys), root / "staged", 1)
    snapshot = root / "snapshot" / NAMESPACE / "snapshot.parquet"
    snapshot.parent.mkdir(parents=True)
    Path(staged[0]).rename(snapshot)
    slices = root / "stream_slice" / NAMESPACE
    changes = _changes(spark, records - keys, keys, 1_700_000_100)
    changes.repartitionByRange(FILES - 1, "position").sortWithinPartitions("position").write.parquet(str(slices))
    return [str(snapshot), *sorted(str(p) for p in slices.glob("*.parquet"))]


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _build(spark: SparkSession, files: list[str], root: Path) -> tuple[float, float, float]:
    """Seconds of the plain Delta write of ``files``, of the changelog refresh and of the current_state
    build from them (tables under ``root``, removed after)."""
    baseline = _timed(lambda: spark.read.schema(LANDING_SPARK_SCHEMA).parquet(*files)
                      .write.format("delta").save(str(root / "plain")))
    tables = CollectionTables.under(str(root / "tables"), NAMESPACE)
    log = _timed(lambda: refresh_changelog(spark, tables, files))
    state = _timed(lambda: refresh_current_state(spark, tables))
    shutil.rmtree(root, ignore_errors=True)
    return baseline, log, state


def full_build(spark: SparkSession, root: Path, records: int) -> list[harness.Row]:
    """The full build against the plain write, and each table's share of it (no goal): medians of
    ``ROUNDS`` interleaved rounds over the same landing files, after an untimed round on a few records
    (the baseline, timed first, would pay the session's warm-up alone)."""
    _build(spark, _landing_zone(spark, root / "warm-up", WARM_UP), root / "warm-up" / "out")
    files = _landing_zone(spark, root / "landing", records)
    rounds = [_build(spark, files, root / f"build-{i}") for i in range(ROUNDS)]
    baseline, log, state = (statistics.median(r[i] for r in rounds) for i in range(3))
    build = statistics.median(r[1] + r[2] for r in rounds)
    ratio = statistics.median((r[1] + r[2]) / r[0] for r in rounds)
    plain = f"a plain Delta write of the same landing rows (medians of {ROUNDS} rounds)"
    return [
        harness.Row(NAME, f"full build (changelog + current_state) from {records:,} landing records", plain,
                    build, baseline, "s", ratio, 2.0, "<="),
        harness.Row(NAME, "full build: the changelog refresh alone", plain, log, baseline, "s",
                    statistics.median(r[1] / r[0] for r in rounds)),
        harness.Row(NAME, "full build: the current_state build alone", plain, state, baseline, "s",
                    statistics.median(r[2] / r[0] for r in rounds)),
    ]  # fmt: skip


def _hand_merge(spark: SparkSession, location: str, rows: DataFrame) -> None:
    """The MERGE a user would write for rows that are already typed (``_gone`` marks deletes)."""
    assignments: dict[str, str | Column] = {f"`{c}`": F.col(f"s.`{c}`") for c in rows.columns if c != "_gone"}
    (DeltaTable.forPath(spark, location).alias("t").merge(rows.alias("s"), "t.__key = s.__key")
     .whenMatchedDelete(condition="s._gone")
     .whenMatchedUpdate(set=assignments)
     .whenNotMatchedInsert(condition="NOT s._gone", values=assignments)
     .execute())  # fmt: skip


def incremental(spark: SparkSession, root: Path, size: int, changes_count: int) -> tuple[float, list[harness.Row]]:
    home = root / f"inc-{size}"
    tables = CollectionTables.under(str(home / "tables"), NAMESPACE)
    files = _write(_snapshot(spark, size), home / "snapshot", FILES)
    refresh_changelog(spark, tables, files)
    refresh_current_state(spark, tables)
    copy = str(home / "copy")
    spark.sql(f"CREATE TABLE delta.`{copy}` SHALLOW CLONE delta.`{tables.current_state}`")
    logs, states, merges = [], [], []
    for round_ in range(ROUNDS):
        version = latest_version(spark, tables.current_state)
        files += _write(_changes(spark, changes_count, size, 1_700_001_000 + 100_000 * round_, changes_count * round_),
                        home / f"changes-{round_}", 1)  # fmt: skip
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
    merge_line = f"a hand-written Delta MERGE of the same rows into a copy of the table (medians of {ROUNDS} rounds)"
    return state, [
        harness.Row(NAME, f"current_state refresh, {what}", merge_line, state, merge, "s", state / merge, 1.5, "<="),
        harness.Row(NAME, f"changelog + current_state refresh, {what}", merge_line, log + state, merge, "s",
                    (log + state) / merge),
        harness.Row(NAME, f"current_state refresh, {what}, first round only", "the hand-written MERGE's first round",
                    states[0], merges[0], "s", states[0] / merges[0]),
    ]


def run(small: bool) -> list[harness.Row]:
    records = 20_000 if small else 1_000_000
    sizes = (5_000, 20_000) if small else (100_000, 1_000_000)
    changes = 500 if small else 10_000
    spark = spark_session()
    root = Path(tempfile.mkdtemp(prefix="bench-tables-"))
    try:
        rows = full_build(spark, root, records)
        times = []
        for size in sizes:
            elapsed, got = incremental(spark, root, size, changes)
            times.append(elapsed)
            rows += got
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows.append(harness.Row(NAME, f"current_state refresh time, {sizes[-1]:,} rows against {sizes[0]:,} (flat: about 1)",
                            f"the same refresh into {sizes[0]:,} rows", times[-1], times[0], "s", times[-1] / times[0]))
    return rows


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
