"""The Kafka offset store: a compacted topic keyed by connector name, selectable like the file store."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from pymongo.database import Database

from mongocdc_core.api import current_cluster_time
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import FileOffsetStore, Offset, OffsetError, SnapshotState, open_offset_store
from mongocdc_core.offsets.kafka import DEFAULT_OFFSETS_TOPIC, KafkaOffsetStore
from mongocdc_core.positions import Position
from mongocdc_core.sinks.factory import open_sink
from mongocdc_core.sinks.jsonl import JsonlSink
from tests.kafka.kafka_support import make_config, read_topic


def _topic() -> str:
    return f"offsets-{uuid.uuid4().hex[:8]}"


def _offset(seconds: int) -> Offset:
    return Offset(
        resume_token={"_data": f"8200{seconds:08X}"},
        position=Position(seconds, 1, 0),
        snapshot=SnapshotState(collections=["a.b"], completed=[], start_position=Position(seconds, 0)),
    )


def test_round_trip_latest_wins_and_connectors_are_separate(kafka_bootstrap: str) -> None:
    topic = _topic()
    first = KafkaOffsetStore(kafka_bootstrap, topic, "conn-a")
    assert first.load() is None  # empty topic
    first.save(_offset(10))
    first.save(_offset(20))
    other = KafkaOffsetStore(kafka_bootstrap, topic, "conn-b")
    other.save(_offset(99))
    first.close()
    other.close()

    reopened = KafkaOffsetStore(kafka_bootstrap, topic, "conn-a")
    assert reopened.load() == _offset(20)
    assert KafkaOffsetStore(kafka_bootstrap, topic, "conn-b").load() == _offset(99)
    assert KafkaOffsetStore(kafka_bootstrap, topic, "conn-c").load() is None
    keys = [k for _, k, _ in read_topic(kafka_bootstrap, topic)]
    assert keys == [b"conn-a", b"conn-a", b"conn-b"]

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    configs = next(iter(admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()))
    assert configs.result()["cleanup.policy"].value == "compact"


def test_a_corrupt_offset_record_is_a_clear_error(kafka_bootstrap: str) -> None:
    topic = _topic()
    store = KafkaOffsetStore(kafka_bootstrap, topic, "conn")
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, key=b"conn", value=b"{not json")
    producer.flush(30)
    with pytest.raises(OffsetError, match=f"{topic}.*not a mongocdc offset"):
        store.load()


def test_a_tombstone_resets_the_connector(kafka_bootstrap: str) -> None:
    topic = _topic()
    store = KafkaOffsetStore(kafka_bootstrap, topic, "conn")
    store.save(_offset(5))
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, key=b"conn", value=None)
    producer.flush(30)
    assert store.load() is None


def test_factory_forms(kafka_bootstrap: str, tmp_path: Path) -> None:
    cfg = ConnectorConfig.from_dict(
        {"mongodb.connection.string": "mongodb://127.0.0.1:1/?replicaSet=rs0", "topic.prefix": "t", "name": "n1"}
    )
    assert isinstance(open_offset_store(str(tmp_path / "o.json"), cfg), FileOffsetStore)
    file_store = open_offset_store(f"file:{tmp_path / 'p.json'}", cfg)
    assert isinstance(file_store, FileOffsetStore) and file_store.path == tmp_path / "p.json"
    topic = _topic()
    kafka_store = open_offset_store(f"kafka:{kafka_bootstrap}/{topic}", cfg)
    assert isinstance(kafka_store, KafkaOffsetStore)
    assert (kafka_store.topic, kafka_store.key) == (topic, b"n1")
    default = open_offset_store(f"kafka:{kafka_bootstrap}", cfg)
    assert isinstance(default, KafkaOffsetStore) and default.topic == DEFAULT_OFFSETS_TOPIC
    with pytest.raises(ValueError, match="unknown offset store kind 'redis'"):
        open_offset_store("redis:localhost:6379", cfg)
    with pytest.raises(ValueError, match="no bootstrap servers"):
        open_offset_store("kafka:/topic", cfg)


def test_exactly_once_needs_kafka_offsets_on_the_sink_cluster(kafka_bootstrap: str, tmp_path: Path) -> None:
    cfg = ConnectorConfig.from_dict(
        {
            "mongodb.connection.string": "mongodb://127.0.0.1:1/?replicaSet=rs0",
            "topic.prefix": "t",
            "name": f"eos-{uuid.uuid4().hex[:6]}",
            "mongocdc.kafka.exactly.once": "true",
        }
    )
    sink = open_sink(f"kafka:{kafka_bootstrap}", cfg)
    with pytest.raises(ValueError, match="--offsets kafka:"):
        open_offset_store(str(tmp_path / "o.json"), cfg, sink)
    with pytest.raises(ValueError, match="sink's cluster"):
        open_offset_store("kafka:127.0.0.1:1/x", cfg, sink)
    sink.close()


def test_engine_resumes_from_the_kafka_offset_store(
    kafka_bootstrap: str, mongo_uri: str, fresh_db: Database, tmp_path: Path
) -> None:
    """Stop and restart: the second run continues after the first, nothing lost or repeated."""
    cfg = make_config(mongo_uri, fresh_db.name)
    spec = f"kafka:{kafka_bootstrap}/{_topic()}"
    coll = fresh_db["c"]
    coll.insert_many([{"_id": i} for i in range(5)])

    sink = JsonlSink(tmp_path / "out")
    store = open_offset_store(spec, cfg)
    first = Engine(cfg, sink, store).run(stop_at=current_cluster_time(cfg))
    store.close()
    assert first.snapshot_documents == 5
    coll.insert_many([{"_id": i} for i in range(5, 12)])
    coll.delete_one({"_id": 0})

    store = open_offset_store(spec, cfg)
    loaded = store.load()
    assert loaded is not None and loaded.resume_token is not None and not loaded.snapshot_in_progress
    second = Engine(cfg, sink, store).run(stop_at=current_cluster_time(cfg))
    store.close()
    sink.close()
    assert not second.snapshot_performed
    assert second.counts == {"c": 7, "u": 0, "d": 1}
