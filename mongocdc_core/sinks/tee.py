"""Deliver the same records to several sinks (for example jsonl for people, Parquet for Spark)."""

from __future__ import annotations

from collections.abc import Sequence

from mongocdc_core.events.records import Record
from mongocdc_core.sinks.base import Sink, takes_landing_columns


class TeeSink:
    """Writes every record to each sink; durable only when every sink is (``flush`` flushes all)."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        if not sinks:
            raise ValueError("a tee sink needs at least one sink")
        self.sinks = list(sinks)

    @property
    def landing_columns(self) -> bool:
        """Whether one of the sinks builds landing columns (see :func:`takes_landing_columns`)."""
        return any(takes_landing_columns(sink) for sink in self.sinks)

    def write(self, records: Sequence[Record]) -> None:
        for sink in self.sinks:
            sink.write(records)

    def flush(self, timeout: float | None = None) -> None:
        for sink in self.sinks:
            sink.flush(timeout)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
