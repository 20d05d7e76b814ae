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

This module holds the format's schemas, texts and template; the converter writes its records with them
(``convert._Debezium3Values``), as it writes the other formats'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from mongocdc_core.events import javajson
from mongocdc_core.events.changes import short
from mongocdc_core.events.envelope import NULL
from mongocdc_core.events.schema import _field, _json_field, _plain, _schema
from mongocdc_core.events.transactions import TransactionFormat
from mongocdc_core.events.transforms import CollectionFields
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


def document_string(doc: Mapping[str, Any] | None, fields: CollectionFields | None) -> bytes:
    """``before``/``after``: the (transformed) document's text as a JSON string, or ``null``."""
    if doc is None:
        return NULL
    return orjson.dumps(javajson.dumps(fields.document(doc) if fields is not None else doc, _VALUE))


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


# -- the format ------------------------------------------------------------------------------------------

#: Transaction records as Debezium's ``TransactionMonitor`` writes them.
TRANSACTIONS = TransactionFormat(transaction_key_schema(), transaction_value_schema(), java_hash_map_order, end_at_next=True)


def _constant(value: str) -> bytes:
    return orjson.dumps(value).replace(b"%", b"%%")


def value_template(*, schema_prefix: bytes, version: str, name: str, rs: str, db: str, collection: str) -> bytes:
    """One collection's value with slots, in this order: ``before``, ``after``, ``updateDescription``
    (JSON bytes), ``source.ts_ms`` (int), ``snapshot`` (JSON bytes), ``ts_us``, ``ts_ns``, ``ord``
    (ints), ``lsid``, ``txnNumber``, ``wallTime``, ``op`` (JSON bytes), ``ts_ms`` (int), ``transaction``
    (JSON bytes). ``schema_prefix`` is empty without schemas; ``source`` has no ``rs``. Snapshot reads use
    it too (:func:`read_source`)."""
    return (
        schema_prefix.replace(b"%", b"%%")
        + b'{"before":%b,"after":%b,"updateDescription":%b,"source":{"version":'
        + _constant(version)
        + b',"connector":'
        + _constant(CONNECTOR)
        + b',"name":'
        + _constant(name)
        + b',"ts_ms":%d,"snapshot":%b,"db":'
        + _constant(db)
        + b',"sequence":null,"ts_us":%d,"ts_ns":%d,"collection":'
        + _constant(collection)
        + b',"ord":%d,"lsid":%b,"txnNumber":%b,"wallTime":%b},"op":%b,"ts_ms":%d,"transaction":%b}'
        + (b"}" if schema_prefix else b"")
    )


def read_source(marker: str, position: Position, ts_ns: int) -> tuple[int, str, int]:
    """A snapshot read's ``source`` time (ns), ``snapshot`` and ``ord``, from its marker: initial and
    blocking snapshot reads carry the read time ``ts_ns``, ``true`` (``last`` on the final read) and
    ``ord`` -1; incremental snapshot reads the position's time and increment and ``incremental``."""
    if marker == _INCREMENTAL:
        return position.seconds * 1_000_000_000, _INCREMENTAL, position.increment
    return ts_ns, _LAST if marker == _LAST else "true", -1
