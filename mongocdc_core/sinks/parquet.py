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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from mongocdc_core.events.raw import native
from mongocdc_core.events.records import Record, RecordRun
from mongocdc_core.positions import Position
from mongocdc_core.sinks.base import KeyScan, SinkError
from mongocdc_core.sinks.readback import KeyScanBuilder, key_id

if TYPE_CHECKING:
    from mongocdc_native import Buffer, ChangeRows, LandingColumns

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
#: How the landing files are written: dictionary pages and min/max statistics only for the columns whose
#: values repeat or are filtered on (positions, op, topic); a document's text has neither use, and trying
#: a dictionary for it and keeping its statistics cost about a tenth of the write (Arrow's defaults do both
#: for every column). The rows are the same either way.
WRITE_OPTIONS: dict[str, list[str]] = {
    "use_dictionary": ["topic", "collection", "op", "snapshot", "source"],
    "write_statistics": ["topic", "collection", "op", "position", "pos_seconds", "pos_increment", "pos_ordinal",
                         "ts_ms", "snapshot"],
}  # fmt: skip


#: The payload fields the landing columns come from, as Arrow's JSON reader parses them.
PAYLOAD_SCHEMA = pa.schema(
    [
        ("ts_ms", pa.int64()),
        ("before", pa.string()),
        ("after", pa.string()),
        (
            "updateDescription",
            pa.struct([
                ("updatedFields", pa.string()),
                ("removedFields", pa.list_(pa.string())),
                ("truncatedArrays", pa.list_(pa.struct([("field", pa.string()), ("size", pa.int64())]))),
            ]),
        ),
        ("source", pa.struct([("snapshot", pa.string())])),
    ]
)
_SOURCE_START = b',"source":{'
_SOURCE_END = b'},"op":'
#: The landing columns taken from the key and value bytes (the walk's and the reader's alike).
_PAYLOAD_COLUMNS = ("key", "value", "ts_ms", "before", "after", "updated_fields", "removed_fields",
                    "truncated_arrays", "snapshot", "source")  # fmt: skip
#: The payload columns whose cells differ between a snapshot chunk's reads (the others are its first read's).
_RUN_OWN = frozenset({"key", "value", "after"})


