"""The configuration's rules, one small function each, run in order over a :class:`Draft`.

Each rule reads the raw strings and the converted values and reports problems (which refuse the
config) or warnings (which are logged); all problems are collected, so a user fixes a config in one
pass. Adding a rule means writing one function and listing it in :data:`RULES`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bson import json_util
from pymongo import uri_parser
from pymongo.errors import ConfigurationError

from mongocdc_core.config.errors import suggest
from mongocdc_core.config.filters import CollectionFilters
from mongocdc_core.config.specs import (
    AUTH_PROVIDERS,
    CB,
    CONNECT_PROPERTIES,
    CONNECTOR_CLASS,
    DEFAULT_AUTH_PROVIDER,
    FILTER_OVERRIDE_PREFIX,
    JSON_CONVERTER,
    PASS_THROUGH_PREFIXES,
    PROPERTIES,
    RENAMED_1X,
    TOPIC_CHARS,
)
from mongocdc_core.config.uri import MASK, uri_parts
from mongocdc_core.config.values import split_regex_list
from mongocdc_core.events.naming import TopicNamingError, strategy_class

_REGEX_LISTS = ("database.include.list", "database.exclude.list", "collection.include.list",
                "collection.exclude.list")
# A snapshot.include.collection.list entry that names one collection (no regex beyond escaped dots).
_LITERAL_NAMESPACE = re.compile(r"[\w$-]+(?:\\?\.[\w$-]+)+")
# srv-only options a plain mongodb:// parse would refuse (the srv form is checked without DNS lookups).
_SRV_ONLY_OPTIONS = ("srvservicename", "srvmaxhosts")


@dataclass
class Draft:
    """A configuration being validated: raw strings, converted values (rules may refine them), findings."""

    raw: Mapping[str, str]
    typed: dict[str, Any]
    problems: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def problem(self, prop: str, message: str) -> None:
        self.problems.append((prop, message))

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def is_set(self, prop: str) -> bool:
        return prop in self.raw and self.raw[prop].strip() != ""

    def has_problem(self, prop: str) -> bool:
        return any(p == prop for p, _ in self.problems)


Rule = Callable[[Draft], None]


def is_namespace(value: str) -> bool:
    """Whether ``value`` is ``<db>.<collection>`` with both parts non-empty."""
    db, dot, collection = value.partition(".")
    return bool(db and dot and collection)


def known_names(d: Draft) -> None:
    """Every property is known; a typo gets the closest name, an old 1.x name what replaced it."""
    candidates = list(PROPERTIES) + list(CONNECT_PROPERTIES)
    for key in d.raw:
        if key in PROPERTIES or key in CONNECT_PROPERTIES:
            continue
        if any(key.startswith(prefix) and len(key) > len(prefix) for prefix in PASS_THROUGH_PREFIXES):
            continue
        if key in RENAMED_1X:
            d.problem(key, f"unknown property: {RENAMED_1X[key]}")
        else:
            d.problem(key, "unknown property" + suggest(key, candidates))


def connection_string(d: Draft) -> None:
    """Required, and a connection string pymongo accepts: ports in range, only known options."""
    if not d.is_set("mongodb.connection.string"):
        d.problem("mongodb.connection.string", "is required (e.g. mongodb://localhost:27017/?replicaSet=rs0)")
        return
    uri: str = d.typed["mongodb.connection.string"]
    if not re.match(r"^mongodb(\+srv)?://", uri):
        d.problem("mongodb.connection.string", "must start with mongodb:// or mongodb+srv://")
        return
    checked = uri
    if uri.startswith("mongodb+srv://"):
        _, options = uri_parts(uri)
        checked = "mongodb://" + uri[len("mongodb+srv://"):]
        if any(option in options for option in _SRV_ONLY_OPTIONS):
            base, _, query = checked.partition("?")
            kept = [item for item in query.split("&") if item.split("=", 1)[0].lower() not in _SRV_ONLY_OPTIONS]
            checked = base + ("?" + "&".join(kept) if kept else "")
    try:
        uri_parser.parse_uri(checked, validate=True, warn=False)
    except (ConfigurationError, ValueError, TypeError) as exc:
        reason = str(exc).replace(" Refer to docstring.", "")
        password = re.match(r"^mongodb(?:\+srv)?://[^:/@]*:([^@/]*)@", uri)
        if password and password.group(1):
            reason = reason.replace(password.group(1), MASK)  # never echo a secret, whatever the driver says
        d.problem("mongodb.connection.string", f"is not a valid MongoDB connection string: {reason}")


def tls_agrees_with_uri(d: Draft) -> None:
    """``mongodb.ssl.enabled=true`` must not be silently overridden by ``tls=false`` in the URI."""
    if not d.typed["mongodb.ssl.enabled"] or d.has_problem("mongodb.connection.string"):
        return
    _, options = uri_parts(d.typed["mongodb.connection.string"] or "")
    for option in ("tls", "ssl"):
        if options.get(option, "").strip().lower() == "false":
            d.problem("mongodb.ssl.enabled", f"is true but mongodb.connection.string sets {option}=false; "
                                             "remove one of them")


def topic_names(d: Draft) -> None:
    """The prefix and the other topic name parts hold only characters Kafka allows."""
    prefix = d.typed["topic.prefix"]
    if not d.is_set("topic.prefix"):
        d.problem("topic.prefix", "is required (the logical name that prefixes every topic)")
    elif not TOPIC_CHARS.match(prefix) or prefix in (".", "..") or len(prefix) > 249:
        d.problem("topic.prefix", f"{prefix!r} is not a valid Kafka topic name part; use only letters, "
                                  "digits, '.', '_' and '-' (at most 249 characters)")
    for prop in ("topic.heartbeat.prefix", "topic.transaction", "topic.delimiter"):
        value = d.typed[prop]
        if not value or not TOPIC_CHARS.match(value):
            d.problem(prop, f"{value!r} contains characters invalid in Kafka topic names")
    if d.is_set("signal.kafka.topic") and not TOPIC_CHARS.match(d.typed["signal.kafka.topic"]):
        d.problem("signal.kafka.topic", "contains characters invalid in Kafka topic names")


def topic_naming_strategy(d: Draft) -> None:
    """``topic.naming.strategy`` resolves to a built-in or registered strategy."""
    try:
        strategy_class(d.typed["topic.naming.strategy"])
    except TopicNamingError as exc:
        d.problem("topic.naming.strategy", str(exc))


def connector_and_auth(d: Draft) -> None:
    """Only the MongoDB connector class and Debezium's default credentials provider."""
    connector_class = d.typed["connector.class"]
    if connector_class is not None and connector_class != CONNECTOR_CLASS:
        d.problem("connector.class", f"must be {CONNECTOR_CLASS}, got {connector_class!r}")
    provider = d.typed["mongodb.authentication.class"]
    if provider not in AUTH_PROVIDERS:
        d.problem("mongodb.authentication.class", f"only {DEFAULT_AUTH_PROVIDER} is supported, got {provider!r}")
    if d.typed["mongodb.password"] is not None and d.typed["mongodb.user"] is None:
        d.problem("mongodb.password", "is set but mongodb.user is not")


