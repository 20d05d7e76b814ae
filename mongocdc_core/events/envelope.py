"""Value payloads: the Debezium envelope (change streams format) and the 1.x oplog-era envelope.

The change streams envelope is written in one pass: everything that depends only on the collection
(the schema part, ``source.version/connector/name/db/rs/collection`` and every field name) is
serialised once per collection into a bytes template with ``%`` slots, and each event fills the
slots with its own bytes (document texts, numbers). The bytes equal what JsonConverter writes
(and orjson would write for the same payload dict): fields in the value schema's order, absent
optional fields present as ``null``. The 1.x envelope is written the same way from its own template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from mongocdc_core.events import ejson
from mongocdc_core.events.changes import short
from mongocdc_core.events.ejson import COMPACT_STYLE, DOCUMENT_STYLE, LEGACY_STYLE
from mongocdc_core.events.transforms import CollectionFields

CONNECTOR = "mongodb"
NULL = b"null"
#: Stands for a read's ``after`` in a value template filled once per chunk: JSON text never holds a NUL byte.
AFTER_SLOT = b"\x00"


def _constant(value: str) -> bytes:
    """A JSON string for a template (``%`` doubled, so it survives the ``%`` formatting)."""
    return orjson.dumps(value).replace(b"%", b"%%")


def value_template(*, schema_prefix: bytes, version: str, name: str, rs: str, db: str, collection: str) -> bytes:
    """One collection's change streams value with slots, in this order: ``before``, ``after``,
    ``updateDescription`` (JSON bytes), ``source.ts_ms/ts_us/ts_ns`` (:func:`times`), ``source.snapshot``
    (JSON bytes), ``source.ord`` (int), ``source.lsid/txnNumber/wallTime`` (JSON bytes), ``op``
    (JSON bytes), ``ts_ms/ts_us/ts_ns`` (int), ``transaction`` (JSON bytes).

    ``schema_prefix`` is the serialised ``{"schema":…,"payload":`` head (empty without schemas).
    """
    return (
        schema_prefix.replace(b"%", b"%%")
        + b'{"before":%b,"after":%b,"updateDescription":%b,"source":{"version":'
        + _constant(version)
        + b',"connector":'
        + _constant(CONNECTOR)
        + b',"name":'
        + _constant(name)
        + b',"ts_ms":%b,"snapshot":%b,"db":'
        + _constant(db)
        + b',"rs":'
        + _constant(rs)
        + b',"collection":'
        + _constant(collection)
        + b',"ord":%d,"h":null,"tord":null,"stxnid":null,"lsid":%b,"txnNumber":%b,"wallTime":%b},'
        + b'"op":%b,"ts_ms":%d,"ts_us":%d,"ts_ns":%d,"transaction":%b}'
        + (b"}" if schema_prefix else b"")
    )


def legacy_value_template(*, schema_prefix: bytes, version: str, name: str, rs: str, db: str, collection: str) -> bytes:
    """One collection's 1.x value with slots, in this order: ``after``, ``patch``, ``filter`` (JSON
    bytes, :func:`legacy_parts`), ``source.ts_ms`` (int), ``source.snapshot`` (JSON bytes),
    ``source.ord`` (int), ``source.stxnid``, ``op`` (JSON bytes), ``ts_ms`` (int), ``transaction``
    (JSON bytes). ``source`` is in the 1.x shape (``h``, an oplog hash change streams do not expose,
    is null)."""
    return (
        schema_prefix.replace(b"%", b"%%")
        + b'{"after":%b,"patch":%b,"filter":%b,"source":{"version":'
        + _constant(version)
        + b',"connector":'
        + _constant(CONNECTOR)
        + b',"name":'
        + _constant(name)
        + b',"ts_ms":%d,"snapshot":%b,"db":'
        + _constant(db)
        + b',"rs":'
        + _constant(rs)
        + b',"collection":'
        + _constant(collection)
        + b',"ord":%d,"h":null,"stxnid":%b},"op":%b,"ts_ms":%d,"transaction":%b}'
        + (b"}" if schema_prefix else b"")
    )


def times(ns: int) -> bytes:
    """The values of ``ts_ms``, ``ts_us`` and ``ts_ns`` for a nanosecond time, with the names between."""
    return b'%d,"ts_us":%d,"ts_ns":%d' % (ns // 1_000_000, ns // 1_000, ns)


def key_template(schema_prefix: bytes) -> bytes:
    """One collection's key with one slot: the JSON string of the ``id``."""
    return schema_prefix.replace(b"%", b"%%") + b'{"id":%b}' + (b"}" if schema_prefix else b"")


