"""One change stream, many landing files: records routed to the file of their collection and window.

A slice run over several windows and collections reads the change stream once, from its earliest
window to its last, and each (collection, window) still gets exactly one file whose content is what
a run of that window alone would write: the events of the window from its read start on.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position
from mongocdc_core.sinks.parquet import ParquetSink


@dataclass
class RouteTarget:
    """One (collection, window) file: records at or after ``low`` go in (``low`` is the window start,
    or the snapshot position for a window whose start left the oplog)."""

    path: Path
    low: Position
    sink: ParquetSink = field(init=False)
    counts: dict[str, int] = field(default_factory=dict)
    events: int = 0
    first: Position | None = None
    last: Position | None = None

    def __post_init__(self) -> None:
        self.sink = ParquetSink.to_file(self.path)


class WindowRouter:
    """A sink: ``targets[(namespace, window index)]``; ``window_starts`` are sorted and contiguous."""

    #: Every target is a Parquet landing file (``mongocdc_core.sinks.base.takes_landing_columns``).
    landing_columns = True

    def __init__(self, window_starts: Sequence[Position], targets: Mapping[tuple[str, int], RouteTarget]) -> None:
        self.window_starts = list(window_starts)
        self.targets = dict(targets)

    def write(self, records: Sequence[Record]) -> None:
        batches: dict[tuple[str, int], list[Record]] = {}
        for record in records:
            if record.collection is None:
                continue  # transaction and heartbeat records belong to no collection's file
            index = bisect_right(self.window_starts, record.position) - 1
            key = (record.collection, index)
            target = self.targets.get(key)
            if target is None or record.position < target.low:
                continue
            batches.setdefault(key, []).append(record)
            if record.op is not None:
                target.events += 1
                target.counts[record.op] = target.counts.get(record.op, 0) + 1
                if target.first is None:
                    target.first = record.position
                target.last = record.position
        for key, batch in batches.items():
            self.targets[key].sink.write(batch)

    def flush(self, timeout: float | None = None) -> None:
        for target in self.targets.values():
            target.sink.flush(timeout)

    def close(self) -> None:
        """Every file moved into place (an empty window gets an empty file, not a stale one)."""
        for target in self.targets.values():
            target.sink.close()

    def abort(self) -> None:
        """A failed run replaces no file."""
        for target in self.targets.values():
            target.sink.abort()
