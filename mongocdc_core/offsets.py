"""Where the stream stands: resume token, position and snapshot progress, stored durably.

The engine saves an offset only after the sink's ``flush`` returned for every record before it,
so after a crash the stored offset never points past an undelivered record (at-least-once).
The file store replaces the file atomically (temp file, fsync, rename, fsync of the directory),
so a crash mid-save leaves either the old or the new offset, never a torn one.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from bson import json_util

from mongocdc_core.positions import Position

_FORMAT_VERSION = 1


class OffsetError(RuntimeError):
    """A stored offset cannot be read (corrupt file, unknown format)."""


@dataclass
class SnapshotState:
    """Progress of an initial/blocking snapshot, so a stopped snapshot is redone where needed.

    ``completed`` collections were copied and flushed; the others in ``collections`` are copied
    again on restart. ``start_position``/``start_token`` were recorded before the copy started and
    are where streaming begins afterwards.
    """

    collections: list[str]
    completed: list[str] = field(default_factory=list)
    start_position: Position | None = None
    start_token: dict[str, Any] | None = None
    running: bool = True

    @property
    def remaining(self) -> list[str]:
        """Collections still to copy, in snapshot order."""
        done = set(self.completed)
        return [ns for ns in self.collections if ns not in done]

    def to_json(self) -> dict[str, Any]:
        return {
            "collections": list(self.collections),
            "completed": list(self.completed),
            "start_position": self.start_position.to_str() if self.start_position else None,
            "start_token": _token_to_json(self.start_token),
            "running": self.running,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotState:
        pos = data.get("start_position")
        return cls(
            collections=list(data.get("collections", [])),
            completed=list(data.get("completed", [])),
            start_position=Position.parse(pos) if pos else None,
            start_token=_token_from_json(data.get("start_token")),
            running=bool(data.get("running", False)),
        )


@dataclass
class Offset:
    """The connector's recorded position (Debezium's offset context).

    ``resume_token`` and ``position`` are the last delivered (flushed) change; ``snapshot`` is set
    while a snapshot is in progress; ``incremental`` holds incremental-snapshot progress owned by
    the incremental snapshot code.
    """

    resume_token: dict[str, Any] | None = None
    position: Position | None = None
    snapshot: SnapshotState | None = None
    incremental: dict[str, Any] | None = None

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
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Offset:
        version = data.get("version")
        if version != _FORMAT_VERSION:
            raise OffsetError(f"unsupported offset format version {version!r} (expected {_FORMAT_VERSION})")
        pos = data.get("position")
        snap = data.get("snapshot")
        return cls(
            resume_token=_token_from_json(data.get("resume_token")),
            position=Position.parse(pos) if pos else None,
            snapshot=SnapshotState.from_json(snap) if snap else None,
            incremental=_token_from_json(data.get("incremental")),
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


class MemoryOffsetStore:
    """An in-process store for bounded runs that must not persist anything (e.g. one-off slices)."""

    def __init__(self, initial: Offset | None = None) -> None:
        self._data = orjson.dumps(initial.to_json()) if initial else None

    def load(self) -> Offset | None:
        return Offset.from_json(orjson.loads(self._data)) if self._data else None

    def save(self, offset: Offset) -> None:
        self._data = orjson.dumps(offset.to_json())

    def close(self) -> None:
        """Nothing to release."""


class FileOffsetStore:
    """One JSON file holding the offset; replaced atomically on every save."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> Offset | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return Offset.from_json(orjson.loads(raw))
        except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError) as exc:
            raise OffsetError(
                f"offset file {self.path} is not a valid mongocdc offset ({exc}); remove it to start "
                "over (a new snapshot per snapshot.mode) or restore it from a backup"
            ) from exc

    def save(self, offset: Offset) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = orjson.dumps(offset.to_json(), option=orjson.OPT_INDENT_2)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def close(self) -> None:
        """Nothing is held open between saves."""
