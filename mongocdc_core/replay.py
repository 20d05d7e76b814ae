"""Rebuild documents from change event records: the proof that the records are complete.

Applying every record of a collection in order (reads and creates set the document, updates set
their full ``after`` or apply their update description, deletes remove it) must give exactly the
documents in the source. The demo and the tests use this to check captures end to end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from bson import json_util

from mongocdc_core.events import ejson


class ReplayError(ValueError):
    """A record cannot be applied (for example an update of a document never seen)."""


def _ejson(text: str) -> Any:
    return ejson.loads(text)


def _payload(message: Any) -> Any:
    """The payload of a JsonConverter message, with or without its ``schema`` part."""
    if isinstance(message, (bytes, str)):
        message = orjson.loads(message)
    if isinstance(message, dict) and message.keys() == {"schema", "payload"}:
        return message["payload"]
    return message


def document_id(key: Any) -> Any:
    """The ``_id`` a record key stands for (``{"id": "<_id in extended JSON>"}``)."""
    payload = _payload(key)
    if not isinstance(payload, dict) or not isinstance(payload.get("id"), str):
        raise ReplayError(f"record key has no 'id' string: {key!r}")
    return _ejson(payload["id"])


def _id_key(value: Any) -> str:
    """A hashable identity for any BSON ``_id`` value."""
    return json_util.dumps({"_id": value}, json_options=json_util.CANONICAL_JSON_OPTIONS)


def _walk(document: Any, parts: list[str], create: bool) -> tuple[Any, str] | None:
    """The container holding the last path component, creating sub-documents when asked."""
    node = document
    for index, part in enumerate(parts[:-1]):
        if isinstance(node, list) and part.isdigit():
            position = int(part)
            if position >= len(node):
                if not create:
                    return None
                node.extend([None] * (position + 1 - len(node)))
            if node[position] is None and create:
                node[position] = [] if parts[index + 1].isdigit() else {}
            node = node[position]
        elif isinstance(node, dict):
            if part not in node:
                if not create:
                    return None
                node[part] = {}
            node = node[part]
        else:
            return None
    return node, parts[-1]


def _set_path(document: dict[str, Any], path: str, value: Any) -> None:
    found = _walk(document, path.split("."), create=True)
    if found is None:
        raise ReplayError(f"cannot set {path!r}: a parent is neither a document nor an array")
    container, last = found
    if isinstance(container, list) and last.isdigit():
        position = int(last)
        if position >= len(container):
            container.extend([None] * (position + 1 - len(container)))
        container[position] = value
    elif isinstance(container, dict):
        container[last] = value
    else:
        raise ReplayError(f"cannot set {path!r}: its parent is neither a document nor an array")


def _remove_path(document: dict[str, Any], path: str) -> None:
    found = _walk(document, path.split("."), create=False)
    if found is None:
        return
    container, last = found
    if isinstance(container, dict):
        container.pop(last, None)
    elif isinstance(container, list) and last.isdigit() and int(last) < len(container):
        container[int(last)] = None  # $unset of an array element leaves null, as MongoDB does


def apply_update_description(document: dict[str, Any], description: Mapping[str, Any]) -> None:
    """Apply a change event's ``updateDescription`` in place: truncations, removals, then updates."""
    for truncated in description.get("truncatedArrays") or ():
        found = _walk(document, f"{truncated['field']}.0".split("."), create=False)
        if found is not None and isinstance(found[0], list):
            del found[0][int(truncated["newSize"]) :]
    for path in description.get("removedFields") or ():
        _remove_path(document, path)
    updated = description.get("updatedFields")
    fields = _ejson(updated) if isinstance(updated, str) else (updated or {})
    for path, value in fields.items():
        _set_path(document, path, value)


class Replayer:
    """Current documents per collection, built by applying records in delivery order."""

    def __init__(self) -> None:
        self.collections: dict[str, dict[str, dict[str, Any]]] = {}

    def apply(self, key: Any, value: Any) -> None:
        """Apply one record (``value`` None is a tombstone and changes nothing)."""
        payload = _payload(value) if value is not None else None
        if payload is None or "op" not in payload:
            return
        source = payload.get("source") or {}
        namespace = f"{source.get('db')}.{source.get('collection')}"
        documents = self.collections.setdefault(namespace, {})
        identity = _id_key(document_id(key))
        op = payload["op"]
        if op in ("r", "c") or (op == "u" and payload.get("after") is not None):
            documents[identity] = _ejson(payload["after"])
        elif op == "u":
            if identity not in documents:
                raise ReplayError(f"update of a document never seen in {namespace}: {key!r}")
            apply_update_description(documents[identity], payload.get("updateDescription") or {})
        elif op == "d":
            documents.pop(identity, None)
        else:
            raise ReplayError(f"unknown op {op!r} in {namespace}")

    def apply_all(self, records: Iterable[tuple[Any, Any]]) -> Replayer:
        for key, value in records:
            self.apply(key, value)
        return self

    def documents(self, namespace: str) -> list[dict[str, Any]]:
        return list(self.collections.get(namespace, {}).values())


def canonical(documents: Iterable[Mapping[str, Any]]) -> list[str]:
    """Order- and field-order-independent canonical text of documents, for equality checks."""
    return sorted(
        json_util.dumps(doc, json_options=json_util.CANONICAL_JSON_OPTIONS, sort_keys=True) for doc in documents
    )


def differences(expected: Iterable[Mapping[str, Any]], actual: Iterable[Mapping[str, Any]], limit: int = 5) -> list[str]:
    """Human-readable lines for documents present on one side only (empty when equal)."""
    left, right = canonical(expected), canonical(actual)
    only_expected = sorted(set(left) - set(right))[:limit]
    only_actual = sorted(set(right) - set(left))[:limit]
    lines = [f"missing or different in replay: {text}" for text in only_expected]
    lines += [f"unexpected in replay: {text}" for text in only_actual]
    if not lines and len(left) != len(right):
        lines.append(f"document counts differ: source {len(left)}, replay {len(right)}")
    return lines
