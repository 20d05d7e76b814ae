"""The coordinator's policy: snapshot per ``snapshot.mode``, then stream, until told to stop.

This is Debezium's ChangeEventSourceCoordinator: it reads the stored offset, asks the
snapshotter whether to copy the data, checks that a stored position is still in the oplog
(never a silent gap), runs the snapshot source and then the streaming source through one
:class:`~mongocdc_core.pipeline.CapturePipeline`, and restarts after retriable errors as Kafka
Connect restarts a task (``errors.max.retries`` restarts, ``retriable.restart.connector.wait.ms``
apart, each reconnecting with the ``connect.backoff.*`` delays).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from pymongo.errors import PyMongoError

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.dispatcher import Dispatcher
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.notifications import NotificationService
from mongocdc_core.offsets import Offset, OffsetStore, SnapshotState
from mongocdc_core.pipeline import Bound, CapturePipeline
from mongocdc_core.positions import Position, token_timestamp
from mongocdc_core.receiver import ProgressListener, SnapshotChunk
from mongocdc_core.sinks.base import KeyReader, Sink
from mongocdc_core.source.blocking import AdHocSnapshots
from mongocdc_core.source.connection import is_retriable, one_line, refused
from mongocdc_core.source.errors import CdcError, ConnectError, HistoryLostError, OffsetInvalidError, Stopped
from mongocdc_core.source.oplog import position_lost
from mongocdc_core.source.snapshot import (
    Snapshotter,
    captured_collections,
    load_snapshotter,
    record_start,
    snapshot_collections,
)
from mongocdc_core.source.stream import StartPoint, watch_target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSummary:
    """What one ``Engine.run`` did.

    ``stopped_because``: max_events, idle, stop_at, stop, snapshot_only (the mode does not stream;
    ``snapshot_performed`` False: its snapshot had completed before), end (the stream was invalidated).
    """

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
        cfg: ConnectorConfig,
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
        self.metrics = ConnectorMetrics(cfg.topic_prefix, cfg.custom_metric_tags)
        self.metrics_file = metrics_file or cfg.mongocdc_metrics_file
        self._stop = threading.Event()
        self.flush_interval_s = cfg.offset_flush_interval_ms / 1000

    def stop(self) -> None:
        """Ask a running ``run`` to finish: it flushes the sink and records the offset, then returns."""
        self._stop.set()

    # -- run ------------------------------------------------------------------------------------------

    def run(
        self, max_events: int | None = None, until_idle: float | None = None, stop_at: Timestamp | None = None
    ) -> RunSummary:
        """Snapshot (per ``snapshot.mode``) then stream until ``max_events`` change events were
        dispatched, the stream passed cluster time ``stop_at`` (every event up to it delivered), it
        was idle for ``until_idle`` seconds, or ``stop()``."""
        if self.cfg.mongocdc_snapshot_delete_missing_keys and not isinstance(self.sink, KeyReader):
            raise CdcError(
                "mongocdc.snapshot.delete.missing.keys=true needs a sink that can read its records back "
                f"(jsonl, parquet or kafka), not {type(self.sink).__name__}"
            )
        bound = Bound(stop_at=stop_at, max_events=max_events, until_idle=until_idle)
        started = time.monotonic()
        if self.metrics_file:
            self.metrics.start_file_writer(self.metrics_file)
        pipeline = CapturePipeline(
            self.cfg, self.sink, offsets=self.offsets, metrics=self.metrics, progress=self.progress, stop=self._stop
        )
        try:
            return _Run(self, pipeline, bound, started).execute()
        finally:
            pipeline.close()
            if self.metrics_file:
                self.metrics.stop_file_writer(self.metrics_file)

    def offsets_description(self) -> str:
        """How the user finds the stored offsets (for recovery messages)."""
        description = getattr(self.offsets, "description", None)
        if isinstance(description, str):
            return description
        path = getattr(self.offsets, "path", None)
        return f"offset file {path}" if path is not None else "the connector's offsets"


class _Run:
    """One ``Engine.run``: the phases (snapshot, stream) and the restarts between them."""

    def __init__(self, engine: Engine, pipeline: CapturePipeline, bound: Bound, started: float) -> None:
        self.engine = engine
        self.cfg = engine.cfg
        self.pipeline = pipeline
        self.bound = bound
        self.started = started
        self.snapshotter: Snapshotter = load_snapshotter(engine.cfg)
        self.dispatcher: Dispatcher | None = None
        self.stored: Offset | None = None
        self.phase = "start"  # start -> snapshot -> stream
        self.previous_token: dict[str, Any] | None = None
        self.performed = self.completed = False

    def execute(self) -> RunSummary:
        """Run the phases; restart after retriable errors as ``errors.max.retries`` allows."""
        restarts = 0
        while True:
            try:
                return self._phases()
            except Stopped:
                return self._summary("stop")
            except (ConnectError, PyMongoError) as exc:
                if isinstance(exc, PyMongoError) and not is_retriable(exc):
                    failure = refused(exc, "capturing", self.cfg.mongodb_user)
                    if failure is not None:
                        raise failure from exc
                    raise
                # Kafka Connect restarts a task that failed with a retriable error after
                # retriable.restart.connector.wait.ms, errors.max.retries times (-1: always).
                restarts += 1
                limit = self.cfg.errors_max_retries
                if 0 <= limit < restarts:
                    if isinstance(exc, ConnectError):
                        raise
                    raise ConnectError(
                        f"MongoDB unreachable and errors.max.retries={limit} restarts used up: {one_line(exc)}"
                    ) from exc
                wait_ms = self.cfg.retriable_restart_connector_wait_ms
                of = "unlimited" if limit < 0 else str(limit)
                log.warning("%s; restart %d of %s in %d ms", one_line(exc), restarts, of, wait_ms)
                self.pipeline.close()
                if self.engine._stop.wait(wait_ms / 1000):
                    return self._summary("stop")

    def _phases(self) -> RunSummary:
        if not self.pipeline.connected:
            self.pipeline.connect()
        if self.dispatcher is None:
            self.stored = self.engine.offsets.load()
            self.dispatcher = self.pipeline.open_dispatcher(
                self.stored or Offset(), flush_interval_s=self.engine.flush_interval_s
            )
        if self.phase == "start":
            self.phase = self._decide()
            if self.phase == "complete":
                log.info("snapshot.mode=%s: the snapshot is complete, nothing to do", self.cfg.snapshot_mode)
                return self._summary("snapshot_only")
        while True:
            if self.phase == "snapshot":
                self.performed = True
                self.completed = self._snapshot()
                if not self.completed:
                    return self._summary("stop")
                if not self.snapshotter.should_stream_events_starting_from_snapshot() and self.previous_token:
                    self.dispatcher.offset.resume_token = dict(self.previous_token)
                    self.dispatcher.commit()
                self.phase = "stream"
            if not self.snapshotter.should_stream():
                return self._summary("snapshot_only")
            try:
                return self._summary(self._stream())
            except HistoryLostError as lost:
                if not self.snapshotter.should_snapshot_on_data_error():
                    raise HistoryLostError.for_offset(
                        lost.position, lost.oplog_first, self.cfg.snapshot_mode, self.engine.offsets_description()
                    ) from lost
                log.warning("%s; snapshot.mode=when_needed takes a new snapshot", lost)
                self.dispatcher.offset = Offset()
                self.previous_token = None
                self.phase = "snapshot"

    def _decide(self) -> str:
        """The first phase from the stored offset and the snapshotter (``complete``: nothing to do)."""
        if self.stored is not None:
            self._check_offset_source(self.stored)
        stored = self.stored
        offset_exists = stored is not None and (stored.resume_token is not None or stored.snapshot is not None)
        in_progress = stored is not None and stored.snapshot_in_progress
        take = self.snapshotter.should_snapshot_data(offset_exists, in_progress)
        self.previous_token = dict(stored.resume_token) if stored is not None and stored.resume_token and not in_progress else None
        if take:
            return "snapshot"
        if offset_exists and not self.snapshotter.should_stream():
            return "complete"  # e.g. initial_only after its snapshot completed: its position does not matter
        if offset_exists and stored is not None and self._offset_lost(token_timestamp(stored.resume_token)):
            return "snapshot"
        return "stream"

    def _check_offset_source(self, stored: Offset) -> None:
        """``mongodb.allow.offset.invalidation``: offsets recorded for another replica set."""
        recorded = stored.replica_set
        current = self.pipeline.topology.set_name if self.pipeline.topology is not None else None
        if recorded is None or current is None or recorded == current:
            return
        if not self.cfg.mongodb_allow_offset_invalidation:
            raise OffsetInvalidError(
                f"the stored offsets ({self.engine.offsets_description()}) were recorded for replica set "
                f"{recorded!r}, but mongodb.connection.string now reaches replica set {current!r}. Resuming "
                "there could skip or repeat changes. Set mongodb.allow.offset.invalidation=true to invalidate "
                "those offsets and take a new snapshot, or point the connector back at the original deployment."
            )
        log.warning(
            "stored offsets belong to replica set %r, not %r: invalidated (mongodb.allow.offset.invalidation)",
            recorded, current,
        )
        assert self.dispatcher is not None
        self.dispatcher.offset = Offset()
        self.stored = None

    def _offset_lost(self, ts: Timestamp | None) -> bool:
        """True when a new snapshot is needed because the stored position left the oplog."""
        lost, first = position_lost(self.pipeline.client, ts)
        if not lost:
            return False
        if self.snapshotter.should_snapshot_on_data_error():
            return True
        raise HistoryLostError.for_offset(ts, first, self.cfg.snapshot_mode, self.engine.offsets_description())

    def _summary(self, reason: str) -> RunSummary:
        dispatcher = self.dispatcher
        return RunSummary(
            snapshot_performed=self.performed,
            snapshot_completed=self.completed,
            snapshot_documents=dispatcher.snapshot_documents if dispatcher else 0,
            events=dispatcher.events if dispatcher else 0,
            counts=dict(dispatcher.counts) if dispatcher else {"c": 0, "u": 0, "d": 0},
            records=dispatcher.records_written if dispatcher else 0,
            first_position=dispatcher.first_position if dispatcher else None,
            last_position=dispatcher.last_position if dispatcher else None,
            stopped_because=reason,
            duration_s=time.monotonic() - self.started,
        )

    # -- snapshot -------------------------------------------------------------------------------------

    def _snapshot(self) -> bool:
        """Copy the collections (resuming an interrupted snapshot); False when stopped."""
        cfg, client, dispatcher = self.cfg, self.pipeline.client, self.dispatcher
        assert dispatcher is not None
        if cfg.snapshot_delay_ms and self.engine._stop.wait(cfg.snapshot_delay_ms / 1000):
            return False
        state = dispatcher.offset.snapshot
        if state is not None and state.running:
            lost, _ = position_lost(client, token_timestamp(state.start_token))
            if lost or state.start_position is None:
                state = None
        if state is None or not state.running:
            start = record_start(client, watch_target(client, cfg))
            state = SnapshotState(
                collections=snapshot_collections(client, cfg),
                start_position=start.position,
                start_token=start.token,
            )
        snap_metrics = self.engine.metrics.snapshot
        snap_metrics.QueueTotalCapacity = snap_metrics.QueueRemainingCapacity = cfg.max_queue_size
        return self.pipeline.snapshot(state, threads=cfg.snapshot_max_threads, listener=_SnapshotterReport(self.snapshotter))

    # -- streaming ------------------------------------------------------------------------------------

    def _stream(self) -> str:
        cfg, client, dispatcher = self.cfg, self.pipeline.client, self.dispatcher
        assert dispatcher is not None
        self.engine.metrics.streaming.CapturedTables = captured_collections(client, cfg)
        if dispatcher.offset.resume_token is None:
            # First start without a snapshot: pin "now" durably, so a restart misses nothing.
            dispatcher.start_at(record_start(client, watch_target(client, cfg)))
        notifications = NotificationService(cfg)
        adhoc = AdHocSnapshots(
            client, cfg, dispatcher, self.engine.metrics, notifications,
            stored_incremental=dispatcher.offset.incremental, stored_blocking=dispatcher.offset.blocking,
        )
        # Reported once the signal channels are open: the Kafka channel starts at the topic's end as it
        # opens, so a signal sent after "streaming started" is always read.
        if self.engine.progress is not None:
            self.engine.progress.streaming_started(dispatcher.offset.position)

        def housekeeping() -> None:
            dispatcher.write(notifications.drain())
            dispatcher.heartbeat_if_due()
            dispatcher.maybe_commit()

        try:
            outcome = self.pipeline.stream(
                StartPoint(resume_after=dispatcher.offset.resume_token), self.bound,
                companion=adhoc, housekeeping=housekeeping,
            )
        finally:
            adhoc.close()
            dispatcher.write(notifications.drain())
        dispatcher.finish()
        return outcome.reason


class _SnapshotterReport:
    """Tells the snapshotter how the initial snapshot ended (Debezium's ``snapshotCompleted``/``snapshotAborted``)."""

    def __init__(self, snapshotter: Snapshotter) -> None:
        self.snapshotter = snapshotter

    def started(self, state: SnapshotState) -> None:
        """The snapshotter is not told of the start."""

    def on_chunk(self, chunk: SnapshotChunk) -> None:
        """Nor of each chunk."""

    def finished(self, completed: bool, position: Position | None) -> None:
        if completed:
            self.snapshotter.snapshot_completed()
        else:
            self.snapshotter.snapshot_aborted()
