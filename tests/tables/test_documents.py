"""Update-description application, typed-column projection and the reconciliation hash (no Spark)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from bson.int64 import Int64
from bson.objectid import ObjectId
from hypothesis import given
from hypothesis import strategies as st

from mongocdc_core.events import ejson
from mongocdc_core.tables import documents
from mongocdc_core.tables.documents import DocumentError, apply_update


def _update(doc: dict[str, Any], updated: dict[str, Any] | None = None, removed: list[str] | None = None,
            truncated: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    text = ejson.dumps(updated) if updated else None
    trunc = ejson.dumps(truncated) if truncated else None
    return dict(apply_update(doc, text, removed, trunc))


def test_dotted_paths_array_indexes_and_padding() -> None:
    doc = {"_id": 1, "a": {"b": [1, 2, 3]}, "c": 1}
    out = _update(doc, {"a.b.1": 20, "a.b.5": 6, "x.y": "new", "c": Int64(7)})
    assert out == {"_id": 1, "a": {"b": [1, 20, 3, None, None, 6]}, "c": 7, "x": {"y": "new"}}
    assert isinstance(out["c"], Int64)


def test_removed_fields_and_array_element_unset() -> None:
    doc = {"_id": 1, "a": {"b": 1, "c": 2}, "arr": [1, 2, 3], "gone": True}
    out = _update(doc, removed=["a.b", "gone", "arr.1", "missing.path"])
    assert out == {"_id": 1, "a": {"c": 2}, "arr": [1, None, 3]}


def test_truncation_then_set_uses_debezium_and_mongodb_names() -> None:
    doc = {"_id": 1, "arr": [1, 2, 3, 4], "deep": {"list": ["a", "b"]}}
    out = _update(doc, {"arr.2": "x"}, truncated=[{"field": "arr", "size": 2}, {"field": "deep.list", "newSize": 1}])
    assert out == {"_id": 1, "arr": [1, 2, "x"], "deep": {"list": ["a"]}}


def test_bad_update_descriptions_are_named() -> None:
    with pytest.raises(DocumentError, match="indexes an array"):
        _update({"_id": 1, "arr": [1]}, {"arr.name": 1})
    with pytest.raises(DocumentError, match="not an array"):
        _update({"_id": 1, "x": 1}, truncated=[{"field": "x", "size": 0}])
    with pytest.raises(DocumentError, match="Extended JSON"):
        apply_update({"_id": 1}, "{not json", None, None)


def test_document_row_types_and_reserved_names() -> None:
    when = datetime.datetime(2024, 5, 6, 7, 8, 9, 123000)
    doc = {"_id": ObjectId("65f0a1b2c3d4e5f6a7b8c9d0"), "n": 1, "big": Int64(2**40), "f": 1.5, "b": True,
           "s": "x", "t": when, "o": {"k": [1]}, "nil": None, "op": "reserved", "bad name": 1}
    text, plain, types = documents.document_row(doc)
    assert types == {"n": "bigint", "big": "bigint", "f": "double", "b": "boolean", "s": "string",
                     "t": "timestamp", "o": "string"}
    assert '"t":"2024-05-06T07:08:09.123000Z"' in plain and '"o":"{\\"k\\": [1]}"' in plain
    assert documents.loads(text) == doc


def test_widening_rules() -> None:
    assert documents.widen(None, "bigint") == "bigint"
    assert documents.widen("bigint", "double") == "double"
    assert documents.widen("double", "bigint") == "double"
    assert documents.widen("bigint", "boolean") == "string"
    assert documents.widen("timestamp", "string") == "string"


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**31), 2**31 - 1) | st.text(max_size=5)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("abc", min_size=1, max_size=2), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=3), _values, max_size=6))
def test_hash_ignores_key_order_and_int64_but_not_values(fields: dict[str, Any]) -> None:
    doc = {"_id": 1, **fields}
    shuffled = {"_id": 1, **dict(reversed(list(fields.items())))}
    assert documents.document_hash(doc) == documents.document_hash(shuffled)
    # what the table stores (relaxed Extended JSON text) hashes like the source document
    assert documents.document_hash(documents.loads(documents.dumps(doc))) == documents.document_hash(doc)
    assert documents.document_hash({**doc, "_extra": 1}) != documents.document_hash(doc)
    as_long = {k: Int64(v) if type(v) is int else v for k, v in doc.items()}
    assert documents.document_hash(as_long) == documents.document_hash(doc)
