"""``--dbpath``: the emulator's data and oplog survive a clean stop and a crash (kill -9).

Every applied change is journaled as a BSON record to ``journal.bson`` (append-only) and written
with ``os.write`` before the reply goes out, so the operating system holds it even if the process
dies the next instant (no fsync: surviving a process crash is the goal, not a power loss).
A checkpoint (``checkpoint.bson``: catalog, documents, oplog, images) is written on shutdown and
whenever the journal grows large; it is written to a temporary file and atomically renamed, and
only then is the journal reset. On start the checkpoint is loaded and the journal replayed; replay
is idempotent, so a crash between the rename and the reset is harmless, and a record cut short by
a crash is discarded.
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import bson
from bson import Timestamp
from bson.binary import Binary
from bson.codec_options import CodecOptions, DatetimeConversion

from .oplog import ts_key
from .state import Collection, Index, ServerState, id_key

# Dates outside Python's datetime range stay DatetimeMS (as the wire decoder keeps them).
_CODEC: CodecOptions[dict[str, Any]] = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)

CHECKPOINT = "checkpoint.bson"
JOURNAL = "journal.bson"
CHECKPOINT_JOURNAL_BYTES = 64 * 1024 * 1024
_LENGTH = struct.Struct("<i")


def _to_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(bytes=bytes(value))


def read_records(path: str) -> tuple[list[dict[str, Any]], int]:
    """Decoded records of a BSON sequence file and the offset where the valid data ends."""
    if not os.path.exists(path):
        return [], 0
    with open(path, "rb") as handle:
        data = handle.read()
    records: list[dict[str, Any]] = []
    pos = 0
    while pos + 4 <= len(data):
        (size,) = _LENGTH.unpack_from(data, pos)
        if size < 5 or pos + size > len(data):
            break
        try:
            records.append(bson.decode(data[pos : pos + size], _CODEC))
        except Exception:  # a torn record from a crash: everything after it is unusable
            break
        pos += size
    return records, pos


class Persistence:
    """Journal + checkpoint files under one directory for one ``ServerState``."""

    def __init__(self, dbpath: str, state: ServerState) -> None:
        os.makedirs(dbpath, exist_ok=True)
        self.dbpath = dbpath
        self.state = state
        self._pending: list[bytes] = []
        self._journal_fd = -1
        self._journal_bytes = 0

    @property
    def journal_path(self) -> str:
        return os.path.join(self.dbpath, JOURNAL)

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.dbpath, CHECKPOINT)

    # -- start -----------------------------------------------------------------------------
    def load(self) -> None:
        """Restore the state from the checkpoint and journal, then start journaling."""
        state = self.state
        with state.lock:
            checkpoint, _ = read_records(self.checkpoint_path)
            journal, valid = read_records(self.journal_path)
            for record in checkpoint:
                self._apply(record)
            for record in journal:
                self._apply(record)
            for coll in state.iter_collections():
                self._rebuild_indexes(coll)
            last = state.oplog.read(state.oplog.last_ts(), inclusive=True) if len(state.oplog) else []
            state.term = max([state.term, *(int(e.get("t", 0)) for e in last)]) + 1  # a restart is an election
            self._journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT, 0o644)
            os.ftruncate(self._journal_fd, valid)  # drop a torn tail
            os.lseek(self._journal_fd, valid, os.SEEK_SET)
            self._journal_bytes = valid
            state.journal = self.record
            state.flush_journal = self.flush

    def _collection(self, db: str, name: str) -> Collection:
        coll = self.state.catalog.get(db, {}).get(name)
        if coll is None:
            coll = Collection(db, name, uuid.uuid4(), {})
            self.state.catalog.setdefault(db, {})[name] = coll
        return coll

    def _apply(self, record: dict[str, Any]) -> None:
        state = self.state
        kind = record.get("k")
        if kind == "put":
            raw = bytes(record["d"])
            doc = bson.decode(raw, _CODEC)
            self._collection(record["db"], record["c"]).put(id_key(doc["_id"]), (doc, raw))
        elif kind == "del":
            self._collection(record["db"], record["c"]).remove(id_key(record["id"]))
        elif kind == "oplog":
            entry = record["e"]
            last = state.oplog.last_ts()
            if last is None or ts_key(entry["ts"]) > ts_key(last):
                state.oplog.append([entry])
        elif kind == "coll":
            coll = self._collection(record["db"], record["name"])
            coll.uuid = _to_uuid(record["uuid"])
            coll.options = dict(record["options"])
            coll.indexes = {spec["name"]: Index(dict(spec)) for spec in record["indexes"]}
            self._rebuild_indexes(coll)
        elif kind == "drop":
            colls = state.catalog.get(record["db"], {})
            colls.pop(record["name"], None)
            if not colls:
                state.catalog.pop(record["db"], None)
        elif kind == "rename":
            sdb, _, sname = record["from"].partition(".")
            tdb, _, tname = record["to"].partition(".")
            source = state.catalog.get(sdb, {})
            if sname in source:
                moved = source.pop(sname)
                if not source:
                    state.catalog.pop(sdb, None)
                moved.db, moved.name, moved.uuid = tdb, tname, _to_uuid(record["uuid"])
                state.catalog.setdefault(tdb, {})[tname] = moved
        elif kind == "img":
            key = (_to_uuid(record["ui"]), ts_key(record["ts"]), int(record["i"]))
            pre, post = record.get("pre"), record.get("post")
            state.images[key] = (None if pre is None else (pre, bson.encode(pre)), None if post is None else (post, bson.encode(post)))
        elif kind == "meta":
            state.term = max(state.term, int(record["term"]))
            state.oplog.clock.advance_to(record["clock"])
        else:
            raise ValueError(f"unknown record kind {kind!r} in {self.dbpath}")

    @staticmethod
    def _rebuild_indexes(coll: Collection) -> None:
        for index in coll.indexes.values():
            index.entries.clear()
            if index.unique and index.name != "_id_":
                for key, (doc, _) in coll.docs.items():
                    ikey = index.key_of(doc)
                    if ikey is not None:
                        index.entries[ikey] = key

    # -- journaling ------------------------------------------------------------------------
    def record(self, record: dict[str, Any]) -> None:
        """Queue one journal record (called by ServerState while it holds its lock)."""
        self._pending.append(bson.encode(record))

    def flush(self) -> None:
        """Hand queued records to the operating system (before the reply is sent)."""
        if not self._pending or self._journal_fd < 0:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        view = memoryview(data)
        while view:
            written = os.write(self._journal_fd, view)
            view = view[written:]
        self._journal_bytes += len(data)

    # -- checkpoints -----------------------------------------------------------------------
    def _snapshot(self) -> Iterator[bytes]:
        state = self.state
        clock = state.oplog.clock.current()
        yield bson.encode({"k": "meta", "term": state.term, "clock": clock if clock.time else Timestamp(0, 0)})
        for coll in state.iter_collections():
            yield bson.encode({"k": "coll", **coll.catalog_entry()})
            for _, raw in coll.docs.values():
                yield bson.encode({"k": "put", "db": coll.db, "c": coll.name, "d": Binary(raw)})
        for entry in state.oplog.entries():
            yield bson.encode({"k": "oplog", "e": entry})
        for (ui, (seconds, inc), index), (pre, post) in state.images.items():
            yield bson.encode({"k": "img", "ui": Binary.from_uuid(ui), "ts": Timestamp(seconds, inc), "i": index,
                               "pre": pre[0] if pre else None, "post": post[0] if post else None})  # fmt: skip

    def checkpoint(self) -> None:
        """Write the whole state, atomically replace the checkpoint, then reset the journal."""
        with self.state.lock:
            self.flush()
            tmp = self.checkpoint_path + ".tmp"
            with open(tmp, "wb") as handle:
                for chunk in self._snapshot():
                    handle.write(chunk)
            os.replace(tmp, self.checkpoint_path)
            if self._journal_fd >= 0:
                os.ftruncate(self._journal_fd, 0)
                os.lseek(self._journal_fd, 0, os.SEEK_SET)
            self._journal_bytes = 0

    def checkpoint_if_large(self) -> None:
        if self._journal_bytes > CHECKPOINT_JOURNAL_BYTES:
            self.checkpoint()

    def close(self) -> None:
        with self.state.lock:
            self.flush()
            self.state.journal = None
            self.state.flush_journal = lambda: None
            if self._journal_fd >= 0:
                os.close(self._journal_fd)
                self._journal_fd = -1
