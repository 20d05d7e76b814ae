"""The Kafka signal channel and the notification channels (log and sink topic)."""

from __future__ import annotations

import logging
import uuid
from typing import Any, cast

import orjson
import pytest
from confluent_kafka import Producer

from mongocdc_core.config import ConfigError, ConnectorConfig
from mongocdc_core.notifications import NotificationService
from mongocdc_core.sinks.kafka import KafkaSink
from mongocdc_core.source.signals import Signal, SignalProcessor
from mongocdc_core.source.signals_kafka import KafkaSignalChannel
from tests.kafka.kafka_support import read_topic, wait_for

EXECUTE: dict[str, Any] = {"type": "execute-snapshot", "data": {"data-collections": ["db1.c1", "db1.c2"], "type": "INCREMENTAL"}}


def _cfg(bootstrap: str, **props: str) -> ConnectorConfig:
    prefix = f"sig{uuid.uuid4().hex[:8]}"
    return ConnectorConfig.from_dict(
        {
            "mongodb.connection.string": "mongodb://127.0.0.1:1/?replicaSet=rs0",
            "topic.prefix": prefix,
            "name": f"{prefix}-connector",
            "signal.enabled.channels": "source,kafka",
            "signal.kafka.bootstrap.servers": bootstrap,
            "signal.kafka.groupId": f"g-{prefix}",
            "notification.enabled.channels": "log,sink",
            "notification.sink.topic.name": f"{prefix}-notifications",
            "mongocdc.schemas.enable": "false",
            **props,
        }
    )


