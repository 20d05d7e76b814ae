"""Helpers shared by the engine's integration tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from bson import Timestamp
from pymongo import MongoClient

from mongocdc_core.api import current_cluster_time
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine, RunSummary
from mongocdc_core.events.records import Record
from mongocdc_core.offsets import OffsetStore
from mongocdc_core.replay import Replayer, canonical


class MemorySink:
    """Keeps written records; ``durable`` holds only what a flush made durable."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.durable: list[Record] = []
        self.flushes = 0

    def write(self, records: Sequence[Record]) -> None:
        self.records.extend(records)

    def flush(self, timeout: float | None = None) -> None:
        self.durable = list(self.records)
        self.flushes += 1

    def close(self) -> None:
        self.flush()

    # -- views ---------------------------------------------------------------------------------------
    def data(self, namespace: str | None = None) -> list[Record]:
        return [r for r in self.records if r.collection is not None and (namespace is None or r.collection == namespace)]

    def values(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Payloads of data events (tombstones left out)."""
        out = []
        for r in self.data(namespace):
            if r.value is not None:
                v = orjson.loads(r.value)
                out.append(v.get("payload", v))
        return out

    def topic(self, topic: str) -> list[Record]:
        return [r for r in self.records if r.topic == topic]


def make_config(uri: str, db: str, **props: Any) -> ConnectorConfig:
    """A fast-polling config capturing every collection of ``db``."""
    base: dict[str, Any] = {
        "mongodb.connection.string": uri,
        "topic.prefix": "srv",
        "collection.include.list": f"{db}\\..*",
        "poll.interval.ms": 50,
        "cursor.max.await.time.ms": 100,
        "connect.backoff.initial.delay.ms": 50,
        "connect.backoff.max.delay.ms": 400,
        "offset.flush.interval.ms": 200,
        "mongodb.heartbeat.frequency.ms": 500,  # rediscover the primary quickly after injected faults
        "mongocdc.schemas.enable": "false",
    }
    base.update(props)
    return ConnectorConfig.from_dict({k: str(v) for k, v in base.items()})


def run_engine(
    cfg: ConnectorConfig,
    sink: Any,
    offsets: OffsetStore,
    *,
    stop_at: Timestamp | None = None,
    max_events: int | None = None,
    until_idle: float | None = None,
) -> RunSummary:
    """One bounded run; without a bound it stops at the cluster time of now (after the caller's
    writes), so what it delivered is decided by positions, never by timing."""
    if stop_at is None and max_events is None and until_idle is None:
        stop_at = current_cluster_time(cfg)
    return Engine(cfg, sink, offsets).run(max_events=max_events, until_idle=until_idle, stop_at=stop_at)


def cluster_time(client: MongoClient[Any]) -> Timestamp:
    """The cluster time after everything ``client`` wrote: a run stopped there has seen all of it."""
    ts = client.admin.command("hello")["$clusterTime"]["clusterTime"]
    assert isinstance(ts, Timestamp)
    return ts


class Background:
    """Runs an engine on a thread until ``stop()``; the summary or the error is kept."""

    def __init__(self, engine: Engine, **run_kwargs: Any) -> None:
        self.engine = engine
        self.summary: RunSummary | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, kwargs=run_kwargs, daemon=True)

    def _run(self, **kwargs: Any) -> None:
        try:
            self.summary = self.engine.run(**kwargs)
        except BaseException as exc:
            self.error = exc

    def start(self) -> Background:
        self._thread.start()
        return self

    def check(self) -> None:
        """Raise the engine's error, if it failed (so a waiting test fails with the cause)."""
        if self.error is not None:
            raise self.error

    def wait(self, timeout: float = 60) -> RunSummary:
        """Wait for the run to end by itself (its bound); its summary, or its error raised."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the run did not end"
        self.check()
        assert self.summary is not None
        return self.summary

    def stop(self, timeout: float = 60) -> RunSummary:
        self.engine.stop()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "engine did not stop"
        if self.error is not None:
            raise self.error
        assert self.summary is not None
        return self.summary


def wait_for(predicate: Callable[[], bool], timeout: float = 20, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def replay(records: Sequence[Record], namespace: str) -> list[str]:
    """Canonical documents rebuilt from ``records`` of ``namespace``."""
    pairs = [(r.key, r.value) for r in records if r.collection == namespace]
    return canonical(Replayer().apply_all(pairs).documents(namespace))


def source_state(collection: Any) -> list[str]:
    return canonical(collection.find())