def filter_lists(d: Draft) -> None:
    """Include and exclude lists are exclusive; in regex mode every entry compiles."""
    for kind in ("database", "collection"):
        include, exclude = f"{kind}.include.list", f"{kind}.exclude.list"
        if d.typed[include] and d.typed[exclude]:
            d.problem(exclude, f"cannot be used together with {include}; set only one of them")
    regex_mode = d.typed["filters.match.mode"] == "regex"
    for prop in (*_REGEX_LISTS, "snapshot.include.collection.list"):
        if not regex_mode and prop != "snapshot.include.collection.list":
            continue
        items = split_regex_list(d.raw.get(prop, "")) if prop in d.raw else ()
        d.typed[prop] = items
        for pattern in items:
            try:
                re.compile(pattern)
            except re.error as exc:
                d.problem(prop, f"invalid regular expression {pattern!r}: {exc}")


def snapshot_list_within_captured(d: Draft) -> None:
    """A collection named in ``snapshot.include.collection.list`` must be one the filters capture."""
    if any(d.has_problem(p) for p in (*_REGEX_LISTS, "snapshot.include.collection.list", "capture.target")):
        return
    filters = filters_of(d.typed)
    for entry in d.typed["snapshot.include.collection.list"]:
        if not _LITERAL_NAMESPACE.fullmatch(entry):
            continue
        db, _, collection = entry.replace("\\.", ".").partition(".")
        if not filters.collection_captured(db, collection):
            d.problem("snapshot.include.collection.list",
                      f"{db}.{collection} is not a captured collection (check database/collection include and "
                      "exclude lists and capture.scope); a snapshot can only copy captured collections")


def field_paths(d: Draft) -> None:
    """``field.exclude.list`` and ``field.renames`` entries name a field inside a collection."""
    for prop in ("field.exclude.list", "field.renames"):
        for item in d.typed[prop]:
            path, sep, new_name = item.partition(":") if prop == "field.renames" else (item, ":", "x")
            parts = path.split(".")
            if not sep or len(parts) < 3 or not all(parts) or not new_name or ":" in new_name:
                form = "<db>.<coll>.<field>:<new name>" if prop == "field.renames" else "<db>.<coll>.<field>"
                d.problem(prop, f"{item!r} is not of the form {form}")


