"""The ``current_state`` Delta table: for each key, the document of the highest-position change event.

DESIGN.md section 3: for any key the record with the highest position is the current state, so the
table is right whatever order snapshots and slices are written in. A merge therefore takes every
changelog row of the keys the new rows touch (a semi-join on the changelog partition), and per key

- if the highest-position row carries a full image (``after``, or a delete), that row wins — a
  window function, no Python;
- otherwise (capture modes without full documents) the key's state is the latest full image with
  every later ``updateDescription`` applied in position order (a grouped Arrow function). A key
  whose updates arrived before any full image (a slice materialised before its snapshot) has no
  state yet; it is counted as pending and resolved when the full image lands.

The winners become ``document`` (Extended JSON) plus one typed column per top-level field; a new
field adds a column, and a field seen with two types widens (bigint+double -> double, anything else
-> string holding JSON) and is reported. One Delta MERGE then inserts, updates and deletes rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mongocdc_core.tables import documents
from mongocdc_core.tables.changelog import read_changelog, table_exists

BASE_COLUMNS: tuple[tuple[str, T.DataType], ...] = (
    ("collection", T.StringType()),
    ("_id", T.StringType()),
    ("op", T.StringType()),
    ("position", T.StringType()),
    ("ts_ms", T.LongType()),
    ("document", T.StringType()),
)
_SPARK_TYPES: dict[str, T.DataType] = {
    documents.LONG: T.LongType(),
    documents.DOUBLE: T.DoubleType(),
    documents.BOOLEAN: T.BooleanType(),
    documents.STRING: T.StringType(),
    documents.TIMESTAMP: T.TimestampType(),
}
_KEY = ["collection", "_id"]
_WINNER_SCHEMA = T.StructType(
    [
        T.StructField("collection", T.StringType()),
        T.StructField("_id", T.StringType()),
        T.StructField("op", T.StringType()),
        T.StructField("position", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("after", T.StringType()),
        T.StructField("deleted", T.BooleanType()),
    ]
)
_FOLD_RESULT_SCHEMA = T.StructType([*_WINNER_SCHEMA.fields, T.StructField("pending", T.BooleanType())])
_ROW_SCHEMA = T.StructType(
    [
        *[f for f in _FOLD_RESULT_SCHEMA.fields if f.name not in ("after",)],
        T.StructField("document", T.StringType()),
        T.StructField("plain", T.StringType()),
        T.StructField("types", T.StringType()),
    ]
)
_TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"


@dataclass
class MergeResult:
    """What one current_state merge did, for asset metadata and tests."""

    location: str
    keys_touched: int = 0
    upserted: int = 0
    deleted: int = 0
    pending_keys: int = 0
    new_columns: list[str] = field(default_factory=list)
    widened: dict[str, str] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)


def _position_order() -> list[Column]:
    """Stream order; at one position a snapshot read sorts before a change event."""
    return [
        F.col("pos_seconds"),
        F.col("pos_increment"),
        F.col("pos_ordinal"),
        F.when(F.col("op") == "r", 0).otherwise(1),
    ]


def _position_struct() -> Column:
    return F.struct(*[c.alias(f"p{i}") for i, c in enumerate(_position_order())])


def _full_image() -> Column:
    return (F.col("op") == "d") | F.col("after").isNotNull()


def _fold(table: pa.Table) -> pa.Table:
    """One key's rows from its latest full image on: apply the later update descriptions in order."""
    rows = sorted(
        table.to_pylist(),
        key=lambda r: (r["pos_seconds"], r["pos_increment"], r["pos_ordinal"], 0 if r["op"] == "r" else 1),
    )
    doc: Any = None
    previous: tuple[Any, ...] | None = None
    for row in rows:
        order = (row["pos_seconds"], row["pos_increment"], row["pos_ordinal"], row["op"])
        if order == previous:  # the same event from a second landing file: apply it once
            continue
        previous = order
        if row["op"] == "d":
            doc = None
        elif row["after"] is not None:
            doc = documents.loads(row["after"])
        elif doc is not None:
            documents.apply_update(doc, row["updated_fields"], row["removed_fields"], row["truncated_arrays"])
    last = rows[-1]
    base_is_delete = rows[0]["op"] == "d"
    out = {
        "collection": last["collection"],
        "_id": last["_id"],
        "op": last["op"],
        "position": last["position"],
        "ts_ms": last["ts_ms"],
        "after": documents.dumps(doc) if doc is not None else None,
        "deleted": doc is None and base_is_delete,
        "pending": doc is None and not base_is_delete,
    }
    return pa.Table.from_pylist([out], schema=_arrow_schema(_FOLD_RESULT_SCHEMA))


def _arrow_schema(schema: T.StructType) -> pa.Schema:
    mapping: dict[type, pa.DataType] = {T.StringType: pa.string(), T.LongType: pa.int64(), T.BooleanType: pa.bool_()}
    return pa.schema([pa.field(f.name, mapping[type(f.dataType)]) for f in schema.fields])


