"""``mongocdc.event.format=debezium_3x``: records byte-identical to the released Debezium 3.x connector.

The seeds document the 2.x-era spelling (mongocdc's default); the Debezium 3.4 and 3.6 MongoDB
connectors write the same data with other bytes, and a team replacing a running Debezium needs those
bytes, because a record's key decides its partition and its compaction identity. What this format
writes, as observed by running the real connector beside mongocdc (tests/compat):

- Keys: ``{"id": "<_id>"}`` with the ``_id`` in the Java driver's relaxed Extended JSON
  (``{"$oid": "…"}``, ``{"$binary": {"base64": "…","subType": "04"}}``, Int64 as a number,
  ``{"$date": "2024-01-02T03:04:05.678Z"}``).
- ``before``/``after``: the driver's strict JSON (``{"$numberLong": "5"}``, ``{"$date": <millis>}``,
  ``1.0E300``), no space after ``,``; ``updatedFields``: its relaxed JSON with ``", "``, ``"{}"``
  when an update only removed or truncated fields. Non-finite doubles stay valid JSON here
  (``{"$numberDouble": "NaN"}``) where Debezium writes a bare ``NaN`` (see :data:`_VALUE`).
- ``source``: ``version, connector, name, ts_ms, snapshot, db, sequence, ts_us, ts_ns,
  collection, ord, lsid, txnNumber, wallTime`` (no ``rs``/``h``/``tord``/``stxnid``), ``ts_*``
  from the event's ``wallTime``; snapshot reads have ``ord`` -1, ``ts_*`` of the read, and the
  markers ``true`` and ``last`` only. The envelope has ``ts_ms`` but no ``ts_us``/``ts_ns``.
- Transaction metadata: id ``<lsid as strict JSON>:<txnNumber>``, ``data_collections`` named
  ``db.collection`` in the order of Java's ``HashMap``, BEGIN at its first event's time, END at the
  time of the event that follows the transaction. Unlike Debezium, an END is also written when no
  event follows (when the stream has scanned past the transaction, at a heartbeat or a stop), once,
  with the time of the transaction's last event.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from bson.datetime_ms import DatetimeMS
from bson.timestamp import Timestamp

from mongocdc_core.events import javajson, raw
from mongocdc_core.events.changes import DATA_OPERATIONS, data_change, short
from mongocdc_core.events.dates import datetime_millis, datetime_ns
from mongocdc_core.events.envelope import AFTER_SLOT, NULL, key_template
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.raw import RawChange, RawDocuments
from mongocdc_core.events.records import Record
from mongocdc_core.events.schema import Serializer, _field, _json_field, _plain, _schema, adjust_schema_name
from mongocdc_core.events.transforms import CollectionFields, FieldTransforms
from mongocdc_core.positions import Position

CONNECTOR = "mongodb"
#: ``before``/``after``: Debezium's ``COMPACT_JSON_SETTINGS``, non-finite doubles kept valid JSON.
_VALUE = javajson.STRICT_INDENTED.valid_json()
#: Event key ``_id``: Debezium's ``SIMPLE_JSON_SETTINGS``.
_KEY = javajson.RELAXED_INDENTED
#: ``lsid`` and transaction ids (an lsid holds only binaries, so nothing non-finite).
_LSID = javajson.STRICT_INDENTED
#: ``updatedFields``: ``BsonDocument.toJson()``.
_UPDATED = javajson.RELAXED
#: The only ``source.snapshot`` values of Debezium 3.x snapshot reads besides incremental ones.
_LAST = "last"
_INCREMENTAL = "incremental"
SNAPSHOT_VALUES = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"

# -- schemas (Debezium 3.x's key order: type, fields/items, optional, name, version, parameters, default) --


def source_schema() -> dict[str, Any]:
    """``io.debezium.connector.mongo.Source`` as Debezium 3.4/3.6 declare it."""
    snapshot = _schema(
        "string", True, name="io.debezium.data.Enum", version=1, parameters={"allowed": SNAPSHOT_VALUES}, default="false",
        default_last=True,
    )
    return _schema(
        "struct",
        False,
        fields=[
            _plain("version", "string", False),
            _plain("connector", "string", False),
            _plain("name", "string", False),
            _plain("ts_ms", "int64", False),
            _field("snapshot", snapshot),
            _plain("db", "string", False),
            _plain("sequence", "string", True),
            _plain("ts_us", "int64", True),
            _plain("ts_ns", "int64", True),
            _plain("collection", "string", False),
            _plain("ord", "int32", False),
            _plain("lsid", "string", True),
            _plain("txnNumber", "int64", True),
            _plain("wallTime", "int64", True),
        ],
        name="io.debezium.connector.mongo.Source",
        version=1,
    )


def transaction_block_schema() -> dict[str, Any]:
    return _schema(
        "struct",
        True,
        fields=[
            _plain("id", "string", False),
            _plain("total_order", "int64", False),
            _plain("data_collection_order", "int64", False),
        ],
        name="event.block",
        version=1,
    )


def envelope_schema(name: str) -> dict[str, Any]:
    """Value schema of a collection topic (no ``ts_us``/``ts_ns`` in the envelope, unlike 2.x)."""
    truncated = _schema(
        "struct",
        False,
        fields=[_plain("field", "string", False), _plain("size", "int32", False)],
        name="io.debezium.connector.mongodb.changestream.truncatedarray",
        version=1,
    )
    update_description = _schema(
        "struct",
        True,
        fields=[
            _field("removedFields", _schema("array", True, items=_schema("string", False))),
            _json_field("updatedFields"),
            _field("truncatedArrays", _schema("array", True, items=truncated)),
        ],
        name="io.debezium.connector.mongodb.changestream.updatedescription",
        version=1,
    )
    return _schema(
        "struct",
        False,
        fields=[
            _json_field("before"),
            _json_field("after"),
            _field("updateDescription", update_description),
            _field("source", source_schema()),
            _plain("op", "string", True),
            _plain("ts_ms", "int64", True),
            _field("transaction", transaction_block_schema()),
        ],
        name=name,
    )


def key_schema(name: str) -> dict[str, Any]:
    return _schema("struct", False, fields=[_plain("id", "string", False)], name=name)


def transaction_key_schema() -> dict[str, Any]:
    return _schema(
        "struct",
        False,
        fields=[_plain("id", "string", False)],
        name="io.debezium.connector.common.TransactionMetadataKey",
        version=1,
    )


def transaction_value_schema() -> dict[str, Any]:
    collection = _schema(
        "struct",
        True,
        fields=[_plain("data_collection", "string", False), _plain("event_count", "int64", False)],
        name="event.collection",
        version=1,
    )
    return _schema(
        "struct",
        False,
        fields=[
            _plain("status", "string", False),
            _plain("id", "string", False),
            _plain("event_count", "int64", True),
            _field("data_collections", _schema("array", True, items=collection)),
            _plain("ts_ms", "int64", False),
        ],
        name="io.debezium.connector.common.TransactionMetadataValue",
        version=1,
    )


def heartbeat_key_schema() -> dict[str, Any]:
    return _schema(
        "struct",
        False,
        fields=[_plain("serverName", "string", False)],
        name="io.debezium.connector.common.ServerNameKey",
        version=1,
    )


def heartbeat_value_schema() -> dict[str, Any]:
    return _schema(
        "struct", False, fields=[_plain("ts_ms", "int64", False)], name="io.debezium.connector.common.Heartbeat", version=1
    )


# -- small pieces ----------------------------------------------------------------------------------------


def key_id(document_id: Any) -> str:
    """The key's ``id``: the ``_id`` as ``JsonSerialization.getDocumentId`` writes it."""
    return javajson.dumps(document_id, _KEY)


