"""Raw MongoDB change stream documents and snapshot reads to serialized Debezium records.

:class:`EventConverter` is the one entry point of the event layer: pure (no I/O), stateful only
for transaction metadata, and fast because everything that depends only on the collection (topic,
schema bytes, field rules) is computed once per collection and cached.
"""

from __future__ import annotations

import datetime
from binascii import hexlify
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from bson.datetime_ms import DatetimeMS
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from mongocdc_core.events import debezium3, ejson, raw
from mongocdc_core.events.changes import DATA_OPERATIONS, short
from mongocdc_core.events.dates import datetime_ns, since_epoch
from mongocdc_core.events.envelope import (
    AFTER_SLOT,
    NULL,
    document_string,
    key_template,
    legacy_after,
    legacy_parts,
    legacy_value_template,
    times,
    update_description,
    value_template,
)
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.raw import RawChange, RawDocuments
from mongocdc_core.events.records import LandingParts, Record
from mongocdc_core.events.schema import (
    Serializer,
    adjust_schema_name,
    envelope_schema,
    envelope_schema_1x,
    heartbeat_key_schema,
    heartbeat_value_schema,
    key_schema,
)
from mongocdc_core.events.transactions import (
    DEFAULT_FORMAT,
    Session,
    TransactionFormat,
    TransactionTracker,
    transaction_id,
)
from mongocdc_core.events.transforms import CollectionFields, FieldTransforms
from mongocdc_core.positions import Position

if TYPE_CHECKING:
    from mongocdc_native import ChangeLanding

#: ``source.snapshot`` values of snapshot reads.
READ_SNAPSHOT_MARKERS = frozenset(
    {"true", "first", "first_in_data_collection", "last_in_data_collection", "last", "incremental"}
)
_MILLISECOND = datetime.timedelta(milliseconds=1)
_OID_KEY_JSON = b'"{\\"$oid\\" : \\"%b\\"}"'
_OP_JSON = {op: orjson.dumps(op) for op in ("c", "u", "d", "r")}
_SNAPSHOT_JSON = {marker: orjson.dumps(marker) for marker in (*READ_SNAPSHOT_MARKERS, "false")}
_NOT_SNAPSHOT = _SNAPSHOT_JSON["false"]


def _wall_time_ms(value: Any) -> int | None:
    """``source.wallTime``: milliseconds since the epoch, or None."""
    if type(value) is datetime.datetime or isinstance(value, datetime.datetime):  # bson.decode's type first
        return since_epoch(value) // _MILLISECOND
    if value is None:
        return None
    if isinstance(value, DatetimeMS):
        return int(value)
    raise ValueError(f"change event 'wallTime' must be a date, got {value!r}")


def _is_document(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)


def key_id_json(value: Any) -> bytes:
    """The key's ``id`` (see :func:`ejson.key_id`) as a JSON string; the common ``_id`` types directly."""
    kind = type(value)
    if kind is ObjectId:
        return _OID_KEY_JSON % hexlify(value.binary)
    if kind is int:
        return b'"%d"' % value
    if kind is Int64:
        return b'"{\\"$numberLong\\" : \\"%d\\"}"' % value
    return orjson.dumps(ejson.key_id(value))


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
    key_template: bytes
    value_template: bytes
    fields: CollectionFields | None
    #: ``fields`` as the compiled module applies them (None: no rules, or only the Python path's).
    native_rules: raw.FieldRules | None
    #: The schema parts every change record's key and value start with (None without schemas): ``Record.heads``.
    heads: tuple[bytes, bytes] | None
    #: The compiled writer of its change records (None: no compiled module, or field rules only the
    #: Python path applies).
    writer: raw.ChangeWriter | None
    #: Its change records' landing rows, which ``writer`` appends to (a converter built for the Parquet landing
    #: in the default or the Debezium 3.x format; else None).
    landing: ChangeLanding | None


#: What fills the default value template's slots (``envelope.value_template``) in the compiled writer.
_WRITER_SLOTS = ("b", "a", "u", "t", _NOT_SNAPSHOT, "i", "l", "x", "w", "o", "M", "U", "N", "k")
#: What fills the 1.x value template's slots (``envelope.legacy_value_template``) in the compiled writer.
_LEGACY_WRITER_SLOTS = ("a", "u", "f", "S", b"false", "i", "l", "o", "M", "k")
#: What fills the 3.x value template's slots (``debezium3.value_template``) in the compiled writer.
_DEBEZIUM3_WRITER_SLOTS = ("b", "a", "u", "E", _NOT_SNAPSHOT, "F", "G", "i", "l", "x", "w", "o", "M", "k")
#: A signed 64-bit number's range: ``source.ts_ns`` past it is refused (as the compiled writer and
#: Kafka Connect's int64 refuse it).
_INT64 = range(-(2**63), 2**63)


