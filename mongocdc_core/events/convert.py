"""Raw MongoDB change stream documents and snapshot reads to serialized Debezium records.

:class:`EventConverter` is the one entry point of the event layer: pure (no I/O), stateful only
for transaction metadata, and fast because everything that depends only on the collection (topic,
schema bytes, field rules) is computed once per collection and cached.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson.datetime_ms import DatetimeMS
from bson.timestamp import Timestamp

from mongocdc_core.events import ejson
from mongocdc_core.events.debezium3 import Debezium3Events
from mongocdc_core.events.envelope import (
    change_streams_payload,
    document_json,
    legacy_payload,
    legacy_source_block,
    source_block,
    update_description,
)
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.records import Record
from mongocdc_core.events.schema import (
    Serializer,
    adjust_schema_name,
    envelope_schema,
    envelope_schema_1x,
    heartbeat_key_schema,
    heartbeat_value_schema,
    key_schema,
)
from mongocdc_core.events.transactions import TransactionTracker, transaction_id
from mongocdc_core.events.transforms import CollectionFields, FieldTransforms
from mongocdc_core.positions import Position

#: Change stream operation types that become data events, and their Debezium ``op``.
DATA_OPERATIONS = {"insert": "c", "update": "u", "replace": "u", "delete": "d"}
#: ``source.snapshot`` values of snapshot reads.
READ_SNAPSHOT_MARKERS = frozenset(
    {"true", "first", "first_in_data_collection", "last_in_data_collection", "last", "incremental"}
)
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _datetime_ns(value: datetime.datetime) -> int:
    """Nanoseconds since the epoch (naive datetimes are UTC, as bson.decode returns them)."""
    delta = value - (_EPOCH_UTC if value.tzinfo is not None else _EPOCH)
    return ((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds) * 1_000


def _wall_time_ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return _datetime_ns(value) // 1_000_000
    if isinstance(value, DatetimeMS):
        return int(value)
    raise ValueError(f"change event 'wallTime' must be a date, got {value!r}")


def _short(doc: Any) -> str:
    text = repr(doc)
    return text if len(text) <= 300 else text[:300] + "..."


@dataclass(frozen=True, slots=True)
class _Collection:
    """Everything about one collection's records that does not depend on the event."""

    db: str
    coll: str
    namespace: str
    topic: str
    data_collection: str
    key_prefix: bytes
    value_prefix: bytes
    fields: CollectionFields | None


