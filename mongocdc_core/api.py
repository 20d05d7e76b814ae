"""The engine's functions for orchestrators (Dagster assets, sensors): each call is self-contained.

Every function opens its own MongoClient from the config and closes it, so calls can run in
separate processes. Snapshots and stream windows write into the given sink and flush it before
returning; they never touch the connector's offsets.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from pymongo import MongoClient

from mongocdc_core.config import ConfigError
from mongocdc_core.dispatcher import Dispatcher, ProgressListener
from mongocdc_core.events import EventConverter, EventOptions
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.offsets import Offset
from mongocdc_core.positions import Position
from mongocdc_core.sinks.base import Sink
from mongocdc_core.source import oplog as _oplog
from mongocdc_core.source.connection import Topology, connect
from mongocdc_core.source.errors import CdcError, HistoryLostError
from mongocdc_core.source.incremental import IncrementalSnapshotResult, incremental_snapshot_collection
from mongocdc_core.source.oplog import OplogWindow
from mongocdc_core.source.ranges import IdRange, plan_ranges
from mongocdc_core.source.snapshot import (
    SnapshotChunk,
    SnapshotCopier,
    captured_collections,
    collection_filter,
    record_start,
)
from mongocdc_core.source.stream import ChangeStreamReader, EventQueue, StartPoint, watch_target

__all__ = [
    "CdcError",
    "ConfigError",
    "HistoryLostError",
    "IdRange",
    "IncrementalSnapshotResult",
    "OplogWindow",
    "SliceResult",
    "SnapshotResult",
    "current_cluster_time",
    "incremental_snapshot_collection",
    "list_captured_collections",
    "oplog_window",
    "plan_snapshot_ranges",
    "snapshot_collection",
    "stream_window",
]


@dataclass(frozen=True)
class SnapshotResult:
    """One collection's blocking snapshot; ``bytes`` counts the serialized record values delivered."""

    namespace: str
    documents: int
    bytes: int
    duration_s: float
    position: Position
    resume_token: dict[str, Any] | None


@dataclass(frozen=True)
class SliceResult:
    """One stream window ``[start, end)``: data events by op (c/u/d), first/last position, end token."""

    namespace: str | None
    counts: dict[str, int]
    events: int
    first_position: Position | None
    last_position: Position | None
    resume_token: dict[str, Any] | None


@contextmanager
def _client(cfg: Any) -> Iterator[tuple[MongoClient[Any], Topology]]:
    client, topology = connect(cfg)
    try:
        yield client, topology
    finally:
        client.close()


def _split(namespace: str) -> tuple[str, str]:
    db, dot, coll = namespace.partition(".")
    if not (db and dot and coll):
        raise CdcError(f"namespace must be '<database>.<collection>', got {namespace!r}")
    return db, coll


def list_captured_collections(cfg: Any) -> list[str]:
    """Existing collections the include/exclude filters capture, as sorted ``db.coll``."""
    with _client(cfg) as (client, _):
        return captured_collections(client, cfg)


def oplog_window(cfg: Any) -> OplogWindow:
    """The oplog's first and last entry times and size; raises where the oplog is not readable."""
    with _client(cfg) as (client, _):
        window = _oplog.oplog_window(client)
    if window is None:
        raise CdcError("local.oplog.rs is not readable (connected through mongos, or missing privileges)")
    return window


def current_cluster_time(cfg: Any) -> Timestamp:
    """The deployment's current clusterTime."""
    with _client(cfg) as (client, _):
        return _oplog.current_cluster_time(client)


def plan_snapshot_ranges(cfg: Any, namespace: str, split_size: int | None = None) -> list[IdRange]:
    """The ``_id`` ranges of about ``split_size`` documents (default ``mongocdc.snapshot.split.size``)
    that a snapshot of ``namespace`` is copied as; orchestrators run one range per partition."""
    db, coll = _split(namespace)
    with _client(cfg) as (client, _):
        size = cfg.mongocdc_snapshot_split_size if split_size is None else split_size
        return plan_ranges(client[db][coll], int(size))


