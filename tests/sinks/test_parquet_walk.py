"""The compiled walk of record payloads (``mongocdc_native.landing_columns``) gives exactly the landing
columns Arrow's JSON reader gives, and takes the records the connector writes."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Sequence
from typing import Any

import bson
import mongocdc_native
import orjson
import pyarrow as pa
import pytest
from bson.codec_options import CodecOptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.raw import RawChange, RawDocuments
from mongocdc_core.events.records import Record, RecordRun
from mongocdc_core.positions import Position
from mongocdc_core.sinks import parquet
from mongocdc_core.sinks.base import takes_landing_columns
from mongocdc_core.sinks.jsonl import JsonlSink
from mongocdc_core.sinks.parquet import landing_table
from mongocdc_core.sinks.tee import TeeSink
from tests.events.helpers import POSITION, change, insert, update
from tests.events.test_raw_changes import java_documents, java_scalars

TOPIC = "p.inventory.orders"


def _both(records: Sequence[Record], monkeypatch: pytest.MonkeyPatch) -> tuple[pa.Table, pa.Table] | None:
    """The landing table with the compiled walk, and with Arrow's reader alone. None where the reader
    refuses the records, after checking that the same error reaches the sink with the walk."""
    with monkeypatch.context() as patch:
        patch.setattr(parquet, "native", None)
        try:
            read = landing_table(records)
        except (pa.ArrowInvalid, orjson.JSONDecodeError) as refused:
            with pytest.raises(type(refused)):
                landing_table(records)
            return None
    return landing_table(records), read


def test_the_walk_takes_the_connectors_records_and_gives_the_readers_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    for schemas in (True, False):
        conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", schemas_enable=schemas, now_ns=lambda: 7,
                                           capture_mode="change_streams_update_full_with_pre_image"))  # fmt: skip
        doc = {"_id": 1, "name": 'a "quoted"\\ name\n\t\x01', "emoji": "\U0001f600 é", "n": [1, {"x": None}]}
        shrunk = {"updatedFields": {"n": [1]}, "removedFields": ["old"], "truncatedArrays": [{"field": "n", "newSize": 1}]}
        events = [insert(doc), update(), update(updateDescription=shrunk), change("delete")]
        records = [r for ev in events for r in conv.convert_change(ev, POSITION)]
        values = [r.value for r in records]
        keys = [r.key for r in records]
        payloads = parquet._PayloadText()
        value_head = payloads.head(records[0].topic, False, values)
        key_head = payloads.head(records[0].topic, True, keys)
        assert (value_head is not None) == schemas
        assert mongocdc_native.landing_columns(keys, key_head, values, value_head) is not None
        both = _both(records, monkeypatch)
        assert both is not None and both[0].equals(both[1])
        assert orjson.loads(both[0].column("after")[0].as_py()) == {
            "_id": 1, "name": doc["name"], "emoji": doc["emoji"], "n": [1, {"x": None}]}  # fmt: skip


@pytest.mark.parametrize(
    "value",
    [
        b'{"after":"{}","after":"{\\"a\\": 1}","source":{"snapshot":"false"},"op":"c"}',  # a repeated member
        b'{"\\u0061fter":"{}","source":{"snapshot":"false"},"op":"c"}',  # an escaped member name
        b'{"after":"{}","source":{"snapshot":true},"op":"c","ts_ms":5}',  # the 1.x boolean snapshot
        b'{"after":"{}","source":{"snapshot":"false"},"op":"c","ts_ms":5.0}',  # a fraction in ts_ms
        b'{"after":"\\ud800","source":{"snapshot":"false"},"op":"c"}',  # a lone surrogate (refused by both)
        b'{"x":"\\udc00","op":"c"}',  # a lone low surrogate in a member the walk only skips
        b'{"x":1e999,"op":"c"}',  # a number beyond a double (refused by both)
        b'{"op":"c","source":{"db":"a"}}',  # source not right before op
        b'{"before":null,"source": {"a": 1}, "op":"c"}',  # blanks around the source block
        b'{"source":{"snapshot":"x"},"op":"c"}',  # source first: no comma before it
        b'{"before":null,"source":{"a":{"b":1}},"op":"c"}',  # a nested object in source
        b'{"before":null,"source":{"snapshot":"a"},"op":"c","transaction":{"id":"t","source":{"x":1},"op":"c"}}',
    ],
)
def test_the_walk_leaves_what_it_does_not_take_to_the_reader(value: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forms the walk does not take, or takes only where the reader path cuts the same ``source`` text:
    it refuses the batch, and the reader's columns (or its error) are what the sink gets."""
    assert mongocdc_native.landing_columns([b'{"id":"1"}'], None, [value], None) is None
    both = _both([Record(TOPIC, b'{"id":"1"}', value, Position(1, 1), "inventory.orders", "c")], monkeypatch)
    assert both is None or both[0].equals(both[1])


