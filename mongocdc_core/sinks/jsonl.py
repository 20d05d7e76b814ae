"""JSON Lines sink: one file per topic, one ``{"key": …, "value": …}`` line per record.

Lines are assembled from the already-serialized key and value bytes, so the sink adds no JSON
work of its own; ``flush`` fsyncs every file it touched since the previous flush. The files are
also what the sink reads back as keys (``KeyReader``): a mark is a file's length.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position
from mongocdc_core.sinks.base import KeyScan, SinkError
from mongocdc_core.sinks.readback import KeyScanBuilder

log = logging.getLogger(__name__)


class JsonlSink:
    """Appends records to ``<directory>/<topic>.jsonl`` in delivery order."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, BinaryIO] = {}
        self._dirty: set[str] = set()
        self._closed = False

    def _file(self, topic: str) -> BinaryIO:
        handle = self._files.get(topic)
        if handle is None:
            if "/" in topic or topic in ("", ".", ".."):
                raise SinkError(f"topic {topic!r} cannot be used as a file name")
            path = self.directory / f"{topic}.jsonl"
            _drop_torn_tail(path)
            handle = open(path, "ab")  # kept open across batches
            self._files[topic] = handle
        return handle

    def write(self, records: Sequence[Record]) -> None:
        if self._closed:
            raise SinkError("write to a closed jsonl sink")
        for record in records:
            line = b'{"key":%s,"value":%s}\n' % (record.key or b"null", record.value or b"null")
            try:
                self._file(record.topic).write(line)
            except OSError as exc:
                raise SinkError(f"cannot write to {self.directory / record.topic}.jsonl: {exc}") from exc
            self._dirty.add(record.topic)

    def flush(self, timeout: float | None = None) -> None:
        try:
            for topic in self._dirty:
                handle = self._files[topic]
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise SinkError(f"cannot flush jsonl files in {self.directory}: {exc}") from exc
        self._dirty.clear()

    def key_mark(self, topic: str) -> int:
        """The length of the topic's file: every line before it was delivered before the mark."""
        path = self._readable(topic)
        return path.stat().st_size if path.exists() else 0

    def scan_keys(self, topic: str, mark: Any, since: Position) -> KeyScan | None:
        """The topic file's keys, split at the byte offset ``mark``."""
        path = self._readable(topic)
        if not isinstance(mark, int):
            return None
        builder = KeyScanBuilder()
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return builder.build() if mark == 0 else None
        offset = 0
        with handle:
            if os.fstat(handle.fileno()).st_size < mark:
                log.warning("%s is shorter than when the snapshot began: its keys cannot be compared", path)
                return None
            for line in handle:
                start, offset = offset, offset + len(line)
                if not line.endswith(b"\n"):
                    break  # a torn last line: never acknowledged
                item = orjson.loads(line)
                builder.add(item.get("key"), item.get("value"), start >= mark)
        return builder.build()

    def _readable(self, topic: str) -> Path:
        """The topic's file with everything written so far on disk."""
        handle = self._files.get(topic)
        if handle is not None:
            handle.flush()
        return self.directory / f"{topic}.jsonl"

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        for handle in self._files.values():
            handle.close()
        self._files.clear()
        self._closed = True


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line that ``kill -9`` left half-written, before appending after it.

    Its record was never acknowledged (the offset is saved only after a flush returned), so the
    restarted connector delivers it again in full; without the cut the two would fuse into one
    unreadable line and lose the record that follows.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    with open(path, "r+b") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        keep = 0
        step = 1 << 16
        end = size
        while end > 0:
            start = max(0, end - step)
            fh.seek(start)
            block = fh.read(end - start)
            newline = block.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
