"""Value payloads: the Debezium envelope (change streams format) and the 1.x oplog-era envelope.

Payload dicts list their fields in the order of the value schema, as JsonConverter writes them;
absent optional fields are present with ``null``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mongocdc_core.events import ejson
from mongocdc_core.events.ejson import COMPACT_STYLE, DOCUMENT_STYLE, LEGACY_STYLE
from mongocdc_core.events.transforms import CollectionFields

CONNECTOR = "mongodb"


def source_block(
    *,
    version: str,
    name: str,
    rs: str,
    db: str,
    collection: str,
    ts_ns: int,
    ord: int,
    snapshot: str,
    lsid: str | None,
    txn_number: int | None,
    wall_time: int | None,
) -> dict[str, Any]:
    """``source`` of the change streams format; ``ts_*`` say when the change happened in MongoDB."""
    return {
        "version": version,
        "connector": CONNECTOR,
        "name": name,
        "ts_ms": ts_ns // 1_000_000,
        "ts_us": ts_ns // 1_000,
        "ts_ns": ts_ns,
        "snapshot": snapshot,
        "db": db,
        "rs": rs,
        "collection": collection,
        "ord": ord,
        "h": None,
        "tord": None,
        "stxnid": None,
        "lsid": lsid,
        "txnNumber": txn_number,
        "wallTime": wall_time,
    }


def document_json(doc: Mapping[str, Any] | None, fields: CollectionFields | None) -> str | None:
    """``before``/``after``: the (transformed) document as strict Extended JSON text."""
    if doc is None:
        return None
    if fields is not None:
        doc = fields.document(doc)
    return ejson.dumps(doc, DOCUMENT_STYLE)


def update_description(desc: Mapping[str, Any], fields: CollectionFields | None) -> dict[str, Any]:
    """``updateDescription`` with ``updatedFields`` as JSON text; empty parts become null."""
    updated = desc.get("updatedFields") or {}
    removed = list(desc.get("removedFields") or ())
    truncated = list(desc.get("truncatedArrays") or ())
    if fields is not None:
        updated = fields.updated_fields(updated)
        removed = fields.field_paths(removed)
        kept = []
        for t in truncated:
            paths = fields.field_paths([t["field"]])
            if paths:
                kept.append({"field": paths[0], "newSize": t["newSize"]})
        truncated = kept
    return {
        "removedFields": removed or None,
        "updatedFields": ejson.dumps(updated, DOCUMENT_STYLE) if updated else None,
        "truncatedArrays": [{"field": t["field"], "size": int(t["newSize"])} for t in truncated] or None,
    }


def change_streams_payload(
    *,
    op: str,
    before: str | None,
    after: str | None,
    update_desc: dict[str, Any] | None,
    source: dict[str, Any],
    now_ns: int,
    transaction: dict[str, Any] | None,
) -> dict[str, Any]:
    """The Debezium 2.x envelope."""
    return {
        "before": before,
        "after": after,
        "updateDescription": update_desc,
        "source": source,
        "op": op,
        "ts_ms": now_ns // 1_000_000,
        "ts_us": now_ns // 1_000,
        "ts_ns": now_ns,
        "transaction": transaction,
    }


def legacy_payload(
    *,
    op: str,
    change: Mapping[str, Any] | None,
    document: Mapping[str, Any] | None,
    fields: CollectionFields | None,
    source: dict[str, Any],
    now_ns: int,
    transaction: dict[str, Any] | None,
) -> dict[str, Any]:
    """The 1.x envelope: inserts/reads carry ``after``, updates ``patch`` + ``filter``, deletes ``filter``.

    ``document`` is the inserted/read document; ``change`` the raw change event for updates,
    replaces and deletes. An update's patch is the ``$set``/``$unset`` document rebuilt from the
    update description; a replace's patch is the replacement document, as in the oplog.
    """
    after = patch = filter_ = None
    if op in ("c", "r"):
        assert document is not None
        after = ejson.dumps(fields.document(document) if fields else document, LEGACY_STYLE)
    else:
        assert change is not None
        filter_ = ejson.dumps(change["documentKey"], LEGACY_STYLE)
        if op == "u":
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
            patch = ejson.dumps(patch_doc, COMPACT_STYLE)
    return {
        "after": after,
        "patch": patch,
        "filter": filter_,
        "source": source,
        "op": op,
        "ts_ms": now_ns // 1_000_000,
        "transaction": transaction,
    }


def legacy_source_block(
    *,
    version: str,
    name: str,
    rs: str,
    db: str,
    collection: str,
    ts_ms: int,
    ord: int,
    snapshot: bool,
    stxnid: str | None,
) -> dict[str, Any]:
    """``source`` in the 1.x shape (``h`` is an oplog hash that change streams do not expose)."""
    return {
        "version": version,
        "connector": CONNECTOR,
        "name": name,
        "ts_ms": ts_ms,
        "snapshot": snapshot,
        "db": db,
        "rs": rs,
        "collection": collection,
        "ord": ord,
        "h": None,
        "stxnid": stxnid,
    }