def _text(value: Any) -> str | None:
    """Strings stay as they are (Debezium already serialized them); structures become JSON."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


class _PayloadText:
    """The payload part of JsonConverter messages as bytes, cut out rather than re-serialised.

    Every record of a topic starts with the same ``{"schema":…,"payload":`` head, so once one
    record showed where its payload starts, the next ones of the topic are sliced at the same
    place. A record that does not start with its topic's head is parsed whole.
    """

    def __init__(self) -> None:
        self._heads: dict[tuple[str, bool], bytes] = {}

    def head(self, topic: str, is_key: bool, raws: list[bytes | None]) -> bytes | None:
        """The head of the topic's keys or values, learnt from the first of ``raws`` if not known yet
        (None when they carry no schema part)."""
        if (topic, is_key) not in self._heads:
            first = next((raw for raw in raws if raw is not None), None)
            if first is not None:
                self.cut(topic, is_key, first)
        return self._heads.get((topic, is_key))

    def cut_values(self, topic: str, raws: list[bytes | None]) -> list[bytes | None]:
        """The payload bytes of a batch of one topic's values (None stays None: a tombstone)."""
        return self._cut_all(topic, False, raws)

    def cut_keys(self, topic: str, raws: list[bytes | None]) -> list[bytes | None]:
        """The payload bytes of a batch of one topic's keys."""
        return self._cut_all(topic, True, raws)

    def _cut_all(self, topic: str, is_key: bool, raws: list[bytes | None]) -> list[bytes | None]:
        cut = self.cut
        head = self._heads.get((topic, is_key))
        if head is None:
            first = next((raw for raw in raws if raw is not None), None)
            if first is None:
                return raws
            cut(topic, is_key, first)  # learns the topic's head when its records carry one
            head = self._heads.get((topic, is_key))
        if head is None:  # no schema part (schemas off) or a record whose head cannot be learned
            return [raw if raw is None or not raw.startswith(b'{"schema":') else cut(topic, is_key, raw) for raw in raws]
        n = len(head)
        return [
            None if raw is None else raw[n:-1] if raw.startswith(head) and raw.endswith(b"}") else cut(topic, is_key, raw)
            for raw in raws
        ]

    def cut(self, topic: str, is_key: bool, raw: bytes) -> bytes:
        """The payload bytes of one key or value."""
        head = self._heads.get((topic, is_key))
        if head is not None and raw.startswith(head) and raw.endswith(b"}"):
            return raw[len(head) : -1]
        if not raw.startswith(b'{"schema":'):
            return raw
        parsed = orjson.loads(raw)
        if not (isinstance(parsed, dict) and parsed.keys() == {"schema", "payload"}):
            return raw
        payload = orjson.dumps(parsed["payload"])
        cut = raw.find(b',"payload":')
        if cut >= 0 and raw[cut + 11 : -1] == payload:
            self._heads[(topic, is_key)] = raw[: cut + 11]
        return payload


def _source(value: bytes | None) -> bytes | None:
    """The ``source`` block of a payload, cut out of its bytes where the connector writes it: right
    before ``op``, as ``,"source":{…},"op":``. Neither marker can occur inside a JSON string (its quotes
    would be escaped), so the cut is the block itself when each occurs once (members of nested objects
    could be named so too) and it holds no nested object. None otherwise (another layout)."""
    if value is None or value.count(_SOURCE_START) != 1 or value.count(_SOURCE_END) != 1:
        return None
    start, end = value.find(_SOURCE_START), value.find(_SOURCE_END)
    text = value[start + 10 : end + 1] if start < end else None
    return text if text is not None and text.count(b"{") == 1 and text.count(b"}") == 1 else None


class _Columns:
    """One topic's pending landing rows, batch by batch as Arrow arrays: what Python takes from each
    record (collection, op, position) and the payload columns, parsed as each batch arrives (while its
    bytes are still in the processor's cache; a whole table's bytes are not).
    """

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.batches: list[dict[str, pa.Array | pa.ChunkedArray]] = []
        self.rows = 0
        self._first: Position | None = None

    def first_position(self) -> str:
        assert self._first is not None
        return self._first.to_str()

    def add(self, records: Sequence[Record], payloads: _PayloadText) -> None:
        """Append a batch of this topic's records: a snapshot chunk's run, change records whose landing rows
        their converter wrote (taken as they are), or others (their columns listed from their bytes)."""
        n = len(records)
        if isinstance(records, RecordRun):  # a snapshot chunk: one position, collection and op, no Record needed
            position = records.position
            batch: dict[str, pa.Array | pa.ChunkedArray] = {
                "collection": pa.repeat(pa.scalar(records.collection, pa.string()), n),
                "op": pa.repeat(pa.scalar(records.op, pa.string()), n),
                "position": pa.repeat(pa.scalar(position.to_str(), pa.string()), n),
                "pos_seconds": pa.repeat(pa.scalar(position.seconds, pa.int64()), n),
                "pos_increment": pa.repeat(pa.scalar(position.increment, pa.int64()), n),
                "pos_ordinal": pa.repeat(pa.scalar(position.ordinal, pa.int64()), n),
            }
            walked = self._run_parts(records, payloads) or self._run_walked(records, payloads)
            batch.update(walked or self._parsed(list(records.keys()), list(records.values()), payloads))
        else:
            position = records[0].position
            batch = _taken(records) or self._listed(records, payloads)
        if self._first is None:
            self._first = position
        self.batches.append(batch)
        self.rows += n

    def _listed(self, records: Sequence[Record], payloads: _PayloadText) -> dict[str, pa.Array | pa.ChunkedArray]:
        """The columns of records whose landing rows were not written with them, one list comprehension per
        column (a loop calling a method per record cost as much as Arrow's whole write)."""
        n = len(records)
        keys: list[bytes | None] = [r.key for r in records]
        values = [r.value for r in records]
        positions = [r.position for r in records]
        seconds = pa.array([p.seconds for p in positions], pa.int64())
        increments = pa.array([p.increment for p in positions], pa.int64())
        ordinals = pa.array([p.ordinal for p in positions], pa.int64())
        batch: dict[str, pa.Array | pa.ChunkedArray] = {
            "collection": pa.array([r.collection for r in records], pa.string()),
            "op": pa.array([r.op if r.value is not None else None for r in records], pa.string()),
            "position": pc.binary_join_element_wise(
                pc.utf8_lpad(pc.cast(seconds, pa.string()), 13, "0"),
                pc.utf8_lpad(pc.cast(increments, pa.string()), 10, "0"),
                pc.utf8_lpad(pc.cast(ordinals, pa.string()), 6, "0"),
                ".",
            ),
            "pos_seconds": seconds,
            "pos_increment": increments,
            "pos_ordinal": ordinals,
        }
        heads = records[0].heads
        if heads is not None and [r.heads for r in records].count(heads) != n:
            heads = None  # not every record written after the same schema parts: each is compared
        batch.update(self._walked(keys, values, payloads, heads) or self._parsed(keys, values, payloads))
        return batch

    def table(self) -> pa.Table:
        """The landing rows of every batch added."""
        columns = {"topic": pa.repeat(pa.scalar(self.topic, pa.string()), self.rows)}
        for name in _COLUMNS[1:]:
            parts = [batch[name] for batch in self.batches]
            chunks = [c for p in parts for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])]
            columns[name] = pa.chunked_array(chunks, LANDING_SCHEMA.field(name).type)
        return pa.Table.from_pydict(columns, schema=LANDING_SCHEMA)

    def _walked(self, keys: list[bytes | None], values: list[bytes | None], payloads: _PayloadText,
                heads: tuple[bytes, bytes] | None = None) -> dict[str, pa.Array] | None:  # fmt: skip
        """The payload columns of a batch from ``mongocdc_native.landing_columns``; None when it is not
        built or leaves the batch to Arrow's reader. ``heads``: the schema parts the converter wrote every
        record of the batch after (``Record.heads``); when they are the topic's, the walk cuts there
        without comparing them (most of a record's bytes)."""
        if native is None:
            return None
        key_head = payloads.head(self.topic, True, keys)
        value_head = payloads.head(self.topic, False, values)
        framed = heads is not None and heads == (key_head, value_head)
        return _walk_columns(len(values), native.landing_columns(keys, key_head, values, value_head, framed))

    def _run_parts(self, run: RecordRun, payloads: _PayloadText) -> dict[str, pa.Array] | None:
        """The payload columns of a snapshot chunk whose converter wrote its ``after`` column
        (:attr:`RecordRun.afters`): that column as it is, the keys' and values' payloads cut at their heads,
        and every other column the first read's (a run's reads share every byte around their ``after``).
        No record is walked but the first; None when the run has no such column or other heads."""
        if native is None or run.afters is None or not len(run):
            return None
        first = run[0]
        key_head = payloads.head(self.topic, True, [first.key])
        value_head = payloads.head(self.topic, False, [first.value])
        if key_head is None or value_head is None or run.heads != (key_head, value_head):
            return None
        keys, key_ends, values, value_ends, lo, hi = run.buffers()
        cut = native.run_payloads(keys, key_ends, values, value_ends, lo, hi, len(key_head), len(value_head))
        one = _walk_columns(1, native.landing_columns([first.key], key_head, [first.value], value_head, True))
        if cut is None or one is None:
            return None
        rows = len(run)
        offsets, data = run.afters
        after = pa.Array.from_buffers(pa.string(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)], offset=lo)
        if after[0] != one["after"][0]:
            return None  # not the column of these records' values: the walk decides
        columns = {name: pa.repeat(one[name][0], rows) for name in _PAYLOAD_COLUMNS if name not in _RUN_OWN}
        return {**columns, "key": _strings(rows, cut[0]), "value": _strings(rows, cut[1]), "after": after}

    def _run_walked(self, run: RecordRun, payloads: _PayloadText) -> dict[str, pa.Array] | None:
        """``_walked`` of a snapshot chunk, read from the run's buffers (no bytes object per record)."""
        if native is None or not len(run):
            return None
        first = run[0]
        key_head = payloads.head(self.topic, True, [first.key])
        value_head = payloads.head(self.topic, False, [first.value])
        keys, key_ends, values, value_ends, lo, hi = run.buffers()
        framed = run.heads is not None and run.heads == (key_head, value_head)  # see _walked
        walked = native.run_landing_columns(keys, key_ends, values, value_ends, lo, hi, key_head, value_head, framed)
        return _walk_columns(len(run), walked)

    def _parsed(self, keys: list[bytes | None], values: list[bytes | None], payloads: _PayloadText
                ) -> dict[str, pa.Array | pa.ChunkedArray]:  # fmt: skip
        """The payload columns of a batch cut in Python and parsed by Arrow's JSON reader (the same
        columns as the compiled walk, at about twice the cost)."""
        values = payloads.cut_values(self.topic, values)
        lines = [v if v is not None and v[:1] == b"{" else b"{}" for v in values]
        try:
            payload = _parse_payloads(lines)
        except pa.ArrowInvalid:  # a payload whose fields have other types (e.g. the 1.x boolean snapshot)
            payload = _parse_payloads_slowly(lines)
        update = payload.column("updateDescription")
        return {
            "key": pa.array(payloads.cut_keys(self.topic, keys), pa.string()),
            "value": pa.array(values, pa.string()),
            "ts_ms": payload.column("ts_ms"),
            "before": payload.column("before"),
            "after": payload.column("after"),
            "updated_fields": pc.struct_field(update, "updatedFields"),
            "removed_fields": pc.struct_field(update, "removedFields"),
            "truncated_arrays": _truncated_text(pc.struct_field(update, "truncatedArrays")),
            "snapshot": pc.struct_field(payload.column("source"), "snapshot"),
            "source": pa.array(_sources(values, lines, payload.column("source")), pa.string()),
        }


