"""Reading delivered records back as keys: what ``KeyReader`` sinks share.

A sink hands every record it finds (key and value as parsed JSON, and whether it lies at or after
the mark) to :class:`KeyScanBuilder`; the builder keeps only the last verdict per key.
"""

from __future__ import annotations

from typing import Any

from mongocdc_core.sinks.base import KeyScan


def _payload(value: Any) -> Any:
    """A JsonConverter message's payload, with or without its ``schema`` part."""
    if isinstance(value, dict) and value.keys() == {"schema", "payload"}:
        return value["payload"]
    return value


def key_id(key: Any) -> str | None:
    """The ``id`` of a Debezium MongoDB key (None for heartbeat, transaction or notification keys)."""
    payload = _payload(key)
    if isinstance(payload, dict) and len(payload) == 1:
        value = payload.get("id")
        return value if isinstance(value, str) else None
    return None


def is_delete(value: Any) -> bool:
    """A tombstone (no value) or a delete event."""
    payload = _payload(value)
    return payload is None or (isinstance(payload, dict) and payload.get("op") == "d")


class KeyScanBuilder:
    """Collects records in delivery order into a :class:`KeyScan`."""

    def __init__(self) -> None:
        self._live: dict[str, bool] = {}
        self._touched: set[str] = set()

    def add(self, key: Any, value: Any, after_mark: bool) -> None:
        kid = key_id(key)
        if kid is None:
            return
        if after_mark:
            self._touched.add(kid)
        else:
            self._live[kid] = not is_delete(value)

    def add_deleted(self, kid: str | None, deleted: bool, after_mark: bool) -> None:
        """The same for a sink that stores the key's ``id`` and the delete verdict itself."""
        if kid is None:
            return
        if after_mark:
            self._touched.add(kid)
        else:
            self._live[kid] = not deleted

    def build(self) -> KeyScan:
        return KeyScan({k for k, live in self._live.items() if live}, self._touched)
