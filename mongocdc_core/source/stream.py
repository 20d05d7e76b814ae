"""The change stream reader: Debezium's internal pipeline, resume, oversize handling, bounded queue.

A reader thread owns the change stream and puts raw change documents into a bounded queue
(``max.queue.size`` events and, when set, ``max.queue.size.in.bytes``), a server batch's events
at a time; the dispatcher takes them out in batches. The queue is what bounds memory when the
sink is slower than MongoDB. The reader remembers the resume token of the last document it
queued, so after an error it reopens the stream exactly after it (pymongo resumes transparently
once; the rest is handled here with Debezium's backoff).
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import bson
from bson import Timestamp
from bson.codec_options import CodecOptions
from pymongo import MongoClient
from pymongo.change_stream import ChangeStream, ClusterChangeStream
from pymongo.errors import OperationFailure, PyMongoError

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.raw import RawChange
from mongocdc_core.metrics import ConnectorMetrics, StreamingMetrics
from mongocdc_core.receiver import ConnectionState
from mongocdc_core.source.connection import Backoff, code_name, hosts_of, is_retriable, one_line, refused
from mongocdc_core.source.errors import (
    CdcError,
    ChangeStreamFailedError,
    ConnectError,
    HistoryLostError,
    OversizeEventError,
)
from mongocdc_core.source.oplog import (
    CAPPED_POSITION_LOST,
    CHANGE_STREAM_HISTORY_LOST,
    is_history_lost,
    oplog_window,
    position_lost,
    token_timestamp,
)

BSON_OBJECT_TOO_LARGE = 10334
NO_MATCHING_DOCUMENT = 47  # fullDocument: required without a stored post-image
_NS_FIELD = "__mongocdc_ns"
_OPERATION_TYPES = {"c": ("insert",), "u": ("update", "replace"), "d": ("delete",)}


# -- pipeline --------------------------------------------------------------------------------------------


def watch_options(cfg: ConnectorConfig) -> dict[str, Any]:
    """``fullDocument`` / ``fullDocumentBeforeChange`` for ``capture.mode`` as Debezium sets them."""
    mode = cfg.capture_mode
    options: dict[str, Any] = {}
    if mode in ("change_streams_update_full", "change_streams_update_full_with_pre_image"):
        options["full_document"] = "required" if cfg.capture_mode_full_update_type == "post_image" else "updateLookup"
    if mode in ("change_streams_with_pre_image", "change_streams_update_full_with_pre_image"):
        options["full_document_before_change"] = "whenAvailable"
    return options


def _name_condition(patterns: tuple[str, ...], field: str, regex: bool) -> dict[str, Any]:
    """Anchored, case-insensitive regex match (or literal ``$in``) of ``field`` against ``patterns``."""
    if not regex:
        return {field: {"$in": list(patterns)}}
    return {"$or": [{field: {"$regex": f"^(?:{p})$", "$options": "i"}} for p in patterns]}


def internal_pipeline(cfg: ConnectorConfig) -> list[dict[str, Any]]:
    """Debezium's stages: capture-relevant operation types and namespaces, signal collection always.

    The namespace filters run on the server (so uncaptured events never cross the network) and are
    checked again on the client with the config's own matcher, which is authoritative.
    """
    regex = cfg.filters_match_mode == "regex"
    allowed_ops = [op for code, ops in _OPERATION_TYPES.items() if code not in cfg.skipped_operations for op in ops]
    data: list[dict[str, Any]] = [{"operationType": {"$in": allowed_ops}}, {"ns.coll": {"$not": re.compile("^system\\.")}}]
    data.append({"ns.db": {"$nin": ["admin", "config", "local"]}})
    if cfg.database_include_list:
        data.append(_name_condition(cfg.database_include_list, "ns.db", regex))
    if cfg.database_exclude_list:
        data.append({"$nor": [_name_condition(cfg.database_exclude_list, "ns.db", regex)]})
    if cfg.collection_include_list:
        data.append(_name_condition(cfg.collection_include_list, _NS_FIELD, regex))
    if cfg.collection_exclude_list:
        data.append({"$nor": [_name_condition(cfg.collection_exclude_list, _NS_FIELD, regex)]})
    match: dict[str, Any] = {"$and": data}
    if cfg.signal_data_collection:
        # Signals are inserts; deletes close incremental-snapshot windows (insert_delete watermarks).
        signals = {_NS_FIELD: cfg.signal_data_collection, "operationType": {"$in": ["insert", "delete"]}}
        match = {"$or": [match, signals]}
    return [
        {"$addFields": {_NS_FIELD: {"$concat": ["$ns.db", ".", "$ns.coll"]}}},
        {"$match": match},
        {"$project": {_NS_FIELD: 0}},
    ]


def oversize_stages(cfg: ConnectorConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(stages before the user's, trailing stages) for ``cursor.oversize.handling.mode``."""
    mode = cfg.cursor_oversize_handling_mode
    if mode == "skip" and cfg.cursor_oversize_skip_threshold > 0:
        limit = cfg.cursor_oversize_skip_threshold
        size_ok = [
            {"$lte": [{"$ifNull": [{"$bsonSize": f"${field}"}, 0]}, limit]}
            for field in ("fullDocument", "fullDocumentBeforeChange")
        ]
        return [{"$match": {"$expr": {"$and": size_ok}}}], []
    if mode == "split":
        return [], [{"$changeStreamSplitLargeEvent": {}}]
    return [], []


