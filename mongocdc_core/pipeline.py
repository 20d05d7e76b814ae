"""One capture pipeline: connect → converter → dispatcher → source → sink, run to an explicit bound.

This is Debezium's ``ChangeEventSourceCoordinator`` wiring plus its ``ChangeEventSourceFactory``:
:class:`CapturePipeline` owns the connection and the one dispatcher (with its converter) of a run,
and runs sources into it — the snapshot copier (:meth:`CapturePipeline.copy`) and the change
stream (:meth:`CapturePipeline.stream`) — with a :class:`Bound`: forever, until a cluster time,
until N events, or until idle. ``Engine.run`` and every ``api`` function are thin callers of it.

Control flows one way: sources emit into the dispatcher through
:class:`~mongocdc_core.receiver.SnapshotReceiver` and never call back into the pipeline. Work
that runs next to streaming (ad hoc snapshots) is a :class:`StreamCompanion`: the pipeline feeds
it the events it dispatched and, when it asks for a blocking snapshot, pauses streaming, runs that
snapshot source (the same copier as the initial snapshot, its progress in the offsets), and
resumes. A blocking snapshot a previous run left unfinished runs before anything is streamed.

Whatever the bound, a stream that ends cleanly first checks that its position is still in the
oplog: a stop never hides a gap.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.dispatcher import Dispatcher
from mongocdc_core.events import EventConverter, EventOptions
from mongocdc_core.events.raw import RawChange, change_namespace, plain, say_if_python_path
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.offsets import Offset, OffsetStore, SnapshotState
from mongocdc_core.positions import Position, token_timestamp
from mongocdc_core.receiver import ConnectionState, ProgressListener, SnapshotChunk
from mongocdc_core.sinks.base import Sink, takes_landing_columns
from mongocdc_core.source.blocking import BlockingSnapshot
from mongocdc_core.source.connection import Topology, connect
from mongocdc_core.source.errors import CdcError, HistoryLostError
from mongocdc_core.source.oplog import position_lost
from mongocdc_core.source.snapshot import SnapshotCopier, collection_filter, estimate_count
from mongocdc_core.source.stream import ChangeStreamReader, EventQueue, StartPoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Bound:
    """When a stream stops (besides ``stop()``): the first of these that is reached.

    ``stop_at``: every event with a clusterTime up to and including it was dispatched (the
    stream scanned past it); ``max_events``: that many data events were dispatched;
    ``until_idle``: the server answered with nothing new for that many seconds while nothing was
    queued (time blocked on a ``getMore`` or on the sink is not idle). No field: forever.
    """

    stop_at: Timestamp | None = None
    max_events: int | None = None
    until_idle: float | None = None

    def __post_init__(self) -> None:
        if self.stop_at is not None and not isinstance(self.stop_at, Timestamp):
            raise CdcError(f"stop_at must be a bson.Timestamp, got {self.stop_at!r}")
        if self.max_events is not None and self.max_events < 1:
            raise CdcError(f"max_events must be a positive number of events, got {self.max_events}")
        if self.until_idle is not None and self.until_idle < 0:
            raise CdcError(f"until_idle must be a non-negative number of seconds, got {self.until_idle}")


@dataclass(frozen=True)
class StreamOutcome:
    """Why a stream ended (``max_events``, ``idle``, ``stop``, ``stop_at``, ``end``, ``done``) and
    the resume token of the end of a bounded window (None otherwise)."""

    reason: str
    end_token: dict[str, Any] | None = None


class StreamCompanion(Protocol):
    """Work running next to the stream on the pipeline's thread (ad hoc snapshots)."""

    @property
    def busy(self) -> bool:
        """Still working (a stream with a busy companion is not idle)."""

    @property
    def watching(self) -> bool:
        """Needs ``on_stream_event``/``on_stream_passed`` for every event (an incremental snapshot
        runs or has windows open); otherwise only signals reach it."""

    def on_signal(self, change: Mapping[str, Any], position: Position) -> None:
        """An event of the signaling collection was dispatched at ``position``."""

    def on_stream_event(self, namespace: str, document_key: Any, position: Position) -> bool:
        """A data event of ``namespace`` was dispatched at ``position``."""

    def on_stream_passed(self, upto: Timestamp, last: Position | None) -> None:
        """Every event with a clusterTime up to ``upto`` was dispatched (the last at ``last``), and none
        up to it will follow (read-only incremental snapshot windows close on it)."""

    def process(self) -> None:
        """Once per loop: act on queued signals, re-raise a worker's failure."""

    def take_blocking(self) -> BlockingSnapshot | None:
        """A blocking snapshot to run now, with streaming paused."""


