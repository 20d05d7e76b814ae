"""Initial and blocking snapshots: when to take one (``snapshot.mode``) and how to copy.

The start position (a resume token from a change stream opened before any document is read,
and its clusterTime) is recorded before copying, so streaming afterwards replays every change
made while the copy ran: nothing is lost, and for each key the record with the highest position
is the current state. Collections are copied in parallel (``snapshot.max.threads``); read events
carry Debezium's ``source.snapshot`` markers in the order they are delivered.

Custom snapshot modes (``snapshot.mode=custom``) are classes registered under the entry point
group ``mongocdc.snapshot_modes``; the entry point name is matched against
``snapshot.mode.custom.name``. The class is instantiated without arguments, gets
``configure(cfg)`` if it defines it, and implements :class:`Snapshotter`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from bson import Int64, Timestamp, json_util
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient, ReadPreference
from pymongo.collection import Collection
from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError
from pymongo.topology_description import TOPOLOGY_TYPE

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.raw import RawDocuments, native
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.offsets.model import SnapshotState
from mongocdc_core.positions import Position
from mongocdc_core.receiver import SnapshotChunk, StartPoint
from mongocdc_core.source.connection import one_line
from mongocdc_core.source.errors import CdcError, HistoryLostError, SnapshotReadUnavailable
from mongocdc_core.source.oplog import current_cluster_time, is_history_lost, token_timestamp
from mongocdc_core.source.ranges import IdRange, decode_key, encode_key, plan_ranges

ENTRY_POINT_GROUP = "mongocdc.snapshot_modes"

# source.snapshot values (Debezium's SnapshotRecord)
MARK_TRUE = "true"
MARK_FIRST = "first"
MARK_FIRST_IN_COLLECTION = "first_in_data_collection"
MARK_LAST_IN_COLLECTION = "last_in_data_collection"
MARK_LAST = "last"


@runtime_checkable
class Snapshotter(Protocol):
    """Debezium's ``io.debezium.snapshot.spi.Snapshotter``, in Python naming.

    ``offset_exists``: the connector has a recorded offset (it was restarted);
    ``snapshot_in_progress``: that offset says a snapshot was started and not completed.
    """

    def name(self) -> str:
        """The value of ``snapshot.mode`` (or ``snapshot.mode.custom.name``) that selects it."""
        ...

    def should_snapshot_data(self, offset_exists: bool, snapshot_in_progress: bool) -> bool:
        """Whether to copy the collections before streaming."""
        ...

    def should_stream(self) -> bool:
        """Whether to stream changes after the snapshot phase."""
        ...

    def should_snapshot_on_data_error(self) -> bool:
        """Whether to take a new snapshot when the recorded position has left the oplog."""
        ...

    def should_stream_events_starting_from_snapshot(self) -> bool:
        """True: stream from the snapshot's start; False: from the previously recorded offset."""
        ...

    def snapshot_completed(self) -> None:
        """Called after a successful snapshot."""
        ...

    def snapshot_aborted(self) -> None:
        """Called when a snapshot is stopped before it completed."""
        ...


@dataclass(frozen=True)
class BuiltinSnapshotter:
    """The built-in modes, each one a combination of Debezium's answers."""

    mode: str
    data: str  # "never" | "no_offset" | "always"
    stream: bool
    on_data_error: bool

    def name(self) -> str:
        return self.mode

    def should_snapshot_data(self, offset_exists: bool, snapshot_in_progress: bool) -> bool:
        if self.data == "always":
            return True
        if self.data == "no_offset":
            return not offset_exists or snapshot_in_progress
        return False

    def should_stream(self) -> bool:
        return self.stream

    def should_snapshot_on_data_error(self) -> bool:
        return self.on_data_error

    def should_stream_events_starting_from_snapshot(self) -> bool:
        return True

    def snapshot_completed(self) -> None:
        """Built-in modes keep no state."""

    def snapshot_aborted(self) -> None:
        """Built-in modes keep no state."""