def build_pipeline(cfg: ConnectorConfig) -> list[dict[str, Any]]:
    """The effective pipeline for ``cursor.pipeline.order`` (internal_first, user_first, user_only)."""
    user = list(cfg.cursor_pipeline or [])
    before, trailing = oversize_stages(cfg)
    order = cfg.cursor_pipeline_order
    if order == "user_only":
        stages = user
    elif order == "user_first":
        stages = user + internal_pipeline(cfg)
    else:
        stages = internal_pipeline(cfg) + user
    return before + stages + trailing


def watch_target(client: MongoClient[Any], cfg: ConnectorConfig) -> Any:
    """The client, database or collection to watch for ``capture.scope``/``capture.target``."""
    scope, target = cfg.capture_scope, cfg.capture_target
    if scope == "database" and target:
        return client[target]
    if scope == "collection" and target:
        db, _, coll = target.partition(".")
        return client[db][coll]
    return client  # the config requires capture.target for the narrower scopes


# -- bounded queue ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class StreamItem:
    """One thing the reader hands over: changes, a progress token only, an end, or an error.

    ``changes`` are consecutive events of the stream with their resume tokens, each a RawChange
    with a header or a decoded event: one item per server batch (or part of one), because a queue
    operation per event cost about as much as converting it.
    """

    kind: str  # "changes" | "progress" | "end" | "error"
    changes: list[tuple[Mapping[str, Any], dict[str, Any]]] | None = None
    token: dict[str, Any] | None = None
    size: int = 0
    error: BaseException | None = None

    @property
    def count(self) -> int:
        """How much of ``max.queue.size`` the item takes: its events, or 1."""
        return 1 if self.changes is None else len(self.changes)


_WAKE_AT = 64  # events queued before a busy dispatcher is woken (an idle one is woken at once)
_ACTIVE_POLL_S = 0.002  # how long a busy dispatcher waits before taking what is queued


