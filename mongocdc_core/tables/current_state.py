"""A collection's ``current_state`` Delta table: one row per document, the highest position wins.

A refresh reads only what the changelog gained since the table's recorded changelog version (its
change data feed) and MERGEs only the keys those events touch:

- per key the winning event is the one with the highest position (docs/architecture.md section 3; at one
  position a snapshot read sorts before a change). When every new event is later than everything
  the table already reflects (the usual case) the new events alone decide; when older events arrive
  (a slice or snapshot materialised late) the keys' events from the oldest new position on are read
  back from the changelog, so a later delete is never overtaken by an older insert;
- a winner without a full document (capture modes without ``fullDocument``) is rebuilt from the
  key's last full image and the update descriptions after it (:mod:`~mongocdc_core.tables.fold`,
  the one Python function; keys whose full image has not arrived yet are *pending*);
- a key whose winner is older than the latest completed full snapshot was not read by it, so it no
  longer exists (no ghosts after a re-snapshot); when a newer full snapshot completes, every such
  row is dropped;
- the documents become typed columns (:mod:`~mongocdc_core.tables.kinds`,
  :mod:`~mongocdc_core.tables.typed_columns`): new fields add columns, a type change converts that column
  (from ``__doc``, which keeps every document exactly) and is reported.

The MERGE writes deletion vectors, so it rewrites the changed rows, not the files around them (but
in a table of a few MB, where rewriting the files it touches costs less than the jobs that write
them); change data feed is on, so downstream jobs read row-level changes incrementally.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from delta.tables import DeltaTable
from pyspark import cloudpickle
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from mongocdc_core.tables import fold, kinds, typed_columns
from mongocdc_core.tables.changelog import (
    COLLECTION_PROPERTY,
    LOG_OPTIONS,
    PARTITION_COLUMN,
    POSITION_PROPERTY,
    ROWS_PROPERTY,
    ROWS_VERSION_PROPERTY,
    SNAPSHOT_PROPERTY,
    Recording,
    TableInputError,
    interpreted,
    latest_version,
    look,
    position_seconds,
    record,
    recording,
    settings,
    size_at,
    table_exists,
    table_properties,
)
from mongocdc_core.tables.changelog import setting as _setting
from mongocdc_core.tables.kinds import Kind

# Executors get fold.py inside the job instead of importing it (mongocdc need not be installed there).
cloudpickle.register_pickle_by_value(fold)

log = logging.getLogger(__name__)

VERSION_PROPERTY = "mongocdc.changelog.version"
KINDS_PROPERTY = "mongocdc.kinds"
OPTIONS_PROPERTY = "mongocdc.options"
#: Optional metadata columns (``TableOptions.add_fields``), named like the extraction transform's.
ADD_FIELDS = {"op": "__op", "source_ts_ms": "__source_ts_ms", "position": "__position", "collection": "__collection"}
_EVENT_COLUMNS = (
    "__key", "__op", "__position", "__ts_ms", "__source_ts_ms", "after", "updated_fields", "removed_fields",
    "truncated_arrays",
)
_FOLD_SCHEMA = (
    "__key string, __op string, __position string, __ts_ms bigint, __source_ts_ms bigint, after string, "
    "deleted boolean, pending boolean"
)
_STATE_COLUMNS = ("__key", "__op", "__position", "__ts_ms", "__source_ts_ms", "after", "deleted", "pending")
_OBSERVATIONS = itertools.count()
_TARGET_PARTITION_BYTES = 64 * 1024 * 1024
_MIN_PARTITION_BYTES = 8 * 1024 * 1024  # below this per core, one partition less beats an idle core
_SAMPLE_ROWS = 1000  # documents whose schema decides which questions a new table's first pass asks
_TABLE_OPTIONS = {
    "delta.columnMapping.mode": "name",
    "delta.enableChangeDataFeed": "true",
    "delta.enableDeletionVectors": "true",
} | LOG_OPTIONS
_MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"  # Delta's copy of a MERGE source
#: A refresh of a table up to this size plans without adaptive execution or broadcast joins (:func:`_small_plans`).
_SMALL_TABLE_BYTES = _MIN_PARTITION_BYTES
#: The settings that refresh runs with: each adaptive query stage and each broadcast is a Spark job of its own,
#: and a MERGE that writes deletion vectors runs 7 jobs where one that rewrites the files it touches (of a
#: table this small, a few MB at most) runs 4.
_SMALL_PLANS = {
    "spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.databricks.delta.merge.deletionVectors.persistent": "false",
}


@dataclass(frozen=True)
class Layout:
    """Which optional columns the table has and how deletes show (from ``TableOptions``)."""

    delete_handling: str = "drop"
    add_fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.delete_handling not in ("drop", "rewrite"):
            raise TableInputError(f"delete_handling must be 'drop' or 'rewrite', got {self.delete_handling!r}")
        unknown = [f for f in self.add_fields if f not in ADD_FIELDS]
        if unknown:
            raise TableInputError(f"add_fields: unknown {unknown} (allowed: {', '.join(ADD_FIELDS)})")

    @property
    def metadata_columns(self) -> list[str]:
        """Optional columns after ``__key`` and ``__position`` (which every table has), in a fixed order."""
        wanted = {ADD_FIELDS[f] for f in self.add_fields} - {"__position"}
        extra = [c for c in ("__op", "__source_ts_ms", "__collection") if c in wanted]
        return extra + (["__deleted"] if self.delete_handling == "rewrite" else [])

    def to_json(self) -> str:
        return json.dumps({"delete_handling": self.delete_handling, "add_fields": sorted(set(self.add_fields))})


@dataclass
class StateResult:
    """What a refresh did (``collection.StateRefresh`` is built from it)."""

    keys_merged: int = 0
    upserted: int = 0
    deleted: int = 0
    pending: int = 0
    row_count: int = 0
    position: str | None = None
    schema: T.StructType = field(default_factory=T.StructType)
    schema_changes: list[str] = field(default_factory=list)
    inserted: int = 0  # rows the table gained
    removed: int = 0  # rows the table lost
    commits: int = 0  # Delta commits an incremental refresh made to the table (ALTERs, MERGE)
    recount: bool = False  # the commits made are not known exactly: count the table
    recorded: bool = False  # the refresh's state went with its MERGE's commit


# --------------------------------------------------------------------------- winners


def _order_tiebreak() -> Column:
    """At one position a snapshot read sorts before a change."""
    return F.when(F.col("__op") == "r", 0).otherwise(1)


def _order() -> Column:
    return F.struct(F.col("__position"), _order_tiebreak())


def _full_image() -> Column:
    return (F.col("__op") == "d") | F.col("after").isNotNull()


def _checkpoint(
    frame: DataFrame, keep: tuple[str, ...] | None = None, **metrics: Column
) -> tuple[DataFrame, dict[str, Any]]:
    """Materialise ``frame`` (its ``keep`` columns, default all) once and compute ``metrics``
    (aggregates over all of ``frame``) in the same pass."""
    observation = Observation(f"mongocdc-{next(_OBSERVATIONS)}")
    observed = frame.observe(observation, *[c.alias(k) for k, c in metrics.items()])
    done = (observed.select(*keep) if keep is not None else observed).localCheckpoint()
    return done, observation.get


def _per_key(events: DataFrame) -> DataFrame:
    """Per key of ``events``: its winning event (highest position), its last full image's order and its
    earliest position (``first``).

    A window ranked by position rather than ``groupBy``/``max_by``: ``max_by`` of a struct holding the
    document cannot use a fixed-width hash buffer and falls back to a slower sort aggregation, while the
    window sorts each key's events once and keeps the top row.
    """
    ranked = Window.partitionBy("__key").orderBy(F.col("__position").desc(), _order_tiebreak().desc())
    whole = ranked.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    return events.select(
        *_EVENT_COLUMNS,
        F.row_number().over(ranked).alias("__rank"),
        F.max(F.when(_full_image(), _order())).over(whole).alias("last_full"),
        F.min("__position").over(whole).alias("first"),
    ).where(F.col("__rank") == 1).drop("__rank")


def _winners(events: DataFrame) -> tuple[DataFrame, dict[str, Any]]:
    """One state row per key of ``events`` (all of that key's events from some position on), checkpointed:
    ``after`` (Extended JSON), ``deleted`` or ``pending``, and ``first``, the key's earliest position here.
    Also ``first``/``last`` (positions) and ``pending`` (keys) over all of them."""
    top, stats = _checkpoint(
        _per_key(events),
        first=F.min("first"), last=F.max("__position"), unfolded=F.count(F.when(~_full_image(), 1)),
    )
    stats["pending"] = 0
    direct = top.where(_full_image()).select(
        *_STATE_COLUMNS[:6], (F.col("__op") == "d").alias("deleted"), F.lit(False).alias("pending"), "first"
    )
    if not stats["unfolded"]:
        return direct, stats
    needs_fold = top.where(~_full_image()).select("__key", "last_full", "first")
    to_fold = (
        events.join(needs_fold, "__key")
        .where(F.col("last_full").isNull() | (_order() >= F.col("last_full")))
        .select(*_EVENT_COLUMNS)
    )
    folded = to_fold.groupBy("__key").applyInArrow(fold.fold_key, _FOLD_SCHEMA)
    rows, more = _checkpoint(
        direct.unionByName(folded.join(needs_fold.select("__key", "first"), "__key")),
        pending=F.count(F.when(F.col("pending"), 1)),
    )
    return rows, stats | more


def _history(changelog: DataFrame, keys: DataFrame, floor: str | None) -> DataFrame:
    """The changelog events of ``keys`` at or after ``floor`` (all of them when None)."""
    events = changelog
    if floor is not None:
        events = events.where(
            (F.col(PARTITION_COLUMN) >= F.to_date(F.timestamp_seconds(position_seconds(F.lit(floor)))))
            & (F.col("__position") >= floor)
        )
    return events.select(*_EVENT_COLUMNS).join(keys.select("__key"), "__key", "left_semi")


# --------------------------------------------------------------------------- table shape


@dataclass(frozen=True)
class Shape:
    """The kinds behind the table's columns: ``_id`` and the document's fields."""

    id_kind: Kind
    doc: Kind

    def to_json(self) -> str:
        return json.dumps({"id": self.id_kind.to_json(), "doc": self.doc.to_json()}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Shape:
        data = json.loads(text)
        return cls(Kind.from_json(data["id"]), Kind.from_json(data["doc"]))

    def user_columns(self) -> list[kinds.Field]:
        return [f for f in self.doc.fields if f.kind.typed]

    def id_type(self) -> T.DataType:
        return self.id_kind.spark_type() if self.id_kind.typed else T.StringType()


def _seen(observed: dict[str, Any]) -> tuple[Kind, kinds.Questions | None, Kind, kinds.Questions | None]:
    """The document and ``_id`` kinds of a pass's merged variant schemas (``doc``, ``id``), each with
    the questions it leaves open."""
    doc, doc_questions = kinds.from_variant_schema(observed["doc"]) if observed["doc"] else (kinds.struct([]), None)
    id_kind, id_questions = kinds.from_variant_schema(observed["id"]) if observed["id"] else (kinds.NULL, None)
    if doc.tag == "null":  # every row a delete: no document to learn a field from
        doc = kinds.struct([])
    if doc.tag != "struct":
        raise TableInputError(f"documents are not JSON objects (schema {observed['doc']})")
    return kinds.struct((f.name, f.kind) for f in doc.fields if f.name != "_id"), doc_questions, id_kind, id_questions


def _answered(observed: dict[str, Any], asked: tuple[kinds.Questions, kinds.Questions]) -> bool:
    """Whether the pass that ``observed`` comes from answered every question its schemas raise."""
    _, doc_questions, _, id_questions = _seen(observed)
    return (not doc_questions or doc_questions.within(asked[0])) and (not id_questions or id_questions.within(asked[1]))


def _infer(
    rows: DataFrame, observed: dict[str, Any], old: Shape | None, asked: tuple[kinds.Questions, kinds.Questions]
) -> Shape:
    """The shape of ``rows`` (variant columns ``v``, ``idv``) merged with ``old``.

    ``observed`` holds the merged variant schemas (``doc``, ``id``) and the answers to the questions
    ``asked`` in that pass (see :func:`_prepare`); only questions it did not ask (new dates, decimals,
    binaries or type conflicts) cost one more aggregation.
    """
    doc, doc_questions, id_kind, id_questions = _seen(observed)
    known_doc, known_id = asked
    values = dict(observed)
    missing: list[Column] = []
    if doc_questions and not doc_questions.within(known_doc):
        missing += typed_columns.questions_aggregates(F.col("v"), doc_questions, "d_")
    if id_questions and not id_questions.within(known_id):
        missing += typed_columns.questions_aggregates(F.col("idv"), id_questions, "i_")
    if missing:
        second = rows.agg(*missing).first()
        assert second is not None
        values |= second.asDict()
    if doc_questions:
        prefix = "d_" if not doc_questions.within(known_doc) else "kd_"
        chosen = doc_questions if prefix == "d_" else known_doc
        doc = kinds.resolve(doc, typed_columns.read_answers(values, chosen, prefix))
    if id_questions:
        prefix = "i_" if not id_questions.within(known_id) else "ki_"
        chosen = id_questions if prefix == "i_" else known_id
        id_kind = kinds.resolve(id_kind, typed_columns.read_answers(values, chosen, prefix))
    merged_doc = kinds.merge(old.doc, doc) if old is not None else doc
    merged_id = kinds.merge(old.id_kind, id_kind) if old is not None else id_kind
    return Shape(kinds.as_id(merged_id), kinds.name_columns(merged_doc, old.doc if old else None, top=True))


def _asked(old: Shape | None, events: DataFrame) -> tuple[tuple[kinds.Questions, kinds.Questions], Shape | None]:
    """The questions (document, ``_id``) to answer in the pass that reads the batch anyway: those about
    the fields the table holds, or for a new table those a sample of the documents raises. A field
    the sample missed costs one more aggregation (:func:`_infer`), never a wrong type.

    For a new table also the sample's own shape (its questions answered over the sample), the guess
    a new table is written with in one pass (:func:`_build`)."""
    if old is not None:
        return (kinds.known_questions(old.doc), kinds.known_questions(old.id_kind)), None
    sample, schemas = _checkpoint(
        events.limit(_SAMPLE_ROWS).select(
            F.when(F.col("after").isNotNull(), typed_columns.document(F.col("after"))).alias("v"),
            typed_columns.document(F.col("__key")).alias("idv"),
        ),
        doc=F.schema_of_variant_agg("v"), id=F.schema_of_variant_agg("idv"),
    )
    _, doc_questions, _, id_questions = _seen(schemas)
    asked = (doc_questions or kinds.Questions(), id_questions or kinds.Questions())
    answers = typed_columns.questions_aggregates(F.col("v"), asked[0], "kd_")
    answers += typed_columns.questions_aggregates(F.col("idv"), asked[1], "ki_")
    values = dict(schemas)
    if answers:
        row = sample.agg(*answers).first()
        assert row is not None
        values |= row.asDict()
    return asked, _infer(sample, values, None, asked)


def _state_values() -> dict[str, Column]:
    """The state columns :func:`columns` takes, from parsed state rows (:func:`_parsed`)."""
    return {
        "__position": F.col("__position"), "__op": F.col("__op"), "__source_ts_ms": F.col("__source_ts_ms"),
        "__deleted": F.col("deleted"),
    }


def _parsed(rows: DataFrame, snapshot: str | None) -> DataFrame:
    """State rows with ghosts marked deleted and their documents parsed (``v``, ``idv``)."""
    ghost = F.lit(snapshot).isNotNull() & (F.col("__position") < F.lit(snapshot))
    return rows.select(
        *_STATE_COLUMNS[:6], ((F.col("deleted") | ghost) & ~F.col("pending")).alias("deleted"), "pending", "first",
    ).select(
        "*",
        F.when(~F.col("deleted") & ~F.col("pending"), typed_columns.document(F.col("after"))).alias("v"),
        F.when(~F.col("pending"), typed_columns.document(F.col("__key"))).alias("idv"),
    )


def _observed(asked: tuple[kinds.Questions, kinds.Questions]) -> dict[str, Column]:
    """What a pass over parsed state rows observes: counts (``keys`` live, ``pending``, ``deleted``), the
    merged variant schemas and the answers to the ``asked`` questions."""
    known_doc, known_id = asked
    answers = typed_columns.question_columns(F.col("v"), known_doc, "kd_")
    answers += typed_columns.question_columns(F.col("idv"), known_id, "ki_")
    return {
        "keys": F.count(F.when(~F.col("pending"), 1)), "pending": F.count(F.when(F.col("pending"), 1)),
        "deleted": F.count(F.when(F.col("deleted"), 1)),
        "doc": F.schema_of_variant_agg("v"), "id": F.schema_of_variant_agg("idv"),
    } | dict(answers)


def _prepare(
    rows: DataFrame, snapshot: str | None, asked: tuple[kinds.Questions, kinds.Questions], **more: Column
) -> tuple[DataFrame, dict[str, Any]]:
    """State rows -> the live rows to merge, with their documents parsed (``v``, ``idv``), materialised
    once (without the document text, which ``v`` holds); the same pass observes :func:`_observed`."""
    done, observed = _checkpoint(
        _parsed(rows, snapshot), ("__key", "__op", "__position", "__source_ts_ms", "deleted", "pending", "v", "idv"),
        **_observed(asked), **more,
    )
    return done.where(~F.col("pending")), observed


def columns(
    shape: Shape, layout: Layout, namespace: str, doc: Column, key: Column, state: dict[str, Column],
    *, strict: bool = True, key_value: Column | None = None,
) -> list[Column]:
    """The table's columns, in order, from a normalised document variant and the event's fields
    (``key_value``: the key's variant when the rows hold it already, else ``key`` is parsed)."""
    parsed_key = typed_columns.document(key) if key_value is None else key_value
    id_value = typed_columns.convert(shape.id_kind, parsed_key, strict=strict) if shape.id_kind.typed else F.lit(None)
    out = [id_value.cast(shape.id_type()).alias("_id")]
    out += [
        typed_columns.field(f.kind, doc, f.name, strict=strict).alias(f.column) for f in shape.user_columns()
    ]
    out += [doc.alias("__doc"), key.alias("__key"), state["__position"].alias("__position")]
    for column in layout.metadata_columns:
        if column == "__collection":
            out.append(F.lit(namespace).alias(column))
        else:
            out.append(state[column].alias(column))
    return out


def _ddl(dtype: T.DataType) -> str:
    """Spark SQL type text with quoted field names (``simpleString`` does not quote)."""
    if isinstance(dtype, T.StructType):
        return "STRUCT<" + ", ".join(f"{typed_columns.quote(f.name)}: {_ddl(f.dataType)}" for f in dtype.fields) + ">"
    if isinstance(dtype, T.ArrayType):
        return f"ARRAY<{_ddl(dtype.elementType)}>"
    return dtype.simpleString().upper()


def _added(old: Kind, new: Kind, prefix: str) -> list[tuple[str, T.DataType]]:
    """(column path, type) of every column the fields of document kind ``new`` add to ``old``'s (a
    changed type is :func:`kinds.needs_rewrite`'s affair)."""
    out: list[tuple[str, T.DataType]] = []
    for f in new.fields:
        if not f.kind.typed:
            continue
        before = old.field(f.name)
        path = f"{prefix}{typed_columns.quote(f.column)}"
        if before is None or not before.kind.typed:
            out.append((path, f.kind.spark_type()))
        else:
            out += _added_within(before.kind, f.kind, path + ".")
    return out


def _added_within(old: Kind, new: Kind, prefix: str) -> list[tuple[str, T.DataType]]:
    """:func:`_added` inside one struct column, or its array's elements (``prefix``: the column's path)."""
    if not (old.nested and new.nested and old.tag == new.tag):
        return []
    if old.tag == "struct":
        return _added(old, new, prefix)
    assert old.element is not None and new.element is not None
    return _added_within(old.element, new.element, prefix + "element.")


# --------------------------------------------------------------------------- refresh


@contextmanager
def sized_shuffles(spark: SparkSession, nbytes: int) -> Iterator[int]:
    """Shuffle partitions sized from the data (about 64 MB each, at most 4 per core), not Spark's 200;
    but one per core once each would get 8 MB: a full build of a 60 MB changelog folded and wrote
    its 500k documents in one task, on one core."""
    cores = max(1, spark.sparkContext.defaultParallelism)
    sized = min(math.ceil(nbytes / _TARGET_PARTITION_BYTES), 4 * cores)
    partitions = max(1, sized, min(cores, nbytes // _MIN_PARTITION_BYTES))
    with _setting(spark, "spark.sql.shuffle.partitions", str(partitions)):
        yield partitions


@contextmanager
def _small_plans(spark: SparkSession, small: bool) -> Iterator[None]:
    """For the block, when ``small``: plans without adaptive query execution (which runs each shuffle
    stage as a Spark job of its own) or broadcast joins (a job each, to collect the small side).

    Nor does its MERGE write deletion vectors: it rewrites the few files it touches, which for a table of
    a few MB costs less than the three jobs deletion vectors take.

    For an incremental refresh of a small table with few changes, the usual one of a quiet collection: it
    then starts 5 Spark jobs instead of 19, and each job costs its scheduling whatever it carries. Only
    when both are small: without a broadcast, the MERGE shuffles the whole table and the changes to join
    them, which for a large one costs more than the jobs saved.

    The settings are the session's while the block runs, as the shuffle partitions are: other threads
    planning in the same session meanwhile plan with them (``collection.concurrently`` gives each refresh
    a session of its own)."""
    with settings(spark, _SMALL_PLANS if small else {}):
        yield


def _changes(spark: SparkSession, location: str, since: int, until: int) -> DataFrame | None:
    """Rows the changelog gained after version ``since`` (None when its change feed no longer has them)."""
    try:
        feed = (
            spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", since + 1).option("endingVersion", until).load(location)
        )
        return feed.where(F.col("_change_type") == "insert").drop("_change_type", "_commit_version", "_commit_timestamp")
    except AnalysisException:
        return None


def refresh(
    spark: SparkSession, namespace: str, changelog_location: str, state_location: str, layout: Layout
) -> StateResult:
    """Bring current_state up to the changelog (see the module doc)."""
    if not table_exists(spark, changelog_location):
        raise TableInputError(f"{namespace}: no changelog table at {changelog_location}: refresh the changelog first")
    log = look(spark, changelog_location)
    log_version, snapshot = log.version, log.properties.get(SNAPSHOT_PROPERTY)
    state = look(spark, state_location)
    props = state.properties
    old = Shape.from_json(props[KINDS_PROPERTY]) if KINDS_PROPERTY in props else None
    rebuild = old is None or props.get(OPTIONS_PROPERTY) != layout.to_json() or VERSION_PROPERTY not in props
    since = -1 if rebuild else int(props[VERSION_PROPERTY])
    table_position = None if rebuild else props.get(POSITION_PROPERTY)
    applied = None if rebuild else props.get(SNAPSHOT_PROPERTY)
    known = None if rebuild else _recorded_rows(props)
    if not rebuild and (known is None or known[1] != state.version):  # another writer committed since the last
        # refresh (or it recorded no count): counted once, at that version, so this refresh's commit records it
        known = (_read_at(spark, state_location, state.version).count(), state.version)
    if not rebuild and since >= log.changed_at and applied == snapshot:  # nothing since, maintenance at most
        assert known is not None and old is not None
        if props.get(ROWS_VERSION_PROPERTY) != str(state.version):  # counted above: recorded for the next cycles
            record(spark, state_location, _state(namespace, since, layout, old, table_position, applied, known))
        return _result(spark, state_location, StateResult(position=table_position, row_count=known[0]), counted=True)
    changelog = spark.read.format("delta").option("versionAsOf", log_version).load(changelog_location)
    events = None if rebuild else _changes(spark, changelog_location, since, log_version)
    if events is None:
        rebuild, old, table_position, applied, events = True, None, None, None, changelog
    ghosts = snapshot is not None and not rebuild and (applied is None or snapshot > applied)

    def carried(result: StateResult, shape: Shape) -> Recording | None:
        """The state the MERGE's commit records: not when a later commit of this refresh follows (rows older
        than a new snapshot dropped), or the table lacks :data:`LOG_OPTIONS` (that later commit sets them)."""
        if rebuild or ghosts or result.recount or known is None or any(props.get(k) != v for k, v in LOG_OPTIONS.items()):
            return None
        # the table held known[0] rows at known[1]; this refresh's commits so far (ADD COLUMNS) changed none
        rows = (known[0], known[1] + result.commits)
        return _state(namespace, log_version, layout, shape, result.position, snapshot, rows)

    # an incremental refresh handles the table and what the changelog gained since (its size then, from the
    # log; unknown: the whole changelog): a small table fed a bulk load is not planned as a small refresh
    added = log.size_bytes - (0 if rebuild else (size_at(spark, changelog_location, since) or 0))
    nbytes = log.size_bytes if rebuild else max(state.size_bytes, added)
    with (sized_shuffles(spark, nbytes), _small_plans(spark, not rebuild and nbytes <= _SMALL_TABLE_BYTES),
          interpreted(spark, nbytes)):
        result, shape = _merge(
            spark, namespace, state_location, layout, changelog, events.select(*_EVENT_COLUMNS), old,
            table_position, snapshot, rebuild, carried,
        )
        if ghosts and snapshot is not None:
            _drop_ghosts(spark, state_location, layout, snapshot, result)
    version = latest_version(spark, state_location)
    if not rebuild:
        if known is not None and not result.recount and version == known[1] + result.commits:  # all since ours
            result.row_count = known[0] + result.inserted - result.removed
        else:
            result.row_count = spark.read.format("delta").load(state_location).count()
    if not result.recorded:  # no commit of this refresh could carry its state: one of its own
        record(spark, state_location,
               _state(namespace, log_version, layout, shape, result.position, snapshot, (result.row_count, version)))
    return _result(spark, state_location, result, counted=True)


def _state(
    namespace: str, log_version: int, layout: Layout, shape: Shape, position: str | None, snapshot: str | None,
    rows: tuple[int, int],
) -> Recording:
    """The state a refresh records: the changelog version it reflects, its layout and shape, the position
    and the latest full snapshot applied, and ``rows``: the table's row count at a version."""
    properties = {
        COLLECTION_PROPERTY: namespace,
        VERSION_PROPERTY: str(log_version),
        OPTIONS_PROPERTY: layout.to_json(),
        KINDS_PROPERTY: shape.to_json(),
    }
    properties |= {POSITION_PROPERTY: position} if position is not None else {}
    properties |= {SNAPSHOT_PROPERTY: snapshot} if snapshot is not None else {}
    return Recording(properties, rows[0], rows[1])


def _read_at(spark: SparkSession, location: str, version: int) -> DataFrame:
    """The table as it was at ``version``."""
    return spark.read.format("delta").option("versionAsOf", version).load(location)


def _recorded_rows(props: dict[str, str]) -> tuple[int, int] | None:
    """The row count the last refresh recorded and the version it describes. It still holds when
    every commit since that version is one this refresh made (checked against the latest version)."""
    rows, at = props.get(ROWS_PROPERTY), props.get(ROWS_VERSION_PROPERTY)
    return (int(rows), int(at)) if rows is not None and at is not None else None


def _result(spark: SparkSession, location: str, result: StateResult, *, counted: bool = False) -> StateResult:
    """``result`` with the table's schema, row count (unless ``counted``: a rebuild knows what it wrote)
    and position."""
    if table_exists(spark, location):
        table = spark.read.format("delta").load(location)
        result.schema = table.schema
        if not counted:
            result.row_count = table.count()
        if result.position is None:
            result.position = table_properties(spark, location).get(POSITION_PROPERTY)
    return result


def _state_rows(
    changelog: DataFrame, events: DataFrame, table_position: str | None, rebuild: bool
) -> tuple[DataFrame, str | None, int]:
    """The state of every key ``events`` touch, the highest position among them, and how many keys
    are still pending."""
    rows, stats = _winners(events)
    last = stats["last"]
    complete = rebuild  # the events are every event of their keys
    if table_position is not None and stats["first"] is not None and stats["first"] <= table_position:
        # older events arrived: the keys' later events (merged before) must keep winning
        rows, stats = _winners(_history(changelog, rows, stats["first"]))
    elif not stats["pending"]:
        complete = True
    pending = int(stats["pending"])
    if not complete and pending:  # updates whose last full image is older than these events
        rebuilt, again = _winners(_history(changelog, rows.where(F.col("pending")), None))
        rows, pending = rows.where(~F.col("pending")).unionByName(rebuilt), int(again["pending"])
    return rows, last, pending


def _merge(
    spark: SparkSession,
    namespace: str,
    location: str,
    layout: Layout,
    changelog: DataFrame,
    events: DataFrame,
    old: Shape | None,
    table_position: str | None,
    snapshot: str | None,
    rebuild: bool,
    carried: Callable[[StateResult, Shape], Recording | None],
) -> tuple[StateResult, Shape]:
    """``carried``: the state the MERGE's commit records, given what the refresh found (None: a later commit
    records it)."""
    result = StateResult(position=table_position)
    # The usual case in one pass: every winner has a full document and is newer than the table.
    top = _per_key(events).select(
        *_STATE_COLUMNS[:6], (F.col("__op") == "d").alias("deleted"), (~_full_image()).alias("pending"), "first"
    )
    asked, guess = _asked(old, events)
    if guess is not None and not table_exists(spark, location):
        shape = _build(spark, namespace, location, layout, top, snapshot, asked, guess, result)
        if shape is not None:
            return result, shape
    live, counts = _prepare(top, snapshot, asked, first=F.min("first"), last=F.max("__position"))
    out_of_order = table_position is not None and counts["first"] is not None and counts["first"] <= table_position
    last = counts["last"]
    if counts["pending"] or out_of_order:  # updates to fold, or older events: the general way
        rows, last, _ = _state_rows(changelog, events, table_position, rebuild)
        live, counts = _prepare(rows, snapshot, asked)
    result.position = max(filter(None, [table_position, last]), default=None)
    result.pending = int(counts["pending"])
    result.keys_merged = int(counts["keys"]) + result.pending
    if result.keys_merged == 0 and old is not None and not rebuild:
        return result, old
    shape = _infer(live, counts, old, asked)
    source = live.select(
        *columns(shape, layout, namespace, F.col("v"), F.col("__key"), _state_values(), key_value=F.col("idv")),
        F.col("__op").alias("__merge_op"), F.col("deleted").alias("__merge_deleted"),
    )
    if rebuild or old is None or not table_exists(spark, location):
        written = source.where(~F.col("__merge_deleted")) if layout.delete_handling == "drop" else source
        _replace(spark, location, written.drop("__merge_op", "__merge_deleted"))
        result.upserted = int(counts["keys"]) - int(counts["deleted"])
        result.row_count = result.upserted if layout.delete_handling == "drop" else int(counts["keys"])
        return result, shape
    old_id, new_id = kinds.struct([("_id", old.id_kind)]), kinds.struct([("_id", shape.id_kind)])
    # A table built before any key was seen has a string _id standing for no type: the first keys decide it.
    id_typed = not old.id_kind.typed and old.id_type() != shape.id_type()
    result.schema_changes = (
        [f"field _id: string -> {shape.id_kind.describe()}"] if id_typed else kinds.changes(old_id, new_id)
    ) + kinds.changes(old.doc, shape.doc)
    added = _added(old.doc, shape.doc, "")
    # an attempt that stopped before recording its shape may have added some of them already, maybe typed
    # from fewer events: those of the same type are skipped, a different one means the table is rewritten
    present = dict(_paths(spark.read.format("delta").load(location).schema, "")) if added else {}
    retyped = any(path in present and _ddl(present[path]) != _ddl(dtype) for path, dtype in added)
    if retyped or id_typed or kinds.needs_rewrite(old_id, new_id) or kinds.needs_rewrite(old.doc, shape.doc):
        _rewrite(spark, namespace, location, layout, shape)
        result.recount = True  # rare (a type changed); the table is counted rather than its commits
    else:
        result.commits += _add_columns(spark, location, old, [(p, t) for p, t in added if p not in present])
    _apply(spark, location, layout, source, result, carried(result, shape))
    return result, shape


def _build(
    spark: SparkSession,
    namespace: str,
    location: str,
    layout: Layout,
    top: DataFrame,
    snapshot: str | None,
    asked: tuple[kinds.Questions, kinds.Questions],
    guess: Shape,
    result: StateResult,
) -> Shape | None:
    """A new table written in one pass over the winners ``top``, typed as ``guess`` (a sample's shape)
    while the same pass observes the shape of every row written: when the two type every value alike,
    the table is done, its shape the observed one. None when they do not (a field, type or decimal
    scale the sample missed, or updates to fold): the table is removed again (see :func:`_remove`) and
    the caller creates it afresh the general way.

    The guess converts leniently (a value it does not fit becomes NULL instead of failing the pass);
    such a value always shows as a different shape, so a table kept was typed as strictly as ever."""
    observation = Observation(f"mongocdc-{next(_OBSERVATIONS)}")
    metrics = _observed(asked) | {"last": F.max("__position")}
    parsed = _parsed(top, snapshot).observe(observation, *[c.alias(k) for k, c in metrics.items()])
    live = parsed.where(~F.col("pending") & ~F.col("deleted")) if layout.delete_handling == "drop" else (
        parsed.where(~F.col("pending"))
    )
    _replace(spark, location, live.select(
        *columns(guess, layout, namespace, F.col("v"), F.col("__key"), _state_values(), strict=False, key_value=F.col("idv"))
    ))
    counts = observation.get
    # with every question answered, _infer runs no other pass
    shape = _infer(live, counts, None, asked) if not counts["pending"] and _answered(counts, asked) else None
    if shape is None or (_typing(shape.id_kind), _typing(shape.doc)) != (_typing(guess.id_kind), _typing(guess.doc)):
        _remove(spark, location)
        return None
    result.position = counts["last"]
    result.keys_merged = int(counts["keys"])
    result.upserted = int(counts["keys"]) - int(counts["deleted"])
    result.row_count = result.upserted if layout.delete_handling == "drop" else int(counts["keys"])
    return shape


def _remove(spark: SparkSession, location: str) -> None:
    """Delete the table :func:`_build` created at ``location`` through Spark's file systems (a local
    path, ``s3a://``, ``abfss://``, ...), and Delta's cached log of it.

    Its mistyped rows must not stay in its history: a time-travel reader would see them, and a change
    data feed reader from version 0 would get them as inserts and no feed for their fix (a rewrite of
    an existing table has the feed off). Everything there is the table's: Delta creates a table only
    where nothing is (no directory, or an empty one)."""
    jvm: Any = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(location)
    path.getFileSystem(spark._jsc.hadoopConfiguration()).delete(path, True)  # type: ignore[attr-defined]
    jvm.org.apache.spark.sql.delta.DeltaLog.invalidateCache(spark._jsparkSession, path)  # type: ignore[attr-defined]


#: What a Delta table's directory holds: its log, data files and deletion vectors (and their checksums).
_DELTA_FILE = re.compile(r"(\.?part-.*\.parquet|\.?deletion_vector_.*\.bin)(\.crc)?")


def _clear_leftover(spark: SparkSession, location: str) -> None:
    """Remove what a killed refresh left where no Delta table is, so the table can be created there.

    ``CREATE TABLE`` makes ``_delta_log`` before it commits, and :func:`_remove` deletes file by file: a
    run killed in between leaves a directory Delta refuses to create a table in (TABLE_OR_VIEW_ALREADY_EXISTS
    for an empty log), and every later refresh of the collection would fail. Only Delta's own files are
    removed: a location holding anything else is someone's data, named in the error."""
    jvm: Any = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(location)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())  # type: ignore[attr-defined]
    if not fs.exists(path):
        return
    files, foreign = fs.listFiles(path, True), []
    prefix = len(str(fs.makeQualified(path).toString()).rstrip("/")) + 1
    while files.hasNext():
        relative = str(files.next().getPath().toString())[prefix:]
        if not relative.startswith("_delta_log/") and not _DELTA_FILE.fullmatch(relative.rsplit("/", 1)[-1]):
            foreign.append(relative)
    if foreign:
        raise TableInputError(
            f"{location} is not a Delta table but holds other files ({', '.join(sorted(foreign)[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}): move them, or name the current_state table differently"
        )
    log.warning("%s: removing what an interrupted refresh left there (no Delta table was committed)", location)
    _remove(spark, location)


def _typing(kind: Kind) -> Kind:
    """``kind`` without what does not change how values convert (a decimal's integer digits)."""
    return replace(
        kind, digits=0, fields=tuple(replace(f, kind=_typing(f.kind)) for f in kind.fields),
        element=_typing(kind.element) if kind.element is not None else None,
    )


def _add_columns(spark: SparkSession, location: str, old: Shape, added: list[tuple[str, T.DataType]]) -> int:
    """ALTER TABLE … ADD COLUMNS for the ``added`` (path, type) columns (top level after the last user
    column, nested at the end); returns the commits made."""
    if not added:
        return 0
    top_level = [(p, t) for p, t in added if "." not in _unquoted_dots(p)]
    nested = [(p, t) for p, t in added if "." in _unquoted_dots(p)]
    user = [f.column for f in old.user_columns()]
    anchor = typed_columns.quote(user[-1]) if user else "`_id`"
    table = f"delta.{typed_columns.quote(location)}"
    for path, dtype in top_level:
        spark.sql(f"ALTER TABLE {table} ADD COLUMNS ({path} {_ddl(dtype)} AFTER {anchor})")
        anchor = path
    if nested:
        spark.sql(f"ALTER TABLE {table} ADD COLUMNS (" + ", ".join(f"{p} {_ddl(t)}" for p, t in nested) + ")")
    return len(top_level) + bool(nested)


def _paths(dtype: T.DataType, prefix: str) -> Iterator[tuple[str, T.DataType]]:
    """Every column path of a table's schema with its type, spelled as :func:`_added` spells them."""
    if isinstance(dtype, T.StructType):
        for f in dtype.fields:
            path = f"{prefix}{typed_columns.quote(f.name)}"
            yield path, f.dataType
            yield from _paths(f.dataType, path + ".")
    elif isinstance(dtype, T.ArrayType):
        yield from _paths(dtype.elementType, prefix + "element.")


def _unquoted_dots(path: str) -> str:
    """``path`` with quoted names removed, so a dot left in it separates nested fields."""
    out, quoted, i = [], False, 0
    while i < len(path):
        ch = path[i]
        if ch == "`":
            if quoted and path[i + 1:i + 2] == "`":
                i += 2
                continue
            quoted = not quoted
        elif not quoted:
            out.append(ch)
        i += 1
    return "".join(out)


def _rewrite(spark: SparkSession, namespace: str, location: str, layout: Layout, shape: Shape) -> None:
    """A type changed: convert every row's columns again from ``__doc``/``__key`` (the exact document)."""
    table = spark.read.format("delta").load(location)
    state: dict[str, Column] = {
        c: F.col(c) for c in ("__position", "__op", "__source_ts_ms", "__deleted") if c in table.columns
    }
    _replace(spark, location, table.select(*columns(shape, layout, namespace, F.col("__doc"), F.col("__key"), state)))


def _replace(spark: SparkSession, location: str, rows: DataFrame) -> None:
    """Write ``rows`` as the whole table, whatever its schema was.

    A new table is created with column mapping, deletion vectors and change data feed first, so the
    feed covers its first rows. Delta refuses a schema-replacing overwrite while the change data feed
    is on (with column mapping), so an existing table has the feed off for that one commit; a
    downstream feed reader resumes from the version after it.
    """
    table = f"delta.{typed_columns.quote(location)}"
    if not table_exists(spark, location):
        _clear_leftover(spark, location)
        properties = ", ".join(f"'{k}' = '{v}'" for k, v in _TABLE_OPTIONS.items())
        columns_ddl = ", ".join(f"{typed_columns.quote(f.name)} {_ddl(f.dataType)}" for f in rows.schema.fields)
        spark.sql(f"CREATE TABLE {table} ({columns_ddl}) USING delta TBLPROPERTIES ({properties})")
        rows.write.format("delta").mode("append").save(location)
        return
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false')")
    rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(location)
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")


def _apply(
    spark: SparkSession, location: str, layout: Layout, source: DataFrame, result: StateResult, state: Recording | None
) -> None:
    """One MERGE of the winners: newer events replace (or delete) rows, older ones change nothing. Its commit
    records ``state`` (when given)."""
    columns = [c for c in source.columns if not c.startswith("__merge_")]
    assignments: dict[str, str | Column] = {typed_columns.quote(c): F.col(f"s.{typed_columns.quote(c)}") for c in columns}
    newer = "(s.__position > t.__position OR (s.__position = t.__position AND s.__merge_op <> 'r'))"
    merge = DeltaTable.forPath(spark, location).alias("t").merge(source.alias("s"), "t.__key = s.__key")
    if layout.delete_handling == "drop":
        merge = (
            merge.whenMatchedDelete(condition=f"{newer} AND s.__merge_deleted")
            .whenMatchedUpdate(condition=f"{newer} AND NOT s.__merge_deleted", set=assignments)
            .whenNotMatchedInsert(condition="NOT s.__merge_deleted", values=assignments)
        )
    else:
        merge = merge.whenMatchedUpdate(condition=newer, set=assignments).whenNotMatchedInsert(values=assignments)
    # The MERGE reads its source twice (to find the rows it touches, then to write them). Delta copies a
    # source that is not a plain Delta scan first, in case it changes in between; ours is a local
    # checkpoint, which cannot, so the copy is skipped (about half a second of a 10k-change refresh).
    with _setting(spark, _MATERIALIZE_SOURCE, "none"), recording(spark, state):
        metrics = merge.execute().first()  # this MERGE's own figures (the history's latest may be another writer's)
    inserted, updated, deleted = (
        (int(metrics["num_inserted_rows"]), int(metrics["num_updated_rows"]), int(metrics["num_deleted_rows"]))
        if metrics is not None else (0, 0, 0)
    )  # fmt: skip
    result.upserted, result.deleted = inserted + updated, deleted
    result.inserted, result.removed = result.inserted + inserted, result.removed + deleted
    result.commits += 1
    if not (inserted or updated or deleted):  # Delta may skip the commit of a MERGE that changed nothing
        result.recount = True
    else:
        result.recorded = state is not None


def _drop_ghosts(spark: SparkSession, location: str, layout: Layout, snapshot: str, result: StateResult) -> None:
    """Rows older than the latest completed full snapshot, which did not read them: deleted, or marked.

    Rare (after a new full snapshot), and whether Delta commits a change of no rows is its own affair:
    the table is counted again afterwards."""
    result.recount = True
    if not table_exists(spark, location):
        return
    table = DeltaTable.forPath(spark, location)
    condition = F.col("__position") < F.lit(snapshot)
    if layout.delete_handling == "drop":
        table.delete(condition)
    else:
        schema = spark.read.format("delta").load(location).schema
        cleared: dict[str, str | Column] = {
            typed_columns.quote(f.name): F.lit(None).cast(f.dataType)
            for f in schema.fields if not f.name.startswith("__") and f.name != "_id"
        }
        cleared |= {"__doc": F.lit(None).cast("variant"), "__deleted": F.lit(True)}
        table.update(condition & ~F.col("__deleted"), cleared)
    metrics = table.history(1).select("operationMetrics").first()
    values = dict(metrics[0]) if metrics is not None and metrics[0] else {}
    result.deleted += int(values.get("numDeletedRows") or values.get("numUpdatedRows") or 0)


def read_current_state(spark: SparkSession, location: str) -> DataFrame:
    """The current_state table (raises when it does not exist yet)."""
    if not table_exists(spark, location):
        raise TableInputError(f"no current_state table at {location}: refresh it first")
    return spark.read.format("delta").load(location)
