"""The unit every sink, offset store and landing zone handles: one serialized Kafka record."""

from __future__ import annotations

from dataclasses import dataclass

from mongocdc_core.positions import Position


@dataclass(slots=True)
class Record:
    """A serialized change, tombstone, transaction or heartbeat record; treat it as immutable.

    Not a frozen dataclass only because a frozen one costs four times as much to create, once
    per event on the hot path; nothing may change a record after it was made (sinks share them).

    ``value`` None is a tombstone. ``collection`` is ``"<db>.<coll>"`` for data records and None for
    heartbeat/transaction records; ``op`` is ``c``/``u``/``d``/``r`` for data events (None for
    tombstones and metadata records).
    """

    topic: str
    key: bytes | None
    value: bytes | None
    position: Position
    collection: str | None
    op: str | None
