"""Change events left raw (the compiled ``mongocdc_native`` path) convert to the Python path's bytes.

The change stream reader receives each event as a :class:`RawChange`. An ordinary event (a
data event, in a transaction or not, with a plain resume token, not split) keeps its BSON: its
header is read by the compiled module and its record written from the BSON by the collection's
writer, in each format (the default, ``debezium_3x`` and ``oplog_1x``); every other event, and every
use other than the conversion, sees it decoded as pymongo decodes it. Each test converts the same
events both ways.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any
from unittest import mock

import bson
import pytest
from bson.binary import Binary
from bson.code import Code
from bson.codec_options import CodecOptions
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

from mongocdc_core.events.dates import datetime_millis
from mongocdc_core.events.raw import RawChange, change_namespace, plain
from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position

from .helpers import CLUSTER_TIME, LSID, POSITION, WALL_TIME, converter
from .strategies import documents, id_values, scalars
from .test_raw_reads import ENGINE_OPTIONS, STANDARD_UUIDS, _members, awkward_text, plain_documents, plain_ids

RAW_OPTIONS: CodecOptions[RawChange] = ENGINE_OPTIONS.with_options(document_class=RawChange)
#: The formats the compiled path writes.
FORMATS = ["change_streams", "debezium_3x", "oplog_1x"]
CAPTURE_MODES = ["change_streams", "change_streams_update_full", "change_streams_with_pre_image",
                 "change_streams_update_full_with_pre_image"]  # fmt: skip


def _event(op: str, key: Any, full: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "_id": {"_data": "8263" + "0" * 30}, "operationType": op, "clusterTime": CLUSTER_TIME,
        "wallTime": WALL_TIME, "ns": {"db": "inventory", "coll": "customers"}, "documentKey": {"_id": key},
    }  # fmt: skip
    if full is not None:
        event["fullDocument"] = {"_id": key, **{k: v for k, v in full.items() if k != "_id"}}
    event.update(extra)
    return event


class _Decoded(Exception):
    """The converter decoded an event: the Python path converts it."""


def compiled(event: dict[str, Any] | RawChange, event_format: str, options: CodecOptions[dict[str, Any]] = ENGINE_OPTIONS,
             capture_mode: str = "change_streams_update_full", **settings_: Any) -> bool:  # fmt: skip
    """Whether the collection's compiled writer writes an event's records whole, in ``event_format``
    (the Python path decodes the event: it does, when the writer leaves the event to it)."""
    raw = event if isinstance(event, RawChange) else _raw(event, options)
    with mock.patch.object(RawChange, "document", side_effect=_Decoded):
        try:
            converter(event_format=event_format, capture_mode=capture_mode, **settings_).convert_change(raw, POSITION)
        except _Decoded:
            return False
    return True


def _raw(event: dict[str, Any], options: CodecOptions[dict[str, Any]] = ENGINE_OPTIONS) -> RawChange:
    return RawChange(bson.encode(event, codec_options=options), options.with_options(document_class=RawChange))


def _both_ways(event: dict[str, Any], options: CodecOptions[dict[str, Any]] = ENGINE_OPTIONS,
               **settings_: Any) -> tuple[list[Record], list[Record]]:
    raw = _raw(event, options)
    decoded = bson.decode(raw.raw, options)
    return converter(**settings_).convert_change(raw, POSITION), converter(**settings_).convert_change(decoded, POSITION)


wall_times = st.one_of(st.none(), st.just(WALL_TIME), st.integers(-(2**62), 2**62).map(DatetimeMS))
descriptions = st.fixed_dictionaries({
    "updatedFields": plain_documents,
    "removedFields": st.lists(awkward_text.filter(lambda s: "\x00" not in s) | st.text(max_size=8), max_size=3),
    "truncatedArrays": st.lists(st.fixed_dictionaries({"field": st.text(max_size=6), "newSize": st.integers(0, 2**31 - 1)}),
                                max_size=2),
})  # fmt: skip


@settings(max_examples=300, deadline=None, phases=[Phase.generate])
@given(
    st.sampled_from(["insert", "update", "replace", "delete"]), plain_ids, plain_documents, plain_documents,
    descriptions, wall_times, st.sampled_from(CAPTURE_MODES), st.booleans(), st.booleans(), st.booleans(),
    st.sampled_from(FORMATS),
)  # fmt: skip
def test_ordinary_events_are_written_by_the_compiled_path_byte_for_byte(
    op: str, key: Any, full: dict[str, Any], before: dict[str, Any], desc: dict[str, Any], wall: Any,
    capture_mode: str, schemas: bool, tombstones: bool, transactions: bool, event_format: str,
) -> None:  # fmt: skip
    # Debezium 3.x takes source.ts_ns from wallTime: past 64-bit nanoseconds, both paths refuse it
    assume(event_format != "debezium_3x" or wall is None or abs(datetime_millis(wall)) < 2**63 // 1_000_000)
    extra: dict[str, Any] = {"wallTime": wall} if wall is not None else {}
    if op == "update":
        extra["updateDescription"] = desc
    if "pre_image" in capture_mode and op != "insert":
        extra["fullDocumentBeforeChange"] = {"_id": key, **before}
    event = _event(op, key, full if op != "delete" else None, **extra)
    if wall is None:
        event.pop("wallTime")
    raw = _raw(event)
    header = raw.header
    assert header is not None
    assert (header.token, header.op_type, header.db, header.coll, header.seconds, header.increment, header.txn_number,
            header.lsid) == ("8263" + "0" * 30, op, "inventory", "customers", CLUSTER_TIME.time, CLUSTER_TIME.inc, None, None)
    assert compiled(raw, event_format, capture_mode=capture_mode)
    from_raw, from_dicts = _both_ways(event, schemas_enable=schemas, capture_mode=capture_mode, event_format=event_format,
                                      tombstones_on_delete=tombstones, provide_transaction_metadata=transactions)  # fmt: skip
    assert from_raw == from_dicts and from_raw


@settings(max_examples=200, deadline=None, phases=[Phase.generate])
@given(st.sampled_from(["insert", "update", "replace", "delete"]), id_values, documents, st.booleans(), st.booleans(),
       st.sampled_from(FORMATS))  # fmt: skip
def test_any_documents_equal_the_python_path(
    op: str, key: Any, full: dict[str, Any], schemas: bool, uuids: bool, event_format: str
) -> None:
    """The whole type zoo: what the compiled path does not write goes to Python, with the same bytes."""
    extra: dict[str, Any] = {"updateDescription": {"updatedFields": full, "removedFields": [], "truncatedArrays": []}}
    event = _event(op, key, full, **(extra if op == "update" else {}))
    from_raw, from_dicts = _both_ways(event, STANDARD_UUIDS if uuids else ENGINE_OPTIONS, schemas_enable=schemas,
                                      capture_mode="change_streams_update_full_with_pre_image", event_format=event_format)  # fmt: skip
    assert from_raw == from_dicts


#: The scalars the compiled Debezium 3.x writer writes itself (the others go to the Python path).
java_scalars = scalars.filter(
    lambda v: not isinstance(v, (Regex, Code)) and not (isinstance(v, Binary) and v.subtype in (2, 3))
    and not (isinstance(v, Decimal128) and not v.to_decimal().is_finite())
)
java_documents = st.dictionaries(
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=6).filter(
        lambda s: not s.startswith("$")),
    st.recursive(java_scalars, lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.text(alphabet="abc", min_size=1, max_size=2), children, max_size=3), max_leaves=12),
    max_size=6,
)  # fmt: skip


@settings(max_examples=300, deadline=None, phases=[Phase.generate])
@given(st.sampled_from(["insert", "update", "replace", "delete"]), java_scalars, java_documents, java_documents,
       st.booleans(), st.booleans())  # fmt: skip
def test_every_type_the_debezium3_writer_takes_is_its_own_and_the_python_paths_bytes(
    op: str, key: Any, full: dict[str, Any], updated: dict[str, Any], schemas: bool, uuids: bool
) -> None:
    """Debezium 3.x texts of every BSON type the compiled writer takes (non-finite doubles, dates of
    any year, timestamps, min/max keys, binaries, decimals, any text), written by it, not by Python."""
    options = STANDARD_UUIDS if uuids else ENGINE_OPTIONS
    extra: dict[str, Any] = {"updateDescription": {"updatedFields": updated, "removedFields": ["a"], "truncatedArrays": []},
                             "fullDocumentBeforeChange": {"_id": key, **updated}}  # fmt: skip
    event = _event(op, key, full if op != "delete" else None, **(extra if op != "insert" else {}))
    assert compiled(event, "debezium_3x", options, "change_streams_update_full_with_pre_image")
    from_raw, from_dicts = _both_ways(event, options, schemas_enable=schemas, event_format="debezium_3x",
                                      capture_mode="change_streams_update_full_with_pre_image")  # fmt: skip
    assert from_raw == from_dicts and from_raw


def test_every_character_is_escaped_as_the_java_driver_escapes_it() -> None:
    """Every BMP code point and some beyond (each written as two escaped UTF-16 units), in a value,
    a field name, a key and an updated field: the compiled bitmap and the Python categories agree."""
    codes = [c for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF] + [0x10000, 0x1D11E, 0x1F600, 0x10FFFF]
    texts = ["".join(map(chr, codes[i : i + 997])) for i in range(0, len(codes), 997)]
    for text in texts:
        event = _event("update", text[:40], {text[40:80]: text}, updateDescription={"updatedFields": {text[80:120]: text}})
        assert compiled(event, "debezium_3x")
        from_raw, from_dicts = _both_ways(event, event_format="debezium_3x", capture_mode="change_streams_update_full")
        assert from_raw == from_dicts


def test_splits_and_other_tokens_are_decoded_as_pymongo_decodes_them() -> None:
    """No header (the Python path converts them): a split fragment, a token with ``_typeBits``, an
    event without clusterTime, half a transaction's fields; each reads as the decoded event."""
    doc = {"_id": 1, "a": "x"}
    cases = [
        _event("insert", 1, doc, lsid=LSID),
        _event("insert", 1, doc, splitEvent={"fragment": 1, "of": 2}),
        _event("insert", 1, doc, _id={"_data": "82", "_typeBits": Binary(b"\x01")}),
        {k: v for k, v in _event("insert", 1, doc).items() if k != "clusterTime"},
        _event("drop", 1, None),
    ]
    for event in cases[:4]:
        raw = _raw(event)
        assert raw.header is None
        decoded = bson.decode(raw.raw, ENGINE_OPTIONS)
        assert plain(raw) == decoded and raw.cluster_time == event.get("clusterTime")
        assert copy.deepcopy(raw) == decoded
        assert change_namespace(raw) == ("inventory", "customers")
    half = cases[0]
    conv, reference = converter(provide_transaction_metadata=True), converter(provide_transaction_metadata=True)
    assert conv.convert_change(_raw(half), POSITION) == reference.convert_change(half, POSITION)
    drop = _raw(cases[4])
    assert drop.header is not None and drop.header.op_type == "drop" and converter().convert_change(drop, POSITION) == []


