"""Update descriptions applied to Extended JSON documents with the standard library only (no Spark)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from mongocdc_core.events import ejson
from mongocdc_core.tables import fold
from mongocdc_core.tables.fold import UpdateError, apply_update


def _update(doc: dict[str, Any], updated: dict[str, Any] | None = None, removed: list[str] | None = None,
            truncated: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    text = ejson.dumps(updated) if updated else None
    trunc = json.dumps(truncated) if truncated else None
    return apply_update(doc, text, removed, trunc)


def test_dotted_paths_array_indexes_and_padding() -> None:
    doc = {"_id": 1, "a": {"b": [1, 2, 3]}, "c": 1}
    out = _update(doc, {"a.b.1": 20, "a.b.5": 6, "x.y": "new"})
    assert out == {"_id": 1, "a": {"b": [1, 20, 3, None, None, 6]}, "c": 1, "x": {"y": "new"}}


def test_values_stay_extended_json_wrappers() -> None:
    from bson.int64 import Int64

    doc = json.loads(ejson.dumps({"_id": 1, "n": 1}))
    out = apply_update(doc, ejson.dumps({"n": Int64(5)}), None, None)
    assert out == {"_id": 1, "n": {"$numberLong": "5"}}


def test_removed_fields_and_array_element_unset() -> None:
    doc = {"_id": 1, "a": {"b": 1, "c": 2}, "arr": [1, 2, 3], "gone": True}
    out = _update(doc, removed=["a.b", "gone", "arr.1", "missing.path"])
    assert out == {"_id": 1, "a": {"c": 2}, "arr": [1, None, 3]}


def test_truncation_then_set_uses_debezium_and_mongodb_names() -> None:
    doc = {"_id": 1, "arr": [1, 2, 3, 4], "deep": {"list": ["a", "b"]}}
    out = _update(doc, {"arr.2": "x"}, truncated=[{"field": "arr", "size": 2}, {"field": "deep.list", "newSize": 1}])
    assert out == {"_id": 1, "arr": [1, 2, "x"], "deep": {"list": ["a"]}}


def test_bad_update_descriptions_are_named() -> None:
    with pytest.raises(UpdateError, match="indexes an array"):
        _update({"_id": 1, "arr": [1]}, {"arr.name": 1})
    with pytest.raises(UpdateError, match="not an array"):
        _update({"_id": 1, "x": 1}, truncated=[{"field": "x", "size": 0}])


def _events(*rows: tuple[str, str, str | None, str | None]) -> pa.Table:
    return pa.Table.from_pylist([
        {"__key": "1", "__op": op, "__position": pos, "__ts_ms": 1, "__source_ts_ms": 1, "after": after,
         "updated_fields": updated, "removed_fields": None, "truncated_arrays": None}
        for op, pos, after, updated in rows
    ])


def test_fold_key_orders_by_position_and_reports_pending_and_deleted() -> None:
    out = fold.fold_key(_events(
        ("u", "3", None, '{"a": 3}'), ("r", "1", '{"_id": 1, "a": 1}', None), ("u", "2", None, '{"b": 2}'),
    )).to_pylist()[0]
    assert json.loads(out["after"]) == {"_id": 1, "a": 3, "b": 2} and not out["deleted"] and not out["pending"]
    assert out["__position"] == "3"
    assert fold.fold_key(_events(("u", "5", None, '{"a": 1}'))).to_pylist()[0]["pending"]
    assert fold.fold_key(_events(("c", "1", '{"_id": 1}', None), ("d", "2", None, None))).to_pylist()[0]["deleted"]


def test_fold_module_imports_only_the_standard_library_and_pyarrow() -> None:
    """Executors run it without mongocdc (or pymongo) installed: it is shipped by value."""
    tree = ast.parse(Path(fold.__file__).read_text())
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported <= {"__future__", "json", "collections", "typing", "pyarrow"}
