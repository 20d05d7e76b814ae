"""mongocdc's compiled conversion of snapshot reads and change events (the crate in ``native/``)."""

def document_bounds(data: bytes) -> list[int]:
    """Start offsets of the BSON documents laid end to end in ``data``, then its length."""

def convert_reads(
    data: bytes,
    bounds: list[int],
    lo: int,
    hi: int,
    key_head: bytes,
    key_tail: bytes,
    value_head: bytes,
    value_tail: bytes,
    printable: bytes | None = None,
    rules: FieldRules | None = None,
    legacy: bool = False,
    landing: bool = False,
) -> tuple[bytes, bytes, bytes, bytes, list[int], tuple[Buffer, Buffer] | None]:
    """The reads ``lo..hi`` as one run: keys end to end, their end offsets (native-endian u64), values
    end to end, their end offsets, the indexes (from ``lo``) left to the Python path (empty), and with
    ``landing`` the landing ``after`` column (i32 offsets, data: each read's document text, unescaped as
    it is written; an empty row for a read left to Python; None when a column cannot hold it).
    With ``printable`` (``javajson.printable_bitmap()``) the key ids and ``after`` are Debezium 3.x's,
    with ``legacy`` the 1.x format's."""

def cursor_batch(reply: bytes) -> tuple[int, bytes, list[int], tuple[int, int] | None]:
    """Cursor id of a raw ``find``/``getMore`` reply, its batch's documents end to end, their bounds,
    and the cursor's ``atClusterTime`` as (time, inc)."""

class ChangeHeader:
    """What the stream reader and the dispatcher need of an ordinary change event."""

    token: str
    op_type: str
    db: str
    coll: str
    seconds: int
    increment: int
    txn_number: int | None
    lsid: bytes | None

def change_header(raw: bytes) -> ChangeHeader | None:
    """The header of an ordinary change event; None for a split fragment or any other shape."""

def document_member(raw: bytes, name: str) -> bytes | None:
    """The BSON of the top-level embedded document ``name`` of ``raw`` (the last when repeated), or None."""

class ChangeWriter:
    """One collection's change records in one format, written whole from an event's BSON: the value
    template's ``pieces`` around its ``slots`` (one letter each, see ``raw.change_writer``), the key
    template's head and tail; with ``printable`` (``javajson.printable_bitmap()``) Debezium 3.x's parts,
    with ``legacy`` the 1.x format's (``after``, ``patch``, ``filter``)."""

    def __init__(
        self,
        pieces: list[bytes],
        slots: str,
        key_head: bytes,
        key_tail: bytes,
        pre_image: bool,
        update_full: bool,
        printable: bytes | None = None,
        rules: FieldRules | None = None,
        legacy: bool = False,
    ) -> None: ...
    def write(
        self,
        raw: bytes,
        header: ChangeHeader,
        increment: int,
        lsid: bytes | None,
        now_ns: int,
        block: bytes | None,
    ) -> tuple[bytes, bytes, int | None] | None:
        """(key, value, ``wallTime`` ms) of an ordinary change event at a position of ``increment``;
        None when the Python path writes it."""
    def write_landing(
        self,
        raw: bytes,
        header: ChangeHeader,
        increment: int,
        lsid: bytes | None,
        now_ns: int,
        block: bytes | None,
        into: ChangeLanding,
        seconds: int,
        ordinal: int,
    ) -> tuple[bytes, bytes, int | None, LandingRow | None] | None:
        """``write`` of the default or the Debezium 3.x format (ValueError in the 1.x format), also appending
        the record's landing row at position (``seconds``, ``increment``, ``ordinal``) to ``into``, taken from
        the parts as they are written: (key, value, ``wallTime`` ms, its row or None when ``into`` could not
        take it)."""

class FieldRules:
    """One collection's field exclusions and renames (``CollectionFields.compiled_rules``)."""

    def __init__(self, rules: list[tuple[list[str], str | None]], renamed_last: bool) -> None: ...

