"""Validation of raw change stream documents, shared by every event format.

A change stream document that becomes a data event must name its namespace and document key and
carry what its operation type needs (``fullDocument`` for inserts and replaces,
``updateDescription`` for updates). :func:`data_change` checks that once and hands the parts over,
so every format converts the same events and rejects the same malformed ones with the same message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Change stream operation types that become data events, and their Debezium ``op``.
DATA_OPERATIONS = {"insert": "c", "update": "u", "replace": "u", "delete": "d"}


def short(doc: Any) -> str:
    """A document shortened for an error message."""
    text = repr(doc)
    return text if len(text) <= 300 else text[:300] + "..."


@dataclass(frozen=True, slots=True)
class DataChange:
    """The validated parts of one data change event."""

    op_type: str
    op: str
    db: str
    coll: str
    document_id: Any
    full_document: Mapping[str, Any] | None
    update_description: Mapping[str, Any] | None


def data_change(change: Mapping[str, Any], skipped: frozenset[str]) -> DataChange | None:
    """The parts of a data change, or None for other operation types (drop, rename, invalidate,
    ...) and for ``skipped.operations``; ValueError names what is missing from a malformed one."""
    op_type = change.get("operationType")
    if not isinstance(op_type, str):
        raise ValueError(f"change event has no string 'operationType': {short(change)}")
    op = DATA_OPERATIONS.get(op_type)
    if op is None or op in skipped:
        return None
    ns = change.get("ns")
    if not isinstance(ns, Mapping) or not isinstance(ns.get("db"), str) or not isinstance(ns.get("coll"), str):
        raise ValueError(f"{op_type} change event has no 'ns.db'/'ns.coll': {short(change)}")
    document_key = change.get("documentKey")
    if not isinstance(document_key, Mapping) or "_id" not in document_key:
        raise ValueError(f"{op_type} change event has no 'documentKey._id': {short(change)}")
    full = change.get("fullDocument")
    if op_type in ("insert", "replace") and not isinstance(full, Mapping):
        raise ValueError(f"{op_type} change event has no 'fullDocument' document: {short(change)}")
    desc = change.get("updateDescription")
    if op_type == "update" and not isinstance(desc, Mapping):
        raise ValueError(f"update change event has no 'updateDescription' document: {short(change)}")
    return DataChange(
        op_type=op_type,
        op=op,
        db=ns["db"],
        coll=ns["coll"],
        document_id=document_key["_id"],
        full_document=full if isinstance(full, Mapping) else None,
        update_description=desc if isinstance(desc, Mapping) else None,
    )
