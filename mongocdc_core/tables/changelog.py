"""The ``changelog`` Delta table: one row per change event, partitioned by collection.

Rows come from landing-zone Parquet files (``mongocdc_core.sinks.parquet.LANDING_SCHEMA``) or from
Kafka records flattened into the same columns (``streaming.py``). Every row remembers where it came
from in ``landing_file``; writing a file again replaces exactly the rows of that file (Delta
``replaceWhere``), so re-materialising a snapshot or stream slice never duplicates events.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

#: Spark form of ``LANDING_SCHEMA`` (explicit, so empty files and evolving writers read the same way).
LANDING_SPARK_SCHEMA = T.StructType(
    [
        T.StructField("topic", T.StringType()),
        T.StructField("collection", T.StringType()),
        T.StructField("key", T.StringType()),
        T.StructField("op", T.StringType()),
        T.StructField("position", T.StringType()),
        T.StructField("pos_seconds", T.LongType()),
        T.StructField("pos_increment", T.LongType()),
        T.StructField("pos_ordinal", T.LongType()),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("before", T.StringType()),
        T.StructField("after", T.StringType()),
        T.StructField("updated_fields", T.StringType()),
        T.StructField("removed_fields", T.ArrayType(T.StringType())),
        T.StructField("truncated_arrays", T.StringType()),
        T.StructField("snapshot", T.StringType()),
        T.StructField("source", T.StringType()),
        T.StructField("value", T.StringType()),
    ]
)

#: (column, type, where it comes from in the Debezium envelope) of the changelog table, in order.
CHANGELOG_COLUMNS: tuple[tuple[str, T.DataType, str], ...] = (
    ("collection", T.StringType(), "source.db + '.' + source.collection"),
    ("_id", T.StringType(), "key.id"),
    ("op", T.StringType(), "op"),
    ("position", T.StringType(), "source.ts_ms / source.ord + transaction ordinal"),
    ("pos_seconds", T.LongType(), "source.ts_ms / 1000"),
    ("pos_increment", T.LongType(), "source.ord"),
    ("pos_ordinal", T.LongType(), "transaction ordinal"),
    ("ts_ms", T.LongType(), "ts_ms"),
    ("event_time", T.TimestampType(), "ts_ms"),
    ("key", T.StringType(), "key"),
    ("before", T.StringType(), "before"),
    ("after", T.StringType(), "after"),
    ("updated_fields", T.StringType(), "updateDescription.updatedFields"),
    ("removed_fields", T.ArrayType(T.StringType()), "updateDescription.removedFields"),
    ("truncated_arrays", T.StringType(), "updateDescription.truncatedArrays"),
    ("snapshot", T.StringType(), "source.snapshot"),
    ("source_ts_ms", T.LongType(), "source.ts_ms"),
    ("source_rs", T.StringType(), "source.rs"),
    ("source_lsid", T.StringType(), "source.lsid"),
    ("source_txn_number", T.LongType(), "source.txnNumber"),
    ("source_wall_time", T.LongType(), "source.wallTime"),
    ("transaction_id", T.StringType(), "transaction.id"),
    ("topic", T.StringType(), "(Kafka topic)"),
    ("source", T.StringType(), "source"),
    ("landing_file", T.StringType(), "(landing file or Kafka partition)"),
    ("landing_version", T.StringType(), "(landing file size and modification time)"),
    ("ingested_at", T.TimestampType(), "(time the row was written)"),
)
CHANGELOG_SCHEMA = T.StructType([T.StructField(name, dtype) for name, dtype, _ in CHANGELOG_COLUMNS])


class TableInputError(ValueError):
    """Input the tables cannot read: a missing landing file, or rows without the required fields."""


@dataclass(frozen=True)
class ChangelogWrite:
    """What one changelog write did: rows written per collection and op, and the files replaced.

    ``written`` holds the rows themselves (checkpointed), so a merge can take their keys without
    reading the table again.
    """

    location: str
    landing_files: tuple[str, ...]
    rows: int
    counts: dict[str, dict[str, int]]
    written: DataFrame


def landing_files(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The Parquet files named by ``paths``: local directories expand to the files below them.

    Paths with a URI scheme (``s3a://``, ``abfss://`` …) are taken as files. A local path that does
    not exist is an error rather than an empty input, so a mistyped partition path is noticed.
    """
    files: list[str] = []
    for raw in paths:
        text = os.fspath(raw)
        if "://" in text:
            files.append(text)
            continue
        path = Path(text)
        if path.is_dir():
            files.extend(str(p.resolve()) for p in sorted(path.rglob("*.parquet")) if not p.name.startswith("."))
        elif path.is_file():
            files.append(str(path.resolve()))
        else:
            raise TableInputError(f"landing-zone path does not exist: {text}")
    return files