def test_an_ordinary_event_reads_as_its_decoded_event() -> None:
    event = _event("update", 7, {"a": 1}, updateDescription={"updatedFields": {"a": 1}, "removedFields": ["b"]})
    raw = _raw(event)
    assert raw.header is not None and raw.cluster_time == CLUSTER_TIME
    assert raw["_id"] == event["_id"] and raw.get("documentKey") == {"_id": 7} and set(raw) == set(event)
    assert copy.deepcopy(raw) == bson.decode(raw.raw, ENGINE_OPTIONS)  # pymongo deep-copies resume tokens


@pytest.mark.parametrize("event_format", FORMATS)
@pytest.mark.parametrize("uuids", [False, True])
@pytest.mark.parametrize("metadata", [False, True])
def test_transactions_are_written_by_the_compiled_path_as_the_python_path(metadata: bool, uuids: bool, event_format: str) -> None:
    """A transaction's events (lsid, txnNumber), then an ordinary event that ends it (with transaction
    metadata: BEGIN, the events with their ``transaction`` blocks, END), then a second transaction."""
    options = STANDARD_UUIDS if uuids else ENGINE_OPTIONS
    other = {**LSID, "id": Binary(bytes(range(16)), 4)}
    events = [
        _event("insert", 1, {"a": "x"}, lsid=LSID, txnNumber=Int64(3)),
        _event("delete", 2, None, lsid=LSID, txnNumber=Int64(3)),
        _event("insert", 3, {"b": 1}, clusterTime=Timestamp(CLUSTER_TIME.time, CLUSTER_TIME.inc + 1)),
        _event("update", 4, {"c": 2}, lsid=other, txnNumber=7, clusterTime=Timestamp(CLUSTER_TIME.time + 1, 1),
               updateDescription={"updatedFields": {"c": 2}, "removedFields": []}),
    ]  # fmt: skip
    positions = [POSITION, Position.from_timestamp(CLUSTER_TIME, 1), Position.from_timestamp(events[2]["clusterTime"]),
                 Position.from_timestamp(events[3]["clusterTime"])]  # fmt: skip
    conv, reference = (converter(provide_transaction_metadata=metadata, event_format=event_format) for _ in range(2))
    raws = [_raw(event, options) for event in events]
    assert all(compiled(raw, event_format) for raw in raws)
    header = raws[0].header
    assert header is not None and (header.txn_number, header.lsid) == (3, bson.encode(LSID, codec_options=options))
    ours = [r for raw, p in zip(raws, positions, strict=True) for r in conv.convert_change(raw, p)] + conv.flush()
    theirs = [r for raw, p in zip(raws, positions, strict=True) for r in reference.convert_change(raw.document(), p)]
    assert ours == theirs + reference.flush()
    assert [r.topic for r in ours].count("fulfillment.transaction") == (4 if metadata else 0)
    session = b'"stxnid":"140ed813-35e0-4174-97f4-ec66ce5947db:3"' if event_format == "oplog_1x" else b'"txnNumber":3'
    assert session in (ours[1 if metadata else 0].value or b"")


