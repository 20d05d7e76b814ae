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
from mongocdc_core.sinks.base import SinkError

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


def _text(value: Any) -> str | None:
    """Strings stay as they are (Debezium already serialized them); structures become JSON."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _source_text(payload: bytes, source: Any) -> str | None:
    """The ``source`` block's text, cut out of the payload rather than re-serialised.

    In an envelope ``"source":{`` and ``},"op":`` cannot occur inside a string (a quote inside a
    JSON string is escaped), so the block is found by them; anything else is re-serialised.
    """
    if not isinstance(source, dict):
        return _text(source)
    start = payload.find(b',"source":{')
    end = payload.find(b'},"op":', start)
    if start < 0 or end < 0:
        return _text(source)
    text = payload[start + 10 : end + 1]
    return text.decode() if text.count(b"{") == 1 or orjson.loads(text) == source else _text(source)


class _PayloadText:
    """The payload part of JsonConverter messages as bytes, cut out rather than re-serialised.

    Every record of a topic starts with the same ``{"schema":…,"payload":`` head, so once one
    record showed where its payload starts, the next ones of the topic are sliced at the same
    place (and parsed without their schema). A record that does not start with its topic's head
    is parsed whole.
    """

    def __init__(self) -> None:
        self._heads: dict[tuple[str, bool], bytes] = {}

    def split(self, topic: str, is_key: bool, raw: bytes) -> tuple[bytes, Any]:
        """(payload bytes, parsed payload) of one key or value."""
        head = self._heads.get((topic, is_key))
        if head is not None and raw.startswith(head) and raw.endswith(b"}"):
            text = raw[len(head) : -1]
            return text, orjson.loads(text)
        parsed = orjson.loads(raw)
        if not (isinstance(parsed, dict) and parsed.keys() == {"schema", "payload"}):
            return raw, parsed
        payload = orjson.dumps(parsed["payload"])
        cut = raw.find(b',"payload":')
        if cut >= 0 and raw[cut + 11 : -1] == payload:
            self._heads[(topic, is_key)] = raw[: cut + 11]
        return payload, parsed["payload"]


class _Columns:
    """Landing rows kept column by column (what ``pa.Table.from_pydict`` takes fastest)."""

    def __init__(self) -> None:
        self.lists: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
        self.rows = 0

    def add(self, record: Record, payloads: _PayloadText) -> None:
        c = self.lists
        key_text: str | None = None
        if record.key is not None:
            text, parsed = payloads.split(record.topic, True, record.key)
            key_text = parsed if isinstance(parsed, str) else text.decode()
        envelope: dict[str, Any] = {}
        value_text: str | None = None
        source_text: str | None = None
        if record.value is not None:
            text, parsed = payloads.split(record.topic, False, record.value)
            value_text = parsed if isinstance(parsed, str) else text.decode()
            if isinstance(parsed, dict):
                envelope = parsed
                source_text = _source_text(text, envelope.get("source"))
        source = envelope.get("source")
        update = envelope.get("updateDescription") or {}
        removed = update.get("removedFields")
        position = record.position
        c["topic"].append(record.topic)
        c["collection"].append(record.collection)
        c["key"].append(key_text)
        c["op"].append(record.op if record.value is not None else None)
        c["position"].append(position.to_str())
        c["pos_seconds"].append(position.seconds)
        c["pos_increment"].append(position.increment)
        c["pos_ordinal"].append(position.ordinal)
        c["ts_ms"].append(envelope.get("ts_ms"))
        c["before"].append(_text(envelope.get("before")))
        c["after"].append(_text(envelope.get("after")))
        c["updated_fields"].append(_text(update.get("updatedFields")))
        c["removed_fields"].append(list(removed) if removed is not None else None)
        c["truncated_arrays"].append(_text(update.get("truncatedArrays")))
        c["snapshot"].append(_text(source.get("snapshot")) if isinstance(source, dict) else None)
        c["source"].append(source_text)
        c["value"].append(value_text)
        self.rows += 1

    def table(self) -> pa.Table:
        return pa.Table.from_pydict(self.lists, schema=LANDING_SCHEMA)


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
        self._init_state()

    def _init_state(self) -> None:
        self._pending: dict[str, _Columns] = {}
        self._payloads = _PayloadText()
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
        sink._init_state()
        sink._tmp = sink.path.with_name(f".{sink.path.name}.{uuid.uuid4().hex}.tmp")
        return sink

    def write(self, records: Sequence[Record]) -> None:
        if self._closed:
            raise SinkError("write to a closed parquet sink")
        pending = self._pending
        payloads = self._payloads
        for record in records:
            columns = pending.get(record.topic)
            if columns is None:
                columns = pending[record.topic] = _Columns()
            columns.add(record, payloads)
        if self.path is not None and sum(c.rows for c in pending.values()) >= _ROW_GROUP_ROWS:
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
        """Append pending rows as row groups of the temporary file (renamed at close)."""
        pending = [c for c in self._pending.values() if c.rows]
        self._pending.clear()
        if not pending:
            return
        assert self._tmp is not None
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp, LANDING_SCHEMA)
        table = pa.concat_tables([c.table() for c in pending]) if len(pending) > 1 else pending[0].table()
        self._writer.write_table(table)
        self.rows_written += table.num_rows

    def _write_rolling(self) -> None:
        """One new file per topic, complete on disk before ``flush`` returns."""
        assert self.directory is not None
        for topic, columns in self._pending.items():
            if not columns.rows:
                continue
            folder = self.directory / topic
            folder.mkdir(parents=True, exist_ok=True)
            name = f"part-{columns.lists['position'][0]}-{uuid.uuid4().hex[:8]}.parquet"
            tmp = folder / f".{name}.tmp"
            pq.write_table(columns.table(), tmp)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, folder / name)
            _fsync_dir(folder)
            self.rows_written += columns.rows
        self._pending.clear()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        if self.path is None:
            return
        assert self._tmp is not None
        if self._writer is None:  # no records: the partition's output is an empty file, not a stale one
            pq.write_table(_Columns().table(), self._tmp)
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
