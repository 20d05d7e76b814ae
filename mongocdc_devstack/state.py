"""The emulator's data: catalog, documents, indexes, pre/post images, transactions.

One ``ServerState`` holds everything a mongod would keep on disk. Every mutation happens while
holding ``oplog.cond`` so the order of the oplog is the order in which writes were applied, and
every applied write produces its oplog entry (mongod 7.0 layout, see the emulator contract) and,
when ``--dbpath`` is set, a journal record flushed before the reply is sent.

Stored documents are never modified in place: an update builds a new dict. Cursors can therefore
hold plain references to documents as a consistent snapshot of what they matched. Each document is
kept with its BSON encoding so that ``find`` replies are assembled from bytes without re-encoding.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import bson
from bson import Int64, ObjectId, Timestamp
from bson.binary import Binary

from . import matching, oplog_diff
from .errors import (
    BAD_VALUE,
    BSON_OBJECT_TOO_LARGE,
    DUPLICATE_KEY,
    ILLEGAL_OPERATION,
    INVALID_NAMESPACE,
    INVALID_OPTIONS,
    NAMESPACE_EXISTS,
    NAMESPACE_NOT_FOUND,
    NO_SUCH_TRANSACTION,
    TRANSACTION_COMMITTED,
    CommandError,
    command_error,
)
from .oplog import Oplog, ts_key
from .snapshot_history import History
from .wire import MAX_BSON_OBJECT_SIZE

IdKey = tuple[Any, ...]
Fold = Callable[[Any], Any]  # a collation's string folding (matching.collation_key)
StoredDoc = tuple[dict[str, Any], bytes]  # the document and its BSON encoding

INDEX_NOT_FOUND = (27, "IndexNotFound")
INDEX_OPTIONS_CONFLICT = (85, "IndexOptionsConflict")
INDEX_KEY_SPECS_CONFLICT = (86, "IndexKeySpecsConflict")
TRANSACTION_TOO_OLD = (225, "TransactionTooOld")
CONFLICTING_OPERATION_IN_PROGRESS = (217, "ConflictingOperationInProgress")
WRITE_CONFLICT = (112, "WriteConflict")
OPERATION_NOT_SUPPORTED_IN_TRANSACTION = (263, "OperationNotSupportedInTransaction")

ID_INDEX: dict[str, Any] = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
SYSTEM_DATABASES = ("admin", "config", "local")


def id_key(value: Any) -> IdKey:
    """The hashable identity of an ``_id`` (equal for values mongod treats as equal)."""
    if isinstance(value, ObjectId):
        return (8, value.binary)
    return matching.bson_sort_key(value)


_EPOCH = datetime.datetime(1970, 1, 1)


def now_ms() -> datetime.datetime:
    """The current UTC time (naive) at millisecond precision, as BSON dates carry it."""
    return _EPOCH + datetime.timedelta(milliseconds=time.time_ns() // 1_000_000)


def format_value(value: Any) -> str:
    """A value the way mongod prints it in error messages (``{ name: "x" }``)."""
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, ObjectId):
        return f"ObjectId('{value}')"
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[ " + ", ".join(format_value(v) for v in value) + " ]"
    if isinstance(value, datetime.datetime):
        return f"new Date({matching.bson_sort_key(value)[1]})"
    return str(value)


def check_namespace(db: str, coll: str | None = None) -> None:
    """mongod's rules for database and collection names."""
    if not db or any(ch in db for ch in '/\\. "$\x00') or len(db) > 63:
        raise command_error(INVALID_NAMESPACE, f"Invalid database name: '{db}'")
    if coll is not None:
        if not coll or coll.startswith(".") or "$" in coll or "\x00" in coll:
            raise command_error(INVALID_NAMESPACE, f"Invalid collection name: {coll}")


