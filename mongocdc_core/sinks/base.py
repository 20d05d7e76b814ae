"""The contract between the engine and the places records go.

The engine records an offset only after ``flush`` returns for the records before it, so a sink
must not return from ``flush`` until everything written so far is durable (on disk, or
acknowledged by Kafka). That single rule is what makes a crash lose nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mongocdc_core.events.records import Record


class SinkError(RuntimeError):
    """Records could not be delivered; nothing after the last successful ``flush`` is durable."""


class Sink(Protocol):
    """Where the engine delivers records, in order."""

    def write(self, records: Sequence[Record]) -> None:
        """Accept records in delivery order (may buffer; may block for backpressure)."""

    def flush(self, timeout: float | None = None) -> None:
        """Block until every record written so far is durable; raise ``SinkError`` otherwise."""

    def close(self) -> None:
        """Flush and release resources. Idempotent."""