def snapshot_mode(d: Draft) -> None:
    """Deprecated and custom modes, and configuration_based settings that would do nothing."""
    mode = d.typed["snapshot.mode"]
    if mode == "never":
        d.warn("snapshot.mode=never is deprecated; use no_data (same behaviour)")
    if mode == "custom" and not d.typed["snapshot.mode.custom.name"]:
        d.problem("snapshot.mode.custom.name", "is required when snapshot.mode=custom")
    if mode != "configuration_based":
        for key in sorted(k for k in d.raw if k.startswith(CB)):
            d.warn(f"{key} has no effect because snapshot.mode is {mode}, not configuration_based")


def snapshot_filter_overrides(d: Draft) -> None:
    """Each collection in ``snapshot.collection.filter.overrides`` has a JSON filter document."""
    named: tuple[str, ...] = d.typed["snapshot.collection.filter.overrides"]
    given = {k[len(FILTER_OVERRIDE_PREFIX):]: v for k, v in d.raw.items()
             if k.startswith(FILTER_OVERRIDE_PREFIX) and len(k) > len(FILTER_OVERRIDE_PREFIX)}
    filters: dict[str, str] = {}
    for namespace in named:
        prop = FILTER_OVERRIDE_PREFIX + namespace
        if not is_namespace(namespace):
            d.problem("snapshot.collection.filter.overrides", f"{namespace!r} is not a <db>.<collection> name")
            continue
        value = given.get(namespace, "").strip()
        if not value:
            d.problem(prop, f"is required because snapshot.collection.filter.overrides names {namespace}")
            continue
        try:
            parsed = json_util.loads(value)
        except ValueError as exc:
            d.problem(prop, f"is not a valid JSON filter document ({exc})")
            continue
        if not isinstance(parsed, dict):
            d.problem(prop, "must be a JSON filter document such as {\"status\": \"active\"}")
            continue
        filters[namespace] = value
    for namespace in sorted(set(given) - set(named)):
        d.warn(f"{FILTER_OVERRIDE_PREFIX}{namespace} is ignored: {namespace} is not named in "
               "snapshot.collection.filter.overrides")
    d.typed["snapshot.collection.filter.overrides"] = filters


def queue_and_backoff(d: Draft) -> None:
    """The queue holds more than a batch; backoff grows; skip mode has a threshold."""
    if d.typed["max.queue.size"] <= d.typed["max.batch.size"] and not d.has_problem("max.queue.size"):
        d.problem("max.queue.size", f"must be larger than max.batch.size ({d.typed['max.queue.size']} <= "
                                    f"{d.typed['max.batch.size']})")
    if d.typed["connect.backoff.initial.delay.ms"] > d.typed["connect.backoff.max.delay.ms"]:
        d.problem("connect.backoff.initial.delay.ms", "must not exceed connect.backoff.max.delay.ms")
    if d.typed["cursor.oversize.handling.mode"] == "skip" and d.typed["cursor.oversize.skip.threshold"] <= 0:
        d.problem("cursor.oversize.skip.threshold",
                  "must be a positive number of bytes when cursor.oversize.handling.mode=skip")


def capture_scope(d: Draft) -> None:
    """``capture.target`` fits ``capture.scope``, and the signaling collection is visible in it."""
    scope, target = d.typed["capture.scope"], d.typed["capture.target"]
    signal = d.typed["signal.data.collection"]
    if signal is not None and not is_namespace(signal):
        d.problem("signal.data.collection", f"{signal!r} is not a fully-qualified <db>.<collection> name")
        signal = None
    source_channel = "source" in d.typed["signal.enabled.channels"]
    if scope == "database":
        if not target:
            d.problem("capture.target", "is required when capture.scope=database (the database to watch)")
        elif "." in target:
            d.problem("capture.target", f"must be a database name when capture.scope=database, got {target!r}")
        elif signal is not None and signal.split(".", 1)[0] != target and source_channel:
            d.problem("signal.data.collection",
                      f"must be in the capture.target database {target!r} when capture.scope=database")
    elif scope == "collection":
        if not target or not is_namespace(target):
            d.problem("capture.target", "must be a <db>.<collection> name when capture.scope=collection")
        elif signal is not None and signal != target and source_channel:
            d.warn("signal.data.collection is outside the captured collection (capture.scope=collection), so "
                   "the source signal channel will not see its signals")
    elif target:
        d.warn("capture.target has no effect because capture.scope is deployment")