def test_the_source_block_is_the_top_level_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A nested object with members named ``source`` and ``op`` after the top-level block: both paths take
    the top-level block (the reader path's cut once took the nested one)."""
    value = b'{"before":null,"source":{"snapshot":"a"},"op":"c","transaction":{"id":"t","source":{"x":1},"op":"c"}}'
    both = _both([Record(TOPIC, b'{"id":"1"}', value, Position(1, 1), "inventory.orders", "c")], monkeypatch)
    assert both is not None
    assert both[0].column("source").to_pylist() == both[1].column("source").to_pylist() == ['{"snapshot":"a"}']


_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
_json_text = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
).map(lambda value: orjson.dumps(value).decode())
_truncated = st.lists(
    st.none() | st.fixed_dictionaries({"field": _text, "size": st.integers(0, 99)}, optional={"extra": st.booleans()}),
    max_size=2,
)
_update = st.fixed_dictionaries(
    {},
    optional={
        "updatedFields": st.none() | _json_text,
        "removedFields": st.none() | st.lists(_text, max_size=3),
        "truncatedArrays": st.none() | _truncated,
        "other": _json_text,
    },
)
_payload = st.fixed_dictionaries(
    {},
    optional={
        "before": st.none() | _json_text,
        "after": st.none() | _json_text,
        "updateDescription": st.none() | _update,
        "source": st.none() | st.fixed_dictionaries({}, optional={"snapshot": st.none() | _text, "ord": st.integers(0, 9)}),
        "op": st.sampled_from(["c", "u", "d", "r"]),
        "ts_ms": st.none() | st.integers(-(2**62), 2**62),
        "transaction": st.none() | st.fixed_dictionaries(
            {"id": _text}, optional={"source": st.fixed_dictionaries({"x": st.integers(0, 9)}), "op": st.just("c")}
        ),
    },
).flatmap(lambda payload: st.permutations(list(payload.items())).map(dict))  # members in any order


