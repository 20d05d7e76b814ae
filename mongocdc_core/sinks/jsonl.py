"""JSON Lines sink: one file per topic, one ``{"key": …, "value": …}`` line per record.

Lines are assembled from the already-serialized key and value bytes, so the sink adds no JSON
work of its own: each ``write`` joins a batch's lines per topic, a few dozen at a time, and hands
them to the file. ``flush`` fsyncs every file it touched since the previous flush.

``mongocdc.jsonl.compression`` (``gzip`` or ``zstd``) compresses the files as they are written
(``<topic>.jsonl.gz`` / ``.jsonl.zst``). Each flush ends the current gzip member / zstd frame
before the fsync, so a file is always a sequence of complete members that ``gzip -dc`` / ``zstd -dc``
(and Python's gzip and zstandard modules) read as one stream; memory stays bounded because the
compressor streams.

The files are also what the sink reads back as keys (``KeyReader``): a mark is a file's length,
taken at the end of a member/frame when compressed.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import orjson
import zstandard

from mongocdc_core.events.records import Record, RecordRun
from mongocdc_core.positions import Position
from mongocdc_core.sinks.base import KeyScan, SinkError
from mongocdc_core.sinks.readback import KeyScanBuilder

log = logging.getLogger(__name__)

COMPRESSIONS = {"none": ".jsonl", "gzip": ".jsonl.gz", "zstd": ".jsonl.zst"}
_GZIP_WBITS = 31  # zlib's gzip container
_ZSTD_LEVEL = 3


class _Compressor(Protocol):
    def compress(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


def _new_compressor(compression: str) -> Callable[[], _Compressor]:
    if compression == "gzip":
        return lambda: zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)
    if compression == "zstd":
        # A ZstdCompressor runs one operation at a time: one per member, as topics interleave.
        return lambda: zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True).compressobj()  # type: ignore[return-value]
    raise SinkError(f"mongocdc.jsonl.compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")


class _TopicFile:
    """One topic's open file; with compression, the member/frame being written."""

    __slots__ = ("handle", "new_compressor", "compressor")

    def __init__(self, handle: BinaryIO, new_compressor: Callable[[], _Compressor] | None) -> None:
        self.handle = handle
        self.new_compressor = new_compressor
        self.compressor: _Compressor | None = None

    def write(self, data: bytes) -> None:
        if self.new_compressor is None:
            self.handle.write(data)
            return
        if self.compressor is None:
            self.compressor = self.new_compressor()
        self.handle.write(self.compressor.compress(data))

    def flush(self) -> None:
        """End the open member/frame (it becomes readable on its own), then fsync."""
        if self.compressor is not None:
            self.handle.write(self.compressor.flush())
            self.compressor = None
        self.handle.flush()
        os.fsync(self.handle.fileno())


#: Lines joined into one write. A batch's lines joined whole made one allocation of megabytes per
#: batch, fresh memory the kernel had to fault in each time; that cost more than the writes themselves
#: (0.64-0.95 of a bare per-line loop against 2.4-2.9 in chunks of 64, schemas on).
_LINES_PER_WRITE = 64


