"""Snapshot documents kept as the server sent them: one raw batch, decoded only where needed.

A snapshot reads with pymongo's ``find_raw_batches`` and hands chunks of :class:`RawDocuments` on.
The converter writes their records straight from the BSON with the compiled ``mongocdc_native``
module (built by ``make setup`` from ``native/``); everything else (markers, the last key of a
chunk, a read the compiled path leaves to Python, or no compiled module at all) sees ordinary
documents, decoded with the collection's codec options exactly as a ``find`` cursor decodes them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any, overload

import bson
from bson.codec_options import CodecOptions


def _native() -> ModuleType | None:
    try:
        import mongocdc_native
    except ImportError:  # not built (e.g. installed without `make setup`): the Python path converts
        return None
    return mongocdc_native


#: The compiled conversion, or None when it was not built.
native = _native()


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

    Slicing shares the bytes; items are decoded on access with ``codec_options``.
    """

    __slots__ = ("bounds", "codec_options", "data", "hi", "lo")

    def __init__(self, data: bytes, codec_options: CodecOptions[dict[str, Any]], bounds: list[int] | None = None,
                 lo: int = 0, hi: int | None = None) -> None:
        self.data = data
        self.codec_options = codec_options
        self.bounds = _bounds(data) if bounds is None else bounds
        self.lo = lo
        self.hi = len(self.bounds) - 1 if hi is None else hi

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
                                self.lo + max(start, stop))
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
