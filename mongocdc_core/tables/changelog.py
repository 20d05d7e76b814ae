"""A collection's ``changelog`` Delta table: every change event once, with its position.

Rows come from landing-zone Parquet files (``mongocdc_core.sinks.parquet.LANDING_SCHEMA``) or from
Kafka records flattened into the same columns (``streaming.py``), so both paths write identical rows.
The table is append-only per event identity (``__key``, ``__position``, ``__op``): a re-delivered file or
record adds nothing, a re-written file adds only the events it did not hold before. It is
partitioned by ``__change_date`` (UTC date of the change), and its change data feed tells
``current_state`` which rows arrived since it last ran.

Which landing files were read (path and version) is kept in a small manifest Delta table inside the
changelog directory (``_mongocdc_landing``, ignored by Delta readers and VACUUM), so a refresh opens
only new or re-written files. The manifest also decides when a full snapshot is complete (see
:func:`snapshot_part` for the file names that count).

What a refresh knows of the table (its highest position, row count, the landing files it was given; for
current_state its shape and changelog version) goes with the refresh's own commit, in the commit's
``userMetadata`` (:class:`Recording`): one commit per refresh, read back from the log without a Spark job
(:func:`look`). Tables written before kept it in table properties, which are read as before.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import re
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from delta.tables import DeltaTable
from py4j.protocol import Py4JJavaError
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mongocdc_core.tables import typed_columns

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
    ("__key", T.StringType(), "key.id: the document key's exact Extended JSON (identity of the document)"),
    ("_id", T.StringType(), "key.id as a user reads it: a string, an ObjectId's hex, a number's digits"),
    ("__op", T.StringType(), "op: c, u, d or r"),
    ("__position", T.StringType(), "clusterTime seconds.increment.ordinal (ordinal: place in a transaction)"),
    ("__ts_ms", T.LongType(), "ts_ms"),
    ("__source_ts_ms", T.LongType(), "source.ts_ms"),
    ("before", T.StringType(), "before (pre-image, when the capture mode provides it)"),
    ("after", T.StringType(), "after"),
    ("updated_fields", T.StringType(), "updateDescription.updatedFields"),
    ("removed_fields", T.ArrayType(T.StringType()), "updateDescription.removedFields"),
    ("truncated_arrays", T.StringType(), "updateDescription.truncatedArrays"),
    ("snapshot", T.StringType(), "source.snapshot"),
    ("source", T.StringType(), "source (JSON)"),
    ("transaction_id", T.StringType(), "transaction.id"),
    ("topic", T.StringType(), "the Kafka topic of the record"),
    ("__collection", T.StringType(), "source.db + '.' + source.collection"),
    ("__origin", T.StringType(), "landing file, or kafka:<topic>:<partition>"),
    ("__ingested_at", T.TimestampType(), "time the row was written"),
    ("__change_date", T.DateType(), "UTC date of the change's cluster time (partition column)"),
)
CHANGELOG_SCHEMA = T.StructType([T.StructField(name, dtype) for name, dtype, _ in CHANGELOG_COLUMNS])
EVENT_IDENTITY = ["__key", "__position", "__op"]
PARTITION_COLUMN = "__change_date"
DATA_OPS = ("c", "u", "d", "r")

POSITION_PROPERTY = "mongocdc.position"
COLLECTION_PROPERTY = "mongocdc.source.collection"
SNAPSHOT_PROPERTY = "mongocdc.snapshot.position"
#: A digest of every landing file (path and version) the last refresh was given: the same files again
#: (and the table still at the version that refresh left) mean nothing new, decided without a Spark job.
LANDING_PROPERTY = "mongocdc.landing.digest"
#: The table's row count and the version it describes: a refresh adds what it changed instead of counting
#: the table again (and one that adds nothing reports it uncounted), as long as no other writer committed.
ROWS_PROPERTY = "mongocdc.rows"
ROWS_VERSION_PROPERTY = "mongocdc.rows.version"
#: The rows the append that recorded the state added (told by its commit's metrics, as :func:`look` reports it):
#: how busy the collection was at its latest refresh that found something, when the current one finds nothing.
APPENDED_PROPERTY = "mongocdc.rows.appended"
MANIFEST_DIR = "_mongocdc_landing"
#: The member of a commit's ``userMetadata`` JSON holding the state a refresh recorded (:class:`Recording`).
STATE_KEY = "mongocdc.state"
#: Delta's session setting for the ``userMetadata`` of the commits that take no write option (MERGE, ALTER).
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
#: Delta writes a checkpoint of a table's log every ``delta.checkpointInterval`` commits (its default 10)
#: in the commit that reaches it. A refresh makes one commit (its state goes with its data, :class:`Recording`),
#: so at 100 a checkpoint falls on every hundredth refresh of a table, and a reader opening the table
#: replays at most 99 small commit files. Set on every table mongocdc writes.
LOG_OPTIONS = {"delta.checkpointInterval": "100"}
#: Refreshes of up to this many bytes run interpreted (:func:`interpreted`).
INTERPRETED_BYTES = 1024 * 1024
_INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}
_SMALL_FILE_BYTES = 16 * 1024  # below this a landing file's footer says whether it holds a row at all
_MANIFEST_SCHEMA = T.StructType(
    [
        T.StructField("path", T.StringType()),
        T.StructField("version", T.StringType()),
        T.StructField("plan", T.StringType()),
        T.StructField("part", T.IntegerType()),
        T.StructField("parts", T.IntegerType()),
        T.StructField("position", T.StringType()),
        T.StructField("read_at", T.TimestampType()),
    ]
)
_SINGLE_SNAPSHOT = re.compile(r"(?:^|/)snapshot/(?P<ns>[^/]+)/snapshot\.parquet$")
_RANGE_SNAPSHOT = re.compile(r"(?:^|/)snapshot/(?P<ns>[^/]+)/ranges-(?P<plan>[^/]+)/(?:range-)?0*(?P<i>\d+)-of-0*(?P<n>\d+)\.parquet$")


class TableInputError(ValueError):
    """Input the tables cannot use: a missing landing file, a table that is not there yet, bad options."""


@dataclass(frozen=True)
class Appended:
    """What one append to a changelog did. ``max_position``: the highest position of the rows it was
    given, each of which the table now holds (appended, or found there: a replay appends nothing, yet
    the table holds its events)."""

    rows: int
    counts: dict[str, int]
    max_position: str | None


def table_exists(spark: SparkSession, location: str) -> bool:
    """Whether a Delta table exists at ``location``."""
    return bool(DeltaTable.isDeltaTable(spark, location))


@dataclass(frozen=True)
class TableLook:
    """What one look at a Delta table's log tells: its version (-1: no table there), its properties (the
    state its last refresh recorded among them), its size in bytes, its schema (Delta's JSON, empty
    without a table) and the version of its latest commit that may have changed rows (earlier than
    ``version`` when only maintenance, OPTIMIZE or VACUUM, followed the last refresh)."""

    version: int
    properties: dict[str, str]
    size_bytes: int
    schema_json: str = ""
    changed_at: int = -1

    @property
    def schema(self) -> T.StructType:
        """The table's schema as its log records it (no Spark job; empty without a table)."""
        return T.StructType.fromJson(json.loads(self.schema_json)) if self.schema_json else T.StructType()

    @property
    def recorded_rows(self) -> int | None:
        """The row count the recorded state holds, when it describes this version (None otherwise: another
        writer committed since, or none was recorded)."""
        rows, at = self.properties.get(ROWS_PROPERTY), self.properties.get(ROWS_VERSION_PROPERTY)
        return int(rows) if rows is not None and at == str(self.version) else None


