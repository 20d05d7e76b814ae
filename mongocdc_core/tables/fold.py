"""Rebuild a document from its last full image and later update descriptions (capture modes without
full documents). The one Python function the tables run on executors.

Executors need nothing installed: this module imports only the standard library and pyarrow (which
PySpark's Arrow functions need anyway), and it is shipped by value with the job
(``cloudpickle.register_pickle_by_value``), never imported there. Documents stay Extended JSON
throughout: a dotted update path never goes inside a BSON value's wrapper, so plain JSON objects and
lists are enough to apply ``$set``/``$unset``/array truncation exactly as MongoDB did.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

#: Arrow schema of :func:`fold_key`'s output (one row per key).
RESULT = pa.schema(
    [
        ("__key", pa.string()),
        ("__op", pa.string()),
        ("__position", pa.string()),
        ("__ts_ms", pa.int64()),
        ("__source_ts_ms", pa.int64()),
        ("after", pa.string()),
        ("deleted", pa.bool_()),
        ("pending", pa.bool_()),
    ]
)


class UpdateError(ValueError):
    """An update description that does not apply to the document it follows."""


def _child(container: Any, segment: str, path: str, create: bool) -> Any:
    """The value under one path segment; creates missing sub-documents when ``create``."""
    if isinstance(container, list):
        if not segment.isdigit():
            raise UpdateError(f"path {path!r}: segment {segment!r} indexes an array")
        index = int(segment)
        if index >= len(container):
            if not create:
                return None
            container.extend([None] * (index + 1 - len(container)))
        if container[index] is None and create:
            container[index] = {}
        return container[index]
    if isinstance(container, dict):
        if segment not in container or (container[segment] is None and create):
            if not create:
                return None
            container[segment] = {}
        return container[segment]
    if create:
        raise UpdateError(f"path {path!r}: segment {segment!r} goes through a {type(container).__name__}")
    return None


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    """``$set`` of a dotted path; numeric segments index arrays (padding with nulls as MongoDB does)."""
    *parents, last = path.split(".")
    container: Any = doc
    for segment in parents:
        container = _child(container, segment, path, create=True)
    if isinstance(container, list):
        if not last.isdigit():
            raise UpdateError(f"path {path!r}: segment {last!r} indexes an array")
        index = int(last)
        if index >= len(container):
            container.extend([None] * (index + 1 - len(container)))
        container[index] = value
    elif isinstance(container, dict):
        container[last] = value
    else:
        raise UpdateError(f"path {path!r} goes through a {type(container).__name__}")


def _unset(doc: dict[str, Any], path: str) -> None:
    """``$unset`` of a dotted path; an array element becomes null (MongoDB keeps the array length)."""
    *parents, last = path.split(".")
    container: Any = doc
    for segment in parents:
        container = _child(container, segment, path, create=False)
        if container is None:
            return
    if isinstance(container, dict):
        container.pop(last, None)
    elif isinstance(container, list) and last.isdigit() and int(last) < len(container):
        container[int(last)] = None


def _truncate(doc: dict[str, Any], path: str, size: int) -> None:
    """Shrink the array at ``path`` to ``size`` elements."""
    *parents, last = path.split(".")
    container: Any = doc
    for segment in parents:
        container = _child(container, segment, path, create=False)
    target = _child(container, last, path, create=False) if container is not None else None
    if not isinstance(target, list):
        raise UpdateError(f"truncatedArrays names {path!r}, which is not an array in the prior state")
    del target[size:]


def _truncations(text: str | None) -> list[tuple[str, int]]:
    """``truncatedArrays`` JSON (Debezium writes ``size``; MongoDB's own name is ``newSize``)."""
    if not text:
        return []
    items = json.loads(text)
    if not isinstance(items, list):
        raise UpdateError(f"truncatedArrays is not a JSON array: {text[:200]!r}")
    out: list[tuple[str, int]] = []
    for item in items:
        size = item.get("size", item.get("newSize")) if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("field"), str) or not isinstance(size, int):
            raise UpdateError(f"truncatedArrays entry needs 'field' and 'size': {item!r}")
        out.append((item["field"], size))
    return out


def apply_update(
    doc: dict[str, Any], updated_fields: str | None, removed_fields: Iterable[str] | None, truncated_arrays: str | None
) -> dict[str, Any]:
    """Apply one ``updateDescription`` (Extended JSON texts) to ``doc`` in place: truncations, then
    sets, then unsets, as MongoDB orders them."""
    for path, size in _truncations(truncated_arrays):
        _truncate(doc, path, size)
    if updated_fields:
        updates = json.loads(updated_fields)
        if not isinstance(updates, dict):
            raise UpdateError(f"updatedFields is not a JSON object: {updated_fields[:200]!r}")
        for path, value in updates.items():
            _set(doc, path, value)
    for path in removed_fields or ():
        _unset(doc, path)
    return doc


def fold_key(table: pa.Table) -> pa.Table:
    """All events of one key (any order) -> its state: a document (``after``), deleted, or pending
    (updates whose full image has not arrived yet). At one position a read sorts before a change."""
    rows = sorted(table.to_pylist(), key=lambda r: (r["__position"], 0 if r["__op"] == "r" else 1))
    doc: dict[str, Any] | None = None
    state = "unknown"
    for row in rows:
        if row["__op"] == "d":
            doc, state = None, "absent"
        elif row["after"] is not None:
            doc, state = json.loads(row["after"]), "present"
        elif doc is not None:
            try:
                apply_update(doc, row["updated_fields"], row["removed_fields"], row["truncated_arrays"])
            except UpdateError as exc:
                raise UpdateError(f"key {row['__key']} at {row['__position']}: {exc}") from None
    last = rows[-1]
    out = {
        "__key": last["__key"],
        "__op": last["__op"],
        "__position": last["__position"],
        "__ts_ms": last["__ts_ms"],
        "__source_ts_ms": last["__source_ts_ms"],
        "after": json.dumps(doc, ensure_ascii=False) if state == "present" else None,
        "deleted": state == "absent",
        "pending": state == "unknown",
    }
    return pa.Table.from_pylist([out], schema=RESULT)
