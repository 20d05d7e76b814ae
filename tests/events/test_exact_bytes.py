"""The fast writers produce exactly the bytes of the straightforward ones.

Records are built in one pass (bytes templates per collection) and documents are restyled from
orjson's compact output; these tests pin that the bytes did not move: a golden set of records
(every format, option and escaping edge case) against the digest of what the dict-and-orjson
writer produced, and properties over generated documents against the reference algorithms.
"""

from __future__ import annotations

import datetime
import hashlib
import random
from typing import Any

import orjson
from bson.binary import Binary
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from mongocdc_core.events import ejson
from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.ejson import COMPACT_STYLE, DOCUMENT_STYLE, KEY_STYLE, LEGACY_STYLE, EjsonMode
from mongocdc_core.events.options import EventOptions
from mongocdc_core.positions import Position

from .helpers import POSITION, insert, payload, update
from .strategies import documents, normalized

LSID = {"id": Binary(bytes.fromhex("140ed81335e0417497f4ec66ce5947db"), 4), "uid": Binary(b"\x01" * 32, 0)}
DOC = {
    "_id": ObjectId("596e275826f08b2730779e1f"), "name": 'quo"te, x: [y]', "n": Int64(5), "price": Decimal128("12.50"),
    "at": datetime.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=datetime.UTC), "tags": ["a", "b, c", ""],
    "nested": {"k": [1, 2.5, {"z": None}]}, "ü": "Zoë\n\t", "big": 1e16, "neg": -0.0,
}  # fmt: skip
# What the dict-and-orjson writer (before the one-pass rewrite) produced for GOLDEN_EVENTS.
GOLDEN_DIGEST = "a59b563146b702f87f3f48cee6c3972b083114713051c407d9a03ea6d3eb3550"


def _event(op: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "_id": {"_data": "8200"}, "operationType": op, "clusterTime": Timestamp(1558965508, 31),
        "wallTime": datetime.datetime(2019, 5, 27, 13, 58, 28, 123000, tzinfo=datetime.UTC),
        "ns": {"db": "inventory", "coll": "customers%d"}, "documentKey": {"_id": DOC["_id"]},
    }  # fmt: skip
    base.update(fields)
    return base


GOLDEN_EVENTS = [
    _event("insert", fullDocument=DOC),
    _event("insert", fullDocument={**DOC, "_id": 7}, documentKey={"_id": 7}, lsid=LSID, txnNumber=Int64(3)),
    _event(
        "update", fullDocument=DOC, fullDocumentBeforeChange={**DOC, "n": Int64(4)},
        updateDescription={"updatedFields": {"n": Int64(5), "a.b": "x"}, "removedFields": ["old"],
                           "truncatedArrays": [{"field": "tags", "newSize": 3}]},
    ),  # fmt: skip
    _event("update", fullDocument=None, updateDescription={"updatedFields": {}, "removedFields": [], "truncatedArrays": []}),
    _event("replace", fullDocument=DOC),
    _event("delete", documentKey={"_id": "str-id"}),
    _event("delete", documentKey={"_id": {"a": 1, "b": [1, 2]}}, lsid=LSID, txnNumber=Int64(9)),
]
GOLDEN_OPTIONS: list[dict[str, Any]] = [
    {},
    {"schemas_enable": False},
    {"capture_mode": "change_streams_update_full_with_pre_image", "provide_transaction_metadata": True},
    {"event_format": "oplog_1x"},
    {"field_exclude_list": ("inventory.customers%d.price",), "field_renames": ("inventory.customers%d.n:m",)},
]


def test_golden_records_keep_their_bytes() -> None:
    out = []
    for opts in GOLDEN_OPTIONS:
        conv = EventConverter(EventOptions(
            topic_prefix="srv%s", rs="rs0", now_ns=lambda: 1558965515240142879, connector_version="3.1.0", **opts
        ))  # fmt: skip
        records = []
        for i, event in enumerate(GOLDEN_EVENTS):
            records += conv.convert_change(event, Position(1558965508, 31, i))
        records += conv.flush()
        read_at = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
        records.append(conv.convert_read(DOC, "inventory", "customers%d", Position(1558965508, 31), "first", read_at))
        records.append(conv.convert_read({**DOC, "_id": Int64(3)}, "inventory", "customers%d", Position(1558965508, 31), "last"))
        out += [(r.topic, r.key, r.value) for r in records]
    assert len(out) == 59
    assert hashlib.sha256(repr(out).encode()).hexdigest() == GOLDEN_DIGEST