def look(spark: SparkSession, location: str, *, recorded: bool = True) -> TableLook:
    """The table at ``location`` as its Delta log describes it now; its properties include the state its
    last refresh recorded in its commit (:func:`recorded_state`; ``recorded=False``: the table's own only).

    Read from the log's latest snapshot (milliseconds once the log is cached) and that commit's file (once
    per version), not through ``DESCRIBE HISTORY``, ``SHOW TBLPROPERTIES`` or ``DESCRIBE DETAIL``, each of
    which runs a Spark job (0.1–2 s, paid several times per refresh). The size comes from the commit's
    checksum file, which Delta writes with every commit; only a table written without one is summed file
    by file. The properties are those stored on the table (not the protocol's ``delta.minReaderVersion``
    and the like, which ``SHOW TBLPROPERTIES`` adds).
    """
    jvm: Any = spark._jvm
    none = jvm.scala.Option.empty()
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location)  # type: ignore[attr-defined]
    snapshot = log.update(False, none, none)
    version = int(snapshot.version())
    if version < 0:
        return TableLook(-1, {}, 0)
    metadata = snapshot.metadata()
    configuration = jvm.scala.jdk.javaapi.CollectionConverters.asJava(metadata.configuration())
    checksum = snapshot.checksumOpt()
    size = checksum.get().tableSizeBytes() if checksum.isDefined() else snapshot.sizeInBytes()
    properties = {str(k): str(v) for k, v in configuration.items()}
    changed_at = version
    if recorded:
        state, changed_at = _found_state(spark, log, str(metadata.id()), version)
        if state is not None:  # recorded in a commit: it, not what an older mongocdc left in the properties
            kept = {k: v for k, v in properties.items() if k not in (ROWS_PROPERTY, ROWS_VERSION_PROPERTY)}
            properties = kept | state
    return TableLook(version, properties, int(size), str(metadata.schemaString()), changed_at)


@dataclass(frozen=True)
class Recording:
    """The state a refresh records with its table: carried by its (last) commit as the commit's
    ``userMetadata`` (JSON), so a refresh makes one commit, not its data and then its properties.

    ``properties``: the state, named as table properties (what :func:`look` reports); ``rows``: the
    table's row count at version ``rows_at``, to which the reader adds what the carrying commit's own
    metrics say it inserted and deleted (known only once it is written; valid only when that commit is
    ``rows_at + 1``: no other writer in between); ``highest``: a column whose highest value among the
    rows the commit adds raises ``mongocdc.position`` (read from the commit's file statistics)."""

    properties: dict[str, str]
    rows: int | None = None
    rows_at: int = -1
    highest: str | None = None

    def to_json(self) -> str:
        state: dict[str, object] = {"properties": self.properties}
        if self.rows is not None:
            state |= {"rows": self.rows, "rows_at": self.rows_at}
        if self.highest is not None:
            state["highest"] = self.highest
        return json.dumps({STATE_KEY: state}, separators=(",", ":"), sort_keys=True)


#: Commits read back from the latest at most to find the state (past OPTIMIZE, VACUUM, a user's ALTER).
_STATE_SEARCH = 20
_STATE_CACHE: dict[tuple[str, int], tuple[dict[str, str] | None, int]] = {}  # (table id, version)
_STATE_CACHE_SIZE = 4096
#: Operations that change no row: the row count recorded before them still holds after them (maintenance
#: between two refreshes leaves a quiet refresh free).
_ROWLESS = frozenset({
    "SET TBLPROPERTIES", "UNSET TBLPROPERTIES", "ADD COLUMNS", "CREATE TABLE", "OPTIMIZE", "VACUUM START", "VACUUM END",
})
#: Delta truncates string statistics longer than this (``dataSkippingStringPrefixLength``): not a maximum then.
_STATS_PREFIX = 32


def recorded_state(commit: str, version: int) -> dict[str, str] | None:
    """The state recorded in one commit file's text (the JSON actions of ``version``): the
    :class:`Recording`'s properties with ``mongocdc.rows`` and ``mongocdc.rows.version`` where the
    commit tells them; ``{}`` for a commit of an older mongocdc, which set its state as table
    properties (they hold it then); None for a commit that records none (look further back)."""
    return _state_of(*_actions(commit), version)


