"""Parsing Debezium signal documents from the signaling collection (no Dagster, no I/O).

A signal is `{"_id": ..., "type": "execute-snapshot" | "stop-snapshot", "data": {...}}`; `data` may be
an object or a JSON string. `data-collections` lists regular expressions matched against whole
`<db>.<collection>` names; a quoted name like `"db"."my.coll"` means exactly that collection.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson
from bson import ObjectId, json_util

EXECUTE: Final = "execute-snapshot"
STOP: Final = "stop-snapshot"
SNAPSHOT_TYPES = ("incremental", "blocking")
_QUOTED = re.compile(r'^"([^"]+)"\."([^"]+)"$')

SnapshotType = Literal["incremental", "blocking"]


class SignalError(ValueError):
    """A signal document is malformed; the message names the signal and the field."""


@dataclass(frozen=True)
class SnapshotSignal:
    """An execute-snapshot or stop-snapshot request."""

    signal_id: str
    action: Literal["execute-snapshot", "stop-snapshot"]
    snapshot_type: SnapshotType | None  # None only for stop-snapshot without a type: every type
    patterns: tuple[re.Pattern[str], ...] | None  # None: every collection (stop-snapshot only)
    conditions: Mapping[str, str] = field(default_factory=dict)  # collection -> filter (extended JSON)

    def matches(self, namespace: str) -> bool:
        return self.patterns is None or any(p.fullmatch(namespace) for p in self.patterns)

    def matching(self, namespaces: Iterable[str]) -> list[str]:
        return sorted(ns for ns in namespaces if self.matches(ns))


def signal_id_of(doc: Mapping[str, Any]) -> str:
    """The signal's `_id` as text: ObjectId hex, or the string / number itself."""
    value = doc.get("_id")
    if isinstance(value, ObjectId):
        return str(value)
    if isinstance(value, str | int):
        return str(value)
    return json_util.dumps(value)


def _unquote(name: str) -> str:
    match = _QUOTED.match(name)
    return f"{match.group(1)}.{match.group(2)}" if match else name


def _pattern(signal_id: str, text: Any) -> re.Pattern[str]:
    if not isinstance(text, str) or not text:
        raise SignalError(f"signal {signal_id}: data-collections entries must be non-empty strings, got {text!r}")
    match = _QUOTED.match(text)
    if match:
        return re.compile(re.escape(f"{match.group(1)}.{match.group(2)}"))
    try:
        return re.compile(text)
    except re.error as exc:
        raise SignalError(f"signal {signal_id}: data-collections entry {text!r} is not a regular expression: {exc}") from None


def _data(signal_id: str, raw: Any) -> dict[str, Any]:
    if isinstance(raw, str | bytes):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise SignalError(f"signal {signal_id}: 'data' is a string but not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise SignalError(f"signal {signal_id}: 'data' must be an object, got {type(raw).__name__}")
    return raw


def _conditions(signal_id: str, raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise SignalError(f"signal {signal_id}: additional-conditions must be a list")
    conditions: dict[str, str] = {}
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("data-collection"), str):
            raise SignalError(f"signal {signal_id}: each additional-conditions entry needs a 'data-collection' string")
        text = item.get("filter")
        if isinstance(text, dict):
            text = json_util.dumps(text)
        if not isinstance(text, str):
            raise SignalError(f"signal {signal_id}: additional-conditions filter for {item['data-collection']} must be a string")
        try:
            parsed = json_util.loads(text)
        except (ValueError, TypeError) as exc:
            raise SignalError(
                f"signal {signal_id}: filter {text!r} for {item['data-collection']} is not a MongoDB query in JSON: {exc}"
            ) from None
        if not isinstance(parsed, dict):
            raise SignalError(f"signal {signal_id}: filter for {item['data-collection']} must be a JSON object")
        conditions[_unquote(item["data-collection"])] = text
    return conditions


def parse_signal(doc: Mapping[str, Any]) -> SnapshotSignal | None:
    """The snapshot request in `doc`, None for other signal types (log, pause, ...), SignalError if malformed."""
    signal_id = signal_id_of(doc)
    kind = doc.get("type")
    if not isinstance(kind, str):
        raise SignalError(f"signal {signal_id}: 'type' must be a string, got {kind!r}")
    if kind not in (EXECUTE, STOP):
        return None
    data = _data(signal_id, doc.get("data"))
    raw_type = data.get("type")
    snapshot_type: SnapshotType | None
    if raw_type is None:
        if kind == STOP:
            raise SignalError(f"signal {signal_id}: stop-snapshot needs data.type (incremental or blocking)")
        snapshot_type = "incremental"
    elif isinstance(raw_type, str) and raw_type.lower() in SNAPSHOT_TYPES:
        snapshot_type = "incremental" if raw_type.lower() == "incremental" else "blocking"
    else:
        raise SignalError(f"signal {signal_id}: data.type {raw_type!r} is not incremental or blocking")
    collections = data.get("data-collections")
    patterns: tuple[re.Pattern[str], ...] | None
    if collections is None:
        if kind == EXECUTE:
            raise SignalError(f"signal {signal_id}: execute-snapshot needs data.data-collections")
        patterns = None
    elif isinstance(collections, list):
        patterns = tuple(_pattern(signal_id, item) for item in collections)
    else:
        raise SignalError(f"signal {signal_id}: data-collections must be a list of names or regular expressions")
    return SnapshotSignal(
        signal_id=signal_id,
        action=EXECUTE if kind == EXECUTE else STOP,
        snapshot_type=snapshot_type,
        patterns=patterns,
        conditions=_conditions(signal_id, data.get("additional-conditions")) if kind == EXECUTE else {},
    )
