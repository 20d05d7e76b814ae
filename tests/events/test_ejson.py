"""Extended JSON text exactly as the seed shows it, and lossless round trips for every BSON type."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from bson import json_util
from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from mongocdc_core.events import ejson
from mongocdc_core.events.ejson import COMPACT_STYLE, DOCUMENT_STYLE, LEGACY_STYLE, EjsonMode

from .strategies import documents, id_values, normalized, same_bson


# Table 9 of the current connector documentation: _id value -> key payload id, row by row.
@pytest.mark.parametrize("value", [ObjectId(), Int64(-(2**62)), 7, -(2**31), "", 'quo"te\u2028\x00'])
def test_key_fast_paths_equal_the_general_writer(value: Any) -> None:
    assert ejson.key_id(value) == ejson.dumps(value, ejson.KEY_STYLE)


def test_key_table_integer() -> None:
    assert ejson.key_id(1234) == "1234"


def test_key_table_float() -> None:
    assert ejson.key_id(12.34) == "12.34"


def test_key_table_string() -> None:
    assert ejson.key_id("1234") == '"1234"'


def test_key_table_document() -> None:
    assert ejson.key_id({"hi": "kafka", "nums": [10.0, 100.0, 1000.0]}) == (
        '{"hi" : "kafka", "nums" : [10.0, 100.0, 1000.0]}'
    )


def test_key_table_object_id() -> None:
    assert ejson.key_id(ObjectId("596e275826f08b2730779e1f")) == '{"$oid" : "596e275826f08b2730779e1f"}'


def test_key_table_binary() -> None:
    expected = '{"$binary" : "a2Fma2E=", "$type" : "00"}'
    assert ejson.key_id(Binary(b"kafka", 0)) == expected
    assert ejson.key_id(b"kafka") == expected  # bson.decode returns subtype 0 as bytes


def test_document_style_matches_update_example() -> None:
    doc = {
        "_id": Int64(1004),
        "first_name": "unknown",
        "last_name": "Kretchmar",
        "email": "annek@noanswer.org",
    }
    assert ejson.dumps(doc) == (
        '{"_id": {"$numberLong": "1004"},"first_name": "unknown","last_name": "Kretchmar",'
        '"email": "annek@noanswer.org"}'
    )


def test_lsid_example() -> None:
    lsid = {
        "id": Binary(bytes.fromhex("140ed81335e0417497f4ec66ce5947db"), 4),
        "uid": Binary(
            json_util.loads('{"$binary": "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=", "$type": "00"}')
        ),
    }
    assert ejson.dumps(lsid) == (
        '{"id": {"$binary": "FA7YEzXgQXSX9OxmzllH2w==","$type": "04"},'
        '"uid": {"$binary": "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=","$type": "00"}}'
    )


def test_legacy_and_compact_styles_match_1x_examples() -> None:
    doc = {"_id": Int64(1004), "first_name": "Anne"}
    assert ejson.dumps(doc, LEGACY_STYLE) == '{"_id" : {"$numberLong" : "1004"},"first_name" : "Anne"}'
    assert (
        ejson.dumps({"$set": {"first_name": "Anne Marie"}}, COMPACT_STYLE)
        == '{"$set":{"first_name":"Anne Marie"}}'
    )


def test_arrays_nested_documents_and_empty_containers() -> None:
    doc = {"a": [1, {"b": [2, 3]}, []], "e": {}, "s": 'quote " and ": colon, comma\n'}
    assert ejson.dumps(doc, DOCUMENT_STYLE) == (
        '{"a": [1, {"b": [2, 3]}, []],"e": {},"s": "quote \\" and \\": colon, comma\\n"}'
    )
    assert ejson.dumps(doc, ejson.KEY_STYLE) == (
        '{"a" : [1, {"b" : [2, 3]}, []], "e" : {}, "s" : "quote \\" and \\": colon, comma\\n"}'
    )


def test_separator_lookalikes_inside_strings_are_untouched() -> None:
    doc = {"a": "x", ": b": [": c", '", "'], '\\": ': {"d": ",\n  "}}
    assert ejson.key_id(doc) == '{"a" : "x", ": b" : [": c", "\\", \\""], "\\\\\\": " : {"d" : ",\\n  "}}'
    assert ejson.dumps(doc) == '{"a": "x",": b": [": c", "\\", \\""],"\\\\\\": ": {"d": ",\\n  "}}'
    assert ejson.loads(ejson.key_id(doc)) == doc


def test_tricky_field_names_keep_their_text() -> None:
    doc = {'k": x': 1, "k\\": 2, "ü ñ": {'\\"': 3}}
    text = ejson.dumps(doc, ejson.KEY_STYLE)
    assert ejson.loads(text) == doc
    assert text == '{"k\\": x" : 1, "k\\\\" : 2, "ü ñ" : {"\\\\\\"" : 3}}'


@pytest.mark.parametrize(
    ("value", "strict"),
    [
        (Int64(5), '{"$numberLong": "5"}'),
        (datetime.datetime(2020, 1, 1, 0, 0, 0, 123000), '{"$date": 1577836800123}'),
        (datetime.datetime(1969, 12, 31, 23, 59, 59), '{"$date": -1000}'),
        (Timestamp(1, 2), '{"$timestamp": {"t": 1,"i": 2}}'),
        (Regex("^a", "i"), '{"$regex": "^a","$options": "i"}'),
        (Code("f()"), '{"$code": "f()"}'),
        (Code("f()", {"x": 1}), '{"$code": "f()","$scope": {"x": 1}}'),
        (Decimal128("1.10"), '{"$numberDecimal": "1.10"}'),
        (MinKey(), '{"$minKey": 1}'),
        (MaxKey(), '{"$maxKey": 1}'),
        (float("nan"), '{"$numberDouble": "NaN"}'),
        (float("-inf"), '{"$numberDouble": "-Infinity"}'),
        (Binary(b"\x01", 0x80), '{"$binary": "AQ==","$type": "80"}'),
        (None, "null"),
        (True, "true"),
    ],
)
def test_strict_forms_of_each_type(value: Any, strict: str) -> None:
    assert ejson.dumps(value) == strict


def test_uuid_values_decoded_with_standard_representation() -> None:
    value = uuid.UUID("140ed813-35e0-4174-97f4-ec66ce5947db")
    assert (
        ejson.dumps({"u": value, "n": None})
        == '{"u": {"$binary": "FA7YEzXgQXSX9OxmzllH2w==","$type": "04"},"n": null}'
    )
    assert ejson.key_id(value) == '{"$binary" : "FA7YEzXgQXSX9OxmzllH2w==", "$type" : "04"}'
    # A string that merely looks like a UUID stays a string.
    assert ejson.dumps({"s": str(value)}) == '{"s": "140ed813-35e0-4174-97f4-ec66ce5947db"}'


def test_relaxed_and_canonical_modes() -> None:
    doc = {"n": 1, "l": Int64(2), "f": 1.5, "d": datetime.datetime(2020, 1, 1)}
    assert (
        ejson.dumps(doc, mode=EjsonMode.RELAXED)
        == '{"n": 1,"l": 2,"f": 1.5,"d": {"$date": "2020-01-01T00:00:00Z"}}'
    )
    assert ejson.dumps(doc, mode=EjsonMode.CANONICAL) == (
        '{"n": {"$numberInt": "1"},"l": {"$numberLong": "2"},"f": {"$numberDouble": "1.5"},'
        '"d": {"$date": {"$numberLong": "1577836800000"}}}'
    )


def test_unserializable_value_is_named() -> None:
    with pytest.raises(TypeError, match="object value .* has no Extended JSON form"):
        ejson.dumps({"x": object()})


# No shrink phase: Hypothesis' shrinker trips over str subclasses such as bson.Code and would
# replace the real failure with an internal KeyError; the unshrunk example is reported instead.
@settings(max_examples=300, deadline=None, phases=[Phase.generate])
@given(documents)
def test_every_bson_type_round_trips_through_json_util(doc: dict[str, Any]) -> None:
    original = normalized(doc)
    for mode in (EjsonMode.STRICT, EjsonMode.CANONICAL):
        text = ejson.dumps(original, mode=mode)
        assert same_bson(json_util.loads(text), original), (mode, text)
    # Relaxed mode drops number types by definition; it must still re-serialize identically.
    relaxed = ejson.dumps(original, mode=EjsonMode.RELAXED)
    assert ejson.dumps(json_util.loads(relaxed), mode=EjsonMode.RELAXED) == relaxed
    assert same_bson(json_util.loads(ejson.dumps(original, LEGACY_STYLE)), original)


@settings(max_examples=200, deadline=None, phases=[Phase.generate])
@given(id_values)
def test_keys_round_trip(value: Any) -> None:
    original = normalized(value)
    assert same_bson(ejson.loads(ejson.key_id(original)), original)


@pytest.mark.parametrize("millis", [2**62, -(2**62), -62_135_596_800_001, 253_402_300_800_000])
def test_dates_outside_pythons_range_are_spelled_like_every_date(millis: int) -> None:
    value = DatetimeMS(millis)
    assert ejson.dumps({"d": value}) == f'{{"d": {{"$date": {millis}}}}}'
    assert ejson.key_id(value) == f'{{"$date" : {millis}}}'
    assert ejson.dumps({"d": value}, COMPACT_STYLE) == f'{{"d":{{"$date":{millis}}}}}'
    assert ejson.loads(ejson.dumps({"d": value})) == {"d": value}


@settings(max_examples=200, deadline=None, phases=[Phase.generate])
@given(st.lists(documents, max_size=6))
def test_batched_document_strings_equal_one_by_one(docs: list[dict[str, Any]]) -> None:
    values = [normalized(doc) for doc in docs]
    for style in (DOCUMENT_STYLE, LEGACY_STYLE, COMPACT_STYLE):
        assert ejson.dumps_strings(values, style) == [ejson.dumps_string(value, style) for value in values]


def test_batched_document_strings_with_a_string_equal_to_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ejson.secrets, "token_hex", lambda n: "f" * (2 * n))
    values = [{"a": "f" * 32}, {"b": ["x", "f" * 32]}, {"c": 1}]
    assert ejson.dumps_strings(values) == [ejson.dumps_string(value) for value in values]


_PLAIN_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters='"\\'), max_size=8)
_PLAIN_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**31), 2**31 - 1), st.floats(allow_nan=False, allow_infinity=False),
              _PLAIN_TEXT, st.builds(lambda n: Int64(n), st.integers(-(2**63), 2**63 - 1)),
              st.builds(ObjectId), st.datetimes().map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000))),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_PLAIN_TEXT, inner, max_size=3)),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(_PLAIN_TEXT, _PLAIN_VALUES, max_size=5), min_size=2, max_size=6))
def test_batched_document_strings_of_plain_documents(docs: list[dict[str, Any]]) -> None:
    """Documents without escapes, the batched path's own case (most real snapshot chunks)."""
    assert ejson.dumps_strings(docs) == [ejson.dumps_string(doc) for doc in docs]