def _actions(commit: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A commit file's ``commitInfo`` and ``add`` actions."""
    info: dict[str, Any] = {}
    adds: list[dict[str, Any]] = []
    for line in commit.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "commitInfo" in action:
            info = action["commitInfo"]
        elif "add" in action:
            adds.append(action["add"])
    return info, adds


def _state_of(info: dict[str, Any], adds: list[dict[str, Any]], version: int) -> dict[str, str] | None:
    """:func:`recorded_state` of a commit's ``commitInfo`` and ``add`` actions."""
    operation = str(info.get("operation", ""))
    try:
        state = json.loads(info.get("userMetadata") or "null")
    except ValueError:
        state = None
    if not isinstance(state, dict) or not isinstance(state.get(STATE_KEY), dict):
        parameters = info.get("operationParameters") or {}
        set_by_older = operation == "SET TBLPROPERTIES" and "mongocdc." in str(parameters.get("properties"))
        return {} if set_by_older else None
    state = state[STATE_KEY]
    properties = {str(k): str(v) for k, v in dict(state.get("properties") or {}).items()}
    column = state.get("highest")
    if column is not None:
        values = [_stat_max(a, str(column)) for a in adds]
        if any(v is None for v in values):  # the statistics cannot tell: neither position nor rows is known
            return {k: v for k, v in properties.items() if k != POSITION_PROPERTY}
        found = max(filter(None, [properties.get(POSITION_PROPERTY), *values]), default=None)
        if found is not None:
            properties[POSITION_PROPERTY] = found
    rows = _rows_after(state, info, version)
    if rows is not None:
        properties |= {ROWS_PROPERTY: str(rows), ROWS_VERSION_PROPERTY: str(version)}
    metrics = info.get("operationMetrics") or {}
    mode = str((info.get("operationParameters") or {}).get("mode"))
    if operation in ("WRITE", "STREAMING UPDATE") and mode != "Overwrite" and "numOutputRows" in metrics:
        properties[APPENDED_PROPERTY] = str(int(metrics["numOutputRows"]))
    return properties


def _stat_max(add: dict[str, Any], column: str) -> str | None:
    """The highest value of ``column`` in one added file, from its statistics ("" for a file without
    rows; None when they cannot tell)."""
    try:
        stats = json.loads(add.get("stats") or "null")
    except ValueError:
        return None
    if not isinstance(stats, dict):
        return None
    if stats.get("numRecords") == 0:
        return ""
    value = (stats.get("maxValues") or {}).get(column)
    return value if isinstance(value, str) and len(value) < _STATS_PREFIX else None


def _rows_after(state: dict[str, Any], info: dict[str, Any], version: int) -> int | None:
    """The table's row count after the commit carrying ``state`` (None when it cannot be told)."""
    operation = str(info.get("operation", ""))
    metrics = info.get("operationMetrics") or {}
    if operation == "WRITE" and str((info.get("operationParameters") or {}).get("mode")) == "Overwrite":
        return int(metrics["numOutputRows"]) if "numOutputRows" in metrics else None
    if state.get("rows") is None or state.get("rows_at") != version - 1:
        return None  # not recorded, or another writer committed in between
    rows = int(state["rows"])
    if operation in _ROWLESS:
        return rows
    if operation in ("WRITE", "STREAMING UPDATE") and "numOutputRows" in metrics:
        return rows + int(metrics["numOutputRows"])
    if operation == "MERGE" and "numTargetRowsInserted" in metrics:
        return rows + int(metrics["numTargetRowsInserted"]) - int(metrics.get("numTargetRowsDeleted") or 0)
    return None


def _found_state(spark: SparkSession, log: Any, table_id: str, version: int) -> tuple[dict[str, str] | None, int]:
    """The state recorded in the latest commit up to ``version`` that records one (None: none found
    within :data:`_STATE_SEARCH` commits, or an older mongocdc's commit first: the properties tell), and
    the version of the latest commit that may have changed rows (that commit's, when only commits that
    change none follow it). Kept per table (its id: a table created again at the same place is another)
    and version."""
    key = (table_id, version)
    if key in _STATE_CACHE:
        return _STATE_CACHE[key]
    jvm: Any = spark._jvm
    found: dict[str, str] | None = None
    changed_at = version
    rowless = True  # every commit after the one found changed no row
    for at in range(version, max(-1, version - _STATE_SEARCH), -1):
        path = jvm.org.apache.hadoop.fs.Path(log.logPath(), f"{at:020d}.json")
        try:
            lines = jvm.scala.jdk.javaapi.CollectionConverters.asJava(log.store().read(path, log.newDeltaHadoopConf()))
        except Py4JJavaError:  # the commit file was cleaned up (or never written): nothing older to find
            break
        info, adds = _actions(str(jvm.java.lang.String.join("\n", lines)))
        state = _state_of(info, adds, at)
        if state is not None:
            found = state or None
            if rowless:
                changed_at = at
                if found is not None and found.get(ROWS_VERSION_PROPERTY) == str(at):
                    found[ROWS_VERSION_PROPERTY] = str(version)
            break
        rowless = rowless and info.get("operation") in _ROWLESS
    if len(_STATE_CACHE) >= _STATE_CACHE_SIZE:
        _STATE_CACHE.clear()
    _STATE_CACHE[key] = found, changed_at
    return found, changed_at


def size_at(spark: SparkSession, location: str, version: int) -> int | None:
    """The table's size in bytes at ``version``, from that commit's checksum file (no Spark job); None
    when the log keeps no checksum for it (written without one, or cleaned up since)."""
    jvm: Any = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location)  # type: ignore[attr-defined]
    checksum = log.readChecksum(version, jvm.scala.Option.empty())
    return int(checksum.get().tableSizeBytes()) if checksum.isDefined() else None


