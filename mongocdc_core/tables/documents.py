"""Pure document functions the Spark tables run inside Python workers (no Spark import here).

- :func:`apply_update` rebuilds a document from a prior state and a change stream
  ``updateDescription`` (capture modes without full documents);
- :func:`document_row` turns one document into the ``current_state`` representation: its Extended
  JSON text, the top-level fields as plain JSON for typed columns, and the Spark type of each field;
- :func:`document_hash` is the order-independent reconciliation hash, computed identically on the
  table side and on the MongoDB side.
"""

from __future__ import annotations

import datetime
import hashlib
import math
from collections.abc import Iterable, Mapping, MutableMapping
from decimal import Decimal
from typing import Any

import orjson
from bson import json_util
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.json_util import JSONOptions
from bson.objectid import ObjectId

from mongocdc_core.events import ejson

#: Column names the tables own; document fields with these names stay only in ``document``.
RESERVED_COLUMNS = frozenset({"collection", "_id", "op", "position", "ts_ms", "document"})
#: Spark SQL type names typed columns can take, and what two different types widen to.
LONG, DOUBLE, BOOLEAN, STRING, TIMESTAMP = "bigint", "double", "boolean", "string", "timestamp"
_TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_CANONICAL_OPTIONS: JSONOptions = json_util.CANONICAL_JSON_OPTIONS
_UNSAFE_NAME_CHARS = frozenset(" ,;{}()\n\t=")


class DocumentError(ValueError):
    """A landing-zone row whose document or update description cannot be interpreted."""


def loads(text: str) -> Any:
    """Parse the Extended JSON the connector writes (strict, relaxed or canonical) to BSON values."""
    try:
        return ejson.loads(text)
    except (ValueError, TypeError) as exc:
        raise DocumentError(f"not Extended JSON ({exc}): {text[:200]!r}") from None


def dumps(doc: Any) -> str:
    """The ``document`` column text: relaxed Extended JSON, the document's own field order."""
    return ejson.dumps(doc, mode=ejson.EjsonMode.RELAXED)


# --------------------------------------------------------------------------- update descriptions


def _child(container: Any, segment: str, path: str, create: bool) -> Any:
    """The value under one path segment; creates missing sub-documents when ``create``."""
    if isinstance(container, list):
        if not segment.isdigit():
            raise DocumentError(f"path {path!r}: segment {segment!r} indexes an array")
        index = int(segment)
        if index >= len(container):
            if not create:
                return None
            container.extend([None] * (index + 1 - len(container)))
        if container[index] is None and create:
            container[index] = {}
        return container[index]
    if isinstance(container, MutableMapping):
        if segment not in container or (container[segment] is None and create):
            if not create:
                return None
            container[segment] = {}
        return container[segment]
    if create:
        raise DocumentError(f"path {path!r}: segment {segment!r} goes through a {type(container).__name__}")
    return None


def _set_path(doc: MutableMapping[str, Any], path: str, value: Any) -> None:
    """``$set`` of a dotted path; numeric segments index arrays (padding with nulls as MongoDB does)."""
    *parents, last = path.split(".")
    container: Any = doc
    for segment in parents:
        container = _child(container, segment, path, create=True)
    if isinstance(container, list):
        if not last.isdigit():
            raise DocumentError(f"path {path!r}: segment {last!r} indexes an array")
        index = int(last)
        if index >= len(container):
            container.extend([None] * (index + 1 - len(container)))
        container[index] = value
    elif isinstance(container, MutableMapping):
        container[last] = value
    else:
        raise DocumentError(f"path {path!r} goes through a {type(container).__name__}")


def _unset_path(doc: MutableMapping[str, Any], path: str) -> None:
    """``$unset`` of a dotted path; an array element becomes null (MongoDB keeps the array length)."""
    *parents, last = path.split(".")
    container: Any = doc
    for segment in parents:
        container = _child(container, segment, path, create=False)
        if container is None:
            return
    if isinstance(container, MutableMapping):
        container.pop(last, None)
    elif isinstance(container, list) and last.isdigit() and int(last) < len(container):
        container[int(last)] = None


def _truncate_path(doc: MutableMapping[str, Any], path: str, size: int) -> None:
    """Shrink the array at ``path`` to ``size`` elements."""
    *parents, last = path.split(".")
    container: Any = doc
    for segment in parents:
        container = _child(container, segment, path, create=False)
    target = _child(container, last, path, create=False) if container is not None else None
    if not isinstance(target, list):
        raise DocumentError(f"truncatedArrays names {path!r}, which is not an array in the prior state")
    del target[size:]


