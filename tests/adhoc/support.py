"""Helpers shared by the ad hoc snapshot tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson
from bson import Timestamp
from pymongo import MongoClient

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.records import Record
from mongocdc_core.replay import Replayer
from tests.engine.engine_support import Background


class MemorySink:
    """Keeps every record written; ``durable`` is what the last successful flush covered."""

    def __init__(self, fail_on_flush: int | None = None) -> None:
        self.records: list[Record] = []
        self.durable: list[Record] = []
        self.flushes = 0
        self.fail_on_flush = fail_on_flush

    def write(self, records: Sequence[Record]) -> None:
        self.records.extend(records)

    def flush(self, timeout: float | None = None) -> None:
        self.flushes += 1
        if self.fail_on_flush is not None and self.flushes >= self.fail_on_flush:
            raise OSError(f"sink failure injected at flush {self.flushes}")
        self.durable = list(self.records)

    def close(self) -> None:
        """Nothing to release."""

    def data(self, namespace: str) -> list[Record]:
        return [r for r in self.records if r.collection == namespace]

    def values(self, namespace: str) -> list[dict[str, Any]]:
        return [payload(r) for r in self.data(namespace) if r.value is not None]


def payload(record: Record) -> dict[str, Any]:
    assert record.value is not None
    value = orjson.loads(record.value)
    return value.get("payload", value) if "schema" in value else value


def reads(sink: MemorySink, namespace: str) -> list[Record]:
    return [r for r in sink.data(namespace) if r.op == "r"]


def make_config(uri: str, db: str, **props: Any) -> ConnectorConfig:
    """A fast-polling connector config capturing ``db`` with its signaling collection ``<db>.signals``."""
    base: dict[str, Any] = {
        "mongodb.connection.string": uri,
        "topic.prefix": "srv",
        "collection.include.list": f"{db}\\..*",
        "signal.data.collection": f"{db}.signals",
        "poll.interval.ms": 50,
        "cursor.max.await.time.ms": 100,
        "connect.backoff.initial.delay.ms": 50,
        "connect.backoff.max.delay.ms": 400,
        "offset.flush.interval.ms": 200,
        "mongocdc.schemas.enable": "false",
    }
    base.update(props)
    return ConnectorConfig.from_dict({k: str(v) for k, v in base.items()})


def replay(records: Iterable[Record], namespace: str) -> list[dict[str, Any]]:
    replayer = Replayer()
    for record in records:
        if record.collection == namespace:
            replayer.apply(record.key, record.value)
    return replayer.documents(namespace)


def cluster_time(client: MongoClient[Any]) -> Timestamp:
    ts = client.admin.command("ping")["operationTime"]
    assert isinstance(ts, Timestamp)
    return ts


def wait_for(predicate: Callable[[], bool], engine: Background | None = None, timeout: float = 30) -> None:
    """Poll ``predicate`` (failing early with the engine's own error, if it died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine is not None:
            engine.check()
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


NOTIFICATIONS = "srv.notifications"


def notifications(sink: MemorySink, aggregate_type: str | None = None) -> list[dict[str, Any]]:
    """Notifications delivered on the sink channel (``notification.sink.topic.name`` = NOTIFICATIONS)."""
    found = []
    for record in sink.records:
        if record.topic == NOTIFICATIONS and record.value is not None:
            value = orjson.loads(record.value)
            value = value.get("payload", value) if "schema" in value else value
            if aggregate_type is None or value["aggregate_type"] == aggregate_type:
                found.append(value)
    return found


def kinds(sink: MemorySink, aggregate_type: str) -> list[str]:
    return [n["type"] for n in notifications(sink, aggregate_type)]


def engine_config(uri: str, db: str, **props: Any) -> ConnectorConfig:
    """Streaming-only connector (no initial snapshot) with sink notifications."""
    base: dict[str, Any] = {
        "snapshot.mode": "no_data",
        "notification.enabled.channels": "sink,log",
        "notification.sink.topic.name": NOTIFICATIONS,
        "heartbeat.interval.ms": 0,
    }
    base.update(props)
    return make_config(uri, db, **base)


def read_ids(sink: MemorySink, namespace: str) -> list[Any]:
    return [orjson.loads(payload(r)["after"])["_id"] for r in reads(sink, namespace)]