def _document_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Winner rows -> ``document``, ``plain`` (typed-column JSON) and ``types`` per row.

    ``types`` is a signature ``name:type,...``: few distinct signatures exist, so the driver collects
    them cheaply to decide the table schema.
    """
    schema = _arrow_schema(_ROW_SCHEMA)
    for batch in batches:
        out: dict[str, list[Any]] = {name: [] for name in schema.names}
        for row in batch.to_pylist():
            for name in ("collection", "_id", "op", "position", "ts_ms", "deleted", "pending"):
                out[name].append(row[name])
            if row["deleted"] or row["pending"]:
                out["document"].append(None)
                out["plain"].append(None)
                out["types"].append(None)
                continue
            doc = documents.loads(row["after"])
            if not isinstance(doc, dict):
                raise documents.DocumentError(f"{row['collection']} key {row['_id']}: 'after' is not a document")
            text, plain, types = documents.document_row(doc)
            out["document"].append(text)
            out["plain"].append(plain)
            out["types"].append(",".join(f"{k}:{v}" for k, v in sorted(types.items())))
        yield pa.RecordBatch.from_pydict(out, schema=schema)


def winners(changes: DataFrame) -> DataFrame:
    """One row per key of ``changes`` (all its changelog rows): the winner, deleted or pending."""
    w = Window.partitionBy(*_KEY)
    ranked = (
        changes.withColumn("_pos", _position_struct())
        .withColumn("_last_full", F.max(F.when(_full_image(), F.col("_pos"))).over(w))
        .withColumn("_rank", F.row_number().over(w.orderBy(F.col("_pos").desc(), F.col("landing_file").desc())))
    )
    # row_number, not max(): the same event can sit in two landing files (a slice and the Kafka path)
    top = ranked.where(F.col("_rank") == 1)
    direct = top.where(_full_image()).select(
        *[F.col(c) for c in ("collection", "_id", "op", "position", "ts_ms", "after")],
        (F.col("op") == "d").alias("deleted"),
        F.lit(False).alias("pending"),
    )
    fold_keys = top.where(~_full_image()).select(*_KEY).distinct()
    to_fold = ranked.join(fold_keys, _KEY, "left_semi").where(
        F.col("_last_full").isNull() | (F.col("_pos") >= F.col("_last_full"))
    )
    folded = (
        to_fold.select(
            "collection", "_id", "op", "position", "ts_ms", "pos_seconds", "pos_increment", "pos_ordinal",
            "after", "updated_fields", "removed_fields", "truncated_arrays",
        )
        .groupBy(*_KEY)
        .applyInArrow(_fold, _FOLD_RESULT_SCHEMA)
    )
    return direct.unionByName(folded)


def _typed_schema(existing: T.StructType | None) -> dict[str, str]:
    """Typed columns of an existing state table as {name: Spark type name}."""
    if existing is None:
        return {}
    base = {name for name, _ in BASE_COLUMNS}
    return {f.name: f.dataType.simpleString() for f in existing.fields if f.name not in base}


def _batch_stats(rows: DataFrame) -> tuple[dict[str, set[str]], dict[str, int]]:
    """One pass over the winners: field types seen, and how many keys are upserted/deleted/pending."""
    outcome = F.when(F.col("pending"), "pending").when(F.col("deleted"), "deleted").otherwise("upserted")
    stats = rows.groupBy(outcome.alias("outcome")).agg(
        F.count("*").alias("n"), F.collect_set("types").alias("signatures")
    )
    seen: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for row in stats.collect():
        counts[row["outcome"]] = int(row["n"])
        for signature in row["signatures"]:
            for entry in filter(None, signature.split(",")):
                name, _, kind = entry.rpartition(":")
                seen.setdefault(name, set()).add(kind)
    return seen, counts


def _resolve_types(existing: dict[str, str], seen: dict[str, set[str]]) -> tuple[dict[str, str], dict[str, str]]:
    """(final column types, widened columns): existing types widened with everything seen now."""
    final = dict(existing)
    widened: dict[str, str] = {}
    for name in sorted(seen):
        kinds = sorted(seen[name])
        current = final.get(name)
        for kind in kinds:
            current = documents.widen(current, kind)
        assert current is not None
        if len(kinds) > 1 or (name in existing and existing[name] != current):
            widened[name] = f"{'+'.join(sorted({*kinds, *([existing[name]] if name in existing else [])}))} -> {current}"
        final[name] = current
    return final, widened


def _project(rows: DataFrame, columns: dict[str, str]) -> DataFrame:
    """Rows with ``plain`` -> one typed column per field (``from_json`` leaves absent fields null)."""
    schema = T.StructType([T.StructField(n, _SPARK_TYPES[t]) for n, t in columns.items()])
    parsed = F.from_json("plain", schema, {"timestampFormat": _TIMESTAMP_FORMAT})
    return rows.select(
        *[F.col(n) for n, _ in BASE_COLUMNS],
        "deleted",
        *[parsed[n].alias(n) for n in columns],
    )


def _empty_state(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([], T.StructType([T.StructField(n, t) for n, t in BASE_COLUMNS]))


def _rewrite_with_types(spark: SparkSession, location: str, columns: dict[str, str]) -> None:
    """Re-derive every typed column from ``document`` (after a type widened) and overwrite the table."""
    current = spark.read.format("delta").load(location)
    rows = current.select(
        "collection", "_id", "op", "position", "ts_ms",
        F.col("document").alias("after"), F.lit(False).alias("deleted"), F.lit(False).alias("pending"),
    ).mapInArrow(_document_rows, _ROW_SCHEMA)
    projected = _project(rows, columns).drop("deleted").localCheckpoint()
    (
        projected.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
        .partitionBy("collection").save(location)
    )


def merge_current_state(
    spark: SparkSession,
    changelog_location: str,
    state_location: str,
    *,
    changes: DataFrame | None = None,
    collections: Sequence[str] | None = None,
) -> MergeResult:
    """Bring current_state up to date for the keys in ``changes`` (or every key of ``collections``).

    ``changes`` are changelog rows already written to the changelog table (only their keys matter);
    without it, the named collections are rebuilt from the whole changelog.
    """
    if changes is None and collections is None:
        raise ValueError("merge_current_state needs the new changelog rows (changes=) or collections=")
    result = MergeResult(state_location)
    changelog = read_changelog(spark, changelog_location)
    if changes is not None:
        keys = changes.select(*_KEY).distinct().localCheckpoint()
        names = sorted(r["collection"] for r in keys.select("collection").distinct().collect())
        relevant = changelog.where(F.col("collection").isin(names)).join(keys, _KEY, "left_semi") if names else None
    else:
        names = sorted(collections or [])
        relevant = changelog.where(F.col("collection").isin(names)) if names else None
    if relevant is None:
        return result

    rows = winners(relevant).mapInArrow(_document_rows, _ROW_SCHEMA).localCheckpoint()
    seen, counts = _batch_stats(rows)
    result.upserted, result.deleted = counts.get("upserted", 0), counts.get("deleted", 0)
    result.pending_keys = counts.get("pending", 0)
    result.keys_touched = sum(counts.values())

    existing_schema = spark.read.format("delta").load(state_location).schema if table_exists(
        spark, state_location
    ) else None
    existing = _typed_schema(existing_schema)
    columns, widened = _resolve_types(existing, seen)
    result.widened = widened
    result.new_columns = [n for n in columns if n not in existing]

    if existing_schema is None:
        _project(_empty_state(spark).withColumn("plain", F.lit(None).cast("string")).withColumn(
            "deleted", F.lit(False)), columns
        ).drop("deleted").write.format("delta").partitionBy("collection").save(state_location)
    elif any(existing[n] != columns[n] for n in existing):
        _rewrite_with_types(spark, state_location, columns)
    elif result.new_columns:
        added = ", ".join(f"`{n}` {columns[n]}" for n in result.new_columns)
        spark.sql(f"ALTER TABLE delta.`{state_location}` ADD COLUMNS ({added})")

    source = _project(rows.where(~F.col("pending")), columns)

    assignments: dict[str, str | Column] = {c: F.col(f"s.`{c}`") for c in [n for n, _ in BASE_COLUMNS] + list(columns)}
    target = DeltaTable.forPath(spark, state_location)
    in_scope = "t.collection IN (" + ", ".join("'" + n.replace("'", "\\'") + "'" for n in names) + ")"
    (
        target.alias("t")
        .merge(source.alias("s"), f"{in_scope} AND t.collection = s.collection AND t._id = s._id")
        .whenMatchedDelete(condition="s.deleted")
        .whenMatchedUpdate(set=assignments)
        .whenNotMatchedInsert(condition="NOT s.deleted", values=assignments)
        .execute()
    )
    if changes is not None:
        # Keys whose changelog rows were all replaced away (a re-written landing file without them)
        # have no winner row above; with no record left they must leave current_state too.
        orphans = keys.join(relevant.select(*_KEY).distinct(), list(_KEY), "left_anti")
        if not orphans.isEmpty():
            (
                target.alias("t")
                .merge(orphans.alias("o"), f"{in_scope} AND t.collection = o.collection AND t._id = o._id")
                .whenMatchedDelete()
                .execute()
            )
    state = spark.read.format("delta").load(state_location).where(F.col("collection").isin(names))
    result.rows = {r["collection"]: int(r["count"]) for r in state.groupBy("collection").count().collect()}
    for name in names:
        result.rows.setdefault(name, 0)
    return result


def read_current_state(spark: SparkSession, location: str) -> DataFrame:
    """The current_state table (empty, base columns only, when it does not exist yet)."""
    if not table_exists(spark, location):
        return _empty_state(spark)
    return spark.read.format("delta").load(location)