class EventQueue:
    """Debezium's ChangeEventQueue: bounded by events and (optionally) bytes; blocks the producer.

    An item of changes weighs its events (an item never holds more than ``max_items``).
    """

    def __init__(self, max_items: int, max_bytes: int, metrics: StreamingMetrics | None = None) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: deque[StreamItem] = deque()
        self._count = 0  # the weight of the queued items (events, and 1 per other item)
        self._bytes = 0
        self._cond = threading.Condition()
        self._closed = False
        self._waiting = 0  # threads blocked in put/get: notify only when someone waits
        self._active = False  # the last get_batch found changes: the dispatcher polls briefly
        self._wake_at = max(1, min(_WAKE_AT, max_items))
        self.metrics = metrics
        if metrics is not None:
            metrics.QueueTotalCapacity = max_items
            metrics.QueueRemainingCapacity = max_items
            metrics.MaxQueueSizeInBytes = max_bytes

    def put(self, item: StreamItem, stop: threading.Event) -> bool:
        """Enqueue, waiting while full; False if ``stop`` was set or the queue closed meanwhile."""
        weight = item.count
        with self._cond:
            while not self._closed and not stop.is_set() and self._items and (
                self._count + weight > self.max_items
                or (self.max_bytes > 0 and self._bytes + item.size > self.max_bytes)
            ):
                self._waiting += 1
                self._cond.wait(0.1)
                self._waiting -= 1
            if self._closed or stop.is_set():
                return False
            self._items.append(item)
            self._count += weight
            self._bytes += item.size
            self._update_metrics()
            # While the dispatcher is busy with a flow of changes it polls every couple of
            # milliseconds, so it is woken only once a batch worth of them waits: one wake-up (a
            # thread switch) per event costs more than converting the event.
            if self._waiting and (not self._active or item.kind != "changes" or self._count >= self._wake_at):
                self._cond.notify_all()
            return True

    def get_batch(self, max_items: int, timeout: float) -> list[StreamItem]:
        """Items weighing about ``max_items`` (the last may go past it), waiting at most ``timeout``
        seconds for the first one."""
        with self._cond:
            if not self._items:
                self._waiting += 1
                self._cond.wait(min(timeout, _ACTIVE_POLL_S) if self._active else timeout)
                self._waiting -= 1
            batch: list[StreamItem] = []
            taken = 0
            while self._items and taken < max_items:
                item = self._items.popleft()
                weight = item.count
                taken += weight
                self._count -= weight
                self._bytes -= item.size
                batch.append(item)
            self._active = bool(batch)
            self._update_metrics()
            if self._waiting and batch:
                self._cond.notify_all()
            return batch

    def pending(self) -> int:
        """Events (and other items) waiting to be dispatched."""
        with self._cond:
            return self._count

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _update_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.QueueRemainingCapacity = max(0, self.max_items - self._count)
            self.metrics.CurrentQueueSizeInBytes = self._bytes


# -- reader ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartPoint:
    """Where a stream starts: after a resume token, at a cluster time, or now (both None)."""

    resume_after: dict[str, Any] | None = None
    start_at: Timestamp | None = None


def _key_of(ts: Timestamp | None) -> tuple[int, int] | None:
    return None if ts is None else (ts.time, ts.inc)


