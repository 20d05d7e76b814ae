"""The engine's functions for orchestrators (Dagster assets, sensors): each call is self-contained.

Every function runs its own :class:`~mongocdc_core.pipeline.CapturePipeline` (which connects
from the config and closes the connection at the end), so calls can run in separate processes.
Snapshots and stream windows write into the given sink and flush it before returning; they never
touch the connector's offsets.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.database import Database

from mongocdc_core.config import ConfigError, ConnectorConfig
from mongocdc_core.events.records import Record
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.offsets import Offset, SnapshotState
from mongocdc_core.pipeline import Bound, CapturePipeline
from mongocdc_core.positions import Position
from mongocdc_core.receiver import ProgressListener
from mongocdc_core.sinks.base import Sink
from mongocdc_core.source import oplog as _oplog
from mongocdc_core.source.errors import CdcError, HistoryLostError, SnapshotReadUnavailable
from mongocdc_core.source.incremental import (
    READ_ONLY,
    IncrementalSnapshotResult,
    IncrementalSnapshotter,
    IncrementalStateFile,
    StandaloneOutput,
)
from mongocdc_core.source.oplog import OplogWindow, OplogWindows
from mongocdc_core.source.ranges import IdRange, plan_ranges
from mongocdc_core.source.signals import SignalRead, read_signal_inserts
from mongocdc_core.source.snapshot import (
    captured_collections,
    collection_filter,
    estimate_count,
    record_start,
)
from mongocdc_core.source.stream import StartPoint, watch_target

__all__ = [
    "CdcError",
    "ConfigError",
    "HistoryLostError",
    "IdRange",
    "IncrementalSnapshotResult",
    "OplogWindow",
    "OplogWindows",
    "SignalRead",
    "SliceResult",
    "SnapshotReadUnavailable",
    "SnapshotResult",
    "current_cluster_time",
    "estimated_counts",
    "incremental_snapshot_collection",
    "list_captured_collections",
    "oplog_window",
    "oplog_windows",
    "plan_snapshot_ranges",
    "read_signals",
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
def _pipeline(
    cfg: ConnectorConfig, sink: Sink, progress: ProgressListener | None = None, metrics: ConnectorMetrics | None = None
) -> Iterator[CapturePipeline]:
    """A connected capture pipeline with a fresh dispatcher (no offsets: callers keep positions).

    ``metrics`` lets the caller read Debezium's snapshot and streaming metrics of the call afterwards."""
    with CapturePipeline(cfg, sink, progress=progress, metrics=metrics) as pipeline:
        pipeline.open_dispatcher(Offset())
        yield pipeline


def _split(namespace: str) -> tuple[str, str]:
    db, dot, coll = namespace.partition(".")
    if not (db and dot and coll):
        raise CdcError(f"namespace must be '<database>.<collection>', got {namespace!r}")
    return db, coll


class _NoSink:
    """For calls that only read metadata: nothing is ever written."""

    def write(self, records: Sequence[Record]) -> None:
        raise CdcError("this call writes no records")

    def flush(self, timeout: float | None = None) -> None:
        """Nothing to flush."""

    def close(self) -> None:
        """Nothing to close."""


def list_captured_collections(cfg: ConnectorConfig) -> list[str]:
    """Existing collections the include/exclude filters capture, as sorted ``db.coll``."""
    with CapturePipeline(cfg, _NoSink()) as pipeline:
        return captured_collections(pipeline.client, cfg)


def oplog_windows(cfg: ConnectorConfig) -> OplogWindows:
    """The oplog window of the replica set, or of each shard of a sharded cluster (read from the shard)."""
    with CapturePipeline(cfg, _NoSink()) as pipeline:
        assert pipeline.topology is not None  # set by connecting
        return _oplog.oplog_windows(cfg, pipeline.client, pipeline.topology)