def _send(bootstrap: str, topic: str, messages: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in messages:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


class Collected:
    def __init__(self) -> None:
        self.signals: list[Signal] = []
        self.rejected: list[tuple[str, str, str]] = []

    def submit(self, signal: Signal) -> None:
        self.signals.append(signal)

    def reject(self, channel: str, reason: str, signal_id: str) -> None:
        self.rejected.append((channel, reason, signal_id))


def _read_until(channel: KafkaSignalChannel, done: Any) -> None:
    for _ in range(100):
        channel.read()
        if done():
            return
    raise AssertionError("signals did not arrive")


def test_good_wrong_key_and_malformed_signals(kafka_bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _cfg(kafka_bootstrap)
    assert cfg.signal_kafka_topic == f"{cfg.topic_prefix}-signal"
    notifications = NotificationService(cfg)
    processor = SignalProcessor(cast(Any, None), notifications, lambda: [], connector_name=str(cfg.name))
    got = Collected()
    channel = KafkaSignalChannel(cfg, got.submit, processor.reject)
    prefix = cfg.topic_prefix.encode()
    _send(
        kafka_bootstrap,
        cfg.signal_kafka_topic,
        [
            (prefix, orjson.dumps(EXECUTE)),
            (b"someone-else", orjson.dumps(EXECUTE)),
            (prefix, b"{not json"),
            (prefix, orjson.dumps({"id": "stop-1", "type": "stop-snapshot", "data": {"type": "incremental"}})),
        ],
    )
    with caplog.at_level(logging.INFO):
        _read_until(channel, lambda: len(got.signals) == 2)
    channel.stop()

    first, second = got.signals
    assert first == Signal("kafka-0-0", "execute-snapshot", EXECUTE["data"], "kafka")
    assert (second.id, second.type, second.data) == ("stop-1", "stop-snapshot", {"type": "incremental"})
    assert processor.rejected == 2
    reasons = [n["additional_data"]["reason"] for n in notifications.sent]
    assert "does not match topic.prefix" in reasons[0] and "someone-else" in reasons[0]
    assert "not valid JSON" in reasons[1]
    assert [n["additional_data"]["signal_id"] for n in notifications.sent] == ["kafka-0-1", "kafka-0-2"]
    assert "skipping signal kafka-0-1" in caplog.text and "Notification from" in caplog.text

    # The sink channel: the dispatcher drains the queued records into the sink; they reach the topic.
    records = notifications.drain()
    assert notifications.drain() == []
    sink = KafkaSink.from_config(kafka_bootstrap, cfg)
    sink.write(records)
    sink.close()
    delivered = read_topic(kafka_bootstrap, str(cfg.notification_sink_topic_name))
    values = [orjson.loads(v or b"null") for _, _, v in delivered]
    assert [(v["aggregate_type"], v["type"]) for v in values] == [("Signal", "REJECTED")] * 2
    assert [orjson.loads(k or b"null") for _, k, _ in delivered] == [v["id"] for v in values]
    assert all(set(v) == {"id", "aggregate_type", "type", "additional_data", "timestamp"} for v in values)


def test_without_offset_commit_only_signals_sent_while_running_are_seen(kafka_bootstrap: str) -> None:
    cfg = _cfg(kafka_bootstrap)
    prefix = cfg.topic_prefix.encode()
    _send(kafka_bootstrap, cfg.signal_kafka_topic, [(prefix, orjson.dumps({**EXECUTE, "id": "before"}))])
    got = Collected()
    channel = KafkaSignalChannel(cfg, got.submit, got.reject)
    _send(kafka_bootstrap, cfg.signal_kafka_topic, [(prefix, orjson.dumps({**EXECUTE, "id": "while-up"}))])
    _read_until(channel, lambda: got.signals)
    channel.stop()
    assert [s.id for s in got.signals] == ["while-up"]


def test_with_offset_commit_signals_sent_while_down_are_seen_once(kafka_bootstrap: str) -> None:
    cfg = _cfg(kafka_bootstrap, **{"signal.consumer.offset.commit.enabled": "true",
                                   "signal.consumer.session.timeout.ms": "10000"})
    assert cfg.signal_consumer_properties == {"session.timeout.ms": "10000"}
    prefix = cfg.topic_prefix.encode()
    got = Collected()
    channel = KafkaSignalChannel(cfg, got.submit, got.reject)
    _send(kafka_bootstrap, cfg.signal_kafka_topic, [(prefix, orjson.dumps({**EXECUTE, "id": "one"}))])
    _read_until(channel, lambda: got.signals)
    channel.stop()
    _send(kafka_bootstrap, cfg.signal_kafka_topic, [(prefix, orjson.dumps({**EXECUTE, "id": "two"}))])

    again = Collected()
    channel = KafkaSignalChannel(cfg, again.submit, again.reject)
    channel.start()  # the background reader
    wait_for(lambda: bool(again.signals))
    channel.stop()
    assert [s.id for s in got.signals] == ["one"] and [s.id for s in again.signals] == ["two"]


def test_sink_notifications_need_a_topic_name() -> None:
    cfg = ConnectorConfig.from_dict(
        {"mongodb.connection.string": "mongodb://127.0.0.1:1/?replicaSet=rs0", "topic.prefix": "t",
         "notification.enabled.channels": "log"}
    )
    service = NotificationService(cfg)
    service.notify("Incremental Snapshot", "STARTED", {"data_collections": "db.c"})
    assert service.drain() == [] and service.sent[0]["type"] == "STARTED"
    with pytest.raises(ConfigError, match="notification.sink.topic.name"):
        cfg.with_properties({"notification.enabled.channels": "sink"})


def test_sink_notifications_carry_the_schema_when_schemas_are_enabled(kafka_bootstrap: str) -> None:
    cfg = _cfg(kafka_bootstrap, **{"mongocdc.schemas.enable": "true"})
    service = NotificationService(cfg)
    service.notify("Incremental Snapshot", "COMPLETED", {})
    (record,) = service.drain()
    value = orjson.loads(record.value or b"")
    key = orjson.loads(record.key or b"")
    assert record.topic == cfg.notification_sink_topic_name
    assert value["payload"]["type"] == "COMPLETED" and key["payload"] == value["payload"]["id"]
    assert [f["field"] for f in value["schema"]["fields"]] == [
        "id", "aggregate_type", "type", "additional_data", "timestamp"
    ]
