"""Connector configuration: Debezium MongoDB property names, defaults and validation.

A mongocdc connector is configured exactly like Debezium's MongoDB connector so existing connector
configs (Kafka Connect JSON or ``.properties``) work unchanged. Every property arrives as a string; this
module converts each one to a typed attribute named after the property (``a.b.c`` -> ``a_b_c``),
validates the whole configuration at once and reports every problem on its own line, naming the
property, so users fix a config in one pass instead of one error at a time.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qsl, unquote

import orjson
from bson import json_util

log = logging.getLogger(__name__)

__all__ = [
    "ConfigError",
    "ConnectorConfig",
    "PropertySpec",
    "PROPERTIES",
    "PROPERTY_SPECS",
    "PASS_THROUGH_PREFIXES",
    "CONNECTOR_CLASS",
    "BUILT_IN_DATABASES",
    "SIGNAL_CHANNELS",
    "NOTIFICATION_CHANNELS",
    "parse_properties",
    "dump_properties",
]

CONNECTOR_CLASS = "io.debezium.connector.mongodb.MongoDbConnector"
DEFAULT_AUTH_PROVIDER = "DefaultMongoDbAuthProvider"
_AUTH_PROVIDERS = (
    DEFAULT_AUTH_PROVIDER,
    "io.debezium.connector.mongodb.connection.DefaultMongoDbAuthProvider",
)
DEFAULT_TOPIC_NAMING_STRATEGY = "io.debezium.schema.DefaultTopicNamingStrategy"

# Databases that Debezium never captures, whatever the filters say.
BUILT_IN_DATABASES = frozenset({"admin", "config", "local"})

_INT64_MAX = 2**63 - 1
_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
_TOPIC_INVALID_CHAR = re.compile(r"[^A-Za-z0-9._-]")
_INTEGER = re.compile(r"^[+-]?[0-9]+$")

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
) -> PropertySpec:
    return PropertySpec(name, kind, default, doc, tuple(allowed), minimum, group)


_CB = "snapshot.mode.configuration.based."
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
    _p(_CB + "snapshot.data", "bool", "false", "configuration_based: snapshot the data."),
    _p(_CB + "snapshot.schema", "bool", "false", "configuration_based: snapshot the schema."),
    _p(_CB + "start.stream", "bool", "false", "configuration_based: stream after the snapshot."),
    _p(_CB + "snapshot.on.schema.error", "bool", "false",
       "configuration_based: snapshot schema when schema history is missing."),
    _p(_CB + "snapshot.on.data.error", "bool", "false",
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
       "Watermarking of incremental snapshot windows.", ("insert_insert", "insert_delete")),
    _p("topic.naming.strategy", "str", DEFAULT_TOPIC_NAMING_STRATEGY, "Topic naming strategy class."),
    _p("topic.delimiter", "str", ".", "Delimiter between topic name parts."),
    _p("topic.cache.size", "int", "10000", "Size of the topic name cache.", minimum=1),
    _p("topic.heartbeat.prefix", "str", "__debezium-heartbeat", "Prefix of the heartbeat topic."),
    _p("topic.transaction", "str", "transaction", "Suffix of the transaction metadata topic."),
    _p("custom.metric.tags", "tags", None, "Extra metric tags k1=v1,k2=v2."),
    _p("errors.max.retries", "int", "-1", "Retries after retriable errors (-1 = unlimited).", minimum=-1),
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
       "Event format: current change streams, or the 1.x oplog format (patch/filter).",
       ("change_streams", "oplog_1x"), group="mongocdc"),
    _p("mongocdc.schemas.enable", "bool", "true",
       "Write the Kafka Connect JSON schema with each record (JsonConverter schemas.enable).",
       group="mongocdc"),
    _p("mongocdc.metrics.file", "str", None, "JSON file the engine rewrites with its metrics.",
       group="mongocdc"),
    _p("mongocdc.snapshot.split.size", "int", "250000",
       "Collections with more documents are snapshotted as _id ranges of about this many documents, copied in "
       "parallel and resumed range by range (0 = never split).", minimum=0, group="mongocdc"),
)

PROPERTIES: dict[str, PropertySpec] = {spec.name: spec for spec in PROPERTY_SPECS}

FILTER_OVERRIDE_PREFIX = "snapshot.collection.filter.overrides."
SIGNAL_CONSUMER_PREFIX = "signal.consumer."
PRODUCER_OVERRIDE_PREFIX = "producer.override."
MONGOCDC_KAFKA_PREFIX = "mongocdc.kafka."

# Kafka Connect framework properties that appear in real connector configs. They are accepted and kept
# in `properties`; mongocdc does not apply them (converters and SMTs are warned about).
_CONNECT_PROPERTIES = frozenset({
    "tasks.max", "key.converter", "value.converter", "header.converter", "transforms", "predicates",
    "errors.tolerance", "errors.log.enable", "errors.log.include.messages", "errors.retry.timeout",
    "errors.retry.delay.max.ms", "config.action.reload", "exactly.once.support", "transaction.boundary",
    "offsets.storage.topic",
})
_CONNECT_PREFIXES = (
    "key.converter.", "value.converter.", "header.converter.", "transforms.", "predicates.",
    "errors.deadletterqueue.", "topic.creation.", "consumer.override.", "admin.override.",
)
PASS_THROUGH_PREFIXES: tuple[str, ...] = (
    FILTER_OVERRIDE_PREFIX,
    SIGNAL_CONSUMER_PREFIX,
    PRODUCER_OVERRIDE_PREFIX,
    MONGOCDC_KAFKA_PREFIX,
    *_CONNECT_PREFIXES,
)
_JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"

# 1.x property names that users migrating old configs will hit; the hint says what replaced them.
_RENAMED_1X = {
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

_SECRET_WORDS = ("password", "secret", "jaas", "token", "credential")
_MASK = "********"


class ConfigError(ValueError):
    """Invalid connector configuration; `problems` holds one (property, message) pair per problem."""

    def __init__(self, problems: Iterable[tuple[str, str]]) -> None:
        self.problems: tuple[tuple[str, str], ...] = tuple(problems)
        lines = [f"  {prop}: {msg}" for prop, msg in self.problems]
        noun = "problem" if len(self.problems) == 1 else "problems"
        super().__init__(f"invalid connector configuration ({len(self.problems)} {noun}):\n" + "\n".join(lines))

    @property
    def properties(self) -> tuple[str, ...]:
        """The names of the offending properties, in report order."""
        return tuple(prop for prop, _ in self.problems)


class _Invalid(Exception):
    """A single property value could not be converted."""


# ---------------------------------------------------------------------------------------------------------
# Java .properties format
# ---------------------------------------------------------------------------------------------------------

_PROP_WS = " \t\f"
_UNESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _natural_lines(text: str) -> list[str]:
    # Only \n, \r and \r\n end a line in Java's properties format (str.splitlines splits on more).
    return re.split(r"\r\n|\r|\n", text)


def _logical_lines(text: str) -> Iterator[str]:
    pending: str | None = None
    for line in _natural_lines(text):
        stripped = line.lstrip(_PROP_WS)
        if pending is None:
            if not stripped or stripped[0] in "#!":
                continue
        elif not stripped:
            yield pending
            pending = None
            continue
        trailing = len(stripped) - len(stripped.rstrip("\\"))
        if trailing % 2 == 1:
            pending = (pending or "") + stripped[:-1]
            continue
        yield (pending or "") + stripped
        pending = None
    if pending is not None:
        yield pending


def _unescape(raw: str, line: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= len(raw):
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt == "u":
            digits = raw[i + 2 : i + 6]
            if len(digits) != 4 or not re.fullmatch(r"[0-9A-Fa-f]{4}", digits):
                raise ConfigError([("<properties>", f"malformed \\uxxxx escape in line {line!r}")])
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_UNESCAPES.get(nxt, nxt))
        i += 2
    # Java builds strings from UTF-16 units; join escaped surrogate pairs into one code point.
    try:
        return "".join(out).encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        raise ConfigError([("<properties>", f"unpaired surrogate escape in line {line!r}")]) from None


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java `.properties` text: `#`/`!` comments, `=`, `:` or blank separators, `\\` continuations."""
    result: dict[str, str] = {}
    for line in _logical_lines(text):
        key_end = len(line)
        value_start = len(line)
        has_sep = False
        backslash = False
        for i, ch in enumerate(line):
            if not backslash and ch in "=:":
                key_end, value_start, has_sep = i, i + 1, True
                break
            if not backslash and ch in _PROP_WS:
                key_end, value_start = i, i + 1
                break
            backslash = (ch == "\\") and not backslash
        while value_start < len(line):
            ch = line[value_start]
            if ch not in _PROP_WS:
                if not has_sep and ch in "=:":
                    has_sep = True
                else:
                    break
            value_start += 1
        result[_unescape(line[:key_end], line)] = _unescape(line[value_start:], line)
    return result


