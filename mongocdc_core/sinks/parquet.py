"""Parquet landing zone: one column per envelope field plus the record's position.

Two layouts share the same columns (``LANDING_SCHEMA``):
- ``ParquetSink(directory)``: rolling files ``<dir>/<topic>/part-<first position>-<n>.parquet``,
  one per topic per flush, each written to a temporary name and renamed when complete;
- ``ParquetSink.to_file(path)``: exactly one file, renamed into place at ``close`` so a re-run of
  a Dagster partition replaces its output atomically instead of duplicating it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position
from mongocdc_core.sinks.base import KeyScan, SinkError
from mongocdc_core.sinks.readback import KeyScanBuilder, key_id

LANDING_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("collection", pa.string()),
        ("key", pa.string()),
        ("op", pa.string()),
        ("position", pa.string()),
        ("pos_seconds", pa.int64()),
        ("pos_increment", pa.int64()),
        ("pos_ordinal", pa.int64()),
        ("ts_ms", pa.int64()),
        ("before", pa.string()),
        ("after", pa.string()),
        ("updated_fields", pa.string()),
        ("removed_fields", pa.list_(pa.string())),
        ("truncated_arrays", pa.string()),
        ("snapshot", pa.string()),
        ("source", pa.string()),
        ("value", pa.string()),
    ]
)
_COLUMNS = LANDING_SCHEMA.names
_ROW_GROUP_ROWS = 50_000


def _payload(raw: bytes | None) -> Any:
    """The payload of a JsonConverter message, with or without its ``schema`` part."""
    if raw is None:
        return None
    parsed = orjson.loads(raw)
    if isinstance(parsed, dict) and parsed.keys() == {"schema", "payload"}:
        return parsed["payload"]
    return parsed


def _text(value: Any) -> str | None:
    """Strings stay as they are (Debezium already serialized them); structures become JSON."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def landing_row(record: Record) -> dict[str, Any]:
    """Flatten one record into the landing-zone columns (absent fields are null)."""
    key = _payload(record.key)
    value = _payload(record.value)
    envelope: dict[str, Any] = value if isinstance(value, dict) else {}
    source = envelope.get("source")
    update = envelope.get("updateDescription") or {}
    removed = update.get("removedFields")
    return {
        "topic": record.topic,
        "collection": record.collection,
        "key": _text(key),
        "op": record.op if value is not None else None,
        "position": record.position.to_str(),
        "pos_seconds": record.position.seconds,
        "pos_increment": record.position.increment,
        "pos_ordinal": record.position.ordinal,
        "ts_ms": envelope.get("ts_ms"),
        "before": _text(envelope.get("before")),
        "after": _text(envelope.get("after")),
        "updated_fields": _text(update.get("updatedFields")),
        "removed_fields": list(removed) if removed is not None else None,
        "truncated_arrays": _text(update.get("truncatedArrays")),
        "snapshot": _text(source.get("snapshot")) if isinstance(source, dict) else None,
        "source": _text(source),
        "value": _text(value),
    }


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=LANDING_SCHEMA)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ParquetSink:
    """Writes records as landing-zone Parquet (see the module docstring for the two layouts)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory: Path | None = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path: Path | None = None
        self._pending: dict[str, list[dict[str, Any]]] = {}
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None
        self._closed = False
        self.rows_written = 0

    @classmethod
    def to_file(cls, path: str | os.PathLike[str]) -> ParquetSink:
        """A sink whose whole output becomes the single file ``path`` when it is closed."""
        sink = cls.__new__(cls)
        sink.directory = None
        sink.path = Path(path)
        sink.path.parent.mkdir(parents=True, exist_ok=True)
        sink._pending = {}
        sink._writer = None
        sink._tmp = sink.path.with_name(f".{sink.path.name}.{uuid.uuid4().hex}.tmp")
        sink._closed = False
        sink.rows_written = 0
        return sink

    def write(self, records: Sequence[Record]) -> None:
        if self._closed:
            raise SinkError("write to a closed parquet sink")
        for record in records:
            self._pending.setdefault(record.topic, []).append(landing_row(record))
        if self.path is not None and sum(len(r) for r in self._pending.values()) >= _ROW_GROUP_ROWS:
            self._write_single()

    def flush(self, timeout: float | None = None) -> None:
        try:
            if self.path is not None:
                self._write_single()
            else:
                self._write_rolling()
        except OSError as exc:
            raise SinkError(f"cannot write parquet landing files: {exc}") from exc

    def _write_single(self) -> None:
        """Append pending rows as a row group of the temporary file (renamed at close)."""
        rows = [row for topic_rows in self._pending.values() for row in topic_rows]
        self._pending.clear()
        if not rows:
            return
        assert self._tmp is not None
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp, LANDING_SCHEMA)
        self._writer.write_table(_table(rows))
        self.rows_written += len(rows)

    def _write_rolling(self) -> None:
        """One new file per topic, complete on disk before ``flush`` returns."""
        assert self.directory is not None
        for topic, rows in self._pending.items():
            if not rows:
                continue
            folder = self.directory / topic
            folder.mkdir(parents=True, exist_ok=True)
            name = f"part-{rows[0]['position']}-{uuid.uuid4().hex[:8]}.parquet"
            tmp = folder / f".{name}.tmp"
            pq.write_table(_table(rows), tmp)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, folder / name)
            _fsync_dir(folder)
            self.rows_written += len(rows)
        self._pending.clear()

    def key_mark(self, topic: str) -> None:
        """Rows carry their positions: the scan splits at the snapshot's position, no mark is needed."""
        return None

    def scan_keys(self, topic: str, mark: Any, since: Position) -> KeyScan | None:
        """The keys of the topic's landing files, split at position ``since`` (None for a single-file sink,
        which holds one run's output, not what downstream has)."""
        if self.directory is None:
            return None
        files = sorted((self.directory / topic).glob("part-*.parquet"))
        if not files:
            return KeyScan()
        columns = ["key", "op", "pos_seconds", "pos_increment", "pos_ordinal"]
        rows = pa.concat_tables([pq.read_table(f, columns=columns) for f in files]).to_pylist()
        rows.sort(key=lambda r: (r["pos_seconds"], r["pos_increment"], r["pos_ordinal"]))  # stable: file order
        builder = KeyScanBuilder()
        start = (since.seconds, since.increment, since.ordinal)
        for row in rows:
            key = orjson.loads(row["key"]) if row["key"] else None
            position = (row["pos_seconds"], row["pos_increment"], row["pos_ordinal"])
            builder.add_deleted(key_id(key), row["op"] in (None, "d"), position >= start)
        return builder.build()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        if self.path is None:
            return
        assert self._tmp is not None
        if self._writer is None:  # no records: the partition's output is an empty file, not a stale one
            pq.write_table(_table([]), self._tmp)
        else:
            self._writer.close()
        with open(self._tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(self._tmp, self.path)
        _fsync_dir(self.path.parent)

    def abort(self) -> None:
        """Discard a single-file sink's output (a failed run must not replace the previous file)."""
        self._closed = True
        if self._writer is not None:
            self._writer.close()
        if self._tmp is not None and self._tmp.exists():
            self._tmp.unlink()
