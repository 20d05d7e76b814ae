"""Snapshot reads from raw batches (the compiled ``mongocdc_native`` path) equal the Python path's.

The copier hands the converter :class:`RawDocuments`; the compiled module writes the records of
the common types straight from the BSON and leaves every other document to the Python path. Each
test converts the same documents both ways and compares the bytes.
"""

from __future__ import annotations

import datetime
import decimal
import math
import random
import struct
from typing import Any

import bson
import mongocdc_native
import pytest
from bson.binary import Binary, UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.min_key import MinKey
from bson.timestamp import Timestamp
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from mongocdc_core.events import javajson
from mongocdc_core.events.raw import RawDocuments
from mongocdc_core.events.records import Record, RecordRun

from .helpers import POSITION, converter
from .strategies import datetimes, decimals, documents, field_names, id_values, int32s, int64s, object_ids

#: As the engine's client decodes (source/connection.py: tz_aware, DATETIME_AUTO).
ENGINE_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(
    tz_aware=True, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
STANDARD_UUIDS = ENGINE_OPTIONS.with_options(uuid_representation=UuidRepresentation.STANDARD)
TS = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)

def _fits(value: decimal.Decimal) -> bool:
    """Whether Decimal128 holds the value exactly (34 digits, exponent -6176..6111)."""
    sign, digits, exponent = value.as_tuple()
    return isinstance(exponent, int) and len(digits) <= 34 and -6176 <= exponent <= 6111 - len(digits) + 1


# Only the types the compiled path writes itself, so most examples exercise it.
awkward_text = st.text(alphabet=st.sampled_from(['"', "\\", "\n", "\x00", "\x01", "\x1f", "\x7f", "é", "\u2028", "𝄞", "a", " ", ":", ","]), max_size=8)
plain_scalars = st.one_of(
    st.none(), st.booleans(), int32s, int64s, st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10), awkward_text, object_ids, datetimes,
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(DatetimeMS),
    st.builds(Binary, st.binary(max_size=40), st.sampled_from([0, 1, 4, 5, 6, 7, 8, 0x80, 0xFF])),
    decimals.filter(lambda d: d.to_decimal().is_finite() and not d.to_decimal().is_nan()),
    st.decimals(allow_nan=False, allow_infinity=False).map(lambda d: Decimal128(d) if _fits(d) else Decimal128("0")),
)
plain_values = st.recursive(
    plain_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(field_names | awkward_text.filter(lambda s: s and "\x00" not in s and not s.startswith("$")), children, max_size=4),
    max_leaves=15,
)
plain_documents = st.dictionaries(field_names, plain_values, max_size=6)
plain_ids = st.one_of(int32s, int64s, object_ids, st.text(max_size=10), awkward_text.filter(lambda s: "\x00" not in s))


def _raw(docs: list[dict[str, Any]], options: CodecOptions[dict[str, Any]] = ENGINE_OPTIONS) -> RawDocuments:
    return RawDocuments(b"".join(bson.encode(doc, codec_options=options) for doc in docs), options)


def _markers(n: int) -> list[str]:
    return ["first", *["true"] * (n - 2), "last"] if n > 1 else ["last"]


def _both_ways(docs: list[dict[str, Any]], options: CodecOptions[dict[str, Any]] = ENGINE_OPTIONS,
               **settings_: Any) -> tuple[list[Record], list[Record]]:
    raw = _raw(docs, options)
    markers = _markers(len(docs))
    conv = converter(**settings_)
    from_raw = conv.convert_reads(raw, markers, "inventory", "customers", POSITION, TS)
    from_dicts = conv.convert_reads(raw.decoded(), markers, "inventory", "customers", POSITION, TS)
    return from_raw, from_dicts


#: The formats the compiled path writes.
FORMATS = ["change_streams", "debezium_3x", "oplog_1x"]


def _left(raw: RawDocuments, event_format: str, rules: object = None) -> list[int]:
    """The reads the compiled module leaves to the Python path in ``event_format`` (with field ``rules``)."""
    kind: dict[str, Any] = {"printable": javajson.printable_bitmap()} if event_format == "debezium_3x" else {
        "legacy": event_format == "oplog_1x"}  # fmt: skip
    return mongocdc_native.convert_reads(raw.data, raw.bounds, 0, len(raw), b"", b"", b"", b"", rules=rules, **kind)[4]


