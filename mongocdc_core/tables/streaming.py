"""Structured Streaming from the connector's Kafka topics into the same two Delta tables.

Each micro-batch (``foreachBatch``) flattens the Debezium records (JsonConverter values with or
without their ``schema`` part) into landing-zone columns, appends them to the changelog (idempotent
per batch through Delta's ``txnAppId``/``txnVersion``) and merges current_state for the batch's keys.

Positions: a Kafka record carries ``source.ts_ms`` (clusterTime seconds) and ``source.ord`` (its
increment) but not the transaction ordinal, so the record's Kafka offset takes the ordinal's place.
Per key, Kafka keeps the connector's delivery order inside one partition, which is the stream order.
Snapshot reads carry their read time in ``source.ts_ms``; mixing a Kafka-fed snapshot with a
landing-zone stream of the same collection is therefore not supported (feed one table from one path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from mongocdc_core.tables.changelog import table_exists, to_changelog
from mongocdc_core.tables.current_state import merge_current_state


@dataclass(frozen=True)
class StreamSettings:
    """What the streaming job reads and where it writes.

    ``topics`` are the data topics (``<prefix>.<db>.<collection>``) or, with ``pattern=True``, one
    Java regular expression; transaction, heartbeat and signal topics may be included — their
    records are skipped, as are tombstones.
    """

    bootstrap_servers: str
    topics: Sequence[str]
    changelog_location: str
    state_location: str
    checkpoint_location: str
    pattern: bool = False
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    #: Process what the topics hold now, then stop (batch-like runs and tests); else run until stopped.
    available_now: bool = False


def _payload(value: Column) -> Column:
    """The envelope: ``payload`` of a schema-carrying JsonConverter message, else the value itself."""
    wrapped = F.get_json_object(value, "$.payload")
    has_schema = F.get_json_object(value, "$.schema").isNotNull() & wrapped.isNotNull()
    return F.when(has_schema, wrapped).otherwise(value)


def kafka_to_landing(records: DataFrame) -> DataFrame:
    """Kafka rows (``key``, ``value`` bytes, ``topic``, ``partition``, ``offset``) -> landing-zone columns."""
    value = F.col("value").cast("string")
    key = F.col("key").cast("string")
    p = F.col("_payload")

    def field(path: str) -> Column:
        return F.get_json_object(p, path)

    seconds = F.floor(field("$.source.ts_ms").cast("bigint") / 1000)
    increment = field("$.source.ord").cast("bigint")
    ordinal = F.col("offset").cast("bigint")
    return (
        records.withColumn("_payload", _payload(value))
        .withColumn("_key", _payload(key))
        .select(
            F.col("topic"),
            F.concat_ws(".", field("$.source.db"), field("$.source.collection")).alias("collection"),
            F.col("_key").alias("key"),
            field("$.op").alias("op"),
            F.format_string("%013d.%010d.%06d", seconds, increment, ordinal).alias("position"),
            seconds.alias("pos_seconds"),
            increment.alias("pos_increment"),
            ordinal.alias("pos_ordinal"),
            field("$.ts_ms").cast("bigint").alias("ts_ms"),
            field("$.before").alias("before"),
            field("$.after").alias("after"),
            field("$.updateDescription.updatedFields").alias("updated_fields"),
            F.from_json(field("$.updateDescription.removedFields"), T.ArrayType(T.StringType())).alias(
                "removed_fields"
            ),
            field("$.updateDescription.truncatedArrays").alias("truncated_arrays"),
            field("$.source.snapshot").alias("snapshot"),
            field("$.source").alias("source"),
            p.alias("value"),
            F.concat(F.lit("kafka:"), F.col("topic"), F.lit(":"), F.col("partition").cast("string")).alias(
                "_landing"
            ),
        )
    )


def kafka_changelog_rows(records: DataFrame) -> DataFrame:
    """Kafka rows -> changelog rows (data events only; ``landing_file`` names topic and partition)."""
    landing = kafka_to_landing(records).where(F.col("op").isin("c", "u", "d", "r"))
    return to_changelog(landing, F.col("_landing"))


def process_batch(spark: SparkSession, settings: StreamSettings, batch: DataFrame, batch_id: int, app_id: str) -> None:
    """One micro-batch: idempotent changelog append, then current_state for the batch's keys."""
    rows = kafka_changelog_rows(batch).localCheckpoint()
    if rows.isEmpty():
        return
    writer = rows.write.format("delta").mode("append").partitionBy("collection")
    if not table_exists(spark, settings.changelog_location):
        writer = writer.option("delta.enableChangeDataFeed", "true")
    writer.option("txnAppId", app_id).option("txnVersion", batch_id).save(settings.changelog_location)
    merge_current_state(
        spark, settings.changelog_location, settings.state_location, changes=rows.select("collection", "_id")
    )


def start_stream(spark: SparkSession, settings: StreamSettings, query_name: str = "mongocdc-tables") -> StreamingQuery:
    """Start the streaming query (the caller awaits or stops it)."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("startingOffsets", settings.starting_offsets)
        .option("failOnDataLoss", "true")
    )
    if settings.pattern:
        if len(settings.topics) != 1:
            raise ValueError("with pattern=True, topics must hold exactly one regular expression")
        reader = reader.option("subscribePattern", settings.topics[0])
    else:
        if not settings.topics:
            raise ValueError("StreamSettings.topics is empty: name the data topics to read")
        reader = reader.option("subscribe", ",".join(settings.topics))
    if settings.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
    writer = (
        reader.load()
        .writeStream.queryName(query_name)
        .option("checkpointLocation", settings.checkpoint_location)
        .foreachBatch(lambda batch, batch_id: process_batch(spark, settings, batch, batch_id, query_name))
    )
    if settings.available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()