_BUILTIN = {
    "always": BuiltinSnapshotter("always", "always", True, False),
    "initial": BuiltinSnapshotter("initial", "no_offset", True, False),
    "initial_only": BuiltinSnapshotter("initial_only", "no_offset", False, False),
    "no_data": BuiltinSnapshotter("no_data", "never", True, False),
    "never": BuiltinSnapshotter("never", "never", True, False),
    "when_needed": BuiltinSnapshotter("when_needed", "no_offset", True, True),
}


def load_snapshotter(cfg: ConnectorConfig) -> Snapshotter:
    """The snapshotter for ``snapshot.mode`` (and its ``configuration_based``/``custom`` properties)."""
    mode = cfg.snapshot_mode
    if mode in _BUILTIN:
        return _BUILTIN[mode]
    if mode == "configuration_based":
        return BuiltinSnapshotter(
            "configuration_based",
            "always" if cfg.snapshot_mode_configuration_based_snapshot_data else "never",
            bool(cfg.snapshot_mode_configuration_based_start_stream),
            bool(cfg.snapshot_mode_configuration_based_snapshot_on_data_error),
        )
    if mode == "custom":
        name = cfg.snapshot_mode_custom_name
        if not name:
            raise CdcError("snapshot.mode=custom requires snapshot.mode.custom.name")
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not found:
            available = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
            raise CdcError(
                f"snapshot.mode.custom.name={name!r}: no snapshotter registered under the entry point group "
                f"{ENTRY_POINT_GROUP!r} (registered: {', '.join(available) or 'none'})"
            )
        instance = found[0].load()()
        configure = getattr(instance, "configure", None)
        if callable(configure):
            configure(cfg)
        if not isinstance(instance, Snapshotter):
            raise CdcError(f"snapshotter {name!r} ({type(instance).__name__}) does not implement Snapshotter")
        return instance
    raise CdcError(f"unknown snapshot.mode {mode!r}")


# -- what and from where ---------------------------------------------------------------------------------


def snapshot_collections(client: MongoClient[Any], cfg: ConnectorConfig) -> list[str]:
    """``db.coll`` of every collection (not view) an initial snapshot copies, sorted."""
    found: list[str] = []
    for db in client.list_database_names():
        if not cfg.database_included(db):
            continue
        for info in client[db].list_collections():
            if info.get("type", "collection") != "collection":
                continue
            if cfg.snapshot_collection_included(db, info["name"]):
                found.append(f"{db}.{info['name']}")
    return sorted(found)


def captured_collections(client: MongoClient[Any], cfg: ConnectorConfig) -> list[str]:
    """``db.coll`` of every existing collection the connector captures (filters), sorted."""
    found: list[str] = []
    for db in client.list_database_names():
        if not cfg.database_included(db):
            continue
        for info in client[db].list_collections():
            name = info["name"]
            if info.get("type", "collection") == "collection" and cfg.collection_included(db, name):
                if not cfg.is_signal_collection(db, name):
                    found.append(f"{db}.{name}")
    return sorted(found)


def collection_filter(cfg: ConnectorConfig, namespace: str) -> dict[str, Any] | None:
    """The ``snapshot.collection.filter.overrides.<db>.<coll>`` query, parsed from (extended) JSON."""
    text = (cfg.snapshot_collection_filter_overrides or {}).get(namespace)
    if not text:
        return None
    try:
        parsed = json_util.loads(text)
    except ValueError as exc:
        raise CdcError(
            f"snapshot.collection.filter.overrides.{namespace} is not a JSON query document: {exc}"
        ) from exc
    if not isinstance(parsed, dict):
        raise CdcError(f"snapshot.collection.filter.overrides.{namespace} must be a JSON object, got {text!r}")
    return parsed