class EventConverter:
    """Turns one change stream document or snapshot document at a time into records."""

    def __init__(self, options: EventOptions) -> None:
        self.options = options
        self._serializer = Serializer(options.schemas_enable)
        self._transforms = FieldTransforms(
            options.field_exclude_list, options.field_renames, options.field_name_adjustment_mode
        )
        self._collections: dict[tuple[str, str], _Collection] = {}
        self._tracker = TransactionTracker(options) if options.provide_transaction_metadata else None
        self._legacy = options.event_format == "oplog_1x"
        self._skipped = options.skipped_operations
        self._topics = options.topics()
        self.heartbeat_topic = self._topics.heartbeat_topic()
        self._heartbeat_key = self._serializer.dumps(
            Serializer.schema_prefix(heartbeat_key_schema()), {"serverName": options.topic_prefix}
        )
        self._heartbeat_prefix = Serializer.schema_prefix(heartbeat_value_schema())
        # mongocdc.event.format=debezium_3x: the released Debezium 3.x bytes, written by their own module.
        self._debezium3 = Debezium3Events(options) if options.event_format == "debezium_3x" else None

    @property
    def transaction_topic(self) -> str:
        return self._topics.transaction_topic()

    def topic_for(self, db: str, coll: str) -> str:
        """The collection's topic, as ``topic.naming.strategy`` names it."""
        return self._collection(db, coll).topic

    def _collection(self, db: str, coll: str) -> _Collection:
        try:
            return self._collections[(db, coll)]
        except KeyError:
            pass
        o = self.options
        topic = self._topics.data_change_topic(db, coll)
        schema_base = adjust_schema_name(topic, o.schema_name_adjustment_mode)
        value_schema = (envelope_schema_1x if self._legacy else envelope_schema)(f"{schema_base}.Envelope")
        ctx = _Collection(
            db=db,
            coll=coll,
            namespace=f"{db}.{coll}",
            topic=topic,
            data_collection=f"{o.rs}.{db}.{coll}" if o.rs else f"{db}.{coll}",
            key_prefix=Serializer.schema_prefix(key_schema(f"{schema_base}.Key")),
            value_prefix=Serializer.schema_prefix(value_schema),
            fields=self._transforms.for_collection(db, coll),
        )
        self._collections[(db, coll)] = ctx
        return ctx

    def _key(self, ctx: _Collection, doc_id: Any) -> bytes:
        return self._serializer.dumps(ctx.key_prefix, {"id": ejson.key_id(doc_id)})

    def convert_change(self, change: Mapping[str, Any], position: Position) -> list[Record]:
        """Records for one raw change stream document, in emission order.

        That is: transaction BEGIN/END records (with ``provide.transaction.metadata``), the data
        event, and a tombstone after a delete (unless ``tombstones.on.delete=false``). Operation
        types other than insert/update/replace/delete (drop, rename, invalidate, ...) and
        ``skipped.operations`` yield no records.
        """
        if self._debezium3 is not None:
            return self._debezium3.convert_change(change, position)
        op_type = change.get("operationType")
        if not isinstance(op_type, str):
            raise ValueError(f"change event has no string 'operationType': {_short(change)}")
        op = DATA_OPERATIONS.get(op_type)
        if op is None or op in self._skipped:
            return []
        ns = change.get("ns")
        if (
            not isinstance(ns, Mapping)
            or not isinstance(ns.get("db"), str)
            or not isinstance(ns.get("coll"), str)
        ):
            raise ValueError(f"{op_type} change event has no 'ns.db'/'ns.coll': {_short(change)}")
        ctx = self._collection(ns["db"], ns["coll"])
        document_key = change.get("documentKey")
        if not isinstance(document_key, Mapping) or "_id" not in document_key:
            raise ValueError(f"{op_type} change event has no 'documentKey._id': {_short(change)}")
        full = change.get("fullDocument")
        if op_type in ("insert", "replace") and not isinstance(full, Mapping):
            raise ValueError(f"{op_type} change event has no 'fullDocument' document: {_short(change)}")
        desc = change.get("updateDescription")
        if op_type == "update" and not isinstance(desc, Mapping):
            raise ValueError(f"update change event has no 'updateDescription' document: {_short(change)}")

        o = self.options
        cluster_time = change.get("clusterTime")
        seconds = cluster_time.time if isinstance(cluster_time, Timestamp) else position.seconds
        lsid = change.get("lsid")
        txn_number = change.get("txnNumber")
        txn_id = transaction_id(lsid, txn_number)
        records: list[Record] = []
        block = None
        if self._tracker is not None:
            records, block = self._tracker.observe(txn_id, ctx.data_collection, position, seconds * 1000)
        now_ns = o.now_ns()
        if self._legacy:
            source = legacy_source_block(
                version=o.connector_version,
                name=o.topic_prefix,
                rs=o.rs,
                db=ctx.db,
                collection=ctx.coll,
                ts_ms=seconds * 1000,
                ord=position.increment,
                snapshot=False,
                stxnid=txn_id,
            )
            payload = legacy_payload(
                op=op,
                change=change,
                document=full,
                fields=ctx.fields,
                source=source,
                now_ns=now_ns,
                transaction=block,
            )
        else:
            source = source_block(
                version=o.connector_version,
                name=o.topic_prefix,
                rs=o.rs,
                db=ctx.db,
                collection=ctx.coll,
                ts_ns=seconds * 1_000_000_000,
                ord=position.increment,
                snapshot="false",
                lsid=ejson.dumps(lsid) if lsid is not None else None,
                txn_number=int(txn_number) if txn_number is not None else None,
                wall_time=_wall_time_ms(change.get("wallTime")),
            )
            fields = ctx.fields
            before = document_json(change.get("fullDocumentBeforeChange"), fields) if o.pre_image else None
            if op_type == "update":
                after = document_json(full, fields) if o.update_full else None
                update_desc = update_description(desc, fields)  # type: ignore[arg-type]
            else:
                after = document_json(full, fields) if op != "d" else None
                update_desc = None
            payload = change_streams_payload(
                op=op,
                before=before,
                after=after,
                update_desc=update_desc,
                source=source,
                now_ns=now_ns,
                transaction=block,
            )
        key = self._key(ctx, document_key["_id"])
        records.append(
            Record(
                ctx.topic, key, self._serializer.dumps(ctx.value_prefix, payload), position, ctx.namespace, op
            )
        )
        if op == "d" and o.tombstones_on_delete:
            records.append(Record(ctx.topic, key, None, position, ctx.namespace, None))
        return records

    def convert_read(
        self,
        document: Mapping[str, Any],
        db: str,
        coll: str,
        position: Position,
        snapshot_marker: str,
        ts: datetime.datetime | None = None,
    ) -> Record:
        """The ``r`` record of one snapshot document.

        ``position`` is the snapshot's position (``source.ord`` is its increment); ``ts`` is when the
        document was read (``source.ts_*``), defaulting to the position's clusterTime.
        """
        if self._debezium3 is not None:
            return self._debezium3.convert_read(document, db, coll, position, snapshot_marker, ts)
        if snapshot_marker not in READ_SNAPSHOT_MARKERS:
            raise ValueError(
                f"snapshot marker must be one of {', '.join(sorted(READ_SNAPSHOT_MARKERS))}; got {snapshot_marker!r}"
            )
        if not isinstance(document, Mapping) or "_id" not in document:
            raise ValueError(f"snapshot document of {db}.{coll} has no '_id': {_short(document)}")
        ctx = self._collection(db, coll)
        o = self.options
        ts_ns = _datetime_ns(ts) if ts is not None else position.seconds * 1_000_000_000
        now_ns = o.now_ns()
        payload: dict[str, Any]
        if self._legacy:
            source = legacy_source_block(
                version=o.connector_version,
                name=o.topic_prefix,
                rs=o.rs,
                db=db,
                collection=coll,
                ts_ms=ts_ns // 1_000_000,
                ord=position.increment,
                snapshot=True,
                stxnid=None,
            )
            payload = legacy_payload(
                op="r",
                change=None,
                document=document,
                fields=ctx.fields,
                source=source,
                now_ns=now_ns,
                transaction=None,
            )
        else:
            source = source_block(
                version=o.connector_version,
                name=o.topic_prefix,
                rs=o.rs,
                db=db,
                collection=coll,
                ts_ns=ts_ns,
                ord=position.increment,
                snapshot=snapshot_marker,
                lsid=None,
                txn_number=None,
                wall_time=None,
            )
            payload = change_streams_payload(
                op="r",
                before=None,
                after=document_json(document, ctx.fields),
                update_desc=None,
                source=source,
                now_ns=now_ns,
                transaction=None,
            )
        value = self._serializer.dumps(ctx.value_prefix, payload)
        return Record(ctx.topic, self._key(ctx, document["_id"]), value, position, ctx.namespace, "r")

    def heartbeat_record(self, position: Position, ts_ms: int) -> Record:
        """A heartbeat on ``<topic.heartbeat.prefix><delimiter><topic.prefix>``.

        Call :meth:`flush` first when transaction metadata is on, so an open transaction ends.
        """
        if self._debezium3 is not None:
            return self._debezium3.heartbeat_record(self.heartbeat_topic, position, ts_ms)
        value = self._serializer.dumps(self._heartbeat_prefix, {"ts_ms": int(ts_ms)})
        return Record(self.heartbeat_topic, self._heartbeat_key, value, position, None, None)

    def flush(self) -> list[Record]:
        """END of a transaction still open (nothing without ``provide.transaction.metadata``)."""
        if self._debezium3 is not None:
            return self._debezium3.flush()
        return self._tracker.flush() if self._tracker is not None else []

    def end_transaction_before(self, cluster_time: Timestamp) -> list[Record]:
        """END of an open transaction when the stream has scanned up to ``cluster_time``, past the
        transaction's own clusterTime (none of its events can follow any more)."""
        if self._debezium3 is not None:
            return self._debezium3.end_transaction_before(cluster_time)
        return self._tracker.end_before(cluster_time) if self._tracker is not None else []