def oplog_window(cfg: ConnectorConfig) -> OplogWindow:
    """The window a stream can resume in (on a sharded cluster, the part every shard's oplog holds); raises
    where an oplog is not readable."""
    windows = oplog_windows(cfg)
    common = windows.common
    if windows.unreadable or common is None:
        raise CdcError("the oplog window is unknown: " + "; ".join(
            f"{name}: {why}" for name, why in sorted(windows.unreadable.items())))
    return common


def estimated_counts(cfg: ConnectorConfig, namespaces: Sequence[str]) -> dict[str, int | None]:
    """Each collection's document count for progress totals (estimated; exact under a filter override)."""
    with CapturePipeline(cfg, _NoSink()) as pipeline:
        return {ns: estimate_count(pipeline.client, cfg, ns) for ns in namespaces}


def read_signals(
    cfg: ConnectorConfig, *, resume_after: dict[str, Any] | None = None, start_at: Timestamp | None = None,
    limit: int = 100,
) -> SignalRead:
    """Signals inserted into ``signal.data.collection`` after a resume token (or from ``start_at``, else
    from now), in insert order, up to the current cluster time; see ``source.signals.read_signal_inserts``."""
    with CapturePipeline(cfg, _NoSink()) as pipeline:
        until = _oplog.current_cluster_time(pipeline.client)
        after_now = Timestamp(until.time, until.inc + 1)  # signals already inserted are not "from now"
        return read_signal_inserts(pipeline.client, cfg, resume_after=resume_after,
                                   start_at=start_at if start_at is not None or resume_after else after_now,
                                   until=until, limit=limit)


def current_cluster_time(cfg: ConnectorConfig) -> Timestamp:
    """The deployment's current clusterTime."""
    with CapturePipeline(cfg, _NoSink()) as pipeline:
        return _oplog.current_cluster_time(pipeline.client)


def plan_snapshot_ranges(cfg: ConnectorConfig, namespace: str, split_size: int | None = None) -> list[IdRange]:
    """The ``_id`` ranges of about ``split_size`` documents (default ``mongocdc.snapshot.split.size``)
    that a snapshot of ``namespace`` is copied as; orchestrators run one range per partition."""
    db, coll = _split(namespace)
    size = cfg.mongocdc_snapshot_split_size if split_size is None else split_size
    with CapturePipeline(cfg, _NoSink()) as pipeline:
        return plan_ranges(pipeline.client[db][coll], size)


def snapshot_collection(
    cfg: ConnectorConfig,
    namespace: str,
    sink: Sink,
    *,
    filter: dict[str, Any] | None = None,  # noqa: A002 - the API's name
    id_range: IdRange | None = None,
    progress: ProgressListener | None = None,
    at_cluster_time: Timestamp | None = None,
    metrics: ConnectorMetrics | None = None,
) -> SnapshotResult:
    """Blocking snapshot of one collection into ``sink`` (flushed before returning).

    The position is recorded before the copy starts; every read record carries it, so any change
    streamed after it supersedes the read. ``filter`` defaults to the collection's
    ``snapshot.collection.filter.overrides`` entry; ``id_range`` copies one range of
    :func:`plan_snapshot_ranges` only (the union of all ranges is the whole snapshot).

    ``at_cluster_time`` reads the collection as it was at that cluster time (a snapshot read) and the
    records carry that position; it raises :class:`SnapshotReadUnavailable` when the server no longer
    holds that time (or cannot read at one), so the caller can choose another way.
    """
    db, coll = _split(namespace)
    started = time.monotonic()
    counting = _CountingSink(sink)
    with _pipeline(cfg, counting, progress, metrics) as pipeline:
        if at_cluster_time is not None:  # a snapshot read: the records carry that time's position
            position, token = Position.from_timestamp(at_cluster_time), None
        else:
            start = record_start(pipeline.client, pipeline.client[db][coll])
            position, token = start.position, start.token
        query = filter if filter is not None else collection_filter(cfg, namespace)
        if id_range is not None and not id_range.whole:
            query = {"$and": [query, id_range.query()]} if query else id_range.query()
        state = SnapshotState(
            collections=[namespace], start_position=position, start_token=token, filters={namespace: query}
        )
        pipeline.snapshot(
            state, threads=1, totals={namespace: None}, at_cluster_time=at_cluster_time,
            split_size=0 if id_range is not None or at_cluster_time is not None else None,
        )
        dispatcher = pipeline.dispatcher
    return SnapshotResult(
        namespace=namespace,
        documents=dispatcher.snapshot_documents,
        bytes=counting.bytes,
        duration_s=time.monotonic() - started,
        position=position,
        resume_token=token,
    )


