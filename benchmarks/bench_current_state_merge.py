"""Merging N change events into current_state, as a ratio to a plain Spark (Delta) write of the same rows.

The changelog holds a snapshot of K keys and N change events on them (updates with full documents,
some deletes); current_state already holds the snapshot. Timed, in one Spark session:
- baseline: a plain Delta append of the N changelog rows to a scratch table;
- merge: ``merge_current_state`` for the N events (per-key winners over the changelog + Delta MERGE).
Printed as seconds and the ratio merge / baseline.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks import harness
from mongocdc_core.tables.changelog import CHANGELOG_COLUMNS, write_rows
from mongocdc_core.tables.current_state import merge_current_state
from mongocdc_core.tables.session import spark_session

NAMESPACE = "bench.orders"


def _rows(spark: SparkSession, count: int, keys: int, first_second: int, snapshot: bool) -> DataFrame:
    """Changelog-shaped rows built in Spark (no Python per row): ``r`` reads, or ``u``/``d`` events."""
    ids = spark.range(count).withColumn("k", F.col("id") % keys)
    op = F.lit("r") if snapshot else F.when(F.col("id") % 50 == 49, "d").otherwise("u")
    seconds = F.lit(first_second) + (F.lit(0) if snapshot else F.col("id") / 100).cast("bigint")
    increment = (F.lit(1) if snapshot else F.col("id") % 100 + 1).cast("bigint")
    after = F.format_string('{"_id": %d, "qty": %d, "name": "item-%d", "price": %d.5}', "k", "id", "k", "id")
    derived = {
        "collection": F.lit(NAMESPACE),
        "_id": F.col("k").cast("string"),
        "op": op,
        "pos_seconds": seconds,
        "pos_increment": increment,
        "pos_ordinal": F.lit(0).cast("bigint"),
        "position": F.format_string("%013d.%010d.%06d", seconds, increment, F.lit(0)),
        "ts_ms": (seconds * 1000).cast("bigint"),
        "key": F.format_string('{"id":"%d"}', "k"),
        "after": F.when(op == "d", F.lit(None)).otherwise(after),
        "landing_file": F.lit("snapshot" if snapshot else "events"),
    }
    return ids.select(
        *[(derived[n] if n in derived else F.lit(None)).cast(t).alias(n) for n, t, _ in CHANGELOG_COLUMNS]
    )


NAME = "current_state merge"
BASELINE = "a plain Delta append of the same changelog rows to a scratch table, same Spark session"


def run(small: bool) -> list[harness.Row]:
    events, keys = (2_000, 500) if small else (1_000_000, 200_000)
    spark = spark_session()
    root = Path(tempfile.mkdtemp(prefix="bench-current-state-"))
    try:
        changelog, state = str(root / "changelog"), str(root / "current_state")
        write_rows(spark, changelog, _rows(spark, keys, keys, 1_700_000_000, snapshot=True), None)
        merge_current_state(spark, changelog, state, collections=[NAMESPACE])
        changes = _rows(spark, events, keys, 1_700_000_100, snapshot=False).localCheckpoint()
        write_rows(spark, changelog, changes, None)

        start = time.perf_counter()
        changes.write.format("delta").mode("append").save(str(root / "baseline"))
        baseline = time.perf_counter() - start

        start = time.perf_counter()
        merge_current_state(spark, changelog, state, changes=changes.select("collection", "_id"))
        merge = time.perf_counter() - start
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    return [harness.Row(NAME, f"merge of {events:,} events on {keys:,} keys vs plain Delta write", BASELINE,
                        merge, baseline, "s", merge / baseline)]


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