def document_json(doc: Mapping[str, Any] | None, fields: CollectionFields | None) -> str | None:
    """``before``/``after`` text (field rules applied)."""
    if doc is None:
        return None
    return javajson.dumps(fields.document(doc) if fields is not None else doc, _VALUE)


def update_description(desc: Mapping[str, Any], fields: CollectionFields | None) -> dict[str, Any]:
    """``updateDescription`` of an update: ``updatedFields`` always (``"{}"`` when empty), the lists
    null when empty (also when the field rules removed every entry)."""
    updated: Mapping[str, Any] = desc.get("updatedFields") or {}
    removed = list(desc.get("removedFields") or ())
    truncated = [(t["field"], int(t["newSize"])) for t in desc.get("truncatedArrays") or ()]
    if fields is not None:
        updated = fields.updated_fields(updated)
        removed = fields.field_paths(removed)
        kept = []
        for name, size in truncated:
            paths = fields.field_paths([name])
            if paths:
                kept.append((paths[0], size))
        truncated = kept
    return {
        "removedFields": removed or None,
        "updatedFields": javajson.dumps(updated, _UPDATED),
        "truncatedArrays": [{"field": name, "size": size} for name, size in truncated] or None,
    }


def lsid_json(lsid: Any) -> str:
    """``source.lsid``: the session id document in strict JSON."""
    if not isinstance(lsid, Mapping) or "id" not in lsid:
        raise ValueError(f"change event 'lsid' must be a document with an 'id', got {short(lsid)}")
    return javajson.dumps(lsid, _LSID)