class _CountingSink:
    """Passes records through and counts the bytes of their values."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        self.bytes = 0

    def write(self, records: Sequence[Record]) -> None:
        self.bytes += sum(len(r.value) for r in records if r.value is not None)
        self.inner.write(records)

    def flush(self, timeout: float | None = None) -> None:
        self.inner.flush(timeout)

    def close(self) -> None:
        self.inner.close()


def _key(ts: Timestamp) -> tuple[int, int]:
    return (ts.time, ts.inc)


def stream_window(
    cfg: ConnectorConfig,
    namespace: str | None,
    start: Timestamp,
    end: Timestamp,
    sink: Sink,
    *,
    progress: ProgressListener | None = None,
    metrics: ConnectorMetrics | None = None,
    only: Iterable[str] | None = None,
) -> SliceResult:
    """Deliver the change events of clusterTime window ``[start, end)`` into ``sink``.

    For one collection (or every captured one when ``namespace`` is None, or those of them in
    ``only``: one change stream serves many collections). The same window
    yields the same events as long as the oplog holds them; when ``start`` has left the oplog
    this raises ``HistoryLostError`` instead of returning a partial window. If ``end`` is in the
    future it waits until the cluster time passes it.
    """
    if not isinstance(start, Timestamp) or not isinstance(end, Timestamp):
        raise CdcError(f"window bounds must be bson.Timestamp values, got {start!r} and {end!r}")
    if _key(end) <= _key(start):
        raise CdcError(f"empty window: end {end} is not after start {start}")
    with _pipeline(cfg, sink, progress, metrics) as pipeline:
        client = pipeline.client
        window = _oplog.oplog_window(client)
        if window is not None and not window.contains(start):
            raise HistoryLostError.for_window(start, end, window.first)
        target = client[_split(namespace)[0]][_split(namespace)[1]] if namespace is not None else watch_target(client, cfg)
        if progress is not None:
            progress.streaming_started(Position.from_timestamp(start))
        try:
            outcome = pipeline.stream(
                StartPoint(start_at=start), Bound(), target=target, window_end=end,
                accept=namespace.__eq__ if namespace is not None else None if only is None else frozenset(only).__contains__,
            )
        except HistoryLostError as lost:
            raise HistoryLostError.for_window(start, end, lost.oplog_first) from lost
        if outcome.reason != "end":
            raise CdcError(f"stream window [{start}, {end}) stopped before its end ({outcome.reason})")
        dispatcher = pipeline.dispatcher
        dispatcher.finish()
    return SliceResult(
        namespace=namespace,
        counts=dict(dispatcher.counts),
        events=dispatcher.events,
        first_position=dispatcher.first_position,
        last_position=dispatcher.last_event_position,
        resume_token=outcome.end_token,
    )


class _IncrementalCompanion:
    """A standalone incremental snapshot next to its own stream (no signals, no blocking snapshots)."""

    def __init__(self, snapshotter: IncrementalSnapshotter, namespace: str) -> None:
        self.snapshotter = snapshotter
        self.namespace = namespace
        self.events = 0
        self.passed: Position | None = None  # every event up to it was dispatched

    @property
    def busy(self) -> bool:
        return self.snapshotter.running

    @property
    def watching(self) -> bool:
        """It counts its collection's streamed events and follows what the stream passed: always."""
        return True

    def on_signal(self, change: Any, position: Position) -> None:
        self.snapshotter.on_signal_event(change, position)

    def on_stream_event(self, namespace: str, document_key: Any, position: Position) -> bool:
        self.events += namespace == self.namespace
        return self.snapshotter.on_stream_event(namespace, document_key, position)

    def on_stream_passed(self, upto: Timestamp, last: Position | None) -> None:
        self.passed = Position.from_timestamp(upto) if self.passed is None else max(self.passed, Position.from_timestamp(upto))
        self.snapshotter.on_stream_passed(upto, last)

    def process(self) -> None:
        self.snapshotter.poll()

    def take_blocking(self) -> None:
        """A standalone incremental snapshot reads no signals, so no blocking snapshot is ever asked for."""
        return None