class _Values(Protocol):
    """How one ``mongocdc.event.format`` spells a collection's values, the one place a format differs
    in :class:`EventConverter`: the value schema and template (per collection), what fills the
    compiled writer's slots, the key's id, the session and transaction records, the heartbeat's
    schemas, and the values the Python path writes from the decoded parts."""

    #: The compiled writer's slots of :meth:`template` (see ``raw.change_writer``).
    slots: tuple[str | bytes, ...]
    #: Renamed fields go last in their document (``FieldTransforms``).
    renamed_last: bool
    #: The compiled writer lays out change records' landing parts (``ChangeWriter.write_landing``).
    landing_parts: bool
    #: The compiled module writes snapshot reads' landing ``after`` column (``raw.read_records``).
    landing_afters: bool
    #: The transaction topic's records (``provide.transaction.metadata``).
    transactions: TransactionFormat

    def schema(self, name: str) -> dict[str, Any]:
        """The value schema."""

    def template(self, *, schema_prefix: bytes, version: str, name: str, rs: str, db: str, collection: str) -> bytes:
        """One collection's value with ``%`` slots."""

    def heartbeat_schemas(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The heartbeat's key and value schemas."""

    def data_collection(self, rs: str, db: str, coll: str) -> str:
        """A collection's name in transaction records."""

    def key_id(self, document_id: Any) -> bytes:
        """The key's ``id`` as a JSON string."""

    def session(self, lsid: Session, txn_number: int | None) -> bytes:
        """The writer's ``l`` slot of an event of a transaction (``lsid`` decoded)."""

    def transaction_id(self, lsid: Session | None, txn_number: int | None) -> str | None:
        """The transaction records' id of an event (None outside a transaction): a :meth:`_TransactionIds.of`."""

    def transaction_ms(self, wall_ms: int | None, seconds: int) -> int:
        """The time (ms) of an event in transaction records, from its ``wallTime`` (ms) and clusterTime."""

    def change_value(self, ctx: _Collection, change: Mapping[str, Any], op: str, seconds: int, position: Position,
                     block: bytes, now_ns: int) -> tuple[bytes, int | None]:  # fmt: skip
        """A checked change event's value, from its decoded parts (the Python path), with ``block`` in its
        ``transaction``; and its ``wallTime`` in ms (None when it has none)."""

    def read_around(self, template: bytes, markers: Iterable[str], position: Position, ts_ns: int,
                    now_ns: int) -> dict[str, tuple[bytes, bytes]]:  # fmt: skip
        """A read's value template bytes before and after its ``after``, per marker."""

    def afters(self, documents: Sequence[Mapping[str, Any]]) -> list[bytes]:
        """Reads' ``after`` as JSON strings (field rules already applied)."""


def _heartbeat_schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    """The heartbeat's key and value schemas of the default and 1.x formats."""
    return heartbeat_key_schema(), heartbeat_value_schema()


def _data_collection(rs: str, db: str, coll: str) -> str:
    """A collection in the default and 1.x formats' transaction records: ``<rs>.<db>.<coll>``."""
    return f"{rs}.{db}.{coll}" if rs else f"{db}.{coll}"


def _cluster_ms(wall_ms: int | None, seconds: int) -> int:
    """The time of an event in the default and 1.x formats' transaction records: its clusterTime's."""
    return seconds * 1000


class _TransactionIds:
    """A format's transaction ids of events (None outside a transaction), as ``form`` writes them from a
    session and a txnNumber, cached for the consecutive events of one transaction. Their session is
    one object when the compiled path decoded it (:meth:`EventConverter.session_of`), an equal one
    when the Python path did. A format's ``transaction_id`` is the bound :meth:`of` (a call of a callable
    object costs twice a method's, once per event)."""

    __slots__ = ("_form", "_last")

    def __init__(self, form: Callable[[Session, int], str | None]) -> None:
        self._form = form
        self._last: tuple[Session | None, int | None, str | None] = (None, None, None)

    def of(self, lsid: Session | None, txn_number: int | None) -> str | None:
        if lsid is None or txn_number is None:
            return None
        last_lsid, last_number, last_id = self._last
        if (lsid is last_lsid or lsid == last_lsid) and txn_number == last_number:
            return last_id
        txn_id = self._form(lsid, txn_number)
        self._last = (lsid, txn_number, txn_id)
        return txn_id


class _ChangeStreamsValues:
    """The default format (``envelope.value_template``): ``before``, ``after`` and ``updateDescription``
    in ``DOCUMENT_STYLE``, ``source`` with ``lsid``, ``txnNumber`` and ``wallTime``."""

    slots: tuple[str | bytes, ...] = _WRITER_SLOTS
    renamed_last = False
    landing_parts = True
    landing_afters = True
    transactions = DEFAULT_FORMAT
    schema = staticmethod(envelope_schema)
    template = staticmethod(value_template)
    key_id = staticmethod(key_id_json)
    heartbeat_schemas = staticmethod(_heartbeat_schemas)
    data_collection = staticmethod(_data_collection)
    transaction_ms = staticmethod(_cluster_ms)

    def __init__(self, options: EventOptions) -> None:
        self.transaction_id = _TransactionIds(transaction_id).of
        self._pre_image = options.pre_image
        self._update_full = options.update_full
        self._last_lsid: Session | None = None
        self._last_lsid_json = NULL
        self._times_seconds = -1
        self._times = b""

    def session(self, lsid: Session, txn_number: int | None) -> bytes:
        """``source.lsid``: the session document's text as a JSON string (cached: a transaction's
        events share one session)."""
        if lsid == self._last_lsid:
            return self._last_lsid_json
        text = ejson.dumps_string(lsid)
        self._last_lsid, self._last_lsid_json = lsid, text
        return text

    def _source_times(self, seconds: int) -> bytes:
        """``source.ts_*`` of a clusterTime's seconds (cached: consecutive events share a second)."""
        if seconds != self._times_seconds:
            self._times_seconds, self._times = seconds, times(seconds * 1_000_000_000)
        return self._times

    def change_value(self, ctx: _Collection, change: Mapping[str, Any], op: str, seconds: int, position: Position,
                     block: bytes, now_ns: int) -> tuple[bytes, int | None]:  # fmt: skip
        get: Callable[[str], Any] = change.get
        fields = ctx.fields
        full = get("fullDocument")
        before = document_string(get("fullDocumentBeforeChange"), fields) if self._pre_image else NULL
        if get("operationType") == "update":
            after = document_string(full, fields) if self._update_full else NULL
            update_desc = update_description(get("updateDescription"), fields)
        else:
            after = document_string(full, fields) if op != "d" else NULL
            update_desc = NULL
        wall_ms = _wall_time_ms(get("wallTime"))
        lsid, txn_number = get("lsid"), get("txnNumber")
        return ctx.value_template % (
            before, after, update_desc,
            self._times if seconds == self._times_seconds else self._source_times(seconds),
            _NOT_SNAPSHOT, position.increment,
            NULL if lsid is None else self.session(lsid, txn_number),
            NULL if txn_number is None else b"%d" % txn_number,
            NULL if wall_ms is None else b"%d" % wall_ms,
            _OP_JSON[op], now_ns // 1_000_000, now_ns // 1_000, now_ns, block,
        ), wall_ms  # fmt: skip

    def read_around(self, template: bytes, markers: Iterable[str], position: Position, ts_ns: int,
                    now_ns: int) -> dict[str, tuple[bytes, bytes]]:  # fmt: skip
        source_times = times(ts_ns)
        around: dict[str, tuple[bytes, bytes]] = {}
        for marker in set(markers):
            whole = template % (
                NULL, AFTER_SLOT, NULL, source_times, _SNAPSHOT_JSON[marker], position.increment, NULL, NULL, NULL,
                _OP_JSON["r"], now_ns // 1_000_000, now_ns // 1_000, now_ns, NULL,
            )  # fmt: skip
            head, _, tail = whole.partition(AFTER_SLOT)
            around[marker] = (head, tail)
        return around

    def afters(self, documents: Sequence[Mapping[str, Any]]) -> list[bytes]:
        """Written in one pass (:func:`ejson.dumps_strings`)."""
        return ejson.dumps_strings(documents)


class _OplogValues:
    """The 1.x format (``envelope.legacy_value_template``): ``after``, ``patch``, ``filter``
    (:func:`legacy_parts`), ``source`` with ``stxnid``; every read is ``snapshot`` true."""

    slots: tuple[str | bytes, ...] = _LEGACY_WRITER_SLOTS
    renamed_last = False
    landing_parts = False
    landing_afters = True
    transactions = DEFAULT_FORMAT
    schema = staticmethod(envelope_schema_1x)
    template = staticmethod(legacy_value_template)
    key_id = staticmethod(key_id_json)
    heartbeat_schemas = staticmethod(_heartbeat_schemas)
    data_collection = staticmethod(_data_collection)
    transaction_ms = staticmethod(_cluster_ms)

    def __init__(self) -> None:
        self.transaction_id = _TransactionIds(transaction_id).of

    def session(self, lsid: Session | None, txn_number: int | None) -> bytes:
        """``source.stxnid`` (null outside a transaction)."""
        return orjson.dumps(self.transaction_id(lsid, txn_number))

    def change_value(self, ctx: _Collection, change: Mapping[str, Any], op: str, seconds: int, position: Position,
                     block: bytes, now_ns: int) -> tuple[bytes, int | None]:  # fmt: skip
        """The 1.x value has no ``wallTime``: None."""
        stxnid = self.session(change.get("lsid"), change.get("txnNumber"))
        after, patch, filter_ = legacy_parts(op, change, ctx.fields)
        return ctx.value_template % (
            after, patch, filter_, seconds * 1000, b"false", position.increment, stxnid, _OP_JSON[op],
            now_ns // 1_000_000, block,
        ), None  # fmt: skip

    def read_around(self, template: bytes, markers: Iterable[str], position: Position, ts_ns: int,
                    now_ns: int) -> dict[str, tuple[bytes, bytes]]:  # fmt: skip
        whole = template % (
            AFTER_SLOT, NULL, NULL, ts_ns // 1_000_000, b"true", position.increment, NULL, _OP_JSON["r"],
            now_ns // 1_000_000, NULL,
        )  # fmt: skip
        head, _, tail = whole.partition(AFTER_SLOT)
        return dict.fromkeys(markers, (head, tail))

    def afters(self, documents: Sequence[Mapping[str, Any]]) -> list[bytes]:
        return [legacy_after(doc) for doc in documents]


class _Debezium3Values:
    """The Debezium 3.x format (``debezium3.value_template``): the Java driver's texts (``debezium3``),
    ``source`` without ``rs`` and with ``ts_*`` of the event's ``wallTime``, reads marked as Debezium 3.x
    marks them (:func:`debezium3.read_source`), its own transaction records (:data:`debezium3.TRANSACTIONS`)
    and heartbeat schemas. The compiled module writes its landing parts, as in the default format."""

    slots: tuple[str | bytes, ...] = _DEBEZIUM3_WRITER_SLOTS
    renamed_last = True
    landing_parts = True
    landing_afters = True
    transactions = debezium3.TRANSACTIONS
    schema = staticmethod(debezium3.envelope_schema)
    template = staticmethod(debezium3.value_template)

    def __init__(self, options: EventOptions) -> None:
        self._pre_image = options.pre_image
        self._update_full = options.update_full
        self._last_lsid: tuple[Session | None, str, bytes] = (None, "", b"")  # an lsid, its text, that as a JSON string
        self.transaction_id = _TransactionIds(self._transaction_id).of

    @staticmethod
    def heartbeat_schemas() -> tuple[dict[str, Any], dict[str, Any]]:
        return debezium3.heartbeat_key_schema(), debezium3.heartbeat_value_schema()

    @staticmethod
    def data_collection(rs: str, db: str, coll: str) -> str:
        """``<db>.<coll>``."""
        return f"{db}.{coll}"

    @staticmethod
    def key_id(document_id: Any) -> bytes:
        return orjson.dumps(debezium3.key_id(document_id))

    def _lsid(self, lsid: Session) -> tuple[str, bytes]:
        """:func:`debezium3.lsid_json` of a session and that text as a JSON string (cached: a transaction's
        events share one session)."""
        last, text, json = self._last_lsid
        if lsid is not last and lsid != last:
            text = debezium3.lsid_json(lsid)
            json = orjson.dumps(text)
            self._last_lsid = (lsid, text, json)
        return text, json

    def session(self, lsid: Session, txn_number: int | None) -> bytes:
        """``source.lsid``: the session id document's strict JSON as a JSON string."""
        last = self._last_lsid
        return last[2] if lsid is last[0] else self._lsid(lsid)[1]

    def _transaction_id(self, lsid: Session, txn_number: int) -> str:
        """``<lsid as strict JSON>:<txnNumber>`` (the session's text shared with :meth:`session`'s cache)."""
        return f"{self._lsid(lsid)[0]}:{int(txn_number)}"

    @staticmethod
    def transaction_ms(wall_ms: int | None, seconds: int) -> int:
        """The event's ``wallTime``, else its clusterTime's."""
        return wall_ms if wall_ms is not None else seconds * 1000

    def change_value(self, ctx: _Collection, change: Mapping[str, Any], op: str, seconds: int, position: Position,
                     block: bytes, now_ns: int) -> tuple[bytes, int | None]:  # fmt: skip
        get: Callable[[str], Any] = change.get
        fields = ctx.fields
        wall_ms = _wall_time_ms(get("wallTime"))
        ts_ms = wall_ms if wall_ms is not None else seconds * 1000
        ts_ns = ts_ms * 1_000_000
        if ts_ns not in _INT64:
            raise ValueError(f"change event 'wallTime' of {wall_ms} ms makes a source.ts_ns past 64 bits")
        full = get("fullDocument")
        full = full if _is_document(full) else None
        before = debezium3.document_string(get("fullDocumentBeforeChange"), fields) if self._pre_image else NULL
        if get("operationType") == "update":
            after = debezium3.document_string(full, fields) if self._update_full else NULL
            update_desc = orjson.dumps(debezium3.update_description(get("updateDescription"), fields))
        else:
            after = debezium3.document_string(full, fields) if op != "d" else NULL
            update_desc = NULL
        lsid, txn_number = get("lsid"), get("txnNumber")
        return ctx.value_template % (
            before, after, update_desc, ts_ms, _NOT_SNAPSHOT, ts_ns // 1_000, ts_ns, position.increment,
            NULL if lsid is None else self.session(lsid, txn_number),
            NULL if txn_number is None else b"%d" % int(txn_number),
            NULL if wall_ms is None else b"%d" % wall_ms,
            _OP_JSON[op], now_ns // 1_000_000, block,
        ), wall_ms  # fmt: skip

    def read_around(self, template: bytes, markers: Iterable[str], position: Position, ts_ns: int,
                    now_ns: int) -> dict[str, tuple[bytes, bytes]]:  # fmt: skip
        around: dict[str, tuple[bytes, bytes]] = {}
        for marker in set(markers):
            read_ns, snapshot, ord_ = debezium3.read_source(marker, position, ts_ns)
            whole = template % (
                NULL, AFTER_SLOT, NULL, read_ns // 1_000_000, orjson.dumps(snapshot), read_ns // 1_000, read_ns, ord_,
                NULL, NULL, NULL, _OP_JSON["r"], now_ns // 1_000_000, NULL,
            )  # fmt: skip
            head, _, tail = whole.partition(AFTER_SLOT)
            around[marker] = (head, tail)
        return around

    def afters(self, documents: Sequence[Mapping[str, Any]]) -> list[bytes]:
        return [debezium3.document_string(doc, None) for doc in documents]


def _values(options: EventOptions) -> _Values:
    """The values writer of ``mongocdc.event.format``."""
    if options.event_format == "debezium_3x":
        return _Debezium3Values(options)
    if options.event_format == "oplog_1x":
        return _OplogValues()
    return _ChangeStreamsValues(options)


class EventConverter:
    """Turns one change stream document or snapshot document at a time into records.

    ``landing``: the records go to the Parquet landing (:func:`mongocdc_core.sinks.base.takes_landing_columns`),
    so the compiled writers also give the landing columns they write: snapshot chunks their ``after`` column
    (:attr:`RecordRun.afters`), change records their landing rows (:attr:`Record.parts`), appended to their
    collection's chunk of rows as the bytes are written; the sink then takes them as they are rather than
    reading them back out of the records' bytes.
    """

    def __init__(self, options: EventOptions, *, landing: bool = False) -> None:
        self.options = options
        self._values: _Values = _values(options)
        self._landing = landing and self._values.landing_afters
        self._landing_parts = landing and self._values.landing_parts
        self._serializer = Serializer(options.schemas_enable)
        self._transforms = FieldTransforms(
            options.field_exclude_list, options.field_renames, options.field_name_adjustment_mode,
            renamed_last=self._values.renamed_last,
        )
        self._collections: dict[tuple[str, str], _Collection] = {}
        self._tracker = (
            TransactionTracker(options, self._values.transactions) if options.provide_transaction_metadata else None
        )
        self._skipped = options.skipped_operations
        self._topics = options.topics()
        self.heartbeat_topic = self._topics.heartbeat_topic()
        heartbeat_key_schema_, heartbeat_value_schema_ = self._values.heartbeat_schemas()
        self._heartbeat_key = self._serializer.dumps(
            Serializer.schema_prefix(heartbeat_key_schema_), {"serverName": options.topic_prefix}
        )
        self._heartbeat_prefix = Serializer.schema_prefix(heartbeat_value_schema_)
        self._last_session: tuple[bytes | None, Session | None] = (None, None)  # a raw lsid's BSON and its decoded form
        self._pre_image = options.pre_image
        self._update_full = options.update_full
        self._tombstones = options.tombstones_on_delete
        self._now_ns = options.now_ns

    def transaction_id(self, lsid: Session | None, txn_number: int | None) -> str | None:
        """The id of an event's transaction (None outside one), as the format writes it in its records: the
        ``LastTransactionId`` metric's (Debezium's is the records' id: in 3.x ``source.lsid:txnNumber``)."""
        return self._values.transaction_id(lsid, txn_number)

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
        value_schema = self._values.schema(f"{schema_base}.Envelope")
        key_prefix = Serializer.schema_prefix(key_schema(f"{schema_base}.Key"))
        value_prefix = Serializer.schema_prefix(value_schema)
        fields = self._transforms.for_collection(db, coll)
        native_rules = raw.field_rules(fields)
        key_template_ = key_template(key_prefix if o.schemas_enable else b"")
        value_template_ = self._values.template(
            schema_prefix=value_prefix if o.schemas_enable else b"",
            version=o.connector_version,
            name=o.topic_prefix,
            rs=o.rs,
            db=db,
            collection=coll,
        )
        compiled = fields is None or native_rules is not None
        ctx = _Collection(
            db=db,
            coll=coll,
            namespace=f"{db}.{coll}",
            topic=topic,
            data_collection=self._values.data_collection(o.rs, db, coll),
            key_prefix=key_prefix,
            value_prefix=value_prefix,
            key_template=key_template_,
            value_template=value_template_,
            fields=fields,
            native_rules=native_rules,
            heads=(key_prefix, value_prefix) if o.schemas_enable else None,
            writer=raw.change_writer(value_template_, self._values.slots, key_template_, self._pre_image,
                                     self._update_full, o.event_format, native_rules) if compiled else None,  # fmt: skip
            landing=raw.change_landing(f"{db}.{coll}", (key_prefix, value_prefix) if o.schemas_enable else None)
            if self._landing_parts and compiled else None,
        )
        self._collections[(db, coll)] = ctx
        return ctx

    def convert_change(self, change: Mapping[str, Any], position: Position) -> list[Record]:
        """Records for one raw change stream document, in emission order.

        That is: transaction BEGIN/END records (with ``provide.transaction.metadata``), the data
        event, and a tombstone after a delete (unless ``tombstones.on.delete=false``). Operation
        types other than insert/update/replace/delete (drop, rename, invalidate, ...) and
        ``skipped.operations`` yield no records.
        """
        if type(change) is RawChange:
            header = change.header
            if header is not None:
                written = self._raw_change(change, header, position)
                if written is not None:
                    return written
            change = change.document()
        get: Callable[[str], Any] = change.get
        op_type = get("operationType")
        op = DATA_OPERATIONS.get(op_type) if type(op_type) is str else None
        if op is None:
            if not isinstance(op_type, str):
                raise ValueError(f"change event has no string 'operationType': {short(change)}")
            return []
        if op in self._skipped:
            return []
        ns = get("ns")
        try:
            ctx = self._collections[(ns["db"], ns["coll"])]
        except (KeyError, TypeError):
            if not _is_document(ns) or not isinstance(ns.get("db"), str) or not isinstance(ns.get("coll"), str):
                raise ValueError(f"{op_type} change event has no 'ns.db'/'ns.coll': {short(change)}") from None
            ctx = self._collection(ns["db"], ns["coll"])
        document_key = get("documentKey")
        if not _is_document(document_key) or "_id" not in document_key:
            raise ValueError(f"{op_type} change event has no 'documentKey._id': {short(change)}")
        full = get("fullDocument")
        desc = get("updateDescription")
        if op_type == "update":
            if not _is_document(desc):
                raise ValueError(f"update change event has no 'updateDescription' document: {short(change)}")
        elif op != "d" and not _is_document(full):
            raise ValueError(f"{op_type} change event has no 'fullDocument' document: {short(change)}")

        cluster_time = get("clusterTime")
        seconds = cluster_time.time if type(cluster_time) is Timestamp else position.seconds
        key = ctx.key_template % self._values.key_id(document_key["_id"])
        tracker = self._tracker
        value, wall_ms = self._values.change_value(ctx, change, op, seconds, position,
                                                   NULL if tracker is None else raw.BLOCK_MARK, self._now_ns())  # fmt: skip
        if tracker is None:
            return self._change_records([], ctx, op, key, value, position)
        records, value = self._observed(tracker, ctx, value, position, get("lsid"), get("txnNumber"), wall_ms, seconds)
        return self._change_records(records, ctx, op, key, value, position)

    def _observed(
        self, tracker: TransactionTracker, ctx: _Collection, value: bytes, position: Position, lsid: Any,
        txn_number: Any, wall_ms: int | None, seconds: int,
    ) -> tuple[list[Record], bytes]:
        """With ``provide.transaction.metadata``: the transaction's BEGIN/END records before an event,
        observed once its value is written, and that value with its block where :data:`raw.BLOCK_MARK`
        stands for it."""
        values = self._values
        records, block = tracker.observe(values.transaction_id(lsid, txn_number), ctx.data_collection, position,
                                         values.transaction_ms(wall_ms, seconds))  # fmt: skip
        head, _, tail = value.rpartition(raw.BLOCK_MARK)
        return records, head + (NULL if block is None else orjson.dumps(block)) + tail  # after the parts' ranges

    def _change_records(
        self, records: list[Record], ctx: _Collection, op: str, key: bytes, value: bytes, position: Position,
        parts: LandingParts | None = None,
    ) -> list[Record]:
        """``records`` (transaction boundaries) then the event's record and, after a delete, its tombstone
        (whose landing row follows the delete's when the delete has one)."""
        records.append(Record(ctx.topic, key, value, position, ctx.namespace, op, ctx.heads, parts))
        if op == "d" and self._tombstones:
            landing = ctx.landing
            row = None if parts is None or landing is None else landing.push_tombstone(
                key, position.seconds, position.increment, position.ordinal)  # fmt: skip
            records.append(Record(ctx.topic, key, None, position, ctx.namespace, None, ctx.heads, row))
        return records

    def session_of(self, change: RawChange) -> Session | None:
        """The decoded ``lsid`` of a raw event with a header, or None outside a transaction (cached:
        a transaction's events share one session)."""
        lsid_bson = change.header.lsid if change.header is not None else None
        if lsid_bson is None:
            return None
        last_bson, last = self._last_session
        if lsid_bson != last_bson:
            last = change.decode(lsid_bson)
            self._last_session = (lsid_bson, last)
        return last

    def _raw_change(self, change: RawChange, header: raw.Header, position: Position) -> list[Record] | None:
        """:meth:`convert_change` of a raw event with a header, its key and value written whole from
        the BSON by the collection's compiled writer; None when the Python path converts it (field
        rules only it applies, or a type or shape the writer leaves to Python, which also reports
        malformed events with their own message).

        Transaction BEGIN/END records are observed only once the writer has written the event (a
        fallback to the Python path must not count it twice): the writer leaves
        :data:`raw.BLOCK_MARK` where the block goes."""
        op = DATA_OPERATIONS.get(header.op_type)
        if op is None or op in self._skipped:
            return []
        db, coll = header.db, header.coll
        ctx = self._collections.get((db, coll)) or self._collection(db, coll)
        writer = ctx.writer
        if writer is None:
            return None
        lsid = None if header.lsid is None else self.session_of(change)
        session = None if lsid is None else self._values.session(lsid, header.txn_number)
        tracker = self._tracker
        mark = None if tracker is None else raw.BLOCK_MARK
        parts: LandingParts | None = None
        landing = ctx.landing
        if landing is not None:  # the same bytes, and their landing row, which the Parquet landing takes as it is
            landed = writer.write_landing(change.raw, header, position.increment, session, self._now_ns(), mark, landing,
                                          position.seconds, position.ordinal)  # fmt: skip
            if landed is None:
                return None
            key, value, wall_ms, parts = landed
        else:
            written = writer.write(change.raw, header, position.increment, session, self._now_ns(), mark)
            if written is None:
                return None
            key, value, wall_ms = written
        if tracker is None:
            return self._change_records([], ctx, op, key, value, position, parts)
        records, value = self._observed(tracker, ctx, value, position, lsid, header.txn_number, wall_ms, header.seconds)
        if parts is not None and landing is not None:  # its row is the last: its value with the block
            landing.replace_value(value)
        return self._change_records(records, ctx, op, key, value, position, parts)

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
        if snapshot_marker not in READ_SNAPSHOT_MARKERS:
            raise ValueError(
                f"snapshot marker must be one of {', '.join(sorted(READ_SNAPSHOT_MARKERS))}; got {snapshot_marker!r}"
            )
        if not isinstance(document, Mapping) or "_id" not in document:
            raise ValueError(f"snapshot document of {db}.{coll} has no '_id': {short(document)}")
        ts_ns = datetime_ns(ts) if ts is not None else position.seconds * 1_000_000_000
        return self._reads(self._collection(db, coll), [document], [snapshot_marker], position, ts_ns)[0]

    def convert_reads(
        self,
        documents: Sequence[Mapping[str, Any]],
        markers: Sequence[str],
        db: str,
        coll: str,
        position: Position,
        ts: datetime.datetime | None = None,
    ) -> Sequence[Record]:
        """:meth:`convert_read` of each document of a snapshot chunk (``markers`` one per document).

        The records are those of :meth:`convert_read` (one processing time for the chunk, in every
        format); the documents are written together (the default format: in one pass,
        :func:`ejson.dumps_strings`) and every record shares the bytes around its ``after``, which is
        what a snapshot of small documents spends its time on.
        :class:`RawDocuments` (a raw batch) are written straight from their BSON by the compiled module,
        into a :class:`RecordRun` (records made only when a consumer takes them).
        """
        if len(documents) != len(markers):
            raise ValueError(f"{len(documents)} snapshot documents of {db}.{coll} with {len(markers)} markers")
        plain = READ_SNAPSHOT_MARKERS.issuperset(markers)
        ts_ns = datetime_ns(ts) if ts is not None else position.seconds * 1_000_000_000
        if isinstance(documents, RawDocuments):
            ctx = self._collection(db, coll)
            if plain and (ctx.fields is None or ctx.native_rules is not None) and raw.native is not None and documents:
                return self._raw_reads(ctx, documents, markers, position, ts_ns)
            documents = documents.decoded()
        if not plain or not all(type(doc) is dict and "_id" in doc for doc in documents):
            return [self.convert_read(doc, db, coll, position, marker, ts) for doc, marker in zip(documents, markers, strict=True)]
        return self._reads(self._collection(db, coll), documents, markers, position, ts_ns)

    def _read_templates(
        self, ctx: _Collection, markers: Sequence[str], position: Position, ts_ns: int
    ) -> dict[str, tuple[bytes, bytes]]:
        """The value template's bytes before and after ``after``, per marker (one processing time)."""
        return self._values.read_around(ctx.value_template, markers, position, ts_ns, self._now_ns())

    def _reads(
        self, ctx: _Collection, documents: Sequence[Mapping[str, Any]], markers: Sequence[str], position: Position,
        ts_ns: int,
    ) -> list[Record]:
        """The records of checked reads: the documents written (in one pass where the format can), each
        record the value template's bytes (one pair per marker) around its ``after``."""
        fields = ctx.fields
        afters = self._values.afters([fields.document(doc) for doc in documents] if fields else documents)
        around = self._read_templates(ctx, markers, position, ts_ns)
        key_template, topic, namespace, key_id = ctx.key_template, ctx.topic, ctx.namespace, self._values.key_id
        if len(around) == 1:
            head, tail = around[markers[0]]
            values = [head + after + tail for after in afters]
        else:
            values = [around[marker][0] + after + around[marker][1] for marker, after in zip(markers, afters, strict=True)]
        return [
            Record(topic, key_template % key_id(doc["_id"]), value, position, namespace, "r")
            for doc, value in zip(documents, values, strict=True)
        ]

    def _raw_reads(
        self, ctx: _Collection, documents: RawDocuments, markers: Sequence[str], position: Position, ts_ns: int
    ) -> Sequence[Record]:
        """:meth:`_reads` of a raw batch, written by the compiled module (:func:`raw.read_records`)."""
        around = self._read_templates(ctx, markers, position, ts_ns)
        fields, afters, key_id = ctx.fields, self._values.afters, self._values.key_id

        def left_read(doc: Mapping[str, Any]) -> tuple[bytes, bytes]:
            return key_id(doc["_id"]), afters([fields.document(doc) if fields is not None else doc])[0]

        return raw.read_records(documents, markers, around, ctx.key_template, ctx.topic, ctx.namespace, position,
                                self.options.event_format, ctx.native_rules, left_read, ctx.heads, self._landing)  # fmt: skip

    def heartbeat_record(self, position: Position, ts_ms: int) -> Record:
        """A heartbeat on ``<topic.heartbeat.prefix><delimiter><topic.prefix>``.

        Call :meth:`flush` first when transaction metadata is on, so an open transaction ends.
        """
        value = self._serializer.dumps(self._heartbeat_prefix, {"ts_ms": int(ts_ms)})
        return Record(self.heartbeat_topic, self._heartbeat_key, value, position, None, None)

    def flush(self) -> list[Record]:
        """END of a transaction still open (nothing without ``provide.transaction.metadata``)."""
        return self._tracker.flush() if self._tracker is not None else []

    def end_transaction_before(self, cluster_time: Timestamp) -> list[Record]:
        """END of an open transaction when the stream has scanned up to ``cluster_time``, past the
        transaction's own clusterTime (none of its events can follow any more)."""
        return self._tracker.end_before(cluster_time) if self._tracker is not None else []
