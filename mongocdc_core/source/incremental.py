"""Incremental snapshots: chunked reads de-duplicated against the stream with watermarks (DBLog).

For every chunk a worker thread writes an *open* watermark into the signaling collection, reads
the next ``incremental.snapshot.chunk.size`` documents in ``_id`` order into a buffer, and closes
the window (``insert_insert``: a second *close* document; ``insert_delete``: deleting the open
one). The dispatcher sees both watermarks in the change stream, in order with the data changes:
every streamed event between them whose key is in the buffer supersedes (drops) the buffered
read; when the close arrives the remaining reads are emitted as ``op: r`` with
``source.snapshot = "incremental"`` at the close watermark's position. Streaming never waits for
the reads and the reads never wait for streaming, except that a worker starts its next chunk only
after the dispatcher emitted the previous one (that bounds the memory to one chunk per worker).

``read_only`` writes nothing to the source (a secondary, a user with read-only privileges): the
watermarks are cluster times instead of documents. The low watermark is the ``operationTime`` of
a ``ping`` sent just before the chunk's read (everything up to it is visible to the read), the
high watermark the ``operationTime`` of the read itself (nothing the read saw is after it). The
window is registered before the low watermark is taken, so every streamed event of the collection
is seen; events after the low watermark whose key is in the buffer drop the read, exactly as
between written watermarks; the window closes when the change stream has passed the high
watermark (the pipeline reports it, :meth:`IncrementalSnapshotter.on_stream_passed`) and the
reads take a position right after every event dispatched so far. Signals then come through the
Kafka or file channel (or the source channel, which only reads).

Chunks follow MongoDB's own ``_id`` order across BSON types (see :func:`read_chunk`): the
index-friendly ``{_id: {$gt: last}}`` within ``last``'s type bracket, and an aggregation
comparison (no type bracketing) to continue into the brackets after it. A collection's snapshot
ends at a short chunk or at the largest ``_id`` it had when its snapshot started, so a collection
that keeps growing still finishes; later inserts come from the stream.

Progress (collections left, last key of the last emitted chunk, rows) is part of the
connector's offset (``Offset.incremental``) and is saved together with the resume token after the
chunk's reads were flushed, so a restarted connector continues with the next chunk.
"""

from __future__ import annotations

import datetime
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from bson import Code, Decimal128, MaxKey, MinKey, ObjectId, Regex, Timestamp, json_util
from bson.codec_options import DatetimeConversion
from bson.datetime_ms import DatetimeMS
from pymongo import MongoClient
from pymongo.client_session import ClientSession
from pymongo.collection import Collection

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.metrics import ConnectorMetrics, SnapshotMetrics
from mongocdc_core.positions import Position
from mongocdc_core.receiver import ProgressListener, SnapshotChunk, SnapshotReceiver
from mongocdc_core.source.errors import CdcError
from mongocdc_core.source.signals import WATERMARK_CLOSE, WATERMARK_OPEN, LogNotifier, Notifier

log = logging.getLogger("mongocdc.incremental")

AGGREGATE = "Incremental Snapshot"
MARKER = "incremental"
READ_ONLY = "read_only"  # incremental.snapshot.watermarking.strategy: cluster times, nothing written
_CANONICAL = json_util.CANONICAL_JSON_OPTIONS.with_options(datetime_conversion=DatetimeConversion.DATETIME_AUTO)


def key_identity(value: Any) -> str:
    """A hashable identity of an ``_id`` value of any BSON type (the same for reads and events)."""
    return json_util.dumps({"_id": value}, json_options=_CANONICAL)