def snapshot_collection(
    cfg: Any,
    namespace: str,
    sink: Sink,
    *,
    filter: dict[str, Any] | None = None,
    id_range: IdRange | None = None,
    progress: ProgressListener | None = None,
) -> SnapshotResult:
    """Blocking snapshot of one collection into ``sink`` (flushed before returning).

    The position is recorded before the copy starts; every read record carries it, so any change
    streamed after it supersedes the read. ``filter`` defaults to the collection's
    ``snapshot.collection.filter.overrides`` entry; ``id_range`` copies one range of
    :func:`plan_snapshot_ranges` only (the union of all ranges is the whole snapshot).
    """
    db, coll = _split(namespace)
    started = time.monotonic()
    with _client(cfg) as (client, topology):
        start = record_start(client, client[db][coll])
        converter = EventConverter(EventOptions.from_config(cfg, rs=topology.set_name or ""))
        query = filter if filter is not None else collection_filter(cfg, namespace)
        if id_range is not None and not id_range.whole:
            query = {"$and": [query, id_range.query()]} if query else id_range.query()
        metrics = ConnectorMetrics(cfg.topic_prefix)
        dispatcher = Dispatcher(cfg, converter, sink, None, metrics, Offset(), progress=progress)
        if progress is not None:
            progress.snapshot_started({namespace: None})

        def emit(chunk: SnapshotChunk) -> bool:
            dispatcher.snapshot_chunk(chunk, start.position, datetime.datetime.now(datetime.UTC))
            return True

        counting = _CountingSink(sink)
        dispatcher.sink = counting
        SnapshotCopier(
            client, cfg, [namespace], emit, threads=1, chunk_size=min(cfg.max_batch_size, 1024),
            filters={namespace: query}, split_size=0 if id_range is not None else None,
        ).run()
        dispatcher.commit()
        if progress is not None:
            progress.snapshot_finished(True, dispatcher.snapshot_documents)
    return SnapshotResult(
        namespace=namespace,
        documents=dispatcher.snapshot_documents,
        bytes=counting.bytes,
        duration_s=time.monotonic() - started,
        position=start.position,
        resume_token=start.token,
    )


class _CountingSink:
    """Passes records through and counts the bytes of their values."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        self.bytes = 0

    def write(self, records: Any) -> None:
        self.bytes += sum(len(r.value) for r in records if r.value is not None)
        self.inner.write(records)

    def flush(self, timeout: float | None = None) -> None:
        self.inner.flush(timeout)

    def close(self) -> None:
        self.inner.close()


def _key(ts: Timestamp) -> tuple[int, int]:
    return (ts.time, ts.inc)


def stream_window(
    cfg: Any,
    namespace: str | None,
    start: Timestamp,
    end: Timestamp,
    sink: Sink,
    *,
    progress: ProgressListener | None = None,
) -> SliceResult:
    """Deliver the change events of clusterTime window ``[start, end)`` into ``sink``.

    For one collection (or every captured one when ``namespace`` is None). The same window
    yields the same events as long as the oplog holds them; when ``start`` has left the oplog
    this raises ``HistoryLostError`` instead of returning a partial window. If ``end`` is in the
    future it waits until the cluster time passes it.
    """
    if not isinstance(start, Timestamp) or not isinstance(end, Timestamp):
        raise CdcError(f"window bounds must be bson.Timestamp values, got {start!r} and {end!r}")
    if _key(end) <= _key(start):
        raise CdcError(f"empty window: end {end} is not after start {start}")
    with _client(cfg) as (client, topology):
        window = _oplog.oplog_window(client)
        if window is not None and not window.contains(start):
            raise HistoryLostError.for_window(start, end, window.first)
        if namespace is not None:
            db, coll = _split(namespace)
            target = client[db][coll]
        else:
            target = watch_target(client, cfg)
        converter = EventConverter(EventOptions.from_config(cfg, rs=topology.set_name or ""))
        metrics = ConnectorMetrics(cfg.topic_prefix)
        dispatcher = Dispatcher(cfg, converter, sink, None, metrics, Offset(), progress=progress)
        queue = EventQueue(cfg.max_queue_size, cfg.max_queue_size_in_bytes, metrics.streaming)
        reader = ChangeStreamReader(
            client, cfg, StartPoint(start_at=start), queue, metrics=metrics.streaming, stop_at=end, target=target
        )
        if progress is not None:
            progress.streaming_started(Position.from_timestamp(start))
        end_token: dict[str, Any] | None = None
        reader.start()
        try:
            done = False
            while not done:
                for item in queue.get_batch(cfg.max_batch_size, cfg.poll_interval_ms / 1000):
                    if item.kind == "change":
                        assert item.doc is not None and item.token is not None
                        ns = item.doc.get("ns") or {}
                        if namespace is None or f"{ns.get('db')}.{ns.get('coll')}" == namespace:
                            dispatcher.change(item.doc, item.token)
                    elif item.kind == "end":
                        end_token = item.token
                        done = True
                        break
                    elif item.kind == "error":
                        assert item.error is not None
                        if isinstance(item.error, HistoryLostError):
                            raise HistoryLostError.for_window(start, end, item.error.oplog_first) from item.error
                        raise item.error
                dispatcher.drain()
            dispatcher.finish()
        finally:
            reader.stop()
            queue.close()
            reader.join()
    return SliceResult(
        namespace=namespace,
        counts=dict(dispatcher.counts),
        events=dispatcher.events,
        first_position=dispatcher.first_position,
        last_position=dispatcher.last_event_position,
        resume_token=end_token,
    )

