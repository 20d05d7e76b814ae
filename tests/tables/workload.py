"""A seeded random MongoDB workload modelled in Python, turned into landing files by the real converter.

The model applies inserts, ``$set`` (dotted paths, array indexes), ``$unset``, array truncation,
replaces, deletes and multi-operation transactions to plain dicts, and emits the change stream
documents MongoDB would (with ``updateDescription``, and ``fullDocument`` for update_full modes).
Snapshots copy the model at a position. The expected current state is the model itself.
"""

from __future__ import annotations

import copy
import datetime
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position
from mongocdc_core.sinks.parquet import ParquetSink

DB = "shop"


@dataclass
class Event:
    """One change stream document and its position."""

    change: dict[str, Any]
    position: Position


@dataclass
class Workload:
    """Model state per collection plus every change event in order."""

    rng: random.Random
    collections: Sequence[str] = ("orders",)
    full_document: bool = False
    #: emit ``fullDocumentBeforeChange`` (pre-images) for updates, replaces and deletes
    pre_images: bool = False
    docs: dict[str, dict[Any, dict[str, Any]]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    seconds: int = 1_700_000_000
    increment: int = 0

    def __post_init__(self) -> None:
        for coll in self.collections:
            self.docs.setdefault(coll, {})

    # ------------------------------------------------------------------ positions
    def _tick(self) -> Timestamp:
        self.increment += 1
        if self.increment > 50:
            self.seconds, self.increment = self.seconds + 1, 1
        return Timestamp(self.seconds, self.increment)

    def position(self) -> Position:
        """The position a snapshot taken now records (the last cluster time)."""
        return Position(self.seconds, self.increment)

    # ------------------------------------------------------------------ values
    def _value(self, depth: int = 0) -> Any:
        r = self.rng.random()
        if r < 0.2:
            return self.rng.randint(-1000, 1000)
        if r < 0.3:
            return Int64(self.rng.randint(-(2**40), 2**40))
        if r < 0.4:
            return round(self.rng.uniform(-100, 100), 3)
        if r < 0.55:
            return self.rng.choice(["a", "b", "hello", "ünï", ""])
        if r < 0.6:
            return self.rng.random() < 0.5
        if r < 0.65:
            return datetime.datetime(2024, 1, 1) + datetime.timedelta(milliseconds=self.rng.randint(0, 10**10))
        if r < 0.7:
            return None
        if depth < 2 and r < 0.85:
            return [self._value(depth + 1) for _ in range(self.rng.randint(0, 4))]
        if depth < 2:
            return {f"k{i}": self._value(depth + 1) for i in range(self.rng.randint(0, 3))}
        return self.rng.randint(0, 9)

    def _document(self, doc_id: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"_id": doc_id}
        for name in self.rng.sample(["name", "qty", "price", "tags", "meta", "when", "flag", "mixed"], 4):
            doc[name] = self._value()
        doc["items"] = [self._value(1) for _ in range(self.rng.randint(1, 5))]
        return doc

    def _new_id(self) -> Any:
        kind = self.rng.random()
        if kind < 0.4:
            return ObjectId(bytes(self.rng.getrandbits(8) for _ in range(12)))
        if kind < 0.7:
            return self.rng.randint(0, 10**9)
        return f"id-{self.rng.randint(0, 10**9)}"

    # ------------------------------------------------------------------ operations
    def _emit(self, coll: str, op_type: str, doc_id: Any, ts: Timestamp, ordinal: int, **extra: Any) -> None:
        change: dict[str, Any] = {
            "operationType": op_type,
            "ns": {"db": DB, "coll": coll},
            "documentKey": {"_id": doc_id},
            "clusterTime": ts,
            **extra,
        }
        self.events.append(Event(change, Position.from_timestamp(ts, ordinal)))

    def insert(self, coll: str, ts: Timestamp, ordinal: int = 0) -> None:
        doc_id = self._new_id()
        doc = self._document(doc_id)
        self.docs[coll][doc_id] = doc
        self._emit(coll, "insert", doc_id, ts, ordinal, fullDocument=copy.deepcopy(doc))

    def _before(self, coll: str, doc_id: Any) -> dict[str, Any]:
        return {"fullDocumentBeforeChange": copy.deepcopy(self.docs[coll][doc_id])} if self.pre_images else {}

    def update(self, coll: str, ts: Timestamp, ordinal: int = 0) -> None:
        doc_id = self.rng.choice(list(self.docs[coll]))
        before = self._before(coll, doc_id)
        doc = self.docs[coll][doc_id]
        updated: dict[str, Any] = {}
        removed: list[str] = []
        truncated: list[dict[str, Any]] = []
        choice = self.rng.random()
        items = doc.get("items")
        if choice < 0.25 and isinstance(items, list) and items:
            index = self.rng.randrange(len(items))
            value = self._value(1)
            items[index] = value
            updated[f"items.{index}"] = value
        elif choice < 0.35 and isinstance(items, list) and len(items) > 1:
            size = self.rng.randrange(len(items))
            del items[size:]
            truncated.append({"field": "items", "newSize": size})
            if self.rng.random() < 0.5:
                items.append(self._value(1))
                updated[f"items.{size}"] = items[size]
        elif choice < 0.45 and isinstance(doc.get("meta"), dict):
            sub = f"k{self.rng.randint(0, 4)}"
            value = self._value(1)
            doc["meta"][sub] = value
            updated[f"meta.{sub}"] = value
        elif choice < 0.6:
            candidates = [k for k in doc if k != "_id"]
            if candidates:
                name = self.rng.choice(candidates)
                del doc[name]
                removed.append(name)
        else:
            name = self.rng.choice(["name", "qty", "price", "flag", "extra", "mixed", "note"])
            value = self._value()
            doc[name] = value
            updated[name] = value
        if not updated and not removed and not truncated:
            doc["touched"] = self.rng.randint(0, 100)
            updated["touched"] = doc["touched"]
        desc = {"updatedFields": updated, "removedFields": removed, "truncatedArrays": truncated}
        extra: dict[str, Any] = {"updateDescription": copy.deepcopy(desc), **before}
        if self.full_document:
            extra["fullDocument"] = copy.deepcopy(doc)
        self._emit(coll, "update", doc_id, ts, ordinal, **extra)

    def replace(self, coll: str, ts: Timestamp, ordinal: int = 0) -> None:
        doc_id = self.rng.choice(list(self.docs[coll]))
        before = self._before(coll, doc_id)
        doc = self._document(doc_id)
        self.docs[coll][doc_id] = doc
        self._emit(coll, "replace", doc_id, ts, ordinal, fullDocument=copy.deepcopy(doc), **before)

    def delete(self, coll: str, ts: Timestamp, ordinal: int = 0) -> None:
        doc_id = self.rng.choice(list(self.docs[coll]))
        before = self._before(coll, doc_id)
        del self.docs[coll][doc_id]
        self._emit(coll, "delete", doc_id, ts, ordinal, **before)

    def step(self) -> None:
        """One random operation, or a transaction of 2-4 operations sharing one clusterTime."""
        coll = self.rng.choice(list(self.collections))
        ts = self._tick()
        if self.rng.random() < 0.1 and len(self.docs[coll]) > 3:
            for ordinal in range(self.rng.randint(2, 4)):
                self._random_op(coll, ts, ordinal)
        else:
            self._random_op(coll, ts, 0)

    def _random_op(self, coll: str, ts: Timestamp, ordinal: int) -> None:
        r = self.rng.random()
        if not self.docs[coll] or r < 0.3:
            self.insert(coll, ts, ordinal)
        elif r < 0.75:
            self.update(coll, ts, ordinal)
        elif r < 0.87:
            self.replace(coll, ts, ordinal)
        else:
            self.delete(coll, ts, ordinal)

    def run(self, steps: int) -> tuple[int, int]:
        """Apply ``steps`` operations; returns the (start, end) event indexes they produced."""
        start = len(self.events)
        for _ in range(steps):
            self.step()
        return start, len(self.events)


def converter(capture_mode: str) -> EventConverter:
    return EventConverter(EventOptions(topic_prefix="dbz", capture_mode=capture_mode, rs="rs0", now_ns=lambda: 1))


def write_landing(path: Path, records: Sequence[Record]) -> Path:
    """Write records as one landing file, exactly as the Dagster assets do."""
    sink = ParquetSink.to_file(path)
    sink.write(list(records))
    sink.close()
    return path


def slice_records(conv: EventConverter, events: Sequence[Event]) -> list[Record]:
    return [rec for ev in events for rec in conv.convert_change(ev.change, ev.position)]


def snapshot_records(conv: EventConverter, workload: Workload, coll: str) -> list[Record]:
    """A blocking snapshot of the model now: every document at the current position."""
    pos = workload.position()
    return [conv.convert_read(doc, DB, coll, pos, "true") for doc in workload.docs[coll].values()]