def record_start(client: MongoClient[Any], watch_target: Any) -> StartPoint:
    """Open a change stream and keep its first post-batch resume token, before any copying.

    Streaming resumes after that token, so every change made while the copy runs is replayed;
    snapshot reads take the token's clusterTime, which no later event has.
    """
    cluster_time = current_cluster_time(client)
    try:
        with watch_target.watch([]) as stream:
            token = stream.resume_token
    except OperationFailure as exc:
        if not is_history_lost(exc):
            raise
        raise HistoryLostError(
            f"cannot start the snapshot: a change stream opened at the current cluster time {cluster_time} is "
            f"already outside the oplog ({one_line(exc)}), so the changes made while the copy runs could not be "
            "streamed after it. A member (or shard) holds no oplog entry at or after that time; check its oplog "
            "(replSetGetStatus, rs.printReplicationInfo()) and run again.",
            position=cluster_time,
        ) from exc
    ts = token_timestamp(dict(token) if token else None) or cluster_time
    return StartPoint(dict(token) if token else None, Position.from_timestamp(ts), cluster_time)


def estimate_count(
    client: MongoClient[Any], cfg: ConnectorConfig, namespace: str, query: Mapping[str, Any] | None = None
) -> int | None:
    """Document count for progress totals: exact with a query (``query``, else the collection's
    filter override), estimated otherwise."""
    db, _, coll = namespace.partition(".")
    try:
        query = query or collection_filter(cfg, namespace)
        if query:
            return int(client[db][coll].count_documents(dict(query)))
        return int(client[db][coll].estimated_document_count())
    except CdcError:
        raise
    except PyMongoError:  # a count is only for display; the copy itself reports real errors
        return None


def read_at_cluster_time(
    client: MongoClient[Any], namespace: str, at: Timestamp, query: dict[str, Any], batch_size: int,
    connection: ConnectorMetrics | None = None,
) -> Iterator[RawDocuments]:
    """Batches of ``namespace`` as it was at cluster time ``at``, in ``_id`` order.

    One ``find`` with ``readConcern: {level: "snapshot", atClusterTime}`` and its ``getMore``s in one
    session (:func:`_own_cursor`; ``connection``'s losses tag each batch, as in :func:`raw_batches`).
    Raises :class:`SnapshotReadUnavailable` when the server refuses (the time has left its snapshot
    history, error 239) or answers without reading at that time (no ``atClusterTime`` in the cursor:
    snapshot reads not supported).
    """
    db, _, coll = namespace.partition(".")
    where = f"snapshot read of {namespace} at Timestamp({at.time}, {at.inc})"
    concern = {"level": "snapshot", "atClusterTime": at}
    try:
        yield from _own_cursor(client[db][coll], query, max(1, batch_size), concern, at, connection)
    except OperationFailure as exc:
        raise SnapshotReadUnavailable(f"{where} refused: {exc.details.get('errmsg') if exc.details else exc}") from exc
    except _NotReadAtTime:
        raise SnapshotReadUnavailable(f"{where}: the server does not support reads at a cluster time") from None


# -- copying ---------------------------------------------------------------------------------------------


def snapshot_marker(first_collection: bool, last_collection: bool, first_record: bool, last_record: bool) -> str:
    """Debezium's precedence for ``source.snapshot``: last, first, last/first in collection, true."""
    if last_record and last_collection:
        return MARK_LAST
    if first_record and first_collection:
        return MARK_FIRST
    if last_record:
        return MARK_LAST_IN_COLLECTION
    if first_record:
        return MARK_FIRST_IN_COLLECTION
    return MARK_TRUE


EmitFn = Callable[[SnapshotChunk], bool]
PrepareFn = Callable[[SnapshotChunk], SnapshotChunk]


_PINNED_TOPOLOGIES = frozenset({TOPOLOGY_TYPE.Single, TOPOLOGY_TYPE.ReplicaSetWithPrimary})


def _pinned(collection: Collection[Any]) -> bool:
    """Whether every command of this collection goes to the one server a cursor lives on."""
    if collection.read_preference != ReadPreference.PRIMARY:
        return False
    client = collection.database.client
    if client.topology_description.topology_type in (TOPOLOGY_TYPE.Unknown, TOPOLOGY_TYPE.ReplicaSetNoPrimary):
        client.admin.command("ping")  # a new client (or an election): wait for the primary, as a find would
    return client.topology_description.topology_type in _PINNED_TOPOLOGIES