def document_string(doc: Mapping[str, Any] | None, fields: CollectionFields | None) -> bytes:
    """``before``/``after``: the (transformed) document's strict Extended JSON text as a JSON
    string, or ``null``."""
    if doc is None:
        return NULL
    if fields is not None:
        doc = fields.document(doc)
    return ejson.dumps_string(doc, DOCUMENT_STYLE)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def update_description(desc: Mapping[str, Any], fields: CollectionFields | None) -> bytes:
    """``updateDescription`` with ``updatedFields`` as JSON text; empty parts become null."""
    updated = desc.get("updatedFields") or {}
    removed = list(desc.get("removedFields") or ())
    truncated = list(desc.get("truncatedArrays") or ())
    for t in truncated:
        if not (isinstance(t, Mapping) and isinstance(t.get("field"), str) and _integer(t.get("newSize"))):
            raise ValueError(
                f"update change event has a 'truncatedArrays' entry without a string 'field' and an integer "
                f"'newSize': {short(t)}"
            )
    if fields is not None:
        updated = fields.updated_fields(updated)
        removed = fields.field_paths(removed)
        kept = []
        for t in truncated:
            paths = fields.field_paths([t["field"]])
            if paths:
                kept.append({"field": paths[0], "newSize": t["newSize"]})
        truncated = kept
    return (
        b'{"removedFields":'
        + (orjson.dumps(removed) if removed else NULL)
        + b',"updatedFields":'
        + (ejson.dumps_string(updated, DOCUMENT_STYLE) if updated else NULL)
        + b',"truncatedArrays":'
        + (orjson.dumps([{"field": t["field"], "size": int(t["newSize"])} for t in truncated]) if truncated else NULL)
        + b"}"
    )


def legacy_after(document: Mapping[str, Any]) -> bytes:
    """The 1.x ``after`` (of an insert or a read; field rules applied): its ``LEGACY_STYLE`` text as a
    JSON string."""
    return orjson.dumps(ejson.dumps(document, LEGACY_STYLE))


def legacy_parts(op: str, change: Mapping[str, Any], fields: CollectionFields | None) -> tuple[bytes, bytes, bytes]:
    """The 1.x ``after``, ``patch`` and ``filter`` of a change event, as JSON: inserts carry ``after``,
    updates ``patch`` + ``filter``, deletes ``filter`` (the others null).

    An update's patch is the ``$set``/``$unset`` document rebuilt from the update description; a
    replace's patch is the replacement document, as in the oplog.
    """
    if op == "c":
        document = change["fullDocument"]
        return legacy_after(fields.document(document) if fields else document), NULL, NULL
    filter_ = orjson.dumps(ejson.dumps(change["documentKey"], LEGACY_STYLE))
    if op != "u":
        return NULL, NULL, filter_
    desc = change.get("updateDescription")
    if desc is None:
        replacement = change.get("fullDocument") or {}
        patch_doc: Mapping[str, Any] = fields.document(replacement) if fields else replacement
    else:
        updated = desc.get("updatedFields") or {}
        removed = list(desc.get("removedFields") or ())
        if fields is not None:
            updated, removed = fields.updated_fields(updated), fields.field_paths(removed)
        patch_doc = {}
        if updated:
            patch_doc["$set"] = updated
        if removed:
            patch_doc["$unset"] = dict.fromkeys(removed, True)
    return NULL, orjson.dumps(ejson.dumps(patch_doc, COMPACT_STYLE)), filter_