class SnapshotListener(Protocol):
    """Who hears a snapshot's course besides the dispatcher: a blocking snapshot's notifications
    (:class:`~mongocdc_core.source.blocking.BlockingSnapshot`), the initial snapshot's snapshotter."""

    def started(self, state: SnapshotState) -> None:
        """The snapshot is announced and about to copy what ``state`` has left."""

    def on_chunk(self, chunk: SnapshotChunk) -> None:
        """A chunk was delivered."""

    def finished(self, completed: bool, position: Position | None) -> None:
        """The copy ended: completed, stopped (resumed by the next run) or failed."""


class CapturePipeline:
    """The wiring of one capture run; ``stop()`` (or the given ``stop`` event) ends it from any thread.

    Use as a context manager: it connects on entry (retrying with backoff) and closes the client
    on exit. :meth:`open_dispatcher` builds the converter and the dispatcher once per run.
    """

    def __init__(
        self,
        cfg: ConnectorConfig,
        sink: Sink,
        *,
        offsets: OffsetStore | None = None,
        metrics: ConnectorMetrics | None = None,
        progress: ProgressListener | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.cfg = cfg
        self.sink = sink
        self.offsets = offsets
        self.metrics = metrics or ConnectorMetrics(cfg.topic_prefix, cfg.custom_metric_tags)
        self.progress = progress
        self.stop_event = stop or threading.Event()
        self._client: MongoClient[Any] | None = None
        self.topology: Topology | None = None
        self._dispatcher: Dispatcher | None = None

    def __enter__(self) -> CapturePipeline:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stop(self) -> None:
        self.stop_event.set()

    # -- wiring ------------------------------------------------------------------------------------------

    def _on_retry(self, state: ConnectionState) -> None:
        """Show the connection state: to the progress listener, else in the log."""
        if self.progress is not None:
            self.progress.connecting(state)
        else:
            log.warning("%s", state.line())

    def connect(self) -> MongoClient[Any]:
        """(Re)connect, retrying with backoff and reporting each failed attempt; ``Stopped`` on stop."""
        self.close()
        self._client, self.topology = connect(self.cfg, self.metrics, self.stop_event, self._on_retry)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self.metrics.streaming.Connected = False

    @property
    def client(self) -> MongoClient[Any]:
        if self._client is None:
            raise CdcError("the capture pipeline is not connected")
        return self._client

    @property
    def connected(self) -> bool:
        return self._client is not None

    def open_dispatcher(self, offset: Offset, *, flush_interval_s: float = 60.0) -> Dispatcher:
        """The run's converter and dispatcher (built once; later calls return the same one)."""
        if self._dispatcher is None:
            rs = self.topology.set_name if self.topology is not None else None
            source = self.topology.source_name if self.topology is not None else ""
            converter = EventConverter(EventOptions.from_config(self.cfg, rs=source),
                                       landing=takes_landing_columns(self.sink))  # fmt: skip
            say_if_python_path()
            self._dispatcher = Dispatcher(
                self.cfg, converter, self.sink, self.offsets, self.metrics, offset,
                progress=self.progress, flush_interval_s=flush_interval_s, replica_set=rs,
            )
        return self._dispatcher

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            raise CdcError("the capture pipeline has no dispatcher yet (open_dispatcher)")
        return self._dispatcher

    # -- snapshot source ---------------------------------------------------------------------------------

    def snapshot(
        self,
        state: SnapshotState,
        *,
        threads: int,
        blocking: bool = False,
        totals: Mapping[str, int | None] | None = None,
        split_size: int | None = None,
        at_cluster_time: Timestamp | None = None,
        listener: SnapshotListener | None = None,
    ) -> bool:
        """Run one snapshot into the dispatcher; False when stopped. The one setup of every snapshot:
        the initial one, a blocking one (``blocking``: the offset's blocking slot, streaming paused)
        and each ``api`` call (a state of its own, never stored).

        It announces the snapshot (the offset, progress ``totals`` — by default each collection's
        estimated count — and Debezium's snapshot metrics), marks the collections copied whole for
        ``mongocdc.snapshot.delete.missing.keys``, copies what ``state`` has left with its start
        position (each collection with its query in ``state.filters``, else its filter override),
        and records the outcome. ``split_size`` and ``at_cluster_time`` are :meth:`copy`'s.
        """
        dispatcher, cfg = self.dispatcher, self.cfg
        position = state.start_position
        assert position is not None, "a snapshot's position is recorded before it starts"
        remaining = state.remaining
        filters = {ns: state.filters[ns] if ns in state.filters else collection_filter(cfg, ns) for ns in remaining}
        if totals is None:
            totals = {ns: estimate_count(self.client, cfg, ns, filters[ns]) for ns in remaining}
        snap_metrics = self.metrics.snapshot
        snap_metrics.start(state.collections)
        snap_metrics.RemainingTableCount = len(remaining)
        if blocking:
            dispatcher.blocking_started(state, totals)
        else:
            dispatcher.snapshot_started(state, totals)
        if cfg.mongocdc_snapshot_delete_missing_keys:
            dispatcher.begin_full_copies(_whole_copies(state, filters))
        if listener is not None:
            listener.started(state)
        completed = False
        try:
            completed = self.copy(
                remaining, position, threads=threads, filters=filters, progress=state, split_size=split_size,
                observe=listener.on_chunk if listener is not None else None, at_cluster_time=at_cluster_time,
            )
        finally:
            snap_metrics.finish(aborted=not completed)
            if listener is not None:
                listener.finished(completed, position)
        if blocking:
            dispatcher.blocking_finished(completed)
        else:
            dispatcher.snapshot_finished(completed)
        return completed

    def copy(
        self,
        namespaces: Sequence[str],
        position: Position,
        *,
        threads: int,
        filters: Mapping[str, dict[str, Any] | None] | None = None,
        progress: SnapshotState | None = None,
        split_size: int | None = None,
        observe: Callable[[SnapshotChunk], None] | None = None,
        at_cluster_time: Timestamp | None = None,
    ) -> bool:
        """Run the snapshot copier over ``namespaces`` into the dispatcher; False when stopped.

        ``progress`` (the offset's snapshot state) makes the copy resumable range by range;
        ``split_size`` overrides ``mongocdc.snapshot.split.size`` (0: copy as given, unsplit);
        ``observe`` sees each chunk after the dispatcher took it; ``at_cluster_time`` reads the
        collections as they were at that time (a snapshot read, refused once the server no longer
        holds it).
        """
        dispatcher = self.dispatcher

        def emit(chunk: SnapshotChunk) -> bool:
            if self.stop_event.is_set():
                return False
            dispatcher.snapshot_chunk(chunk, position, datetime.datetime.now(datetime.UTC))
            if observe is not None:
                observe(chunk)
            return True

        def prepare(chunk: SnapshotChunk) -> SnapshotChunk:
            return dispatcher.prepare_chunk(chunk, position, datetime.datetime.now(datetime.UTC))

        copier = SnapshotCopier(
            self.client, self.cfg, list(namespaces), emit, threads=threads,
            chunk_size=min(self.cfg.max_batch_size, 1024), filters=filters, stop=threading.Event(),
            progress=progress, split_size=split_size, prepare=prepare, at_cluster_time=at_cluster_time,
            connection=self.metrics,
        )
        forward = threading.Thread(target=_forward_stop, args=(self.stop_event, copier.stop), daemon=True)
        forward.start()
        try:
            return copier.run()
        finally:
            copier.stop.set()

    # -- streaming source --------------------------------------------------------------------------------

    def stream(
        self,
        start: StartPoint,
        bound: Bound,
        *,
        target: Any = None,
        pipeline: list[dict[str, Any]] | None = None,
        accept: Callable[[str], bool] | None = None,
        companion: StreamCompanion | None = None,
        done: Callable[[], bool] | None = None,
        window_end: Timestamp | None = None,
        housekeeping: Callable[[], None] | None = None,
    ) -> StreamOutcome:
        """Dispatch the change stream from ``start`` until ``bound``, ``done()`` or ``stop()``.

        ``accept(namespace)`` keeps only some namespaces' events; ``window_end`` ends a
        ``[start, end)`` window (exclusive, unlike ``bound.stop_at``); ``housekeeping`` runs once
        per loop (heartbeats, periodic commits, notifications). A clean end first checks that the
        stream's position is still in the oplog (``HistoryLostError`` otherwise). A failure
        keeps what was delivered (committed when the sink still flushes) and is re-raised.
        """
        cfg = self.cfg
        dispatcher = self.dispatcher
        streaming = self.metrics.streaming
        queue = EventQueue(cfg.max_queue_size, cfg.max_queue_size_in_bytes, streaming)
        stop_at, inclusive = (window_end, False) if window_end is not None else (bound.stop_at, True)
        reader = ChangeStreamReader(
            self.client, cfg, start, queue, metrics=self.metrics, stop_at=stop_at, stop_inclusive=inclusive,
            target=target, pipeline=pipeline, on_retry=self._on_retry,
            sharded=self.topology is not None and self.topology.kind == "sharded",
        )
        poll_s = cfg.poll_interval_ms / 1000
        counted_from = dispatcher.events
        frontier: Timestamp | None = None  # every event up to this clusterTime was dispatched
        last_activity = time.monotonic()
        end_token: dict[str, Any] | None = None
        reason = "stop"
        failed = True
        reader.start()
        try:
            if companion is not None:
                self._run_blocking(companion)  # one a previous run left unfinished: before any event
            while not self.stop_event.is_set():
                finished: str | None = None
                for item in queue.get_batch(cfg.max_batch_size, poll_s):
                    if item.kind == "changes":
                        assert item.changes is not None
                        for doc, token in item.changes:
                            watching = companion is not None and companion.watching
                            if watching and (passed := _passed_before(doc, token, dispatcher.last_position)):
                                assert companion is not None
                                frontier = passed  # unwatched events leave it behind: it only ever says too little
                                companion.on_stream_passed(frontier, dispatcher.last_position)
                            if self._dispatch(doc, token, accept, companion, watching):
                                last_activity = time.monotonic()
                                if bound.max_events is not None and dispatcher.events - counted_from >= bound.max_events:
                                    finished = "max_events"
                                    break
                            if companion is not None and self._run_blocking(companion):
                                last_activity = time.monotonic()
                                if self.stop_event.is_set():
                                    break  # stopped inside a blocking snapshot: nothing after its signal is dispatched
                        else:
                            continue
                        break  # the events after the break are not dispatched, nor what was queued after them
                    elif item.kind == "progress":
                        assert item.token is not None
                        dispatcher.progress_token(item.token)
                        scanned = token_timestamp(item.token)
                        if companion is not None and scanned is not None:
                            frontier = scanned  # the stream scanned everything up to it
                            companion.on_stream_passed(frontier, dispatcher.last_position)
                    elif item.kind == "end":
                        end_token = item.token
                        reached = window_end is None and bound.stop_at is not None and item.token is not None
                        finished = "stop_at" if reached else "end"
                        break
                    elif item.error is not None:
                        raise item.error
                if companion is not None and not self.stop_event.is_set():
                    companion.process()
                    if frontier is not None:  # windows whose reads finished after the stream passed them
                        companion.on_stream_passed(frontier, dispatcher.last_position)
                    self._run_blocking(companion)
                    if companion.busy:
                        last_activity = time.monotonic()  # an ad hoc snapshot is running: not idle
                if housekeeping is not None:
                    housekeeping()
                dispatcher.drain()
                if finished is None and done is not None and done():
                    finished = "done"
                if finished is None and bound.until_idle is not None and _idle(reader, queue, last_activity, bound.until_idle):
                    finished = "idle"
                if finished is not None:
                    reason = finished
                    break
            self._check_position(reader)
            failed = False
            return StreamOutcome(reason, end_token)
        finally:
            reader.stop()
            queue.close()
            reader.join()
            if failed:
                # Keep what was delivered; a failing sink raises again here, which must not hide
                # the original error (and then the offset is not saved, as it must not be).
                try:
                    dispatcher.commit()
                except Exception:  # noqa: BLE001 - the original error is being raised
                    log.debug("commit after a failed stream failed too", exc_info=True)

    def _dispatch(
        self,
        doc: Mapping[str, Any],
        token: dict[str, Any],
        accept: Callable[[str], bool] | None,
        companion: StreamCompanion | None,
        watching: bool,
    ) -> bool:
        """One change through the dispatcher, then to the companion (signals; every data event when it
        is ``watching``); True for a data event."""
        if accept is None and companion is None:
            return self.dispatcher.change(doc, token)
        db, coll = change_namespace(doc)
        if accept is not None and not accept(f"{db}.{coll}"):
            return False
        dispatcher = self.dispatcher
        produced = dispatcher.change(doc, token)
        if companion is None or (produced and not watching):
            return produced
        position = dispatcher.last_position
        assert position is not None
        if produced:  # a captured collection's event: never the signaling collection's
            companion.on_stream_event(f"{db}.{coll}", _key_id(doc), position)
        elif isinstance(db, str) and isinstance(coll, str) and self.cfg.is_signal_collection(db, coll):
            companion.on_signal(plain(doc), position)
        return produced

    def _run_blocking(self, companion: StreamCompanion) -> bool:
        """Run the blocking snapshots the companion asks for, streaming paused; True if any ran.

        Nothing is dispatched meanwhile (the reader's bounded queue fills and waits). The request
        and its range progress go into the offset (``Offset.blocking``) with the paused stream
        position, so a stopped or failed snapshot resumes with what is left on the next run.
        """
        ran = False
        while not self.stop_event.is_set() and (snapshot := companion.take_blocking()) is not None:
            ran = True
            self.dispatcher.drain()
            state = snapshot.prepare(self.client)
            self.snapshot(state, threads=self.cfg.snapshot_max_threads, blocking=True, listener=snapshot)
        return ran

    def _check_position(self, reader: ChangeStreamReader) -> None:
        """Before a clean stop: the stream's position must still be in the oplog (no silent gap)."""
        ts = reader.resume_position()
        try:
            lost, first = position_lost(self.client, ts)
        except PyMongoError as exc:  # unreachable at the very end: say so, the run itself is complete
            log.warning("could not check that position %s is still in the oplog: %s", ts, exc)
            return
        if lost:
            raise HistoryLostError(
                f"the stream's position {ts} left the oplog while the connector was reading (the oplog "
                f"now starts at {first}): changes in between were purged",
                position=ts,
                oplog_first=first,
            )


def _whole_copies(state: SnapshotState, filters: Mapping[str, dict[str, Any] | None]) -> list[str]:
    """Collections this snapshot copies whole, from their first document (whose missing keys it may delete)."""
    whole = []
    for namespace in state.remaining:
        if filters.get(namespace):
            continue  # a filtered copy does not say which documents exist
        if namespace in state.parts and namespace not in state.marks:
            log.info("snapshot of %s resumes a copy begun without mongocdc.snapshot.delete.missing.keys: "
                     "no deletes for keys it does not read", namespace)
            continue
        whole.append(namespace)
    return whole


def _key_id(change: Mapping[str, Any]) -> Any:
    """``documentKey._id`` of a change event (a raw one decodes only its ``documentKey``)."""
    if type(change) is RawChange:
        return change.key_id()
    key = change.get("documentKey")
    return key.get("_id") if isinstance(key, Mapping) else None


def _passed_before(doc: Mapping[str, Any], token: Mapping[str, Any], last: Position | None) -> Timestamp | None:
    """The clusterTime just before this change's, when it is the first of a new clusterTime (every
    event up to that one was dispatched then); None inside a clusterTime (a transaction)."""
    cluster_time = doc.cluster_time if type(doc) is RawChange else doc.get("clusterTime")
    ts = cluster_time if isinstance(cluster_time, Timestamp) else token_timestamp(token)
    if ts is None or (last is not None and (last.seconds, last.increment) >= (ts.time, ts.inc)):
        return None
    return Timestamp(ts.time, ts.inc - 1) if ts.inc else Timestamp(ts.time - 1, 0xFFFFFFFF)


def _idle(reader: ChangeStreamReader, queue: EventQueue, last_activity: float, until_idle: float) -> bool:
    """Idle: nothing queued, and the server kept answering "nothing new" for ``until_idle`` s.

    Measured between server replies, so time blocked on a ``getMore`` (no reply) or on the sink
    (events still queued) never counts.
    """
    if queue.pending():
        return False
    quiet_since, last_reply = reader.quiet_since, reader.last_reply
    if quiet_since is None or last_reply is None:
        return False
    return last_reply - max(quiet_since, last_activity) >= until_idle


def _forward_stop(source: threading.Event, target: threading.Event) -> None:
    """Propagate a pipeline stop to a copier's workers until the copy is over."""
    while not target.is_set():
        if source.wait(0.1):
            target.set()

