"""The typed, validated connector configuration that every part of mongocdc reads.

A mongocdc connector is configured exactly like Debezium's MongoDB connector so existing connector
configs (Kafka Connect JSON or ``.properties``) work unchanged. Every property arrives as a string;
each one becomes a typed attribute named after the property (``a.b.c`` -> ``a_b_c``), the whole
configuration is validated at once and every problem is reported on its own line, naming the
property, so users fix a config in one pass instead of one error at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import orjson

from mongocdc_core.config.codec import parse_properties, scalar_to_str
from mongocdc_core.config.errors import ConfigError, Invalid, suggest
from mongocdc_core.config.filters import CollectionFilters
from mongocdc_core.config.providers import resolve as resolve_providers
from mongocdc_core.config.specs import (
    CONNECT_PROPERTIES,
    FILTER_OVERRIDE_PREFIX,
    PASS_THROUGH_PREFIXES,
    PRODUCER_OVERRIDE_PREFIX,
    PROPERTIES,
    PROPERTY_SPECS,
    SIGNAL_CONSUMER_PREFIX,
)
from mongocdc_core.config.uri import MASK, is_secret, mask_connection_string, uri_parts
from mongocdc_core.config.validators import filters_of, validate
from mongocdc_core.config.values import convert
from mongocdc_core.events.naming import TopicNamingStrategy, TopicSettings, topic_naming

log = logging.getLogger("mongocdc_core.config")


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
    event_processing_failure_handling_mode: str
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
    mongocdc_metrics_port: int
    mongocdc_snapshot_split_size: int
    mongocdc_jsonl_compression: str
    mongocdc_snapshot_delete_missing_keys: bool
    mongocdc_kafka_topic_creation_enable: bool
    mongocdc_kafka_topic_partitions: int
    mongocdc_kafka_topic_replication_factor: int
    mongocdc_kafka_topic_cleanup_policy: str
    mongocdc_kafka_exactly_once: bool
    mongocdc_kafka_transaction_timeout_ms: int
    # -- pass-through groups and bookkeeping
    signal_consumer_properties: dict[str, str]
    producer_overrides: dict[str, str]
    properties: dict[str, str]
    #: The properties as written, config provider variables unresolved (``with_properties`` starts from them).
    written_properties: dict[str, str]
    warnings: tuple[str, ...]
    filters: CollectionFilters
    _topics: TopicNamingStrategy

    _frozen: ClassVar[bool] = False

    def __init__(self, properties: Mapping[str, object], *, name: str | None = None) -> None:
        """Validate `properties` (Debezium names -> strings or JSON scalars); raise ConfigError on any problem.

        `name` is the connector name from an outer Kafka Connect JSON document.
        """
        problems: list[tuple[str, str]] = []
        raw: dict[str, str] = {}
        for key, value in properties.items():
            if not isinstance(key, str):
                problems.append((repr(key), "property names must be strings"))
                continue
            try:
                text = scalar_to_str(key, value)
            except ConfigError as exc:
                problems.extend(exc.problems)
                continue
            if text is not None:
                raw[key] = text
        if name is not None:
            if "name" in raw and raw["name"].strip() != name.strip():
                problems.append(("name", f"the outer name {name!r} differs from config name {raw['name']!r}"))
            raw.setdefault("name", name)
        # the properties as written (variables and all): a changed copy resolves them again, once
        written = dict(raw)
        resolution = resolve_providers(raw)
        raw = resolution.properties
        problems.extend(resolution.problems)

        typed: dict[str, Any] = {}
        for spec in PROPERTY_SPECS:
            try:
                typed[spec.name] = convert(spec, raw.get(spec.name))
            except Invalid as exc:
                problems.append((spec.name, str(exc)))
                typed[spec.name] = convert(spec, None)
        draft = validate(raw, typed, problems)
        if draft.problems:
            raise ConfigError([(prop, resolution.mask(message)) for prop, message in draft.problems])

        if typed["signal.kafka.topic"] is None:
            typed["signal.kafka.topic"] = f"{typed['topic.prefix']}-signal"
        for spec in PROPERTY_SPECS:
            object.__setattr__(self, spec.attribute, typed[spec.name])
        object.__setattr__(self, "signal_consumer_properties", {
            k: v for k, v in _group(raw, SIGNAL_CONSUMER_PREFIX).items() if k != "offset.commit.enabled"
        })
        object.__setattr__(self, "producer_overrides", _group(raw, PRODUCER_OVERRIDE_PREFIX))
        object.__setattr__(self, "properties", raw)
        object.__setattr__(self, "written_properties", written)
        object.__setattr__(self, "warnings", tuple(resolution.mask(w) for w in draft.warnings))
        object.__setattr__(self, "filters", filters_of(typed))
        object.__setattr__(self, "_topics", topic_naming(self.topic_naming_strategy, self.topic_settings()))
        for message in self.warnings:
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
        merged: dict[str, object] = dict(self.written_properties)
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

    # -- typed access -------------------------------------------------------------------------------------------

    def get(self, name: str) -> Any:
        """The typed value of a property by its Debezium name (raw string for pass-through properties)."""
        if name == "snapshot.collection.filter.overrides":
            return tuple(self.snapshot_collection_filter_overrides)
        if name in PROPERTIES:
            return getattr(self, PROPERTIES[name].attribute)
        if name.startswith(FILTER_OVERRIDE_PREFIX):
            return self.snapshot_collection_filter_overrides.get(name[len(FILTER_OVERRIDE_PREFIX):])
        if name in CONNECT_PROPERTIES or any(name.startswith(p) for p in PASS_THROUGH_PREFIXES):
            return self.properties.get(name)
        raise KeyError(f"unknown property {name!r}{suggest(name, PROPERTIES)}")

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for pymongo's MongoClient next to `mongodb_connection_string`.

        Only properties that were set, or whose Debezium default differs from pymongo's, are included, and
        nothing the connection string already sets (in Debezium the connection string wins).
        """
        uri_has_user, uri_options = uri_parts(self.mongodb_connection_string)
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

    # -- filters (see filters.py) ---------------------------------------------------------------------------------

    def is_signal_collection(self, db: str, collection: str) -> bool:
        """Whether `db.collection` is the configured signaling collection."""
        return self.filters.is_signal_collection(db, collection)

    def database_included(self, db: str) -> bool:
        """Whether changes in database `db` are captured; the signaling collection's database always is."""
        return self.filters.database_included(db)

    def collection_included(self, db: str, collection: str) -> bool:
        """Whether changes in `db.collection` are captured; the signaling collection always is."""
        return self.filters.collection_included(db, collection)

    def snapshot_collection_included(self, db: str, collection: str) -> bool:
        """Whether an initial or blocking snapshot copies `db.collection`."""
        return self.filters.snapshot_collection_included(db, collection)

    # -- topics (events/naming.py) -------------------------------------------------------------------------------

    def topic_settings(self) -> TopicSettings:
        """The ``topic.*`` properties a naming strategy reads."""
        return TopicSettings(self.topic_prefix, self.topic_delimiter, self.topic_heartbeat_prefix,
                             self.topic_transaction)

    def topic_naming(self) -> TopicNamingStrategy:
        """The ``topic.naming.strategy`` in use (resolved once, when the config was validated)."""
        return self._topics

    def data_topic(self, db: str, collection: str) -> str:
        """The topic of a collection's change events, as the converter names it."""
        return self.topic_naming().data_change_topic(db, collection)

    def transaction_topic(self) -> str:
        """`<topic.prefix>.<topic.transaction>`."""
        return self.topic_naming().transaction_topic()

    def heartbeat_topic(self) -> str:
        """`<topic.heartbeat.prefix>.<topic.prefix>`."""
        return self.topic_naming().heartbeat_topic()

    # -- presentation ---------------------------------------------------------------------------------------------

    def redacted_properties(self) -> dict[str, str]:
        """The raw properties with passwords and secrets masked, safe to log or show."""
        out: dict[str, str] = {}
        for key, value in self.properties.items():
            if is_secret(key):
                out[key] = MASK
            elif key == "mongodb.connection.string":
                out[key] = mask_connection_string(value)
            else:
                out[key] = value
        return out

    def __repr__(self) -> str:
        return f"ConnectorConfig({self.redacted_properties()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConnectorConfig) and self.properties == other.properties

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.properties.items())))


def _group(raw: Mapping[str, str], prefix: str) -> dict[str, str]:
    """The properties under a pass-through prefix, prefix removed."""
    return {k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix) and len(k) > len(prefix)}