def raw_batches(collection: Collection[Any], query: dict[str, Any], batch_size: int,
                connection: ConnectorMetrics | None = None) -> Iterator[RawDocuments]:
    """The documents matching ``query`` in ``_id`` order, one :class:`RawDocuments` per server batch.

    Reading the primary of a replica set (or one server): :func:`_own_cursor`. Otherwise (mongos,
    secondary reads): pymongo's ``find_raw_batches``, which keeps its cursor on the server that
    opened it. Each batch is tagged with ``connection``'s losses when it was asked for
    (``RawDocuments.asked``): a batch read ahead before a loss and handed over after it ends nothing.
    """
    if _pinned(collection):
        concern = collection.read_concern.document
        yield from _own_cursor(collection, query, batch_size, concern or None, None, connection)
        return
    options = collection.codec_options
    cursor = collection.find_raw_batches(query, batch_size=batch_size, sort=[("_id", 1)])
    with cursor:
        while True:
            asked = _losses(connection)
            batch = next(cursor, None)
            if batch is None:
                return
            yield RawDocuments(batch, options, asked=asked)


def _losses(connection: ConnectorMetrics | None) -> int | None:
    """``ConnectorMetrics.losses`` as a read is sent (None without metrics: a read taken as new)."""
    return connection.losses if connection is not None else None


class _NotReadAtTime(Exception):
    """A reply to a read at a cluster time without ``atClusterTime``: the server ignored it."""


def _cut(reply: RawBSONDocument) -> tuple[int, bytes, list[int] | None, tuple[int, int] | None]:
    """A raw ``find``/``getMore`` reply's cursor id, its batch's documents end to end (with their
    bounds when the compiled module cut them) and the cursor's ``atClusterTime``."""
    if native is not None:
        return native.cursor_batch(reply.raw)
    cursor = reply["cursor"]
    batch = cursor.get("firstBatch", cursor.get("nextBatch", []))
    at = cursor.get("atClusterTime")
    return int(cursor["id"]), b"".join(doc.raw for doc in batch), None, None if at is None else (at.time, at.inc)


def _own_cursor(
    collection: Collection[Any], query: dict[str, Any], batch_size: int, read_concern: dict[str, Any] | None,
    at: Timestamp | None, connection: ConnectorMetrics | None,
) -> Iterator[RawDocuments]:
    """``find`` (in ``_id`` order) and its ``getMore``s in one session, on the server it went to (the
    caller makes sure every command goes there); each reply's batch cut out of its BSON by the
    compiled module, with no Python object per document (pymongo's raw batch cursor builds one per
    document to join them). The ``find`` is retried once after a network error or a lost primary, as
    pymongo retries reads; a cursor left open is killed. With ``at``, a reply must say it read then.
    Each batch carries ``connection``'s losses when its command was sent (``RawDocuments.asked``).

    After an election the next ``getMore`` goes to the new primary, which does not know the cursor
    (CursorNotFound): the copy fails and the connector's restart resumes it from its recorded
    progress, as after a lost connection.
    """
    options = collection.codec_options
    # The command is encoded with these too: range bounds may hold UUIDs in the client's representation.
    raw_reply = options.with_options(document_class=RawBSONDocument)
    database, name = collection.database, collection.name
    client = database.client
    find: dict[str, Any] = {"find": name, "filter": query, "sort": {"_id": 1}}
    more: dict[str, Any] = {"collection": name}
    if batch_size:
        find["batchSize"] = more["batchSize"] = batch_size
    if read_concern:
        find["readConcern"] = read_concern
    with client.start_session(causal_consistency=False) as session:
        cursor_id = 0
        try:
            asked = _losses(connection)
            try:
                reply = database.command(find, session=session, codec_options=raw_reply)
            except ConnectionFailure:
                if not client.options.retry_reads:
                    raise
                asked = _losses(connection)
                reply = database.command(find, session=session, codec_options=raw_reply)
            cursor_id, data, bounds, read_at = _cut(reply)
            if at is not None and read_at != (at.time, at.inc):
                raise _NotReadAtTime
            while True:
                if data:
                    yield RawDocuments(data, options, bounds, asked=asked)
                if not cursor_id:
                    return
                asked = _losses(connection)
                reply = database.command({"getMore": Int64(cursor_id), **more}, session=session,
                                         codec_options=raw_reply)
                cursor_id, data, bounds, _ = _cut(reply)
        finally:
            if cursor_id:
                with contextlib.suppress(PyMongoError):  # the server drops it after its idle timeout anyway
                    database.command({"killCursors": name, "cursors": [Int64(cursor_id)]}, session=session)


