"""The unit every sink, offset store and landing zone handles: one serialized Kafka record."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias, overload

from mongocdc_core.positions import Position

if TYPE_CHECKING:
    from mongocdc_native import Buffer, LandingRow


#: A change record's landing row (``mongocdc_native.LandingRow``), as a converter built for the Parquet
#: landing gives it with the record (``EventConverter(landing=True)``): the chunk of its collection's rows its
#: compiled writer appended it to (a ``mongocdc_native.ChangeLanding``), and its number there. Only the
#: compiled sink reads it (``mongocdc_native.take_rows``: a batch's consecutive rows of one chunk in one call).
LandingParts: TypeAlias = "LandingRow"


@dataclass(slots=True)
class Record:
    """A serialized change, tombstone, transaction or heartbeat record; treat it as immutable.

    Not a frozen dataclass only because a frozen one costs four times as much to create, once
    per event on the hot path; nothing may change a record after it was made (sinks share them).

    ``value`` None is a tombstone. ``collection`` is ``"<db>.<coll>"`` for data records and None for
    heartbeat/transaction records; ``op`` is ``c``/``u``/``d``/``r`` for data events (None for
    tombstones and metadata records). ``heads``, when given, are the schema parts the converter wrote
    the key and the value after (one tuple per collection, shared by its records): a sink that takes
    records apart (the Parquet landing) cuts their payloads there without comparing those bytes again.
    They say how the bytes were written, not what the record is: equality leaves them out, as it leaves out
    ``parts`` (:data:`LandingParts`), which a converter built for the Parquet landing gives change records.
    """

    topic: str
    key: bytes | None
    value: bytes | None
    position: Position
    collection: str | None
    op: str | None
    heads: tuple[bytes, bytes] | None = field(default=None, compare=False, repr=False)
    parts: LandingParts | None = field(default=None, compare=False, repr=False)


class RecordRun(Sequence[Record]):
    """Records sharing their topic, position, collection and op, whose keys and values lie end to end.

    A snapshot chunk's reads as the compiled converter writes them: no Python object per read until
    a consumer takes one (each access makes a :class:`Record`). The copier's threads convert chunks
    at the same time only where no GIL is held, so a per-read object there would serialise them;
    a sink that only counts, or writes in bulk, never pays for the objects at all.
    ``key_ends``/``value_ends`` are each record's end offset (native-endian u64 bytes). ``heads``: as
    :attr:`Record.heads`, for every record of the run. ``afters``, when given (a converter built for the
    Parquet landing), are the landing ``after`` column of the whole run as Arrow string buffers (i32
    offsets, data): each read's document text, which the converter wrote unescaped with the record.
    """

    __slots__ = ("topic", "position", "collection", "op", "heads", "afters", "_keys", "_values", "_key_ends",
                 "_value_ends", "_lo", "_hi")  # fmt: skip

    def __init__(
        self, topic: str, keys: bytes, key_ends: bytes | memoryview, values: bytes, value_ends: bytes | memoryview,
        position: Position, collection: str, op: str, lo: int = 0, hi: int | None = None,
        heads: tuple[bytes, bytes] | None = None, afters: tuple[Buffer, Buffer] | None = None,
    ) -> None:  # fmt: skip
        self.topic, self.position, self.collection, self.op, self.heads = topic, position, collection, op, heads
        self.afters = afters
        self._keys, self._values = keys, values
        self._key_ends = key_ends if isinstance(key_ends, memoryview) else memoryview(key_ends).cast("Q")
        self._value_ends = value_ends if isinstance(value_ends, memoryview) else memoryview(value_ends).cast("Q")
        if len(self._key_ends) != len(self._value_ends):
            raise ValueError(f"a record run needs one key end per value end: {len(self._key_ends)} and {len(self._value_ends)}")
        self._lo, self._hi = lo, len(self._key_ends) if hi is None else hi

    def __len__(self) -> int:
        return self._hi - self._lo

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Record]: ...

    def __getitem__(self, index: int | slice) -> Record | Sequence[Record]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return RecordRun(self.topic, self._keys, self._key_ends, self._values, self._value_ends, self.position,
                             self.collection, self.op, self._lo + start, self._lo + max(start, stop), self.heads,
                             self.afters)  # fmt: skip
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"record {index} of a run of {n}")
        i = self._lo + (index if index >= 0 else n + index)
        return Record(self.topic, self.key_at(i), self.value_at(i), self.position, self.collection, self.op, self.heads)

    def key_at(self, i: int) -> bytes:
        """The key of record ``i`` of the whole run (not counted from a slice's start)."""
        return self._keys[self._key_ends[i - 1] if i else 0 : self._key_ends[i]]

    def value_at(self, i: int) -> bytes:
        """The value of record ``i`` of the whole run (not counted from a slice's start)."""
        return self._values[self._value_ends[i - 1] if i else 0 : self._value_ends[i]]

    def buffers(self) -> tuple[bytes, bytes, bytes, bytes, int, int]:
        """Keys and values end to end with their end offsets (native-endian u64 bytes), and the range
        ``lo..hi`` of them this run covers: for a consumer that reads the records' bytes in bulk."""
        return self._keys, self._key_ends.tobytes(), self._values, self._value_ends.tobytes(), self._lo, self._hi

    def keys(self) -> list[bytes]:
        return [self.key_at(i) for i in range(self._lo, self._hi)]

    def values(self) -> list[bytes]:
        return [self.value_at(i) for i in range(self._lo, self._hi)]

    def __iter__(self) -> Iterator[Record]:
        topic, position, collection, op, heads = self.topic, self.position, self.collection, self.op, self.heads
        for key, value in zip(self.keys(), self.values(), strict=True):
            yield Record(topic, key, value, position, collection, op, heads)

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same records (a list of them, another run)."""
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # compares by content, like the list it stands for

    def __repr__(self) -> str:
        return f"RecordRun({len(self)} records of {self.collection} on {self.topic})"