def _taken(records: Sequence[Record]) -> dict[str, pa.Array | pa.ChunkedArray] | None:
    """The columns of change records whose converter wrote their landing rows (:attr:`Record.parts`), taken
    as they are: each run of consecutive rows of one chunk sliced out of the chunk's buffers (no copy, nothing
    per record but reading its parts). None when a record has no row (the walk then lands the batch from
    the records' bytes: the same columns)."""
    if native is None:
        return None
    runs = native.take_rows([r.parts for r in records])
    if runs is None:
        return None
    chunks: dict[int, dict[str, pa.Array]] = {}
    slices: list[dict[str, pa.Array | pa.ChunkedArray]] = []
    for taken, lo, hi in runs:
        columns = chunks.get(id(taken))
        if columns is None:
            columns = _chunk_columns(taken)
            if columns is None:
                return None
            chunks[id(taken)] = columns
        slices.append({name: column.slice(lo, hi - lo) for name, column in columns.items()})
    if len(slices) == 1:
        return slices[0]
    return {name: pa.chunked_array([s[name] for s in slices]) for name in slices[0]}


def _chunk_columns(taken: ChangeRows) -> dict[str, pa.Array] | None:
    """Every landing column of a chunk of change rows (as ``take_rows`` gives it), over its buffers."""
    rows, collection, walked, (seconds, increments, ordinals), positions, ops = taken
    columns = _walk_columns(rows, walked)
    if columns is None:
        return None
    return columns | {
        "collection": pa.repeat(pa.scalar(collection, pa.string()), rows),
        "op": _strings(rows, ops),
        "position": _strings(rows, positions),
        "pos_seconds": pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(seconds)]),
        "pos_increment": pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(increments)]),
        "pos_ordinal": pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(ordinals)]),
    }