class ChangeStreamReader(threading.Thread):
    """Reads the change stream into an ``EventQueue`` until stopped, at ``stop_at``, or on a fatal error."""

    def __init__(
        self,
        client: MongoClient[Any],
        cfg: ConnectorConfig,
        start: StartPoint,
        queue: EventQueue,
        *,
        metrics: ConnectorMetrics | None = None,
        stop_at: Timestamp | None = None,
        stop_inclusive: bool = False,
        target: Any = None,
        pipeline: list[dict[str, Any]] | None = None,
        on_retry: Callable[[ConnectionState], None] | None = None,
        sharded: bool = False,
    ) -> None:
        super().__init__(name="mongocdc-change-stream", daemon=True)
        self.client = client
        self.cfg = cfg
        self.queue = queue
        self.metrics = metrics
        self.stop_at = stop_at
        self.stop_inclusive = stop_inclusive
        self.sharded = sharded  # through mongos (see _past_stop)
        self.on_retry = on_retry
        self.stop_event = threading.Event()
        # Liveness for the idle bound: when the server last answered, and since when every answer
        # was empty (None while documents are arriving). A getMore that blocks answers nothing.
        self.last_reply: float | None = None
        self.quiet_since: float | None = None
        self._target = target if target is not None else watch_target(client, cfg)
        self._pipeline = pipeline if pipeline is not None else build_pipeline(cfg)
        self._options = watch_options(cfg)
        self._resume_after = start.resume_after
        self._start_at = start.start_at
        self._measure = cfg.max_queue_size_in_bytes > 0  # sizing costs an encode: only when bounded
        self._backoff = Backoff.from_config(cfg)
        self._fragments: list[dict[str, Any]] = []
        # Changes read but not yet queued: handed over together when the server's batch is used up
        # (or they fill ``max.batch.size``, the queue, or its bytes).
        self._changes: list[tuple[Mapping[str, Any], dict[str, Any]]] = []
        self._changes_bytes = 0
        self._changes_transaction_at: Timestamp | None = None
        self._chunk = max(1, min(cfg.max_batch_size, queue.max_items))
        self._last_progress: dict[str, Any] | None = None
        # The clusterTime of the last event queued when it belongs to a transaction: every event of
        # a transaction shares its commit time (across shards too), so a scan that only reaches that
        # time may not have seen the rest of it.
        self._transaction_at: Timestamp | None = None

    def stop(self) -> None:
        self.stop_event.set()

    def _open(self) -> ChangeStream[Any]:
        await_ms = self.cfg.cursor_max_await_time_ms or None
        kwargs: dict[str, Any] = dict(self._options)
        if self._resume_after is not None:
            kwargs["resume_after"] = self._resume_after
        elif self._start_at is not None:
            kwargs["start_at_operation_time"] = self._start_at
        kwargs.update(batch_size=self.cfg.max_batch_size, max_await_time_ms=await_ms)
        # Events arrive as RawChange (undecoded): the converter writes most records from their BSON.
        target = self._target
        if isinstance(target, MongoClient):
            # MongoClient.watch, on the admin database with the raw document class (a client has no
            # with_options): the same ClusterChangeStream it builds.
            admin = target.get_database("admin", codec_options=_raw_options(target.codec_options))
            every = {"full_document": None, "resume_after": None, "collation": None, "start_at_operation_time": None,
                     "session": None, "start_after": None}  # fmt: skip
            stream: ChangeStream[Any] = ClusterChangeStream(admin, self._pipeline, **{**every, **kwargs})
            stream._initialize_cursor()
            return stream
        raw_target = target.with_options(codec_options=_raw_options(target.codec_options))
        return raw_target.watch(self._pipeline, **kwargs)  # type: ignore[no-any-return]

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # handed to the dispatcher, which raises it on its thread
            self.queue.put(StreamItem("error", error=exc), threading.Event())

    def _fatal(self, exc: PyMongoError) -> BaseException:
        """The error that ends the stream, with what it means and how to recover."""
        if is_history_lost(exc):
            start = self.resume_position()
            window = None
            try:
                window = oplog_window(self.client)
            except PyMongoError:
                pass
            return HistoryLostError(
                f"change stream history lost while resuming at {start}: {exc}. "
                "The oplog no longer holds the stream's position.",
                position=start,
                oplog_first=window.first if window else None,
            )
        if isinstance(exc, OperationFailure) and exc.code == BSON_OBJECT_TOO_LARGE:
            return OversizeEventError(
                f"a change event exceeds MongoDB's 16 MiB BSON limit ({exc}); with "
                "cursor.oversize.handling.mode=fail the connector stops. Set it to 'split' "
                "($changeStreamSplitLargeEvent, MongoDB 6.0.9+) or to 'skip' with cursor.oversize.skip.threshold."
            )
        if isinstance(exc, OperationFailure) and exc.code == NO_MATCHING_DOCUMENT and "post-image" in str(exc):
            return CdcError(
                "capture.mode.full.update.type=post_image needs post-images, and a captured collection has "
                "none (MongoDB: "
                f"{one_line(exc)}). Enable them on each captured collection with "
                'db.runCommand({collMod: "<collection>", changeStreamPreAndPostImages: {enabled: true}}) '
                "(MongoDB 6.0+), or set capture.mode.full.update.type=lookup."
            )
        failure = refused(exc, "change stream", self.cfg.mongodb_user)
        if failure is not None:
            return failure
        if isinstance(exc, OperationFailure):
            return ChangeStreamFailedError(
                f"the change stream failed with a non-resumable error {exc.code} ({code_name(exc) or 'unknown'}): "
                f"{one_line(exc)}"
            )
        return exc

    def resume_position(self) -> Timestamp | None:
        """The clusterTime the stream would resume from (how far it has read)."""
        return token_timestamp(self._resume_after) or self._start_at

    def _still_in_window(self, exc: PyMongoError) -> bool:
        """A 136/286 error while the resume position is still in the oplog: resuming works."""
        if not (isinstance(exc, OperationFailure) and exc.code in (CAPPED_POSITION_LOST, CHANGE_STREAM_HISTORY_LOST)):
            return False
        start = self.resume_position()
        try:
            lost, first = position_lost(self.client, start)
        except PyMongoError:
            return False
        return start is not None and first is not None and not lost

    def _retry(self, exc: PyMongoError, failures: int) -> None:
        """Report the failed attempt and wait the backoff delay before the next one."""
        delay_s = self._backoff.delay_ms(failures) / 1000
        if self.on_retry is not None:
            self.on_retry(ConnectionState(hosts_of(self.client), failures, self._backoff.max_attempts, delay_s, one_line(exc)))
        self.stop_event.wait(delay_s)

    def _run(self) -> None:
        stream: ChangeStream[Any] | None = None
        failures = 0
        try:
            while not self.stop_event.is_set():
                try:
                    # What counts as MongoDB answering again is an answer to a question asked after the
                    # last loss was counted (ConnectorMetrics.losses when it was asked).
                    if stream is None:
                        asked = self.metrics.losses if self.metrics is not None else 0
                        stream = self._open()
                        if self.metrics is not None:
                            self.metrics.streaming.Connected = True
                            self.metrics.connection_restored(asked)
                    asked = self.metrics.losses if self.metrics is not None else 0
                    doc = stream.try_next()
                    failures = 0
                    if doc is None and self.metrics is not None:
                        # The server answered a getMore (a document may come from the driver's buffer).
                        self.metrics.connection_restored(asked)
                except PyMongoError as exc:
                    if stream is not None:
                        stream.close()
                        stream = None
                    self._fragments = []
                    self._changes, self._changes_bytes = [], 0  # read again after the reopen
                    if self.metrics is not None:
                        self.metrics.streaming.Connected = False
                    if not (is_retriable(exc) or self._still_in_window(exc)):
                        raise self._fatal(exc) from exc
                    if self.metrics is not None:
                        self.metrics.connection_lost()
                    if self.cfg.errors_max_retries == 0:
                        raise CdcError(
                            f"the change stream failed with a retriable error and errors.max.retries=0 "
                            f"disables retries: {one_line(exc)}"
                        ) from exc
                    failures += 1
                    if failures > self._backoff.max_attempts:
                        raise ConnectError(
                            f"change stream: MongoDB unreachable after {self._backoff.max_attempts} "
                            f"reconnection attempts (connect.max.attempts): {one_line(exc)}"
                        ) from exc
                    self._retry(exc, failures)
                    continue
                self.last_reply = time.monotonic()
                if doc is None:
                    if self.quiet_since is None:
                        self.quiet_since = self.last_reply
                    token = stream.resume_token
                    if not self._progress(dict(token) if token is not None else None):
                        return
                    if not stream.alive:
                        self.queue.put(StreamItem("end"), self.stop_event)
                        return
                    continue
                self.quiet_since = None
                if not self._handle(doc):
                    return
                for doc in _rest_of_batch(stream):
                    if not self._handle(doc):
                        return
                if not self._hand_over():
                    return
        finally:
            if stream is not None:
                stream.close()

    def _past_stop(self, at: tuple[int, int] | None, *, scanned: bool) -> bool:
        """Whether the stream reached ``stop_at``: an event after it, or a scan that covers it.

        An inclusive stop is covered by a scan that reached it, unless the last event was part of a
        transaction committed at that very time: the transaction's other events (on another shard,
        or in the next batch) share the time and must still come, so then only a scan past it ends.
        Through mongos only a scan past it ends either: each shard's clock is its own, so two shards
        can write at one time, and the router's token once one shard's scan reached that time is a
        high-water mark there, which sorts before the other shard's events of that time still to come.
        """
        if self.stop_at is None or at is None:
            return False
        stop = (self.stop_at.time, self.stop_at.inc)
        if self.stop_inclusive and not scanned:
            return at > stop
        if self.stop_inclusive and at == stop and (self.sharded or self._transaction_at == self.stop_at):
            return False
        return at >= stop

    def _end(self, token: dict[str, Any] | None) -> bool:
        if self._hand_over():
            self.queue.put(StreamItem("end", token=token), self.stop_event)
        self.stop_event.set()
        return False

    def _progress(self, token: dict[str, Any] | None) -> bool:
        """Hand over a post-batch resume token (offsets and heartbeats advance on idle streams).

        False when the scan passed ``stop_at`` (the end was queued).
        """
        if token is None or self._fragments:
            return True
        if self._past_stop(_key_of(token_timestamp(token)), scanned=True):
            return self._end(token)
        if token == self._last_progress:
            return True
        self._last_progress = token
        if self.queue.put(StreamItem("progress", token=token), self.stop_event):
            self._resume_after = token
        return True

    def _hand_over(self) -> bool:
        """Queue the changes read so far as one item; False if stopped meanwhile."""
        if not self._changes:
            return True
        changes, size = self._changes, self._changes_bytes
        self._changes, self._changes_bytes = [], 0
        if not self.queue.put(StreamItem("changes", changes=changes, size=size), self.stop_event):
            return False
        token = changes[-1][1]
        self._resume_after = token
        self._last_progress = token
        self._transaction_at = self._changes_transaction_at  # the clusterTime of a transaction's event, else None
        return True

    def _handle(self, doc: Mapping[str, Any]) -> bool:
        """Take one change (reassembling split fragments) to hand over; False when the stream must end.

        An ordinary event stays raw (its header says all this needs); any other is decoded here.
        """
        change: Mapping[str, Any] = doc
        header = doc.header if isinstance(doc, RawChange) else None
        at: tuple[int, int] | None
        if header is not None:
            assert isinstance(doc, RawChange)
            token, at, size = {"_data": header.token}, (header.seconds, header.increment), len(doc.raw)
            ct = Timestamp(header.seconds, header.increment) if header.txn_number is not None else None  # a transaction's event
        else:
            change = doc.document() if type(doc) is RawChange else doc
            split = change.get("splitEvent")
            if split is not None:
                self._fragments.append(dict(change))
                if split.get("fragment") != split.get("of"):
                    return True
                change = _reassemble(self._fragments)
                self._fragments = []
            token, stated = change["_id"], change.get("clusterTime")
            ct = stated if isinstance(stated, Timestamp) else None
            at = _key_of(ct or token_timestamp(token))
            size = len(bson.encode(change)) if self._measure else 0
            if change.get("txnNumber") is None:
                ct = None
        if self._past_stop(at, scanned=False):
            return self._end(token)
        full = len(self._changes) >= self._chunk or (self._measure and self._changes_bytes + size > self.queue.max_bytes)
        if self._changes and full and not self._hand_over():  # a chunk of max.batch.size, or the byte bound
            return False
        self._changes.append((change, token))
        self._changes_bytes += size
        self._changes_transaction_at = ct
        return True


