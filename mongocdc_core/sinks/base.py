"""The contract between the engine and the places records go.

The engine records an offset only after ``flush`` returns for the records before it, so a sink
must not return from ``flush`` until everything written so far is durable (on disk, or
acknowledged by Kafka). That single rule is what makes a crash lose nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position


class SinkError(RuntimeError):
    """Records could not be delivered; nothing after the last successful ``flush`` is durable."""


class RecordRejected(SinkError):
    """The sink refused one record for what it is (e.g. larger than the topic accepts), not because the
    destination is unavailable: writing it again cannot succeed, so the connector's
    ``event.processing.failure.handling.mode`` decides what happens to it.

    Raised by ``write``: the first ``accepted`` records of the batch were taken, ``record`` was not,
    and neither were the ones after it. The sink stays usable.
    """

    def __init__(self, message: str, record: Record, accepted: int) -> None:
        super().__init__(message)
        self.record = record
        self.accepted = accepted


def takes_landing_columns(sink: object) -> bool:
    """Whether ``sink`` builds landing columns from the records (the Parquet landing, alone or in a tee):
    its converter then writes the columns it can with the records (``EventConverter(landing=True)``)."""
    return getattr(sink, "landing_columns", False) is True


class Sink(Protocol):
    """Where the engine delivers records, in order."""

    def write(self, records: Sequence[Record]) -> None:
        """Accept records in delivery order (may buffer; may block for backpressure); ``RecordRejected``
        for a record the destination can never take."""

    def flush(self, timeout: float | None = None) -> None:
        """Block until every record written so far is durable; raise ``SinkError`` otherwise."""

    def close(self) -> None:
        """Flush and release resources. Idempotent."""


@dataclass
class KeyScan:
    """The document keys a sink holds for one topic, split at a mark taken before a snapshot began.

    ``present``: keys whose last record before the mark is neither a delete nor a tombstone;
    ``touched``: keys with any record at or after the mark (the snapshot's reads, events streamed
    since). Keys are the ``id`` of the Debezium key (the ``_id`` as the key spells it).
    """

    present: set[str] = field(default_factory=set)
    touched: set[str] = field(default_factory=set)

    def missing(self) -> list[str]:
        """Keys downstream still holds that nothing since the mark confirmed: gone from the source."""
        return sorted(self.present - self.touched)


@runtime_checkable
class KeyReader(Protocol):
    """A sink that can read back the keys it delivered (``mongocdc.snapshot.delete.missing.keys``)."""

    def key_mark(self, topic: str) -> Any:
        """A JSON-able point in what was delivered to ``topic`` so far (taken after a flush)."""

    def scan_keys(self, topic: str, mark: Any, since: Position) -> KeyScan | None:
        """The keys of ``topic`` split at ``mark`` (sinks that record positions may split at ``since``);
        None when this sink cannot tell what downstream holds."""