def bson_bracket(value: Any) -> int | None:
    """MongoDB's canonical type order of an ``_id`` value (None: let the server compare it).

    Query comparisons (``$gt``) only match values of the same bracket; aggregation comparisons
    compare across brackets in this order.
    """
    if value is None:
        return 1
    if isinstance(value, (Code, Regex, MinKey, MaxKey)):
        return None
    if isinstance(value, bool):
        return 8
    if isinstance(value, (int, float, Decimal128)):
        return 2
    if isinstance(value, str):
        return 3
    if isinstance(value, Mapping):
        return 4
    if isinstance(value, (bytes, uuid.UUID)):
        return 6
    if isinstance(value, ObjectId):
        return 7
    if isinstance(value, (datetime.datetime, DatetimeMS)):
        return 9
    if isinstance(value, Timestamp):
        return 10
    return None


def _ordering(value: Any) -> Any:
    """A Python value ordered like MongoDB orders ``value`` within its bracket, or None."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, Decimal128)):
        number = value.to_decimal() if isinstance(value, Decimal128) else value
        return None if number != number else number  # NaN: leave it to the server
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, ObjectId):
        return value.binary
    if isinstance(value, (datetime.datetime, DatetimeMS)):
        return int(DatetimeMS(value)) if isinstance(value, datetime.datetime) else int(value)
    if isinstance(value, Timestamp):
        return (value.time, value.inc)
    return None


def past_maximum(key: Any, maximum: Any) -> bool:
    """True when ``key`` is known to sort at or after ``maximum`` (unknown: False, keep reading)."""
    if key_identity(key) == key_identity(maximum):
        return True
    left, right = bson_bracket(key), bson_bracket(maximum)
    if left is None or right is None:
        return False
    if left != right:
        return left > right
    a, b = _ordering(key), _ordering(maximum)
    return a is not None and b is not None and bool(a > b)


def _and(bound: dict[str, Any], condition: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"$and": [bound, dict(condition)]} if condition else bound


def read_chunk(
    collection: Collection[Any],
    last: tuple[Any] | None,
    condition: Mapping[str, Any] | None,
    size: int,
    session: ClientSession | None = None,
) -> list[dict[str, Any]]:
    """The next ``size`` documents after ``last`` (a 1-tuple; None: from the start) in ``_id`` order.

    ``{_id: {$gt: last}}`` uses the ``_id`` index but only matches ``last``'s type bracket, which is a
    correct prefix of the answer; when it comes back short, the rest comes from the brackets after
    it with an aggregation comparison (no type bracketing; ``$literal`` keeps a key such as ``"$x"``
    from being read as a field path). Keys MongoDB brackets specially (MinKey, MaxKey, code,
    regex) always use the aggregation comparison.
    """

    def find(query: dict[str, Any], limit: int) -> list[dict[str, Any]]:
        return list(collection.find(query, session=session).sort("_id", 1).limit(limit))

    if last is None:
        return find(dict(condition) if condition else {}, size)
    key = last[0]
    documents: list[dict[str, Any]] = []
    if bson_bracket(key) is not None:
        documents = find(_and({"_id": {"$gt": key}}, condition), size)
        if len(documents) == size:
            return documents
        key = documents[-1]["_id"] if documents else key
    after = {"$expr": {"$gt": ["$_id", {"$literal": key}]}}
    return documents + find(_and(after, condition), size - len(documents))


# -- what the snapshotter needs from its host ------------------------------------------------------------


class SnapshotOutput(Protocol):
    """Where emitted reads and progress go (the dispatcher, on its own thread)."""

    def emit_reads(
        self, namespace: str, documents: Sequence[Mapping[str, Any]], position: Position, asked: int | None,
    ) -> None:
        """Write ``r`` records (marker ``incremental``) for ``documents`` at ``position`` (``asked``:
        :attr:`SnapshotChunk.asked`)."""

    def save_progress(self, state: dict[str, Any] | None) -> None:
        """Record the progress; it becomes durable with the next offset commit (after the sink flush)."""


class ReceiverOutput:
    """:class:`SnapshotOutput` for the connector: reads and progress (the offset's ``incremental``)."""

    def __init__(self, receiver: SnapshotReceiver) -> None:
        self.receiver = receiver

    def emit_reads(
        self, namespace: str, documents: Sequence[Mapping[str, Any]], position: Position, asked: int | None,
    ) -> None:
        docs = [dict(d) for d in documents]
        chunk = SnapshotChunk(namespace, docs, [MARKER] * len(docs), final=False, asked=asked)
        self.receiver.snapshot_chunk(chunk, position, datetime.datetime.now(datetime.UTC))

    def save_progress(self, state: dict[str, Any] | None) -> None:
        self.receiver.set_incremental(state)


# -- state -----------------------------------------------------------------------------------------------


@dataclass
class IncrementalState:
    """Progress of one incremental snapshot; JSON form lives in ``Offset.incremental``.

    ``last_keys[ns]`` / ``max_keys[ns]`` are 1-tuples (a key may itself be null); a collection
    without an entry in ``last_keys`` has not emitted a chunk yet.
    """

    id: str
    collections: list[str]
    filters: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_keys: dict[str, tuple[Any]] = field(default_factory=dict)
    max_keys: dict[str, tuple[Any] | None] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    completed: list[str] = field(default_factory=list)
    paused: bool = False

    @property
    def remaining(self) -> list[str]:
        done = set(self.completed)
        return [ns for ns in self.collections if ns not in done]

    def to_json(self) -> dict[str, Any]:
        """Extended-JSON text for BSON values so keys of every type survive exactly."""
        return {
            "id": self.id,
            "collections": list(self.collections),
            "completed": list(self.completed),
            "filters": {ns: json_util.dumps(q, json_options=_CANONICAL) for ns, q in self.filters.items()},
            "last_keys": {ns: json_util.dumps({"k": k[0]}, json_options=_CANONICAL) for ns, k in self.last_keys.items()},
            "max_keys": {
                ns: None if k is None else json_util.dumps({"k": k[0]}, json_options=_CANONICAL)
                for ns, k in self.max_keys.items()
            },
            "rows": dict(self.rows),
            "paused": self.paused,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IncrementalState:
        def key(text: str | None) -> tuple[Any] | None:
            return None if text is None else (json_util.loads(text, json_options=_CANONICAL)["k"],)

        try:
            return cls(
                id=str(data["id"]),
                collections=list(data["collections"]),
                completed=list(data.get("completed", [])),
                filters={ns: json_util.loads(q, json_options=_CANONICAL) for ns, q in data.get("filters", {}).items()},
                last_keys={ns: (json_util.loads(t, json_options=_CANONICAL)["k"],) for ns, t in data.get("last_keys", {}).items()},
                max_keys={ns: key(t) for ns, t in data.get("max_keys", {}).items()},
                rows={ns: int(n) for ns, n in data.get("rows", {}).items()},
                paused=bool(data.get("paused", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CdcError(f"stored incremental snapshot progress is not readable ({exc!r}): {dict(data)!r}") from exc


@dataclass
class _Window:
    """One chunk between its watermarks.

    ``touched``: keys streamed while the window was open, with the clusterTime of their latest
    event; ``low``/``high``: the cluster-time watermarks of a ``read_only`` window (events up to
    ``low`` are reflected in the read and do not drop it).
    """

    id: str
    namespace: str
    chunk_size: int
    opened: bool = False
    buffer: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_key: tuple[Any] | None = None
    touched: dict[str, tuple[int, int]] = field(default_factory=dict)
    low: Timestamp | None = None
    high: Timestamp | None = None
    done: bool = False  # the collection ends with this chunk
    asked: int | None = None  # ConnectorMetrics.losses before the chunk was read (SnapshotChunk.asked)
    read_done: threading.Event = field(default_factory=threading.Event)
    emitted: threading.Event = field(default_factory=threading.Event)
    discarded: bool = False


class IncrementalSnapshotter:
    """Runs incremental snapshots next to streaming; the dispatcher feeds it through two hooks.

    Dispatcher thread: :meth:`on_stream_event` for every data change of a captured collection,
    :meth:`on_signal_event` for every insert/delete in the signaling collection,
    :meth:`on_stream_passed` when the stream's position moved (closes ``read_only`` windows),
    :meth:`poll` once per loop (re-raises a worker's failure). Signals (any thread via the
    :class:`~mongocdc_core.source.signals.SignalProcessor`): :meth:`start`, :meth:`stop`,
    :meth:`pause`, :meth:`resume`. Up to ``snapshot.max.threads`` collections are read at once.
    """

    def __init__(
        self,
        client: MongoClient[Any],
        cfg: ConnectorConfig,
        output: SnapshotOutput,
        *,
        notifier: Notifier | None = None,
        metrics: SnapshotMetrics | None = None,
        connection: ConnectorMetrics | None = None,
        state: IncrementalState | None = None,
        progress: ProgressListener | None = None,
    ) -> None:
        self.strategy = cfg.incremental_snapshot_watermarking_strategy
        if not cfg.signal_data_collection and self.strategy != READ_ONLY:
            raise CdcError(
                "incremental snapshots need signal.data.collection (the watermarks are written there), or "
                "incremental.snapshot.watermarking.strategy=read_only"
            )
        self.client = client
        self.cfg = cfg
        self.output = output
        self.notifier = notifier or LogNotifier(cfg.topic_prefix)
        self.metrics = metrics
        self.connection = connection  # its losses tag each chunk's read (SnapshotChunk.asked)
        self.progress = progress
        self.chunk_size = int(cfg.incremental_snapshot_chunk_size)
        db, _, coll = (cfg.signal_data_collection or "").partition(".")
        self.signals = client[db][coll] if self.strategy != READ_ONLY else None
        self.state: IncrementalState | None = state
        self._lock = threading.RLock()
        self._windows: dict[str, _Window] = {}
        self._workers: list[threading.Thread] = []
        self._claimed: set[str] = set()
        self._stopped: set[str] = set()
        self._halt = threading.Event()  # engine shutdown or stop-snapshot: workers end, progress kept
        self._resume = threading.Event()
        self._errors: list[BaseException] = []
        self._paused_at: float | None = None
        self.finished = threading.Event()
        if state is not None and state.remaining:
            if state.paused:
                self._paused_at = time.monotonic()
            else:
                self._resume.set()
            self._begin(resumed=True)
        else:
            self.state = None
            self.finished.set()

    # -- control (signals) ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.state is not None and not self.finished.is_set()

    @property
    def watching(self) -> bool:
        """The stream's events must be reported one by one: a snapshot runs or a window is open."""
        return self.running or bool(self._windows)

    def collections(self) -> list[str]:
        """Collections of the running snapshot not finished yet."""
        with self._lock:
            return self.state.remaining if self.state is not None else []

    def start(self, signal_id: str, namespaces: Sequence[str], filters: Mapping[str, dict[str, Any]]) -> None:
        """Add collections to the running snapshot, or start a new one."""
        with self._lock:
            if self.running and self.state is not None:
                added = [ns for ns in namespaces if ns not in self.state.remaining]
                for ns in added:
                    if ns in self.state.completed:
                        self.state.completed.remove(ns)
                        for table in (self.state.last_keys, self.state.max_keys, self.state.rows):
                            table.pop(ns, None)
                    if ns not in self.state.collections:
                        self.state.collections.append(ns)
                    self._stopped.discard(ns)
                    self._claimed.discard(ns)
                self.state.filters.update({ns: dict(q) for ns, q in filters.items() if ns in added})
                if self.metrics is not None:
                    self.metrics.TotalTableCount += len(added)
                    self.metrics.RemainingTableCount += len(added)
                self._spawn()
                self._notify("STARTED", {"data_collections": ",".join(added)})
                return
            self.state = IncrementalState(signal_id, list(namespaces), {ns: dict(q) for ns, q in filters.items()})
            self._stopped.clear()
            self._claimed.clear()
            self._halt = threading.Event()
            self._resume.set()
            self._paused_at = None
            self.finished.clear()
            self._begin(resumed=False)

    def _begin(self, *, resumed: bool) -> None:
        assert self.state is not None
        if self.metrics is not None:
            self.metrics.start(self.state.collections)
            self.metrics.RemainingTableCount = len(self.state.remaining)
            self.metrics.SnapshotPaused = self.state.paused
        if self.progress is not None:
            self.progress.snapshot_started(dict.fromkeys(self.state.remaining))
        self._notify("STARTED", {"data_collections": ",".join(self.state.remaining),
                                 **({"resumed": "true"} if resumed else {})})
        self.output.save_progress(self.state.to_json())
        self._spawn()

    def stop(self, namespaces: Sequence[str] | None) -> list[str]:
        """Stop the whole snapshot (None) or drop some collections from it; returns what was stopped."""
        with self._lock:
            if not self.running or self.state is None:
                return []
            targets = self.state.remaining if namespaces is None else [ns for ns in namespaces if ns in self.state.remaining]
            if not targets:
                return []
            self._stopped.update(targets)
            self.state.collections = [ns for ns in self.state.collections if ns not in targets]
            for table in (self.state.last_keys, self.state.max_keys, self.state.rows, self.state.filters):
                for ns in targets:
                    table.pop(ns, None)
            for window in self._windows.values():
                if window.namespace in targets:
                    window.discarded = True
                    window.emitted.set()
            if self.metrics is not None:
                self.metrics.RemainingTableCount = max(0, self.metrics.RemainingTableCount - len(targets))
            if self.state.remaining:
                self._notify("ABORTED", {"data_collections": ",".join(targets)})
                self.output.save_progress(self.state.to_json())
            else:
                self._finish(aborted=True)
            return targets

    def pause(self) -> bool:
        """Hold the workers before their next chunk (the open window still completes)."""
        with self._lock:
            if not self.running or self.state is None or self.state.paused:
                return False
            self.state.paused = True
            self._resume.clear()
            self._paused_at = time.monotonic()
            if self.metrics is not None:
                self.metrics.SnapshotPaused = True
            self.output.save_progress(self.state.to_json())
            self._notify("PAUSED", {})
            return True

    def resume(self) -> bool:
        with self._lock:
            if not self.running or self.state is None or not self.state.paused:
                return False
            self.state.paused = False
            if self.metrics is not None:
                self.metrics.SnapshotPaused = False
                if self._paused_at is not None:
                    self.metrics.SnapshotPausedDurationInSeconds += int(time.monotonic() - self._paused_at)
            self._paused_at = None
            self._resume.set()
            self.output.save_progress(self.state.to_json())
            self._notify("RESUMED", {})
            return True

    def shutdown(self) -> None:
        """Engine stopping: end the workers, keep the progress (the next run continues)."""
        self._halt.set()
        self._resume.set()
        with self._lock:
            for window in self._windows.values():
                window.emitted.set()
            workers = list(self._workers)
        for worker in workers:
            worker.join(timeout=10)

    # -- dispatcher hooks ------------------------------------------------------------------------------

    def on_stream_event(self, namespace: str, document_key: Any, position: Position) -> bool:
        """A streamed data change of ``namespace``; True when it superseded a read of an open window."""
        if not self._windows:
            return False
        identity = key_identity(document_key)
        at = (position.seconds, position.increment)
        hit = False
        with self._lock:
            for window in self._windows.values():
                if window.opened and window.namespace == namespace:
                    window.touched[identity] = at
                    hit = hit or identity in window.buffer
        return hit

    def on_stream_passed(self, upto: Timestamp, last: Position | None) -> None:
        """Every event up to clusterTime ``upto`` was dispatched, the last at ``last``: close the
        ``read_only`` windows whose high watermark the stream has passed."""
        if not self._windows or self.strategy != READ_ONLY:
            return
        bound = (upto.time, upto.inc)
        if last is not None and (last.seconds, last.increment) > bound:
            return  # events of a later clusterTime were dispatched: wait for the next report
        with self._lock:
            ready = sorted(
                (w for w in self._windows.values() if w.high is not None and (w.high.time, w.high.inc) <= bound),
                key=lambda w: (w.high.time, w.high.inc) if w.high is not None else (0, 0),
            )
        for window in ready:
            assert window.high is not None
            position = Position.from_timestamp(window.high)
            if last is not None and last >= position:
                position = Position(last.seconds, last.increment, last.ordinal + 1)  # right after it, before the next
            self._close(window, position)

    def on_signal_event(self, change: Mapping[str, Any], position: Position) -> bool:
        """An insert/delete in the signaling collection; True when it was one of our watermarks."""
        op = change.get("operationType")
        doc_id = (change.get("documentKey") or {}).get("_id")
        if not isinstance(doc_id, str):
            return False
        window_id, _, suffix = doc_id.rpartition("-")
        with self._lock:
            window = self._windows.get(window_id)
        if window is None:
            return False
        if op == "insert" and suffix == "open":
            window.opened = True
            return True
        closes = (op == "insert" and suffix == "close") or (op == "delete" and suffix == "open")
        if not closes:
            return False
        self._close(window, position)
        return True

    def poll(self) -> None:
        """Re-raise a worker's failure on the dispatcher's thread."""
        if self._errors:
            error = self._errors.pop(0)
            raise CdcError(f"incremental snapshot failed: {error}") from error

    # -- emission (dispatcher thread) ------------------------------------------------------------------

    def _close(self, window: _Window, position: Position) -> None:
        if not window.read_done.wait(30):
            raise CdcError(f"incremental snapshot window {window.id} closed before its chunk was read")
        with self._lock:
            self._windows.pop(window.id, None)
            state = self.state
            if window.discarded or state is None or window.namespace not in state.remaining:
                window.emitted.set()
                return
            low = (window.low.time, window.low.inc) if window.low is not None else None
            stale = {identity for identity, at in window.touched.items() if low is None or at > low}
            reads = [doc for identity, doc in window.buffer.items() if identity not in stale]
            ns = window.namespace
        if reads:
            self.output.emit_reads(ns, reads, position, window.asked)
        with self._lock:
            state.rows[ns] = state.rows.get(ns, 0) + len(reads)
            done = window.done
            if window.last_key is not None:
                state.last_keys[ns] = window.last_key
            if done:
                state.completed.append(ns)
                if self.metrics is not None:
                    self.metrics.table_done()
                self._notify("TABLE_SCAN_COMPLETED", {
                    "data_collection": ns, "scanned_collection": ns,
                    "total_rows_scanned": str(state.rows[ns]), "status": "SUCCEEDED" if state.rows[ns] else "EMPTY",
                })
                if self.progress is not None:
                    self.progress.snapshot_collection_done(ns, state.rows[ns])
            else:
                self._notify("IN_PROGRESS", {
                    "data_collections": ",".join(state.remaining),
                    "current_collection_in_progress": ns,
                    "maximum_key": _key_text(state.max_keys.get(ns)),
                    "last_processed_key": _key_text(window.last_key),
                    "rows": str(state.rows[ns]),
                })
            if not state.remaining:
                self._finish(aborted=False)
            else:
                self.output.save_progress(state.to_json())
        window.emitted.set()

    def _finish(self, *, aborted: bool) -> None:
        """Called under the lock: the snapshot is over (completed, or stopped by a signal)."""
        self.output.save_progress(None)
        documents = sum(self.state.rows.values()) if self.state is not None else 0
        self.state = None
        self._halt.set()
        self._resume.set()
        if self.metrics is not None:
            self.metrics.finish(aborted=aborted)
        if self.progress is not None:
            self.progress.snapshot_finished(not aborted, documents)
        self._notify("ABORTED" if aborted else "COMPLETED", {})
        self.finished.set()

    # -- workers -------------------------------------------------------------------------------------

    def _spawn(self) -> None:
        """Start workers up to ``snapshot.max.threads`` for collections nobody reads yet."""
        assert self.state is not None
        waiting = [ns for ns in self.state.remaining if ns not in self._claimed]
        self._workers = [w for w in self._workers if w.is_alive()]
        free = max(1, int(self.cfg.snapshot_max_threads)) - len(self._workers)
        for _ in range(min(free, len(waiting))):
            worker = threading.Thread(target=self._work, args=(self._halt,), name="mongocdc-incremental", daemon=True)
            self._workers.append(worker)
            worker.start()

    def _claim(self) -> str | None:
        with self._lock:
            if self.state is None:
                return None
            for ns in self.state.remaining:
                if ns not in self._claimed:
                    self._claimed.add(ns)
                    return ns
            return None

    def _work(self, halt: threading.Event) -> None:
        try:
            while not halt.is_set() and (ns := self._claim()) is not None:
                self._snapshot_collection(ns, halt)
        except BaseException as exc:
            log.exception("incremental snapshot worker failed")
            self._errors.append(exc)

    def _snapshot_collection(self, ns: str, halt: threading.Event) -> None:
        db, _, coll = ns.partition(".")
        collection = self.client[db][coll]
        with self._lock:
            if self.state is None:
                return
            condition = self.state.filters.get(ns)
            known = ns in self.state.max_keys
            maximum = self.state.max_keys.get(ns)
        if not known:
            top = collection.find(condition or {}, {"_id": 1}).sort("_id", -1).limit(1)
            found = next(iter(top), None)
            maximum = None if found is None else (found["_id"],)
            with self._lock:
                if self.state is None:
                    return
                self.state.max_keys[ns] = maximum
        while not halt.is_set():
            self._resume.wait()
            with self._lock:
                state = self.state
                if halt.is_set() or state is None or ns in self._stopped or ns not in state.remaining:
                    return
                last = state.last_keys.get(ns)
                window = _Window(uuid.uuid4().hex, ns, self.chunk_size)
                self._windows[window.id] = window
            window.asked = self.connection.losses if self.connection is not None else None
            # Even an empty collection gets a (trivial) window, so every emission and every progress
            # update happens on the dispatcher's thread, in stream order.
            if self.strategy == READ_ONLY:
                documents, low, high = self._read_between_cluster_times(window, collection, last, condition, maximum)
            else:
                self._watermark(window, WATERMARK_OPEN)
                documents, low, high = [], None, None
                if maximum is not None:
                    documents = read_chunk(collection, last, condition, self.chunk_size)
            with self._lock:
                window.low, window.high = low, high
                window.buffer = {key_identity(d["_id"]): d for d in documents}
                window.last_key = (documents[-1]["_id"],) if documents else None
                # Done at a short chunk or at the largest key of the start (later inserts are streamed).
                window.done = len(documents) < self.chunk_size or (
                    maximum is not None and any(past_maximum(d["_id"], maximum[0]) for d in documents)
                )
            window.read_done.set()
            if self.strategy != READ_ONLY:
                self._close_watermark(window)
            while not window.emitted.wait(0.2):
                if halt.is_set():
                    return
            if window.discarded or window.done:
                return

    def _read_between_cluster_times(
        self,
        window: _Window,
        collection: Collection[Any],
        last: tuple[Any] | None,
        condition: Mapping[str, Any] | None,
        maximum: tuple[Any] | None,
    ) -> tuple[list[dict[str, Any]], Timestamp, Timestamp]:
        """A ``read_only`` chunk: (documents, low, high watermark); nothing is written.

        The window is open (every event of the collection is noted) before the low watermark is
        taken, so no event after it can slip by unnoticed.
        """
        with self._lock:
            window.opened = True
        with self.client.start_session(causal_consistency=False) as session:
            self.client.admin.command("ping", session=session)
            low = session.operation_time
            documents = read_chunk(collection, last, condition, self.chunk_size, session) if maximum is not None else []
            high = session.operation_time
        if low is None or high is None:
            raise CdcError(
                "incremental.snapshot.watermarking.strategy=read_only needs the operationTime MongoDB returns "
                "on replica sets and sharded clusters; this deployment returned none"
            )
        return documents, low, high

    def _watermark(self, window: _Window, kind: str) -> None:
        assert self.signals is not None
        suffix = "open" if kind == WATERMARK_OPEN else "close"
        state = self.state
        self.signals.insert_one({
            "_id": f"{window.id}-{suffix}",
            "type": kind,
            "data": {"snapshot": state.id if state is not None else "", "data-collection": window.namespace},
        })

    def _close_watermark(self, window: _Window) -> None:
        assert self.signals is not None
        if self.strategy == "insert_delete":
            self.signals.delete_one({"_id": f"{window.id}-open"})
        else:
            self._watermark(window, WATERMARK_CLOSE)

    def _notify(self, kind: str, data: Mapping[str, str]) -> None:
        try:
            self.notifier.notify(AGGREGATE, kind, {"connector_name": self.cfg.topic_prefix, **data})
        except Exception:  # notifications never break the snapshot
            log.exception("notification %s failed", kind)


def _key_text(key: tuple[Any] | None) -> str:
    return "" if key is None else json_util.dumps(key[0], json_options=json_util.RELAXED_JSON_OPTIONS)


# -- standalone run (for orchestrators; the capture pipeline streams it) ------------------------------------------------------------------


@dataclass(frozen=True)
class IncrementalSnapshotResult:
    """One collection's incremental snapshot.

    ``documents`` reads and ``events`` streamed changes were delivered; ``first_position`` /
    ``last_position`` are the first and last chunk's positions (None when nothing was read);
    everything of the collection up to ``end_position`` is in the sink, so a stream slice starting
    after it continues seamlessly.
    """

    namespace: str
    documents: int
    events: int
    duration_s: float
    first_position: Position | None
    last_position: Position | None
    end_position: Position | None
    resumed: bool


class IncrementalStateFile:
    """A standalone run's progress file (``state_path``), replaced atomically."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self, namespace: str) -> IncrementalState | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            state = IncrementalState.from_json(orjson.loads(raw))
        except orjson.JSONDecodeError as exc:
            raise CdcError(f"incremental snapshot state file {self.path} is not valid JSON: {exc}") from exc
        if state.collections != [namespace]:
            raise CdcError(
                f"incremental snapshot state file {self.path} belongs to {state.collections}, not {namespace!r}; "
                "use another state_path or remove the file"
            )
        return state

    def save(self, state: dict[str, Any] | None) -> None:
        if state is None:
            self.path.unlink(missing_ok=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(orjson.dumps(state))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class StandaloneOutput:
    """A standalone run's output: reads to the receiver; progress to the state file after a flush."""

    def __init__(self, receiver: SnapshotReceiver, state_file: IncrementalStateFile | None) -> None:
        self.receiver = receiver
        self.state_file = state_file
        self.first: Position | None = None
        self.last: Position | None = None

    def emit_reads(
        self, namespace: str, documents: Sequence[Mapping[str, Any]], position: Position, asked: int | None,
    ) -> None:
        docs = [dict(d) for d in documents]
        chunk = SnapshotChunk(namespace, docs, [MARKER] * len(docs), final=False, asked=asked)
        self.receiver.snapshot_chunk(chunk, position, datetime.datetime.now(datetime.UTC))
        self.first = self.first or position
        self.last = position

    def save_progress(self, state: dict[str, Any] | None) -> None:
        if self.state_file is not None:
            self.receiver.commit()  # never record progress ahead of the reads it covers
            self.state_file.save(state)