# Text made of JSON's structural characters, to stress telling strings from structure.
tricky_text = st.text(alphabet='":,[]{}\\ \n\x00ab$ü', max_size=10)
tricky_documents = st.recursive(
    st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | tricky_text | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(tricky_text, children, max_size=3),
    max_leaves=12,
).filter(lambda v: isinstance(v, (dict, list)))


def _reference(value: Any, style: ejson.JsonStyle) -> bytes:
    """The restyling of orjson's indented output (member names start their line)."""
    return ejson._styled(orjson.dumps(value, default=ejson._DEFAULTS[EjsonMode.STRICT], option=ejson._INDENT), style)


@settings(max_examples=400, deadline=None, phases=[Phase.generate])
@given(tricky_documents | documents.map(normalized))
def test_restyled_compact_output_equals_the_indented_reference(value: Any) -> None:
    for style in (DOCUMENT_STYLE, KEY_STYLE, LEGACY_STYLE):
        if ejson._needs_json_util(value):
            continue
        assert ejson.dumps_bytes(value, style) == _reference(value, style), style
    assert ejson.dumps_bytes(value, COMPACT_STYLE) == orjson.dumps(orjson.loads(ejson.dumps_bytes(value, KEY_STYLE)))
    for style in (DOCUMENT_STYLE, COMPACT_STYLE):
        assert ejson.dumps_string(value, style) == orjson.dumps(ejson.dumps(value, style))


@settings(max_examples=150, deadline=None, phases=[Phase.generate])
@given(documents.map(normalized), st.booleans())
def test_records_are_exactly_what_orjson_writes_for_their_payload(body: dict[str, Any], schemas: bool) -> None:
    conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", schemas_enable=schemas,
                                       capture_mode="change_streams_update_full_with_pre_image"))  # fmt: skip
    doc = {"_id": 1, **body}
    records = conv.convert_change(insert(doc), POSITION) + conv.convert_change(
        update(fullDocument=doc, fullDocumentBeforeChange=doc, updateDescription={"updatedFields": body,
               "removedFields": list(body)[:2], "truncatedArrays": []}), POSITION
    ) + [conv.convert_read(doc, "inventory", "customers", POSITION, "true")]  # fmt: skip
    for record in records:
        assert record.value is not None and record.key is not None
        assert orjson.dumps(orjson.loads(record.value)) == record.value
        assert orjson.dumps(orjson.loads(record.key)) == record.key
        assert payload(record)["after"] == ejson.dumps(doc)


def test_decimal128_text_equals_pymongos() -> None:
    rng = random.Random(7)
    values = [Decimal128.from_bid(rng.randbytes(16)) for _ in range(20_000)]
    values += [Decimal128(t) for t in ("0", "-0", "1E+6111", "1E-6176", "-1.5E-10", "9" * 34, "0.000", "NaN", "-Infinity")]
    for value in values:
        try:
            expected = str(value)
        except Exception as exc:  # noqa: BLE001 - the same failure is expected
            expected = repr(exc)
        try:
            text = ejson.decimal128_text(value)
        except Exception as exc:  # noqa: BLE001
            text = repr(exc)
        assert text == expected


def test_dates_outside_pythons_range_in_records() -> None:
    conv = EventConverter(EventOptions(topic_prefix="p", schemas_enable=False))
    (record,) = conv.convert_change(insert({"_id": DatetimeMS(2**62), "d": DatetimeMS(-(2**62))}), POSITION)
    assert payload(record)["after"] == f'{{"_id": {{"$date": {2**62}}},"d": {{"$date": {-(2**62)}}}}}'
    assert orjson.loads(record.key or b"") == {"id": f'{{"$date" : {2**62}}}'}
