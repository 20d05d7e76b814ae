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

import datetime
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from bson import Decimal128, Int64, ObjectId, json_util
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.positions import Position
from mongocdc_core.receiver import SnapshotChunk, StartPoint
from mongocdc_core.source.errors import CdcError
from mongocdc_core.source.oplog import current_cluster_time, token_timestamp

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
    with watch_target.watch([]) as stream:
        token = stream.resume_token
    ts = token_timestamp(dict(token) if token else None) or cluster_time
    return StartPoint(dict(token) if token else None, Position.from_timestamp(ts), cluster_time)


def estimate_count(client: MongoClient[Any], cfg: ConnectorConfig, namespace: str) -> int | None:
    """Document count for progress totals (exact with a filter override, estimated otherwise)."""
    db, _, coll = namespace.partition(".")
    try:
        query = collection_filter(cfg, namespace)
        if query:
            return int(client[db][coll].count_documents(query))
        return int(client[db][coll].estimated_document_count())
    except CdcError:
        raise
    except PyMongoError:  # a count is only for display; the copy itself reports real errors
        return None


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

_END = object()


@dataclass(frozen=True, slots=True)
class _Unit:
    """A piece of work: one collection, or one ``_id`` range of a split collection."""

    namespace: str
    query: dict[str, Any]


_NUMBER_TYPES = (int, float, Int64, Decimal128)


def _id_bracket(value: Any) -> type | None:
    """The BSON comparison bracket of an ``_id`` when ranges over it are safe, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, _NUMBER_TYPES):
        return int
    if isinstance(value, (str, ObjectId, datetime.datetime)):
        return type(value)
    return None


class SnapshotCopier:
    """Copies collections with up to ``threads`` workers and hands chunks to ``emit`` in order.

    ``emit`` is called under one lock, so chunks reach it in the order their markers describe;
    it returns False to stop the copy (engine stopping). Markers: the first record delivered is
    ``first``; the final record of the collection that finishes last is ``last``.

    With more threads than collections, a collection of at least ``split_min_documents`` is
    split into ``_id`` ranges copied in parallel. Ranges are only used when the smallest and the
    largest ``_id`` share one comparison bracket (number, string, ObjectId, date): MongoDB sorts
    by type first, so then every ``_id`` is in that bracket and the ranges cover all documents.
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
        filters: dict[str, dict[str, Any] | None] | None = None,
        stop: threading.Event | None = None,
        split_min_documents: int = 20_000,
    ) -> None:
        self.client = client
        self.cfg = cfg
        self.emit = emit
        self.max_threads = max(1, threads)
        self.fetch_size = int(cfg.snapshot_fetch_size or 0)
        self.chunk_size = max(1, self.fetch_size or chunk_size)
        self.filters = filters if filters is not None else {ns: collection_filter(cfg, ns) for ns in collections}
        self.stop = stop or threading.Event()
        self.split_min_documents = split_min_documents
        self._collections = list(collections)
        self._pending: list[_Unit] = []
        self._parts_left: dict[str, int] = {}
        self._started: set[str] = set()
        self._active = 0
        self._emitted_any = False
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []

    def run(self) -> bool:
        """Copy everything; True when complete, False when stopped. Re-raises a worker's error."""
        spare = self.max_threads // max(1, len(self._collections))
        for namespace in self._collections:
            units = self._split(namespace, spare) if spare > 1 else [self._unit(namespace, None)]
            self._pending.extend(units)
            self._parts_left[namespace] = len(units)
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
        return not self.stop.is_set()

    def _unit(self, namespace: str, id_range: dict[str, Any] | None) -> _Unit:
        base = self.filters.get(namespace) or {}
        if id_range is None:
            return _Unit(namespace, base)
        query = {"_id": id_range}
        return _Unit(namespace, {"$and": [base, query]} if base else query)

    def _split(self, namespace: str, parts: int) -> list[_Unit]:
        """``_id`` ranges of about equal size, or the whole collection when splitting is unsafe."""
        db, _, coll = namespace.partition(".")
        collection = self.client[db][coll]
        count = collection.estimated_document_count()
        if count < self.split_min_documents:
            return [self._unit(namespace, None)]
        lowest = collection.find_one({}, {"_id": 1}, sort=[("_id", 1)])
        highest = collection.find_one({}, {"_id": 1}, sort=[("_id", -1)])
        if lowest is None or highest is None:
            return [self._unit(namespace, None)]
        bracket = _id_bracket(lowest["_id"])
        if bracket is None or bracket is not _id_bracket(highest["_id"]):
            return [self._unit(namespace, None)]
        bounds: list[Any] = []
        for k in range(1, parts):
            found = collection.find_one({}, {"_id": 1}, sort=[("_id", 1)], skip=k * count // parts)
            if found is not None and (not bounds or found["_id"] > bounds[-1]):
                bounds.append(found["_id"])
        if not bounds:
            return [self._unit(namespace, None)]
        ranges: list[dict[str, Any]] = [{"$lt": bounds[0]}]
        ranges += [{"$gte": lo, "$lt": hi} for lo, hi in zip(bounds, bounds[1:], strict=False)]
        ranges.append({"$gte": bounds[-1]})
        return [self._unit(namespace, r) for r in ranges]

    def _claim(self) -> _Unit | None:
        with self._lock:
            if not self._pending or self.stop.is_set() or self._errors:
                return None
            self._active += 1
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
        db, _, coll = unit.namespace.partition(".")
        cursor = self.client[db][coll].find(unit.query, batch_size=self.fetch_size)
        try:
            it = iter(cursor)
            batch: list[dict[str, Any]] = []
            current = next(it, _END)
            if current is _END:
                self._deliver(unit.namespace, [], part_done=True)
                return
            while current is not _END:
                if self.stop.is_set():
                    return
                following = next(it, _END)
                batch.append(current)  # type: ignore[arg-type]
                if following is _END or len(batch) >= self.chunk_size:
                    if not self._deliver(unit.namespace, batch, part_done=following is _END):
                        return
                    batch = []
                current = following
        finally:
            cursor.close()

    def _deliver(self, namespace: str, docs: list[dict[str, Any]], *, part_done: bool) -> bool:
        with self._lock:
            final = part_done and self._parts_left[namespace] == 1  # the collection is complete
            last_collection = final and self._active == 1 and not self._pending
            first_chunk = bool(docs) and namespace not in self._started
            first_collection = first_chunk and not self._emitted_any
            markers = [MARK_TRUE] * len(docs)
            if docs:
                n = len(docs)
                for i in (0, n - 1):
                    markers[i] = snapshot_marker(
                        first_collection, last_collection, first_chunk and i == 0, final and i == n - 1
                    )
                self._emitted_any = True
                self._started.add(namespace)
            if part_done:
                self._active -= 1
                self._parts_left[namespace] -= 1
            accepted = self.emit(SnapshotChunk(namespace, docs, markers, final))
            if not accepted:
                self.stop.set()  # the receiver is stopping: the copy is incomplete
            return accepted