@pytest.mark.parametrize("event_format", FORMATS)
def test_a_transactions_event_left_to_python_is_counted_once(event_format: str) -> None:
    """The compiled writer writes an event before its transaction block is observed, so an event it
    leaves to Python (a regular expression) is observed once, by the Python path: the blocks'
    orders and the END's counts are the Python path's."""
    events = [
        _event("insert", 1, {"a": "x"}, lsid=LSID, txnNumber=Int64(3)),
        _event("insert", 2, {"r": Regex("^a", "i")}, lsid=LSID, txnNumber=Int64(3)),
        _event("insert", 3, {"b": 1}, lsid=LSID, txnNumber=Int64(3)),
    ]  # fmt: skip
    positions = [Position.from_timestamp(CLUSTER_TIME, i) for i in range(3)]
    conv, reference = (converter(provide_transaction_metadata=True, event_format=event_format) for _ in range(2))
    raws = [_raw(event) for event in events]
    assert not compiled(raws[1], event_format)  # the writer leaves it to Python
    ours = [r for raw, p in zip(raws, positions, strict=True) for r in conv.convert_change(raw, p)] + conv.flush()
    theirs = [r for raw, p in zip(raws, positions, strict=True) for r in reference.convert_change(raw.document(), p)]
    assert ours == theirs + reference.flush()
    assert b'"event_count":3' in (ours[-1].value or b"") and b'"total_order":3' in (ours[-2].value or b"")