def incremental_snapshot_collection(
    cfg: ConnectorConfig,
    namespace: str,
    sink: Sink,
    *,
    filter: dict[str, Any] | None = None,  # noqa: A002 - the API's name
    progress: ProgressListener | None = None,
    state_path: str | os.PathLike[str] | None = None,
    metrics: ConnectorMetrics | None = None,
) -> IncrementalSnapshotResult:
    """Incremental snapshot of one collection with its own change stream, into ``sink``.

    Watermarks go to ``signal.data.collection`` and the stream watches that collection and
    ``namespace`` (with ``incremental.snapshot.watermarking.strategy=read_only`` nothing is
    written: the watermarks are cluster times and the stream watches ``namespace`` only). Reads carry their chunk's closing-watermark position; the collection's changes
    streamed while the snapshot ran are delivered too, so applying the sink's records in order
    gives the collection as it was at the end. ``filter`` defaults to the collection's
    ``snapshot.collection.filter.overrides`` entry. With ``state_path`` an interrupted run
    continues from its last completed chunk; the file is removed when the snapshot completes.
    """
    db, coll = _split(namespace)
    read_only = cfg.incremental_snapshot_watermarking_strategy == READ_ONLY
    if not cfg.signal_data_collection and not read_only:
        raise CdcError(
            "incremental_snapshot_collection needs signal.data.collection (watermarks are written there), or "
            "incremental.snapshot.watermarking.strategy=read_only"
        )
    started = time.monotonic()
    state_file = IncrementalStateFile(state_path) if state_path is not None else None
    signal_db, _, signal_coll = (cfg.signal_data_collection or "").partition(".")
    watched = {namespace} if read_only else {namespace, cfg.signal_data_collection}
    with _pipeline(cfg, sink, progress, metrics) as pipeline:
        client = pipeline.client
        target: Collection[Any] | Database[Any] | MongoClient[Any]
        stages: list[dict[str, Any]] = []
        if read_only:
            target = client[db][coll]
        else:
            target = client[db] if signal_db == db else client
            stages = [{"$match": {"$or": [{"ns.db": db, "ns.coll": coll}, {"ns.db": signal_db, "ns.coll": signal_coll}]}}]
        start = record_start(client, target)
        dispatcher = pipeline.dispatcher
        stored = state_file.load(namespace) if state_file is not None else None
        query = filter if filter is not None else collection_filter(cfg, namespace)
        output = StandaloneOutput(dispatcher, state_file)
        snapshotter = IncrementalSnapshotter(
            client, cfg, output, metrics=pipeline.metrics.snapshot, connection=pipeline.metrics, state=stored, progress=progress,
        )
        if stored is None:
            snapshotter.start(f"api-{uuid.uuid4()}", [namespace], {namespace: query} if query else {})
        companion = _IncrementalCompanion(snapshotter, namespace)
        try:
            pipeline.stream(
                StartPoint(resume_after=start.token), Bound(), target=target, pipeline=stages,
                accept=watched.__contains__,
                companion=companion, done=snapshotter.finished.is_set,
            )
        finally:
            snapshotter.shutdown()
        dispatcher.finish()
    return IncrementalSnapshotResult(
        namespace=namespace,
        documents=dispatcher.snapshot_documents,
        events=companion.events,
        duration_s=time.monotonic() - started,
        first_position=output.first,
        last_position=output.last,
        end_position=max((p for p in (dispatcher.last_position, companion.passed) if p is not None), default=None),
        resumed=stored is not None,
    )
