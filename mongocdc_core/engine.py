"""The coordinator: snapshot per ``snapshot.mode``, then stream, until told to stop.

This is Debezium's ChangeEventSourceCoordinator: it reads the stored offset, asks the
snapshotter whether to copy the data, checks that a stored position is still in the oplog
(never a silent gap), runs the snapshot source and then the streaming source, both through one
dispatcher that owns the offset context.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from pymongo import MongoClient

from mongocdc_core.dispatcher import Dispatcher, ProgressListener
from mongocdc_core.events import EventConverter, EventOptions
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.notifications import NotificationService
from mongocdc_core.offsets import Offset, OffsetStore, SnapshotState
from mongocdc_core.positions import Position
from mongocdc_core.sinks.base import Sink
from mongocdc_core.source.blocking import AdHocSnapshots
from mongocdc_core.source.connection import connect
from mongocdc_core.source.errors import CdcError, ConnectError, HistoryLostError
from mongocdc_core.source.oplog import position_lost, token_timestamp
from mongocdc_core.source.snapshot import (
    SnapshotChunk,
    SnapshotCopier,
    Snapshotter,
    captured_collections,
    collection_filter,
    load_snapshotter,
    record_start,
    snapshot_collections,
)
from mongocdc_core.source.stream import ChangeStreamReader, EventQueue, StartPoint, watch_target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSummary:
    """What one ``Engine.run`` did. ``stopped_because``: max_events, idle, stop, snapshot_only, end."""

    snapshot_performed: bool
    snapshot_completed: bool
    snapshot_documents: int
    events: int
    counts: dict[str, int]
    records: int
    first_position: Position | None
    last_position: Position | None
    stopped_because: str
    duration_s: float


class Engine:
    """Runs one connector: ``Engine(cfg, sink, offsets).run()``; ``stop()`` from any thread."""

    def __init__(
        self,
        cfg: Any,
        sink: Sink,
        offsets: OffsetStore,
        *,
        progress: ProgressListener | None = None,
        metrics_file: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.sink = sink
        self.offsets = offsets
        self.progress = progress
        self.metrics = ConnectorMetrics(cfg.topic_prefix)
        self.metrics_file = metrics_file or cfg.mongocdc_metrics_file
        self._stop = threading.Event()
        self.flush_interval_s = cfg.offset_flush_interval_ms / 1000

    def stop(self) -> None:
        """Ask a running ``run`` to finish: it flushes the sink and records the offset, then returns."""
        self._stop.set()

    # -- run ------------------------------------------------------------------------------------------

    def run(self, max_events: int | None = None, until_idle: float | None = None) -> RunSummary:
        """Snapshot (per ``snapshot.mode``) then stream until ``max_events`` change events were
        dispatched, no event arrived for ``until_idle`` seconds, or ``stop()``."""
        started = time.monotonic()
        if self.metrics_file:
            self.metrics.start_file_writer(self.metrics_file)
        client: MongoClient[Any] | None = None
        try:
            client, topology = connect(self.cfg, self.metrics, self._stop)
            converter = EventConverter(EventOptions.from_config(self.cfg, rs=topology.set_name or ""))
            stored = self.offsets.load()
            offset = stored or Offset()
            dispatcher = Dispatcher(
                self.cfg,
                converter,
                self.sink,
                self.offsets,
                self.metrics,
                offset,
                progress=self.progress,
                flush_interval_s=self.flush_interval_s,
            )
            return self._run(client, dispatcher, stored, max_events, until_idle, started)
        finally:
            self.metrics.streaming.Connected = False
            if client is not None:
                client.close()
            if self.metrics_file:
                self.metrics.stop_file_writer(self.metrics_file)

    def _run(
        self,
        client: MongoClient[Any],
        dispatcher: Dispatcher,
        stored: Offset | None,
        max_events: int | None,
        until_idle: float | None,
        started: float,
    ) -> RunSummary:
        snapshotter = load_snapshotter(self.cfg)
        offset_exists = stored is not None and (stored.resume_token is not None or stored.snapshot is not None)
        in_progress = stored is not None and stored.snapshot_in_progress
        take_snapshot = snapshotter.should_snapshot_data(offset_exists, in_progress)
        previous_token = stored.resume_token if stored is not None and not in_progress else None

        if offset_exists and not take_snapshot and stored is not None:
            take_snapshot = self._check_offset(client, snapshotter, token_timestamp(stored.resume_token))
        snapshot_performed = snapshot_completed = False
        restarts = 0
        while True:
            if take_snapshot:
                snapshot_performed = True
                snapshot_completed = self._snapshot(client, dispatcher, snapshotter)
                if not snapshot_completed:
                    return self._summary(dispatcher, True, False, "stop", started)
                if not snapshotter.should_stream_events_starting_from_snapshot() and previous_token is not None:
                    dispatcher.offset.resume_token = previous_token
                    dispatcher.commit()
            if not snapshotter.should_stream():
                return self._summary(dispatcher, snapshot_performed, snapshot_completed, "snapshot_only", started)
            try:
                reason = self._stream(client, dispatcher, max_events, until_idle)
            except ConnectError as unreachable:
                # Debezium restarts a task that failed with a retriable error after
                # retriable.restart.connector.wait.ms, errors.max.retries times (-1: always).
                restarts += 1
                if 0 <= self.cfg.errors_max_retries < restarts:
                    raise
                log.warning("%s; restarting in %d ms", unreachable, self.cfg.retriable_restart_connector_wait_ms)
                if self._stop.wait(self.cfg.retriable_restart_connector_wait_ms / 1000):
                    return self._summary(dispatcher, snapshot_performed, snapshot_completed, "stop", started)
                take_snapshot = False
                continue
            except HistoryLostError as lost:
                if not snapshotter.should_snapshot_on_data_error():
                    raise HistoryLostError.for_offset(
                        lost.position, lost.oplog_first, self.cfg.snapshot_mode, self._offsets_description()
                    ) from lost
                dispatcher.offset = Offset()
                take_snapshot = True
                previous_token = None
                continue
            return self._summary(dispatcher, snapshot_performed, snapshot_completed, reason, started)

    def _offsets_description(self) -> str:
        path = getattr(self.offsets, "path", None)
        return f"offset file {path}" if path is not None else "the connector's offsets"

    def _check_offset(self, client: MongoClient[Any], snapshotter: Snapshotter, ts: Any) -> bool:
        """True when a new snapshot is needed because the stored position left the oplog."""
        lost, first = position_lost(client, ts)
        if not lost:
            return False
        if snapshotter.should_snapshot_on_data_error():
            return True
        raise HistoryLostError.for_offset(ts, first, self.cfg.snapshot_mode, self._offsets_description())

    def _summary(
        self, dispatcher: Dispatcher, performed: bool, completed: bool, reason: str, started: float
    ) -> RunSummary:
        return RunSummary(
            snapshot_performed=performed,
            snapshot_completed=completed,
            snapshot_documents=dispatcher.snapshot_documents,
            events=dispatcher.events,
            counts=dict(dispatcher.counts),
            records=dispatcher.records_written,
            first_position=dispatcher.first_position,
            last_position=dispatcher.last_position,
            stopped_because=reason,
            duration_s=time.monotonic() - started,
        )

    # -- snapshot -------------------------------------------------------------------------------------

    def _snapshot(self, client: MongoClient[Any], dispatcher: Dispatcher, snapshotter: Snapshotter) -> bool:
        """Copy the collections (resuming an interrupted snapshot); False when stopped."""
        if self.cfg.snapshot_delay_ms and self._stop.wait(self.cfg.snapshot_delay_ms / 1000):
            return False
        state = dispatcher.offset.snapshot
        if state is not None and state.running:
            lost, _ = position_lost(client, token_timestamp(state.start_token))
            if lost or state.start_position is None:
                state = None
        if state is None or not state.running:
            start = record_start(client, watch_target(client, self.cfg))
            state = SnapshotState(
                collections=snapshot_collections(client, self.cfg),
                start_position=start.position,
                start_token=start.token,
            )
        remaining = state.remaining
        totals = {ns: _estimate(client, self.cfg, ns) for ns in remaining}
        snap_metrics = self.metrics.snapshot
        snap_metrics.start(state.collections)
        snap_metrics.RemainingTableCount = len(remaining)
        snap_metrics.QueueTotalCapacity = snap_metrics.QueueRemainingCapacity = self.cfg.max_queue_size
        dispatcher.snapshot_started(state, totals)
        assert state.start_position is not None
        position = state.start_position

        def emit(chunk: SnapshotChunk) -> bool:
            if self._stop.is_set():
                return False
            dispatcher.snapshot_chunk(chunk, position, datetime.datetime.now(datetime.UTC))
            return True

        copier = SnapshotCopier(
            client,
            self.cfg,
            remaining,
            emit,
            threads=self.cfg.snapshot_max_threads,
            chunk_size=min(self.cfg.max_batch_size, 1024),
            stop=threading.Event(),
            progress=state,
        )
        threading.Thread(target=self._forward_stop, args=(copier.stop,), daemon=True).start()
        try:
            completed = copier.run()
        except BaseException:
            snap_metrics.finish(aborted=True)
            snapshotter.snapshot_aborted()
            raise
        finally:
            copier.stop.set()
        snap_metrics.finish(aborted=not completed)
        dispatcher.snapshot_finished(completed)
        if completed:
            snapshotter.snapshot_completed()
        else:
            snapshotter.snapshot_aborted()
        return completed

    def _forward_stop(self, target: threading.Event) -> None:
        """Propagate ``stop()`` to the snapshot workers until they are done."""
        while not target.is_set():
            if self._stop.wait(0.1):
                target.set()

    # -- streaming ------------------------------------------------------------------------------------

    def _stream(
        self, client: MongoClient[Any], dispatcher: Dispatcher, max_events: int | None, until_idle: float | None
    ) -> str:
        cfg = self.cfg
        streaming = self.metrics.streaming
        queue = EventQueue(cfg.max_queue_size, cfg.max_queue_size_in_bytes, streaming)
        streaming.CapturedTables = captured_collections(client, cfg)
        if dispatcher.offset.resume_token is None:
            # First start without a snapshot: pin "now" durably, so a restart misses nothing.
            dispatcher.start_at(record_start(client, watch_target(client, cfg)))
        token = dispatcher.offset.resume_token
        reader = ChangeStreamReader(client, cfg, StartPoint(resume_after=token), queue, metrics=streaming)
        if self.progress is not None:
            self.progress.streaming_started(dispatcher.offset.position)
        poll_s = cfg.poll_interval_ms / 1000
        dispatched_at_start = dispatcher.events
        last_event = time.monotonic()
        reason = "stop"
        failed = True
        notifications = NotificationService(cfg)
        adhoc = AdHocSnapshots(client, cfg, dispatcher, self.metrics, notifications, self._stop)
        dispatcher.on_signal = adhoc.on_signal
        dispatcher.on_stream_event = adhoc.on_stream_event
        reader.start()
        try:
            while not self._stop.is_set():
                batch = queue.get_batch(cfg.max_batch_size, poll_s)
                for item in batch:
                    if item.kind == "change":
                        assert item.doc is not None and item.token is not None
                        if dispatcher.change(item.doc, item.token):
                            last_event = time.monotonic()
                            if max_events is not None and dispatcher.events - dispatched_at_start >= max_events:
                                failed = False
                                return "max_events"
                    elif item.kind == "progress":
                        assert item.token is not None
                        dispatcher.progress_token(item.token)
                    elif item.kind == "end":
                        failed = False
                        return "end"
                    elif item.error is not None:
                        raise item.error
                adhoc.process()
                dispatcher.write(notifications.drain())
                dispatcher.drain()
                dispatcher.heartbeat_if_due()
                dispatcher.maybe_commit()
                if adhoc.busy:
                    last_event = time.monotonic()  # an incremental snapshot is running: not idle
                if until_idle is not None and time.monotonic() - last_event >= until_idle:
                    reason = "idle"
                    break
            failed = False
            return reason
        finally:
            reader.stop()
            queue.close()
            reader.join()
            adhoc.close()
            dispatcher.on_signal = dispatcher.on_stream_event = None
            dispatcher.write(notifications.drain())
            if failed:
                # Keep what was delivered; a failing sink raises again here, which must not hide
                # the original error (and then the offset is not saved, as it must not be).
                with contextlib.suppress(Exception):
                    dispatcher.commit()
            else:
                dispatcher.finish()


def _estimate(client: MongoClient[Any], cfg: Any, namespace: str) -> int | None:
    """Document count for progress totals (exact with a filter override, estimated otherwise)."""
    db, _, coll = namespace.partition(".")
    try:
        query = collection_filter(cfg, namespace)
        if query:
            return int(client[db][coll].count_documents(query))
        return int(client[db][coll].estimated_document_count())
    except CdcError:
        raise
    except Exception:  # a count is only for display; the copy itself reports real errors
        return None
