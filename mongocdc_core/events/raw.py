"""Snapshot documents and change events kept as the server sent them, decoded only where needed.

A snapshot reads raw batches and hands chunks of :class:`RawDocuments` on; the change stream
reader receives each event as a :class:`RawChange`. The converter writes their records straight
from the BSON with the compiled ``mongocdc_native`` module (built by ``make setup`` from
``native/``); everything else (markers, the last key of a chunk, a signal, a split event, a read
or event the compiled path leaves to Python, or no compiled module at all) sees ordinary
documents, decoded with the stream's or collection's codec options exactly as pymongo decodes them.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, ItemsView, Iterator, Mapping, Sequence
from itertools import repeat
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, overload

import bson
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from mongocdc_core.events import javajson
from mongocdc_core.events.changes import short
from mongocdc_core.events.envelope import AFTER_SLOT
from mongocdc_core.events.records import LandingParts, Record, RecordRun
from mongocdc_core.events.transforms import CollectionFields
from mongocdc_core.positions import Position

if TYPE_CHECKING:
    from mongocdc_native import ChangeLanding


def _native() -> tuple[ModuleType | None, str]:
    try:
        import mongocdc_native
    except ImportError as exc:  # not installed for this platform: the Python path converts
        return None, str(exc)
    return mongocdc_native, ""


#: The compiled conversion, or None when it is not installed (and why not).
native, _native_missing = _native()
_said = False


def say_if_python_path() -> None:
    """One warning line per process, when a run starts, if the compiled conversion is missing."""
    global _said
    if native is None and not _said:
        _said = True
        logging.getLogger("mongocdc").warning(
            "mongocdc_native (the compiled conversion) is not available (%s): converting in Python, "
            "the same bytes, several times slower per document; install the mongocdc-native wheel for this platform "
            "or build it where Rust is present (pip install mongocdc-native)", _native_missing)

#: How a change event's BSON starts after its length: its resume token, ``_id``, a document.
_EVENT_START = b"\x03_id\x00"


def _bounds(data: bytes) -> list[int]:
    """Start offsets of the documents of a raw batch, then its length."""
    if native is not None:
        return native.document_bounds(data)
    bounds, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 4], "little", signed=True)
        if size < 5 or at + size > len(data):
            raise ValueError(f"BSON document at byte {at} declares {size} bytes; {len(data) - at} remain")
        bounds.append(at)
        at += size
    bounds.append(len(data))
    return bounds


class RawDocuments(Sequence[dict[str, Any]]):
    """Documents ``lo..hi`` of raw BSON ``data`` (starts at ``bounds``), as a sequence of dicts.

    Slicing shares the bytes (and ``asked``); items are decoded on access with ``codec_options``. ``asked``:
    the connection losses counted when the batch was asked for (``SnapshotChunk.asked``), None when unknown.
    """

    __slots__ = ("asked", "bounds", "codec_options", "data", "hi", "lo")

    def __init__(self, data: bytes, codec_options: CodecOptions[dict[str, Any]], bounds: list[int] | None = None,
                 lo: int = 0, hi: int | None = None, asked: int | None = None) -> None:
        self.data = data
        self.codec_options = codec_options
        self.bounds = _bounds(data) if bounds is None else bounds
        self.lo = lo
        self.hi = len(self.bounds) - 1 if hi is None else hi
        self.asked = asked

    def __len__(self) -> int:
        return self.hi - self.lo

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> RawDocuments: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | RawDocuments:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("raw documents slice only with step 1")
            return RawDocuments(self.data, self.codec_options, self.bounds, self.lo + start,
                                self.lo + max(start, stop), self.asked)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"document {index} of {len(self)}")
        i = self.lo + index
        return bson.decode(self.data[self.bounds[i] : self.bounds[i + 1]], self.codec_options)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.decoded())

    def raw(self, index: int) -> bytes:
        """The BSON of one document."""
        i = self.lo + index
        return self.data[self.bounds[i] : self.bounds[i + 1]]

    def decoded(self) -> list[dict[str, Any]]:
        """All documents, decoded."""
        return bson.decode_all(self._bytes(), self.codec_options) if len(self) else []

    def _bytes(self) -> bytes:
        if self.lo == 0 and self.hi == len(self.bounds) - 1:
            return self.data
        return self.data[self.bounds[self.lo] : self.bounds[self.hi]]


#: ``mongocdc_native.FieldRules``: a handle the converters pass back to the module as it is (typed
#: opaquely, so that type checks do not depend on which build of the module is installed).
FieldRules = object


def field_rules(fields: CollectionFields | None) -> FieldRules | None:
    """A collection's field rules as the compiled module applies them (None: no rules, no module, or
    rules only the Python path applies: see ``CollectionFields.compiled_rules``)."""
    if fields is None or native is None:
        return None
    rules = fields.compiled_rules()
    return None if rules is None else native.FieldRules(rules, fields.renamed_last)


class ChangeWriter(Protocol):
    """``mongocdc_native.ChangeWriter`` as the converters call it: one collection's change records in one
    format, written whole from an event's BSON."""

    def write(self, raw: bytes | memoryview, header: Header, increment: int, lsid: bytes | None, now_ns: int,
              block: bytes | None) -> tuple[bytes, bytes, int | None] | None:
        """(key, value, ``wallTime`` ms) of an ordinary change event; None when the Python path writes it."""

    def write_landing(self, raw: bytes | memoryview, header: Header, increment: int, lsid: bytes | None, now_ns: int,
                      block: bytes | None, into: ChangeLanding, seconds: int, ordinal: int,
                      ) -> tuple[bytes, bytes, int | None, LandingParts | None] | None:  # fmt: skip
        """``write`` of the default or the Debezium 3.x format, also appending the record's landing row at position
        (``seconds``, ``increment``, ``ordinal``) to ``into``: that row, or None when ``into`` could not take it."""