def file_version(path: str) -> str | None:
    """Size and modification time of a local file (None for URIs): a re-written file gets a new one."""
    if "://" in path:
        return None
    stat = os.stat(path)
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def changed_files(spark: SparkSession, location: str, files: Sequence[str]) -> list[str]:
    """The files whose current version is not in the changelog yet (new, re-written, or URIs)."""
    if not files or not table_exists(spark, location):
        return list(files)
    present = {
        (r["landing_file"], r["landing_version"])
        for r in spark.read.format("delta").load(location)
        .where(F.col("landing_file").isin(list(files)))
        .select("landing_file", "landing_version").distinct().collect()
    }
    return [f for f in files if (f, file_version(f)) not in present or file_version(f) is None]


def _json_field(column: str, path: str) -> Column:
    return F.get_json_object(F.col(column), path)


def to_changelog(landing: DataFrame, landing_file: Column, landing_version: Column | None = None) -> DataFrame:
    """Landing-zone rows -> changelog rows: data events only (no tombstones, heartbeats, BEGIN/END)."""
    data = landing.where(F.col("collection").isNotNull() & F.col("op").isNotNull() & F.col("key").isNotNull())
    derived = {
        "_id": _json_field("key", "$.id"),
        "event_time": F.timestamp_millis(F.col("ts_ms")),
        "source_ts_ms": _json_field("source", "$.ts_ms").cast("bigint"),
        "source_rs": _json_field("source", "$.rs"),
        "source_lsid": _json_field("source", "$.lsid"),
        "source_txn_number": _json_field("source", "$.txnNumber").cast("bigint"),
        "source_wall_time": _json_field("source", "$.wallTime").cast("bigint"),
        "transaction_id": _json_field("value", "$.transaction.id"),
        "landing_file": landing_file,
        "landing_version": landing_version if landing_version is not None else F.lit(None),
        "ingested_at": F.current_timestamp(),
    }
    return data.select(
        *[(derived[name] if name in derived else F.col(name)).cast(dtype).alias(name) for name, dtype, _ in CHANGELOG_COLUMNS]
    )


def read_landing(spark: SparkSession, files: Sequence[str]) -> DataFrame:
    """Changelog rows of the given landing files, each tagged with its file in ``landing_file``."""
    frames = [
        to_changelog(spark.read.schema(LANDING_SPARK_SCHEMA).parquet(f), F.lit(f), F.lit(file_version(f)))
        for f in files
    ]
    if not frames:
        return spark.createDataFrame([], CHANGELOG_SCHEMA)
    return reduce(DataFrame.unionByName, frames)


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def table_exists(spark: SparkSession, location: str) -> bool:
    """Whether a Delta table exists at ``location``."""
    return bool(DeltaTable.isDeltaTable(spark, location))


def write_changelog(
    spark: SparkSession, location: str, paths: Sequence[str | os.PathLike[str]]
) -> ChangelogWrite:
    """Write the landing files' events into the changelog, replacing earlier rows of the same files."""
    files = landing_files(paths)
    if not files:
        raise TableInputError(f"no landing-zone Parquet files under {[os.fspath(p) for p in paths]}")
    rows = read_landing(spark, files).localCheckpoint()
    predicate = "landing_file IN (" + ", ".join(_sql_string(f) for f in files) + ")"
    write_rows(spark, location, rows, predicate)
    counts = _counts(rows)
    return ChangelogWrite(location, tuple(files), sum(sum(c.values()) for c in counts.values()), counts, rows)


def write_rows(spark: SparkSession, location: str, rows: DataFrame, replace_where: str | None) -> None:
    """Append (or, with a predicate, replace) changelog rows."""
    writer = rows.write.format("delta").partitionBy("collection")
    if not table_exists(spark, location):
        # the change data feed lets current_state find the keys of rows added or replaced since it last ran
        writer = writer.mode("append").option("delta.enableChangeDataFeed", "true")
    elif replace_where is not None:
        writer = writer.mode("overwrite").option("replaceWhere", replace_where)
    else:
        writer = writer.mode("append")
    writer.save(location)


def _counts(rows: DataFrame) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for row in rows.groupBy("collection", "op").count().collect():
        counts.setdefault(row["collection"], {})[row["op"]] = int(row["count"])
    return counts


def read_changelog(spark: SparkSession, location: str) -> DataFrame:
    """The changelog table (empty with the right schema when it does not exist yet)."""
    if not table_exists(spark, location):
        return spark.createDataFrame([], CHANGELOG_SCHEMA)
    return spark.read.format("delta").load(location)