@dataclass
class Index:
    """A secondary (or ``_id``) index; unique ones keep their entries to enforce uniqueness."""

    spec: dict[str, Any]  # as listIndexes shows it: v, key, name, unique, ...
    entries: dict[IdKey, IdKey] = field(default_factory=dict)  # index key -> document id key

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def unique(self) -> bool:
        return bool(self.spec.get("unique"))

    def key_of(self, doc: Mapping[str, Any]) -> IdKey | None:
        """The index key of a document, or None when a sparse/partial index skips it."""
        pattern = self.spec["key"]
        partial = self.spec.get("partialFilterExpression")
        if partial and not matching.matches(partial, doc):
            return None
        values = []
        present = False
        for path in pattern:
            value = matching.get_path(doc, path)
            if value is matching._MISSING:
                value = None
            else:
                present = True
            values.append(matching.bson_sort_key(value))
        if self.spec.get("sparse") and not present:
            return None
        return tuple(values)

    def key_values(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        result = {}
        for path in self.spec["key"]:
            value = matching.get_path(doc, path)
            result[path] = None if value is matching._MISSING else value
        return result


class Collection:
    """One collection: documents in insertion order, catalog options and indexes."""

    def __init__(self, db: str, name: str, ui: uuid.UUID, options: dict[str, Any]) -> None:
        self.db = db
        self.name = name
        self.uuid = ui
        self.options = options
        self.docs: dict[IdKey, StoredDoc] = {}
        self.indexes: dict[str, Index] = {"_id_": Index(dict(ID_INDEX))}
        self._sorted_ids: list[IdKey] | None = None  # the _id index, built on first range read

    def sorted_ids(self) -> list[IdKey]:
        """Document ids in BSON order (the ``_id`` index), kept up to date once built."""
        if self._sorted_ids is None:
            self._sorted_ids = sorted(self.docs)
        return self._sorted_ids

    @property
    def ns(self) -> str:
        return f"{self.db}.{self.name}"

    @property
    def uuid(self) -> uuid.UUID:
        return self._uuid

    @uuid.setter
    def uuid(self, value: uuid.UUID) -> None:
        self._uuid = value
        self._ui = Binary.from_uuid(value)

    @property
    def ui(self) -> Binary:
        """The uuid as oplog entries carry it (BSON binary subtype 4)."""
        return self._ui

    def clone(self) -> Collection:
        """A copy sharing the (immutable) documents: a transaction's private view."""
        other = Collection(self.db, self.name, self.uuid, dict(self.options))
        other.docs = dict(self.docs)
        other.indexes = {name: Index(dict(ix.spec), dict(ix.entries)) for name, ix in self.indexes.items()}
        return other

    def check_unique(self, doc: Mapping[str, Any], key: IdKey) -> None:
        """Raise mongod's DuplicateKey error if ``doc`` (stored under ``key``) violates an index."""
        for index in self.indexes.values():
            if index.name == "_id_":
                existing = self.docs.get(key)
                if existing is not None:
                    self._duplicate(index, doc)
                continue
            if not index.unique:
                continue
            ikey = index.key_of(doc)
            if ikey is not None:
                owner = index.entries.get(ikey)
                if owner is not None and owner != key:
                    self._duplicate(index, doc)

    def check_unique_replacement(self, doc: Mapping[str, Any], key: IdKey) -> None:
        for index in self.indexes.values():
            if not index.unique or index.name == "_id_":
                continue
            ikey = index.key_of(doc)
            if ikey is not None:
                owner = index.entries.get(ikey)
                if owner is not None and owner != key:
                    self._duplicate(index, doc)

    def _duplicate(self, index: Index, doc: Mapping[str, Any]) -> None:
        values = index.key_values(doc)
        raise DuplicateKeyError(
            f"E11000 duplicate key error collection: {self.ns} index: {index.name} dup key: {format_value(values)}",
            dict(index.spec["key"]),
            values,
        )

    def put(self, key: IdKey, stored: StoredDoc) -> None:
        """Store a document (insert or replace), maintaining unique index entries."""
        old = self.docs.get(key)
        for index in self.indexes.values():
            if index.unique and index.name != "_id_":
                if old is not None:
                    okey = index.key_of(old[0])
                    if okey is not None and index.entries.get(okey) == key:
                        del index.entries[okey]
                nkey = index.key_of(stored[0])
                if nkey is not None:
                    index.entries[nkey] = key
        if old is None and self._sorted_ids is not None:
            if not self._sorted_ids or key > self._sorted_ids[-1]:
                self._sorted_ids.append(key)
            else:
                bisect.insort(self._sorted_ids, key)
        self.docs[key] = stored

    def remove(self, key: IdKey) -> StoredDoc | None:
        old = self.docs.pop(key, None)
        if old is not None:
            if self._sorted_ids is not None:
                position = bisect.bisect_left(self._sorted_ids, key)
                if position < len(self._sorted_ids) and self._sorted_ids[position] == key:
                    del self._sorted_ids[position]
            for index in self.indexes.values():
                if index.unique and index.name != "_id_":
                    okey = index.key_of(old[0])
                    if okey is not None and index.entries.get(okey) == key:
                        del index.entries[okey]
        return old

    def build_index(self, index: Index) -> None:
        """Populate a new unique index, failing like mongod on existing duplicates."""
        if not index.unique or index.name == "_id_":
            return
        for key, (doc, _) in self.docs.items():
            ikey = index.key_of(doc)
            if ikey is None:
                continue
            if ikey in index.entries:
                values = index.key_values(doc)
                raise DuplicateKeyError(
                    f"Index build failed: {self.uuid}: Collection {self.ns} ( {self.uuid} ) :: caused by :: "
                    f"E11000 duplicate key error collection: {self.ns} index: {index.name} dup key: {format_value(values)}",
                    dict(index.spec["key"]),
                    values,
                )
            index.entries[ikey] = key

    def rebuild_unique_indexes(self) -> None:
        """Recompute unique index entries after documents were swapped in wholesale (a snapshot view)."""
        for index in self.indexes.values():
            if index.unique and index.name != "_id_":
                index.entries = {}
                self.build_index(index)

    def catalog_entry(self) -> dict[str, Any]:
        return {
            "db": self.db,
            "name": self.name,
            "uuid": Binary.from_uuid(self.uuid),
            "options": self.options,
            "indexes": [ix.spec for ix in self.indexes.values()],
        }


class DuplicateKeyError(CommandError):
    """E11000 with the ``keyPattern``/``keyValue`` mongod adds to the write error."""

    def __init__(self, errmsg: str, key_pattern: dict[str, Any], key_value: dict[str, Any]) -> None:
        super().__init__(DUPLICATE_KEY[0], DUPLICATE_KEY[1], errmsg)
        self.key_pattern = key_pattern
        self.key_value = key_value

    def to_reply(self) -> dict[str, Any]:
        reply = super().to_reply()
        reply["keyPattern"] = self.key_pattern
        reply["keyValue"] = self.key_value
        return reply


class DocumentValidationError(CommandError):
    """DocumentValidationFailure (121) with the ``errInfo`` mongod attaches to the write error."""

    def __init__(self, document_id: Any) -> None:
        super().__init__(121, "DocumentValidationFailure", "Document failed validation")
        self.document_id = document_id

    def to_reply(self) -> dict[str, Any]:
        reply = super().to_reply()
        reply["errInfo"] = {"failingDocumentId": self.document_id, "details": {"operatorName": "$and", "clausesNotSatisfied": []}}
        return reply


DOLLAR_PREFIXED_FIELD_NAME = (52, "DollarPrefixedFieldName")
# mongod's errors for documents over 16 MiB produced by an update or an upsert (not an insert).
UPDATE_TOO_LARGE = (17419, "Location17419")
UPSERT_TOO_LARGE = (17420, "Location17420")


def encode_document(doc: Mapping[str, Any]) -> bytes:
    raw = bson.encode(doc)
    if len(raw) > MAX_BSON_OBJECT_SIZE:
        raise command_error(BSON_OBJECT_TOO_LARGE, f"object to insert too large. size in bytes: {len(raw)}, max size: {MAX_BSON_OBJECT_SIZE}")
    return raw


def encode_updated(doc: Mapping[str, Any]) -> bytes:
    """The BSON of an update's result; too large is 17419, as mongod's update stage reports it."""
    raw = bson.encode(doc)
    if len(raw) > MAX_BSON_OBJECT_SIZE:
        raise command_error(UPDATE_TOO_LARGE, f"Resulting document after update is larger than {MAX_BSON_OBJECT_SIZE}")
    return raw


@dataclass
class _Effect:
    """One document change of a transaction, replayed onto the real collection at commit."""

    db: str
    coll: str
    key: IdKey | None
    stored: StoredDoc | None  # None: delete
    created: Collection | None = None  # a collection the transaction created (key and stored unused)


@dataclass
class Transaction:
    """A multi-document transaction of one session: private collection copies and its operations."""

    lsid: dict[str, Any]
    txn_number: int
    state: str = "in_progress"  # in_progress | committed | aborted
    collections: dict[tuple[str, str], Collection] = field(default_factory=dict)
    ops: list[dict[str, Any]] = field(default_factory=list)
    effects: list[_Effect] = field(default_factory=list)
    images: list[tuple[uuid.UUID, int, dict[str, Any] | None, dict[str, Any] | None]] = field(default_factory=list)
    commit_ts: Timestamp | None = None
    touched: set[tuple[str, str, IdKey]] = field(default_factory=set)
    snapshot_ts: Timestamp = field(default_factory=lambda: Timestamp(0, 0))  # reads see the data as of this time


@dataclass
class Session:
    lsid: dict[str, Any]
    txn_number: int = -1
    txn: Transaction | None = None
    retry_replies: dict[int, dict[str, Any]] = field(default_factory=dict)
    # What each statement of the current retryable write contributed, by statement index: a retry
    # after a dropped connection replays these instead of writing again (mongod's executed stmtIds).
    executed: dict[int, dict[str, Any]] = field(default_factory=dict)


class ServerState:
    """Catalog, documents, images and sessions of the emulated replica set member.

    Implements the change stream host protocol (``collection_uuid``, ``collection_options``,
    ``lookup_document``, ``change_stream_images``, ``run_pipeline``).
    """

    def __init__(self, oplog: Oplog) -> None:
        self.oplog = oplog
        self.lock = oplog.cond
        self.term = 1
        self.catalog: dict[str, dict[str, Collection]] = {}
        # (collection uuid, ts key, applyOps index) -> (pre, post) with their BSON; insertion order is ts order
        self.images: OrderedDict[tuple[uuid.UUID, tuple[int, int], int], tuple[StoredDoc | None, StoredDoc | None]] = OrderedDict()
        self.sessions: dict[bytes, Session] = {}
        self.history = History()
        self.history.start(oplog.clock.current())
        # Documents written by open transactions: a second writer gets (or causes) a WriteConflict.
        self.txn_owners: dict[tuple[str, str, IdKey], Transaction] = {}
        self.journal: Callable[[dict[str, Any]], None] | None = None
        self.flush_journal: Callable[[], None] = lambda: None
        self._batch: list[dict[str, Any]] | None = None

    # ---------------------------------------------------------------------------------------
    # host protocol for change streams
    # ---------------------------------------------------------------------------------------
    def collection_uuid(self, db: str, coll: str) -> uuid.UUID | None:
        with self.lock:
            found = self.catalog.get(db, {}).get(coll)
            return found.uuid if found is not None else None

    def collection_options(self, db: str, coll: str) -> dict[str, Any]:
        with self.lock:
            found = self.catalog.get(db, {}).get(coll)
            return dict(found.options) if found is not None else {}

    def lookup_document(self, db: str, coll: str, document_key: dict[str, Any]) -> dict[str, Any] | None:
        # Lock-free (a change stream calls it per event): single dict reads are atomic, and stored
        # documents are never modified in place, so whatever is read is a consistent version.
        found = self.catalog.get(db, {}).get(coll)
        if found is None or "_id" not in document_key:
            return None
        stored = found.docs.get(id_key(document_key["_id"]))
        if stored is None:
            return None
        doc = stored[0]
        for path, value in document_key.items():
            if path != "_id" and not matching._values_equal(matching.get_path(doc, path), value):
                return None
        return doc

    def lookup_document_bson(self, db: str, coll: str, document_key: dict[str, Any]) -> bytes | None:
        """``lookup_document`` as its stored BSON (an event splices it in without encoding it again)."""
        found = self.catalog.get(db, {}).get(coll)
        if found is None or "_id" not in document_key:
            return None
        stored = found.docs.get(id_key(document_key["_id"]))
        if stored is None:
            return None
        for path, value in document_key.items():
            if path != "_id" and not matching._values_equal(matching.get_path(stored[0], path), value):
                return None
        return stored[1]

    def change_stream_images(self, ui: uuid.UUID, ts: Timestamp, index: int) -> tuple[dict[str, Any] | None, dict[str, Any] | None] | None:
        found = self.images.get((ui, ts_key(ts), index))  # one atomic dict read, as lookup_document
        if found is None:
            return None
        pre, post = found
        return (pre[0] if pre is not None else None, post[0] if post is not None else None)

    def change_stream_images_bson(self, ui: uuid.UUID, ts: Timestamp, index: int) -> tuple[bytes | None, bytes | None] | None:
        """The images as their stored BSON, which an event copies instead of encoding again."""
        found = self.images.get((ui, ts_key(ts), index))
        if found is None:
            return None
        pre, post = found
        return (pre[1] if pre is not None else None, post[1] if post is not None else None)

    def run_pipeline(self, docs: list[dict[str, Any]], stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return matching.run_pipeline(docs, stages)

    # ---------------------------------------------------------------------------------------
    # catalog
    # ---------------------------------------------------------------------------------------
    def get_collection(self, db: str, coll: str, txn: Transaction | None = None) -> Collection | None:
        """The collection as the caller sees it (a transaction sees its own snapshot)."""
        with self.lock:
            if txn is not None:
                view = txn.collections.get((db, coll))
                if view is not None:
                    return view
                base = self.catalog.get(db, {}).get(coll)
                if base is None:
                    return None
                view = self.history.as_of(base, txn.snapshot_ts)  # the data as of the transaction's start
                if view is base:
                    view = base.clone()
                txn.collections[(db, coll)] = view
                return view
            return self.catalog.get(db, {}).get(coll)

    def database_names(self) -> list[str]:
        with self.lock:
            return [name for name, colls in self.catalog.items() if colls]

    def collections(self, db: str) -> list[Collection]:
        with self.lock:
            return list(self.catalog.get(db, {}).values())

    def _journal(self, record: dict[str, Any]) -> None:
        if self.journal is not None:
            self.journal(record)

    def _next_ts(self) -> Timestamp:
        return self.oplog.clock.next()

    def _entry(self, ts: Timestamp, op: str, ns: str, o: dict[str, Any], ui: Binary | None = None,
               o2: dict[str, Any] | None = None, from_migrate: bool = False) -> dict[str, Any]:  # fmt: skip
        entry: dict[str, Any] = {"op": op, "ns": ns}
        if ui is not None:
            entry["ui"] = ui
        entry["o"] = o
        if o2 is not None:
            entry["o2"] = o2
        if from_migrate:
            entry["fromMigrate"] = True
        entry.update(ts=ts, t=Int64(self.term), v=Int64(2), wall=now_ms())
        return entry

    def _append(self, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            self._journal({"k": "oplog", "e": entry})
        if self._batch is not None:
            self._batch.extend(entries)
            return
        self.oplog.append(entries)
        self._prune_images()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Hold the lock for a whole write command and append its oplog entries in one go
        (readers wait on the same lock, so they see the same order either way)."""
        with self.lock:
            if self._batch is not None:
                yield
                return
            self._batch = []
            try:
                yield
            finally:
                entries, self._batch = self._batch, None
                if entries:
                    self.oplog.append(entries)
                    self._prune_images()
                self.flush_journal()

    def _prune_images(self) -> None:
        first = self.oplog.first_ts()
        if first is None or not self.images:
            return
        limit = ts_key(first)
        while self.images:
            key = next(iter(self.images))
            if key[1] >= limit:
                break
            self.images.popitem(last=False)

    def _record_images(self, coll: Collection, ts: Timestamp, index: int,
                       pre: StoredDoc | dict[str, Any] | None, post: StoredDoc | dict[str, Any] | None) -> None:  # fmt: skip
        """Keep a change's pre/post images with their BSON (encoded here when not at hand), so the
        change streams reading them copy bytes."""
        pre_stored = pre if isinstance(pre, tuple) or pre is None else (pre, bson.encode(pre))
        post_stored = post if isinstance(post, tuple) or post is None else (post, bson.encode(post))
        self.images[(coll.uuid, ts_key(ts), index)] = (pre_stored, post_stored)
        pre, post = (pre_stored[0] if pre_stored else None), (post_stored[0] if post_stored else None)
        self._journal({"k": "img", "ui": Binary.from_uuid(coll.uuid), "ts": ts, "i": index, "pre": pre, "post": post})

    def _create_collection(self, db: str, name: str, options: dict[str, Any], ui: uuid.UUID | None = None) -> Collection:
        coll = Collection(db, name, ui or uuid.uuid4(), options)
        self.catalog.setdefault(db, {})[name] = coll
        self._journal({"k": "coll", **coll.catalog_entry()})
        return coll

    def _journal_catalog(self, coll: Collection) -> None:
        self._journal({"k": "coll", **coll.catalog_entry()})

    def create_collection(self, db: str, name: str, options: dict[str, Any], implicit: bool = False,
                          txn: Transaction | None = None) -> Collection:  # fmt: skip
        """``create`` (explicit) or the implicit creation on first insert, with its oplog entry."""
        check_namespace(db, name)
        with self.lock:
            if txn is not None:
                existing = self.get_collection(db, name, txn)
                if existing is not None:
                    if implicit:
                        return existing
                    raise command_error(NAMESPACE_EXISTS, f"Collection {db}.{name} already exists.")
                return self._create_in_transaction(db, name, options, txn)
            if name in self.catalog.get(db, {}):
                existing = self.catalog[db][name]
                if implicit:
                    return existing
                if existing.options == options:
                    return existing  # mongod 7.0: same options -> ok
                raise command_error(NAMESPACE_EXISTS, f"Collection {db}.{name} already exists with different options")
            coll = self._create_collection(db, name, options)
            o: dict[str, Any] = {"create": name, **options}
            o["idIndex"] = dict(ID_INDEX)
            self._append([self._entry(self._next_ts(), "c", f"{db}.$cmd", o, ui=coll.ui)])
            self.flush_journal()
            return coll

    def _create_in_transaction(self, db: str, name: str, options: dict[str, Any], txn: Transaction) -> Collection:
        """mongod 4.4+: a collection created in a transaction exists for others once the transaction
        commits; its ``create`` entry is part of the transaction's applyOps."""
        coll = Collection(db, name, uuid.uuid4(), dict(options))
        txn.collections[(db, name)] = coll
        txn.effects.append(_Effect(db, name, None, None, created=coll))
        txn.ops.append({"op": "c", "ns": f"{db}.$cmd", "ui": coll.ui, "o": {"create": name, **options, "idIndex": dict(ID_INDEX)}})
        return coll

    def _require(self, db: str, name: str) -> Collection:
        coll = self.catalog.get(db, {}).get(name)
        if coll is None:
            raise command_error(NAMESPACE_NOT_FOUND, f"ns does not exist: {db}.{name}")
        return coll

    def drop_collection(self, db: str, name: str, from_migrate: bool = False) -> int | None:
        """Drop a collection; returns its index count (None if it did not exist).

        ``from_migrate``: a sharded cluster's participant copy, whose entry change streams skip
        (only one shard reports the drop, as in a sharded MongoDB).
        """
        with self.lock:
            coll = self.catalog.get(db, {}).get(name)
            if coll is None:
                return None
            del self.catalog[db][name]
            if not self.catalog[db]:
                del self.catalog[db]
            self._journal({"k": "drop", "db": db, "name": name})
            ts = self._next_ts()
            self.history.record_catalog(ts, db, name, coll, started=False)
            self._append([self._entry(ts, "c", f"{db}.$cmd", {"drop": name}, ui=coll.ui, from_migrate=from_migrate)])
            self.flush_journal()
            return len(coll.indexes)

    def drop_database(self, db: str) -> None:
        with self.lock:
            if db not in self.catalog:
                return
            colls = list(self.catalog.get(db, {}))
            for name in colls:
                coll = self.catalog[db].pop(name)
                self._journal({"k": "drop", "db": db, "name": name})
                ts = self._next_ts()
                self.history.record_catalog(ts, db, name, coll, started=False)
                self._append([self._entry(ts, "c", f"{db}.$cmd", {"drop": name}, ui=coll.ui)])
            self.catalog.pop(db, None)
            self._append([self._entry(self._next_ts(), "c", f"{db}.$cmd", {"dropDatabase": 1})])
            self.flush_journal()

    def rename_collection(self, source: str, target: str, drop_target: bool, stay_temp: bool = False) -> None:
        """``renameCollection`` within or across databases (cross-db keeps mongod's single entry)."""
        sdb, _, sname = source.partition(".")
        tdb, _, tname = target.partition(".")
        check_namespace(sdb, sname)
        check_namespace(tdb, tname)
        with self.lock:
            coll = self.catalog.get(sdb, {}).get(sname)
            if coll is None:
                raise command_error(NAMESPACE_NOT_FOUND, "source namespace does not exist")
            if source == target:
                raise command_error(ILLEGAL_OPERATION, "Can't rename a collection to itself")
            existing = self.catalog.get(tdb, {}).get(tname)
            if existing is not None:
                if not drop_target:
                    raise command_error(NAMESPACE_EXISTS, "target namespace exists")
                del self.catalog[tdb][tname]
                self._journal({"k": "drop", "db": tdb, "name": tname})
            del self.catalog[sdb][sname]
            if not self.catalog[sdb]:
                del self.catalog[sdb]
            if sdb != tdb:
                coll.uuid = uuid.uuid4()  # cross-database rename copies into a new collection
            coll.db, coll.name = tdb, tname
            self.catalog.setdefault(tdb, {})[tname] = coll
            self._journal({"k": "rename", "from": source, "to": target, "uuid": Binary.from_uuid(coll.uuid)})
            o: dict[str, Any] = {"renameCollection": source, "to": target, "stayTemp": stay_temp}
            ts = self._next_ts()
            if existing is not None:
                o["dropTarget"] = existing.ui  # mongod 7.0 logs it only when a target was dropped
                self.history.record_catalog(ts, tdb, tname, existing, started=False)
            self.history.record_catalog(ts, sdb, sname, coll, started=False)
            self.history.record_catalog(ts, tdb, tname, coll, started=True)
            self._append([self._entry(ts, "c", f"{sdb}.$cmd", o, ui=coll.ui)])
            self.flush_journal()

    def coll_mod(self, db: str, name: str, changes: dict[str, Any]) -> None:
        with self.lock:
            coll = self._require(db, name)
            coll.options = {**coll.options, **changes}
            self._journal_catalog(coll)
            self._append([self._entry(self._next_ts(), "c", f"{db}.$cmd", {"collMod": name, **changes}, ui=coll.ui)])
            self.flush_journal()

    def create_indexes(self, db: str, name: str, specs: list[dict[str, Any]],
                       txn: Transaction | None = None) -> tuple[int, int, bool]:  # fmt: skip
        """Create indexes; returns (indexes before, after, whether the collection was created)."""
        with self.lock:
            if txn is not None:
                existing = self.get_collection(db, name, txn)
                if existing is not None and not any(e.created is existing for e in txn.effects):
                    raise command_error(
                        OPERATION_NOT_SUPPORTED_IN_TRANSACTION,
                        f"Cannot create new indexes on existing collection {db}.{name} in a multi-document transaction.",
                    )
                created = existing is None
                coll = existing or self._create_in_transaction(db, name, {}, txn)
            else:
                created = name not in self.catalog.get(db, {})
                coll = self.create_collection(db, name, {}, implicit=True)
            before = len(coll.indexes)
            for spec in specs:
                index = Index(spec)
                same_name = coll.indexes.get(index.name)
                same_key = next((ix for ix in coll.indexes.values() if ix.spec["key"] == spec["key"]), None)
                if same_name is not None:
                    if same_name.spec != spec:
                        if same_name.spec["key"] != spec["key"]:
                            raise command_error(
                                INDEX_KEY_SPECS_CONFLICT,
                                f"An existing index has the same name as the requested index. When index names are not specified, "
                                f"they are auto generated and can cause conflicts. Please refer to our documentation. "
                                f"Requested index: {format_value(spec)}, existing index: {format_value(same_name.spec)}",
                            )
                        raise command_error(
                            INDEX_OPTIONS_CONFLICT,
                            f"An equivalent index already exists with the same name but different options. "
                            f"Requested index: {format_value(spec)}, existing index: {format_value(same_name.spec)}",
                        )
                    continue
                if same_key is not None and same_key.spec.get("unique", False) == spec.get("unique", False):
                    raise command_error(
                        INDEX_OPTIONS_CONFLICT,
                        f"Index already exists with a different name: {same_key.name}",
                    )
                coll.build_index(index)
                coll.indexes[index.name] = index
                if txn is not None:
                    txn.ops.append({"op": "c", "ns": f"{db}.$cmd", "ui": coll.ui, "o": {"createIndexes": name, **spec}})
                    continue
                self._journal_catalog(coll)
                self._append([self._entry(self._next_ts(), "c", f"{db}.$cmd", {"createIndexes": name, **spec}, ui=coll.ui)])
            self.flush_journal()
            return before, len(coll.indexes), created

    def drop_indexes(self, db: str, name: str, which: Any) -> int:
        with self.lock:
            coll = self._require(db, name)
            before = len(coll.indexes)
            if which == "*":
                targets = [n for n in coll.indexes if n != "_id_"]
            elif isinstance(which, list):
                targets = list(which)
            elif isinstance(which, str):
                targets = [which]
            elif isinstance(which, Mapping):
                found = [n for n, ix in coll.indexes.items() if ix.spec["key"] == dict(which)]
                if not found:
                    raise command_error(INDEX_NOT_FOUND, f"can't find index with key: {format_value(dict(which))}")
                targets = found
            else:
                raise command_error(BAD_VALUE, "'index' must be a string, an array of strings or an object")
            for target in targets:
                if target == "_id_":
                    raise command_error(INVALID_OPTIONS, "cannot drop _id index")
                if target not in coll.indexes:
                    raise command_error(INDEX_NOT_FOUND, f"index not found with name [{target}]")
            for target in targets:
                del coll.indexes[target]
                self._journal_catalog(coll)
                self._append([self._entry(self._next_ts(), "c", f"{db}.$cmd", {"dropIndexes": name, "index": target}, ui=coll.ui)])
            self.flush_journal()
            return before

    # ---------------------------------------------------------------------------------------
    # document writes
    # ---------------------------------------------------------------------------------------
    def _write_target(self, db: str, name: str, txn: Transaction | None) -> Collection:
        if txn is None:
            existing = self.catalog.get(db, {}).get(name)
            if existing is not None:
                return existing
        check_namespace(db, name)
        if db == "local" or name.startswith("system."):
            raise command_error(INVALID_NAMESPACE, f"cannot write to '{db}.{name}'")
        if txn is not None:
            return self.create_collection(db, name, {}, implicit=True, txn=txn)
        if name not in self.catalog.get(db, {}):
            self.create_collection(db, name, {}, implicit=True)
        target = self.get_collection(db, name, txn)
        assert target is not None
        return target

    def _images_enabled(self, coll: Collection) -> bool:
        setting = coll.options.get("changeStreamPreAndPostImages")
        return isinstance(setting, Mapping) and bool(setting.get("enabled"))

    def _emit(self, txn: Transaction | None, coll: Collection, op: str, o: dict[str, Any], o2: dict[str, Any] | None,
              key: IdKey, stored: StoredDoc | None, pre: dict[str, Any] | None, pre_stored: StoredDoc | None = None) -> None:  # fmt: skip
        """Record one applied document change: oplog entry + journal now, or into the transaction."""
        images = self._images_enabled(coll) and op in ("u", "d")
        post = stored[0] if stored is not None else None
        if txn is not None:
            txn.effects.append(_Effect(coll.db, coll.name, key, stored))
            op_doc: dict[str, Any] = {"op": op, "ns": coll.ns, "ui": coll.ui, "o": o}
            if o2 is not None:
                op_doc["o2"] = o2
            if images:
                txn.images.append((coll.uuid, len(txn.ops), pre, post))
            txn.ops.append(op_doc)
            return
        ts = self._next_ts()
        self.history.record(ts, coll, key, pre)
        if stored is None:
            self._journal({"k": "del", "db": coll.db, "c": coll.name, "id": pre["_id"] if pre else o["_id"]})
        else:
            self._journal({"k": "put", "db": coll.db, "c": coll.name, "d": stored[1]})
        if images:
            self._record_images(coll, ts, 0, pre_stored if pre_stored is not None and pre_stored[0] is pre else pre, stored)
        self._append([self._entry(ts, op, coll.ns, o, ui=coll.ui, o2=o2)])

    def insert_one(self, db: str, name: str, doc: dict[str, Any], txn: Transaction | None,
                   bypass_validation: bool = False) -> dict[str, Any]:  # fmt: skip
        """Insert a document (``_id`` generated at the front when missing).

        Field names may start with ``$`` or contain dots (mongod 5.0+), except inside ``_id``.
        """
        if "_id" not in doc:
            doc = {"_id": ObjectId(), **doc}
        elif next(iter(doc)) != "_id":
            doc = {"_id": doc["_id"], **{k: v for k, v in doc.items() if k != "_id"}}
        ident = doc["_id"]
        if isinstance(ident, list):
            raise command_error(BAD_VALUE, "can't use an array for _id")
        if isinstance(ident, Mapping):
            for key in ident:
                if key.startswith("$"):
                    raise command_error(DOLLAR_PREFIXED_FIELD_NAME, f"_id fields may not contain '$'-prefixed fields: {key} is not valid for storage.")
        raw = encode_document(doc)
        with self.lock:
            coll = self._write_target(db, name, txn)
            self.check_validator(coll, doc, None, bypass_validation)
            if txn is not None and coll.options.get("capped"):
                raise command_error(
                    OPERATION_NOT_SUPPORTED_IN_TRANSACTION,
                    f"Collection '{coll.ns}' is a capped collection. Writes in transactions are not allowed on capped collections.",
                )
            key = id_key(doc["_id"])
            self._check_conflict(txn, coll, key)
            coll.check_unique(doc, key)
            coll.put(key, (doc, raw))
            self._emit(txn, coll, "i", doc, {"_id": doc["_id"]}, key, (doc, raw), None)
            if coll.options.get("capped") and txn is None:
                self._enforce_cap(coll)
            return doc

    def check_validator(self, coll: Collection, doc: Mapping[str, Any], old: Mapping[str, Any] | None, bypass: bool) -> None:
        """The collection's ``validator`` (a query expression), as ``validationLevel``/``validationAction`` ask.

        ``moderate`` skips updates of documents that did not pass before; ``warn`` only logs (mongod
        writes a log line); ``bypassDocumentValidation`` skips the check.
        """
        validator = coll.options.get("validator")
        if not validator or bypass or coll.options.get("validationLevel") == "off":
            return
        if coll.options.get("validationAction") == "warn":
            return
        if old is not None and coll.options.get("validationLevel") == "moderate" and not matching.matches(validator, old):
            return
        if matching.matches(validator, doc):
            return
        raise DocumentValidationError(doc.get("_id"))

    def _enforce_cap(self, coll: Collection) -> None:
        """Capped collections drop their oldest documents past ``max`` documents or ``size``
        bytes; since FCV 5.0 mongod logs these as ordinary delete entries."""
        raw_max, raw_size = coll.options.get("max"), coll.options.get("size")
        max_docs = int(raw_max) if isinstance(raw_max, (int, float)) and raw_max > 0 else 0
        max_bytes = int(raw_size) if isinstance(raw_size, (int, float)) and raw_size > 0 else 0
        total = sum(len(raw) for _, raw in coll.docs.values()) if max_bytes else 0
        while len(coll.docs) > 1:
            over_count = bool(max_docs) and len(coll.docs) > max_docs
            over_size = bool(max_bytes) and total > max_bytes
            if not (over_count or over_size):
                break
            oldest = next(iter(coll.docs))
            total -= len(coll.docs[oldest][1])
            self.delete_stored(coll, oldest, None)

    def _check_conflict(self, txn: Transaction | None, view: Collection, key: IdKey) -> None:
        """WriteConflict (a TransientTransactionError) when a transaction writes a document that
        changed outside it after its snapshot was taken, as mongod's snapshot isolation does."""
        marker = (view.db, view.name, key)
        owner = self.txn_owners.get(marker)
        if owner is not None and owner.state != "in_progress":
            del self.txn_owners[marker]
            owner = None
        if txn is None:
            if owner is not None:
                # mongod makes this write wait until the transaction ends; the emulator cannot block
                # a writer inside its lock, so the open transaction loses instead (its commit fails
                # with NoSuchTransaction, a TransientTransactionError).
                owner.state = "aborted"
                del self.txn_owners[marker]
            return
        if marker in txn.touched:
            return
        base = self.catalog.get(view.db, {}).get(view.name)
        changed = base is not None and base.docs.get(key) is not view.docs.get(key)
        if changed or (owner is not None and owner is not txn):
            txn.state = "aborted"
            raise command_error(
                WRITE_CONFLICT,
                "Write conflict during plan execution and yielding is disabled. :: Please retry your operation or multi-document transaction.",
                labels=("TransientTransactionError",),
            )
        txn.touched.add(marker)
        self.txn_owners[marker] = txn

    def replace_stored(self, coll: Collection, key: IdKey, old: dict[str, Any], new: dict[str, Any],
                       update: Any, txn: Transaction | None, diff: dict[str, Any] | None = None) -> None:  # fmt: skip
        """Store the result of an update and log it as mongod does: an operator update's logged diff,
        a pipeline's computed diff (or the whole document when that is smaller), a replacement whole."""
        raw = encode_updated(new)
        self._check_conflict(txn, coll, key)
        coll.check_unique_replacement(new, key)
        old_stored = coll.docs.get(key)
        coll.put(key, (new, raw))
        if diff is None and isinstance(update, list):
            diff = oplog_diff.compute_diff(old, new)
        if diff is None:
            o = new
        else:
            o = {"$v": 2, "diff": diff}
        self._emit(txn, coll, "u", o, {"_id": new["_id"]}, key, (new, raw), old, old_stored)

    def delete_stored(self, coll: Collection, key: IdKey, txn: Transaction | None) -> None:
        self._check_conflict(txn, coll, key)
        old = coll.remove(key)
        if old is not None:
            self._emit(txn, coll, "d", {"_id": old[0]["_id"]}, None, key, None, old[0], old)

    def update_documents(
        self, db: str, name: str, query: dict[str, Any], update: Any, *, multi: bool, upsert: bool,
        array_filters: list[dict[str, Any]] | None, txn: Transaction | None, sort: dict[str, Any] | None = None,
        collation: Fold | None = None, bypass_validation: bool = False,
    ) -> tuple[int, int, tuple[Any] | None, dict[str, Any] | None, dict[str, Any] | None]:  # fmt: skip
        """Apply one update statement; returns (n matched, n modified, (upserted _id,) or None, pre, post)."""
        matching.validate_filter(query)
        matching.validate_update(update)
        with self.lock:
            coll = self.get_collection(db, name, txn)
            candidates = self.match(coll, query, sort=sort, limit=0 if multi else 1, collation=collation) if coll is not None else []
            if not candidates:
                if not upsert:
                    return 0, 0, None, None, None
                seed = matching.upsert_seed(query)
                if isinstance(update, Mapping) and not matching.is_operator_update(update):
                    new = matching.apply_update(seed, update, is_insert=True)
                    if "_id" not in new and "_id" in seed:
                        new = {"_id": seed["_id"], **new}
                else:
                    new = matching.apply_update(seed, update, query=query, array_filters=array_filters, is_insert=True)
                if len(bson.encode(new)) > MAX_BSON_OBJECT_SIZE:
                    raise command_error(UPSERT_TOO_LARGE, f"Document to upsert is larger than {MAX_BSON_OBJECT_SIZE}")
                upserted_doc = self.insert_one(db, name, new if "_id" in new else {"_id": ObjectId(), **new}, txn, bypass_validation)
                return 0, 0, (upserted_doc["_id"],), None, upserted_doc
            modified = 0
            pre = post = None
            assert coll is not None
            for old in candidates:
                new, diff = matching.apply_update_with_diff(old, update, query=query, array_filters=array_filters)
                pre, post = old, new
                if diff == {} or (new == old and bson.encode(new) == coll.docs[id_key(old["_id"])][1]):
                    continue
                self.check_validator(coll, new, old, bypass_validation)
                self.replace_stored(coll, id_key(old["_id"]), old, new, update, txn, diff)
                modified += 1
            return len(candidates), modified, None, pre, post

    def delete_documents(self, db: str, name: str, query: dict[str, Any], limit: int, txn: Transaction | None,
                         sort: dict[str, Any] | None = None, collation: Fold | None = None) -> list[dict[str, Any]]:  # fmt: skip
        matching.validate_filter(query)
        with self.lock:
            coll = self.get_collection(db, name, txn)
            if coll is None:
                return []
            if db == "local" or name.startswith("system."):
                raise command_error(INVALID_NAMESPACE, f"cannot delete from '{db}.{name}'")
            victims = self.match(coll, query, sort=sort, limit=limit, collation=collation)
            for doc in victims:
                self.delete_stored(coll, id_key(doc["_id"]), txn)
            return victims

    # ---------------------------------------------------------------------------------------
    # chunk migration (a sharded cluster's shards; the mongos drives both sides)
    # ---------------------------------------------------------------------------------------
    def receive_collection(self, like: Collection) -> None:
        """A migration's recipient gets the donor's collection (same uuid, options and indexes) when it
        has none yet; its entries carry ``fromMigrate``, so change streams do not report them."""
        with self.lock:
            if like.name in self.catalog.get(like.db, {}):
                return
            coll = self._create_collection(like.db, like.name, dict(like.options), like.uuid)
            o: dict[str, Any] = {"create": like.name, **like.options, "idIndex": dict(ID_INDEX)}
            entries = [self._entry(self._next_ts(), "c", f"{like.db}.$cmd", o, ui=coll.ui, from_migrate=True)]
            for name, index in like.indexes.items():
                if name == "_id_":
                    continue
                built = Index(dict(index.spec))
                coll.indexes[name] = built
                entries.append(self._entry(self._next_ts(), "c", f"{like.db}.$cmd", {"createIndexes": like.name, **built.spec},
                                           ui=coll.ui, from_migrate=True))  # fmt: skip
            self._journal_catalog(coll)
            self._append(entries)
            self.flush_journal()

    def migrate_documents(self, db: str, name: str, moves: Sequence[tuple[Timestamp, IdKey, StoredDoc]], incoming: bool) -> None:
        """A migration's writes: the recipient inserts (``incoming``) or the donor deletes each
        document at the time given, as oplog entries with ``fromMigrate: true`` (mongod's migration
        and range deleter). The mongos gives both sides the same times, so a snapshot read at any
        cluster time finds each document on exactly one shard."""
        with self.batch():
            coll = self._require(db, name)
            for ts, key, stored in moves:
                doc = stored[0]
                if incoming:
                    self.history.record(ts, coll, key, None)
                    coll.put(key, stored)
                    self._journal({"k": "put", "db": db, "c": name, "d": stored[1]})
                    self._append([self._entry(ts, "i", coll.ns, doc, ui=coll.ui, o2={"_id": doc["_id"]}, from_migrate=True)])
                elif coll.remove(key) is not None:
                    self.history.record(ts, coll, key, doc)
                    self._journal({"k": "del", "db": db, "c": name, "id": doc["_id"]})
                    self._append([self._entry(ts, "d", coll.ns, {"_id": doc["_id"]}, ui=coll.ui, from_migrate=True)])

    def abort_transactions_on(self, db: str, name: str) -> int:
        """End every open transaction that read or wrote ``db.name`` (a migration's critical section
        aborts them; their commit then fails with NoSuchTransaction, a TransientTransactionError)."""
        aborted = 0
        with self.lock:
            for session in self.sessions.values():
                txn = session.txn
                if txn is None or txn.state != "in_progress":
                    continue
                if (db, name) in txn.collections or any(m[0] == db and m[1] == name for m in txn.touched):
                    txn.state = "aborted"
                    self._release(txn)
                    aborted += 1
        return aborted

    def transaction_open(self, lsid: Mapping[str, Any], txn_number: int) -> bool:
        """Whether the session's transaction ``txn_number`` can still commit (a two-phase commit's prepare)."""
        with self.lock:
            session = self.sessions.get(_lsid_key(lsid))
            txn = session.txn if session is not None else None
            return txn is not None and txn.txn_number == txn_number and txn.state == "in_progress"

    # ---------------------------------------------------------------------------------------
    # reads
    # ---------------------------------------------------------------------------------------
    def match(self, coll: Collection, query: Mapping[str, Any], sort: Mapping[str, Any] | None = None,
              limit: int = 0, skip: int = 0, collation: Fold | None = None) -> list[dict[str, Any]]:  # fmt: skip
        """Documents of ``coll`` matching ``query`` in sort (or storage) order."""
        return [d for d, _ in self.match_stored(coll, query, sort=sort, limit=limit, skip=skip, collation=collation)]

    def match_stored(self, coll: Collection, query: Mapping[str, Any], sort: Mapping[str, Any] | None = None,
                     limit: int = 0, skip: int = 0, collation: Fold | None = None) -> list[StoredDoc]:  # fmt: skip
        if collation is not None:
            return self._match_collated(coll, query, sort, limit, skip, collation)
        with self.lock:
            ranged = _id_range(query)
            order = dict(sort) if sort else {}
            if not query and order in ({"_id": 1}, {"_id": -1}):  # a whole-collection read in index order
                keys = coll.sorted_ids()
                selected = keys[::-1] if order == {"_id": -1} else keys
                selected = selected[skip:] if skip else selected
                selected = selected[:limit] if limit else selected
                return [coll.docs[k] for k in selected]
            if ranged is not None and order in ({}, {"_id": 1}, {"_id": -1}):
                stored = self._id_range_read(coll, ranged, descending=order == {"_id": -1},
                                             limit=0 if len(query) > 1 else (skip + limit if limit else 0))  # fmt: skip
                rest = {k: v for k, v in query.items() if k != "_id"}
                if rest:
                    stored = [s for s in stored if matching.matches(rest, s[0])]
                stored = stored[skip:] if skip else stored
                return stored[:limit] if limit else stored
            stored = self._candidates(coll, query)
        if query:
            applies = matching.matches
            stored = [s for s in stored if applies(query, s[0])]
        if sort:
            in_order = matching.sort_documents([s[0] for s in stored], sort)
            by_id = {id(s[0]): s for s in stored}
            stored = [by_id[id(d)] for d in in_order]
        if skip:
            stored = stored[skip:]
        if limit:
            stored = stored[:limit]
        return stored

    def _match_collated(self, coll: Collection, query: Mapping[str, Any], sort: Mapping[str, Any] | None,
                        limit: int, skip: int, fold: Fold) -> list[StoredDoc]:  # fmt: skip
        """Matching and sorting under a collation: strings compare as the collation folds them."""
        with self.lock:
            stored = list(coll.docs.values())
        folded_query = fold(query)
        pairs = [(fold(s[0]), s) for s in stored]
        if query:
            pairs = [(f, s) for f, s in pairs if matching.matches(folded_query, f)]
        if sort:
            order = {id(f): s for f, s in pairs}
            pairs = [(f, order[id(f)]) for f in matching.sort_documents([f for f, _ in pairs], sort)]
        result = [s for _, s in pairs][skip:]
        return result[:limit] if limit else result

    @staticmethod
    def _id_range_read(coll: Collection, bounds: tuple[IdKey | None, bool, IdKey | None, bool],
                       descending: bool, limit: int) -> list[StoredDoc]:  # fmt: skip
        """Documents whose ``_id`` lies within the bounds, in ``_id`` order, via the _id index."""
        lower, lower_inclusive, upper, upper_inclusive = bounds
        keys = coll.sorted_ids()
        rank = (lower or upper or (0,))[0]
        if lower is None:
            start = bisect.bisect_left(keys, (rank,))
        else:
            start = (bisect.bisect_left if lower_inclusive else bisect.bisect_right)(keys, lower)
        if upper is None:
            stop = bisect.bisect_left(keys, (rank + 1,))
        else:
            stop = (bisect.bisect_right if upper_inclusive else bisect.bisect_left)(keys, upper)
        if stop <= start:
            return []
        if descending:
            first = start if not limit else max(start, stop - limit)
            selected = keys[first:stop][::-1]
        else:
            selected = keys[start : stop if not limit else min(stop, start + limit)]
        docs = coll.docs
        return [docs[k] for k in selected]

    def _candidates(self, coll: Collection, query: Mapping[str, Any]) -> list[StoredDoc]:
        """All documents, or only the one an ``_id`` equality names (the fast path)."""
        if "_id" in query:
            wanted = query["_id"]
            if isinstance(wanted, Mapping) and wanted and all(k.startswith("$") for k in wanted):
                if set(wanted) == {"$eq"}:
                    wanted = wanted["$eq"]
                elif set(wanted) == {"$in"} and isinstance(wanted["$in"], list) and not any(
                    isinstance(v, (Mapping, list)) or hasattr(v, "pattern") for v in wanted["$in"]
                ):
                    found = (coll.docs.get(id_key(v)) for v in wanted["$in"])
                    return [s for s in found if s is not None]
                else:
                    return list(coll.docs.values())
            if isinstance(wanted, (list, Mapping)) or hasattr(wanted, "pattern"):
                return list(coll.docs.values())
            one = coll.docs.get(id_key(wanted))
            return [one] if one is not None else []
        return list(coll.docs.values())

    # ---------------------------------------------------------------------------------------
    # sessions and transactions
    # ---------------------------------------------------------------------------------------
    def session(self, lsid: Mapping[str, Any]) -> Session:
        key = _lsid_key(lsid)
        with self.lock:
            found = self.sessions.get(key)
            if found is None:
                found = self.sessions[key] = Session(dict(lsid))
            return found

    def end_sessions(self, lsids: Iterable[Mapping[str, Any]]) -> None:
        with self.lock:
            for lsid in lsids:
                found = self.sessions.pop(_lsid_key(lsid), None)
                if found is not None and found.txn is not None and found.txn.state == "in_progress":
                    found.txn.state = "aborted"

    def transaction_for(self, session: Session, txn_number: int, start: bool) -> Transaction:
        """The transaction a command with ``autocommit: false`` runs in (mongod's state rules)."""
        with self.lock:
            if txn_number < session.txn_number:
                raise command_error(
                    TRANSACTION_TOO_OLD,
                    f"Cannot start transaction {txn_number} on session {_lsid_text(session.lsid)} because a newer "
                    f"transaction {session.txn_number} has already started.",
                )
            if start:
                if txn_number == session.txn_number and session.txn is not None:
                    if session.txn.state == "committed":
                        raise command_error(TRANSACTION_COMMITTED, f"Transaction with {{ txnNumber: {txn_number} }} has been committed.")
                    raise command_error(
                        CONFLICTING_OPERATION_IN_PROGRESS,
                        f"Cannot start a transaction with txnNumber {txn_number}: it is already in progress",
                    )
                if session.txn is not None and session.txn.state == "in_progress":
                    session.txn.state = "aborted"
                session.txn_number = txn_number
                session.txn = Transaction(session.lsid, txn_number, snapshot_ts=self.oplog.clock.current())
                return session.txn
            txn = session.txn
            if txn is None or txn.txn_number != txn_number or session.txn_number != txn_number:
                raise _no_such_transaction(txn_number)
            if txn.state == "aborted":
                raise _no_such_transaction(txn_number, aborted=True)
            if txn.state == "committed":
                raise command_error(TRANSACTION_COMMITTED, f"Transaction with {{ txnNumber: {txn_number} }} has been committed.")
            return txn

    def commit_transaction(self, session: Session, txn_number: int) -> Timestamp:
        """Apply a transaction atomically as ONE applyOps oplog entry; a retried commit is a no-op."""
        with self.lock:
            txn = session.txn
            if txn is None or txn.txn_number != txn_number or session.txn_number != txn_number:
                raise _no_such_transaction(txn_number)
            if txn.state == "committed":
                assert txn.commit_ts is not None
                return txn.commit_ts
            if txn.state == "aborted":
                raise _no_such_transaction(txn_number, aborted=True)
            txn.state = "committed"
            ts = self._next_ts()
            txn.commit_ts = ts
            if not txn.ops:
                return self.oplog.clock.current()
            for effect in txn.effects:
                base = self.catalog.get(effect.db, {}).get(effect.coll)
                if effect.created is not None:
                    if base is None:
                        created = effect.created
                        base = Collection(effect.db, effect.coll, created.uuid, dict(created.options))
                        base.indexes = {name: Index(dict(ix.spec)) for name, ix in created.indexes.items()}
                        self.catalog.setdefault(effect.db, {})[effect.coll] = base
                        self._journal_catalog(base)
                    continue
                if base is None:
                    base = self._create_collection(effect.db, effect.coll, {})
                assert effect.key is not None
                old = base.docs.get(effect.key)
                self.history.record(ts, base, effect.key, old[0] if old is not None else None)
                if effect.stored is None:
                    removed = base.remove(effect.key)
                    if removed is not None:
                        self._journal({"k": "del", "db": effect.db, "c": effect.coll, "id": removed[0]["_id"]})
                else:
                    base.put(effect.key, effect.stored)
                    self._journal({"k": "put", "db": effect.db, "c": effect.coll, "d": effect.stored[1]})
            for ui, index, pre, post in txn.images:
                base_coll = next((c for colls in self.catalog.values() for c in colls.values() if c.uuid == ui), None)
                if base_coll is not None:
                    self._record_images(base_coll, ts, index, pre, post)
            entry: dict[str, Any] = {
                "lsid": _oplog_lsid(txn.lsid),
                "txnNumber": Int64(txn.txn_number),
                "op": "c",
                "ns": "admin.$cmd",
                "o": {"applyOps": txn.ops},
                "ts": ts,
                "t": Int64(self.term),
                "v": Int64(2),
                "wall": now_ms(),
                "prevOpTime": {"ts": Timestamp(0, 0), "t": Int64(-1)},
            }
            self._append([entry])
            self.flush_journal()
            self._release(txn)
            return ts

    def abort_transaction(self, session: Session, txn_number: int) -> None:
        with self.lock:
            txn = session.txn
            if txn is None or txn.txn_number != txn_number or txn.state == "aborted":
                raise _no_such_transaction(txn_number, aborted=txn is not None and txn.state == "aborted")
            if txn.state == "committed":
                raise command_error(TRANSACTION_COMMITTED, "Transaction has been committed.")
            txn.state = "aborted"
            self._release(txn)

    def _release(self, txn: Transaction) -> None:
        """The documents an ended transaction wrote are free for other writers again."""
        for marker in txn.touched:
            if self.txn_owners.get(marker) is txn:
                del self.txn_owners[marker]

    # ---------------------------------------------------------------------------------------
    # periodic no-op and persistence support
    # ---------------------------------------------------------------------------------------
    def write_noop(self, message: str = "periodic noop") -> None:
        with self.lock:
            self._append([self._entry(self._next_ts(), "n", "", {"msg": message})])
            self.flush_journal()

    def iter_collections(self) -> Iterator[Collection]:
        for colls in self.catalog.values():
            yield from colls.values()




_RANGE_OPERATORS = {"$gt": (True, False), "$gte": (True, True), "$lt": (False, False), "$lte": (False, True)}
_RANGEABLE = (int, float, str, ObjectId, datetime.datetime, Timestamp, Binary)


def _id_range(query: Mapping[str, Any]) -> tuple[IdKey | None, bool, IdKey | None, bool] | None:
    """Bounds of an ``_id`` range condition (``{_id: {$gte: a, $lt: b}}``) the _id index can
    answer exactly, with mongod's type bracketing; None when the condition is anything else."""
    cond = query.get("_id")
    if not isinstance(cond, Mapping) or not cond or not set(cond) <= set(_RANGE_OPERATORS):
        return None
    lower: IdKey | None = None
    upper: IdKey | None = None
    lower_inclusive = upper_inclusive = True
    for op, value in cond.items():
        if isinstance(value, bool) or not isinstance(value, _RANGEABLE) or (isinstance(value, float) and value != value):
            return None
        key = id_key(value)
        is_lower, inclusive = _RANGE_OPERATORS[op]
        if is_lower:
            if lower is not None:
                return None
            lower, lower_inclusive = key, inclusive
        else:
            if upper is not None:
                return None
            upper, upper_inclusive = key, inclusive
    if lower is not None and upper is not None and lower[0] != upper[0]:
        return (lower, True, lower, False)  # different type brackets: nothing matches
    return lower, lower_inclusive, upper, upper_inclusive


def _lsid_key(lsid: Mapping[str, Any]) -> bytes:
    ident = lsid.get("id")
    if isinstance(ident, uuid.UUID):
        return ident.bytes
    if isinstance(ident, (bytes, Binary)):
        return bytes(ident)
    raise command_error(BAD_VALUE, "lsid.id must be a UUID")


def _lsid_text(lsid: Mapping[str, Any]) -> str:
    key = _lsid_key(lsid)
    return f"{uuid.UUID(bytes=key)} - 47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="


def _oplog_lsid(lsid: Mapping[str, Any]) -> dict[str, Any]:
    """The lsid as mongod logs it: ``{id: UUID, uid: sha256 of the (empty) user name}``."""
    import hashlib

    ident = lsid["id"]
    if not isinstance(ident, Binary):
        ident = Binary(_lsid_key(lsid), 4)
    return {"id": ident, "uid": Binary(hashlib.sha256(b"").digest(), 0)}


def _no_such_transaction(txn_number: int, aborted: bool = False) -> CommandError:
    if aborted:
        message = f"Transaction with {{ txnNumber: {txn_number} }} has been aborted."
    else:
        message = f"Given transaction number {txn_number} does not match any in-progress transactions."
    return command_error(NO_SUCH_TRANSACTION, message, labels=("TransientTransactionError",))