_CLOSE_WAIT_S = 5.0  # longest wait for a range reader's getMore in flight when the copy stops


class _Prefetch:
    """A range's raw batches, the next one read by a thread of its own while the last is converted.

    The server works on a ``getMore`` while this process converts the previous batch instead of
    one waiting for the other. The reading thread owns the cursor (cursors are not thread-safe) and
    closes it; an error it meets is raised by :meth:`next`.
    """

    _END = object()

    def __init__(self, open_cursor: Callable[[], Iterable[RawDocuments]], stop: threading.Event, name: str,
                 depth: int = 2) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = stop
        self._closed = threading.Event()
        self._ended = False
        self._thread = threading.Thread(target=self._read, args=(open_cursor,), name=name, daemon=True)
        self._thread.start()

    def _read(self, open_cursor: Callable[[], Iterable[RawDocuments]]) -> None:
        try:
            batches = iter(open_cursor())
            try:
                for batch in batches:
                    if not self._put(batch):
                        return
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()
            self._put(self._END)
        except BaseException as exc:  # noqa: BLE001 - handed to the copying thread, which raises it
            self._put(exc)

    def _put(self, item: object) -> bool:
        """Queue ``item``; False once closed (the cursor is then closed, never read on)."""
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=0.1)
            except queue.Full:
                continue
            return not self._closed.is_set()
        return False

    def next(self) -> RawDocuments | None:
        """The next batch; None at the end of the range, or once the copy is stopping."""
        while not self._ended and not self._stop.is_set():
            try:
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is self._END:
                self._ended = True
            elif isinstance(item, BaseException):
                self._ended = True
                raise item
            else:
                assert isinstance(item, RawDocuments)
                return item
        return None

    def close(self) -> None:
        """Stop reading and wait (a while) for the thread to kill the cursor, before the client may close.
        The batches read ahead are dropped, so that a reader waiting to queue one goes on at once (rather
        than at its next look at the clock) and finds the copy closed."""
        self._closed.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()
        self._thread.join(_CLOSE_WAIT_S)


@dataclass(frozen=True, slots=True)
class _Unit:
    """A piece of work: one ``_id`` range (possibly the whole collection), with its estimated size."""

    namespace: str
    part: int
    query: dict[str, Any]
    weight: float


