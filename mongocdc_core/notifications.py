"""Debezium's notification channels: ``log`` and ``sink`` (a topic, ``notification.sink.topic.name``).

A notification is Debezium's ``Notification``: ``id`` (uuid), ``aggregate_type`` (e.g. "Incremental
Snapshot"), ``type`` (STARTED, COMPLETED, …), ``additional_data`` (string map) and ``timestamp`` (ms).
Every ``additional_data`` value is cut to a bounded prefix (``mongocdc_core.quoting``), so no
notification can outgrow a Kafka message or flood a log. ``notify`` may be called from any thread; sink records are queued and handed to the sink by the
dispatcher's thread (``drain``), because sinks are not thread-safe and must keep delivery order.
The ``jmx`` channel has no JMX here: notifications are kept in ``sent`` for in-process readers.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.records import Record
from mongocdc_core.logs import fields
from mongocdc_core.positions import Position
from mongocdc_core.quoting import TEXT_LIMIT, bounded

log = logging.getLogger(__name__)

_KEY_SCHEMA = {"type": "string", "optional": False}
_VALUE_SCHEMA = {
    "type": "struct",
    "name": "io.debezium.notification.Notification",
    "optional": False,
    "fields": [
        {"field": "id", "type": "string", "optional": False},
        {"field": "aggregate_type", "type": "string", "optional": False},
        {"field": "type", "type": "string", "optional": False},
        {
            "field": "additional_data",
            "type": "map",
            "keys": {"type": "string", "optional": False},
            "values": {"type": "string", "optional": False},
            "optional": True,
        },
        {"field": "timestamp", "type": "int64", "optional": False},
    ],
}
_KEEP_SENT = 1000


def log_notification(connector_name: str, notification: Mapping[str, Any]) -> None:
    """Debezium's ``log`` channel: one INFO event, the notification as JSON in the message and as
    structured fields (``notification``) for JSON logs."""
    log.info("Notification from %s: %s", connector_name or "mongocdc", orjson.dumps(notification).decode(),
             extra=fields(notification=dict(notification)))


class NotificationService:
    """Sends notifications to the channels in ``notification.enabled.channels``."""

    def __init__(self, cfg: ConnectorConfig) -> None:
        self.channels = tuple(cfg.notification_enabled_channels)
        self.topic: str | None = cfg.notification_sink_topic_name
        self.connector_name = cfg.name or cfg.topic_prefix or ""
        self.schemas = cfg.mongocdc_schemas_enable
        self.sent: list[dict[str, Any]] = []
        self._pending: list[Record] = []
        self._lock = threading.Lock()

    def notify(self, aggregate_type: str, type: str, additional_data: Mapping[str, str]) -> None:  # noqa: A002
        """Build one notification and send it to every enabled channel (never raises for a channel)."""
        notification = {
            "id": str(uuid.uuid4()),
            "aggregate_type": aggregate_type,
            "type": type,
            # Bounded: a notification quoting a megabyte-sized bad value must still fit in a Kafka message.
            "additional_data": {bounded(str(k), 200): bounded(str(v), TEXT_LIMIT) for k, v in additional_data.items()},
            "timestamp": int(time.time() * 1000),
        }
        if "log" in self.channels:
            log_notification(self.connector_name, notification)
        record = self._record(notification) if "sink" in self.channels else None
        with self._lock:
            self.sent.append(notification)
            del self.sent[:-_KEEP_SENT]
            if record is not None:
                self._pending.append(record)

    def drain(self) -> list[Record]:
        """Sink records queued since the last call (the dispatcher writes them to the sink)."""
        with self._lock:
            records, self._pending = self._pending, []
        return records

    def _record(self, notification: dict[str, Any]) -> Record:
        assert self.topic is not None
        key: Any = notification["id"]
        value: Any = notification
        if self.schemas:
            key = {"schema": _KEY_SCHEMA, "payload": key}
            value = {"schema": _VALUE_SCHEMA, "payload": value}
        # Not a stream position: the lowest one, so it never moves or blocks an offset.
        return Record(self.topic, orjson.dumps(key), orjson.dumps(value), Position.MIN, None, None)