def change_landing(collection: str, heads: tuple[bytes, bytes] | None) -> ChangeLanding | None:
    """The landing rows of ``collection`` (``db.coll``), whose keys and values are written after ``heads``
    (their schema parts; None: no schemas), for its compiled writer to fill (None without the module)."""
    if native is None:
        return None
    key_head, value_head = (None, None) if heads is None else (len(heads[0]), len(heads[1]))
    return native.ChangeLanding(collection, key_head, value_head)

#: Template slots written with ``%d`` (the others with ``%b``); see ``ChangeWriter`` for the letters.
_INT_SLOTS = frozenset("iSEFGMUN")
_SLOT_MARK = b"\x00slot\x00"  # a NUL byte: never in JSON text
_INT_SLOT_MARK = 918_273_645_918_273_645
_SLOT_SPLIT = re.compile(re.escape(_SLOT_MARK) + b"|" + str(_INT_SLOT_MARK).encode())
#: What the writer puts in the ``transaction`` slot (``k``) when the block is known only after the
#: event's parts: a NUL byte, never in JSON text, so the one occurrence is that slot.
BLOCK_MARK = b"\x00block\x00"


class _PartsFormat(TypedDict, total=False):
    """The keywords that tell the compiled module a format other than the default."""

    printable: bytes
    legacy: bool


def _parts_format(event_format: str) -> _PartsFormat:
    """How the compiled module is told to write the parts of ``mongocdc.event.format``'s records."""
    if event_format == "debezium_3x":
        return {"printable": javajson.printable_bitmap()}
    return {"legacy": True} if event_format == "oplog_1x" else {}


def change_writer(
    value_template: bytes, slots: Sequence[str | bytes], key_template: bytes, pre_image: bool, update_full: bool,
    event_format: str, rules: FieldRules | None,
) -> ChangeWriter | None:
    """The compiled writer of a collection's change records in ``event_format`` (None without the
    compiled module).

    ``value_template`` is the format's value template; ``slots`` names what fills each of its slots
    in order: a letter of ``mongocdc_native.ChangeWriter``, or the bytes of a constant.
    """
    if native is None:
        return None
    filled = value_template % tuple(
        slot if isinstance(slot, bytes) else _INT_SLOT_MARK if slot in _INT_SLOTS else _SLOT_MARK for slot in slots
    )
    letters = "".join(slot for slot in slots if isinstance(slot, str))
    pieces = _SLOT_SPLIT.split(filled)
    if len(pieces) != len(letters) + 1:
        raise ValueError(f"value template of {len(pieces) - 1} slots for {letters!r}")
    key_head, _, key_tail = (key_template % AFTER_SLOT).partition(AFTER_SLOT)
    return native.ChangeWriter(pieces, letters, key_head, key_tail, pre_image, update_full, rules=rules,
                               **_parts_format(event_format))