def table_properties(spark: SparkSession, location: str) -> dict[str, str]:
    """The Delta table properties at ``location`` (empty when there is no table)."""
    return look(spark, location).properties


def set_properties(spark: SparkSession, location: str, properties: dict[str, str]) -> None:
    """Set ``properties`` on the table (one Delta commit)."""
    if not properties:
        return
    assignments = ", ".join(f"{_sql_string(k)} = {_sql_string(v)}" for k, v in sorted(properties.items()))
    spark.sql(f"ALTER TABLE delta.{typed_columns.quote(location)} SET TBLPROPERTIES ({assignments})")


@contextmanager
def setting(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """The session's ``key`` set to ``value`` for the block, then as the session had it (unset included)."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


@contextmanager
def interpreted(spark: SparkSession, nbytes: int) -> Iterator[None]:
    """For the block, when ``nbytes`` (the data it reads and writes) is at most :data:`INTERPRETED_BYTES`:
    Spark evaluates expressions without generating and compiling Java code for them (whole-stage code
    generation off; ``spark.sql.codegen.factoryMode``, Spark's internal choice for projections and predicates,
    set to interpret them).

    A one-change refresh of a small table compiled 69 classes, its plans' code of the table's own shape, which
    a fresh JVM (every Dagster run's) holds none of and Spark's cache of compiled classes soon drops: about a
    quarter of the refresh's time. For a few thousand rows, interpreting costs less than compiling."""
    with settings(spark, _INTERPRETED if nbytes <= INTERPRETED_BYTES else {}):
        yield


@contextmanager
def settings(spark: SparkSession, values: dict[str, str]) -> Iterator[None]:
    """:func:`setting` of each of ``values`` for the block."""
    with ExitStack() as stack:
        for key, value in values.items():
            stack.enter_context(setting(spark, key, value))
        yield


_SESSION_LOCKS: weakref.WeakKeyDictionary[SparkSession, threading.Lock] = weakref.WeakKeyDictionary()
_SESSION_LOCKS_LOCK = threading.Lock()


@contextmanager
def recording(spark: SparkSession, state: Recording | None) -> Iterator[None]:
    """The Delta commits made in the block (a MERGE, an ALTER TABLE: those that take no write option)
    carry ``state`` (nothing when None), through the session's ``userMetadata`` setting.

    The setting is the session's: refreshes of other tables running in other threads of the same session
    would carry it too, so one block at a time holds it per session (``collection.concurrently`` gives
    each refresh a session of its own: there they never wait)."""
    if state is None:
        yield
        return
    with _SESSION_LOCKS_LOCK:
        lock = _SESSION_LOCKS.setdefault(spark, threading.Lock())
    with lock, setting(spark, USER_METADATA_CONF, state.to_json()):
        yield


def record(spark: SparkSession, location: str, state: Recording) -> None:
    """Record ``state`` in a commit of its own: for a refresh that wrote nothing, or whose last commit could
    not carry it (a full build, rows dropped after a new snapshot). The commit also sets
    :data:`LOG_OPTIONS` (tables built before they were set get them here)."""
    with recording(spark, state):
        set_properties(spark, location, LOG_OPTIONS)


def changelog_state(
    namespace: str, before: TableLook, *, rows: int, highest: str | None, landing: str, snapshot_position: str | None = None
) -> Recording:
    """The state a changelog refresh records (its append's commit raises the position to the highest it
    appends, :func:`append_events`): the source collection, the highest position (``highest``: the table's,
    where a writer counted it, :func:`held`), the latest full snapshot, the digest of the landing files it
    was given (:func:`landing_digest`; ``""`` from a writer of other rows, the stream, so the landing
    shortcuts cannot take its commit for the last landing refresh's) and ``rows``, the table's row count
    at version ``before.version``."""
    properties = {COLLECTION_PROPERTY: namespace, LANDING_PROPERTY: landing}
    position = max(filter(None, [before.properties.get(POSITION_PROPERTY), highest]), default=None)
    snapshot = snapshot_position or before.properties.get(SNAPSHOT_PROPERTY)
    properties |= {POSITION_PROPERTY: position} if position is not None else {}
    properties |= {SNAPSHOT_PROPERTY: snapshot} if snapshot is not None else {}
    return Recording(properties, rows, before.version)


def append_recorded(
    spark: SparkSession, location: str, namespace: str, rows: DataFrame, before: TableLook, state: Recording, *,
    unique: bool = False, new: bool = False,
) -> tuple[Appended, TableLook]:
    """:func:`append_events` whose commit records ``state``, and the table after it. When no commit was
    made (nothing to append) or the table lacks :data:`LOG_OPTIONS`, :func:`record` makes one."""
    appended = append_events(spark, location, namespace, rows, unique=unique, new=new, state=state)
    after = look(spark, location)
    if after.version == before.version or any(after.properties.get(k) != v for k, v in LOG_OPTIONS.items()):
        position = max(filter(None, [state.properties.get(POSITION_PROPERTY), appended.max_position]), default=None)
        extra = {POSITION_PROPERTY: position} if position is not None else {}
        record(spark, location, replace(state, properties=state.properties | extra, rows=after.recorded_rows
                                        if after.version > before.version else state.rows, rows_at=after.version))
        after = look(spark, location)
    return appended, after


def latest_version(spark: SparkSession, location: str) -> int:
    """The table's latest committed version (-1 when there is no table)."""
    return look(spark, location, recorded=False).version


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --------------------------------------------------------------------------- landing files


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
            files.extend(
                str(p.resolve()) for p in sorted(path.rglob("*.parquet"))
                if not any(part.startswith((".", "_")) for part in p.relative_to(path).parts)
            )
        elif path.is_file():
            files.append(str(path.resolve()))
        else:
            raise TableInputError(f"landing-zone path does not exist: {text}")
    return list(dict.fromkeys(files))


def landing_by_collection(paths: Sequence[str | os.PathLike[str]]) -> dict[str, list[str]]:
    """The landing files of ``paths`` (as :func:`landing_files` finds them) per collection they hold rows of.

    Read from each file's footer (the ``collection`` column's statistics) where one collection fills the
    file, as every file the sinks write does; otherwise from the column itself. Local files only.
    """
    import pyarrow.parquet as pq

    found: dict[str, list[str]] = {}
    for path in landing_files(paths):
        meta = pq.ParquetFile(path).metadata
        names: set[str] = set()
        index = meta.schema.names.index("collection") if "collection" in meta.schema.names else -1
        if index < 0:
            raise TableInputError(f"{path} is not a landing file (it has no 'collection' column)")
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(index).statistics
            if stats is None or not stats.has_min_max or stats.min != stats.max or stats.null_count:
                names = {v for v in pq.read_table(path, columns=["collection"])["collection"].to_pylist() if v}
                break
            names.add(stats.min if isinstance(stats.min, str) else bytes(stats.min).decode())
        for name in names:
            found.setdefault(name, []).append(path)
    return found


def file_version(spark: SparkSession, path: str) -> str:
    """Size and modification time of a file (a re-written file gets a new version)."""
    if "://" not in path:
        stat = os.stat(path)
        return f"{stat.st_size}:{stat.st_mtime_ns}"
    jvm: Any = spark._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    status = hadoop_path.getFileSystem(spark._jsc.hadoopConfiguration()).getFileStatus(hadoop_path)  # type: ignore[attr-defined]
    return f"{status.getLen()}:{status.getModificationTime()}"


def version_bytes(version: str) -> int:
    """The size in bytes of a file version from :func:`file_version`."""
    return int(version.split(":", 1)[0])


def holds_events(path: str, namespace: str) -> bool:
    """Whether a landing file may hold events: not a local file that holds no row (every quiet collection
    gets one per window), unless it is part of a full snapshot (an empty range still counts as read).
    Only small files' footers are read: an empty landing file is a few kilobytes."""
    if "://" in path or snapshot_part(path, namespace) is not None or os.stat(path).st_size > _SMALL_FILE_BYTES:
        return True
    return bool(pq.read_metadata(path).num_rows)


def landed_rows(path: str) -> int | None:
    """The rows a local landing file holds (its Parquet footer; a file of several collections counts theirs
    too), or None for a file behind a URI (not read here)."""
    return None if "://" in path else int(pq.read_metadata(path).num_rows)


def landing_digest(versions: dict[str, str]) -> str:
    """A digest of landing files and their versions (:func:`file_version`), whatever their order."""
    text = "\n".join(f"{path}\t{version}" for path, version in sorted(versions.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def snapshot_part(path: str, namespace: str) -> tuple[str, int, int] | None:
    """``(plan, part, parts)`` when ``path`` is (part of) a full snapshot of ``namespace``, else None.

    ``…/snapshot/<ns>/snapshot.parquet`` is a whole snapshot (plan ``""``, part 1 of 1);
    ``…/snapshot/<ns>/ranges-<plan>/[range-]<i>-of-<n>.parquet`` is range ``i`` of ``n`` of one plan
    (the Dagster range assets write ``range-<iiiii>-of-<nnnnn>.parquet``).
    """
    normalized = path.replace("\\", "/")
    single = _SINGLE_SNAPSHOT.search(normalized)
    if single is not None:
        return ("", 1, 1) if single["ns"] == namespace else None
    ranged = _RANGE_SNAPSHOT.search(normalized)
    if ranged is not None and ranged["ns"] == namespace:
        return (f"{ranged['ns']}/ranges-{ranged['plan']}", int(ranged["i"]), int(ranged["n"]))
    return None


def _same_file(spark_path: str, given: str) -> bool:
    """Whether Spark's ``_metadata.file_path`` names the given landing file."""
    def plain(text: str) -> str:
        if text.startswith("file:"):
            text = "/" + text[len("file:"):].lstrip("/")
        return text
    return plain(spark_path) == plain(given)


# --------------------------------------------------------------------------- rows


def position_seconds(position: Column) -> Column:
    """The cluster-time seconds of a position string (``seconds.increment.ordinal``)."""
    return F.substring_index(position, ".", 1).cast("bigint")


def changelog_rows(landing: DataFrame, origin: Column, namespace: str | None = None) -> DataFrame:
    """Landing-zone rows -> changelog rows: data events only (no tombstones, heartbeats, BEGIN/END)."""
    data = landing.where(
        F.col("collection").isNotNull() & F.col("op").isin(*DATA_OPS) & F.col("key").isNotNull()
        & F.col("position").isNotNull()
    )
    if namespace is not None:
        data = data.where(F.col("collection") == namespace)
    key = _key_id(F.col("key"))
    derived: dict[str, Column] = {
        "__key": key,
        "_id": typed_columns.key_text(key),
        "__op": F.col("op"),
        "__position": F.col("position"),
        "__ts_ms": F.col("ts_ms"),
        "__source_ts_ms": _source_ts_ms(F.col("source")),
        "transaction_id": _transaction_id(F.col("value")),
        "__collection": F.col("collection"),
        "__origin": origin,
        "__ingested_at": F.current_timestamp(),
        "__change_date": F.to_date(F.timestamp_seconds(position_seconds(F.col("position")))),
    }
    return data.select(
        *[(derived[name] if name in derived else F.col(name)).cast(dtype).alias(name) for name, dtype, _ in CHANGELOG_COLUMNS]
    )


# The three members below are read with JSONPath (``get_json_object``) where a plain text search cannot
# be sure; for the texts the connector writes it can, at a fraction of the cost (they were two thirds
# of the time spent deriving changelog rows).


def _key_id(key: Column) -> Column:
    """``key.id``. A key written as ``{"id":"…"}`` whose string has no escape but ``\\"`` (numbers,
    ObjectIds, plain strings) is cut out of the text; every other spelling is parsed."""
    inner = F.substring(key, F.lit(8), F.length(key) - 9)
    rest = F.replace(inner, F.lit('\\"'), F.lit(""))
    plain = (
        key.startswith('{"id":"') & key.endswith('"}') & (F.length(key) >= 9)
        & ~rest.contains('"') & ~rest.contains("\\")
    )
    return F.when(plain, F.replace(inner, F.lit('\\"'), F.lit('"'))).otherwise(F.get_json_object(key, "$.id"))


_SOURCE_TS_MS = r',"ts_ms":(-?[0-9]+)[,}]'


def _source_ts_ms(source: Column) -> Column:
    """``source.ts_ms``. In a flat object (one ``{``, the first byte: the connector's ``source``) a
    ``,"ts_ms":`` can only start a member (quotes inside strings are escaped), so a regular expression
    finds it; a nested or unusual block (spaces, ``ts_ms`` first) is parsed. The expression starts
    with its literal text, which Java's engine finds with a skip search (a leading character class
    made it try every offset), and the braces are counted in bytes: testing flatness with a
    substring measured in characters cost 2 s per million blocks of the connector's size."""
    flat = source.startswith("{") & (
        F.octet_length(F.replace(source, F.lit("{"), F.lit(""))) == F.octet_length(source) - 1
    )
    found = F.regexp_extract(source, _SOURCE_TS_MS, 1)
    return F.when(flat & (found != ""), found).otherwise(F.get_json_object(source, "$.ts_ms"))


def _transaction_id(value: Column) -> Column:
    """``transaction.id``: NULL without parsing when no ``"transaction"`` member holds an object (an
    event outside a transaction, ``"transaction":null``); parsed otherwise. The connector's payload
    ends with its ``"transaction":null}`` outside a transaction: a member of the outermost object,
    tested in bytes at the end, before the expression searches the whole text (a third of the cost)."""
    return F.when(value.endswith('"transaction":null}'), F.lit(None)).when(
        value.rlike(r'"transaction"\s*:\s*\{'), F.get_json_object(value, "$.transaction.id")
    )


def read_changelog(spark: SparkSession, location: str) -> DataFrame:
    """The changelog table (empty with the right schema when it does not exist yet)."""
    if not table_exists(spark, location):
        return spark.createDataFrame([], CHANGELOG_SCHEMA)
    return spark.read.format("delta").load(location)


def _span(path: str) -> tuple[str, str, bool, bool] | None:
    """(lowest position, highest position, has reads, may have other rows) of a local landing file, from
    its Parquet footer statistics (None when they cannot tell; an ``op`` that is NULL somewhere counts as
    other rows). A refresh asks this of each new file several times: the footer is read once per version
    of the file."""
    if "://" in path:
        return None
    stat = os.stat(path)
    return _footer_span(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4096)
def _footer_span(path: str, mtime_ns: int, size: int) -> tuple[str, str, bool, bool] | None:
    """:func:`_span` of one version of the file (``mtime_ns`` and ``size`` tell a rewritten file apart)."""
    meta = pq.read_metadata(path)
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    bounds: dict[str, tuple[str, str]] = {}
    op_nulls = False
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if group.num_rows == 0:
            continue
        for name in ("position", "op", "snapshot"):
            stats = group.column(names.index(name)).statistics if name in names else None
            if stats is None:
                return None
            op_nulls = op_nulls or (name == "op" and bool(stats.null_count))
            if not stats.has_min_max:
                if stats.null_count != group.num_rows:
                    return None
                continue
            low, high = bounds.get(name, (_text(stats.min), _text(stats.max)))
            bounds[name] = (min(low, _text(stats.min)), max(high, _text(stats.max)))
    if "position" not in bounds:
        return ("", "", False, False)  # no rows with a position
    snapshot, op = bounds.get("snapshot"), bounds.get("op")
    reads = snapshot is not None and snapshot != ("false", "false")
    changes = op_nulls or (op is not None and op != ("r", "r"))
    return (*bounds["position"], reads, changes)


def may_repeat(files: Sequence[str]) -> bool:
    """Whether two of ``files`` can hold the same event. An event's identity includes its op, so a read
    can only repeat a read and a change a change; files whose positions do not overlap cannot share one
    (the usual case: a snapshot, then slices of disjoint windows)."""
    if len(files) < 2:
        return False
    spans = [_span(f) for f in files]
    known = [s for s in spans if s is not None]
    if len(known) < len(spans):
        return True
    for kind in (2, 3):  # reads, changes
        ranges = sorted((s[0], s[1]) for s in known if s[kind] and s[0])
        for (_, high), (low, _) in zip(ranges, ranges[1:], strict=False):
            if low <= high:
                return True
    return False


def append_events(
    spark: SparkSession, location: str, namespace: str, rows: DataFrame, *, unique: bool = False, new: bool = False,
    state: Recording | None = None,
) -> Appended:
    """Append the events of ``rows`` the changelog does not hold yet (by ``__key, __position, __op``).
    ``unique``: the caller knows ``rows`` holds each event once (no deduplication among them); ``new``:
    the caller knows the changelog holds none of them (no look at the table's events). ``state``: what the
    append's commit records, its position raised to the highest of ``rows`` (known before the write where
    the batch's bounds are looked up, else read by :func:`recorded_state` from the commit's statistics)."""
    exists = table_exists(spark, location)
    bounds = None
    if exists and not new:  # the positions and dates the batch spans (the same before and after deduplication)
        rows = rows.localCheckpoint()
        bounds = rows.agg(
            F.min("__position").alias("lo"), F.max("__position").alias("hi"),
            F.collect_set(PARTITION_COLUMN).alias("dates"),
        ).first()
        assert bounds is not None
        if bounds["lo"] is None:
            return Appended(0, {}, None)
    if not unique and _repeats(rows):
        rows = rows.dropDuplicates(EVENT_IDENTITY)
    if bounds is not None:
        existing = (
            spark.read.format("delta").load(location)
            .where(F.col(PARTITION_COLUMN).isin(list(bounds["dates"])))
            .where(F.col("__position").between(bounds["lo"], bounds["hi"]))
            .select(*EVENT_IDENTITY)
        )
        rows = rows.join(existing, EVENT_IDENTITY, "left_anti")
    observation = Observation(f"changelog-{id(rows)}")
    observed = rows.observe(
        observation,
        F.count(F.lit(1)).alias("rows"),
        F.max("__position").alias("max_position"),
        *[F.count(F.when(F.col("__op") == op, 1)).alias(f"op_{op}") for op in DATA_OPS],
    )
    writer = observed.write.format("delta").mode("append").partitionBy(PARTITION_COLUMN)
    if state is not None:
        if bounds is not None:
            position = max(filter(None, [state.properties.get(POSITION_PROPERTY), bounds["hi"]]))
            state = replace(state, properties=state.properties | {POSITION_PROPERTY: position})
        else:
            state = replace(state, highest="__position")
        writer = writer.option("userMetadata", state.to_json())
    if not exists:
        writer = writer.option("delta.enableChangeDataFeed", "true").options(**LOG_OPTIONS)
    writer.save(location)
    metrics = observation.get
    counts = {op: int(metrics[f"op_{op}"]) for op in DATA_OPS if metrics.get(f"op_{op}")}
    highest = bounds["hi"] if bounds is not None else metrics.get("max_position")  # given, not only appended
    return Appended(int(metrics.get("rows") or 0), counts, highest)


def held(spark: SparkSession, location: str) -> tuple[int, str | None]:
    """The table's row count and highest position, read from the table (one Spark job): for a writer
    whose look found the recorded state not describing the table's version (another writer appended
    since, or the state could not tell), so the position it records covers those rows too."""
    found = spark.read.format("delta").load(location).agg(F.count(F.lit(1)), F.max("__position")).first()
    assert found is not None
    return int(found[0]), found[1]


def later_than(files: Sequence[str], position: str | None) -> bool:
    """Whether every event of ``files`` is later than ``position``, by their Parquet footers (no Spark job;
    False when a footer cannot tell). Given a table's highest position, the table holds none of them."""
    if position is None or not files:
        return False
    spans = [_span(f) for f in files]
    return all(span is not None and span[0] > position for span in spans)


def _repeats(rows: DataFrame) -> bool:
    """Whether an event occurs more than once in ``rows``. Files whose positions overlap (the ranges
    of one snapshot share its position) rarely hold one event twice; counting the identities shuffles
    three short columns, where removing duplicates would shuffle every event with its documents; and
    a 64-bit hash of them stands for the three (a collision only costs the deduplication)."""
    identity = F.xxhash64(*EVENT_IDENTITY).alias("identity")
    return bool(rows.groupBy(identity).count().where(F.col("count") > 1).limit(1).collect())


# --------------------------------------------------------------------------- manifest and refresh


@dataclass(frozen=True)
class ChangelogResult:
    files_read: int
    appended: Appended
    position: str | None
    snapshot_position: str | None
    row_count: int
    schema: T.StructType
    latest_append: int = 0  # rows of the table's latest append: this refresh's, or where it added none, the one before


def _appended(found: TableLook) -> int:
    """The rows the append that recorded the table's state added (0 when its commit does not tell)."""
    return int(found.properties.get(APPENDED_PROPERTY, 0))


def _manifest(spark: SparkSession, location: str) -> DataFrame | None:
    """The manifest table (None before the first landing file is read). Its own log decides: Delta
    takes a directory inside the changelog for part of the changelog, so ``table_exists`` is true there."""
    path = f"{location.rstrip('/')}/{MANIFEST_DIR}"
    return spark.read.format("delta").load(path) if look(spark, path, recorded=False).version >= 0 else None


def _snapshot_positions(spark: SparkSession, namespace: str, files: list[str], landing: DataFrame) -> dict[str, str]:
    """The read position of each full-snapshot file among ``files``: from its Parquet footer where the
    file holds reads only (as the snapshot assets write them), so a build reads its landing files
    once; one aggregation over the landing rows for the files whose footers cannot tell."""
    out: dict[str, str] = {}
    unknown: list[str] = []
    for given in (f for f in files if snapshot_part(f, namespace) is not None):
        told, position = _footer_read_position(given)
        if not told:
            unknown.append(given)
        elif position is not None:
            out[given] = position
    if not unknown:
        return out
    found = (
        landing.where(F.col("op") == "r")
        .groupBy(F.col("_metadata.file_path").alias("file"))
        .agg(F.min("position").alias("position"))
        .collect()
    )
    for given in unknown:
        for row in found:
            if _same_file(row["file"], given):
                out[given] = row["position"]
    return out


def _footer_read_position(path: str) -> tuple[bool, str | None]:
    """(whether the footer tells, the lowest position) of a local landing file all of whose rows are
    reads (:func:`_span`); a file without rows tells: no position."""
    span = _span(path)
    if span is None or span[3]:
        return False, None
    return True, span[0] or None


def _text(value: str | bytes) -> str:
    """A string column's footer statistic as text (pyarrow gives bytes where no UTF-8 annotation says)."""
    return value if isinstance(value, str) else bytes(value).decode()


def _completed_snapshot(entries: Sequence[tuple[str | None, int | None, int | None, str | None]]) -> str | None:
    """The position of the latest full snapshot all of whose files were read (None: none yet), from the
    manifest's ``(plan, part, parts, position)`` entries (a few per snapshot: no Spark job).

    A snapshot that read no document at all carries no position, so it cannot count.
    """
    plans: dict[tuple[str, int | None], tuple[set[int | None], list[str]]] = {}
    for plan, part, parts, position in entries:
        if plan is None:
            continue
        read, positions = plans.setdefault((plan, parts), (set(), []))
        read.add(part)
        if position is not None:
            positions.append(position)
    complete = [min(positions) for (_, parts), (read, positions) in plans.items()
                if positions and parts is not None and len(read) >= parts]  # fmt: skip
    return max(complete, default=None)


def _unread_by_properties(namespace: str, files: list[str], versions: dict[str, str], before: TableLook) -> list[str] | None:
    """The files not read yet, decided by the recorded state alone (no read of the manifest, a
    Delta table whose scan costs several Spark jobs), or None when they cannot tell.

    They tell in the usual refresh: the table is at the version the last refresh left (no other
    writer: the stream's commits record an empty digest), the files later than its highest position
    are new (had one been read, that position would be at least its events': a writer that found the
    properties stale counted the table and recorded its highest position), and the others are exactly
    the files (and versions) the last refresh was given, which it read (its digest is recorded in its
    append's commit). A new part of a full snapshot needs the manifest's other parts, so it
    leaves the decision to it.
    """
    if before.recorded_rows is None or not before.properties.get(LANDING_PROPERTY):
        return None
    position = before.properties.get(POSITION_PROPERTY)
    later = [f for f in files if later_than([f], position)]
    if not later or any(snapshot_part(f, namespace) is not None for f in later):
        return None
    known = {f: versions[f] for f in files if f not in later}
    return later if landing_digest(known) == before.properties[LANDING_PROPERTY] else None


def refresh(spark: SparkSession, namespace: str, location: str, paths: Sequence[str]) -> ChangelogResult:
    """Append the events of new or re-written landing files of ``namespace`` (see the module doc).

    When the files are those the last refresh was given, unchanged (files holding no row left out), and
    the table is still at the version it left, nothing is read and no Spark job runs (the state its last
    commit recorded decides)."""
    files = [f for f in landing_files(paths) if holds_events(f, namespace)]
    versions = {f: file_version(spark, f) for f in files}
    digest = landing_digest(versions)
    before = look(spark, location)
    if before.version >= 0 and before.properties.get(LANDING_PROPERTY) == digest and before.recorded_rows is not None:
        props = before.properties
        return ChangelogResult(0, Appended(0, {}, None), props.get(POSITION_PROPERTY), props.get(SNAPSHOT_PROPERTY),
                               before.recorded_rows, before.schema, _appended(before))  # fmt: skip
    new_table = before.version < 0
    listed: list[tuple[str, str, str | None, int | None, int | None, str | None]] = []
    todo = _unread_by_properties(namespace, files, versions, before)
    if todo is None:  # the recorded state cannot tell: the manifest decides
        manifest = _manifest(spark, location)
        if manifest is not None and files:
            listed = [tuple(r) for r in manifest.select("path", "version", "plan", "part", "parts", "position").collect()]
        seen = {(path, version) for path, version, *_ in listed}
        todo = [f for f in files if (f, versions[f]) not in seen]
    properties = before.properties
    snapshot_position = properties.get(SNAPSHOT_PROPERTY)
    # the rows the table holds before this refresh's commit, and their highest position where it was counted
    # (another writer committed since the last refresh, or one stopped before recording: their rows count too)
    known, highest = (0, None) if new_table else (before.recorded_rows, None)
    if known is None:
        known, highest = held(spark, location)
    read: DataFrame | None = None
    rows: DataFrame | None = None
    fresh = False
    if todo:
        landing = spark.read.schema(LANDING_SPARK_SCHEMA).parquet(*todo)
        rows = changelog_rows(landing, F.col("_metadata.file_path"), namespace)
        # files later than the highest position the table recorded, in the commit that is still its latest
        # (no writer appended since), hold no event the table has: nothing to look up in it
        fresh = before.recorded_rows is not None and later_than(todo, properties.get(POSITION_PROPERTY))
        positions = _snapshot_positions(spark, namespace, todo, landing)
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        entries = []
        for f in todo:
            part = snapshot_part(f, namespace)
            entries.append((f, versions[f], *(part or (None, None, None)), positions.get(f), now))
        read = spark.createDataFrame(entries, _MANIFEST_SCHEMA)
        if any(e[2] is not None for e in entries):
            completed = _completed_snapshot([e[2:6] for e in [*listed, *entries]])
            if completed is not None and (snapshot_position is None or completed > snapshot_position):
                snapshot_position = completed
    # the state (the digest among it) goes with the append's commit, the manifest after it: a refresh stopped
    # in between reads the files again once the recorded state cannot tell (appending no event twice)
    state = changelog_state(namespace, before, rows=known, highest=highest, landing=digest,
                            snapshot_position=snapshot_position)
    if todo or new_table:  # without landing data a new table is empty, so readers find one
        rows = rows if rows is not None else spark.createDataFrame([], CHANGELOG_SCHEMA)
        with interpreted(spark, sum(version_bytes(versions[f]) for f in todo)):
            appended, after = append_recorded(spark, location, namespace, rows, before, state,
                                              unique=not may_repeat(todo), new=fresh)
    else:  # nothing to read, yet the state changed (other files given, or counted): recorded alone
        appended = Appended(0, {}, None)
        record(spark, location, state)
        after = look(spark, location)
    position, row_count = after.properties.get(POSITION_PROPERTY), after.recorded_rows
    if row_count is None:  # another writer committed after this refresh's commit
        row_count, counted = held(spark, location)
        position = max(filter(None, [position, counted]), default=None)
    if read is not None:  # last: a refresh stopped before this reads the files again (appending no event twice)
        with interpreted(spark, 0):  # a few rows
            read.write.format("delta").mode("append").options(**LOG_OPTIONS).save(f"{location.rstrip('/')}/{MANIFEST_DIR}")
    return ChangelogResult(len(todo), appended, position, snapshot_position, row_count, after.schema,
                           appended.rows or _appended(before))