class Buffer:
    """A column buffer the landing walk wrote, lent through the buffer protocol (``pa.py_buffer`` wraps
    it without a copy); integers in the machine's byte order, as Arrow reads them."""

    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __len__(self) -> int: ...

_Strings = tuple[Buffer, Buffer, Buffer, int]

#: Landing columns as Arrow buffers: key, value (payload text), ts_ms, before, after, updatedFields,
#: removedFields, truncatedArrays (raw JSON), source.snapshot, source (raw JSON). A string column is
#: (i32 offsets, data, validity, null count); ts_ms (i64 values, validity, null count); removedFields
#: (list offsets, validity, null count, item strings); every buffer a :class:`Buffer`.
LandingColumns = tuple[
    _Strings,
    _Strings,
    tuple[Buffer, Buffer, int],
    _Strings,
    _Strings,
    _Strings,
    tuple[Buffer, Buffer, int, _Strings],
    _Strings,
    _Strings,
    _Strings,
]

def landing_columns(
    keys: list[bytes | None],
    key_head: bytes | None,
    values: list[bytes | None],
    value_head: bytes | None,
    framed: bool = False,
) -> LandingColumns | None:
    """Landing columns of one topic's records, each cut after its topic's schema part when it starts with
    it; None when Arrow's JSON reader must parse. ``framed``: the caller vouches that every key and value
    starts with its head (the converter wrote them so), which is then not compared."""

def run_landing_columns(
    keys: bytes,
    key_ends: bytes,
    values: bytes,
    value_ends: bytes,
    lo: int,
    hi: int,
    key_head: bytes | None,
    value_head: bytes | None,
    framed: bool = False,
) -> LandingColumns | None:
    """``landing_columns`` of records ``lo..hi`` laid end to end (a snapshot chunk's run), each record's end
    offset given as native-endian u64 bytes."""

#: A chunk's rows as ``take_rows`` gives them: the chunk's row count, its collection, its payload columns,
#: its positions' seconds, increments and ordinals (i64 buffers), their texts and the operations (strings).
ChangeRows = tuple[int, str, LandingColumns, tuple[Buffer, Buffer, Buffer], _Strings, _Strings]

class LandingRow:
    """A change record's landing row (``Record.parts``): its chunk and its number there."""

class ChangeLanding:
    """One collection's landing rows (``collection``: ``db.coll``), appended chunk after chunk by
    ``ChangeWriter.write_landing`` as it writes the change records (and ``push_tombstone``), taken by the
    Parquet sink as Arrow buffers (``take_rows``, which freezes a chunk: the next rows go to a new one of its
    size). ``key_head``/``value_head``: the schema parts' lengths (None: no schemas)."""

    def __init__(self, collection: str, key_head: int | None, value_head: int | None) -> None: ...
    def push_tombstone(self, key: bytes, seconds: int, increment: int, ordinal: int) -> LandingRow | None:
        """Appends a tombstone's row; it, or None when the chunk cannot take it."""
    def replace_value(self, value: bytes) -> None:
        """Writes ``value`` over the value of the last row written (the transaction block written in)."""

def take_rows(parts: list[object]) -> list[tuple[ChangeRows, int, int]] | None:
    """The landing rows of a batch of one topic's change records (their ``LandingRow``) as runs of consecutive
    rows of one chunk: (the chunk's rows, first row, end row), in the records' order; None when a record has
    none or a chunk could not write one (the sink then walks the records)."""

def run_payloads(
    keys: bytes,
    key_ends: bytes,
    values: bytes,
    value_ends: bytes,
    lo: int,
    hi: int,
    key_head: int,
    value_head: int,
) -> tuple[_Strings, _Strings] | None:
    """The key and value payload columns of records ``lo..hi`` of a run the converter wrote: each cut after
    its schema part of ``key_head`` / ``value_head`` bytes (not compared) and before its closing brace; None
    when a record is too short for that."""