class SnapshotCopier:
    """Copies collections as ``_id`` ranges with up to ``threads`` workers, handing chunks to ``emit``.

    A collection of more than ``mongocdc.snapshot.split.size`` documents is planned as ranges of
    about that size (:mod:`mongocdc_core.source.ranges`, every ``_id`` type in the server's order);
    all ranges of all collections form one pool, biggest first, each range read in ``_id`` order
    with its own cursor and ``snapshot.fetch.size`` (``split_size`` overrides the property; 0 never
    splits, for a caller that already copies one range). With ``progress`` (the offset's
    :class:`SnapshotState`), the plan is recorded there and ranges already done, or the keys of a
    range already delivered, are skipped: a resumed snapshot copies only what is left. With
    ``at_cluster_time`` every range is read as it was at that time (:func:`read_at_cluster_time`).

    Chunks reach ``emit`` one at a time, in the order their markers describe (the order in which
    the workers took them under one lock); it returns False to stop the copy (engine stopping).
    ``prepare`` (optional) is called on each chunk before its turn, by the worker that read it and
    in parallel with the other workers (the conversion, which is most of a chunk's cost); ``emit``
    gets what it returns, while other workers go on reading and ordering their chunks.

    Markers are Debezium's whatever order the ranges finish in: the first record delivered is
    ``first``, the first of each other collection ``first_in_data_collection``, the last of each
    collection ``last_in_data_collection`` and the very last ``last``. Which record is a collection's last is
    only known once all its ranges finished (a range finishing later may be empty), so the final
    record of each finished range is held back until it is known not to be the last, and the
    final record of a finished collection until it is known whether it is the snapshot's last. A
    held record's range is not done yet: a stop leaves it to the restart, never delivered twice.
    """

    def __init__(
        self,
        client: MongoClient[Any],
        cfg: ConnectorConfig,
        collections: Sequence[str],
        emit: EmitFn,
        *,
        threads: int = 1,
        chunk_size: int = 1024,
        filters: Mapping[str, dict[str, Any] | None] | None = None,
        stop: threading.Event | None = None,
        progress: SnapshotState | None = None,
        split_size: int | None = None,
        prepare: PrepareFn | None = None,
        at_cluster_time: Timestamp | None = None,
        connection: ConnectorMetrics | None = None,
    ) -> None:
        self.client = client
        self.cfg = cfg
        self.emit = emit
        self.prepare = prepare
        self.max_threads = max(1, threads)
        self.fetch_size = int(cfg.snapshot_fetch_size or 0)
        self.chunk_size = max(1, self.fetch_size or chunk_size)
        self.filters = dict(filters) if filters is not None else {ns: collection_filter(cfg, ns) for ns in collections}
        self.stop = stop or threading.Event()
        self.split_size = int(cfg.mongocdc_snapshot_split_size if split_size is None else split_size)
        self.progress = progress
        self.at_cluster_time = at_cluster_time
        self.connection = connection  # its losses tag each batch's read (SnapshotChunk.asked)
        self._collections = list(collections)
        self._pending: list[_Unit] = []
        self._parts_left: dict[str, int] = {}
        self._started: set[str] = set()
        self._emitted_any = progress is not None and progress.delivered
        # a finished range's final record, per collection (its part, the record, its batch's asked)
        self._tails: dict[str, tuple[int, dict[str, Any], int | None]] = {}
        self._last: tuple[str, int, dict[str, Any], int | None] | None = None  # a finished collection's final record
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []
        # Chunks ordered under the lock wait here with their tickets until the worker that ordered
        # them hands them over (prepare, then emit in ticket order: ``_turn`` is the next to emit;
        # only ``_ordered`` takes tickets).
        self._outbox: list[tuple[int, SnapshotChunk]] = []
        self._tickets = 0
        self._turn = 0
        self._turn_passed = threading.Condition()

    def plan(self, namespace: str) -> list[IdRange]:
        """The ``_id`` ranges ``namespace`` is copied as (one when it is small)."""
        db, _, coll = namespace.partition(".")
        return plan_ranges(self.client[db][coll], self.split_size)

    def run(self) -> bool:
        """Copy everything; True when complete, False when stopped. Re-raises a worker's error."""
        finished: list[str] = []
        for namespace in self._collections:
            units = self._units(namespace)
            if not units:
                finished.append(namespace)
            self._pending.extend(units)
            self._parts_left[namespace] = len(units)
        if self.max_threads == 1:
            # One worker: Debezium's order (by collection name), so the final read, marked `last`, is the
            # one Debezium marks; empty collections first, as they deliver nothing. Stable within a collection.
            self._pending.sort(key=lambda unit: (unit.weight > 0, unit.namespace.partition(".")[2]))
        else:
            self._pending.sort(key=lambda unit: -unit.weight)  # biggest work first; stable within a collection

        def record_finished() -> bool:
            for namespace in finished:  # every range was done before a restart: only the end is left to record
                if not self._enqueue(namespace, 0, [], part_done=False, final=True):
                    return False
            return True

        if not self._ordered(record_finished):
            return False
        workers = [
            threading.Thread(target=self._worker, name=f"mongocdc-snapshot-{i}", daemon=True)
            for i in range(max(1, min(self.max_threads, len(self._pending))))
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if self._errors:
            raise self._errors[0]
        if self.stop.is_set():
            return False
        return self._ordered(lambda: self._release_last(last=True))

    def _units(self, namespace: str) -> list[_Unit]:
        """The ranges of ``namespace`` still to copy (planned now, or taken from ``progress``)."""
        entries = self.progress.parts.get(namespace) if self.progress is not None else None
        if entries is None:
            entries = [{"range": r.to_json(), "done": False, "after": None} for r in self.plan(namespace)]
            if self.progress is not None:
                self.progress.parts[namespace] = entries
        elif any(entry.get("after") for entry in entries):
            self._started.add(namespace)  # resumed: its first record was delivered before the restart
        db, _, coll = namespace.partition(".")
        weight = self.client[db][coll].estimated_document_count() / max(1, len(entries))
        base = self.filters.get(namespace) or {}
        units = []
        for part, entry in enumerate(entries):
            if entry.get("done"):
                continue
            id_range = IdRange.from_json(entry["range"])
            if entry.get("after") is not None:
                id_range = id_range.after(decode_key(entry["after"]))
            bound = id_range.query()
            query = {"$and": [base, bound]} if base and bound else (bound or base)
            units.append(_Unit(namespace, part, query, weight))
        return units

    def _claim(self) -> _Unit | None:
        with self._lock:
            if not self._pending or self.stop.is_set() or self._errors:
                return None
            return self._pending.pop(0)

    def _worker(self) -> None:
        try:
            while (unit := self._claim()) is not None:
                self._copy(unit)
        except BaseException as exc:
            with self._lock:
                self._errors.append(exc)
            self.stop.set()

    def _copy(self, unit: _Unit) -> None:
        """Read one range in ``_id`` order and deliver it in chunks of at most ``chunk_size``
        documents; the next batch is read before a chunk goes, so the range's last chunk is known
        to be its last.

        The range is read as raw batches (decoded only where the conversion needs it), the next
        batch fetched while the previous one is converted (:class:`_Prefetch`). A chunk is a batch
        or a slice of one, never two joined: joining copied every batch once more (the fetch size
        is the chunk size, so a batch is a chunk)."""
        db, _, coll = unit.namespace.partition(".")
        collection = self.client[db][coll]
        at = self.at_cluster_time

        def open_cursor() -> Iterable[RawDocuments]:
            if at is not None:
                return read_at_cluster_time(self.client, unit.namespace, at, unit.query,
                                            self.fetch_size or self.chunk_size, self.connection)
            return raw_batches(collection, unit.query, self.fetch_size, self.connection)

        batches = _Prefetch(open_cursor, self.stop, f"mongocdc-snapshot-read-{unit.namespace}-{unit.part}")
        size = self.chunk_size
        pending = RawDocuments(b"", collection.codec_options)
        try:
            while True:
                if len(pending) > size:
                    chunk, pending = pending[:size], pending[size:]
                else:
                    following = batches.next()
                    while following is not None and not len(following):
                        following = batches.next()
                    if self.stop.is_set():
                        return
                    if following is None:  # the cursor is exhausted: this is the range's last chunk
                        self._deliver(unit.namespace, unit.part, pending, part_done=True)
                        return
                    chunk, pending = pending, following
                    if not len(chunk):
                        continue
                if self.stop.is_set() or not self._deliver(unit.namespace, unit.part, chunk, part_done=False):
                    return
        finally:
            batches.close()

    def _deliver(self, namespace: str, part: int, docs: RawDocuments, *, part_done: bool) -> bool:
        """A chunk of a range (``part_done``: the range's last): ordered under the lock, then handed over."""
        return self._ordered(lambda: self._order(namespace, part, docs, part_done=part_done))

    def _ordered(self, order: Callable[[], bool]) -> bool:
        """Run ``order`` under the lock (it queues chunks with tickets), then hand the queued chunks
        over. The one path that takes tickets: every ticket taken reaches :meth:`_hand_over`, also
        when ``order`` raised (its turn must pass, or a later worker waits for it forever), and the
        stop is set before the lock is released, so no later ticket is emitted either."""
        failure: BaseException | None = None
        with self._lock:
            try:
                ordered = order()
            except BaseException as exc:  # noqa: BLE001 - re-raised once the queued turns passed
                failure, ordered = exc, False
                self.stop.set()
            queued, self._outbox = self._outbox, []
        handed = self._hand_over(queued)
        if failure is not None:
            raise failure
        return handed and ordered

    def _hand_over(self, queued: Sequence[tuple[int, SnapshotChunk]]) -> bool:
        """Prepare each chunk, then emit it in its ticket's turn. Every turn passes, whatever happens
        (a stop, a failure); once one chunk is not emitted, none after it is (a restart then resumes
        from what was)."""
        ok = True
        failure: BaseException | None = None
        for ticket, chunk in queued:
            if ok and failure is None and self.prepare is not None and not self.stop.is_set():
                try:
                    chunk = self.prepare(chunk)
                except BaseException as exc:  # noqa: BLE001 - re-raised once every ticket's turn passed
                    failure = exc
            with self._turn_passed:
                while self._turn != ticket:
                    self._turn_passed.wait()
                try:
                    ok = ok and failure is None and not self.stop.is_set() and self.emit(chunk)
                except BaseException as exc:  # noqa: BLE001 - as above
                    failure, ok = exc, False
                finally:
                    if not ok:  # the receiver is stopping (or this failed): no later turn emits
                        self.stop.set()
                    self._turn += 1
                    self._turn_passed.notify_all()
        if failure is not None:
            raise failure
        return ok

    def _order(self, namespace: str, part: int, docs: RawDocuments, *, part_done: bool) -> bool:
        """Decide the chunks of :meth:`_deliver` (under the lock); holds back final records (see the class)."""
        asked = docs.asked
        if not part_done:
            return self._enqueue(namespace, part, docs, part_done=False, asked=asked)
        tail = docs[-1] if docs else None
        if tail is not None and not self._enqueue(namespace, part, docs[:-1], part_done=False, asked=asked):
            return False
        if tail is None and not self._enqueue(namespace, part, [], part_done=True):
            return False
        if tail is not None:
            held = self._tails.pop(namespace, None)
            if held is not None and not self._enqueue(namespace, held[0], [held[1]], part_done=True, asked=held[2]):
                return False
            self._tails[namespace] = (part, tail, asked)
        self._parts_left[namespace] -= 1
        if self._parts_left[namespace] > 0:
            return True
        # The collection is complete: its held record is its last.
        final = self._tails.pop(namespace, None)
        if final is None:  # nothing of it was read in this run: record that it is complete
            return self._enqueue(namespace, part, [], part_done=False, final=True)
        if not self._release_last(last=False):  # another collection's final record: not the last
            return False
        self._last = (namespace, *final)
        return True

    def _release_last(self, *, last: bool) -> bool:
        """Deliver the held final record of a finished collection (``last``: nothing follows it)."""
        held, self._last = self._last, None
        if held is None:
            return True
        namespace, part, doc, asked = held
        return self._enqueue(namespace, part, [doc], part_done=True, final=True, last=last, asked=asked)

    def _enqueue(
        self, namespace: str, part: int, docs: Sequence[dict[str, Any]], *, part_done: bool, final: bool = False,
        last: bool = False, asked: int | None = None,
    ) -> bool:
        """Queue one chunk with its markers and the next ticket (under the lock); False once stopping. ``asked``:
        the losses counted when its documents were read (:attr:`RawDocuments.asked`, :attr:`SnapshotChunk.asked`)."""
        if docs and self._last is not None and self._last[0] != namespace:
            if not self._release_last(last=False):  # another collection follows it: not the last record
                return False
        if not docs and not part_done and not final:
            return not self.stop.is_set()
        first_chunk = bool(docs) and namespace not in self._started
        first_collection = first_chunk and not self._emitted_any
        markers = [MARK_TRUE] * len(docs)
        if docs:
            n = len(docs)
            for i in (0, n - 1):
                markers[i] = snapshot_marker(first_collection, last, first_chunk and i == 0, final and i == n - 1)
            self._emitted_any = True
            self._started.add(namespace)
        after = encode_key(docs[-1]["_id"]) if docs else None
        self._outbox.append((self._tickets, SnapshotChunk(namespace, docs, markers, final, part, part_done, after,
                                                          asked=asked)))
        self._tickets += 1
        return not self.stop.is_set()
