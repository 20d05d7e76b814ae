"""Tests for ConnectorConfig: Debezium defaults, loading formats, validation, filters, secrets."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from bson import ObjectId
from hypothesis import given, settings
from hypothesis import strategies as st

from mongocdc_core.config import (
    CONNECTOR_CLASS,
    PROPERTY_SPECS,
    ConfigError,
    ConnectorConfig,
    dump_properties,
    parse_properties,
)

BASE = {"mongodb.connection.string": "mongodb://localhost:27017/?replicaSet=rs0", "topic.prefix": "fulfillment"}


def make(**overrides: Any) -> ConnectorConfig:
    """A valid config plus overrides given with underscores for dots (`max_batch_size=10`)."""
    props: dict[str, Any] = dict(BASE)
    for key, value in overrides.items():
        props[key.replace("_", ".")] = value
    return ConnectorConfig(props)


def cfg(props: dict[str, Any]) -> ConnectorConfig:
    return ConnectorConfig({**BASE, **props})


def config_error(props: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        cfg(props)
    return info.value


# ---------------------------------------------------------------------------------------------------------
# defaults, checked against the seed
# ---------------------------------------------------------------------------------------------------------

# (property, default text as printed in seed 000 (None: the row has no default cell), typed default).
# Rows are in the seed's table order; the last rows are not in the seed's tables.
SEED_DEFAULTS: list[tuple[str, str | None, Any]] = [
    ("mongodb.allow.offset.invalidation", "false", False),
    ("name", "No default", None),
    ("connector.class", "No default", None),
    ("mongodb.connection.string", "No default", "<required>"),
    ("topic.prefix", "No default", "<required>"),
    ("mongodb.authentication.class", "DefaultMongoDbAuthProvider", "DefaultMongoDbAuthProvider"),
    ("mongodb.user", "No default", None),
    ("mongodb.password", "No default", None),
    ("mongodb.authsource", "admin", "admin"),
    ("mongodb.ssl.enabled", "false", False),
    ("mongodb.ssl.invalid.hostname.allowed", "false", False),
    ("filters.match.mode", "regex", "regex"),
    ("database.include.list", "empty string", ()),
    ("database.exclude.list", "empty string", ()),
    ("collection.include.list", "empty string", ()),
    ("collection.exclude.list", "empty string", ()),
    # The flattened seed lost an underscore: Debezium's value is change_streams_update_full.
    ("capture.mode", "changestreams_update_full", "change_streams_update_full"),
    ("capture.scope", "deployment", "deployment"),
    ("capture.target", None, None),
    ("field.exclude.list", "empty string", ()),
    ("field.renames", "empty string", ()),
    ("tombstones.on.delete", "true", True),
    ("schema.name.adjustment.mode", "none", "none"),
    ("field.name.adjustment.mode", "none", "none"),
    ("capture.mode.full.update.type", "lookup", "lookup"),
    ("max.batch.size", "2048", 2048),
    ("max.queue.size", "8192", 8192),
    ("max.queue.size.in.bytes", "0", 0),
    ("poll.interval.ms", "1000", 1000),
    ("connect.backoff.initial.delay.ms", "1000", 1000),
    # The seed's default cell says 1000 but its text (and Debezium) say 120 seconds; docs/architecture.md section 2.
    ("connect.backoff.max.delay.ms", "1000", 120000),
    ("connect.max.attempts", "16", 16),
    ("source.struct.version", "v2", "v2"),
    ("heartbeat.interval.ms", "0", 0),
    ("skipped.operations", "t", frozenset({"t"})),
    ("snapshot.collection.filter.overrides", "No default", ()),
    # "No default" in the docs; Debezium's code default is 0 (no delay).
    ("snapshot.delay.ms", "No default", 0),
    ("snapshot.fetch.size", "0", 0),
    ("snapshot.include.collection.list", "All collections specified in collection.include.list", ()),
    ("snapshot.max.threads", "1", 1),
    ("snapshot.mode", "initial", "initial"),
    ("snapshot.mode.configuration.based.snapshot.data", "false", False),
    ("snapshot.mode.configuration.based.snapshot.schema", "false", False),
    ("snapshot.mode.configuration.based.start.stream", "false", False),
    ("snapshot.mode.configuration.based.snapshot.on.schema.error", "false", False),
    ("snapshot.mode.configuration.based.snapshot.on.data.error", "false", False),
    ("snapshot.mode.custom.name", "No default", None),
    ("provide.transaction.metadata", "false", False),
    ("retriable.restart.connector.wait.ms", "10000 (10 seconds)", 10000),
    ("mongodb.poll.interval.ms", "30000", 30000),
    ("mongodb.connect.timeout.ms", "10000 (10 seconds)", 10000),
    ("mongodb.heartbeat.frequency.ms", "10000 (10 seconds)", 10000),
    ("mongodb.socket.timeout.ms", "0", 0),
    ("mongodb.server.selection.timeout.ms", "30000 (30 seconds)", 30000),
    ("cursor.pipeline", "No default", []),
    ("cursor.pipeline.order", "internal_first", "internal_first"),
    ("cursor.oversize.handling.mode", "fail", "fail"),
    ("cursor.oversize.skip.threshold", "0", 0),
    ("cursor.max.await.time.ms", "0", 0),
    ("signal.data.collection", "No default", None),
    ("signal.enabled.channels", "source", ("source",)),
    ("notification.enabled.channels", "No default", ()),
    ("incremental.snapshot.chunk.size", "1024", 1024),
    ("incremental.snapshot.watermarking.strategy", "insert_insert", "insert_insert"),
    ("topic.naming.strategy", "io.debezium.schema.DefaultTopicNamingStrategy",
     "io.debezium.schema.DefaultTopicNamingStrategy"),
    ("topic.delimiter", ".", "."),
    ("topic.cache.size", "10000", 10000),
    # The flattened seed lost the leading underscores (emphasis markup); the 1.x docs show them.
    ("topic.heartbeat.prefix", "debezium-heartbeat", "__debezium-heartbeat"),
    ("topic.transaction", "transaction", "transaction"),
    ("custom.metric.tags", "No default", {}),
    ("errors.max.retries", "-1", -1),
    ("event.processing.failure.handling.mode", None, "fail"),  # Debezium's common property, not in the table
    ("signal.kafka.topic", "<topic.prefix>-signal", "fulfillment-signal"),
    ("signal.kafka.groupId", "kafka-signal", "kafka-signal"),
    ("signal.kafka.bootstrap.servers", "No default", None),
    ("signal.kafka.poll.timeout.ms", "100", 100),
    ("signal.consumer.offset.commit.enabled", "false", False),
    ("notification.sink.topic.name", "No default", None),
    # Not in the seed's tables.
    ("signal.file", None, "file-signals.txt"),
    ("signal.poll.interval.ms", None, 5000),
    ("offset.flush.interval.ms", None, 60000),
    ("offset.storage.file.filename", None, None),
    ("mongocdc.event.format", None, "change_streams"),
    ("mongocdc.schemas.enable", None, True),
    ("mongocdc.metrics.file", None, None),
    ("mongocdc.metrics.port", None, 0),
    ("mongocdc.snapshot.split.size", None, 250000),
    ("mongocdc.jsonl.compression", None, "none"),
    ("mongocdc.snapshot.delete.missing.keys", None, False),
    ("mongocdc.kafka.topic.creation.enable", None, True),
    ("mongocdc.kafka.topic.partitions", None, 1),
    ("mongocdc.kafka.topic.replication.factor", None, -1),
    ("mongocdc.kafka.topic.cleanup.policy", None, "delete"),
    ("mongocdc.kafka.exactly.once", None, False),
    ("mongocdc.kafka.transaction.timeout.ms", None, 900000),
]
SEED_000 = sorted((Path(__file__).resolve().parents[3] / "shared" / "seeds").glob("000_*.txt"))


def test_default_table_covers_every_property_in_order() -> None:
    assert [row[0] for row in SEED_DEFAULTS] == [spec.name for spec in PROPERTY_SPECS]


@pytest.mark.parametrize(("prop", "seed_text", "expected"), SEED_DEFAULTS, ids=[r[0] for r in SEED_DEFAULTS])
def test_default_value(prop: str, seed_text: str | None, expected: Any) -> None:
    config = ConnectorConfig(BASE)
    if expected == "<required>":
        assert config.get(prop) == BASE[prop]
        return
    assert config.get(prop) == expected
    assert type(config.get(prop)) is type(expected)


@pytest.mark.skipif(not SEED_000, reason="seed documents not present next to this checkout")
def test_default_texts_appear_in_the_seed_tables_in_order() -> None:
    lines = SEED_000[0].read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Table 13. Required"))
    position = start
    for prop, seed_text, _ in SEED_DEFAULTS:
        if seed_text is None:
            continue
        found = next((i for i in range(position + 1, len(lines)) if lines[i].strip() == seed_text), None)
        assert found is not None, f"{prop}: default {seed_text!r} not found after line {position + 1}"
        position = found


def test_every_property_has_its_attribute_and_get_agrees() -> None:
    config = ConnectorConfig(BASE)
    for spec in PROPERTY_SPECS:
        attribute = spec.name.replace(".", "_").replace("-", "_")
        assert spec.attribute == attribute
        if spec.name != "snapshot.collection.filter.overrides":
            assert getattr(config, attribute) == config.get(spec.name)
    assert config.signal_kafka_groupId == "kafka-signal"
    assert config.snapshot_collection_filter_overrides == {}


def test_get_unknown_property_suggests() -> None:
    with pytest.raises(KeyError, match="max.batch.size"):
        ConnectorConfig(BASE).get("max.bath.size")


# ---------------------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------------------

CONNECT_JSON = {
    "name": "inventory-connector",
    "config": {
        "connector.class": CONNECTOR_CLASS,
        "mongodb.connection.string": "mongodb://mongo1:27017/?replicaSet=rs0",
        "topic.prefix": "fulfillment",
        "collection.include.list": "inventory.orders, inventory.customers ,",
        "max.batch.size": 100,
        "tombstones.on.delete": False,
        "tasks.max": "1",
    },
}


def test_from_dict_kafka_connect_document_takes_outer_name() -> None:
    config = ConnectorConfig.from_dict(CONNECT_JSON)
    assert config.name == "inventory-connector"
    assert config.properties["name"] == "inventory-connector"
    assert config.collection_include_list == ("inventory.orders", "inventory.customers")
    assert config.max_batch_size == 100
    assert config.tombstones_on_delete is False
    assert config.properties["max.batch.size"] == "100"
    assert config.properties["tombstones.on.delete"] == "false"


def test_from_json_bare_properties() -> None:
    config = ConnectorConfig.from_json(json.dumps({**BASE, "capture.mode": "CHANGE_STREAMS"}))
    assert config.name is None
    assert config.capture_mode == "change_streams"


def test_outer_and_inner_name_must_agree() -> None:
    doc = {"name": "a", "config": {**BASE, "name": "b"}}
    with pytest.raises(ConfigError) as info:
        ConnectorConfig.from_dict(doc)
    assert info.value.properties == ("name",)


def test_unexpected_top_level_key_next_to_config() -> None:
    with pytest.raises(ConfigError, match="max.batch.size"):
        ConnectorConfig.from_dict({"name": "x", "config": BASE, "max.batch.size": "5"})


def test_nested_json_value_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"max\.batch\.size: expected a string or scalar"):
        cfg({"max.batch.size": {"value": 5}})


def test_load_json_file_by_extension(tmp_path: Path) -> None:
    path = tmp_path / "connector.json"
    path.write_text(json.dumps(CONNECT_JSON))
    assert ConnectorConfig.load(path).name == "inventory-connector"


def test_load_sniffs_json_content(tmp_path: Path) -> None:
    path = tmp_path / "connector.conf"
    path.write_text("\n  " + json.dumps(CONNECT_JSON))
    assert ConnectorConfig.load(str(path)).topic_prefix == "fulfillment"


def test_load_properties_file(tmp_path: Path) -> None:
    path = tmp_path / "mongo.properties"
    path.write_text(
        "# Debezium MongoDB connector\n"
        "! another comment style\n"
        "name=inventory-connector\n"
        "connector.class: io.debezium.connector.mongodb.MongoDbConnector\n"
        "mongodb.connection.string = mongodb://mongo1:27017/?replicaSet=rs0\n"
        "topic.prefix fulfillment\n"
        "collection.include.list=inventory.orders,\\\n"
        "    inventory.customers\n"
        "\n"
        "mongodb.password=p\\u00e4ss\\#word\n"
        "mongodb.user=debezium\n",
        encoding="utf-8",
    )
    config = ConnectorConfig.load(path)
    assert config.name == "inventory-connector"
    assert config.connector_class == CONNECTOR_CLASS
    assert config.topic_prefix == "fulfillment"
    assert config.collection_include_list == ("inventory.orders", "inventory.customers")
    assert config.mongodb_password == "päss#word"


def test_load_reports_unreadable_and_invalid_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match="nope.json"):
        ConnectorConfig.load(missing)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="broken.json: not valid JSON"):
        ConnectorConfig.load(broken)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Truth = Beauty\n", {"Truth": "Beauty"}),
        ("  Truth:Beauty", {"Truth": "Beauty"}),
        ("Truth                    :Beauty", {"Truth": "Beauty"}),
        ("fruits   apple, banana, pear, \\\n    cantaloupe, watermelon, \\\n    kiwi, mango",
         {"fruits": "apple, banana, pear, cantaloupe, watermelon, kiwi, mango"}),
        ("cheeses\n", {"cheeses": ""}),
        ("a\\ b\\=c=d e \n", {"a b=c": "d e "}),
        ("# comment \\\nkey=v", {"key": "v"}),
        ("key=a\\\n\nother=b", {"key": "a", "other": "b"}),
        ("key=a\\\n  # not a comment", {"key": "a# not a comment"}),
        ("key=ends with backslash\\\\\nnext=1", {"key": "ends with backslash\\", "next": "1"}),
        ("k=\\ud83d\\ude00\\t\\n", {"k": "\U0001f600\t\n"}),
        ("k=v\r\nk2=v2\rk3=v3", {"k": "v", "k2": "v2", "k3": "v3"}),
        ("k=1\nk=2", {"k": "2"}),
    ],
)
def test_parse_properties_java_semantics(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


def test_parse_properties_malformed_unicode_escape() -> None:
    with pytest.raises(ConfigError, match="malformed"):
        parse_properties("k=\\u12x4")


_prop_text = st.text(st.characters(codec="utf-8"), max_size=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_prop_text, _prop_text, max_size=8))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert parse_properties(dump_properties(props)) == props


@settings(max_examples=50, deadline=None)
@given(
    batch=st.integers(min_value=1, max_value=5000),
    password=st.text(st.characters(codec="utf-8"), min_size=1, max_size=12).filter(
        lambda s: s.strip() == s
    ),
    collections=st.lists(st.from_regex(r"[a-z]{1,8}\.[a-z]{1,8}", fullmatch=True), max_size=4),
)
def test_config_round_trips_through_properties_file(batch: int, password: str, collections: list[str]) -> None:
    config = make(
        max_batch_size=batch,
        max_queue_size=batch + 1,
        mongodb_user="u",
        mongodb_password=password,
        collection_include_list=",".join(collections),
    )
    again = ConnectorConfig.from_properties(dump_properties(config.properties))
    assert again == config
    assert again.mongodb_password == password
    assert again.collection_include_list == tuple(collections)


# ---------------------------------------------------------------------------------------------------------
# typed conversions
# ---------------------------------------------------------------------------------------------------------


def test_conversions() -> None:
    config = cfg({
        "skipped.operations": "c, D",
        "signal.enabled.channels": "source,Kafka",
        "signal.kafka.bootstrap.servers": "127.0.0.1:9092",
        "notification.enabled.channels": "log",
        "custom.metric.tags": "k1=v1, k2=v2",
        "field.renames": "inventory.orders.qty:quantity, *.*.a.b:c",
        "field.exclude.list": "inventory.orders.secret",
        "snapshot.mode": "When_Needed",
        "topic.prefix": "  fulfillment  ",
    })
    assert config.skipped_operations == frozenset({"c", "d"})
    assert config.signal_enabled_channels == ("source", "kafka")
    assert config.notification_enabled_channels == ("log",)
    assert config.custom_metric_tags == {"k1": "v1", "k2": "v2"}
    assert config.field_renames == ("inventory.orders.qty:quantity", "*.*.a.b:c")
    assert config.field_exclude_list == ("inventory.orders.secret",)
    assert config.snapshot_mode == "when_needed"
    assert config.topic_prefix == "fulfillment"


def test_skipped_operations_none_means_empty() -> None:
    assert make(skipped_operations="none").skipped_operations == frozenset()


def test_cursor_pipeline_is_parsed_extended_json() -> None:
    pipeline = '[{"$match": {"fullDocument._id": {"$oid": "5f0c6e2b9d1e8c3a4b5c6d7e"}}}, {"$project": {"x": 1}}]'
    config = make(cursor_pipeline=pipeline)
    assert config.cursor_pipeline == [
        {"$match": {"fullDocument._id": ObjectId("5f0c6e2b9d1e8c3a4b5c6d7e")}},
        {"$project": {"x": 1}},
    ]


def test_cursor_pipeline_may_be_a_json_array_in_connect_json() -> None:
    doc = {"config": {**BASE, "cursor.pipeline": [{"$match": {"operationType": "insert"}}]}}
    assert ConnectorConfig.from_dict(doc).cursor_pipeline == [{"$match": {"operationType": "insert"}}]


def test_snapshot_filter_overrides_and_pass_through_groups() -> None:
    config = cfg({
        "snapshot.collection.filter.overrides": "inventory.orders,customers.all.people",
        "snapshot.collection.filter.overrides.inventory.orders": '{"status": "active"}',
        "snapshot.collection.filter.overrides.customers.all.people": "{}",
        "signal.consumer.security.protocol": "SSL",
        "signal.consumer.offset.commit.enabled": "true",
        "producer.override.linger.ms": "5",
        "key.converter.schemas.enable": "false",
    })
    assert config.snapshot_collection_filter_overrides == {
        "inventory.orders": '{"status": "active"}',
        "customers.all.people": "{}",
    }
    assert config.get("snapshot.collection.filter.overrides.inventory.orders") == '{"status": "active"}'
    assert config.get("snapshot.collection.filter.overrides") == ("inventory.orders", "customers.all.people")
    assert config.signal_consumer_properties == {"security.protocol": "SSL"}
    assert config.signal_consumer_offset_commit_enabled is True
    assert config.producer_overrides == {"linger.ms": "5"}
    assert config.get("producer.override.linger.ms") == "5"


def test_unlisted_filter_override_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mongocdc_core.config"):
        config = cfg({"snapshot.collection.filter.overrides.inventory.orders": "{}"})
    assert config.snapshot_collection_filter_overrides == {}
    assert "snapshot.collection.filter.overrides.inventory.orders" in caplog.text


def test_schemas_enable_follows_value_converter_unless_set() -> None:
    assert cfg({"value.converter.schemas.enable": "false"}).mongocdc_schemas_enable is False
    both = cfg({"value.converter.schemas.enable": "false", "mongocdc.schemas.enable": "true"})
    assert both.mongocdc_schemas_enable is True
    assert make(mongocdc_event_format="OPLOG_1X").mongocdc_event_format == "oplog_1x"


def test_derived_signal_topic_and_topic_names() -> None:
    config = cfg({"topic.delimiter": "_", "topic.transaction": "tx"})
    assert config.signal_kafka_topic == "fulfillment-signal"
    assert config.data_topic("inventory", "orders") == "fulfillment_inventory_orders"
    assert config.transaction_topic() == "fulfillment_tx"
    assert config.heartbeat_topic() == "__debezium-heartbeat_fulfillment"
    assert ConnectorConfig(BASE).data_topic("db", "a b$c") == "fulfillment.db.a_b_c"


def test_config_is_immutable_and_with_properties_revalidates() -> None:
    config = ConnectorConfig(BASE)
    with pytest.raises(AttributeError):
        config.max_batch_size = 5
    smaller = config.with_properties({"max.batch.size": "10"})
    assert smaller.max_batch_size == 10 and config.max_batch_size == 2048
    with pytest.raises(ConfigError, match="topic.prefix"):
        config.with_properties({"topic.prefix": None})


# ---------------------------------------------------------------------------------------------------------
# validation: every message names the property
# ---------------------------------------------------------------------------------------------------------

VALIDATION_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("missing connection string", {"mongodb.connection.string": None}, "mongodb.connection.string"),
    ("bad connection string", {"mongodb.connection.string": "localhost:27017"}, "mongodb.connection.string"),
    ("missing topic prefix", {"topic.prefix": ""}, "topic.prefix"),
    ("unknown property", {"max.bath.size": "1"}, "max.bath.size"),
    ("1.x property", {"mongodb.hosts": "rs0/h:27017"}, "mongodb.hosts"),
    ("bad int", {"max.batch.size": "many"}, "max.batch.size"),
    ("float int", {"snapshot.fetch.size": 1.5}, "snapshot.fetch.size"),
    ("bad bool", {"tombstones.on.delete": "yes"}, "tombstones.on.delete"),
    ("bad enum", {"capture.mode": "oplog"}, "capture.mode"),
    ("bad scope", {"capture.scope": "cluster"}, "capture.scope"),
    ("bad order", {"cursor.pipeline.order": "last"}, "cursor.pipeline.order"),
    ("bad adjustment", {"schema.name.adjustment.mode": "avrounicode"}, "schema.name.adjustment.mode"),
    ("bad event format", {"mongocdc.event.format": "patch"}, "mongocdc.event.format"),
    ("bad watermarking", {"incremental.snapshot.watermarking.strategy": "x"},
     "incremental.snapshot.watermarking.strategy"),
    ("both collection lists", {"collection.include.list": "a.b", "collection.exclude.list": "c.d"},
     "collection.exclude.list"),
    ("both database lists", {"database.include.list": "a", "database.exclude.list": "c"}, "database.exclude.list"),
    ("invalid include regex", {"collection.include.list": "inventory.(orders"}, "collection.include.list"),
    ("invalid exclude regex", {"database.exclude.list": "[abc"}, "database.exclude.list"),
    ("invalid snapshot regex", {"snapshot.include.collection.list": "a.*("}, "snapshot.include.collection.list"),
    ("custom without name", {"snapshot.mode": "custom"}, "snapshot.mode.custom.name"),
    ("skip without threshold", {"cursor.oversize.handling.mode": "skip"}, "cursor.oversize.skip.threshold"),
    ("database scope without target", {"capture.scope": "database"}, "capture.target"),
    ("collection scope bad target", {"capture.scope": "collection", "capture.target": "inventory"},
     "capture.target"),
    ("signal outside target db", {"capture.scope": "database", "capture.target": "inventory",
                                  "signal.data.collection": "other.signals"}, "signal.data.collection"),
    ("signal not qualified", {"signal.data.collection": "signals"}, "signal.data.collection"),
    ("topic prefix chars", {"topic.prefix": "ful/fillment"}, "topic.prefix"),
    ("topic prefix dot", {"topic.prefix": ".."}, "topic.prefix"),
    ("heartbeat prefix chars", {"topic.heartbeat.prefix": "a b"}, "topic.heartbeat.prefix"),
    ("queue not larger", {"max.queue.size": "2048"}, "max.queue.size"),
    ("negative duration", {"heartbeat.interval.ms": "-1"}, "heartbeat.interval.ms"),
    ("negative delay", {"snapshot.delay.ms": "-5"}, "snapshot.delay.ms"),
    ("zero batch", {"max.batch.size": "0"}, "max.batch.size"),
    ("bad rename", {"field.renames": "inventory.orders.qty"}, "field.renames"),
    ("bad rename target", {"field.renames": "inventory.qty:quantity"}, "field.renames"),
    ("bad exclude field", {"field.exclude.list": "orders"}, "field.exclude.list"),
    ("retries below -1", {"errors.max.retries": "-2"}, "errors.max.retries"),
    ("bad operation", {"skipped.operations": "c,x"}, "skipped.operations"),
    ("none with others", {"skipped.operations": "none,c"}, "skipped.operations"),
    ("pipeline not array", {"cursor.pipeline": '{"$match": {}}'}, "cursor.pipeline"),
    ("pipeline not objects", {"cursor.pipeline": "[1, 2]"}, "cursor.pipeline"),
    ("pipeline not json", {"cursor.pipeline": "[{$match: 1}"}, "cursor.pipeline"),
    ("bad tags", {"custom.metric.tags": "k1"}, "custom.metric.tags"),
    ("unknown channel", {"signal.enabled.channels": "source,carrier-pigeon"}, "signal.enabled.channels"),
    ("sink without topic", {"notification.enabled.channels": "sink"}, "notification.sink.topic.name"),
    ("kafka signals without brokers", {"signal.enabled.channels": "kafka"}, "signal.kafka.bootstrap.servers"),
    ("filter override missing", {"snapshot.collection.filter.overrides": "inventory.orders"},
     "snapshot.collection.filter.overrides.inventory.orders"),
    ("filter override not json", {"snapshot.collection.filter.overrides": "inventory.orders",
                                  "snapshot.collection.filter.overrides.inventory.orders": "status = 1"},
     "snapshot.collection.filter.overrides.inventory.orders"),
    ("filter override not namespace", {"snapshot.collection.filter.overrides": "orders"},
     "snapshot.collection.filter.overrides"),
    ("other connector", {"connector.class": "io.debezium.connector.mysql.MySqlConnector"}, "connector.class"),
    ("other auth provider", {"mongodb.authentication.class": "com.example.Auth"}, "mongodb.authentication.class"),
    ("other naming strategy", {"topic.naming.strategy": "com.example.Naming"}, "topic.naming.strategy"),
    ("password without user", {"mongodb.password": "pw"}, "mongodb.password"),
    ("backoff inverted", {"connect.backoff.initial.delay.ms": "5000", "connect.backoff.max.delay.ms": "1000"},
     "connect.backoff.initial.delay.ms"),
    ("heartbeat too frequent", {"mongodb.heartbeat.frequency.ms": "10"}, "mongodb.heartbeat.frequency.ms"),
]


@pytest.mark.parametrize(("props", "prop"), [c[1:] for c in VALIDATION_CASES], ids=[c[0] for c in VALIDATION_CASES])
def test_validation_error_names_the_property(props: dict[str, Any], prop: str) -> None:
    error = config_error(props)
    assert isinstance(error, ValueError)
    assert prop in error.properties
    assert re.search(rf"^  {re.escape(prop)}: ", str(error), re.MULTILINE)


def test_unknown_property_suggests_closest_name() -> None:
    assert "did you mean 'tombstones.on.delete'" in str(config_error({"tombstone.on.delete": "true"}))
    assert "mongodb.connection.string" in str(config_error({"mongodb.hosts": "h:1"}))


def test_all_problems_reported_together_one_line_each() -> None:
    error = config_error({
        "topic.prefix": None,
        "max.batch.size": "x",
        "capture.mode": "nope",
        "collection.include.list": "a.b",
        "collection.exclude.list": "c.d",
        "bogus.property": "1",
    })
    assert set(error.properties) == {
        "topic.prefix", "max.batch.size", "capture.mode", "collection.exclude.list", "bogus.property",
    }
    assert str(error).count("\n") == len(error.problems)


def test_kafka_connect_framework_properties_are_accepted(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mongocdc_core.config"):
        config = cfg({
            "tasks.max": "1",
            "transforms": "unwrap",
            "transforms.unwrap.type": "io.debezium.connector.mongodb.transforms.ExtractNewDocumentState",
            "value.converter": "io.confluent.connect.avro.AvroConverter",
        })
    assert config.properties["tasks.max"] == "1"
    assert "transforms" in caplog.text and "value.converter" in caplog.text


def test_never_is_kept_with_a_deprecation_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mongocdc_core.config"):
        config = make(snapshot_mode="never")
    assert config.snapshot_mode == "never"
    assert "deprecated" in caplog.text and "no_data" in caplog.text
    assert any("snapshot.mode" in w for w in config.warnings)


def test_configuration_based_sub_properties_warn_when_mode_differs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mongocdc_core.config"):
        config = cfg({"snapshot.mode.configuration.based.snapshot.data": "true"})
    assert config.snapshot_mode_configuration_based_snapshot_data is True
    assert "snapshot.mode.configuration.based.snapshot.data" in caplog.text
    quiet = cfg({"snapshot.mode": "configuration_based", "snapshot.mode.configuration.based.start.stream": "true"})
    assert quiet.warnings == ()
    assert quiet.snapshot_mode_configuration_based_start_stream is True


def test_valid_scopes() -> None:
    database = cfg({"capture.scope": "database", "capture.target": "inventory",
                    "signal.data.collection": "inventory.signals"})
    assert database.capture_target == "inventory"
    skip = cfg({"cursor.oversize.handling.mode": "skip", "cursor.oversize.skip.threshold": "1024"})
    assert skip.cursor_oversize_skip_threshold == 1024


# ---------------------------------------------------------------------------------------------------------
# filters
# ---------------------------------------------------------------------------------------------------------


def test_regex_collection_include_is_anchored() -> None:
    config = cfg({"collection.include.list": "inventory.orders, inventory\\.cust.*"})
    assert config.collection_included("inventory", "orders")
    assert not config.collection_included("inventory", "orders2")
    assert not config.collection_included("xinventory", "orders")
    assert config.collection_included("inventory", "customers")
    assert not config.collection_included("other", "customers")


def test_regex_matches_whole_namespace_with_dotted_collection_names() -> None:
    config = cfg({"collection.include.list": "inventory\\.orders"})
    assert config.collection_included("inventory", "orders")
    assert not config.collection_included("inventory", "orders.archive")
    dotted = cfg({"collection.include.list": "inventory\\.orders\\..*"})
    assert dotted.collection_included("inventory", "orders.archive")
    assert not dotted.collection_included("inventory", "orders")


def test_regex_filters_are_case_insensitive_like_debezium() -> None:
    assert cfg({"collection.include.list": "Inventory.Orders"}).collection_included("inventory", "orders")


def test_regex_list_keeps_commas_inside_quantifiers_and_classes() -> None:
    config = cfg({"collection.include.list": "db.c{1,3}, db.[x,y]z"})
    assert config.collection_include_list == ("db.c{1,3}", "db.[x,y]z")
    assert config.collection_included("db", "ccc")
    assert config.collection_included("db", ",z")
    assert not config.collection_included("db", "cccc")


def test_regex_exclude_and_database_lists() -> None:
    config = cfg({"collection.exclude.list": "inventory\\.audit.*", "database.include.list": "inventory,sales"})
    assert config.collection_included("inventory", "orders")
    assert not config.collection_included("inventory", "audit_log")
    assert config.collection_included("sales", "audit_log")
    assert config.database_included("sales")
    assert not config.database_included("sales2")
    assert not config.collection_included("hr", "people")
    excluded = cfg({"database.exclude.list": "hr.*"})
    assert not excluded.database_included("hr_eu")
    assert excluded.database_included("xhr")


def test_literal_mode_is_exact() -> None:
    config = cfg({"filters.match.mode": "literal", "collection.include.list": " inventory.orders , a.b.c "})
    assert config.collection_included("inventory", "orders")
    assert not config.collection_included("inventory", "orders2")
    assert not config.collection_included("inventoryXorders", "x")
    assert config.collection_included("a", "b.c")
    assert config.collection_included("Inventory", "ORDERS")  # Debezium compares literals ignoring case
    # Regex metacharacters mean nothing in literal mode, so invalid regexes are fine.
    assert cfg({"filters.match.mode": "literal", "database.include.list": "in(ventory"}).database_included("in(ventory")


def test_builtin_databases_and_system_collections_are_never_captured() -> None:
    config = ConnectorConfig(BASE)
    for db in ("admin", "config", "local"):
        assert not config.database_included(db)
        assert not config.collection_included(db, "anything")
    assert not config.collection_included("inventory", "system.views")
    assert config.collection_included("inventory", "orders")


def test_signal_collection_is_always_included() -> None:
    config = cfg({"collection.include.list": "inventory\\.orders", "database.include.list": None,
                  "signal.data.collection": "ops.debezium_signal"})
    assert config.collection_included("ops", "debezium_signal")
    assert config.is_signal_collection("ops", "debezium_signal")
    assert config.database_included("ops")
    assert not config.collection_included("ops", "other")
    assert not config.snapshot_collection_included("ops", "debezium_signal")


def test_capture_scope_limits_filters() -> None:
    database = cfg({"capture.scope": "database", "capture.target": "inventory"})
    assert database.database_included("inventory") and not database.database_included("sales")
    assert database.collection_included("inventory", "orders")
    collection = cfg({"capture.scope": "collection", "capture.target": "inventory.orders"})
    assert collection.collection_included("inventory", "orders")
    assert not collection.collection_included("inventory", "customers")


def test_snapshot_include_collection_list() -> None:
    config = cfg({"collection.include.list": "inventory\\..*", "snapshot.include.collection.list": "inventory.orders"})
    assert config.snapshot_collection_included("inventory", "orders")
    assert not config.snapshot_collection_included("inventory", "orders2")
    assert config.collection_included("inventory", "orders2")
    assert not config.snapshot_collection_included("sales", "orders")


_names = st.from_regex(r"[A-Za-z0-9_]{1,10}(\.[A-Za-z0-9_]{1,6})?", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(db=st.from_regex(r"[A-Za-z0-9_]{1,10}", fullmatch=True), coll=_names, other=_names)
def test_escaped_namespace_matches_only_itself(db: str, coll: str, other: str) -> None:
    if db.lower() in ("admin", "config", "local") or coll.startswith("system."):
        return
    config = cfg({"collection.include.list": re.escape(f"{db}.{coll}")})
    literal = cfg({"filters.match.mode": "literal", "collection.include.list": f"{db}.{coll}"})
    assert config.collection_included(db, coll) and literal.collection_included(db, coll)
    assert config.collection_included(db, other) == (other.lower() == coll.lower())
    assert literal.collection_included(db, other) == (other.lower() == coll.lower())


# ---------------------------------------------------------------------------------------------------------
# connection and secrets
# ---------------------------------------------------------------------------------------------------------


def test_connection_kwargs_defaults() -> None:
    # Only Debezium's connect timeout differs from pymongo's defaults.
    assert ConnectorConfig(BASE).connection_kwargs() == {"connectTimeoutMS": 10000}


def test_connection_kwargs_from_properties() -> None:
    config = cfg({
        "mongodb.user": "debezium", "mongodb.password": "dbz", "mongodb.authsource": "users",
        "mongodb.ssl.enabled": "true", "mongodb.ssl.invalid.hostname.allowed": "true",
        "mongodb.connect.timeout.ms": "500", "mongodb.heartbeat.frequency.ms": "1000",
        "mongodb.socket.timeout.ms": "2000", "mongodb.server.selection.timeout.ms": "3000",
    })
    assert config.connection_kwargs() == {
        "username": "debezium", "password": "dbz", "authSource": "users", "tls": True,
        "tlsAllowInvalidHostnames": True, "connectTimeoutMS": 500, "heartbeatFrequencyMS": 1000,
        "socketTimeoutMS": 2000, "serverSelectionTimeoutMS": 3000,
    }


def test_connection_string_settings_win() -> None:
    config = cfg({
        "mongodb.connection.string": "mongodb://a:b@h:27017/?authSource=x&TLS=true&connectTimeoutMS=1",
        "mongodb.user": "debezium", "mongodb.password": "dbz", "mongodb.ssl.enabled": "true",
    })
    assert config.connection_kwargs() == {}
    # TLS asked for by the property but switched off by the URI is a contradiction, not a silent plain run.
    error = config_error({"mongodb.connection.string": "mongodb://h/?tls=false", "mongodb.ssl.enabled": "true"})
    assert error.properties == ("mongodb.ssl.enabled",) and "tls=false" in str(error)
    auth = cfg({"mongodb.connection.string": "mongodb://h/?authSource=x", "mongodb.user": "u"})
    assert auth.connection_kwargs() == {"username": "u", "connectTimeoutMS": 10000}


def test_connection_kwargs_work_with_pymongo() -> None:
    from pymongo import MongoClient

    config = cfg({"mongodb.user": "u", "mongodb.password": "p", "mongodb.ssl.enabled": "false",
                  "mongodb.server.selection.timeout.ms": "100"})
    client: MongoClient[dict[str, Any]] = MongoClient(
        config.mongodb_connection_string, connect=False, **config.connection_kwargs()
    )
    try:
        assert client.options.pool_options.connect_timeout == 10.0
        assert client.options.server_selection_timeout == 0.1
    finally:
        client.close()


def test_repr_masks_secrets(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        config = cfg({
            "mongodb.connection.string": "mongodb://admin:hunter2@h:27017/?replicaSet=rs0",
            "mongodb.user": "debezium", "mongodb.password": "s3cr3t-pw",
            "signal.consumer.ssl.keystore.password": "ks-pw",
            "signal.consumer.sasl.jaas.config": "org.Login required password=\"jaas-pw\";",
            "producer.override.sasl.client.secret": "client-secret",
            "snapshot.mode": "never",
        })
    text = repr(config) + str(config) + caplog.text
    for secret in ("hunter2", "s3cr3t-pw", "ks-pw", "jaas-pw", "client-secret"):
        assert secret not in text
    assert "debezium" in repr(config) and "mongodb://admin:********@h:27017" in repr(config)
    assert config.redacted_properties()["mongodb.password"] == "********"
    # The real values stay available to the code that needs them.
    assert config.mongodb_password == "s3cr3t-pw"


def test_errors_do_not_echo_passwords() -> None:
    error = config_error({"mongodb.password": "topsecret-value"})
    assert "topsecret-value" not in str(error)


def test_mongocdc_properties_are_validated_whatever_the_sink() -> None:
    error = config_error({"mongocdc.kafka.exactly.onse": "true", "mongocdc.metrics.prot": "1"})
    assert error.properties == ("mongocdc.kafka.exactly.onse", "mongocdc.metrics.prot")
    assert "did you mean 'mongocdc.kafka.exactly.once'?" in str(error)
    assert "did you mean 'mongocdc.metrics.port'?" in str(error)
    config = cfg({"mongocdc.kafka.exactly.once": "TRUE", "mongocdc.kafka.topic.cleanup.policy": "Compact"})
    assert config.mongocdc_kafka_exactly_once is True and config.mongocdc_kafka_topic_cleanup_policy == "compact"


def test_change_stream_pipeline_stages_are_checked() -> None:
    allowed = cfg({"cursor.pipeline": '[{"$match": {"operationType": "insert"}}, {"$set": {"x": 1}}]'})
    assert [next(iter(stage)) for stage in allowed.cursor_pipeline] == ["$match", "$set"]
    error = config_error({"cursor.pipeline": '[{"$match": {}}, {"$out": "x"}]'})
    assert error.properties == ("cursor.pipeline",)
    assert "stage 2 uses '$out', which a change stream does not allow" in str(error)


def test_snapshot_list_must_name_captured_collections() -> None:
    ok = cfg({"collection.include.list": "inv\\..*", "snapshot.include.collection.list": "inv.orders,other\\..*"})
    assert ok.snapshot_include_collection_list == ("inv.orders", "other\\..*")  # patterns cannot be checked
    error = config_error({"collection.include.list": "inv\\..*", "snapshot.include.collection.list": "crm.people"})
    assert error.properties == ("snapshot.include.collection.list",) and "crm.people" in str(error)


@pytest.mark.parametrize("uri", [
    "mongodb://bob:topsecret-value@h:99999/",
    "mongodb://bob:topsecret-value@h/?replicaSet=rs0&bogusOption=topsecret-value",
])
def test_connection_string_errors_name_the_property_without_the_password(uri: str) -> None:
    error = config_error({"mongodb.connection.string": uri})
    assert error.properties == ("mongodb.connection.string",) and "topsecret-value" not in str(error)


# -- Kafka's config providers ------------------------------------------------------------------------------

PROVIDERS = {
    "config.providers": "env,file,dir",
    "config.providers.env.class": "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
    "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
    "config.providers.dir.class": "org.apache.kafka.common.config.provider.DirectoryConfigProvider",
}


def test_secrets_come_from_kafkas_config_providers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_PASSWORD", "s3cr:t}$")
    (tmp_path / "secrets.properties").write_text("user=cdc\nprefix = shop\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tls").write_text("true")
    config = cfg({**PROVIDERS, "mongodb.password": "${env:CDC_PASSWORD}",
                  "mongodb.user": f"${{file:{tmp_path}/secrets.properties:user}}",
                  "topic.prefix": f"${{file:{tmp_path}/secrets.properties:prefix}}-cdc",
                  "mongodb.ssl.enabled": f"${{dir:{tmp_path}/run:tls}}",
                  "producer.override.client.id": "${vault:secret/x:y}"})  # not a configured provider: as written
    assert (config.mongodb_password, config.mongodb_user, config.topic_prefix) == ("s3cr:t}$", "cdc", "shop-cdc")
    assert config.mongodb_ssl_enabled is True and config.producer_overrides == {"client.id": "${vault:secret/x:y}"}


def test_a_provider_that_cannot_resolve_names_the_property_and_never_a_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDC_MISSING", raising=False)
    monkeypatch.setenv("CDC_OTHER", "hunter2")
    (tmp_path / "secrets.properties").write_text("user=hunter2\n")
    error = config_error({
        **PROVIDERS, "config.providers.env.param.allowlist.pattern": "CDC_[A-Z]+",
        "config.providers.file.param.allowed.paths": str(tmp_path / "elsewhere"),
        "mongodb.password": "${env:CDC_MISSING}", "mongodb.user": "${env:HOME}",
        "topic.prefix": f"${{file:{tmp_path}/secrets.properties:user}}"})
    text = str(error)
    assert "mongodb.password" in text and "${env:CDC_MISSING}: the environment variable CDC_MISSING is not set" in text
    assert "HOME is not allowed by allowlist.pattern 'CDC_[A-Z]+'" in text
    assert "topic.prefix" in text and "is outside allowed.paths" in text and "hunter2" not in text
    bad = str(config_error({"config.providers": "vault", "config.providers.vault.class": "com.example.Vault",
                            "config.providers.env.class": ENV_CLASS,
                            "config.providers.vault.param.token": "x"}))
    assert "config.providers.vault.class: must name one of Kafka's config providers" in bad and "not 'com.example.Vault'" in bad
    assert "config.providers.env.class: configures a provider that config.providers does not list" in bad


ENV_CLASS = "org.apache.kafka.common.config.provider.EnvVarConfigProvider"


def test_a_resolved_value_is_never_quoted_and_is_resolved_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "secrets.properties").write_text("password=hunter2-${env:CDC_X}\n")
    monkeypatch.setenv("CDC_X", "expanded")
    variable = f"${{file:{tmp_path}/secrets.properties:password}}"
    text = str(config_error({**PROVIDERS, "mongodb.ssl.enabled": variable}))  # the wrong key: a secret where a boolean goes
    assert "mongodb.ssl.enabled" in text and variable in text and "hunter2" not in text
    config = cfg({**PROVIDERS, "mongodb.user": "cdc", "mongodb.password": variable})
    assert config.mongodb_password == "hunter2-${env:CDC_X}"  # a secret is a value, not a template
    assert config.with_properties({"max.batch.size": 10}).mongodb_password == "hunter2-${env:CDC_X}"
    bad = str(config_error({**PROVIDERS, "config.providers.env.param.allowlist.pattern": "CDC_[", "mongodb.user": "${env:CDC_X}"}))
    assert "config.providers.env.param.allowlist.pattern: not a regular expression" in bad