def _record(payload: dict[str, Any] | None, schema: bool, spelling: tuple[bool, bool]) -> Record:
    """A record of ``payload``, written compactly as the connector does, or (``spelling``) with blanks
    after separators and/or non-ASCII and ``/`` escaped, as another writer might."""
    blanks, escaped = spelling
    document = {"schema": {"name": "A"}, "payload": payload} if schema else payload
    if payload is None:
        value = None
    elif blanks or escaped:
        text = json.dumps(document, ensure_ascii=escaped, separators=(", ", ": ") if blanks else (",", ":"))
        value = (text.replace("/", "\\/") if escaped else text).encode()
    else:
        value = orjson.dumps(document)
    key = orjson.dumps({"schema": {"name": "K"}, "payload": {"id": "1"}} if schema else {"id": "1"})
    return Record(TOPIC, key, value, Position(1, 1), "inventory.orders", None if payload is None else payload.get("op"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.tuples(st.none() | _payload, st.tuples(st.booleans(), st.booleans())), min_size=1, max_size=6),
    schema=st.booleans(),
)
def test_the_walk_and_the_reader_give_the_same_columns(
    rows: list[tuple[dict[str, Any] | None, tuple[bool, bool]]], schema: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [_record(payload, schema, spelling) for payload, spelling in rows]
    both = _both(records, monkeypatch)
    assert both is not None and both[0].to_pylist() == both[1].to_pylist()


def _reads(run: bool, schemas: bool) -> Sequence[Record]:
    """A snapshot chunk of the connector's reads: a :class:`RecordRun` from raw BSON or a list from dicts."""
    conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", schemas_enable=schemas, now_ns=lambda: 7))
    docs: list[dict[str, Any]] = [
        {"_id": 1, "name": 'a "quoted"\\ name\n\t\x01', "emoji": "\U0001f600 é"},
        {"_id": 2, "n": [1, {"x": None}], "s": "/"},
        {"_id": "three"},
        {"_id": 4, "text": "\u2028\u00e9" * 40},
    ]
    chunk: Any = docs
    if run:
        chunk = RawDocuments(b"".join(bson.encode(doc) for doc in docs), CodecOptions(tz_aware=True))
    records = conv.convert_reads(chunk, _markers(run), "inventory", "orders", POSITION)
    assert isinstance(records, RecordRun) == run
    return records


def _markers(run: bool) -> list[str]:
    """One marker throughout (a run), or a collection's first and last reads around two inner ones."""
    return ["true"] * 4 if run else ["first", "true", "true", "last"]


@pytest.mark.parametrize(("run", "schemas"), [(True, True), (True, False), (False, True), (False, False)])
def test_a_snapshot_chunk_reads_each_document_once_and_gives_the_readers_columns(
    run: bool, schemas: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads share every byte around their ``after``: the walk reads the first in full and only the
    ``after`` of the others, whose columns must still be exactly the reader's (the reads marked first
    and last differ around their ``after``, so each is walked in full)."""
    records = _reads(run, schemas)
    both = _both(records, monkeypatch)
    assert both is not None and both[0].to_pylist() == both[1].to_pylist()
    assert [orjson.loads(a)["_id"] for a in both[0].column("after").to_pylist()] == [1, 2, "three", 4]
    assert both[0].column("snapshot").to_pylist() == _markers(run)
    part = _both(records[1:3], monkeypatch)  # a run's slice is read from the same buffers, from its own start
    assert part is not None and part[0].to_pylist() == part[1].to_pylist() == both[0].slice(1, 2).to_pylist()


#: Payloads in the connector's member order (``source`` right before ``op``, where the walk takes it),
#: with every member the walk copies from a framing row.
_frames = st.fixed_dictionaries({
    "before": st.none() | _json_text,
    "updateDescription": st.none() | st.fixed_dictionaries({
        "updatedFields": st.none() | _json_text,
        "removedFields": st.none() | st.lists(_text, max_size=3),
        "truncatedArrays": st.none() | _truncated,
    }),
    "source": st.none() | st.fixed_dictionaries({"snapshot": st.none() | _text, "ord": st.integers(0, 9)}),
    "op": st.sampled_from(["c", "u", "d", "r"]),
    "ts_ms": st.none() | st.integers(-(2**62), 2**62),
})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(frame=_frames, afters=st.lists(st.none() | _json_text, min_size=1, max_size=8),
       spelling=st.tuples(st.booleans(), st.booleans()), schema=st.booleans())  # fmt: skip
def test_payloads_differing_only_in_after_give_the_readers_columns(
    frame: dict[str, Any], afters: list[Any], spelling: tuple[bool, bool], schema: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of payloads equal but for ``after`` (the walk takes the other cells of every payload but the
    first from the last one it walked in full), ``after`` null in some, in any spelling: the reader's columns."""
    records = [_record({"before": frame["before"], "after": after, **frame}, schema, spelling) for after in afters]
    both = _both(records, monkeypatch)
    assert both is None or both[0].to_pylist() == both[1].to_pylist()


def test_a_payload_sharing_the_frame_is_still_checked_as_utf8(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bytes around a framed payload's ``after`` were checked with the frame; its ``after`` is checked
    on its own: a byte that is not UTF-8 there refuses the batch, as anywhere else."""
    good = b'{"before":null,"after":"{\\"a\\": 1}","source":{"snapshot":"true"},"op":"r"}'
    bad = good.replace(b"1}", b"\xff}")
    assert mongocdc_native.landing_columns([b'{"id":"1"}'] * 2, None, [good, good], None) is not None
    assert mongocdc_native.landing_columns([b'{"id":"1"}'] * 2, None, [good, bad], None) is None
    records = [Record(TOPIC, b'{"id":"1"}', value, Position(1, 1), "inventory.orders", "r") for value in (good, bad)]
    assert _both(records, monkeypatch) is None  # the reader refuses the batch too, and the sink gets its error


@pytest.mark.parametrize(
    ("key", "value", "utf8"),
    [
        (b'{"id":"1"}', b'{"after":"\xc3\xa9 caf\xc3\xa9 \xf0\x9f\x98\x80","op":"c"}', True),
        (b'{"id":"\xc3\xa9"}', b'{"after":"{}","op":"c"}', True),
        (b'{"id":"1"}', b'{"after":"\xff","source":{"snapshot":"false"},"op":"c"}', False),  # in a kept text
        (b'{"id":"1"}', b'{"before":null,"after":"{\\"a\\": \\"12345678\xc3\\"}","op":"c"}', False),  # cut short
        (b'{"id":"1"}', b'{"x":"\xed\xa0\x80","op":"c"}', False),  # a surrogate's bytes, in a skipped text
        (b'{"id":"\xff"}', b'{"after":"{}","op":"c"}', False),  # in the key
        # within a text's last eight bytes, read one byte at a time: kept, then skipped
        (b'{"id":"1"}', b'{"op":"c","after":"\xc3\xa9"}', True),
        (b'{"id":"1"}', b'{"op":"c","after":"\xff"}', False),
        (b'{"id":"1"}', b'{"op":"c","x":"\xc3\xa9"}', True),
        (b'{"id":"1"}', b'{"op":"c","x":"\xff"}', False),
    ],
)
def test_the_walk_takes_utf8_and_refuses_other_bytes(
    key: bytes, value: bytes, utf8: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Payloads are checked as UTF-8 only where the walk met a byte beyond ASCII: UTF-8 is taken, with the
    reader's columns; anything else refuses the batch, and the sink gets the reader's error as before."""
    assert (mongocdc_native.landing_columns([key], None, [value], None) is not None) == utf8
    both = _both([Record(TOPIC, key, value, Position(1, 1), "inventory.orders", "c")], monkeypatch)
    if utf8:
        assert both is not None and both[0].equals(both[1])
    else:
        assert both is None  # the reader refuses the batch too, and the sink gets its error


def test_columns_keep_their_bytes_while_later_batches_reuse_freed_buffers() -> None:
    """The walk refills the buffers of columns that were freed (no fresh pages per batch): a table still
    held keeps its own bytes however many batches are walked after it, and equals a copy taken at once."""

    def batch(n: int, tag: str) -> list[Record]:
        return [
            Record(TOPIC, b'{"id":"%d"}' % i, b'{"before":null,"after":"{\\"_id\\": %d, \\"t\\": \\"%s\\"}",'
                   b'"source":{"snapshot":"false"},"op":"c","ts_ms":%d}' % (i, tag.encode() * (i % 50), i),
                   Position(1, i + 1), "inventory.orders", "c")  # fmt: skip
            for i in range(n)
        ]

    held = landing_table(batch(3000, "held"))
    copy = held.to_pylist()
    for round_ in range(6):  # each table freed at once: its buffers go back to be written again
        other = landing_table(batch(3000 + round_, "other-" * (round_ + 1)))
        assert other.column("after")[7].as_py() == '{"_id": 7, "t": "%s"}' % ("other-" * (round_ + 1) * 7)
        del other
    assert held.to_pylist() == copy


def test_the_walks_buffers_are_lent_read_only() -> None:
    """Arrow wraps the walk's buffers without a copy; they are read-only, so nothing can change a column
    in place (a writable view is refused with an error, not handed out)."""
    columns = mongocdc_native.landing_columns(
        [b'{"id":"1"}'], None, [b'{"before":null,"after":"{\\"a\\": 1}","source":{"snapshot":"false"},"op":"c"}'], None
    )
    assert columns is not None
    after = columns[4][1]
    view = memoryview(after)
    assert view.readonly and bytes(view) == b'{"a": 1}' and len(after) == 8
    with pytest.raises(TypeError):
        view[0] = 0
    with pytest.raises(TypeError):
        (ctypes.c_char * len(after)).from_buffer(after)  # asks for a writable buffer


class _FramedSpy:
    """``mongocdc_native`` as the sink sees it, noting the ``framed`` of each ``landing_columns`` call."""

    def __init__(self) -> None:
        self.framed: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(mongocdc_native, name)

    def landing_columns(self, keys: Any, key_head: Any, values: Any, value_head: Any, framed: bool = False) -> Any:
        self.framed.append(framed)
        return mongocdc_native.landing_columns(keys, key_head, values, value_head, framed)

    def run_landing_columns(self, keys: bytes, key_ends: bytes, values: bytes, value_ends: bytes, lo: int, hi: int,
                            key_head: bytes | None, value_head: bytes | None, framed: bool = False) -> Any:  # fmt: skip
        self.framed.append(framed)
        return mongocdc_native.run_landing_columns(keys, key_ends, values, value_ends, lo, hi, key_head, value_head, framed)


def _change_records(**options: Any) -> list[Record]:
    conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", now_ns=lambda: 7, **options))
    doc = {"_id": 1, "name": 'a "quoted"\\ name\n\t\x01', "emoji": "\U0001f600 é", "n": [1, {"x": None}]}
    shrunk = {"updatedFields": {"n": [1]}, "removedFields": ["old"], "truncatedArrays": [{"field": "n", "newSize": 1}]}
    events = [insert(doc), update(), update(updateDescription=shrunk), change("delete"), insert({"_id": "two"})]
    return [r for ev in events for r in conv.convert_change(ev, POSITION)]


@pytest.mark.parametrize("options", [
    {}, {"capture_mode": "change_streams_update_full_with_pre_image"}, {"provide_transaction_metadata": True},
    {"field_exclude_list": ("inventory.orders.emoji",)}, {"event_format": "oplog_1x"},
])  # fmt: skip
def test_change_records_are_cut_at_the_heads_the_converter_wrote_them_after(
    options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Change records carry the schema parts their key and value were written after (``Record.heads``):
    the walk cuts there without comparing them, and lands exactly the rows it lands comparing them (and
    the reader's). A batch where one record carries no heads is compared throughout."""
    records = _change_records(**options)
    assert all(r.heads is records[0].heads is not None for r in records if r.topic == TOPIC)
    spy = _FramedSpy()
    monkeypatch.setattr(parquet, "native", spy)
    framed = landing_table(records)
    assert spy.framed and all(spy.framed)
    unframed = [Record(r.topic, r.key, r.value, r.position, r.collection, r.op) for r in records]
    assert unframed == records  # the heads say how a record was written, not what it is
    spy.framed.clear()
    compared = landing_table(unframed)
    assert spy.framed and not any(spy.framed)
    assert framed.to_pylist() == compared.to_pylist()
    mixed = [*records[:2], unframed[2], *records[3:]]
    spy.framed.clear()
    assert landing_table(mixed).to_pylist() == compared.to_pylist() and not any(spy.framed)
    monkeypatch.setattr(parquet, "native", None)
    assert landing_table(records).to_pylist() == compared.to_pylist()  # Arrow's reader


def test_schemaless_change_records_carry_no_heads() -> None:
    """Without the schema part there is nothing to cut: the records carry no heads (and land as before)."""
    records = _change_records(schemas_enable=False)
    assert all(r.heads is None for r in records)
    assert landing_table(records).num_rows == len(records)


@pytest.mark.parametrize("rules", [False, True])
def test_a_snapshot_run_is_cut_at_the_heads_its_reads_were_written_after(rules: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot chunk's run carries the schema parts its reads were written after: walked without comparing
    them, it lands the rows it lands comparing them, and so do its slices and the records taken from it."""
    conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", now_ns=lambda: 7,
                                       **({"field_exclude_list": ("inventory.orders.emoji",)} if rules else {})))  # fmt: skip
    docs = [{"_id": 1, "name": 'a "quoted"\\ name', "emoji": "\U0001f600 é"}, {"_id": "two", "n": [1.5, None]}, {"_id": 3}]
    raw = RawDocuments(b"".join(bson.encode(doc) for doc in docs), CodecOptions(tz_aware=True))
    run = conv.convert_reads(raw, ["true"] * 3, "inventory", "orders", POSITION)
    assert isinstance(run, RecordRun) and run.heads is not None
    spy = _FramedSpy()
    monkeypatch.setattr(parquet, "native", spy)
    framed = landing_table(run)
    sliced = landing_table(run[1:])
    assert spy.framed == [True, True]
    bare = RecordRun(run.topic, *run.buffers()[:4], run.position, run.collection, run.op, *run.buffers()[4:])
    compared = landing_table(bare)
    assert spy.framed[2:] == [False]
    assert framed.to_pylist() == compared.to_pylist() and sliced.to_pylist() == compared.slice(1).to_pylist()
    assert landing_table(list(run)).to_pylist() == compared.to_pylist() and spy.framed[3:] == [True]


class _WalkedRows(_FramedSpy):
    """``_FramedSpy`` that also counts the records the walk was given."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = 0

    def landing_columns(self, keys: Any, key_head: Any, values: Any, value_head: Any, framed: bool = False) -> Any:
        self.rows += len(values)
        return super().landing_columns(keys, key_head, values, value_head, framed)

    def run_landing_columns(self, keys: bytes, key_ends: bytes, values: bytes, value_ends: bytes, lo: int, hi: int,
                            key_head: bytes | None, value_head: bytes | None, framed: bool = False) -> Any:  # fmt: skip
        self.rows += hi - lo
        return super().run_landing_columns(keys, key_ends, values, value_ends, lo, hi, key_head, value_head, framed)


@pytest.mark.parametrize("event_format", ["change_streams", "debezium_3x"])
@pytest.mark.parametrize("rules", [False, True])
def test_a_snapshot_run_converted_for_the_landing_brings_its_after_column(
    rules: bool, event_format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A converter built for the Parquet landing writes each read's ``after`` text with its record: the sink
    takes that column as it is and walks only the chunk's first read (the others share its bytes around
    ``after``), and lands the rows the walk and Arrow's reader land from the same records, slices included."""
    options = EventOptions(topic_prefix="p", rs="rs0", now_ns=lambda: 7, event_format=event_format,
                           **({"field_exclude_list": ("inventory.orders.emoji",)} if rules else {}))  # fmt: skip
    docs = [{"_id": 1, "name": 'a "quoted"\\ name\n\t\x01', "emoji": "\U0001f600 é"}, {"_id": "two", "n": [1.5, None]},
            {"_id": 3, "text": "\u2028\u00e9/" * 40}, {"_id": 4}]  # fmt: skip
    raw = RawDocuments(b"".join(bson.encode(doc) for doc in docs), CodecOptions(tz_aware=True))
    run = EventConverter(options, landing=True).convert_reads(raw, ["true"] * 4, "inventory", "orders", POSITION)
    plain = EventConverter(options).convert_reads(raw, ["true"] * 4, "inventory", "orders", POSITION)
    assert isinstance(run, RecordRun) and run.afters is not None
    assert isinstance(plain, RecordRun) and plain.afters is None and list(plain) == list(run)
    spy = _WalkedRows()
    monkeypatch.setattr(parquet, "native", spy)
    landed, part = landing_table(run), landing_table(run[1:3])
    assert spy.rows == 2  # the first read of each
    monkeypatch.undo()
    both = _both(plain, monkeypatch)
    assert both is not None and landed.to_pylist() == both[0].to_pylist() == both[1].to_pylist()
    assert part.to_pylist() == landed.slice(1, 2).to_pylist()
    assert [orjson.loads(a)["_id"] for a in landed.column("after").to_pylist()] == [1, "two", 3, 4]


def test_the_converter_writes_landing_columns_for_a_parquet_sink_alone_or_in_a_tee(tmp_path: Any) -> None:
    """``takes_landing_columns``: what the pipeline builds its converter with."""
    parquet_sink, jsonl_sink = parquet.ParquetSink(tmp_path / "p"), JsonlSink(tmp_path / "j")
    assert takes_landing_columns(parquet_sink) and not takes_landing_columns(jsonl_sink)
    assert takes_landing_columns(TeeSink([jsonl_sink, parquet_sink])) and not takes_landing_columns(TeeSink([jsonl_sink]))


def test_a_snapshot_chunk_with_first_and_last_reads_carries_its_heads() -> None:
    """A chunk holding a collection's first or last read becomes a list of records, each still written after
    the collection's schema parts: they carry them (the sink then cuts there without comparing)."""
    conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", now_ns=lambda: 7))
    docs = [{"_id": i} for i in range(4)]
    raw = RawDocuments(b"".join(bson.encode(doc) for doc in docs), CodecOptions(tz_aware=True))
    records = conv.convert_reads(raw, _markers(False), "inventory", "orders", POSITION)
    assert not isinstance(records, RecordRun)
    heads = records[0].heads
    assert heads is not None and all(r.heads == heads and r.key.startswith(heads[0]) and r.value.startswith(heads[1])
                                     for r in records if r.key is not None and r.value is not None)  # fmt: skip


_STREAM = CodecOptions(document_class=RawChange, tz_aware=True)


def _raw_change_records(landing: bool, session: bool, **options: Any) -> list[Record]:
    """:func:`_change_records`'s events as the stream reads them: raw, written by the compiled writer, with
    their landing rows when the converter is built for the landing; with ``session``, one more in a
    transaction (its ``source.lsid`` text holds braces in a string: see
    ``test_change_rows_in_a_transaction_are_taken_where_their_source_reads_back_the_same``)."""
    conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", now_ns=lambda: 7, **options), landing=landing)
    doc = {"_id": 1, "name": 'a "quoted"\\ name\n\t\x01', "emoji": "\U0001f600 é", "n": [1, {"x": None}]}
    shrunk = {"updatedFields": {"n": [1]}, "removedFields": ["old"], "truncatedArrays": [{"field": "n", "newSize": 1}]}
    lsid = {"id": bson.Binary(bytes(range(16)), 4), "uid": bson.Binary(bytes(32), 0)}
    events = [insert(doc), update(), update(updateDescription=shrunk), change("delete"), insert({"_id": "two"}),
              insert({"_id": 3, "text": "\u2028/" * 30}, **({"lsid": lsid, "txnNumber": bson.Int64(4)} if session else {}))]  # fmt: skip
    records = [r for ev in events for r in conv.convert_change(bson.decode(bson.encode(ev), _STREAM), POSITION)]
    return records + conv.flush()


@pytest.mark.parametrize("options", [
    {}, {"capture_mode": "change_streams_update_full_with_pre_image"}, {"provide_transaction_metadata": True},
    {"field_exclude_list": ("inventory.customers.emoji",)}, {"event_format": "oplog_1x"},
    {"event_format": "debezium_3x", "capture_mode": "change_streams_update_full_with_pre_image"},
    {"event_format": "debezium_3x", "provide_transaction_metadata": True, "field_renames": ("inventory.customers.n:m",)},
])  # fmt: skip
def test_change_records_converted_for_the_landing_bring_their_parts(
    options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A converter built for the Parquet landing gives each change record its landing parts with the same
    bytes: the sink takes them as its columns without walking the values, and lands exactly the rows the
    walk and Arrow's reader land from those records (the oplog format has no compiled writer: no parts)."""
    records, plain = _raw_change_records(True, False, **options), _raw_change_records(False, False, **options)
    assert records == plain and all(r.parts is None for r in plain)
    data = [r for r in records if r.collection is not None and r.value is not None]
    assert data and all((r.parts is not None) == (options.get("event_format") != "oplog_1x") for r in data)
    spy = _WalkedRows()
    monkeypatch.setattr(parquet, "native", spy)
    landed = landing_table(records)
    walked_rows = spy.rows
    monkeypatch.undo()
    both = _both(plain, monkeypatch)
    assert both is not None and landed.to_pylist() == both[0].to_pylist() == both[1].to_pylist()
    change_topic = [r for r in records if r.collection is not None]
    assert walked_rows == len(records) - (len(change_topic) if data[0].parts is not None else 0)
    mixed = [*change_topic[:2], plain[2], *change_topic[3:]]  # one record without parts: the walk lands them all
    assert landing_table(mixed).to_pylist() == landing_table([r for r in plain if r.collection is not None]).to_pylist()
    in_session, plain = _raw_change_records(True, True, **options), _raw_change_records(False, True, **options)
    assert in_session == plain and landing_table(in_session).to_pylist() == landing_table(plain).to_pylist()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(event_format=st.sampled_from(["change_streams", "debezium_3x"]), schemas=st.booleans(),
       keys=st.lists(java_scalars, min_size=4, max_size=4), docs=st.lists(java_documents, min_size=4, max_size=4),
       updated=java_documents, removed=st.lists(st.text(max_size=6), max_size=2))  # fmt: skip
def test_change_rows_the_writers_lay_out_are_the_walks_on_events_of_every_type(
    event_format: str, schemas: bool, keys: list[Any], docs: list[dict[str, Any]], updated: dict[str, Any],
    removed: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Generated events of every BSON type the compiled Debezium 3.x writer takes, in its format and the default
    one: the landing rows the writer lays out as it writes each record are taken without walking a record (in
    3.x always), and are the columns the walk and Arrow's reader land from the same records' bytes."""
    options = EventOptions(topic_prefix="p", rs="rs0", now_ns=lambda: 7, event_format=event_format, schemas_enable=schemas,
                           capture_mode="change_streams_update_full_with_pre_image")  # fmt: skip
    description = {"updatedFields": updated, "removedFields": removed, "truncatedArrays": [{"field": "n", "newSize": 1}]}
    events = [
        insert({"_id": keys[0], **docs[0]}),
        update(documentKey={"_id": keys[1]}, updateDescription=description, fullDocument={"_id": keys[1], **docs[1]},
               fullDocumentBeforeChange={"_id": keys[1], **docs[2]}),
        change("replace", documentKey={"_id": keys[2]}, fullDocument={"_id": keys[2], **docs[3]}),
        change("delete", documentKey={"_id": keys[3]}, fullDocumentBeforeChange={"_id": keys[3], **docs[0]}),
    ]  # fmt: skip
    records = [r for ev in events for r in EventConverter(options, landing=True).convert_change(
        bson.decode(bson.encode(ev), _STREAM), POSITION)]  # fmt: skip
    plain = [r for ev in events for r in EventConverter(options).convert_change(bson.decode(bson.encode(ev), _STREAM), POSITION)]
    taken = all(r.parts is not None for r in records)  # the default writer leaves some types to Python
    assert records == plain and (taken or event_format == "change_streams")
    spy = _WalkedRows()
    monkeypatch.setattr(parquet, "native", spy)
    landed = landing_table(records)
    assert spy.rows == (0 if taken else len(records))
    monkeypatch.undo()
    both = _both(plain, monkeypatch)
    assert both is not None and landed.to_pylist() == both[0].to_pylist() == both[1].to_pylist()


def test_change_rows_are_taken_by_runs_across_chunks_again_and_with_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A converter built for the landing appends each change record's row to its collection's chunk, which the
    first take freezes (later records start another): a batch across two chunks, the same records taken again
    (records are shared: a tee may hold two Parquet sinks) and a batch missing a record land, without walking a
    record, exactly the rows the walk and Arrow's reader land from the same bytes, positions and tombstones
    included."""
    conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", now_ns=lambda: 7), landing=True)
    plain_conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", now_ns=lambda: 7))
    events = [insert({"_id": i, "text": "é\n" * i}) if i % 3 else change("delete", documentKey={"_id": i})
              for i in range(8)]  # fmt: skip
    records: list[Record] = []
    plain: list[Record] = []
    for i, event in enumerate(events):
        position = Position(1_714_564_800 + i // 2, 7 + i // 2, i % 2)
        raw = bson.decode(bson.encode(event), _STREAM)
        records += conv.convert_change(raw, position)
        plain += plain_conv.convert_change(bson.decode(bson.encode(event), _STREAM), position)
        if i == 3:
            first = len(records)
            landing_table(records[:2])  # freezes the first chunk: the next records go to another
    assert records == plain and all(r.parts is not None for r in records) and first < len(records)
    spy = _WalkedRows()
    monkeypatch.setattr(parquet, "native", spy)
    batches = [records, records, records[first - 2 : first + 2], [*records[:2], *records[3:]]]
    landed = [landing_table(batch) for batch in batches]
    assert spy.rows == 0
    monkeypatch.undo()
    expected = [plain, plain, plain[first - 2 : first + 2], [*plain[:2], *plain[3:]]]
    for table, batch in zip(landed, expected, strict=True):
        both = _both(batch, monkeypatch)
        assert both is not None and table.to_pylist() == both[0].to_pylist() == both[1].to_pylist()
    assert landed[0].column("pos_ordinal").to_pylist()[:3] == [0, 0, 1]  # a delete's tombstone shares its position
    assert landed[0].column("op").to_pylist()[:3] == ["d", None, "c"]


@pytest.mark.parametrize("coll", ["customers", "clients é/ü", "a}b", "a\nb}"])
def test_change_rows_in_a_transaction_are_taken_where_their_source_reads_back_the_same(
    coll: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event in a transaction has ``source.lsid``, the session document's text: braces inside a string,
    whose block the reader path lands as orjson writes it again once parsed. Its row is taken as written where
    that gives back the same bytes (a flat block escaping only quotes and backslashes); otherwise (a newline
    in the collection's name, escaped) the batch is walked from its bytes. Either way the same rows land."""
    lsid = {"id": bson.Binary(bytes(range(16)), 4), "uid": bson.Binary(bytes(32), 0)}
    events = [insert({"_id": i, "v": "x" * i}, lsid=lsid, txnNumber=bson.Int64(4), ns={"db": "inventory", "coll": coll})
              for i in range(3)]  # fmt: skip
    conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", now_ns=lambda: 7), landing=True)
    plain_conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", now_ns=lambda: 7))
    records = [r for ev in events for r in conv.convert_change(bson.decode(bson.encode(ev), _STREAM), POSITION)]
    plain = [r for ev in events for r in plain_conv.convert_change(bson.decode(bson.encode(ev), _STREAM), POSITION)]
    assert records == plain and all(b"{" in r.value.partition(b',"source":')[2] for r in records if r.value)
    spy = _WalkedRows()
    monkeypatch.setattr(parquet, "native", spy)
    landed = landing_table(records)
    assert spy.rows == (len(records) if "\n" in coll else 0)
    monkeypatch.undo()
    both = _both(plain, monkeypatch)
    assert both is not None and landed.to_pylist() == both[0].to_pylist() == both[1].to_pylist()
    assert all("lsid" in orjson.loads(s) for s in landed.column("source").to_pylist())
