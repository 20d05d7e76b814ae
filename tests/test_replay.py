"""Replaying records rebuilds documents, including update descriptions without full documents."""

from __future__ import annotations

import orjson
import pytest
from bson import ObjectId, json_util

from mongocdc_core.replay import Replayer, ReplayError, apply_update_description, canonical, differences

SOURCE = {"db": "inventory", "collection": "orders"}


def _key(value: object) -> bytes:
    return orjson.dumps({"id": json_util.dumps(value)})


def _value(op: str, **fields: object) -> bytes:
    return orjson.dumps({"op": op, "source": SOURCE, **fields})


def test_apply_update_description_paths_arrays_and_removals() -> None:
    doc = {"_id": 1, "a": {"b": 1, "c": 2}, "arr": [1, 2, 3, 4], "gone": True}
    apply_update_description(
        doc,
        {
            "updatedFields": '{"a.b": 5, "arr.1": 9, "new.deep": {"x": 1}}',
            "removedFields": ["gone", "a.c"],
            "truncatedArrays": [{"field": "arr", "newSize": 2}],
        },
    )
    assert doc == {"_id": 1, "a": {"b": 5}, "arr": [1, 9], "new": {"deep": {"x": 1}}}


def test_array_append_and_unset_element() -> None:
    doc = {"_id": 1, "arr": [1]}
    apply_update_description(doc, {"updatedFields": '{"arr.2": 3}', "removedFields": ["arr.0"]})
    assert doc["arr"] == [None, None, 3]


def test_replayer_follows_create_update_delete_and_ignores_tombstones() -> None:
    oid = ObjectId()
    records = [
        (_key(oid), _value("r", after=json_util.dumps({"_id": oid, "n": 1}))),
        (_key(2), _value("c", after='{"_id": 2, "n": 2}')),
        (_key(oid), {"schema": {}, "payload": orjson.loads(_value("u", updateDescription={"updatedFields": '{"n": 5}', "removedFields": [], "truncatedArrays": None}))}),
        (_key(2), _value("d", before=None)),
        (_key(2), None),
        (_key(3), _value("u", after='{"_id": 3, "full": true}')),
    ]
    replay = Replayer().apply_all(records)
    assert canonical(replay.documents("inventory.orders")) == canonical([{"_id": oid, "n": 5}, {"_id": 3, "full": True}])


def test_update_of_unknown_document_is_an_error() -> None:
    with pytest.raises(ReplayError, match="never seen"):
        Replayer().apply(_key(1), _value("u", updateDescription={"updatedFields": "{}"}))


def test_bad_key_is_an_error() -> None:
    with pytest.raises(ReplayError, match="'id'"):
        Replayer().apply(b'{"x": 1}', _value("c", after="{}"))


def test_differences_names_the_mismatch() -> None:
    assert differences([{"_id": 1, "a": 1}], [{"a": 1, "_id": 1}]) == []
    lines = differences([{"_id": 1, "a": 1}], [{"_id": 1, "a": 2}])
    assert any("missing" in line for line in lines) and any("unexpected" in line for line in lines)
