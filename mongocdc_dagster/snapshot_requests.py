"""The snapshot requests the Dagster sensor acts on, read with the engine's own signal parser.

The sensor must accept and refuse exactly what the connector does, so nothing here parses a signal:
:func:`parse_signal` hands the document to ``mongocdc_core.source.signals`` and keeps what a sensor
needs (which collections, which snapshot type, which filter per collection).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from bson import ObjectId, json_util

from mongocdc_core.source.signals import (
    SNAPSHOT_BLOCKING,
    SignalError,
    collection_pattern,
    literal_namespace,
    parse_execute_snapshot,
    parse_signal_document,
    parse_stop_snapshot,
)

EXECUTE: Final = "execute-snapshot"
STOP: Final = "stop-snapshot"

SnapshotType = Literal["incremental", "blocking"]

__all__ = ["EXECUTE", "STOP", "SignalError", "SnapshotSignal", "SnapshotType", "parse_signal", "signal_id_of"]


@dataclass(frozen=True)
class SnapshotSignal:
    """An execute-snapshot or stop-snapshot request."""

    signal_id: str
    action: Literal["execute-snapshot", "stop-snapshot"]
    snapshot_type: SnapshotType
    patterns: tuple[re.Pattern[str], ...] | None  # None: every collection (stop-snapshot only)
    conditions: tuple[tuple[str, str], ...] = ()  # (data-collection entry, filter as extended JSON)
    entries: tuple[str, ...] = ()  # the data-collections entries as sent

    def unmatched_names(self, namespaces: Iterable[str]) -> list[str]:
        """Entries that name one collection (not a pattern) matching none of ``namespaces``: collections
        that do not exist yet, or that the connector does not capture."""
        names = list(namespaces)
        return [name for entry in self.entries if (name := literal_namespace(entry)) is not None
                and not any(collection_pattern(entry).fullmatch(ns) for ns in names)]

    def matches(self, namespace: str) -> bool:
        return self.patterns is None or any(p.fullmatch(namespace) for p in self.patterns)

    def matching(self, namespaces: Iterable[str]) -> list[str]:
        return sorted(ns for ns in namespaces if self.matches(ns))

    def condition_for(self, namespace: str) -> str | None:
        """The ``additional-conditions`` filter (extended JSON) for one matched collection; the last
        condition whose entry matches wins, as in the engine."""
        found = [query for entry, query in self.conditions if collection_pattern(entry).fullmatch(namespace)]
        return found[-1] if found else None


def signal_id_of(doc: Mapping[str, Any]) -> str:
    """The signal's `_id` as the user wrote it: a string as is (as the engine names it), ObjectId hex, an
    integer as is, any other value as Extended JSON. Run tags carry it whole (tag values of runs are free
    text), so a run is found again by the id the user inserted."""
    value = doc.get("_id")
    if isinstance(value, ObjectId):
        return str(value)
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return json_util.dumps(value)


def parse_signal(doc: Mapping[str, Any]) -> SnapshotSignal | None:
    """The snapshot request in `doc`, None for other signal types (log, pause, ...), SignalError if malformed."""
    signal = parse_signal_document({**doc, "id": signal_id_of(doc)})
    kind = signal.type.lower()
    if kind == EXECUTE:
        request = parse_execute_snapshot(signal)
        return SnapshotSignal(
            signal_id=signal.id,
            action=EXECUTE,
            snapshot_type="blocking" if request.snapshot_type == SNAPSHOT_BLOCKING else "incremental",
            patterns=tuple(collection_pattern(entry) for entry in request.collections),
            conditions=tuple((entry, json_util.dumps(query)) for entry, query in request.conditions),
            entries=tuple(request.collections),
        )
    if kind == STOP:
        stop = parse_stop_snapshot(signal)
        return SnapshotSignal(
            signal_id=signal.id,
            action=STOP,
            snapshot_type="blocking" if stop.snapshot_type == SNAPSHOT_BLOCKING else "incremental",
            patterns=None if stop.collections is None else tuple(collection_pattern(e) for e in stop.collections),
        )
    return None