@settings(max_examples=300, deadline=None, phases=[Phase.generate])
@given(st.lists(st.tuples(plain_ids, plain_documents), min_size=1, max_size=6), st.booleans(), st.sampled_from(FORMATS))
def test_plain_documents_are_written_by_the_compiled_path_byte_for_byte(
    items: list[tuple[Any, dict[str, Any]]], schemas: bool, event_format: str
) -> None:
    docs = [{"_id": i, **{k: v for k, v in body.items() if k != "_id"}} for i, body in items]
    from_raw, from_dicts = _both_ways(docs, schemas_enable=schemas, event_format=event_format)
    assert from_raw == from_dicts
    assert not _left(_raw(docs), event_format), "the compiled path left a document of its own types to Python"


@settings(max_examples=200, deadline=None, phases=[Phase.generate])
@given(st.lists(st.tuples(id_values, documents), min_size=1, max_size=5), st.booleans(), st.booleans(),
       st.sampled_from(FORMATS))  # fmt: skip
def test_any_documents_equal_the_python_path(
    items: list[tuple[Any, dict[str, Any]]], schemas: bool, uuids: bool, event_format: str
) -> None:
    """The whole type zoo: what the compiled path does not write goes to Python, with the same bytes."""
    docs = [{"_id": i, **body} for i, body in items]
    from_raw, from_dicts = _both_ways(docs, STANDARD_UUIDS if uuids else ENGINE_OPTIONS, schemas_enable=schemas,
                                      event_format=event_format)  # fmt: skip
    assert from_raw == from_dicts


@pytest.mark.parametrize("markers", [["true", "true", "last"], ["incremental"] * 3,
                                     ["first", "incremental", "last_in_data_collection"]])
def test_debezium3_reads_of_every_marker_are_the_python_paths(markers: list[str]) -> None:
    """Debezium 3.x reads: ``ord`` -1 and the read time, ``true`` or ``last``; incremental ones the
    position's time and increment (the other markers are ``true``, as the Python path writes them)."""
    docs = [{"_id": i, "a": float("inf"), "t": Timestamp(5, i), "k": MinKey()} for i in range(3)]
    raw = _raw(docs)
    assert not _left(raw, "debezium_3x")
    conv = converter(event_format="debezium_3x")
    from_raw = conv.convert_reads(raw, markers, "inventory", "customers", POSITION, TS)
    assert from_raw == conv.convert_reads(raw.decoded(), markers, "inventory", "customers", POSITION, TS)
    assert b'"snapshot":"incremental"' in (from_raw[1].value or b"") or markers[1] != "incremental"


@pytest.mark.parametrize("event_format", FORMATS)
def test_a_read_of_an_unknown_marker_is_refused_in_every_format(event_format: str) -> None:
    docs = [{"_id": i} for i in range(3)]
    conv = converter(event_format=event_format)
    for chunk in (_raw(docs), docs):
        with pytest.raises(ValueError, match="snapshot marker must be one of .*; got 'x'"):
            conv.convert_reads(chunk, ["first", "true", "x"], "inventory", "customers", POSITION, TS)


@pytest.mark.parametrize("event_format", FORMATS)
def test_field_renames_are_written_by_the_compiled_path(event_format: str) -> None:
    docs = [{"_id": i, "a": i, "b": "x"} for i in range(5)]
    renamed, plain = _both_ways(docs, field_renames=("inventory.customers.a:z",), event_format=event_format)
    assert renamed == plain
    assert (b'\\"z\\" : 0' if event_format == "oplog_1x" else b'\\"z\\": 0') in (renamed[0].value or b"")


def test_random_doubles_are_spelled_as_orjson_spells_them() -> None:
    rng = random.Random(7)
    values = [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(20_000)]
    values += [0.0, -0.0, 1.0, 1e15, 1e16, 9999999999999998.0, 1e-5, 1e-6, 5e-324, 1.7976931348623157e308]
    docs = [{"_id": i, "v": v} for i, v in enumerate(values) if v == v and abs(v) != float("inf")]
    from_raw, from_dicts = _both_ways(docs, schemas_enable=False)
    assert from_raw == from_dicts


def test_random_doubles_are_spelled_as_java_spells_them() -> None:
    """Debezium 3.x: ``Double.toString`` (positional from 1e-3 to below 1e7), at and around its bounds
    and over every exponent, in ``after`` (strict) and in the key (relaxed)."""
    rng = random.Random(11)
    values = [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(20_000)]
    for bound in (1e-3, 1e7, 1e-5, 1e16):
        values += [bound, -bound, math.nextafter(bound, 0.0), math.nextafter(bound, math.inf)]
    values += [rng.uniform(1e6, 1e8) for _ in range(200)] + [rng.uniform(1e-4, 1e-2) for _ in range(200)]
    values += [0.0, -0.0, 1.0, 100.0, 5e-324, 1.7976931348623157e308, float("nan"), float("inf"), float("-inf")]
    docs = [{"_id": v, "v": v} for v in values]
    raw = _raw(docs)
    assert not _left(raw, "debezium_3x")
    conv = converter(schemas_enable=False, event_format="debezium_3x")
    markers = ["true"] * len(docs)
    from_raw = conv.convert_reads(raw, markers, "inventory", "customers", POSITION, TS)
    assert from_raw == conv.convert_reads(raw.decoded(), markers, "inventory", "customers", POSITION, TS)


