"""Kafka sink: every record to its topic through an idempotent confluent-kafka producer.

Why it is lossless: the producer is idempotent with ``acks=all`` and ``message.timeout.ms=0``
(retry forever instead of dropping), so while the broker is away records wait in a bounded local
queue and ``write`` blocks when that queue is full; ``flush`` returns only once every record written
so far is acknowledged and raises ``SinkError`` (sticky) on any delivery error, and the engine
records an offset only after ``flush`` returned. Record keys are the Kafka keys and the partitioner
is Java's murmur2, so all events of a document land in one partition, in order, exactly where Kafka
Connect would put them.

With ``mongocdc.kafka.exactly.once=true`` the producer is transactional (``transactional.id`` = the
connector name): records go into an open transaction that the Kafka offset store commits together
with the offset (``commit_with_offset``), so a ``read_committed`` consumer sees each event once.

With ``mongocdc.snapshot.delete.missing.keys`` the sink reads its topics back (``read_committed``) to
find the keys downstream still holds (``KeyReader``). A record larger than its topic accepts (the topic's ``max.message.bytes``, the producer's
``message.max.bytes``) is refused before it is produced, with ``RecordRejected``: the broker would
refuse it on every retry, so the connector's ``event.processing.failure.handling.mode`` decides.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.records import Record, RecordRun
from mongocdc_core.positions import Position
from mongocdc_core.sinks.base import KeyScan, RecordRejected, SinkError
from mongocdc_core.sinks.readback import KeyScanBuilder

log = logging.getLogger(__name__)

_ADMIN_TIMEOUT_S = 30.0
_BLOCKED_LOG_EVERY_S = 10.0
_POLL_STEP_S = 0.1
_TOPIC_EXISTS = KafkaError.TOPIC_ALREADY_EXISTS
_DEFAULT_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's message.max.bytes
# Record batch header (61 bytes) plus one record's framing and a few headers: what a record costs on
# the wire beyond its key and value.
_RECORD_OVERHEAD = 128
#: Header carrying every record's position (``Position.to_str()``): consumers such as the Structured
#: Streaming tables order records by it exactly as the landing zone's position column does.
POSITION_HEADER = "mongocdc.position"


@dataclass(frozen=True)
class KafkaSinkSettings:
    """What the sink needs from a connector config (all of it optional, so ``cfg=None`` works)."""

    bootstrap_servers: str
    connector_name: str = "mongocdc"
    topic_creation: bool = True
    partitions: int = 1
    replication_factor: int = -1
    cleanup_policy: str = "delete"
    exactly_once: bool = False
    transaction_timeout_ms: int = 900_000
    max_queue_messages: int = 8192
    max_queue_bytes: int = 0
    producer_overrides: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, bootstrap_servers: str, cfg: ConnectorConfig | None = None) -> KafkaSinkSettings:
        """The ``mongocdc.kafka.*`` settings, ``producer.override.*`` and the queue bounds of ``cfg``
        (validated with the rest of the config); the defaults without one."""
        if not bootstrap_servers.strip():
            raise ValueError("Kafka sink needs bootstrap servers (kafka:HOST:PORT)")
        if cfg is None:
            return cls(bootstrap_servers=bootstrap_servers.strip())
        return cls(
            bootstrap_servers=bootstrap_servers.strip(),
            connector_name=connector_name(cfg),
            topic_creation=cfg.mongocdc_kafka_topic_creation_enable,
            partitions=cfg.mongocdc_kafka_topic_partitions,
            replication_factor=cfg.mongocdc_kafka_topic_replication_factor,
            cleanup_policy=cfg.mongocdc_kafka_topic_cleanup_policy,
            exactly_once=cfg.mongocdc_kafka_exactly_once,
            transaction_timeout_ms=cfg.mongocdc_kafka_transaction_timeout_ms,
            max_queue_messages=cfg.max_queue_size,
            max_queue_bytes=cfg.max_queue_size_in_bytes,
            producer_overrides=dict(cfg.producer_overrides),
        )

    def producer_config(self) -> dict[str, Any]:
        """librdkafka settings: lossless defaults, bounded queue, then the user's overrides."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": f"mongocdc-{self.connector_name}",
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",  # Java's partitioner: same partition as Kafka Connect
            "linger.ms": 5,
            "message.timeout.ms": 0,  # never give up on a record: wait for the broker to return
            "queue.buffering.max.messages": max(1, self.max_queue_messages),
            "delivery.report.only.error": True,
        }
        if self.max_queue_bytes > 0:
            conf["queue.buffering.max.kbytes"] = max(1, math.ceil(self.max_queue_bytes / 1024))
        if self.exactly_once:
            conf["transactional.id"] = self.connector_name
            conf["transaction.timeout.ms"] = self.transaction_timeout_ms
            # A transactional producer cannot wait longer for a record than the transaction lives.
            conf["message.timeout.ms"] = self.transaction_timeout_ms
        conf.update(self.producer_overrides)
        return conf

    def topic_config(self) -> dict[str, str]:
        return {"cleanup.policy": self.cleanup_policy}