@pytest.mark.parametrize("event_format", FORMATS)
def test_field_renames_are_written_by_the_compiled_path(event_format: str) -> None:
    event = _event("insert", 1, {"a": 1, "b": "x"})
    rename = ("inventory.customers.a:z",)
    renamed, reference = _both_ways(event, field_renames=rename, event_format=event_format)
    assert renamed == reference and compiled(event, event_format, field_renames=rename)
    assert (b'\\"z\\" : 1' if event_format == "oplog_1x" else b'\\"z\\": 1') in (renamed[0].value or b"")


@pytest.mark.parametrize("event_format", FORMATS)
def test_malformed_events_fail_with_the_python_paths_message(event_format: str) -> None:
    """What the compiled path cannot write (here: events missing their documents) is reported by the
    Python path, in its words."""
    no_desc = _event("update", 1, None)
    no_full = _event("insert", 1, None)
    no_key = {k: v for k, v in _event("delete", 1, None).items() if k != "documentKey"}
    for event, message in ((no_desc, "no 'updateDescription'"), (no_full, "no 'fullDocument'"), (no_key, "no 'documentKey._id'")):
        assert not compiled(event, event_format)
        with pytest.raises(ValueError, match=message):
            converter(event_format=event_format).convert_change(_raw(event), POSITION)