def test_documents_the_compiled_path_leaves_to_python() -> None:
    """A repeated name (a dict keeps the last value, in the first place), a DBRef (decoded, it is
    written $ref, $id, $db first), a non-finite double, a NaN Decimal128, a legacy UUID (subtype 3,
    spelled after the client's UUID representation) and a key of another type are all converted by
    the Python path, in place."""
    repeated = _members([("_id", 1), ("a", 1), ("b", 2), ("a", 3)])
    many = _members([("_id", 2), *[(f"f{i}", i) for i in range(20)], ("f3", "again")])
    dbrefs = _members([("_id", 7), ("r", {"$id": 1, "$ref": "c"}), ("s", {"$ref": "c", "$id": 2, "x": 1, "$db": "d"})])
    docs: list[Any] = [{"_id": 3, "x": float("nan")}, {"_id": 4, "d": Decimal128("NaN"), "u": Binary(bytes(16), 3)},
                       {"_id": 5.5, "x": 1}, {"_id": Int64(6), "when": datetime.datetime(2020, 1, 1)}]
    raw = RawDocuments(repeated + many + dbrefs + b"".join(bson.encode(doc) for doc in docs), ENGINE_OPTIONS)
    left = mongocdc_native.convert_reads(raw.data, raw.bounds, 0, len(raw), b"", b"", b"", b"")[4]
    assert left == [0, 1, 2, 3, 4, 5]
    conv = converter(schemas_enable=False)
    markers = _markers(len(raw))
    assert conv.convert_reads(raw, markers, "inventory", "customers", POSITION, TS) == conv.convert_reads(
        raw.decoded(), markers, "inventory", "customers", POSITION, TS)
    assert b'\\"a\\": 3,\\"b\\": 2' in (conv.convert_reads(raw[:1], ["true"], "inventory", "customers", POSITION, TS)[0].value or b"")


def test_a_chunk_of_inner_reads_is_one_run_that_reads_as_its_list() -> None:
    """Reads of one marker, all written by the compiled path: a RecordRun, the records made only when
    taken, and it reads (index, slice, iteration, equality) exactly as the list the Python path gives."""
    docs = [{"_id": i, "name": f"n-{i}", "tags": ["a"] * (i % 3)} for i in range(7)]
    raw = _raw(docs)
    conv = converter(schemas_enable=True)
    run = conv.convert_reads(raw, ["true"] * 7, "inventory", "customers", POSITION, TS)
    listed = conv.convert_reads(raw.decoded(), ["true"] * 7, "inventory", "customers", POSITION, TS)
    assert isinstance(run, RecordRun) and not isinstance(listed, RecordRun)
    assert run == listed and listed == run and len(run) == 7 and list(run) == listed
    assert run[0] == listed[0] and run[-1] == listed[-1] and run[3].op == "r" and run[3].collection == "inventory.customers"
    middle = run[2:5]
    assert isinstance(middle, RecordRun) and middle == listed[2:5] and middle[-1] == listed[4] and middle[1:] == listed[3:5]
    assert run[::2] == listed[::2] and run[5:2] == [] and run != listed[:6]
    assert run.keys() == [r.key for r in listed] and middle.values() == [r.value for r in listed[2:5]]
    with pytest.raises(IndexError):
        run[7]
    with pytest.raises(IndexError):
        middle[-4]
    # a first or last read of the collection (another marker) or a read left to Python: a list
    assert type(conv.convert_reads(raw, ["first", *["true"] * 6], "inventory", "customers", POSITION, TS)) is list


def _members(pairs: list[tuple[str, Any]]) -> bytes:
    """A BSON document with these members in this order, repeated names included (a dict cannot hold them)."""
    body = b"".join(bson.encode({name: value})[4:-1] for name, value in pairs)
    return (len(body) + 5).to_bytes(4, "little") + body + b"\x00"


def test_a_raw_read_without_id_fails_like_the_read() -> None:
    raw = _raw([{"_id": 1}, {"x": 1}])
    with pytest.raises(ValueError, match="has no '_id'"):
        converter().convert_reads(raw, ["true", "true"], "inventory", "customers", POSITION)