def channels(d: Draft) -> None:
    """Enabled channels have what they need."""
    if "sink" in d.typed["notification.enabled.channels"] and not d.typed["notification.sink.topic.name"]:
        d.problem("notification.sink.topic.name", "is required when notification.enabled.channels includes sink")
    if "kafka" in d.typed["signal.enabled.channels"] and not d.typed["signal.kafka.bootstrap.servers"]:
        d.problem("signal.kafka.bootstrap.servers", "is required when signal.enabled.channels includes kafka")


def source_struct_version(d: Draft) -> None:
    """Only the v2 source block exists: v1 (the pre-0.10 layout) is refused rather than ignored."""
    if d.typed["source.struct.version"] == "v1":
        d.problem("source.struct.version", "v1 (the source block of Debezium before 0.10) is not produced by "
                                           "mongocdc, which writes the current v2 block; remove the property "
                                           "or set it to v2")


def kafka_sink(d: Draft) -> None:
    """``mongocdc.kafka.*`` values that their type alone does not rule out."""
    if d.typed["mongocdc.kafka.topic.replication.factor"] == 0:
        d.problem("mongocdc.kafka.topic.replication.factor", "must be -1 (broker default) or >= 1, got 0")


def kafka_connect_settings(d: Draft) -> None:
    """Kafka Connect's converter settings: schemas.enable is honoured, other converters and SMTs are not."""
    schemas_flag = d.raw.get("value.converter.schemas.enable", "").strip().lower()
    if not d.is_set("mongocdc.schemas.enable") and schemas_flag in ("true", "false"):
        d.typed["mongocdc.schemas.enable"] = schemas_flag == "true"
    converter = d.raw.get("value.converter", "").strip()
    if converter and converter != JSON_CONVERTER:
        d.warn(f"value.converter {converter} is not applied; mongocdc writes Kafka Connect JSON")
    if d.is_set("transforms"):
        d.warn("transforms (single message transforms) are not applied by mongocdc")


_SCHEMAS_FLAGS = ("key.converter.schemas.enable", "value.converter.schemas.enable")


def debezium_3x_schemas(d: Draft) -> None:
    """``debezium_3x`` promises Debezium's bytes, so the JsonConverter settings a Debezium config
    carries must describe what mongocdc writes: one schemas setting for keys and values."""
    if d.typed["mongocdc.event.format"] != "debezium_3x":
        return
    flags = {prop: d.raw[prop].strip().lower() for prop in _SCHEMAS_FLAGS if d.is_set(prop)}
    if d.is_set("mongocdc.schemas.enable"):
        flags["mongocdc.schemas.enable"] = str(d.typed["mongocdc.schemas.enable"]).lower()
    if len(set(flags.values())) > 1:
        listed = ", ".join(f"{prop}={value}" for prop, value in flags.items())
        d.problem("mongocdc.event.format", f"debezium_3x writes keys and values with one JsonConverter schemas "
                                           f"setting, but the config asks for different ones ({listed}); set "
                                           f"them all alike, or only mongocdc.schemas.enable")
    elif flags and not d.is_set("mongocdc.schemas.enable"):
        d.typed["mongocdc.schemas.enable"] = next(iter(flags.values())) == "true"


def filters_of(typed: Mapping[str, Any]) -> CollectionFilters:
    """The capture filters described by converted property values."""
    return CollectionFilters(
        regex_mode=typed["filters.match.mode"] == "regex",
        lists={prop: tuple(typed[prop]) for prop in (*_REGEX_LISTS, "snapshot.include.collection.list")},
        capture_scope=typed["capture.scope"],
        capture_target=typed["capture.target"],
        signal_data_collection=typed["signal.data.collection"],
    )


RULES: tuple[Rule, ...] = (
    known_names,
    connection_string,
    tls_agrees_with_uri,
    topic_names,
    topic_naming_strategy,
    connector_and_auth,
    filter_lists,
    capture_scope,
    snapshot_list_within_captured,
    field_paths,
    snapshot_mode,
    snapshot_filter_overrides,
    queue_and_backoff,
    channels,
    source_struct_version,
    kafka_sink,
    kafka_connect_settings,
    debezium_3x_schemas,
)


def validate(raw: Mapping[str, str], typed: dict[str, Any], problems: list[tuple[str, str]]) -> Draft:
    """Run every rule; ``problems`` are those found while converting values, reported first."""
    draft = Draft(raw, typed, list(problems))
    for rule in RULES:
        rule(draft)
    return draft
