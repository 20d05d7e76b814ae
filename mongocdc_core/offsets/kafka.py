"""Offsets in a compacted Kafka topic, as Kafka Connect keeps them in its offsets topic.

The record key is the connector name and the value the offset JSON (``Offset.to_json``); the
latest record for the key is the offset. Compaction keeps the topic small. ``load`` reads with
``isolation.level=read_committed``, so in exactly-once mode an offset written inside an aborted
transaction (a connector killed mid-batch) is never seen, and neither are that batch's records.

Without exactly-once the store has its own idempotent producer and ``save`` returns after the
broker acknowledged the offset record. With exactly-once it saves through the transactional
``KafkaSink``: the offset record is the last write of the transaction that carries the batch.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.offsets.model import Offset, OffsetError
from mongocdc_core.sinks.base import SinkError
from mongocdc_core.sinks.kafka import KafkaSink, admin_config, connector_name, create_topics

log = logging.getLogger(__name__)

DEFAULT_OFFSETS_TOPIC = "mongocdc-offsets"
_LOAD_TIMEOUT_S = 60.0


class KafkaOffsetStore:
    """One connector's offset in ``topic`` under ``key`` (the connector name)."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str = DEFAULT_OFFSETS_TOPIC,
        key: str = "mongocdc",
        *,
        sink: KafkaSink | None = None,
        client_config: dict[str, Any] | None = None,
        create_topic: bool = True,
        replication_factor: int = -1,
    ) -> None:
        if not bootstrap_servers.strip():
            raise ValueError("the Kafka offset store needs bootstrap servers (kafka:HOST:PORT/TOPIC)")
        if not topic:
            raise ValueError("the Kafka offset store needs a topic name (kafka:HOST:PORT/TOPIC)")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.key = key.encode()
        self._client_config = {"bootstrap.servers": bootstrap_servers, **(client_config or {})}
        self._sink = sink if sink is not None and sink.transactional else None
        self._producer: Producer | None = None
        self._closed = False
        if create_topic:
            admin = AdminClient(admin_config(self._client_config))
            create_topics(
                admin,
                [topic],
                partitions=1,
                replication_factor=replication_factor,
                config={"cleanup.policy": "compact"},
            )

    @property
    def description(self) -> str:
        return f"Kafka offsets topic {self.topic!r} (key {self.key.decode()!r}) on {self.bootstrap_servers}"

    def load(self) -> Offset | None:
        """The latest committed offset for the key, or None."""
        consumer = Consumer(
            {
                **self._client_config,
                "group.id": f"mongocdc-offsets-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            metadata = consumer.list_topics(self.topic, timeout=_LOAD_TIMEOUT_S)
            topic_md = metadata.topics.get(self.topic)
            if topic_md is None or topic_md.error is not None:
                if topic_md is not None and topic_md.error is not None and (
                    topic_md.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART
                ):
                    raise OffsetError(f"cannot read {self.description}: {topic_md.error.str()}")
                return None
            partitions = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in topic_md.partitions]
            latest: bytes | None = None
            found = False
            pending = {tp.partition for tp in partitions}
            consumer.assign(partitions)
            deadline = time.monotonic() + _LOAD_TIMEOUT_S
            while pending:
                if time.monotonic() > deadline:
                    raise OffsetError(f"timed out reading {self.description}")
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition() or 0)
                        continue
                    raise OffsetError(f"cannot read {self.description}: {err.str()}")
                if msg.key() == self.key:
                    latest = msg.value()
                    found = True
        except KafkaException as exc:
            raise OffsetError(f"cannot read {self.description}: {exc.args[0].str()}") from exc
        finally:
            consumer.close()
        if not found or latest is None:  # a tombstone resets the connector, as in Kafka Connect
            return None
        try:
            return Offset.from_json(orjson.loads(latest))
        except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError) as exc:
            raise OffsetError(f"the latest record in {self.description} is not a mongocdc offset ({exc})") from exc

    def save(self, offset: Offset) -> None:
        """Store ``offset`` durably (acknowledged by the broker, or committed with its batch)."""
        if self._closed:
            raise OffsetError(f"save to a closed {self.description}")
        value = orjson.dumps(offset.to_json())
        if self._sink is not None:
            self._sink.commit_with_offset(self.topic, self.key, value, offset.position)
            return
        producer = self._own_producer()
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        producer.produce(self.topic, key=self.key, value=value, on_delivery=delivered)
        while producer.flush(1.0):
            log.warning("waiting for Kafka to acknowledge the offset in %s", self.description)
        if errors:
            raise SinkError(f"cannot save the offset to {self.description}: {errors[0].str()}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._producer is not None:
            self._producer.flush(30)
            self._producer = None

    def _own_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                {
                    **self._client_config,
                    "enable.idempotence": True,
                    "acks": "all",
                    "message.timeout.ms": 0,
                    "linger.ms": 0,
                }
            )
        return self._producer


def parse_kafka_spec(target: str) -> tuple[str, str]:
    """``HOST:PORT[,HOST:PORT…][/TOPIC]`` -> (bootstrap servers, topic)."""
    bootstrap, _, topic = target.partition("/")
    return bootstrap, topic or DEFAULT_OFFSETS_TOPIC


def kafka_offset_store(target: str, cfg: ConnectorConfig | None, sink: Any = None) -> KafkaOffsetStore:
    """The store for ``kafka:`` + ``target``; the transactional sink joins in exactly-once mode."""
    bootstrap, topic = parse_kafka_spec(target)
    if not bootstrap:
        raise ValueError(f"offset store kafka:{target} names no bootstrap servers (kafka:HOST:PORT/TOPIC)")
    overrides = dict(cfg.producer_overrides) if cfg is not None else {}
    client = admin_config(overrides)
    client.pop("bootstrap.servers", None)
    client.pop("client.id", None)
    return KafkaOffsetStore(bootstrap, topic, connector_name(cfg), sink=sink, client_config=client)