def _truncations(text: str | None) -> list[tuple[str, int]]:
    """``truncatedArrays`` JSON (Debezium writes ``size``; MongoDB's own name is ``newSize``)."""
    if not text:
        return []
    items = orjson.loads(text)
    if not isinstance(items, list):
        raise DocumentError(f"truncatedArrays is not a JSON array: {text[:200]!r}")
    out: list[tuple[str, int]] = []
    for item in items:
        size = item.get("size", item.get("newSize")) if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("field"), str) or not isinstance(size, int):
            raise DocumentError(f"truncatedArrays entry needs 'field' and 'size': {item!r}")
        out.append((item["field"], size))
    return out


def apply_update(
    doc: MutableMapping[str, Any],
    updated_fields: str | None,
    removed_fields: Iterable[str] | None,
    truncated_arrays: str | None,
) -> MutableMapping[str, Any]:
    """Apply one ``updateDescription`` to ``doc`` in place (truncations, then sets, then unsets)."""
    for path, size in _truncations(truncated_arrays):
        _truncate_path(doc, path, size)
    if updated_fields:
        updates = loads(updated_fields)
        if not isinstance(updates, Mapping):
            raise DocumentError(f"updatedFields is not a JSON object: {updated_fields[:200]!r}")
        for path, value in updates.items():
            _set_path(doc, path, value)
    for path in removed_fields or ():
        _unset_path(doc, path)
    return doc


# --------------------------------------------------------------------------- typed columns


def spark_type(value: Any) -> str | None:
    """Spark SQL type of a top-level field value (None for null: a null says nothing about type)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return BOOLEAN
    if isinstance(value, int):  # int and Int64 alike: both become bigint, so they never conflict
        return LONG
    if isinstance(value, float):
        return DOUBLE
    if isinstance(value, datetime.datetime):
        return TIMESTAMP
    return STRING


def widen(left: str | None, right: str | None) -> str | None:
    """The type both values fit in: equal types stay, bigint+double is double, anything else string."""
    if left is None or left == right:
        return right
    if right is None:
        return left
    if {left, right} == {LONG, DOUBLE}:
        return DOUBLE
    return STRING


def plain_value(value: Any) -> Any:
    """The JSON value Spark's ``from_json`` reads into the field's typed column.

    Scalars are native JSON; timestamps are ISO-8601 UTC text; ObjectId, Decimal128 and every other
    BSON type, and sub-documents and arrays, become their relaxed Extended JSON text, so a column
    widened to string holds readable JSON.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return value.strftime(_TS_FORMAT)
    if isinstance(value, ObjectId):
        return str(value)
    if isinstance(value, Decimal128):
        return str(value.to_decimal())
    if isinstance(value, Decimal):
        return str(value)
    return dumps(value)


def column_name_ok(name: str) -> bool:
    """Whether a top-level field can be a typed column (Delta rejects some characters; `$` is reserved)."""
    return (
        bool(name)
        and name not in RESERVED_COLUMNS
        and not name.startswith("$")
        and not any(ch in _UNSAFE_NAME_CHARS for ch in name)
    )


def document_row(doc: Mapping[str, Any]) -> tuple[str, str, dict[str, str]]:
    """``(document, plain, types)`` for one document.

    ``document`` is its Extended JSON; ``plain`` a JSON object of the typable top-level fields in
    plain form (see :func:`plain_value`); ``types`` maps each non-null such field to its Spark type.
    """
    plain: dict[str, Any] = {}
    types: dict[str, str] = {}
    for name, value in doc.items():
        if name == "_id" or not column_name_ok(name):
            continue
        plain[name] = plain_value(value)
        kind = spark_type(value)
        if kind is not None:
            types[name] = kind
    return dumps(doc), orjson.dumps(plain).decode(), types


# --------------------------------------------------------------------------- reconciliation hash


def _normalise(value: Any) -> Any:
    """Forget what the change event text cannot carry: Int64 vs int (strict mode) and key order."""
    if isinstance(value, Mapping):
        return {k: _normalise(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    if isinstance(value, Int64):
        return int(value)
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.UTC).replace(tzinfo=None)
    return value


def canonical_json(value: Any) -> str:
    """Canonical Extended JSON with recursively sorted keys: equal documents give equal text."""
    return json_util.dumps(_normalise(value), json_options=_CANONICAL_OPTIONS)



def document_hash(doc: Mapping[str, Any]) -> int:
    """Unsigned 64-bit BLAKE2b of :func:`canonical_json`; summed modulo 2**64 it is order-independent."""
    return int.from_bytes(hashlib.blake2b(canonical_json(doc).encode(), digest_size=8).digest(), "big")
