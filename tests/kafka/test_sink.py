"""The Kafka sink delivers what the jsonl sink writes, record for record, and fails loudly."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from pymongo import MongoClient
from pymongo.database import Database

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine
from mongocdc_core.events.records import Record
from mongocdc_core.offsets import FileOffsetStore
from mongocdc_core.positions import Position
from mongocdc_core.sinks.base import RecordRejected, SinkError
from mongocdc_core.sinks.factory import open_sink
from mongocdc_core.sinks.jsonl import JsonlSink
from mongocdc_core.sinks.kafka import KafkaSink, KafkaSinkSettings, create_topics
from tests.engine.engine_support import Background
from tests.kafka.kafka_support import (
    StreamingStarted,
    by_key,
    list_topics,
    make_config,
    read_jsonl,
    read_topic,
    wait_for,
)


def _record(topic: str, key: bytes | None, value: bytes | None, n: int = 1) -> Record:
    return Record(topic, key, value, Position(1, n), None, None)


def _cfg(**props: str) -> ConnectorConfig:
    return ConnectorConfig.from_dict(
        {"mongodb.connection.string": "mongodb://127.0.0.1:1/?replicaSet=rs0", "topic.prefix": "t", **props}
    )


def _workload(db: Database, client: MongoClient) -> int:
    """Inserts, updates, deletes and one multi-document transaction; returns the change event count."""
    orders, items = db["orders"], db["items"]
    for i in range(40):
        orders.insert_one({"_id": i, "qty": i, "tags": ["a", "b"]})
    for i in range(0, 40, 3):
        orders.update_one({"_id": i}, {"$set": {"qty": -i}, "$unset": {"tags": ""}})
    for i in range(0, 40, 5):
        orders.delete_one({"_id": i})
    for i in range(10):
        items.insert_one({"_id": f"s{i}", "name": f"item {i}"})
    with client.start_session() as session, session.start_transaction():
        items.insert_one({"_id": "t1", "name": "in txn"}, session=session)
        orders.update_one({"_id": 1}, {"$inc": {"qty": 100}}, session=session)
        items.delete_one({"_id": "s1"}, session=session)
    return 40 + 14 + 8 + 10 + 3


def test_kafka_run_equals_jsonl_run(
    kafka_bootstrap: str, mongo_uri: str, mongo_client: MongoClient, fresh_db: Database, tmp_path: Path
) -> None:
    """Two engines on the same data, one per sink: same topics, keys, values and per-key order;
    tombstones are null values; transaction and heartbeat records arrive; a document's events share
    one partition."""
    for i in range(100, 120):
        fresh_db["orders"].insert_one({"_id": i, "qty": i})  # snapshot reads
    cfg = make_config(
        mongo_uri,
        fresh_db.name,
        **{
            "provide.transaction.metadata": "true",
            "heartbeat.interval.ms": "100",
            "mongocdc.kafka.topic.partitions": "3",
            # No full-document lookup: each engine looks an updated document up when it reads the event,
            # so a delete between the two reads gave one engine the document and the other null (CI saw
            # it); an update's own description is the same for both.
            "capture.mode": "change_streams",
        },
    )
    jsonl_dir = tmp_path / "jsonl"
    runs = []
    for sink in (JsonlSink(jsonl_dir), open_sink(f"kafka:{kafka_bootstrap}", cfg)):
        listener = StreamingStarted()
        engine = Engine(cfg, sink, FileOffsetStore(tmp_path / f"{uuid.uuid4().hex}.json"), progress=listener)
        runs.append((Background(engine).start(), listener, sink))
    for run, listener, _ in runs:
        wait_for(lambda: listener.started.is_set() or run.error is not None)  # noqa: B023 - used at once
        run.check()
    events = _workload(fresh_db, mongo_client)
    for run, _, _ in runs:
        seen = run.engine.metrics.streaming
        wait_for(lambda: seen.TotalNumberOfEventsSeen >= events or run.error is not None)  # noqa: B023
        run.check()
    for run, _, sink in runs:
        run.stop()
        sink.close()

    expected = read_jsonl(jsonl_dir)
    heartbeat, transaction = cfg.heartbeat_topic(), cfg.transaction_topic()
    assert expected[heartbeat] and expected[transaction]
    produced = list_topics(kafka_bootstrap, cfg.topic_prefix) | list_topics(kafka_bootstrap, heartbeat)
    assert produced == set(expected)
    for topic, records in expected.items():
        got = read_topic(kafka_bootstrap, topic)
        if topic == heartbeat:
            assert got and all(orjson.loads(v or b"{}").get("ts_ms") for _, _, v in got)
            continue
        assert by_key([(k, v) for _, k, v in got]) == by_key(records), topic
        partitions: dict[bytes | None, set[int]] = {}
        for partition, key, _ in got:
            partitions.setdefault(key, set()).add(partition)
        assert all(len(p) == 1 for p in partitions.values()), f"a key spans partitions in {topic}"
    orders = read_topic(kafka_bootstrap, cfg.data_topic(fresh_db.name, "orders"))
    tombstones = [k for _, k, v in orders if v is None]
    assert len(tombstones) == 8 and {len({p for p, _, _ in orders})} == {3}


def test_topics_created_with_configured_partitions_and_cleanup_policy(kafka_bootstrap: str) -> None:
    cfg = _cfg(**{"mongocdc.kafka.topic.partitions": "2", "mongocdc.kafka.topic.cleanup.policy": "compact"})
    topic = f"created-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink.from_config(kafka_bootstrap, cfg)
    sink.write([_record(topic, b'{"id":"1"}', b'{"v":1}'), _record(topic, b'{"id":"1"}', None, 2)])
    sink.close()

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    md = admin.list_topics(topic, timeout=30).topics[topic]
    assert len(md.partitions) == 2
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    configs = next(iter(described.values())).result()
    assert configs["cleanup.policy"].value == "compact"
    assert [(k, v) for _, k, v in read_topic(kafka_bootstrap, topic)] == [
        (b'{"id":"1"}', b'{"v":1}'),
        (b'{"id":"1"}', None),
    ]


def test_topic_creation_disabled_relies_on_broker_auto_creation(kafka_bootstrap: str) -> None:
    cfg = _cfg(**{"mongocdc.kafka.topic.creation.enable": "false", "mongocdc.kafka.topic.partitions": "4"})
    topic = f"auto-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink.from_config(kafka_bootstrap, cfg)
    sink.write([_record(topic, b"k", b"v")])
    sink.close()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert len(admin.list_topics(topic, timeout=30).topics[topic].partitions) == 1  # the broker's default
    assert [(k, v) for _, k, v in read_topic(kafka_bootstrap, topic)] == [(b"k", b"v")]


def test_delivery_error_fails_flush_naming_the_topic_and_stays_failed(kafka_bootstrap: str) -> None:
    topic = f"small-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    create_topics(admin, [topic], partitions=1, replication_factor=1, config={})  # returns once listed
    sink = KafkaSink.from_config(kafka_bootstrap, _cfg())
    sink.write([_record(topic, b"k", b"small")])  # the sink learns the topic's limit here...
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"max.message.bytes": "1000"})
    admin.alter_configs([resource])[resource].result(30)  # ...and the topic shrinks behind its back
    sink.write([_record(topic, b"k", b"x" * 5000, 2)])
    with pytest.raises(SinkError, match=topic):
        sink.flush(30)
    with pytest.raises(SinkError, match=topic):  # sticky: no later flush can claim success
        sink.write([_record(topic, b"k", b"small", 3)])


def test_a_record_larger_than_the_topic_takes_is_refused_and_the_sink_stays_usable(kafka_bootstrap: str) -> None:
    topic = f"small-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    create_topics(admin, [topic], partitions=1, replication_factor=1, config={"max.message.bytes": "2000"})
    sink = KafkaSink.from_config(kafka_bootstrap, _cfg())
    batch = [_record(topic, b"a", b"small", 1), _record(topic, b"b", b"x" * 5000, 2), _record(topic, b"c", b"z", 3)]
    with pytest.raises(RecordRejected, match=r"max.message.bytes \(2,000\)") as info:
        sink.write(batch)
    assert info.value.accepted == 1 and info.value.record is batch[1]
    sink.write(batch[2:])
    sink.flush(30)
    sink.close()
    assert [(k, v) for _, k, v in read_topic(kafka_bootstrap, topic)] == [(b"a", b"small"), (b"c", b"z")]


def test_compression_and_producer_overrides_pass_through(kafka_bootstrap: str) -> None:
    cfg = _cfg(**{"producer.override.compression.type": "lz4", "producer.override.linger.ms": "20"})
    settings = KafkaSinkSettings.from_config(kafka_bootstrap, cfg)
    conf = settings.producer_config()
    assert conf["compression.type"] == "lz4" and conf["linger.ms"] == "20"
    assert conf["enable.idempotence"] is True and conf["acks"] == "all" and conf["message.timeout.ms"] == 0
    topic = f"lz4-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink(settings)
    records = [_record(topic, f'{{"id":"{i}"}}'.encode(), orjson.dumps({"n": i, "pad": "z" * 200}), i + 1)
               for i in range(500)]
    sink.write(records)
    sink.flush()
    sink.close()
    assert [(k, v) for _, k, v in read_topic(kafka_bootstrap, topic)] == [(r.key, r.value) for r in records]


def test_queue_bounds_come_from_max_queue_size() -> None:
    cfg = _cfg(**{"max.queue.size": "5000", "max.batch.size": "100", "max.queue.size.in.bytes": "3000000"})
    conf = KafkaSinkSettings.from_config("127.0.0.1:1", cfg).producer_config()
    assert conf["queue.buffering.max.messages"] == 5000
    assert conf["queue.buffering.max.kbytes"] == 2930


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"mongocdc.kafka.topic.partitons": "2"}, "mongocdc.kafka.topic.partitons"),
        ({"mongocdc.kafka.topic.partitions": "0"}, "topic.partitions: must be >= 1"),
        ({"mongocdc.kafka.topic.cleanup.policy": "forever"}, "cleanup.policy"),
        ({"mongocdc.kafka.exactly.once": "yes"}, "exactly.once: expected true or false"),
        ({"mongocdc.kafka.topic.replication.factor": "0"}, "replication.factor"),
    ],
)
def test_bad_settings_are_named(props: Mapping[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        KafkaSinkSettings.from_config("127.0.0.1:9092", _cfg(**props))


def test_factory_rejects_kafka_without_servers() -> None:
    with pytest.raises(ValueError, match="kafka:HOST:PORT"):
        open_sink("kafka:", None)
