"""The offset model: resume token, position and snapshot progress, as every store saves them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from bson import json_util

from mongocdc_core.positions import Position

_FORMAT_VERSION = 1


class OffsetError(RuntimeError):
    """A stored offset cannot be read (corrupt file, unknown format)."""


@dataclass
class SnapshotState:
    """Progress of an initial/blocking snapshot, so a stopped snapshot resumes where it stopped.

    ``completed`` collections were copied and flushed. ``parts[ns]`` is the plan of a collection
    being copied: its ``_id`` ranges (``IdRange`` JSON), each with ``done`` and ``after`` (the last
    key copied *and flushed*, as canonical Extended JSON), so a restart copies only what is left.
    ``delivered``: some record of the snapshot was delivered (the next one is not ``first``).
    ``start_position``/``start_token`` were recorded before the copy started: the reads' position,
    and for an initial snapshot where streaming begins afterwards. A blocking snapshot also keeps
    its request, ``signal_id`` and the query per collection (``filters``, None: every document),
    so a restart runs the same snapshot again (streaming resumes where it paused, at the signal).
    ``marks[ns]`` is where the sink stood before the copy of ``ns`` began
    (``mongocdc.snapshot.delete.missing.keys``: keys held before it and not touched after it are
    gone from the source).
    """

    collections: list[str]
    completed: list[str] = field(default_factory=list)
    start_position: Position | None = None
    start_token: dict[str, Any] | None = None
    running: bool = True
    parts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    marks: dict[str, Any] = field(default_factory=dict)
    delivered: bool = False
    signal_id: str | None = None
    filters: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    @property
    def remaining(self) -> list[str]:
        """Collections still to copy, in snapshot order."""
        done = set(self.completed)
        return [ns for ns in self.collections if ns not in done]

    def record_part(self, namespace: str, part: int, after: str | None, done: bool, collection_done: bool) -> None:
        """A chunk of ``part`` of ``namespace`` was handed to the sink (durable with the next commit)."""
        if after is not None:
            self.delivered = True
        entries = self.parts.get(namespace)
        if entries is not None and 0 <= part < len(entries):
            if after is not None:
                entries[part]["after"] = after
            if done:
                entries[part]["done"] = True
        if collection_done:
            self.parts.pop(namespace, None)
            if namespace not in self.completed:
                self.completed.append(namespace)

    def to_json(self) -> dict[str, Any]:
        return {
            "collections": list(self.collections),
            "completed": list(self.completed),
            "parts": {ns: [dict(entry) for entry in entries] for ns, entries in self.parts.items()},
            "start_position": self.start_position.to_str() if self.start_position else None,
            "start_token": _token_to_json(self.start_token),
            "running": self.running,
            "marks": dict(self.marks),
            "delivered": self.delivered,
            "signal_id": self.signal_id,
            "filters": {ns: _token_to_json(query) for ns, query in self.filters.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotState:
        pos = data.get("start_position")
        parts = data.get("parts") or {}
        return cls(
            collections=list(data.get("collections", [])),
            completed=list(data.get("completed", [])),
            parts={str(ns): [dict(entry) for entry in entries] for ns, entries in (data.get("parts") or {}).items()},
            start_position=Position.parse(pos) if pos else None,
            start_token=_token_from_json(data.get("start_token")),
            running=bool(data.get("running", False)),
            marks=dict(data.get("marks") or {}),
            # Offsets written before ``delivered`` existed: a started range means records went out.
            delivered=bool(data.get("delivered", any(e.get("after") for entries in parts.values() for e in entries))),
            signal_id=data.get("signal_id"),
            filters={str(ns): _token_from_json(query) for ns, query in (data.get("filters") or {}).items()},
        )


@dataclass
class Offset:
    """The connector's recorded position (Debezium's offset context).

    ``resume_token`` and ``position`` are the last delivered (flushed) change; ``snapshot`` is set
    while an initial snapshot is in progress, ``blocking`` while a blocking ad hoc snapshot is (the
    stream is paused at its signal, so the resume token stays there until it completes);
    ``incremental`` holds incremental-snapshot progress owned by the incremental snapshot code.
    All of it is saved as one document, so a snapshot's progress and the stream position never
    disagree.
    """

    resume_token: dict[str, Any] | None = None
    position: Position | None = None
    snapshot: SnapshotState | None = None
    incremental: dict[str, Any] | None = None
    blocking: SnapshotState | None = None
    replica_set: str | None = None  # the replica set the position belongs to (None: unknown, older offsets)

    @property
    def snapshot_in_progress(self) -> bool:
        return self.snapshot is not None and self.snapshot.running

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _FORMAT_VERSION,
            "resume_token": _token_to_json(self.resume_token),
            "position": self.position.to_str() if self.position else None,
            "snapshot": self.snapshot.to_json() if self.snapshot else None,
            "incremental": _token_to_json(self.incremental),
            "blocking": self.blocking.to_json() if self.blocking else None,
            "replica_set": self.replica_set,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Offset:
        version = data.get("version")
        if version != _FORMAT_VERSION:
            raise OffsetError(f"unsupported offset format version {version!r} (expected {_FORMAT_VERSION})")
        pos = data.get("position")
        snap = data.get("snapshot")
        blocking = data.get("blocking")
        return cls(
            resume_token=_token_from_json(data.get("resume_token")),
            position=Position.parse(pos) if pos else None,
            snapshot=SnapshotState.from_json(snap) if snap else None,
            incremental=_token_from_json(data.get("incremental")),
            blocking=SnapshotState.from_json(blocking) if blocking else None,
            replica_set=data.get("replica_set"),
        )


def _token_to_json(value: dict[str, Any] | None) -> Any:
    """BSON values (resume tokens may hold binary) as canonical extended JSON, lossless."""
    if value is None:
        return None
    return orjson.loads(json_util.dumps(value, json_options=json_util.CANONICAL_JSON_OPTIONS))


def _token_from_json(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    decoded = json_util.loads(orjson.dumps(value), json_options=json_util.CANONICAL_JSON_OPTIONS)
    return dict(decoded)


class OffsetStore(Protocol):
    """Durable storage of one connector's offset."""

    def load(self) -> Offset | None:
        """The last saved offset, or None when the connector never recorded one."""

    def save(self, offset: Offset) -> None:
        """Replace the stored offset durably before returning."""

    def close(self) -> None:
        """Release resources. Idempotent."""