def _rest_of_batch(stream: ChangeStream[Any]) -> list[Any]:
    """The events left of the server's last batch, taken at once, the stream left as that many
    ``try_next`` calls would leave it (a call per event cost as much as converting the event).

    pymongo keeps a batch in its cursor's buffer and offers no public way to take it; its own
    resume (once, inside ``try_next``) starts after the token kept here: the batch's post-batch
    token, or its last event's. Empty when an event has no resume token (``try_next`` raises
    pymongo's own error for it) or the stream decodes events itself.
    """
    cursor = stream._cursor
    buffered = cursor._data
    if not buffered or stream._decode_custom:
        return []
    for doc in buffered:
        if type(doc) is not RawChange or (doc.header is None and "_id" not in doc):
            return []
    events = list(buffered)
    buffered.clear()
    stream._resume_token = cursor._post_batch_resume_token or events[-1]["_id"]
    stream._start_at_operation_time = None
    stream._uses_start_after = False
    stream._uses_resume_after = True
    if not cursor.alive:
        stream._closed = True
    return events


def _raw_options(options: CodecOptions[Any]) -> CodecOptions[RawChange]:
    """The stream's codec options with events left raw (decoded, when needed, with ``options``)."""
    return options.with_options(document_class=RawChange)


def _reassemble(fragments: list[dict[str, Any]]) -> dict[str, Any]:
    """Join ``$changeStreamSplitLargeEvent`` fragments into the event they were cut from.

    Each fragment carries a disjoint set of top-level fields; the last fragment's ``_id`` is the
    token to resume after once the whole event is processed.
    """
    merged: dict[str, Any] = {}
    for fragment in fragments:
        for key, value in fragment.items():
            if key not in ("_id", "splitEvent"):
                merged[key] = value
    merged["_id"] = fragments[-1]["_id"]
    return merged