def _walk_columns(rows: int, walked: LandingColumns | None) -> dict[str, pa.Array] | None:
    """The payload columns over the buffers of the compiled walk (None: it left the batch to the reader)."""
    if walked is None:
        return None
    key, value, (ts, ts_valid, ts_nulls), before, after, updated, removed, truncated, snapshot, source = walked
    truncated_texts = _strings(rows, truncated)
    if truncated_texts.null_count != rows:
        try:
            truncated_texts = pa.array(
                [None if t is None else _truncated_as_read(t) for t in truncated_texts.to_pylist()], pa.string()
            )
        except (_NeedsReader, orjson.JSONDecodeError):  # the reader path decides (or reports the error)
            return None
    list_offsets, list_valid, list_nulls, items = removed
    return {
        "key": _strings(rows, key),
        "value": _strings(rows, value),
        "ts_ms": pa.Array.from_buffers(pa.int64(), rows, [_validity(ts_valid, ts_nulls), pa.py_buffer(ts)],
                                       null_count=ts_nulls),
        "before": _strings(rows, before),
        "after": _strings(rows, after),
        "updated_fields": _strings(rows, updated),
        "removed_fields": pa.Array.from_buffers(
            pa.list_(pa.string()), rows, [_validity(list_valid, list_nulls), pa.py_buffer(list_offsets)],
            null_count=list_nulls, children=[_strings(len(items[0]) // 4 - 1, items)],
        ),
        "truncated_arrays": truncated_texts,
        "snapshot": _strings(rows, snapshot),
        "source": _strings(rows, source),
    }  # fmt: skip


def _sources(values: list[bytes | None], lines: list[bytes], parsed: pa.ChunkedArray) -> list[bytes | None]:
    """The ``source`` texts of the payloads that have one (``parsed``: the reader's ``source`` column), cut
    out of their bytes; one that cannot be cut is written again from the parsed payload (compact, so
    a payload of another layout may read differently from how it was written)."""
    sources: list[bytes | None] = []
    for value, line, present in zip(values, lines, parsed.is_valid().to_pylist(), strict=True):
        text = _source(value) if present else None
        sources.append(orjson.dumps(orjson.loads(line)["source"]) if present and text is None else text)
    return sources


class _NeedsReader(Exception):
    """A ``truncatedArrays`` entry of a shape Arrow's reader decides (it refuses or converts it)."""


def _truncated_as_read(text: str) -> str:
    """``truncatedArrays`` JSON text as the reader's struct list spells it (``field`` then ``size``)."""
    items = orjson.loads(text)
    out: list[dict[str, object] | None] = []
    for item in items:
        if item is None:
            out.append(None)
            continue
        if not isinstance(item, dict):
            raise _NeedsReader
        field, size = item.get("field"), item.get("size")
        if not (field is None or isinstance(field, str)) or not (size is None or (type(size) is int and -(2**63) <= size < 2**63)):
            raise _NeedsReader
        out.append({"field": field, "size": size})
    return orjson.dumps(out).decode()


def _validity(bits: Buffer, nulls: int) -> pa.Buffer | None:
    return pa.py_buffer(bits) if nulls else None


def _strings(rows: int, column: tuple[Buffer, Buffer, Buffer, int]) -> pa.Array:
    """An Arrow string array over the compiled walk's buffers (no copy)."""
    offsets, data, valid, nulls = column
    return pa.Array.from_buffers(pa.string(), rows, [_validity(valid, nulls), pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)  # fmt: skip


def _add_by_topic(pending: dict[str, _Columns], records: Sequence[Record], payloads: _PayloadText) -> None:
    """Append ``records`` to their topics' pending columns, keeping each topic's order."""
    if not records:
        return
    if isinstance(records, RecordRun):
        groups: Mapping[str, Sequence[Record]] = {records.topic: records}
    elif (topics := [r.topic for r in records]).count(topics[0]) == len(topics):  # one collection's changes
        groups = {topics[0]: records}
    else:
        split: dict[str, list[Record]] = {}
        for record in records:
            split.setdefault(record.topic, []).append(record)
        groups = split
    for topic, batch in groups.items():
        columns = pending.get(topic)
        if columns is None:
            columns = pending[topic] = _Columns(topic)
        columns.add(batch, payloads)


def landing_table(records: Sequence[Record]) -> pa.Table:
    """The landing-zone rows of ``records``, exactly as the sink writes them (in order per topic)."""
    by_topic: dict[str, _Columns] = {}
    _add_by_topic(by_topic, records, _PayloadText())
    tables = [columns.table() for columns in by_topic.values()]
    return pa.concat_tables(tables) if tables else LANDING_SCHEMA.empty_table()


def _parse_payloads(lines: list[bytes]) -> pa.Table:
    """Arrow's JSON reader over the payloads as JSON Lines (a block must hold the longest line). On the
    calling thread: Arrow's thread pool cost about a tenth more CPU than it saved in wall time, and the
    sink shares its cores with the reader and the dispatcher."""
    data = b"\n".join(lines)
    block = min(max(1 << 20, 2 * max(map(len, lines), default=0) + 2), 2**31 - 1)
    return pa_json.read_json(
        pa.BufferReader(data),
        read_options=pa_json.ReadOptions(block_size=block, use_threads=False),
        parse_options=pa_json.ParseOptions(explicit_schema=PAYLOAD_SCHEMA, unexpected_field_behavior="ignore"),
    )


def _parse_payloads_slowly(lines: list[bytes]) -> pa.Table:
    """The same columns parsed in Python, for payloads whose field types Arrow refuses."""
    rows = []
    for line in lines:
        envelope = orjson.loads(line)
        envelope = envelope if isinstance(envelope, dict) else {}
        update = envelope.get("updateDescription")
        source = envelope.get("source")
        rows.append({
            "ts_ms": envelope.get("ts_ms"),
            "before": _text(envelope.get("before")),
            "after": _text(envelope.get("after")),
            "updateDescription": None if not isinstance(update, dict) else {
                "updatedFields": _text(update.get("updatedFields")),
                "removedFields": update.get("removedFields"),
                "truncatedArrays": update.get("truncatedArrays"),
            },
            "source": {"snapshot": _text(source.get("snapshot"))} if isinstance(source, dict) else None,
        })  # fmt: skip
    return pa.Table.from_pylist(rows, schema=PAYLOAD_SCHEMA)


def _truncated_text(truncated: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``truncatedArrays`` as JSON text (rare: only updates that shrank an array have it)."""
    if truncated.null_count == len(truncated):
        return pa.nulls(len(truncated), pa.string())
    return pa.array([None if t is None else _text(t) for t in truncated.to_pylist()], pa.string())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ParquetSink:
    """Writes records as landing-zone Parquet (see the module docstring for the two layouts)."""

    #: Its converter writes the landing columns it can with the records (``base.takes_landing_columns``).
    landing_columns = True

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
        _add_by_topic(self._pending, records, self._payloads)
        if self.path is not None and sum(c.rows for c in self._pending.values()) >= _ROW_GROUP_ROWS:
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
            self._writer = pq.ParquetWriter(self._tmp, LANDING_SCHEMA, **WRITE_OPTIONS)
        tables = [c.table() for c in pending]
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        self._writer.write_table(table, row_group_size=_ROW_GROUP_ROWS)
        self.rows_written += table.num_rows

    def _write_rolling(self) -> None:
        """One new file per topic, complete on disk before ``flush`` returns."""
        assert self.directory is not None
        for topic, columns in self._pending.items():
            if not columns.rows:
                continue
            folder = self.directory / topic
            folder.mkdir(parents=True, exist_ok=True)
            name = f"part-{columns.first_position()}-{uuid.uuid4().hex[:8]}.parquet"
            tmp = folder / f".{name}.tmp"
            pq.write_table(columns.table(), tmp, **WRITE_OPTIONS)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, folder / name)
            _fsync_dir(folder)
            self.rows_written += columns.rows
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
            pq.write_table(LANDING_SCHEMA.empty_table(), self._tmp, **WRITE_OPTIONS)
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