def test_a_date_outside_pythons_range_is_the_same_millisecond_count() -> None:
    wall = DatetimeMS(-(2**62))
    event = _event("delete", 1, None, wallTime=wall)
    from_raw, from_dicts = _both_ways(event)
    assert from_raw == from_dicts and b'"wallTime":%d' % -(2**62) in (from_raw[0].value or b"")
    assert _both_ways(_event("delete", 1, None, wallTime=datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)))[0]


@pytest.mark.parametrize("event_format", FORMATS)
def test_repeated_names_read_as_the_decoded_event(event_format: str) -> None:
    """A repeated name keeps its last value once decoded (a dict): the compiled path leaves such a
    documentKey or truncatedArrays entry to Python, and takes the last ns.db/ns.coll."""
    twice = RawBSONDocument(_members([("_id", 1), ("_id", 2)]))
    entry = RawBSONDocument(_members([("field", "t"), ("newSize", 1), ("field", "u")]))
    ns = RawBSONDocument(_members([("db", "inventory"), ("coll", "other"), ("coll", "customers")]))
    desc = {"updatedFields": {"a": 1}, "removedFields": [], "truncatedArrays": [{"field": "t", "newSize": 1}]}
    cases = [
        _event("update", 1, {"a": 1}, documentKey=twice, updateDescription=desc),
        _event("update", 1, {"a": 1}, updateDescription={**desc, "truncatedArrays": [entry]}),
        _event("update", 1, {"a": 1}, ns=ns, updateDescription=desc),
    ]
    for event in cases:
        patched = bson.encode(event)
        raw = RawChange(patched, RAW_OPTIONS)
        assert raw.header is not None and (raw.header.db, raw.header.coll) == ("inventory", "customers")
        conv, reference = converter(event_format=event_format), converter(event_format=event_format)
        assert conv.convert_change(raw, POSITION) == reference.convert_change(raw.document(), POSITION)
        assert raw.key_id() == raw.document()["documentKey"]["_id"]


def test_an_error_reply_reads_as_its_decoded_document() -> None:
    """pymongo puts a reply's repr into its error messages: the decoded document, never BSON bytes."""
    reply = RawChange(bson.encode({"ok": 0.0, "errmsg": "boom", "code": 280}), RAW_OPTIONS)
    assert reply.header is None and repr(reply) == repr({"ok": 0.0, "errmsg": "boom", "code": 280})
    assert reply["code"] == 280 and dict(reply.items())["errmsg"] == "boom"


def test_an_event_of_4_kib_or_more_keeps_the_compiled_path() -> None:
    """pymongo slices a document of 4 KiB or more out of its reply as a memoryview: the event still
    gets a header (bytes of its own), and converts as the decoded event does."""
    event = _event("insert", 7, {"note": "x" * 6000})
    reply = bson.encode({"cursor": {"nextBatch": [event], "id": Int64(1)}, "ok": 1.0})
    decoded_reply = bson.decode(reply, RAW_OPTIONS)
    assert type(decoded_reply["cursor"].raw) is memoryview  # the reply's own documents stay views
    (raw,) = decoded_reply["cursor"]["nextBatch"]
    assert type(raw.raw) is bytes and raw.header is not None
    assert converter().convert_change(raw, POSITION) == converter().convert_change(bson.decode(raw.raw, ENGINE_OPTIONS), POSITION)


def test_a_length_that_lies_is_refused_as_pymongo_refuses_it() -> None:
    data = bytearray(bson.encode(_event("insert", 7, {"a": 1})))
    data[0] += 1  # declares one byte more than it has
    with pytest.raises(bson.errors.InvalidBSON):
        RawChange(bytes(data), RAW_OPTIONS)