class JsonlSink:
    """Appends records to ``<directory>/<topic>.jsonl`` (``.gz``/``.zst`` compressed) in delivery order."""

    def __init__(self, directory: str | os.PathLike[str], *, compression: str = "none") -> None:
        if compression not in COMPRESSIONS:
            raise SinkError(f"mongocdc.jsonl.compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.compression = compression
        self.suffix = COMPRESSIONS[compression]
        self._new_compressor = None if compression == "none" else _new_compressor(compression)
        self._files: dict[str, _TopicFile] = {}
        self._dirty: set[str] = set()
        self._closed = False

    def path(self, topic: str) -> Path:
        """The file a topic's records go to."""
        return self.directory / f"{topic}{self.suffix}"

    def _file(self, topic: str) -> _TopicFile:
        handle = self._files.get(topic)
        if handle is None:
            if "/" in topic or topic in ("", ".", ".."):
                raise SinkError(f"topic {topic!r} cannot be used as a file name")
            path = self.path(topic)
            if self.compression == "none":
                _drop_torn_tail(path)
            else:
                _drop_torn_member(path, self.compression)
            handle = _TopicFile(open(path, "ab"), self._new_compressor)  # kept open across batches
            self._files[topic] = handle
        return handle

    def write(self, records: Sequence[Record]) -> None:
        if self._closed:
            raise SinkError("write to a closed jsonl sink")
        # The lines of a batch per topic, in delivery order, joined a few dozen at a time.
        lines: dict[str, list[bytes]] = {}
        if isinstance(records, RecordRun):  # a snapshot chunk: one topic, every key and value present
            lines[records.topic] = [b'{"key":%b,"value":%b}\n' % kv for kv in zip(records.keys(), records.values(), strict=True)]
        else:
            for record in records:
                topic_lines = lines.get(record.topic)
                if topic_lines is None:
                    topic_lines = lines[record.topic] = []
                topic_lines.append(b'{"key":%b,"value":%b}\n' % (record.key or b"null", record.value or b"null"))
        for topic, topic_lines in lines.items():
            try:
                handle = self._file(topic)
                for start in range(0, len(topic_lines), _LINES_PER_WRITE):
                    handle.write(b"".join(topic_lines[start : start + _LINES_PER_WRITE]))
            except OSError as exc:
                raise SinkError(f"cannot write to {self.path(topic)}: {exc}") from exc
            self._dirty.add(topic)

    def flush(self, timeout: float | None = None) -> None:
        try:
            for topic in self._dirty:
                self._files[topic].flush()
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
        with handle:
            if os.fstat(handle.fileno()).st_size < mark:
                log.warning("%s is shorter than when the snapshot began: its keys cannot be compared", path)
                return None
            for line, after_mark in _lines(handle, mark, self.compression):
                item = orjson.loads(line)
                builder.add(item.get("key"), item.get("value"), after_mark)
        return builder.build()

    def _readable(self, topic: str) -> Path:
        """The topic's file with everything written so far on disk (compressed: its member ended)."""
        handle = self._files.get(topic)
        if handle is not None:
            handle.flush()
        return self.path(topic)

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        for handle in self._files.values():
            handle.handle.close()
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


class _Decompressor(Protocol):
    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes) -> bytes: ...


def _new_decompressor(compression: str) -> _Decompressor:
    if compression == "gzip":
        return zlib.decompressobj(_GZIP_WBITS)
    return zstandard.ZstdDecompressor().decompressobj()  # type: ignore[return-value]


def _lines(handle: BinaryIO, mark: int, compression: str) -> Iterator[tuple[bytes, bool]]:
    """Every complete line of a landing file, and whether it starts at or after byte ``mark`` of
    the file. A torn last line was never acknowledged and is left out; so is the damaged part of a
    torn last member (its complete lines count, which can only keep a key, never delete one)."""
    pending = b""
    for text, after in _texts(handle, mark, compression):
        pending += text
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line + b"\n", after


def _texts(handle: BinaryIO, mark: int, compression: str) -> Iterator[tuple[bytes, bool]]:
    """The file's text in pieces, each wholly before or wholly after byte ``mark`` (compressed
    files: marks fall between members, so a member lies wholly on one side)."""
    offset = 0  # file offset just past the data read so far
    decompressor = None if compression == "none" else _new_decompressor(compression)
    while chunk := handle.read(1 << 20):
        start, offset = offset, offset + len(chunk)
        if decompressor is None:
            cut = min(max(mark - start, 0), len(chunk))
            yield chunk[:cut], False
            yield chunk[cut:], True
            continue
        data = chunk
        while data:
            after = offset - len(data) >= mark
            try:
                yield decompressor.decompress(data), after
            except (zlib.error, zstandard.ZstdError):
                return  # a damaged last member: never acknowledged
            if not decompressor.eof:
                break
            data = decompressor.unused_data
            decompressor = _new_decompressor(compression)


def _drop_torn_member(path: Path, compression: str) -> None:
    """The compressed counterpart of :func:`_drop_torn_tail`: cut a last member/frame that
    ``kill -9`` left incomplete (its records were never flushed, so they are delivered again).

    Members end only at flushes, so every complete one ends with a whole line; the file is read
    through once, member by member, without keeping what it decompresses.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return

    complete = 0  # end of the last complete member
    position = 0  # file offset where ``data`` starts
    decompressor = _new_decompressor(compression)
    with open(path, "rb") as fh:
        data = fh.read(1 << 20)
        while data:
            try:
                decompressor.decompress(data)
            except (zlib.error, zstandard.ZstdError):
                break  # damaged from here on: keep only the complete members before it
            if decompressor.eof:
                rest = decompressor.unused_data
                position += len(data) - len(rest)
                complete = position
                decompressor = _new_decompressor(compression)
                data = rest or fh.read(1 << 20)
            else:
                position += len(data)
                data = fh.read(1 << 20)
    if complete < size:
        with open(path, "r+b") as torn:
            torn.truncate(complete)
            torn.flush()
            os.fsync(torn.fileno())