def _escape(text: str, is_key: bool) -> str:
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch in "\t\n\r\f":
            out.append("\\" + {"\t": "t", "\n": "n", "\r": "r", "\f": "f"}[ch])
        elif ch == " " and (is_key or i == 0):
            out.append("\\ ")
        elif ch in "=:#!":
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def dump_properties(properties: Mapping[str, str]) -> str:
    """Write properties in Java `.properties` syntax that `parse_properties` reads back unchanged."""
    return "".join(f"{_escape(k, True)}={_escape(v, False)}\n" for k, v in properties.items())


# ---------------------------------------------------------------------------------------------------------
# value conversion
# ---------------------------------------------------------------------------------------------------------


def _scalar_to_str(prop: str, value: object) -> str | None:
    """Turn a JSON/Python scalar into the string Kafka Connect would see; None means unset."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    if prop == "cursor.pipeline" and isinstance(value, list):
        return json_util.dumps(value)
    raise ConfigError([(prop, f"expected a string or scalar value, got {type(value).__name__}")])


def _split_list(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _split_regex_list(value: str) -> tuple[str, ...]:
    """Split on commas that are not escaped and not inside (), [] or {} so `a{1,3}` stays whole."""
    items: list[str] = []
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    current: list[str] = []
    escaped = False
    for ch in value:
        if escaped:
            current.append(ch)
            escaped = False
            continue
        if ch == "\\":
            current.append(ch)
            escaped = True
            continue
        if ch in depth and not (ch != "[" and depth["["]):
            depth[ch] += 1
        elif ch in closing and depth[closing[ch]] > 0 and not (ch != "]" and depth["["]):
            depth[closing[ch]] -= 1
        if ch == "," and not any(depth.values()):
            items.append("".join(current))
            current = []
            continue
        current.append(ch)
    items.append("".join(current))
    return tuple(item.strip() for item in items if item.strip())


def _convert(spec: PropertySpec, raw: str | None) -> Any:
    """Convert a raw string (None = unset) to the typed value, raising _Invalid with a readable reason."""
    text = raw.strip() if raw is not None else None
    if text is None or (text == "" and spec.kind in ("str", "password", "int", "enum", "bool")):
        text = spec.default
    kind = spec.kind
    if kind in ("str", "password"):
        return text or None
    if kind == "bool":
        assert text is not None
        if text.lower() not in ("true", "false"):
            raise _Invalid(f"expected true or false, got {text!r}")
        return text.lower() == "true"
    if kind == "int":
        assert text is not None
        if not _INTEGER.match(text):
            raise _Invalid(f"expected an integer, got {text!r}")
        number = int(text)
        if spec.minimum is not None and number < spec.minimum:
            raise _Invalid(f"must be >= {spec.minimum}, got {number}")
        if number > _INT64_MAX:
            raise _Invalid(f"must be <= {_INT64_MAX}, got {number}")
        return number
    if kind == "enum":
        assert text is not None
        value = text.lower()
        if value not in spec.allowed:
            raise _Invalid(f"{text!r} is not one of {', '.join(spec.allowed)}{_suggest(value, spec.allowed)}")
        return value
    text = text or ""
    if kind in ("list", "filter_list"):
        return _split_list(text)
    if kind == "regex_list":
        return _split_regex_list(text)
    if kind == "channels":
        items = _split_list(text)
        for item in items:
            if item.lower() not in spec.allowed:
                raise _Invalid(
                    f"unknown channel {item!r}; known channels: {', '.join(spec.allowed)}"
                    f"{_suggest(item.lower(), spec.allowed)}"
                )
        return tuple(item.lower() for item in items)
    if kind == "operations":
        ops = {item.lower() for item in _split_list(text)}
        unknown = sorted(ops - {"c", "u", "d", "t", "none"})
        if unknown:
            raise _Invalid(f"unknown operation(s) {', '.join(unknown)}; use c, u, d, t or none")
        if "none" in ops and len(ops) > 1:
            raise _Invalid("'none' cannot be combined with other operations")
        return frozenset(ops - {"none"})
    if kind == "pipeline":
        return _parse_pipeline(text)
    if kind == "tags":
        tags: dict[str, str] = {}
        for item in _split_list(text):
            key, sep, value = item.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise _Invalid(f"expected key=value pairs separated by commas, got {item!r}")
            tags[key.strip()] = value.strip()
        return tags
    raise AssertionError(f"unhandled property kind {kind}")


def _parse_pipeline(text: str) -> list[dict[str, Any]]:
    if not text:
        return []
    try:
        stages = json_util.loads(text)
    except ValueError as exc:
        raise _Invalid(f"is not valid JSON ({exc})") from None
    if not isinstance(stages, list) or not all(isinstance(stage, dict) for stage in stages):
        raise _Invalid("must be a JSON array of pipeline stage objects, e.g. [{\"$match\": {...}}]")
    return stages


def _suggest(word: str, candidates: Iterable[str]) -> str:
    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _is_secret(prop: str) -> bool:
    lowered = prop.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def _mask_connection_string(uri: str) -> str:
    """Hide the password in `mongodb://user:pass@host`."""
    return re.sub(r"^(mongodb(?:\+srv)?://[^:/@]*:)[^@/]*@", lambda m: m.group(1) + _MASK + "@", uri)


def _uri_parts(uri: str) -> tuple[bool, dict[str, str]]:
    """Whether the URI carries credentials, and its options keyed by lower-case name."""
    rest = uri.split("://", 1)[1] if "://" in uri else uri
    authority, _, tail = rest.partition("/")
    if "?" in authority:
        authority, _, query = authority.partition("?")
    else:
        query = tail.partition("?")[2]
    has_user = "@" in authority
    options = {k.lower(): unquote(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    return has_user, options


# ---------------------------------------------------------------------------------------------------------
# the configuration
# ---------------------------------------------------------------------------------------------------------


class ConnectorConfig:
    """A validated Debezium MongoDB connector configuration with one typed attribute per property."""

    # -- required and common
    mongodb_allow_offset_invalidation: bool
    name: str | None
    connector_class: str | None
    mongodb_connection_string: str
    topic_prefix: str
    mongodb_authentication_class: str
    mongodb_user: str | None
    mongodb_password: str | None
    mongodb_authsource: str
    mongodb_ssl_enabled: bool
    mongodb_ssl_invalid_hostname_allowed: bool
    filters_match_mode: str
    database_include_list: tuple[str, ...]
    database_exclude_list: tuple[str, ...]
    collection_include_list: tuple[str, ...]
    collection_exclude_list: tuple[str, ...]
    capture_mode: str
    capture_scope: str
    capture_target: str | None
    field_exclude_list: tuple[str, ...]
    field_renames: tuple[str, ...]
    tombstones_on_delete: bool
    schema_name_adjustment_mode: str
    field_name_adjustment_mode: str
    # -- advanced
    capture_mode_full_update_type: str
    max_batch_size: int
    max_queue_size: int
    max_queue_size_in_bytes: int
    poll_interval_ms: int
    connect_backoff_initial_delay_ms: int
    connect_backoff_max_delay_ms: int
    connect_max_attempts: int
    source_struct_version: str
    heartbeat_interval_ms: int
    skipped_operations: frozenset[str]
    snapshot_collection_filter_overrides: dict[str, str]
    snapshot_delay_ms: int
    snapshot_fetch_size: int
    snapshot_include_collection_list: tuple[str, ...]
    snapshot_max_threads: int
    snapshot_mode: str
    snapshot_mode_configuration_based_snapshot_data: bool
    snapshot_mode_configuration_based_snapshot_schema: bool
    snapshot_mode_configuration_based_start_stream: bool
    snapshot_mode_configuration_based_snapshot_on_schema_error: bool
    snapshot_mode_configuration_based_snapshot_on_data_error: bool
    snapshot_mode_custom_name: str | None
    provide_transaction_metadata: bool
    retriable_restart_connector_wait_ms: int
    mongodb_poll_interval_ms: int
    mongodb_connect_timeout_ms: int
    mongodb_heartbeat_frequency_ms: int
    mongodb_socket_timeout_ms: int
    mongodb_server_selection_timeout_ms: int
    cursor_pipeline: list[dict[str, Any]]
    cursor_pipeline_order: str
    cursor_oversize_handling_mode: str
    cursor_oversize_skip_threshold: int
    cursor_max_await_time_ms: int
    signal_data_collection: str | None
    signal_enabled_channels: tuple[str, ...]
    notification_enabled_channels: tuple[str, ...]
    incremental_snapshot_chunk_size: int
    incremental_snapshot_watermarking_strategy: str
    topic_naming_strategy: str
    topic_delimiter: str
    topic_cache_size: int
    topic_heartbeat_prefix: str
    topic_transaction: str
    custom_metric_tags: dict[str, str]
    errors_max_retries: int
    # -- Kafka signal channel, notifications, file channel
    signal_kafka_topic: str
    signal_kafka_groupId: str  # the attribute rule keeps Debezium's camel case
    signal_kafka_bootstrap_servers: str | None
    signal_kafka_poll_timeout_ms: int
    signal_consumer_offset_commit_enabled: bool
    notification_sink_topic_name: str | None
    signal_file: str
    signal_poll_interval_ms: int
    # -- Kafka Connect worker offsets
    offset_flush_interval_ms: int
    offset_storage_file_filename: str | None
    # -- mongocdc
    mongocdc_event_format: str
    mongocdc_schemas_enable: bool
    mongocdc_metrics_file: str | None
    mongocdc_snapshot_split_size: int
    # -- pass-through groups and bookkeeping
    signal_consumer_properties: dict[str, str]
    producer_overrides: dict[str, str]
    mongocdc_kafka: dict[str, str]
    properties: dict[str, str]
    warnings: tuple[str, ...]
    _patterns: dict[str, tuple[re.Pattern[str], ...]]
    _literals: dict[str, frozenset[str]]

    _frozen: ClassVar[bool] = False

    def __init__(self, properties: Mapping[str, object], *, name: str | None = None) -> None:
        """Validate `properties` (Debezium names -> strings or JSON scalars); raise ConfigError on any problem.

        `name` is the connector name from an outer Kafka Connect JSON document.
        """
        problems: list[tuple[str, str]] = []
        warnings: list[str] = []
        raw: dict[str, str] = {}
        for key, value in properties.items():
            if not isinstance(key, str):
                problems.append((repr(key), "property names must be strings"))
                continue
            try:
                text = _scalar_to_str(key, value)
            except ConfigError as exc:
                problems.extend(exc.problems)
                continue
            if text is not None:
                raw[key] = text
        if name is not None:
            if "name" in raw and raw["name"].strip() != name.strip():
                problems.append(("name", f"the outer name {name!r} differs from config name {raw['name']!r}"))
            raw.setdefault("name", name)

        typed: dict[str, Any] = {}
        for spec in PROPERTY_SPECS:
            try:
                typed[spec.name] = _convert(spec, raw.get(spec.name))
            except _Invalid as exc:
                problems.append((spec.name, str(exc)))
                typed[spec.name] = _convert(spec, None)
        self._check_names(raw, problems)
        extras = self._collect_prefixed(raw, typed, problems, warnings)
        self._check_rules(raw, typed, problems, warnings)
        if problems:
            raise ConfigError(problems)

        if typed["signal.kafka.topic"] is None:
            typed["signal.kafka.topic"] = f"{typed['topic.prefix']}-signal"
        for spec in PROPERTY_SPECS:
            if spec.name != "snapshot.collection.filter.overrides":
                object.__setattr__(self, spec.attribute, typed[spec.name])
        for attr, value in extras.items():
            object.__setattr__(self, attr, value)
        object.__setattr__(self, "properties", raw)
        object.__setattr__(self, "warnings", tuple(warnings))
        object.__setattr__(self, "_patterns", self._compile_filters())
        object.__setattr__(self, "_literals", {
            prop: frozenset(item.lower() for item in self.get(prop))
            for prop in ("database.include.list", "database.exclude.list", "collection.include.list",
                         "collection.exclude.list")
        })
        for message in warnings:
            log.warning("%s", message)
        object.__setattr__(self, "_frozen", True)

    # -- construction ---------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ConnectorConfig:
        """From a dict of properties, or a Kafka Connect `{"name": ..., "config": {...}}` document."""
        config = data.get("config")
        if isinstance(config, Mapping):
            unexpected = sorted(set(data) - {"name", "config", "tasks", "type"})
            if unexpected:
                raise ConfigError(
                    [(key, "unexpected top-level key next to 'config' (properties go inside 'config')")
                     for key in unexpected]
                )
            outer = data.get("name")
            if outer is not None and not isinstance(outer, str):
                raise ConfigError([("name", f"expected a string, got {type(outer).__name__}")])
            return cls(config, name=outer)
        return cls(data)

    @classmethod
    def from_json(cls, text: str | bytes) -> ConnectorConfig:
        """From Debezium's JSON connector config (wrapped or bare)."""
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise ConfigError([("<json>", f"not valid JSON: {exc}")]) from None
        if not isinstance(data, dict):
            raise ConfigError([("<json>", "the connector config must be a JSON object")])
        return cls.from_dict(data)

    @classmethod
    def from_properties(cls, text: str) -> ConnectorConfig:
        """From the text of a Java `.properties` file."""
        return cls(parse_properties(text))

    @classmethod
    def load(cls, path: str | Path) -> ConnectorConfig:
        """From a file: JSON when the extension is .json or the content starts with '{', else properties."""
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError([(str(file), f"cannot read the connector config: {exc.strerror or exc}")]) from None
        except UnicodeDecodeError as exc:
            raise ConfigError([(str(file), f"not UTF-8 text: {exc}")]) from None
        if file.suffix.lower() == ".json" or (file.suffix.lower() != ".properties" and text.lstrip().startswith("{")):
            try:
                return cls.from_json(text)
            except ConfigError as exc:
                raise ConfigError(
                    [(str(file) if prop == "<json>" else prop, msg) for prop, msg in exc.problems]
                ) from None
        return cls.from_properties(text)

    def with_properties(self, overrides: Mapping[str, object]) -> ConnectorConfig:
        """A new, re-validated config with some properties changed (None removes one)."""
        merged: dict[str, object] = dict(self.properties)
        for key, value in overrides.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return ConnectorConfig(merged)

    def __setattr__(self, key: str, value: object) -> None:
        if self._frozen:
            raise AttributeError("ConnectorConfig is immutable; use with_properties()")
        object.__setattr__(self, key, value)

    # -- validation -------------------------------------------------------------------------------------------

    @staticmethod
    def _check_names(raw: Mapping[str, str], problems: list[tuple[str, str]]) -> None:
        for key in raw:
            if key in PROPERTIES or key in _CONNECT_PROPERTIES:
                continue
            if any(key.startswith(prefix) and len(key) > len(prefix) for prefix in PASS_THROUGH_PREFIXES):
                continue
            if key in _RENAMED_1X:
                problems.append((key, f"unknown property: {_RENAMED_1X[key]}"))
                continue
            problems.append((key, "unknown property" + _suggest(key, list(PROPERTIES) + list(_CONNECT_PROPERTIES))))

    @staticmethod
    def _collect_prefixed(
        raw: Mapping[str, str],
        typed: dict[str, Any],
        problems: list[tuple[str, str]],
        warnings: list[str],
    ) -> dict[str, Any]:
        """Gather the pass-through groups and the per-collection snapshot filters."""
        def group(prefix: str) -> dict[str, str]:
            return {k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix) and len(k) > len(prefix)}

        consumer = {k: v for k, v in group(SIGNAL_CONSUMER_PREFIX).items() if k != "offset.commit.enabled"}
        filters: dict[str, str] = {}
        named = typed["snapshot.collection.filter.overrides"]
        given = group(FILTER_OVERRIDE_PREFIX)
        for namespace in named:
            prop = FILTER_OVERRIDE_PREFIX + namespace
            if not _is_namespace(namespace):
                problems.append(("snapshot.collection.filter.overrides",
                                 f"{namespace!r} is not a <db>.<collection> name"))
                continue
            value = given.get(namespace, "").strip()
            if not value:
                problems.append((prop, f"is required because snapshot.collection.filter.overrides names {namespace}"))
                continue
            try:
                parsed = json_util.loads(value)
            except ValueError as exc:
                problems.append((prop, f"is not a valid JSON filter document ({exc})"))
                continue
            if not isinstance(parsed, dict):
                problems.append((prop, "must be a JSON filter document such as {\"status\": \"active\"}"))
                continue
            filters[namespace] = value
        for namespace in sorted(set(given) - set(named)):
            warnings.append(
                f"{FILTER_OVERRIDE_PREFIX}{namespace} is ignored: {namespace} is not named in "
                "snapshot.collection.filter.overrides"
            )
        return {
            "snapshot_collection_filter_overrides": filters,
            "signal_consumer_properties": consumer,
            "producer_overrides": group(PRODUCER_OVERRIDE_PREFIX),
            "mongocdc_kafka": group(MONGOCDC_KAFKA_PREFIX),
        }

    @staticmethod
    def _check_rules(
        raw: Mapping[str, str],
        typed: dict[str, Any],
        problems: list[tuple[str, str]],
        warnings: list[str],
    ) -> None:
        """Cross-property rules from the Debezium documentation."""
        def problem(prop: str, message: str) -> None:
            problems.append((prop, message))

        def is_set(prop: str) -> bool:
            return prop in raw and raw[prop].strip() != ""

        if not is_set("mongodb.connection.string"):
            problem("mongodb.connection.string", "is required (e.g. mongodb://localhost:27017/?replicaSet=rs0)")
        elif not re.match(r"^mongodb(\+srv)?://", typed["mongodb.connection.string"]):
            problem("mongodb.connection.string", "must start with mongodb:// or mongodb+srv://")
        prefix = typed["topic.prefix"]
        if not is_set("topic.prefix"):
            problem("topic.prefix", "is required (the logical name that prefixes every topic)")
        elif not _TOPIC_CHARS.match(prefix) or prefix in (".", "..") or len(prefix) > 249:
            problem("topic.prefix", f"{prefix!r} is not a valid Kafka topic name part; use only letters, "
                                    "digits, '.', '_' and '-' (at most 249 characters)")
        for prop, value in (("topic.heartbeat.prefix", typed["topic.heartbeat.prefix"]),
                            ("topic.transaction", typed["topic.transaction"]),
                            ("topic.delimiter", typed["topic.delimiter"])):
            if not value or not _TOPIC_CHARS.match(value):
                problem(prop, f"{value!r} contains characters invalid in Kafka topic names")
        if is_set("signal.kafka.topic") and not _TOPIC_CHARS.match(typed["signal.kafka.topic"]):
            problem("signal.kafka.topic", "contains characters invalid in Kafka topic names")

        connector_class = typed["connector.class"]
        if connector_class is not None and connector_class != CONNECTOR_CLASS:
            problem("connector.class", f"must be {CONNECTOR_CLASS}, got {connector_class!r}")
        if typed["mongodb.authentication.class"] not in _AUTH_PROVIDERS:
            problem("mongodb.authentication.class",
                    f"only {DEFAULT_AUTH_PROVIDER} is supported, got {typed['mongodb.authentication.class']!r}")
        if typed["topic.naming.strategy"] != DEFAULT_TOPIC_NAMING_STRATEGY:
            problem("topic.naming.strategy",
                    f"only {DEFAULT_TOPIC_NAMING_STRATEGY} is supported, got {typed['topic.naming.strategy']!r}")
        if typed["mongodb.password"] is not None and typed["mongodb.user"] is None:
            problem("mongodb.password", "is set but mongodb.user is not")

        for kind in ("database", "collection"):
            include, exclude = f"{kind}.include.list", f"{kind}.exclude.list"
            if typed[include] and typed[exclude]:
                problem(exclude, f"cannot be used together with {include}; set only one of them")
        regex_mode = typed["filters.match.mode"] == "regex"
        for prop in ("database.include.list", "database.exclude.list", "collection.include.list",
                     "collection.exclude.list", "snapshot.include.collection.list"):
            if not regex_mode and prop != "snapshot.include.collection.list":
                continue
            items = _split_regex_list(raw.get(prop, "")) if prop in raw else ()
            typed[prop] = items
            for pattern in items:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    problem(prop, f"invalid regular expression {pattern!r}: {exc}")

        for prop in ("field.exclude.list", "field.renames"):
            for item in typed[prop]:
                path, sep, new_name = item.partition(":") if prop == "field.renames" else (item, ":", "x")
                parts = path.split(".")
                if not sep or len(parts) < 3 or not all(parts) or not new_name or ":" in new_name:
                    form = "<db>.<coll>.<field>:<new name>" if prop == "field.renames" else "<db>.<coll>.<field>"
                    problem(prop, f"{item!r} is not of the form {form}")

        mode = typed["snapshot.mode"]
        if mode == "never":
            warnings.append("snapshot.mode=never is deprecated; use no_data (same behaviour)")
        if mode == "custom" and not typed["snapshot.mode.custom.name"]:
            problem("snapshot.mode.custom.name", "is required when snapshot.mode=custom")
        if mode != "configuration_based":
            for key in sorted(k for k in raw if k.startswith(_CB)):
                warnings.append(f"{key} has no effect because snapshot.mode is {mode}, not configuration_based")

        if typed["max.queue.size"] <= typed["max.batch.size"] and "max.queue.size" not in (p for p, _ in problems):
            problem("max.queue.size", f"must be larger than max.batch.size ({typed['max.queue.size']} <= "
                                      f"{typed['max.batch.size']})")
        if typed["connect.backoff.initial.delay.ms"] > typed["connect.backoff.max.delay.ms"]:
            problem("connect.backoff.initial.delay.ms", "must not exceed connect.backoff.max.delay.ms")
        if typed["cursor.oversize.handling.mode"] == "skip" and typed["cursor.oversize.skip.threshold"] <= 0:
            problem("cursor.oversize.skip.threshold",
                    "must be a positive number of bytes when cursor.oversize.handling.mode=skip")

        scope, target = typed["capture.scope"], typed["capture.target"]
        signal = typed["signal.data.collection"]
        if signal is not None and not _is_namespace(signal):
            problem("signal.data.collection", f"{signal!r} is not a fully-qualified <db>.<collection> name")
            signal = None
        if scope == "database":
            if not target:
                problem("capture.target", "is required when capture.scope=database (the database to watch)")
            elif "." in target:
                problem("capture.target", f"must be a database name when capture.scope=database, got {target!r}")
            elif signal is not None and signal.split(".", 1)[0] != target and "source" in typed[
                    "signal.enabled.channels"]:
                problem("signal.data.collection",
                        f"must be in the capture.target database {target!r} when capture.scope=database")
        elif scope == "collection":
            if not target or not _is_namespace(target):
                problem("capture.target", "must be a <db>.<collection> name when capture.scope=collection")
            elif signal is not None and signal != target and "source" in typed["signal.enabled.channels"]:
                warnings.append("signal.data.collection is outside the captured collection (capture.scope="
                                "collection), so the source signal channel will not see its signals")
        elif target:
            warnings.append("capture.target has no effect because capture.scope is deployment")

        if "sink" in typed["notification.enabled.channels"] and not typed["notification.sink.topic.name"]:
            problem("notification.sink.topic.name", "is required when notification.enabled.channels includes sink")
        if "kafka" in typed["signal.enabled.channels"] and not typed["signal.kafka.bootstrap.servers"]:
            problem("signal.kafka.bootstrap.servers", "is required when signal.enabled.channels includes kafka")

        schemas_flag = raw.get("value.converter.schemas.enable", "").strip().lower()
        if not is_set("mongocdc.schemas.enable") and schemas_flag in ("true", "false"):
            typed["mongocdc.schemas.enable"] = schemas_flag == "true"
        converter = raw.get("value.converter", "").strip()
        if converter and converter != _JSON_CONVERTER:
            warnings.append(f"value.converter {converter} is not applied; mongocdc writes Kafka Connect JSON")
        if is_set("transforms"):
            warnings.append("transforms (single message transforms) are not applied by mongocdc")

    # -- typed access -------------------------------------------------------------------------------------------

    def get(self, name: str) -> Any:
        """The typed value of a property by its Debezium name (raw string for pass-through properties)."""
        if name == "snapshot.collection.filter.overrides":
            return tuple(self.snapshot_collection_filter_overrides)
        if name in PROPERTIES:
            return getattr(self, PROPERTIES[name].attribute)
        if name.startswith(FILTER_OVERRIDE_PREFIX):
            return self.snapshot_collection_filter_overrides.get(name[len(FILTER_OVERRIDE_PREFIX):])
        if name in _CONNECT_PROPERTIES or any(name.startswith(p) for p in PASS_THROUGH_PREFIXES):
            return self.properties.get(name)
        raise KeyError(f"unknown property {name!r}{_suggest(name, PROPERTIES)}")

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for pymongo's MongoClient next to `mongodb_connection_string`.

        Only properties that were set, or whose Debezium default differs from pymongo's, are included, and
        nothing the connection string already sets (in Debezium the connection string wins).
        """
        uri_has_user, uri_options = _uri_parts(self.mongodb_connection_string)
        kwargs: dict[str, Any] = {}

        def put(option: str, value: Any) -> None:
            if option.lower() not in uri_options:
                kwargs[option] = value

        if self.mongodb_user is not None and not uri_has_user:
            kwargs["username"] = self.mongodb_user
            if self.mongodb_password is not None:
                kwargs["password"] = self.mongodb_password
            put("authSource", self.mongodb_authsource)
        if self.mongodb_ssl_enabled and "ssl" not in uri_options:
            put("tls", True)
            if self.mongodb_ssl_invalid_hostname_allowed:
                put("tlsAllowInvalidHostnames", True)
        explicit = self.properties
        # Debezium's 10 s connect timeout differs from pymongo's 20 s, so it always applies.
        put("connectTimeoutMS", self.mongodb_connect_timeout_ms)
        if "mongodb.heartbeat.frequency.ms" in explicit:
            put("heartbeatFrequencyMS", self.mongodb_heartbeat_frequency_ms)
        if "mongodb.socket.timeout.ms" in explicit and self.mongodb_socket_timeout_ms > 0:
            put("socketTimeoutMS", self.mongodb_socket_timeout_ms)
        if "mongodb.server.selection.timeout.ms" in explicit:
            put("serverSelectionTimeoutMS", self.mongodb_server_selection_timeout_ms)
        return kwargs

    # -- filters ------------------------------------------------------------------------------------------------

    def _compile_filters(self) -> dict[str, tuple[re.Pattern[str], ...]]:
        props = ["snapshot.include.collection.list"]
        if self.filters_match_mode == "regex":
            props += ["database.include.list", "database.exclude.list", "collection.include.list",
                      "collection.exclude.list"]
        return {prop: tuple(re.compile(p, re.IGNORECASE) for p in self.get(prop)) for prop in props}

    def _matches(self, prop: str, name: str) -> bool:
        if prop in self._patterns:
            return any(p.fullmatch(name) for p in self._patterns[prop])
        return name.lower() in self._literals[prop]

    def is_signal_collection(self, db: str, collection: str) -> bool:
        """Whether `db.collection` is the configured signaling collection."""
        return self.signal_data_collection == f"{db}.{collection}"

    def database_included(self, db: str) -> bool:
        """Whether changes in database `db` are captured (filters, capture scope, built-in databases).

        The database of the signaling collection is always included so signals are seen.
        """
        signal = self.signal_data_collection
        return (signal is not None and signal.split(".", 1)[0] == db) or self._database_captured(db)

    def collection_included(self, db: str, collection: str) -> bool:
        """Whether changes in `db.collection` are captured; the signaling collection always is.

        Regex mode matches each pattern against the whole `<db>.<collection>` (anchored); literal mode
        compares whole names. Both ignore case, as Debezium does. System collections (`system.*`) and the
        admin, config and local databases are never captured.
        """
        return self.is_signal_collection(db, collection) or self._collection_captured(db, collection)

    def snapshot_collection_included(self, db: str, collection: str) -> bool:
        """Whether an initial or blocking snapshot copies `db.collection`.

        It must be captured by the filters (the signaling collection only counts if the filters capture
        it) and match snapshot.include.collection.list when that is set.
        """
        if not self._collection_captured(db, collection):
            return False
        if self.snapshot_include_collection_list:
            return self._matches("snapshot.include.collection.list", f"{db}.{collection}")
        return True

    def _database_captured(self, db: str) -> bool:
        if db in BUILT_IN_DATABASES:
            return False
        if self.capture_scope == "database" and db != self.capture_target:
            return False
        if self.capture_scope == "collection" and db != (self.capture_target or "").split(".", 1)[0]:
            return False
        if self.database_include_list:
            return self._matches("database.include.list", db)
        if self.database_exclude_list:
            return not self._matches("database.exclude.list", db)
        return True

    def _collection_captured(self, db: str, collection: str) -> bool:
        if collection.startswith("system.") or not self._database_captured(db):
            return False
        namespace = f"{db}.{collection}"
        if self.capture_scope == "collection" and namespace != self.capture_target:
            return False
        if self.collection_include_list:
            return self._matches("collection.include.list", namespace)
        if self.collection_exclude_list:
            return not self._matches("collection.exclude.list", namespace)
        return True

    # -- topics (Debezium's DefaultTopicNamingStrategy) ----------------------------------------------------------

    def data_topic(self, db: str, collection: str) -> str:
        """`<topic.prefix>.<db>.<collection>`, invalid topic characters replaced by '_' as Debezium does."""
        d = self.topic_delimiter
        return _TOPIC_INVALID_CHAR.sub("_", f"{self.topic_prefix}{d}{db}{d}{collection}")

    def transaction_topic(self) -> str:
        """`<topic.prefix>.<topic.transaction>`."""
        return f"{self.topic_prefix}{self.topic_delimiter}{self.topic_transaction}"

    def heartbeat_topic(self) -> str:
        """`<topic.heartbeat.prefix>.<topic.prefix>`."""
        return f"{self.topic_heartbeat_prefix}{self.topic_delimiter}{self.topic_prefix}"

    # -- presentation ---------------------------------------------------------------------------------------------

    def redacted_properties(self) -> dict[str, str]:
        """The raw properties with passwords and secrets masked, safe to log or show."""
        out: dict[str, str] = {}
        for key, value in self.properties.items():
            if _is_secret(key):
                out[key] = _MASK
            elif key == "mongodb.connection.string":
                out[key] = _mask_connection_string(value)
            else:
                out[key] = value
        return out

    def __repr__(self) -> str:
        return f"ConnectorConfig({self.redacted_properties()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConnectorConfig) and self.properties == other.properties

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.properties.items())))


def _is_namespace(value: str) -> bool:
    db, dot, collection = value.partition(".")
    return bool(db and dot and collection)