def _wall_time_ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, (datetime.datetime, DatetimeMS)):
        return datetime_millis(value)
    raise ValueError(f"change event 'wallTime' must be a date, got {value!r}")


def java_string_hash(text: str) -> int:
    """``String.hashCode()`` (over UTF-16 code units), as an unsigned 32-bit number."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h


def java_hash_map_order(keys: Iterable[str]) -> list[str]:
    """The iteration order of a ``java.util.HashMap`` into which ``keys`` were put in this order.

    Entries sit in the bucket ``(h ^ (h >>> 16)) & (capacity - 1)``; the table starts with 16
    buckets and doubles whenever it holds more than 3/4 of that; a bucket keeps insertion order
    (also across resizes).
    """
    inserted = list(dict.fromkeys(keys))
    capacity = 16
    while len(inserted) > capacity * 3 // 4:
        capacity *= 2

    def bucket(key: str) -> int:
        h = java_string_hash(key)
        return (h ^ (h >> 16)) & (capacity - 1)

    return [key for _, key in sorted(enumerate(inserted), key=lambda item: (bucket(item[1]), item[0]))]


# -- transactions ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Transaction:
    id: str
    last_position: Position
    last_ts_ms: int
    event_count: int = 0
    per_collection: dict[str, int] = field(default_factory=dict)


class _Transactions:
    """BEGIN/END records and envelope blocks, as Debezium's ``TransactionMonitor`` writes them."""

    def __init__(self, topic: str, serializer: Serializer) -> None:
        self.topic = topic
        self._serializer = serializer
        self._key_prefix = Serializer.schema_prefix(transaction_key_schema())
        self._value_prefix = Serializer.schema_prefix(transaction_value_schema())
        self._open: _Transaction | None = None

    def observe(
        self, txn_id: str | None, data_collection: str, position: Position, ts_ms: int
    ) -> tuple[list[Record], dict[str, Any] | None]:
        """Records to emit before this event (END of the previous transaction at this event's
        time, BEGIN of its own), and the event's ``transaction`` block."""
        records: list[Record] = []
        if self._open is not None and self._open.id != txn_id:
            records.append(self._end(ts_ms))
        if txn_id is None:
            return records, None
        txn = self._open
        if txn is None:
            txn = self._open = _Transaction(txn_id, position, ts_ms)
            begin = {"status": "BEGIN", "id": txn_id, "event_count": None, "data_collections": None, "ts_ms": ts_ms}
            records.append(self._record(txn_id, begin, position))
        txn.event_count += 1
        txn.last_position = position
        txn.last_ts_ms = ts_ms
        order = txn.per_collection.get(data_collection, 0) + 1
        txn.per_collection[data_collection] = order
        return records, {"id": txn_id, "total_order": txn.event_count, "data_collection_order": order}

    def flush(self) -> list[Record]:
        """END of the open transaction (no event follows it yet), at its last event's time."""
        return [self._end(self._open.last_ts_ms)] if self._open is not None else []

    def end_before(self, cluster_time: Timestamp) -> list[Record]:
        """END of the open transaction when ``cluster_time`` is past it (none of its events can follow)."""
        txn = self._open
        if txn is None or txn.last_position.timestamp >= cluster_time:
            return []
        return self.flush()

    def _end(self, ts_ms: int) -> Record:
        txn = self._open
        assert txn is not None
        self._open = None
        collections = [
            {"data_collection": name, "event_count": txn.per_collection[name]}
            for name in java_hash_map_order(txn.per_collection)
        ]
        payload = {"status": "END", "id": txn.id, "event_count": txn.event_count,
                   "data_collections": collections, "ts_ms": ts_ms}
        return self._record(txn.id, payload, txn.last_position)

    def _record(self, txn_id: str, payload: dict[str, Any], position: Position) -> Record:
        key = self._serializer.dumps(self._key_prefix, {"id": txn_id})
        return Record(self.topic, key, self._serializer.dumps(self._value_prefix, payload), position, None, None)


