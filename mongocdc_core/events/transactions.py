"""Transaction metadata (``provide.transaction.metadata``): BEGIN/END records and envelope blocks.

Change streams deliver the operations of one multi-document transaction contiguously, each with
the session ``lsid`` and ``txnNumber``. The tracker sees the converted events in stream order,
opens a transaction at its first event (BEGIN), numbers the events (``total_order``,
``data_collection_order``) and closes it (END, with per-collection counts) when an event from
outside the transaction arrives or when the caller flushes (heartbeat, end of a slice).
How a format writes those records (their schemas, the order of ``data_collections``, the time of
an END that an event ends) is its :class:`TransactionFormat`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bson.binary import Binary
from bson.timestamp import Timestamp

from mongocdc_core.events import ejson
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.records import Record
from mongocdc_core.events.schema import Serializer, transaction_key_schema, transaction_value_schema
from mongocdc_core.positions import Position

#: A change event's ``lsid``: its session's document as decoded (``{"id": <UUID>, "uid": <hash>}``).
Session = Mapping[str, object]


def transaction_id(lsid: Session | None, txn_number: int | None) -> str | None:
    """``<lsid id as UUID>:<txnNumber>`` as Debezium forms it, or None outside a transaction. ``lsid`` is
    checked: a decoded event's is whatever the event holds."""
    if lsid is None or txn_number is None:
        return None
    if not isinstance(lsid, Mapping) or "id" not in lsid:
        raise ValueError(f"change event 'lsid' must be a document with an 'id', got {lsid!r}")
    session = lsid["id"]
    if isinstance(session, Binary) and session.subtype in (3, 4) and len(session) == 16:
        session_text = str(uuid.UUID(bytes=bytes(session)))
    elif isinstance(session, uuid.UUID):
        session_text = str(session)
    else:
        session_text = ejson.dumps(session)
    return f"{session_text}:{int(txn_number)}"


@dataclass(frozen=True, slots=True)
class TransactionFormat:
    """What differs between the formats' transaction records."""

    key_schema: dict[str, Any]
    value_schema: dict[str, Any]
    #: The END record's ``data_collections`` in order, from the names in the order the events came.
    order: Callable[[Iterable[str]], list[str]] = list
    #: An END that the next event ends has that event's time (Debezium 3.x), else its last event's.
    end_at_next: bool = False


#: mongocdc's default and 1.x formats.
DEFAULT_FORMAT = TransactionFormat(transaction_key_schema(), transaction_value_schema())


@dataclass(slots=True)
class _OpenTransaction:
    id: str
    last_position: Position
    last_ts_ms: int
    event_count: int = 0
    per_collection: dict[str, int] = field(default_factory=dict)


class TransactionTracker:
    """Stateful BEGIN/END emitter; feed it every emitted data event in stream order."""

    def __init__(self, options: EventOptions, format_: TransactionFormat = DEFAULT_FORMAT) -> None:
        self.topic = options.topics().transaction_topic()
        self._serializer = Serializer(options.schemas_enable)
        self._key_prefix = Serializer.schema_prefix(format_.key_schema)
        self._value_prefix = Serializer.schema_prefix(format_.value_schema)
        self._order = format_.order
        self._end_at_next = format_.end_at_next
        self._open: _OpenTransaction | None = None

    @property
    def open_transaction_id(self) -> str | None:
        return self._open.id if self._open is not None else None

    def observe(
        self, txn_id: str | None, data_collection: str, position: Position, ts_ms: int
    ) -> tuple[list[Record], dict[str, Any] | None]:
        """Boundary records to emit before this event, and the event's ``transaction`` block."""
        records: list[Record] = []
        if self._open is not None and self._open.id != txn_id:
            records.append(self._end(ts_ms if self._end_at_next else self._open.last_ts_ms))
        if txn_id is None:
            return records, None
        if self._open is None:
            self._open = _OpenTransaction(txn_id, position, ts_ms)
            records.append(self._record(txn_id, "BEGIN", None, None, ts_ms, position))
        txn = self._open
        txn.event_count += 1
        txn.last_position = position
        txn.last_ts_ms = ts_ms
        order = txn.per_collection.get(data_collection, 0) + 1
        txn.per_collection[data_collection] = order
        return records, {"id": txn_id, "total_order": txn.event_count, "data_collection_order": order}

    def flush(self) -> list[Record]:
        """END of the open transaction, if any (call before heartbeats and at the end of a slice), at
        its last event's time."""
        return [self._end(self._open.last_ts_ms)] if self._open is not None else []

    def end_before(self, cluster_time: Timestamp) -> list[Record]:
        """END of the open transaction when ``cluster_time`` is past its events (none can follow)."""
        txn = self._open
        if txn is None or txn.last_position.timestamp >= cluster_time:
            return []
        return self.flush()

    def _end(self, ts_ms: int) -> Record:
        txn = self._open
        assert txn is not None
        self._open = None
        per_collection = txn.per_collection
        collections = [{"data_collection": c, "event_count": per_collection[c]} for c in self._order(per_collection)]
        return self._record(txn.id, "END", txn.event_count, collections, ts_ms, txn.last_position)

    def _record(
        self,
        txn_id: str,
        status: str,
        event_count: int | None,
        collections: list[dict[str, Any]] | None,
        ts_ms: int,
        position: Position,
    ) -> Record:
        payload = {
            "status": status,
            "id": txn_id,
            "event_count": event_count,
            "data_collections": collections,
            "ts_ms": ts_ms,
        }
        key = self._serializer.dumps(self._key_prefix, {"id": txn_id})
        value = self._serializer.dumps(self._value_prefix, payload)
        return Record(self.topic, key, value, position, None, None)