def read_records(
    documents: RawDocuments, markers: Sequence[str], around: Mapping[str, tuple[bytes, bytes]], key_template: bytes,
    topic: str, namespace: str, position: Position, event_format: str, rules: FieldRules | None,
    left_read: Callable[[Mapping[str, Any]], tuple[bytes, bytes]], heads: tuple[bytes, bytes] | None = None,
    landing: bool = False,
) -> Sequence[Record]:
    """The ``r`` records of a raw batch, written from the BSON by the compiled module in
    ``event_format`` (``mongocdc.event.format``), with the collection's field ``rules`` (:func:`field_rules`).

    Each value is the template bytes ``around`` its ``after`` (a pair per marker), each key the
    ``key_template`` around its id. Every record is written with the pair of the chunk's inner
    marker into one :class:`RecordRun` (no object per read). Only a chunk with a read of another
    marker (a collection's first or last) or a read the module leaves to Python (a type it does
    not write) becomes a list: those reads get their own pair around the same ``after``, or are
    decoded and written by ``left_read`` (key id and ``after`` as JSON strings). ``heads``: the schema
    parts the templates start with (:attr:`Record.heads`), given to the run. With ``landing``, the run also
    carries its landing ``after`` column (:attr:`RecordRun.afters`), written with the records.
    """
    assert native is not None
    common = markers[len(markers) // 2]  # the copier marks only a chunk's first and last reads
    head, tail = around[common]
    key_head, _, key_tail = (key_template % AFTER_SLOT).partition(AFTER_SLOT)
    keys, key_ends, values, value_ends, left, afters = native.convert_reads(
        documents.data, documents.bounds, documents.lo, documents.hi, key_head, key_tail, head, tail, rules=rules,
        landing=landing, **_parts_format(event_format),
    )
    run = RecordRun(topic, keys, key_ends, values, value_ends, position, namespace, "r", heads=heads, afters=afters)
    if not left and markers.count(common) == len(markers):
        return run
    key_list: list[bytes] = run.keys()
    value_list: list[bytes | None] = list(run.values())
    for i in left:
        value_list[i] = None
    for i, marker in enumerate(markers):
        value = value_list[i]
        if marker != common and value is not None:
            other_head, other_tail = around[marker]
            value_list[i] = other_head + value[len(head) : len(value) - len(tail)] + other_tail
    for i in left:
        doc = documents[i]
        if "_id" not in doc:
            raise ValueError(f"snapshot document of {namespace} has no '_id': {short(doc)}")
        other_head, other_tail = around[markers[i]]
        key_id, after = left_read(doc)
        key_list[i] = key_template % key_id
        value_list[i] = other_head + after + other_tail
    # map over the lists (not a comprehension): a third less time per record, most of it GIL-held
    return list(map(Record, repeat(topic), key_list, value_list, repeat(position), repeat(namespace), repeat("r"),
                    repeat(heads)))  # every template starts with the same schema parts


class Header(Protocol):
    """What the reader and the dispatcher need of an ordinary raw event, read by the compiled module
    (``mongocdc_native.ChangeHeader``): its fields by name."""

    @property
    def token(self) -> str:
        """The resume token's ``_data``."""
    @property
    def op_type(self) -> str: ...
    @property
    def db(self) -> str: ...
    @property
    def coll(self) -> str: ...
    @property
    def seconds(self) -> int:
        """clusterTime's time."""
    @property
    def increment(self) -> int:
        """clusterTime's increment."""
    @property
    def txn_number(self) -> int | None:
        """A transaction's ``txnNumber`` (None outside one)."""
    @property
    def lsid(self) -> bytes | None:
        """A transaction's ``lsid`` as its BSON (None outside one)."""

#: The last raw codec options seen and their plain (dict) counterpart: a stream keeps one.
_plain_options: tuple[CodecOptions[Any] | None, CodecOptions[dict[str, Any]] | None] = (None, None)


def _plain(options: CodecOptions[Any]) -> CodecOptions[dict[str, Any]]:
    global _plain_options
    raw_options, plain = _plain_options
    if raw_options is not options or plain is None:
        plain = options.with_options(document_class=dict)
        _plain_options = (options, plain)
    return plain


class RawChange(RawBSONDocument):
    """A change event as the server sent it: the change stream's document class.

    pymongo makes one per event of a batch without decoding it. ``header`` (:class:`Header`) is what
    the reader and the dispatcher need, read by the compiled module: the resume token's ``_data``,
    operationType, ns.db, ns.coll, clusterTime, txnNumber and lsid as BSON, the last two None
    outside a transaction; it is None for an event of another shape (a split fragment, a token with
    ``_typeBits``, no ``ns.coll`` or ``clusterTime`` as after a dropDatabase or an invalidate, or
    no compiled module), which the reader decodes at once (``document()``, as pymongo would have
    decoded it). Server replies decoded with this class (the batches pymongo reads, error
    replies) have no header either and behave as a RawBSONDocument.
    """

    __slots__ = ("_decoded", "_options", "header")

    def __init__(self, bson_bytes: bytes | memoryview, codec_options: CodecOptions[Any] | None = None) -> None:
        if native is not None and type(bson_bytes) is not bytes and bson_bytes[4:9] == _EVENT_START:
            # pymongo hands a document of 4 KiB or more over as a memoryview of its reply: an event
            # gets bytes of its own, so that the compiled module reads it (and the reply can go).
            bson_bytes = bytes(bson_bytes)
        header = native.change_header(bson_bytes) if native is not None and type(bson_bytes) is bytes else None
        if header is None:
            super().__init__(bson_bytes, codec_options)
        else:
            # What RawBSONDocument.__init__ sets, without its checks of the options and the length
            # (half of this constructor's cost, paid per event): the compiled module has just checked
            # the document's length and walked all of it, and the options are the stream's own.
            self._RawBSONDocument__raw = bson_bytes
            self._RawBSONDocument__inflated_doc = None
            self._RawBSONDocument__codec_options = codec_options
        self._options = codec_options
        self._decoded: dict[str, Any] | None = None
        self.header: Header | None = header

    def document(self) -> dict[str, Any]:
        """The event decoded with the stream's own codec options (document class ``dict``)."""
        if self._decoded is None:
            self._decoded = self.decode(self.raw)
        return self._decoded

    def decode(self, data: bytes | memoryview) -> dict[str, Any]:
        """A document of this event (such as its ``lsid``) decoded as the event would be."""
        return bson.decode(data, _plain(self._options) if self._options is not None else CodecOptions())

    @property
    def cluster_time(self) -> Timestamp | None:
        if self.header is not None:
            return Timestamp(self.header.seconds, self.header.increment)
        value = self.document().get("clusterTime")
        return value if isinstance(value, Timestamp) else None

    # With a header, mapping access sees the decoded event (the resume token pymongo reads from each
    # event without decoding it). Without one (a server reply holding a batch, a post-batch token,
    # an event the reader decodes at once) it is a RawBSONDocument: pymongo reads replies this way.

    def __getitem__(self, key: str) -> Any:
        if self.header is None:
            return super().__getitem__(key)
        if key == "_id":
            return {"_data": self.header.token}
        return self.document()[key]

    def __iter__(self) -> Iterator[str]:
        return super().__iter__() if self.header is None else iter(self.document())

    def __len__(self) -> int:
        return super().__len__() if self.header is None else len(self.document())

    def items(self) -> ItemsView[str, Any]:
        return super().items() if self.header is None else self.document().items()

    def __repr__(self) -> str:
        """The decoded document (an error reply's repr goes into the driver's error message)."""
        try:
            return repr(self.document())
        except Exception:  # noqa: BLE001 - undecodable: the raw bytes
            return super().__repr__()

    def key_id(self) -> Any:
        """The event's ``documentKey._id``, decoding only the ``documentKey`` (None when absent)."""
        if native is not None and type(self.raw) is bytes:
            member = native.document_member(self.raw, "documentKey")
            return self.decode(member).get("_id") if member is not None else None
        key = self.document().get("documentKey")
        return key.get("_id") if isinstance(key, Mapping) else None

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        """A decoded copy (pymongo deep-copies resume tokens, a post-batch one decoded as this class)."""
        return copy.deepcopy(self.document(), memo)


def plain(change: Mapping[str, Any]) -> Mapping[str, Any]:
    """A change event as a decoded mapping (a :class:`RawChange` decoded; anything else as it is)."""
    return change.document() if type(change) is RawChange else change


def change_namespace(change: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(ns.db, ns.coll)`` of a change event (None where absent), without decoding an ordinary raw one."""
    if type(change) is RawChange and change.header is not None:
        return change.header.db, change.header.coll
    ns = change.get("ns")
    return (ns.get("db"), ns.get("coll")) if isinstance(ns, Mapping) else (None, None)
