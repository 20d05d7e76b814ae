"""The lakehouse tables against plain Delta baselines, in one Spark session, printed as ratios.

1. Full build: ``refresh_changelog`` + ``refresh_current_state`` from about 1M landing records (a
   snapshot of half of them, then updates with full documents, inserts and deletes), against a plain
   Delta write of the same landing rows (read the Parquet files, write one Delta table). Goal <= 2x.
2. Incremental refresh of 10k changes into current_state tables of 100k and of 1M rows, against a
   hand-written Delta MERGE of the same 10k rows (already typed) into a copy of the table. Goal <= 1.5x,
   and the refresh time flat as the table grows.

``MONGOCDC_BENCH_SMALL=1``: 100k records, tables of 10k and 100k rows, 1k changes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from mongocdc_core.tables import CollectionTables, refresh_changelog, refresh_current_state
from mongocdc_core.tables.changelog import LANDING_SPARK_SCHEMA
from mongocdc_core.tables.session import spark_session

NAMESPACE = "bench.items"
SMALL = bool(os.environ.get("MONGOCDC_BENCH_SMALL"))
RECORDS = 100_000 if SMALL else 1_000_000
SIZES = (10_000, 100_000) if SMALL else (100_000, 1_000_000)
CHANGES = 1_000 if SMALL else 10_000
FILES = 8


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


def _changes(spark: SparkSession, count: int, keys: int, first_second: int) -> DataFrame:
    """Updates (80%), inserts of new keys (10%) and deletes (10%), in position order."""
    n = F.col("id")
    kind = n % 10
    key = F.when(kind == 8, F.lit(keys) + n).otherwise((n * 7919) % keys)
    ids = spark.range(count).select(key.alias("key"), n.alias("n"))
    op = F.when(F.col("n") % 10 == 8, "c").when(F.col("n") % 10 == 9, "d").otherwise("u")
    second = F.lit(first_second) + (F.col("n") / 1000).cast("bigint")
    return _landing(spark, ids, op, second, F.col("n") % 1000 + 1, F.col("n") + 1)


def _write(frame: DataFrame, path: Path, files: int) -> list[str]:
    frame.repartition(files).write.mode("overwrite").parquet(str(path))
    return sorted(str(p) for p in path.glob("*.parquet"))


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def full_build(spark: SparkSession, root: Path) -> None:
    keys = RECORDS // 2
    landing = _snapshot(spark, keys).unionByName(_changes(spark, RECORDS - keys, keys, 1_700_000_100))
    files = _write(landing, root / "landing", FILES)
    baseline = _timed(lambda: spark.read.schema(LANDING_SPARK_SCHEMA).parquet(*files)
                      .write.format("delta").save(str(root / "plain")))
    tables = CollectionTables.under(str(root / "tables"), NAMESPACE)
    log = _timed(lambda: refresh_changelog(spark, tables, files))
    state_result: list[object] = []
    state = _timed(lambda: state_result.append(refresh_current_state(spark, tables)))
    print(f"full build from {RECORDS:,} landing records ({state_result[0].row_count:,} documents):")  # type: ignore[attr-defined]
    print(f"  plain Delta write of the landing rows  {baseline:8.2f} s")
    print(f"  changelog                              {log:8.2f} s")
    print(f"  current_state                          {state:8.2f} s")
    print(f"  ratio build / plain write              {(log + state) / baseline:8.2f}x  (goal <= 2x)")


def incremental(spark: SparkSession, root: Path, size: int) -> float:
    home = root / f"inc-{size}"
    tables = CollectionTables.under(str(home / "tables"), NAMESPACE)
    snap = _write(_snapshot(spark, size), home / "snapshot", FILES)
    refresh_changelog(spark, tables, snap)
    refresh_current_state(spark, tables)
    copy = str(home / "copy")
    spark.sql(f"CREATE TABLE delta.`{copy}` SHALLOW CLONE delta.`{tables.current_state}`")
    version = DeltaTable.forPath(spark, tables.current_state).history(1).select("version").first()[0]  # type: ignore[index]
    changes = _write(_changes(spark, CHANGES, size, 1_700_001_000), home / "changes", 1)
    log = _timed(lambda: refresh_changelog(spark, tables, snap + changes))
    state = _timed(lambda: refresh_current_state(spark, tables))

    # the same rows, typed, as a user's hand-written MERGE would get them
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version + 1)
            .load(tables.current_state).where(F.col("_change_type").isin("update_postimage", "insert", "delete")))
    rows = feed.select(*[c for c in feed.columns if not c.startswith("_c")],
                       (F.col("_change_type") == "delete").alias("_gone")).localCheckpoint()
    rows.count()
    target = DeltaTable.forPath(spark, copy).alias("t")
    assignments: dict[str, str | Column] = {f"`{c}`": F.col(f"s.`{c}`") for c in rows.columns if c != "_gone"}
    merge = _timed(lambda: target.merge(rows.alias("s"), "t.__key = s.__key")
                   .whenMatchedDelete(condition="s._gone")
                   .whenMatchedUpdate(set=assignments)
                   .whenNotMatchedInsert(condition="NOT s._gone", values=assignments)
                   .execute())
    print(f"incremental refresh of {CHANGES:,} changes into {size:,} rows:")
    print(f"  hand-written Delta MERGE               {merge:8.2f} s")
    print(f"  current_state refresh                  {state:8.2f} s   ratio {state / merge:6.2f}x  (goal <= 1.5x)")
    print(f"  changelog + current_state              {log + state:8.2f} s   ratio {(log + state) / merge:6.2f}x")
    return state


def main() -> None:
    spark = spark_session()
    root = Path(tempfile.mkdtemp(prefix="bench-tables-"))
    try:
        full_build(spark, root)
        times = [incremental(spark, root, size) for size in SIZES]
        print(f"refresh time {SIZES[-1]:,} rows / {SIZES[0]:,} rows: {times[-1] / times[0]:6.2f}x  (flat: about 1x)")
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
