"""Every property mongocdc knows: Debezium's MongoDB connector properties, then mongocdc's own.

One :class:`PropertySpec` per property says how its string value is converted and what its default
is; the validators, the codec and the typed :class:`~mongocdc_core.config.ConnectorConfig` all read
these specs, so a property is declared in exactly one place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

CONNECTOR_CLASS = "io.debezium.connector.mongodb.MongoDbConnector"
DEFAULT_AUTH_PROVIDER = "DefaultMongoDbAuthProvider"
AUTH_PROVIDERS = (
    DEFAULT_AUTH_PROVIDER,
    "io.debezium.connector.mongodb.connection.DefaultMongoDbAuthProvider",
)
DEFAULT_TOPIC_NAMING_STRATEGY = "io.debezium.schema.DefaultTopicNamingStrategy"

# Databases that Debezium never captures, whatever the filters say.
BUILT_IN_DATABASES = frozenset({"admin", "config", "local"})

INT64_MAX = 2**63 - 1
TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
INTEGER = re.compile(r"^[+-]?[0-9]+$")

Kind = Literal[
    "str",  # free text; empty means unset when there is no default
    "password",  # like str, never logged
    "bool",  # true/false, case-insensitive (Kafka ConfigDef rule)
    "int",  # base-10 integer within [minimum, 2**63-1]
    "enum",  # one of `allowed`, case-insensitive, stored lower-case
    "list",  # comma-separated, stripped, empties dropped -> tuple[str, ...]
    "filter_list",  # like list, but split regex-aware and compiled when filters.match.mode=regex
    "regex_list",  # always regular expressions (anchored, case-insensitive)
    "channels",  # list whose items must be in `allowed`
    "operations",  # skipped.operations: c,u,d,t or none -> frozenset[str]
    "pipeline",  # JSON array of aggregation stages -> list[dict]
    "tags",  # k1=v1,k2=v2 -> dict[str, str]
]


@dataclass(frozen=True)
class PropertySpec:
    """One Debezium property: its name, how to convert it, and its default as the docs state it."""

    name: str
    kind: Kind
    default: str | None
    doc: str
    allowed: tuple[str, ...] = ()
    minimum: int | None = None
    group: str = "advanced"
    maximum: int | None = None

    @property
    def attribute(self) -> str:
        """The Python attribute name: dots and dashes become underscores, case is kept."""
        return _attribute_name(self.name)


def _attribute_name(prop: str) -> str:
    return prop.replace(".", "_").replace("-", "_")


def _p(
    name: str,
    kind: Kind,
    default: str | None,
    doc: str,
    allowed: Iterable[str] = (),
    minimum: int | None = None,
    group: str = "advanced",
    maximum: int | None = None,
) -> PropertySpec:
    return PropertySpec(name, kind, default, doc, tuple(allowed), minimum, group, maximum)


CB = "snapshot.mode.configuration.based."
_SNAPSHOT_MODES = (
    "always",
    "initial",
    "initial_only",
    "no_data",
    "never",
    "when_needed",
    "configuration_based",
    "custom",
)
_CAPTURE_MODES = (
    "change_streams",
    "change_streams_update_full",
    "change_streams_with_pre_image",
    "change_streams_update_full_with_pre_image",
)
_ADJUSTMENT_MODES = ("none", "avro", "avro_unicode")
SIGNAL_CHANNELS = ("source", "kafka", "file", "jmx", "in-process")
NOTIFICATION_CHANNELS = ("sink", "log", "jmx")
# In the order of the tables of the current Debezium MongoDB documentation (seed 000), followed by the
# Kafka signal and sink notification tables, Debezium's file signal channel, the Kafka Connect worker's
# offset settings, and mongocdc's own switches.
PROPERTY_SPECS: tuple[PropertySpec, ...] = (
    # -- required and common ------------------------------------------------------------------------------
    _p("mongodb.allow.offset.invalidation", "bool", "false",
       "Invalidate and consolidate shard-specific offsets recorded by earlier versions.", group="common"),
    _p("name", "str", None, "Unique connector name.", group="common"),
    _p("connector.class", "str", None, f"Must be {CONNECTOR_CLASS}.", group="common"),
    _p("mongodb.connection.string", "str", None, "MongoDB connection string (required).", group="common"),
    _p("topic.prefix", "str", None, "Logical name; prefix of every topic (required).", group="common"),
    _p("mongodb.authentication.class", "str", DEFAULT_AUTH_PROVIDER,
       "Credentials provider; only the default provider is supported.", group="common"),
    _p("mongodb.user", "str", None, "Database user.", group="common"),
    _p("mongodb.password", "password", None, "Database password.", group="common"),
    _p("mongodb.authsource", "str", "admin", "Authentication database.", group="common"),
    _p("mongodb.ssl.enabled", "bool", "false", "Connect with TLS.", group="common"),
    _p("mongodb.ssl.invalid.hostname.allowed", "bool", "false",
       "Disable strict TLS hostname checking.", group="common"),
    _p("filters.match.mode", "enum", "regex", "How include/exclude lists match names.",
       ("regex", "literal"), group="common"),
    _p("database.include.list", "filter_list", "", "Databases to capture.", group="common"),
    _p("database.exclude.list", "filter_list", "", "Databases not to capture.", group="common"),
    _p("collection.include.list", "filter_list", "", "Namespaces <db>.<coll> to capture.", group="common"),
    _p("collection.exclude.list", "filter_list", "", "Namespaces <db>.<coll> not to capture.",
       group="common"),
    _p("capture.mode", "enum", "change_streams_update_full", "How update events are captured.",
       _CAPTURE_MODES, group="common"),
    _p("capture.scope", "enum", "deployment", "Scope of the change stream.",
       ("collection", "database", "deployment"), group="common"),
    _p("capture.target", "str", None, "Database (or <db>.<coll> for collection scope) to watch.",
       group="common"),
    _p("field.exclude.list", "list", "", "Fields <db>.<coll>.<field> removed from event values.",
       group="common"),
    _p("field.renames", "list", "", "Renames <db>.<coll>.<field>:<new name>, applied in order.",
       group="common"),
    _p("tombstones.on.delete", "bool", "true", "Follow each delete with a tombstone.", group="common"),
    _p("schema.name.adjustment.mode", "enum", "none", "Schema name adjustment.", _ADJUSTMENT_MODES,
       group="common"),
    _p("field.name.adjustment.mode", "enum", "none", "Field name adjustment.", _ADJUSTMENT_MODES,
       group="common"),
    # -- advanced --------------------------------------------------------------------------------------------
    _p("capture.mode.full.update.type", "enum", "lookup", "How full documents of updates are fetched.",
       ("lookup", "post_image")),
    _p("max.batch.size", "int", "2048", "Events per batch.", minimum=1),
    _p("max.queue.size", "int", "8192", "Capacity of the event queue (must exceed max.batch.size).",
       minimum=1),
    _p("max.queue.size.in.bytes", "int", "0", "Capacity of the event queue in bytes (0 = unbounded).",
       minimum=0),
    _p("poll.interval.ms", "int", "1000", "Wait for new events in each iteration.", minimum=1),
    _p("connect.backoff.initial.delay.ms", "int", "1000", "First reconnect delay.", minimum=1),
    _p("connect.backoff.max.delay.ms", "int", "120000", "Largest reconnect delay.", minimum=1),
    _p("connect.max.attempts", "int", "16", "Failed connection attempts before giving up.", minimum=1),
    _p("source.struct.version", "enum", "v2", "Version of the source block.", ("v1", "v2")),
    _p("heartbeat.interval.ms", "int", "0", "Heartbeat interval (0 = no heartbeats).", minimum=0),
    _p("skipped.operations", "operations", "t", "Operations not emitted (c, u, d, t or none)."),
    _p("snapshot.collection.filter.overrides", "list", None,
       "Collections <db>.<coll> whose snapshot uses snapshot.collection.filter.overrides.<db>.<coll>."),
    _p("snapshot.delay.ms", "int", "0", "Delay before the snapshot starts.", minimum=0),
    _p("snapshot.fetch.size", "int", "0", "Documents per snapshot batch (0 = server default).", minimum=0),
    _p("snapshot.include.collection.list", "regex_list", "",
       "Namespaces to snapshot (default: all captured)."),
    _p("snapshot.max.threads", "int", "1", "Threads of the initial snapshot.", minimum=1),
    _p("snapshot.mode", "enum", "initial", "When to snapshot.", _SNAPSHOT_MODES),
    _p(CB + "snapshot.data", "bool", "false", "configuration_based: snapshot the data."),
    _p(CB + "snapshot.schema", "bool", "false", "configuration_based: snapshot the schema."),
    _p(CB + "start.stream", "bool", "false", "configuration_based: stream after the snapshot."),
    _p(CB + "snapshot.on.schema.error", "bool", "false",
       "configuration_based: snapshot schema when schema history is missing."),
    _p(CB + "snapshot.on.data.error", "bool", "false",
       "configuration_based: snapshot data when the offset left the log."),
    _p("snapshot.mode.custom.name", "str", None, "Name of the custom snapshotter (snapshot.mode=custom)."),
    _p("provide.transaction.metadata", "bool", "false", "Emit transaction boundaries and metadata."),
    _p("retriable.restart.connector.wait.ms", "int", "10000", "Wait before restarting after an error.",
       minimum=0),
    _p("mongodb.poll.interval.ms", "int", "30000", "Interval of replica set discovery.", minimum=1),
    _p("mongodb.connect.timeout.ms", "int", "10000", "Driver connect timeout.", minimum=0),
    _p("mongodb.heartbeat.frequency.ms", "int", "10000", "Driver heartbeat frequency.", minimum=500),
    _p("mongodb.socket.timeout.ms", "int", "0", "Driver socket timeout (0 = none).", minimum=0),
    _p("mongodb.server.selection.timeout.ms", "int", "30000", "Driver server selection timeout.",
       minimum=0),
    _p("cursor.pipeline", "pipeline", None, "User aggregation stages for the change stream (JSON array)."),
    _p("cursor.pipeline.order", "enum", "internal_first", "Order of internal and user stages.",
       ("internal_first", "user_first", "user_only")),
    _p("cursor.oversize.handling.mode", "enum", "fail", "What to do with oversized change events.",
       ("fail", "skip", "split")),
    _p("cursor.oversize.skip.threshold", "int", "0", "Largest document size processed in skip mode.",
       minimum=0),
    _p("cursor.max.await.time.ms", "int", "0", "Cursor await time (0 = driver default).", minimum=0),
    _p("signal.data.collection", "str", None, "Signaling collection <db>.<coll>."),
    _p("signal.enabled.channels", "channels", "source", "Enabled signal channels.", SIGNAL_CHANNELS),
    _p("notification.enabled.channels", "channels", None, "Enabled notification channels.",
       NOTIFICATION_CHANNELS),
    _p("incremental.snapshot.chunk.size", "int", "1024", "Documents per incremental snapshot chunk.",
       minimum=1),
    _p("incremental.snapshot.watermarking.strategy", "enum", "insert_insert",
       "Watermarking of incremental snapshot windows: documents written to the signaling collection "
       "(insert_insert, insert_delete), or read_only: cluster times, nothing written to the source.",
       ("insert_insert", "insert_delete", "read_only")),
    _p("topic.naming.strategy", "str", DEFAULT_TOPIC_NAMING_STRATEGY, "Topic naming strategy class."),
    _p("topic.delimiter", "str", ".", "Delimiter between topic name parts."),
    _p("topic.cache.size", "int", "10000", "Size of the topic name cache.", minimum=1),
    _p("topic.heartbeat.prefix", "str", "__debezium-heartbeat", "Prefix of the heartbeat topic."),
    _p("topic.transaction", "str", "transaction", "Suffix of the transaction metadata topic."),
    _p("custom.metric.tags", "tags", None, "Extra metric tags k1=v1,k2=v2."),
    _p("errors.max.retries", "int", "-1", "Retries after retriable errors (-1 = unlimited).", minimum=-1),
    # Debezium's common property (not in the MongoDB tables): an event that cannot be converted or that
    # the sink refuses (e.g. larger than the topic accepts) stops the connector, or is logged and skipped.
    _p("event.processing.failure.handling.mode", "enum", "fail",
       "Events that cannot be processed or delivered: fail (stop, naming the event), warn (log and skip) or skip.",
       ("fail", "warn", "skip")),
    # -- Kafka signal channel ---------------------------------------------------------------------------------
    _p("signal.kafka.topic", "str", None, "Signal topic (default <topic.prefix>-signal).", group="signal"),
    _p("signal.kafka.groupId", "str", "kafka-signal", "Consumer group of the signal topic.", group="signal"),
    _p("signal.kafka.bootstrap.servers", "str", None, "Kafka brokers of the signal topic.", group="signal"),
    _p("signal.kafka.poll.timeout.ms", "int", "100", "Signal topic poll timeout.", minimum=0,
       group="signal"),
    _p("signal.consumer.offset.commit.enabled", "bool", "false", "Commit signal topic offsets.",
       group="signal"),
    # -- sink notifications ------------------------------------------------------------------------------------
    _p("notification.sink.topic.name", "str", None, "Topic of the sink notification channel.",
       group="notification"),
    # -- Debezium's file signal channel and signal polling (not in the MongoDB tables) -------------------------
    _p("signal.file", "str", "file-signals.txt", "File read by the file signal channel.", group="signal"),
    _p("signal.poll.interval.ms", "int", "5000", "How often signal channels are polled.", minimum=1,
       group="signal"),
    # -- Kafka Connect worker offset settings, honoured by the engine -----------------------------------------
    _p("offset.flush.interval.ms", "int", "60000", "How often offsets are flushed and recorded.", minimum=0,
       group="worker"),
    _p("offset.storage.file.filename", "str", None, "File of the file offset store.", group="worker"),
    # -- mongocdc ----------------------------------------------------------------------------------------------
    _p("mongocdc.event.format", "enum", "change_streams",
       "Event format: change_streams (the documented spelling), debezium_3x (byte-identical to the released "
       "Debezium 3.x connector), or oplog_1x (the 1.x patch/filter format).",
       ("change_streams", "debezium_3x", "oplog_1x"), group="mongocdc"),
    _p("mongocdc.schemas.enable", "bool", "true",
       "Write the Kafka Connect JSON schema with each record (JsonConverter schemas.enable).",
       group="mongocdc"),
    _p("mongocdc.metrics.file", "str", None, "JSON file the engine rewrites with its metrics.",
       group="mongocdc"),
    _p("mongocdc.metrics.port", "int", "0",
       "Serve the metrics in Prometheus text format on this port (0 = off).", minimum=0, group="mongocdc",
       maximum=65535),
    _p("mongocdc.snapshot.split.size", "int", "250000",
       "Collections with more documents are snapshotted as _id ranges of about this many documents, copied in "
       "parallel and resumed range by range (0 = never split).", minimum=0, group="mongocdc"),
    _p("mongocdc.jsonl.compression", "enum", "none",
       "Compression of JSON Lines landing files: none (<topic>.jsonl), gzip (<topic>.jsonl.gz) or zstd "
       "(<topic>.jsonl.zst); each flush ends a gzip member / zstd frame, so the files stay readable by gzip/zstd.",
       ("none", "gzip", "zstd"), group="mongocdc"),
    _p("mongocdc.snapshot.delete.missing.keys", "bool", "false",
       "After a complete snapshot of a collection, emit a delete event and a tombstone for every key the sink "
       "still holds that neither the snapshot read nor the stream touched since it began (no ghosts after a "
       "re-snapshot). The sink reads its own records back: the JSON Lines files, the landing zone, or the "
       "topics (read_committed).", group="mongocdc"),
    # -- mongocdc's Kafka sink (read only by the Kafka sink, validated whatever the sink) -------------------
    _p("mongocdc.kafka.topic.creation.enable", "bool", "true", "Create missing topics before writing.",
       group="mongocdc"),
    _p("mongocdc.kafka.topic.partitions", "int", "1", "Partitions of topics the sink creates.", minimum=1,
       group="mongocdc"),
    _p("mongocdc.kafka.topic.replication.factor", "int", "-1",
       "Replication factor of topics the sink creates (-1 = broker default).", minimum=-1, group="mongocdc"),
    _p("mongocdc.kafka.topic.cleanup.policy", "enum", "delete", "cleanup.policy of topics the sink creates.",
       ("delete", "compact", "compact,delete", "delete,compact"), group="mongocdc"),
    _p("mongocdc.kafka.exactly.once", "bool", "false",
       "Transactional producer; offsets committed in the same Kafka transaction.", group="mongocdc"),
    _p("mongocdc.kafka.transaction.timeout.ms", "int", "900000", "Kafka transaction timeout.", minimum=1000,
       group="mongocdc"),
)

PROPERTIES: dict[str, PropertySpec] = {spec.name: spec for spec in PROPERTY_SPECS}

FILTER_OVERRIDE_PREFIX = "snapshot.collection.filter.overrides."
SIGNAL_CONSUMER_PREFIX = "signal.consumer."
PRODUCER_OVERRIDE_PREFIX = "producer.override."

# Kafka Connect framework properties that appear in real connector configs. They are accepted and kept
# in `properties`; mongocdc does not apply them (converters and SMTs are warned about).
CONNECT_PROPERTIES = frozenset({
    "tasks.max", "key.converter", "value.converter", "header.converter", "transforms", "predicates",
    "errors.tolerance", "errors.log.enable", "errors.log.include.messages", "errors.retry.timeout",
    "errors.retry.delay.max.ms", "config.action.reload", "exactly.once.support", "transaction.boundary",
    "offsets.storage.topic", "config.providers",
})
_CONNECT_PREFIXES = (
    "key.converter.", "value.converter.", "header.converter.", "transforms.", "predicates.",
    "errors.deadletterqueue.", "topic.creation.", "consumer.override.", "admin.override.", "config.providers.",
)
PASS_THROUGH_PREFIXES: tuple[str, ...] = (
    FILTER_OVERRIDE_PREFIX,
    SIGNAL_CONSUMER_PREFIX,
    PRODUCER_OVERRIDE_PREFIX,
    *_CONNECT_PREFIXES,
)
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"

# 1.x property names that users migrating old configs will hit; the hint says what replaced them.
RENAMED_1X = {
    "mongodb.hosts": "replaced by mongodb.connection.string (e.g. mongodb://host:27017/?replicaSet=rs0)",
    "mongodb.name": "replaced by topic.prefix",
    "mongodb.members.auto.discover": "removed; put discovery options in mongodb.connection.string",
    "initial.sync.max.threads": "replaced by snapshot.max.threads",
    "heartbeat.topics.prefix": "replaced by topic.heartbeat.prefix",
    "sanitize.field.names": "replaced by field.name.adjustment.mode",
    "database.whitelist": "replaced by database.include.list",
    "database.blacklist": "replaced by database.exclude.list",
    "collection.whitelist": "replaced by collection.include.list",
    "collection.blacklist": "replaced by collection.exclude.list",
    "field.blacklist": "replaced by field.exclude.list",
}