def connector_name(cfg: ConnectorConfig | None) -> str:
    """The connector's ``name`` (``topic.prefix`` when unnamed): transactional.id and offset key."""
    if cfg is None:
        return "mongocdc"
    return cfg.name or cfg.topic_prefix


def admin_config(producer_conf: Mapping[str, Any]) -> dict[str, Any]:
    """The connection part of a producer config, for an AdminClient/Consumer on the same cluster."""
    keep = ("bootstrap.servers", "client.id")
    security = ("security.", "sasl.", "ssl.")
    return {k: v for k, v in producer_conf.items() if k in keep or k.startswith(security)}


def create_topics(
    admin: AdminClient,
    topics: Iterable[str],
    *,
    partitions: int,
    replication_factor: int,
    config: Mapping[str, str],
    stop: threading.Event | None = None,
    on_retry: Callable[[list[str]], None] | None = None,
) -> None:
    """Create the missing ones among ``topics`` (existing topics are left alone).

    Transient failures (broker away) are retried until ``stop`` is set; anything else raises
    ``SinkError`` naming the topic and Kafka's error. Returns once the broker's metadata lists the
    new topics (or, with a warning, after the admin timeout or once ``stop`` is set), so a
    ``describe_configs`` right after (the sink asks for ``max.message.bytes``) sees the topic's own
    settings rather than "unknown topic".
    """
    pending = sorted(set(topics))
    created: list[str] = []
    while pending:
        new = [NewTopic(t, num_partitions=partitions, replication_factor=replication_factor, config=dict(config))
               for t in pending]
        futures = admin.create_topics(new, operation_timeout=_ADMIN_TIMEOUT_S, request_timeout=_ADMIN_TIMEOUT_S)
        retry: list[str] = []
        for topic, future in futures.items():
            try:
                future.result()
                created.append(topic)
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.code() == _TOPIC_EXISTS:
                    continue
                if err.retriable() or err.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
                                                     KafkaError._ALL_BROKERS_DOWN):
                    retry.append(topic)
                    continue
                raise SinkError(f"cannot create Kafka topic {topic!r}: {err.str()}") from exc
        pending = retry
        if pending:
            if stop is not None and stop.is_set():
                raise SinkError(f"cannot create Kafka topics {pending}: the broker is unavailable")
            if on_retry is not None:
                on_retry(pending)
            time.sleep(1.0)
    _wait_listed(admin, created, stop)


def _wait_listed(admin: AdminClient, topics: Sequence[str], stop: threading.Event | None) -> None:
    """Wait (up to the admin timeout, or until ``stop``) until the broker's metadata lists ``topics``.

    A KRaft broker applies a created topic to its metadata a moment after the controller answers
    CreateTopics; until then it calls the topic unknown. Producing needs no wait (the producer
    retries), so past the timeout this logs the topics still unlisted and returns.
    """
    deadline = time.monotonic() + _ADMIN_TIMEOUT_S
    waiting = list(topics)
    while waiting and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        still: list[str] = []
        for topic in waiting:
            try:
                metadata = admin.list_topics(topic, timeout=5.0).topics.get(topic)
            except KafkaException:
                metadata = None
            if metadata is None or metadata.error is not None:
                still.append(topic)
        waiting = still
        if waiting:
            time.sleep(0.1)
    if waiting:
        log.warning("Kafka topics %s were created but the broker does not list them after %.0f s; "
                    "the producer retries until it does", waiting, _ADMIN_TIMEOUT_S)


