"""Debezium's Kafka signal channel: signals are messages on ``signal.kafka.topic``.

The key of a message must equal ``topic.prefix``; the value is the signal JSON (``type``, ``data``,
optionally ``id``; without one the id is ``kafka-<partition>-<offset>``). The topic has one
partition (signal order matters), read from ``signal.kafka.bootstrap.servers`` with group
``signal.kafka.groupId`` and the pass-through ``signal.consumer.*`` settings.

With ``signal.consumer.offset.commit.enabled=true`` the channel resumes from the group's committed
offset and commits after each signal is handed over (at-least-once); otherwise it starts at the
end of the topic, so only signals sent while the connector runs are seen (Debezium's behaviour).
A message with a wrong key or malformed JSON is rejected (logged, and notified by the processor),
never fatal.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.quoting import bounded
from mongocdc_core.source.signals import CHANNEL_KAFKA, Signal, SignalError, parse_signal_json

log = logging.getLogger(__name__)

Reject = Callable[[str, str, str], None]
"""``(channel, reason, signal_id)``, as ``SignalProcessor.reject``."""

_METADATA_TIMEOUT_S = 30.0


def _log_reject(channel: str, reason: str, signal_id: str) -> None:
    log.warning("skipping signal %s from the %s channel: %s", signal_id or "?", channel, bounded(reason))


class KafkaSignalChannel:
    """Reads the signal topic; ``read()`` polls once, ``start()`` polls on a thread until ``stop()``."""

    def __init__(self, cfg: ConnectorConfig, submit: Callable[[Signal], None], reject: Reject | None = None) -> None:
        bootstrap = cfg.signal_kafka_bootstrap_servers
        if not bootstrap:
            raise ValueError("signal.kafka.bootstrap.servers is required for the Kafka signal channel")
        self.topic: str = cfg.signal_kafka_topic or f"{cfg.topic_prefix}-signal"
        self.topic_prefix: str = cfg.topic_prefix
        self.poll_timeout_s = cfg.signal_kafka_poll_timeout_ms / 1000
        self.commit = cfg.signal_consumer_offset_commit_enabled
        self.submit = submit
        self.reject = reject or _log_reject
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": cfg.signal_kafka_groupId,
                "client.id": f"mongocdc-signal-{cfg.topic_prefix}-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **cfg.signal_consumer_properties,
            }
        )
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._assign()

    def _assign(self) -> None:
        """Partition 0 at the committed offset (commit enabled) or at the current end of the topic.

        The end is looked up now, not lazily, so a signal sent after the constructor returned is seen.
        """
        partition = TopicPartition(self.topic, 0)
        try:
            if self.commit:
                committed = self._consumer.committed([partition], timeout=_METADATA_TIMEOUT_S)[0]
                start = committed.offset if committed.offset >= 0 else OFFSET_BEGINNING
            else:
                _, high = self._consumer.get_watermark_offsets(partition, timeout=_METADATA_TIMEOUT_S)
                start = high
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() not in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                                  KafkaError._UNKNOWN_TOPIC):
                raise
            start = OFFSET_BEGINNING  # the topic does not exist yet: everything in it will be new
        self._consumer.assign([TopicPartition(self.topic, 0, start)])
        log.info("Kafka signal channel reading %s from offset %s", self.topic, start)

    def read(self) -> list[Signal]:
        """Poll once (up to ``signal.kafka.poll.timeout.ms``); hand over and return the valid signals."""
        messages = self._consumer.consume(100, self.poll_timeout_s)
        signals = []
        for message in messages:
            signal = self._handle(message)
            if signal is not None:
                signals.append(signal)
        if self.commit and messages:
            last = messages[-1]
            self._consumer.commit(
                offsets=[TopicPartition(self.topic, last.partition() or 0, (last.offset() or 0) + 1)],
                asynchronous=False,
            )
        return signals

    def _handle(self, message: Message) -> Signal | None:
        err = message.error()
        if err is not None:
            if err.code() not in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                log.warning("Kafka signal channel: %s", err.str())
            return None
        signal_id = f"kafka-{message.partition()}-{message.offset()}"
        key, value = message.key(), message.value()
        try:
            if key is None:
                raise SignalError(f"signal {signal_id}: message has no key (it must equal topic.prefix "
                                  f"{self.topic_prefix!r})")
            if value is None:
                raise SignalError(f"signal {signal_id}: message has no value")
            signal = parse_signal_json(value, CHANNEL_KAFKA, key=key, topic_prefix=self.topic_prefix, id=signal_id)
        except SignalError as exc:
            self.reject(CHANNEL_KAFKA, str(exc), signal_id)
            return None
        self.submit(signal)
        return signal

    # -- background reading --------------------------------------------------------------------------

    def start(self) -> None:
        """Read on a daemon thread until ``stop()``."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="mongocdc-signal-kafka", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.read()
            except KafkaException as exc:  # a broker hiccup must not end signal reading
                log.warning("Kafka signal channel: %s", exc.args[0].str())
                self._stop.wait(1.0)

    def stop(self) -> None:
        """Stop the thread (if started) and close the consumer. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if not self._closed:
            self._closed = True
            self._consumer.close()