# -- the format ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Collection:
    db: str
    coll: str
    namespace: str
    topic: str
    key_prefix: bytes
    value_prefix: bytes
    fields: CollectionFields | None
    #: The key with one slot, the ``id`` as a JSON string (``envelope.key_template``).
    key_template: bytes
    #: A change event's value with slots (see :func:`_change_template`).
    change_template: bytes
    #: ``fields`` as the compiled module applies them (None: no rules, or only the Python path's).
    native_rules: raw.FieldRules | None
    #: The compiled writer of its change records (None: no compiled module, or rules only the Python path applies).
    writer: raw.ChangeWriter | None
    #: The schema parts every change record's key and value start with (None without schemas): ``Record.heads``.
    heads: tuple[bytes, bytes] | None


def _constant(value: str) -> bytes:
    return orjson.dumps(value).replace(b"%", b"%%")


def _change_template(schema_prefix: bytes, options: EventOptions, db: str, coll: str) -> bytes:
    """A change event's value, as :meth:`Debezium3Events.convert_change` serialises its payload, with
    slots in this order: ``before``, ``after``, ``updateDescription`` (JSON bytes), ``source.ts_ms``
    (int), ``snapshot`` (JSON bytes), ``ts_us``, ``ts_ns``, ``ord`` (ints), ``lsid``, ``txnNumber``,
    ``wallTime``, ``op`` (JSON bytes), ``ts_ms`` (int), ``transaction`` (JSON bytes).
    ``schema_prefix`` is empty without schemas. Snapshot reads use it too."""
    return (
        schema_prefix.replace(b"%", b"%%")
        + b'{"before":%b,"after":%b,"updateDescription":%b,"source":{"version":'
        + _constant(options.connector_version)
        + b',"connector":'
        + _constant(CONNECTOR)
        + b',"name":'
        + _constant(options.topic_prefix)
        + b',"ts_ms":%d,"snapshot":%b,"db":'
        + _constant(db)
        + b',"sequence":null,"ts_us":%d,"ts_ns":%d,"collection":'
        + _constant(coll)
        + b',"ord":%d,"lsid":%b,"txnNumber":%b,"wallTime":%b},"op":%b,"ts_ms":%d,"transaction":%b}'
        + (b"}" if schema_prefix else b"")
    )


_OP_JSON = {op: orjson.dumps(op) for op in ("c", "u", "d", "r")}
_NOT_SNAPSHOT = orjson.dumps("false")
#: What fills the change template's slots (:func:`_change_template`) in the compiled writer.
_WRITER_SLOTS = ("b", "a", "u", "E", _NOT_SNAPSHOT, "F", "G", "i", "l", "x", "w", "o", "M", "k")