class KafkaSinkMetrics:
    """Delivery health, readable while the engine runs (``as_dict`` for the metrics file)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.BrokerUnavailable = False
        self.SinkBlocked = False
        self.MilliSecondsBlocked = 0
        self.NumberOfBlockedPeriods = 0
        self.TotalNumberOfRecordsSent = 0
        self.NumberOfTransactionsCommitted = 0
        self.LastError = ""
        self._blocked_since: float | None = None

    def block(self) -> bool:
        """Enter the blocked state; True when it was not blocked before."""
        with self._lock:
            if self._blocked_since is not None:
                return False
            self._blocked_since = time.monotonic()
            self.SinkBlocked = True
            self.NumberOfBlockedPeriods += 1
            return True

    def unblock(self) -> float:
        """Leave the blocked state; the seconds it lasted (0 when it was not blocked)."""
        with self._lock:
            self.BrokerUnavailable = False
            if self._blocked_since is None:
                return 0.0
            blocked = time.monotonic() - self._blocked_since
            self._blocked_since = None
            self.SinkBlocked = False
            self.MilliSecondsBlocked += int(blocked * 1000)
            return blocked

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            current = 0 if self._blocked_since is None else int((time.monotonic() - self._blocked_since) * 1000)
            return {
                "BrokerUnavailable": self.BrokerUnavailable,
                "SinkBlocked": self.SinkBlocked,
                "MilliSecondsBlocked": self.MilliSecondsBlocked + current,
                "NumberOfBlockedPeriods": self.NumberOfBlockedPeriods,
                "TotalNumberOfRecordsSent": self.TotalNumberOfRecordsSent,
                "NumberOfTransactionsCommitted": self.NumberOfTransactionsCommitted,
                "LastError": self.LastError,
            }


class KafkaSink:
    """Produces records to Kafka; see the module docstring for the delivery guarantees."""

    def __init__(
        self,
        settings: KafkaSinkSettings,
        *,
        init_timeout: float = 60.0,
        on_acknowledged: Callable[[Message], None] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = KafkaSinkMetrics()
        self._on_acknowledged = on_acknowledged
        conf = settings.producer_config()
        if on_acknowledged is not None:  # successful deliveries are reported too (costs a callback each)
            conf["delivery.report.only.error"] = False
        conf["error_cb"] = self._on_error
        conf.setdefault("logger", logging.getLogger("mongocdc_core.sinks.kafka.librdkafka"))
        conf["on_delivery"] = self._on_delivery
        self._producer = Producer(conf)
        self._admin = AdminClient(admin_config(conf)) if settings.topic_creation else None
        self._describer = self._admin if self._admin is not None else AdminClient(admin_config(conf))
        self._client_max = int(conf.get("message.max.bytes", _DEFAULT_MESSAGE_MAX_BYTES))
        # The broker checks a topic's max.message.bytes against the compressed batch: the record's own
        # size is a sure bound only without compression.
        compression = str(conf.get("compression.type", conf.get("compression.codec", "none"))).lower()
        self._uncompressed = compression in ("none", "")
        self._limits: dict[str, tuple[int, str]] = {}
        self._connection = admin_config(conf)
        self._known_topics: set[str] = set()
        self._delivery_errors: list[tuple[str, KafkaError]] = []
        self._fatal: KafkaError | None = None
        self._closed = False
        self._stop = threading.Event()
        self._last_blocked_log = 0.0
        self.transactional = settings.exactly_once
        self._in_txn = False
        self._txn_max_position: Position | None = None
        self._committed_position: Position | None = None
        if self.transactional:
            try:
                # Fences an earlier instance with the same transactional.id and aborts its open transaction.
                self._producer.init_transactions(init_timeout)
            except KafkaException as exc:
                raise SinkError(
                    f"cannot initialise Kafka transactions (transactional.id {settings.connector_name!r}) "
                    f"on {settings.bootstrap_servers}: {exc.args[0].str()}"
                ) from exc

    @classmethod
    def from_config(cls, bootstrap_servers: str, cfg: ConnectorConfig | None = None) -> KafkaSink:
        return cls(KafkaSinkSettings.from_config(bootstrap_servers, cfg))

    # -- callbacks (run inside poll/flush on the calling thread) ---------------------------------------

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._delivery_errors.append((str(msg.topic()), err))
            self.metrics.LastError = f"{msg.topic()}: {err.str()}"
        elif self._on_acknowledged is not None:
            self._on_acknowledged(msg)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err
            self.metrics.LastError = err.str()
            log.error("Kafka producer fatal error: %s", err.str())
            return
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            if not self.metrics.BrokerUnavailable:
                log.warning("Kafka broker(s) %s unavailable; records are kept and retried", self.settings.bootstrap_servers)
            self.metrics.BrokerUnavailable = True
        else:
            log.debug("Kafka producer: %s", err.str())

    # -- Sink protocol -------------------------------------------------------------------------------

    def write(self, records: Sequence[Record]) -> None:
        """Queue records for delivery; blocks (bounded memory) while the local queue is full."""
        self._check_usable()
        if not records:
            return
        if self._admin is not None:
            topics = {records.topic} if isinstance(records, RecordRun) else {r.topic for r in records}
            missing = topics - self._known_topics
            if missing:
                self._create(missing)
        if self.transactional:
            self._begin()
        produce = self._producer.produce
        topic: str | None = None
        limit = (0, "")
        for index, record in enumerate(records):
            if record.topic != topic:  # a batch is mostly one topic: one limit lookup per run of it
                topic = record.topic
                limit = self._limits.get(topic) or self._limit(topic)
            value = record.value
            if value is not None and len(value) + len(record.key or b"") > limit[0]:
                size = len(value) + len(record.key or b"")
                self._refused(records, index, f"the {size:,}-byte record exceeds the {limit[0]:,} bytes {limit[1]}")
            while True:
                try:
                    produce(record.topic, value=record.value, key=record.key,
                            headers=[(POSITION_HEADER, record.position.to_str().encode())])
                    break
                except BufferError:
                    self._wait_for_room()
                except KafkaException as exc:
                    err: KafkaError = exc.args[0]
                    if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:  # refused locally: the producer is fine
                        self._refused(records, index, f"{err.str()} ({limit[1]})")
                    self._fatal = err
                    raise SinkError(f"cannot produce to Kafka topic {record.topic!r}: {err.str()}") from exc
        if self.transactional:
            self._note_position(records[-1])
        self.metrics.TotalNumberOfRecordsSent += len(records)
        if self.metrics.SinkBlocked:
            self._unblocked()
        self._producer.poll(0)

    def flush(self, timeout: float | None = None) -> None:
        """Return once every record written so far is acknowledged by Kafka; ``SinkError`` on any
        delivery error (sticky: the sink stays failed, so no later offset can pass a lost record)."""
        self._check_usable()
        deadline = None if timeout is None else time.monotonic() + timeout
        waiting_since = time.monotonic()
        while True:
            left = self._producer.flush(_POLL_STEP_S * 5)
            self._check_usable()
            if left == 0:
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise SinkError(f"{left} records not acknowledged by Kafka within {timeout}s")
            if now - waiting_since > 2.0 and self.metrics.block():
                self._last_blocked_log = now
                log.warning("Kafka sink blocked: waiting for %d records to be acknowledged", left)
            elif self.metrics.SinkBlocked and now - self._last_blocked_log > _BLOCKED_LOG_EVERY_S:
                self._last_blocked_log = now
                log.warning("Kafka sink still blocked: %d records waiting for the broker", left)
        if self.metrics.SinkBlocked:
            self._unblocked()
        self.metrics.BrokerUnavailable = False

    def close(self) -> None:
        """Flush; in exactly-once mode commit an open transaction only if the last committed offset
        covers every record in it (otherwise abort: a restart produces them again)."""
        if self._closed:
            return
        try:
            if self._fatal is None and not self._delivery_errors:
                self.flush()
                if self.transactional and self._in_txn:
                    covered = self._txn_max_position is None or (
                        self._committed_position is not None and self._txn_max_position <= self._committed_position
                    )
                    if covered:
                        self._commit()
                    else:
                        log.info("aborting the open Kafka transaction: its records are after the committed offset")
                        self._producer.abort_transaction(_ADMIN_TIMEOUT_S)
                        self._in_txn = False
        finally:
            self._closed = True
            self._stop.set()

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery callbacks now (thread-safe; e.g. a latency probe's own thread)."""
        self._producer.poll(timeout)

    def _note_position(self, last: Record) -> None:
        """Records arrive in position order: the last one produced carries the transaction's highest position."""
        if self._txn_max_position is None or last.position > self._txn_max_position:
            self._txn_max_position = last.position

    def _refused(self, records: Sequence[Record], index: int, why: str) -> None:
        """Raise ``RecordRejected`` for ``records[index]`` (the ones before it were produced)."""
        record = records[index]
        self.metrics.TotalNumberOfRecordsSent += index
        if self.transactional and index:
            self._note_position(records[index - 1])
        self.metrics.LastError = f"{record.topic}: record refused: {why}"
        raise RecordRejected(
            f"Kafka topic {record.topic!r} cannot take this record: {why}. To deliver such records, raise the "
            "topic's max.message.bytes and producer.override.message.max.bytes (and the consumers' fetch sizes)",
            record, index,
        )

    def _limit(self, topic: str) -> tuple[int, str]:
        """The largest key + value ``topic`` takes, and where that limit comes from (asked once per topic)."""
        limit, source = self._client_max, f"of the producer's message.max.bytes ({self._client_max:,})"
        if self._uncompressed:
            resource = ConfigResource(ResourceType.TOPIC, topic)
            try:
                entries = self._describer.describe_configs([resource], request_timeout=_ADMIN_TIMEOUT_S)[resource].result()
                topic_max = int(entries["max.message.bytes"].value)
            except (KafkaException, KeyError, ValueError, TypeError) as exc:
                log.debug("max.message.bytes of topic %s unknown (%s); the producer's limit applies", topic, exc)
            else:
                if topic_max < limit:
                    limit, source = topic_max, f"of the topic's max.message.bytes ({topic_max:,})"
        self._limits[topic] = (limit - _RECORD_OVERHEAD, source)
        return self._limits[topic]

    # -- reading keys back (KeyReader) ----------------------------------------------------------------

    def _reader(self) -> Consumer:
        return Consumer({
            **self._connection, "group.id": f"mongocdc-keys-{uuid.uuid4().hex[:12]}", "enable.auto.commit": False,
            "enable.partition.eof": True, "isolation.level": "read_committed",
        })

    def key_mark(self, topic: str) -> dict[str, int]:
        """The end offset of each of the topic's partitions (records before them were delivered)."""
        consumer = self._reader()
        try:
            partitions = self._partitions(consumer, topic)
            return {
                str(p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=_ADMIN_TIMEOUT_S)[1]
                for p in partitions
            }
        except KafkaException as exc:
            raise SinkError(f"cannot read the end offsets of Kafka topic {topic!r}: {exc.args[0].str()}") from exc
        finally:
            consumer.close()

    def scan_keys(self, topic: str, mark: Any, since: Position) -> KeyScan | None:
        """Reads the topic (``read_committed``) from its beginning, split at the offsets of ``mark``."""
        if not isinstance(mark, dict):
            return None
        builder = KeyScanBuilder()
        consumer = self._reader()
        try:
            pending = set(self._partitions(consumer, topic))
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
            while pending:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise SinkError(f"cannot read back Kafka topic {topic!r}: {err.str()}")
                    pending.discard(msg.partition())
                    continue
                raw = msg.value()
                try:
                    key = orjson.loads(msg.key() or b"null")
                    value = orjson.loads(raw) if raw is not None else None
                except orjson.JSONDecodeError:
                    continue  # not a record of this connector
                builder.add(key, value, (msg.offset() or 0) >= int(mark.get(str(msg.partition()), 0)))
        finally:
            consumer.close()
        return builder.build()

    @staticmethod
    def _partitions(consumer: Consumer, topic: str) -> list[int]:
        metadata = consumer.list_topics(topic, timeout=_ADMIN_TIMEOUT_S).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return []  # nothing was ever delivered to it
        return sorted(metadata.partitions)

    # -- exactly-once: the offset store commits through here -----------------------------------------

    def commit_with_offset(self, topic: str, key: bytes, value: bytes, position: Position | None) -> None:
        """Write the offset record and commit it atomically with every record since the last commit."""
        if not self.transactional:
            raise SinkError("commit_with_offset needs mongocdc.kafka.exactly.once=true")
        self._check_usable()
        if self._admin is not None and topic not in self._known_topics:
            self._known_topics.add(topic)  # the offset store created it (compacted)
        self._begin()
        while True:
            try:
                self._producer.produce(topic, value=value, key=key)
                break
            except BufferError:
                self._wait_for_room()
        self.flush()
        self._commit()
        self._committed_position = position

    def _begin(self) -> None:
        if not self._in_txn:
            self._call_txn(self._producer.begin_transaction, "begin")
            self._in_txn = True
            self._txn_max_position = None

    def _commit(self) -> None:
        self._call_txn(lambda: self._producer.commit_transaction(self.settings.transaction_timeout_ms / 1000), "commit")
        self._in_txn = False
        self._txn_max_position = None
        self.metrics.NumberOfTransactionsCommitted += 1

    def _call_txn(self, call: Any, what: str) -> None:
        """A transactional API call: retried when retriable; an abortable error aborts and raises."""
        while True:
            try:
                call()
                return
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.retriable():
                    self._wait_for_broker(f"{what} transaction")
                    continue
                if err.txn_requires_abort():
                    try:
                        self._producer.abort_transaction(_ADMIN_TIMEOUT_S)
                    except KafkaException:
                        log.exception("aborting the Kafka transaction failed")
                    self._in_txn = False
                    self._fatal = err
                    raise SinkError(f"Kafka transaction {what} failed and was aborted: {err.str()}") from exc
                self._fatal = err
                raise SinkError(f"Kafka transaction {what} failed: {err.str()}") from exc

    # -- helpers -------------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise SinkError("the Kafka sink is closed")
        if self._fatal is not None:
            raise SinkError(f"the Kafka producer failed: {self._fatal.str()}")
        if self._delivery_errors:
            topic, err = self._delivery_errors[0]
            more = f" (and {len(self._delivery_errors) - 1} more)" if len(self._delivery_errors) > 1 else ""
            raise SinkError(f"delivery to Kafka topic {topic!r} failed: {err.str()}{more}")

    def _wait_for_room(self) -> None:
        """The local queue is full (broker slow or away): serve the producer until there is room."""
        now = time.monotonic()
        if self.metrics.block():
            self._last_blocked_log = now
            log.warning("Kafka producer queue full (%d records); waiting for the broker", len(self._producer))
        elif now - self._last_blocked_log > _BLOCKED_LOG_EVERY_S:
            self._last_blocked_log = now
            log.warning("Kafka sink still blocked: %d records waiting for the broker", len(self._producer))
        self._producer.poll(_POLL_STEP_S)
        self._check_usable()

    def _wait_for_broker(self, what: str) -> None:
        if self.metrics.block():
            log.warning("Kafka sink blocked: cannot %s, waiting for the broker", what)
        self._producer.poll(_POLL_STEP_S * 5)

    def _unblocked(self) -> None:
        blocked = self.metrics.unblock()
        if blocked:
            log.warning("Kafka sink resumed after %.1fs blocked", blocked)

    def _create(self, topics: set[str]) -> None:
        assert self._admin is not None

        def retrying(pending: list[str]) -> None:
            if self.metrics.block():
                log.warning("Kafka sink blocked: cannot create topics %s yet, retrying", pending)

        create_topics(
            self._admin,
            topics,
            partitions=self.settings.partitions,
            replication_factor=self.settings.replication_factor,
            config=self.settings.topic_config(),
            stop=self._stop,
            on_retry=retrying,
        )
        self._known_topics |= topics
