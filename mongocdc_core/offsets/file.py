"""Offset stores kept in this process (bounded runs) or in one local file (the default).

The file store replaces the file atomically (temp file, fsync, rename, fsync of the directory),
so a crash mid-save leaves either the old or the new offset, never a torn one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import orjson

from mongocdc_core.offsets.model import Offset, OffsetError


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