class Debezium3Events:
    """Change stream documents and snapshot reads to Debezium 3.x records (``EventConverter`` delegates here)."""

    def __init__(self, options: EventOptions) -> None:
        self.options = options
        self._serializer = Serializer(options.schemas_enable)
        self._transforms = FieldTransforms(
            options.field_exclude_list, options.field_renames, options.field_name_adjustment_mode, renamed_last=True
        )
        self._topics = options.topics()
        self._collections: dict[tuple[str, str], _Collection] = {}
        self._transactions = (
            _Transactions(self._topics.transaction_topic(), self._serializer)
            if options.provide_transaction_metadata
            else None
        )
        self._heartbeat_key_prefix = Serializer.schema_prefix(heartbeat_key_schema())
        self._heartbeat_value_prefix = Serializer.schema_prefix(heartbeat_value_schema())
        self._last_lsid: tuple[bytes | None, str, bytes] = (None, "", b"")  # a raw lsid's BSON, text, JSON string
        # what convert_raw reads per event, read once (options' properties compute theirs per call)
        self._pre_image = options.pre_image
        self._update_full = options.update_full
        self._skipped = options.skipped_operations
        self._tombstones = options.tombstones_on_delete
        self._now_ns = options.now_ns

    def _collection(self, db: str, coll: str) -> _Collection:
        ctx = self._collections.get((db, coll))
        if ctx is None:
            topic = self._topics.data_change_topic(db, coll)
            base = adjust_schema_name(topic, self.options.schema_name_adjustment_mode)
            key_prefix = Serializer.schema_prefix(key_schema(f"{base}.Key"))
            value_prefix = Serializer.schema_prefix(envelope_schema(f"{base}.Envelope"))
            schemas = self.options.schemas_enable
            fields = self._transforms.for_collection(db, coll)
            native_rules = raw.field_rules(fields)
            key_template_ = key_template(key_prefix if schemas else b"")
            change_template = _change_template(value_prefix if schemas else b"", self.options, db, coll)
            ctx = self._collections[(db, coll)] = _Collection(
                db=db,
                coll=coll,
                namespace=f"{db}.{coll}",
                topic=topic,
                key_prefix=key_prefix,
                value_prefix=value_prefix,
                fields=fields,
                native_rules=native_rules,
                heads=(key_prefix, value_prefix) if schemas else None,
                key_template=key_template_,
                change_template=change_template,
                writer=raw.change_writer(change_template, _WRITER_SLOTS, key_template_, self._pre_image,
                                         self._update_full, "debezium_3x", native_rules)
                if fields is None or native_rules is not None else None,  # fmt: skip
            )
        return ctx

    def _source(
        self, ctx: _Collection, ts_ns: int, snapshot: str, ord_: int, lsid: str | None,
        txn_number: int | None, wall_time: int | None,
    ) -> dict[str, Any]:
        return {
            "version": self.options.connector_version,
            "connector": CONNECTOR,
            "name": self.options.topic_prefix,
            "ts_ms": ts_ns // 1_000_000,
            "snapshot": snapshot,
            "db": ctx.db,
            "sequence": None,
            "ts_us": ts_ns // 1_000,
            "ts_ns": ts_ns,
            "collection": ctx.coll,
            "ord": ord_,
            "lsid": lsid,
            "txnNumber": txn_number,
            "wallTime": wall_time,
        }

    def _value(self, ctx: _Collection, payload: dict[str, Any]) -> bytes:
        return self._serializer.dumps(ctx.value_prefix, payload)

    def _key(self, ctx: _Collection, document_id: Any) -> bytes:
        return self._serializer.dumps(ctx.key_prefix, {"id": key_id(document_id)})

    def convert_change(self, change: Mapping[str, Any], position: Position) -> list[Record]:
        """Records of one change stream document: transaction BEGIN/END, the event, a tombstone."""
        parsed = data_change(change, self.options.skipped_operations)
        if parsed is None:
            return []
        ctx = self._collection(parsed.db, parsed.coll)
        o = self.options
        wall_time = _wall_time_ms(change.get("wallTime"))
        cluster_time = change.get("clusterTime")
        seconds = cluster_time.time if isinstance(cluster_time, Timestamp) else position.seconds
        ts_ms = wall_time if wall_time is not None else seconds * 1000
        lsid = change.get("lsid")
        txn_number = change.get("txnNumber")
        lsid_text = lsid_json(lsid) if lsid is not None else None
        txn_id = f"{lsid_text}:{int(txn_number)}" if lsid_text is not None and txn_number is not None else None
        records: list[Record] = []
        block = None
        if self._transactions is not None:
            records, block = self._transactions.observe(txn_id, ctx.namespace, position, ts_ms)
        source = self._source(
            ctx, ts_ms * 1_000_000, "false", position.increment, lsid_text,
            int(txn_number) if txn_number is not None else None, wall_time,
        )
        fields = ctx.fields
        full = parsed.full_document
        before = document_json(change.get("fullDocumentBeforeChange"), fields) if o.pre_image else None
        desc = parsed.update_description
        if parsed.op_type == "update":
            after = document_json(full, fields) if o.update_full else None
            assert desc is not None
            update_desc: dict[str, Any] | None = update_description(desc, fields)
        else:
            after = document_json(full, fields) if parsed.op != "d" else None
            update_desc = None
        payload = {
            "before": before,
            "after": after,
            "updateDescription": update_desc,
            "source": source,
            "op": parsed.op,
            "ts_ms": o.now_ns() // 1_000_000,
            "transaction": block,
        }
        key = self._key(ctx, parsed.document_id)
        records.append(Record(ctx.topic, key, self._value(ctx, payload), position, ctx.namespace, parsed.op, ctx.heads))
        if parsed.op == "d" and o.tombstones_on_delete:
            records.append(Record(ctx.topic, key, None, position, ctx.namespace, None, ctx.heads))
        return records

    def convert_raw(self, change: RawChange, header: raw.Header, position: Position) -> list[Record] | None:
        """:meth:`convert_change` of a raw event with a header, its key and value written whole from
        the BSON by the collection's compiled writer; None when the Python path converts it (field
        rules only it applies, or a type or shape the writer leaves to Python, which also reports
        malformed events with their own message). The transaction block, which needs the event's
        time (its ``wallTime``), is put where the writer left :data:`raw.BLOCK_MARK`, as in
        ``EventConverter._raw_change``."""
        op = DATA_OPERATIONS.get(header.op_type)
        if op is None or op in self._skipped:
            return []
        db, coll = header.db, header.coll
        ctx = self._collections.get((db, coll)) or self._collection(db, coll)
        writer = ctx.writer
        if writer is None:
            return None
        lsid_bson = header.lsid
        lsid_text, lsid_string = (None, None) if lsid_bson is None else self._lsid(change, lsid_bson)
        transactions = self._transactions
        written = writer.write(
            change.raw, header, position.increment, lsid_string, self._now_ns(),
            None if transactions is None else raw.BLOCK_MARK,
        )  # fmt: skip
        if written is None:
            return None
        key, value, wall_ms = written
        if transactions is None:
            records: list[Record] = []
        else:
            txn_number = header.txn_number
            txn_id = f"{lsid_text}:{txn_number}" if lsid_text is not None and txn_number is not None else None
            ts_ms = wall_ms if wall_ms is not None else header.seconds * 1000
            records, block = transactions.observe(txn_id, ctx.namespace, position, ts_ms)
            head, _, tail = value.rpartition(raw.BLOCK_MARK)
            value = head + (NULL if block is None else orjson.dumps(block)) + tail
        records.append(Record(ctx.topic, key, value, position, ctx.namespace, op, ctx.heads))
        if op == "d" and self._tombstones:
            records.append(Record(ctx.topic, key, None, position, ctx.namespace, None, ctx.heads))
        return records

    def _lsid(self, change: RawChange, lsid_bson: bytes) -> tuple[str, bytes]:
        """:func:`lsid_json` of a raw event's ``lsid``, and that text as a JSON string (cached: a
        transaction's events share one session)."""
        last_bson, text, json = self._last_lsid
        if lsid_bson != last_bson:
            text = lsid_json(change.decode(lsid_bson))
            json = orjson.dumps(text)
            self._last_lsid = (lsid_bson, text, json)
        return text, json

    def convert_reads(
        self,
        documents: Sequence[Mapping[str, Any]],
        markers: Sequence[str],
        db: str,
        coll: str,
        position: Position,
        ts: datetime.datetime | None = None,
    ) -> Sequence[Record]:
        """:meth:`convert_read` of each document of a snapshot chunk; a raw batch is written from its
        BSON by the compiled module (:func:`raw.read_records`), with one processing time."""
        ctx = self._collection(db, coll)
        compiled = ctx.fields is None or ctx.native_rules is not None
        if isinstance(documents, RawDocuments) and compiled and raw.native is not None and documents:
            around = self._read_templates(ctx, markers, position, ts)
            fields = ctx.fields

            def left_read(doc: Mapping[str, Any]) -> tuple[bytes, bytes]:
                return orjson.dumps(key_id(doc["_id"])), orjson.dumps(document_json(doc, fields))

            return raw.read_records(documents, markers, around, ctx.key_template, ctx.topic, ctx.namespace, position,
                                    "debezium_3x", ctx.native_rules, left_read, ctx.heads)  # fmt: skip
        return [self.convert_read(doc, db, coll, position, marker, ts) for doc, marker in zip(documents, markers, strict=True)]

    def _read_templates(
        self, ctx: _Collection, markers: Sequence[str], position: Position, ts: datetime.datetime | None
    ) -> dict[str, tuple[bytes, bytes]]:
        """The value template's bytes before and after ``after``, per marker (as :meth:`convert_read`)."""
        now_ms = self.options.now_ns() // 1_000_000
        around: dict[str, tuple[bytes, bytes]] = {}
        for marker in set(markers):
            if marker == _INCREMENTAL:
                ts_ns, snapshot, ord_ = position.seconds * 1_000_000_000, _INCREMENTAL, position.increment
            else:
                ts_ns = datetime_ns(ts) if ts is not None else position.seconds * 1_000_000_000
                snapshot, ord_ = (_LAST if marker == _LAST else "true"), -1
            whole = ctx.change_template % (
                NULL, AFTER_SLOT, NULL, ts_ns // 1_000_000, orjson.dumps(snapshot), ts_ns // 1_000, ts_ns, ord_,
                NULL, NULL, NULL, _OP_JSON["r"], now_ms, NULL,
            )  # fmt: skip
            head, _, tail = whole.partition(AFTER_SLOT)
            around[marker] = (head, tail)
        return around

    def convert_read(
        self,
        document: Mapping[str, Any],
        db: str,
        coll: str,
        position: Position,
        snapshot_marker: str,
        ts: datetime.datetime | None = None,
    ) -> Record:
        """The ``r`` record of one snapshot document read at ``ts`` (default: the position's time).

        Initial and blocking snapshot reads carry ``ord`` -1, the read time and ``true`` (``last``
        on the final read); incremental snapshot reads carry ``incremental`` and the position.
        """
        if not isinstance(document, Mapping) or "_id" not in document:
            raise ValueError(f"snapshot document of {db}.{coll} has no '_id': {short(document)}")
        ctx = self._collection(db, coll)
        if snapshot_marker == _INCREMENTAL:
            source = self._source(ctx, position.seconds * 1_000_000_000, _INCREMENTAL, position.increment, None, None, None)
        else:
            marker = _LAST if snapshot_marker == _LAST else "true"
            ts_ns = datetime_ns(ts) if ts is not None else position.seconds * 1_000_000_000
            source = self._source(ctx, ts_ns, marker, -1, None, None, None)
        payload = {
            "before": None,
            "after": document_json(document, ctx.fields),
            "updateDescription": None,
            "source": source,
            "op": "r",
            "ts_ms": self.options.now_ns() // 1_000_000,
            "transaction": None,
        }
        return Record(ctx.topic, self._key(ctx, document["_id"]), self._value(ctx, payload), position, ctx.namespace, "r")

    def heartbeat_record(self, topic: str, position: Position, ts_ms: int) -> Record:
        """A heartbeat (``io.debezium.connector.common.Heartbeat``, schema version 1)."""
        key = self._serializer.dumps(self._heartbeat_key_prefix, {"serverName": self.options.topic_prefix})
        value = self._serializer.dumps(self._heartbeat_value_prefix, {"ts_ms": int(ts_ms)})
        return Record(topic, key, value, position, None, None)

    def flush(self) -> list[Record]:
        """END of a transaction still open."""
        return self._transactions.flush() if self._transactions is not None else []

    def end_transaction_before(self, cluster_time: Timestamp) -> list[Record]:
        """END of an open transaction that ``cluster_time`` is past."""
        return self._transactions.end_before(cluster_time) if self._transactions is not None else []