def test_raw_documents_behave_as_a_sequence_of_decoded_documents() -> None:
    docs = [{"_id": i, "n": "x" * i} for i in range(6)]
    raw = _raw(docs)
    assert len(raw) == 6 and list(raw) == docs and raw[-1] == docs[-1] and raw[2] == docs[2]
    tail = raw[4:]
    assert len(tail) == 2 and list(tail) == docs[4:] and raw[:0].decoded() == []
    assert tail.raw(1) == bson.encode(docs[5]) and list(tail[1:]) == docs[5:] and len(tail[2:]) == 0
    with pytest.raises(IndexError):
        raw[6]


def test_a_malformed_batch_is_named() -> None:
    good = bson.encode({"_id": 1})
    with pytest.raises(ValueError, match=f"BSON document at byte {len(good)} declares"):
        RawDocuments(good + b"\x30\x00\x00\x00\x00", ENGINE_OPTIONS)
    with pytest.raises(ValueError, match="truncated BSON document at byte"):
        mongocdc_native.document_bounds(good + b"\x01")
    # Bounds that do not fit the data are refused, never a crash of the compiled code.
    for bounds in ([5, 0, len(good)], [0, len(good) + 1]):
        with pytest.raises(ValueError, match="ascending bounds"):
            mongocdc_native.convert_reads(good, bounds, 0, len(bounds) - 1, b"", b"", b"", b"")
    empty = bytes(8)  # one end offset, 0: the read is left to Python with an empty key and value
    assert mongocdc_native.convert_reads(good, [0, 0], 0, 1, b"", b"", b"", b"") == (b"", empty, b"", empty, [0], None)
    assert mongocdc_native.convert_reads(good[:3], [0, 3], 0, 1, b"", b"", b"", b"") == (b"", empty, b"", empty, [0], None)


def test_a_cursor_reply_is_cut_into_its_batch_or_named() -> None:
    docs = [{"_id": i, "v": "x" * i} for i in range(3)]
    reply = bson.encode({"cursor": {"nextBatch": docs, "id": Int64(42), "ns": "db.c"}, "ok": 1.0})
    cursor_id, data, bounds, at = mongocdc_native.cursor_batch(reply)
    assert cursor_id == 42 and list(RawDocuments(data, ENGINE_OPTIONS, bounds)) == docs and at is None
    first = bson.encode({"cursor": {"id": 0, "firstBatch": [], "atClusterTime": Timestamp(1700000000, 7)}})
    assert mongocdc_native.cursor_batch(first) == (0, b"", [0], (1700000000, 7))
    with pytest.raises(ValueError, match="no 'cursor' document"):
        mongocdc_native.cursor_batch(bson.encode({"ok": 0.0}))
    with pytest.raises(ValueError, match="BSON type 0x10, not a document"):
        mongocdc_native.cursor_batch(bson.encode({"cursor": {"id": 0, "firstBatch": [1]}}))
    short = bson.encode({"cursor": {"id": 0, "firstBatch": []}}).replace(b"\x05\x00\x00\x00\x00", b"\x01\x00\x00\x00\x00")
    with pytest.raises(ValueError, match="no 'firstBatch'/'nextBatch' array"):
        mongocdc_native.cursor_batch(short)


@settings(max_examples=300, deadline=None, phases=[Phase.generate])
@given(plain_documents, st.lists(st.tuples(st.integers(min_value=4), st.integers(0, 255)), max_size=6), st.binary(max_size=64))
def test_damaged_bson_is_refused_or_left_to_python_never_a_crash(
    body: dict[str, Any], flips: list[tuple[int, int]], noise: bytes
) -> None:
    """Bytes changed inside a well-framed document: the compiled path writes it or leaves it to Python;
    arbitrary bytes as a batch or a reply: a ValueError. Never a panic of the compiled code."""
    data = bytearray(bson.encode({"_id": 1, **{k: v for k, v in body.items() if k != "_id"}}))
    for at, byte in flips:
        data[4 + at % max(1, len(data) - 5)] = byte
    raw = RawDocuments(bytes(data), ENGINE_OPTIONS)
    if not mongocdc_native.convert_reads(raw.data, raw.bounds, 0, 1, b"", b"", b"", b"")[4]:
        # what it writes, Python decodes and writes alike
        conv = converter(schemas_enable=False)
        assert conv.convert_reads(raw, ["true"], "inventory", "customers", POSITION, TS) == conv.convert_reads(
            raw.decoded(), ["true"], "inventory", "customers", POSITION, TS)
    for call in (mongocdc_native.document_bounds, mongocdc_native.cursor_batch):
        try:
            call(noise)
        except ValueError:
            pass
