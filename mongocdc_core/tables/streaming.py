"""Structured Streaming from the connector's Kafka topics into the same per-collection tables.

One query reads all of a connector's topics (best by pattern, so a collection captured later is read
too): a deployment's tens of collections share one checkpoint and one micro-batch loop. Each micro-batch
(``foreachBatch``) flattens the Debezium records (JsonConverter values with or without their ``schema``
part) into landing-zone columns, appends each collection's events to its changelog (append-only per
event identity, so a batch replayed after a restart adds nothing) and refreshes that collection's
current_state, the collections it touched several at once as a refresh cycle does: exactly once into
the tables, across restarts. A batch in which any collection failed fails the query before its offsets
are committed, so a restart processes it again. What a collection's append would look up in its table
per batch (its lowest position, repeated events) one aggregation of the batch finds for all of them.

Positions: mongocdc's Kafka sink puts every record's position in the header ``mongocdc.position``,
so a record read here sorts exactly as the same record read from the landing zone, and both paths
build identical tables. A record without the header (another producer, such as Debezium itself)
falls back to ``source.ts_ms`` seconds and ``source.ord`` for change events; its snapshot reads have
no position and lose to every change event of their key.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from py4j.protocol import Py4JJavaError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from mongocdc_core.sinks.kafka import POSITION_HEADER
from mongocdc_core.tables import changelog as _changelog
from mongocdc_core.tables.changelog import (
    EVENT_IDENTITY,
    POSITION_PROPERTY,
    TableInputError,
    changelog_rows,
    look,
)
from mongocdc_core.tables.collection import (
    CollectionTables,
    TableOptions,
    concurrently,
    refresh_current_state,
)

log = logging.getLogger(__name__)
_NO_POSITION = "0000000000000.0000000000.000000"


@dataclass(frozen=True)
class StreamSettings:
    """What the streaming job reads and where it writes.

    ``topics`` are the data topics (``<prefix>.<db>.<collection>``) or, with ``pattern=True``, one
    Java regular expression (new topics matching it are picked up: a collection added while the job
    runs gets its tables). Transaction, heartbeat and signal topics may be included — their records
    are skipped, as are tombstones. Each collection's tables are ``CollectionTables.under(root, ns)``
    unless ``tables`` names them. ``kafka_options`` pass through to the Kafka source (``kafka.*``
    settings such as security). ``concurrency``: collections of one micro-batch written at once (as
    ``refresh_collections``'s; default :func:`.collection.default_concurrency`).
    """

    bootstrap_servers: str
    topics: Sequence[str]
    root: str
    checkpoint_location: str
    pattern: bool = False
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    #: Process what the topics hold now, then stop (batch-like runs and tests); else run until stopped.
    available_now: bool = False
    options: TableOptions = field(default_factory=TableOptions)
    tables: Callable[[str], CollectionTables] | None = None
    kafka_options: Mapping[str, str] = field(default_factory=dict)
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise TableInputError(f"StreamSettings.concurrency must be at least 1, got {self.concurrency}")

    def tables_for(self, namespace: str) -> CollectionTables:
        return self.tables(namespace) if self.tables is not None else CollectionTables.under(self.root, namespace)


def _payload(value: Column) -> Column:
    """The envelope: ``payload`` of a schema-carrying JsonConverter message, else the value itself."""
    wrapped = F.get_json_object(value, "$.payload")
    has_schema = F.get_json_object(value, "$.schema").isNotNull() & wrapped.isNotNull()
    return F.when(has_schema, wrapped).otherwise(value)


def _position(payload: Column) -> Column:
    """The record's position: its header, else derived from the envelope (see the module doc)."""
    header = F.element_at(F.filter(F.col("headers"), lambda h: h["key"] == F.lit(POSITION_HEADER)), 1)
    seconds = F.floor(F.get_json_object(payload, "$.source.ts_ms").cast("bigint") / 1000)
    increment = F.get_json_object(payload, "$.source.ord").cast("bigint")
    derived = F.when(F.get_json_object(payload, "$.op") == "r", F.lit(_NO_POSITION)).otherwise(
        F.format_string("%013d.%010d.%06d", seconds, F.coalesce(increment, F.lit(0)), F.lit(0))
    )
    return F.coalesce(header["value"].cast("string"), derived)


def kafka_to_landing(records: DataFrame) -> DataFrame:
    """Kafka rows (``key``, ``value``, ``topic``, ``partition``, ``headers``) -> landing-zone columns."""
    p = F.col("_payload")

    def field_(path: str) -> Column:
        return F.get_json_object(p, path)

    position = F.col("_position")
    parts = F.split(position, r"\.")
    return (
        records.withColumn("_payload", _payload(F.col("value").cast("string")))
        .withColumn("_position", _position(F.col("_payload")))
        .select(
            F.col("topic"),
            F.concat_ws(".", field_("$.source.db"), field_("$.source.collection")).alias("collection"),
            _payload(F.col("key").cast("string")).alias("key"),
            field_("$.op").alias("op"),
            position.alias("position"),
            parts[0].cast("bigint").alias("pos_seconds"),
            parts[1].cast("bigint").alias("pos_increment"),
            parts[2].cast("bigint").alias("pos_ordinal"),
            field_("$.ts_ms").cast("bigint").alias("ts_ms"),
            field_("$.before").alias("before"),
            field_("$.after").alias("after"),
            field_("$.updateDescription.updatedFields").alias("updated_fields"),
            F.from_json(field_("$.updateDescription.removedFields"), T.ArrayType(T.StringType())).alias("removed_fields"),
            field_("$.updateDescription.truncatedArrays").alias("truncated_arrays"),
            field_("$.source.snapshot").alias("snapshot"),
            field_("$.source").alias("source"),
            p.alias("value"),
            F.concat(F.lit("kafka:"), F.col("topic"), F.lit(":"), F.col("partition").cast("string")).alias("_origin"),
        )
    )


def kafka_changelog_rows(records: DataFrame) -> DataFrame:
    """Kafka rows -> changelog rows of every collection (data events only)."""
    return changelog_rows(kafka_to_landing(records), F.col("_origin"))


class BatchWriteError(RuntimeError):
    """Collections of a micro-batch whose tables could not be written (the others were): the query
    stops without committing the batch's offsets, and a restart writes it again."""

    def __init__(self, batch_id: int, failures: Mapping[str, Exception]) -> None:
        self.failures = dict(failures)
        lines = [f"{namespace}: {_summary(exc)}" for namespace, exc in sorted(self.failures.items())]
        super().__init__(
            f"micro-batch {batch_id}: the tables of {len(lines)} collection(s) failed (the batch's offsets are not "
            "committed; a restart writes it again):\n" + "\n".join(lines)
        )


def _summary(exc: Exception) -> str:
    """One line saying what failed: for an error raised in the JVM, the Java exception (py4j's own first
    line only names the call, such as ``o734.save``)."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if isinstance(exc, Py4JJavaError) and java is not None else str(exc)
    first = (text.strip().splitlines() or [""])[0]
    return first if isinstance(exc, Py4JJavaError) else f"{type(exc).__name__}: {first}"


@dataclass(frozen=True)
class _Part:
    """One collection's events in a micro-batch: the lowest position among them and whether each
    event occurs once."""

    first: str
    unique: bool


def _parts(rows: DataFrame) -> dict[str, _Part]:
    """Every collection of the batch with its :class:`_Part`, from one aggregation of the whole batch (an
    append that had to find them itself would run three Spark jobs per collection). A 64-bit hash stands
    for an event's identity: a collision only costs a deduplication."""
    found = rows.groupBy("__collection").agg(
        F.min("__position").alias("first"), F.count(F.lit(1)).alias("events"),
        F.countDistinct(F.xxhash64(*EVENT_IDENTITY)).alias("identities"),
    ).collect()  # fmt: skip
    return {r["__collection"]: _Part(r["first"], r["events"] == r["identities"]) for r in found}


def _write_collection(settings: StreamSettings, view: str, parts: Mapping[str, _Part], spark: SparkSession,
                      namespace: str) -> None:  # fmt: skip
    """One collection's part of a micro-batch, in ``spark`` (a session of its own): its events, read from
    the batch's global view, appended to its changelog, then its current_state refreshed.

    Events all later than the position the changelog recorded in its latest commit (the usual case: a
    topic's records come in order) are appended without looking them up in the table; a batch replayed
    after a crash, or records produced twice, are looked up. The row count is recorded with the
    position, so the next batch can tell the recorded position is still the table's latest."""
    tables = settings.tables_for(namespace)
    part = parts[namespace]
    rows = spark.table(view).where(F.col("__collection") == namespace)
    before = look(spark, tables.changelog)
    recorded = before.properties.get(POSITION_PROPERTY)
    fresh = before.version < 0 or (before.recorded_rows is not None and recorded is not None and part.first > recorded)
    known, highest = (0, None) if before.version < 0 else (before.recorded_rows, None)
    if known is None:  # another writer committed, or one stopped before recording, or a table from before row
        known, highest = _changelog.held(spark, tables.changelog)  # counts were recorded: counted once
    # landing="": the landing refresh's shortcuts must not take this commit for its own
    state = _changelog.changelog_state(namespace, before, rows=known, highest=highest, landing="")
    _changelog.append_recorded(spark, tables.changelog, namespace, rows, before, state, unique=part.unique, new=fresh)
    refresh_current_state(spark, tables, settings.options)


def process_batch(spark: SparkSession, settings: StreamSettings, batch: DataFrame, batch_id: int) -> None:
    """One micro-batch: each collection's new events into its changelog, then its current_state, several
    collections at once (:func:`.collection.concurrently`, the refresh cycle's way: each in a Spark session
    and scheduler pool of its own, so the SQL settings a refresh sizes do not race). A DataFrame belongs
    to the session that made it, so the batch's rows reach those sessions as a global temporary view
    (shared by every session of the SparkContext; dropped when the batch ends). Every collection is
    attempted; if any failed, :class:`BatchWriteError` names them all."""
    rows = kafka_changelog_rows(batch).localCheckpoint()
    parts = _parts(rows)
    namespaces = sorted(parts)
    if not namespaces:
        return
    view = f"mongocdc_batch_{uuid.uuid4().hex}"
    rows.createGlobalTempView(view)
    shared = f"{spark.conf.get('spark.sql.globalTempDatabase', 'global_temp')}.{view}"
    failures: dict[str, Exception] = {}
    try:
        write = partial(_write_collection, settings, shared, parts)
        for namespace, outcome in concurrently(spark, namespaces, write, concurrency=settings.concurrency):
            if isinstance(outcome, Exception):
                log.error("micro-batch %d: the tables of %s failed: %s", batch_id, namespace, _summary(outcome))
                failures[namespace] = outcome
    finally:
        spark.catalog.dropGlobalTempView(view)
    if failures:
        raise BatchWriteError(batch_id, failures) from next(iter(failures.values()))


def start_stream(spark: SparkSession, settings: StreamSettings, query_name: str = "mongocdc-tables") -> StreamingQuery:
    """Start the streaming query (the caller awaits or stops it)."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("startingOffsets", settings.starting_offsets)
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true")
    )
    for key, value in settings.kafka_options.items():
        reader = reader.option(key if key.startswith("kafka.") else f"kafka.{key}", value)
    if settings.pattern:
        if len(settings.topics) != 1:
            raise TableInputError("with pattern=True, topics must hold exactly one regular expression")
        reader = reader.option("subscribePattern", settings.topics[0])
    else:
        if not settings.topics:
            raise TableInputError("StreamSettings.topics is empty: name the data topics to read")
        reader = reader.option("subscribe", ",".join(settings.topics))
    if settings.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
    writer = (
        reader.load()
        .writeStream.queryName(query_name)
        .option("checkpointLocation", settings.checkpoint_location)
        .foreachBatch(lambda batch, batch_id: process_batch(spark, settings, batch, batch_id))
    )
    if settings.available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()
