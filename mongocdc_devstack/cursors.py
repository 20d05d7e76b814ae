"""Server-side cursors: the registry behind ``find``/``aggregate``, ``getMore`` and ``killCursors``.

Batches are assembled directly as BSON bytes: documents that are stored with their encoding are
copied, not re-encoded, which keeps draining a large collection cheap. A reply carries at most
``batchSize`` documents and at most 16 MiB of them (always at least one), as mongod does.
"""

from __future__ import annotations

import random
import struct
import threading
import time
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, Protocol

import bson
from bson import Int64
from bson.raw_bson import RawBSONDocument

from .errors import CURSOR_NOT_FOUND, command_error
from .wire import MAX_BSON_OBJECT_SIZE

IDLE_TIMEOUT_SECONDS = 600.0
DEFAULT_FIRST_BATCH = 101
_ELEMENT_HEADS: list[bytes] = []  # b"\x03<i>\x00": the head of array element i (a document)
_HEAD_OFFSETS: list[int] = [0]  # summed lengths of the first i heads
_MAX_CACHED_HEADS = 1 << 20


def _element_heads(count: int) -> list[bytes]:
    """Heads for array elements 0..count-1 (cached up to a million; batches are rarely longer)."""
    heads = _ELEMENT_HEADS
    if len(heads) < count:
        for i in range(len(heads), min(count, _MAX_CACHED_HEADS)):
            heads.append(b"\x03" + str(i).encode() + b"\x00")
            _HEAD_OFFSETS.append(_HEAD_OFFSETS[-1] + len(heads[-1]))
        if count > _MAX_CACHED_HEADS:
            return heads + [b"\x03" + str(i).encode() + b"\x00" for i in range(_MAX_CACHED_HEADS, count)]
    return heads


def _heads_size(heads: list[bytes], count: int) -> int:
    return _HEAD_OFFSETS[count] if count < len(_HEAD_OFFSETS) else sum(map(len, heads[:count]))


def cursor_document(
    cursor_id: int, ns: str, batch_key: str, batch: Sequence[bytes], extra: dict[str, Any] | None = None
) -> RawBSONDocument:
    """``{<batch_key>: [...], id, ns, ...extra}`` as raw BSON around already-encoded documents.

    The documents are copied once, by a single join: a 16 MiB change stream batch holds tens of
    thousands of events, so per-document concatenation would dominate the reply's cost.
    """
    count = len(batch)
    heads = _element_heads(count)
    array_size = 5 + _heads_size(heads, count) + sum(map(len, batch))
    key = b"\x04" + batch_key.encode() + b"\x00"
    tail = bson.encode({"id": Int64(cursor_id), "ns": ns, **(extra or {})})[4:-1]
    total = 4 + len(key) + array_size + len(tail) + 1
    return RawBSONDocument(
        b"".join(
            chain(
                (struct.pack("<i", total), key, struct.pack("<i", array_size)),
                chain.from_iterable(zip(heads, batch, strict=False)),  # heads may be longer
                (b"\x00", tail, b"\x00"),
            )
        )
    )


class Cursor(Protocol):
    ns: str

    @property
    def exhausted(self) -> bool: ...

    def next_batch(self, batch_size: int | None, max_time_ms: int | None) -> list[bytes]: ...

    def extra_fields(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class ListCursor:
    """A cursor over a precomputed result list (documents or their stored encodings)."""

    def __init__(self, ns: str, items: Sequence[Any], encode: Callable[[Any], bytes], limit: int = 0) -> None:
        self.ns = ns
        self._items = items
        self._encode = encode
        self._pos = 0
        self._end = len(items) if limit <= 0 else min(limit, len(items))
        # mongod knows a cursor is done when a batch came up short or its limit was reached; a
        # batch filled exactly to its size leaves the cursor open (the next getMore finds nothing).
        self._limited = 0 < limit <= len(items)
        self._done = False
        self.time_limited = False  # opened with maxTimeMS, which then limits each getMore too

    @property
    def exhausted(self) -> bool:
        return self._pos >= self._end and (self._done or self._limited)

    def next_batch(self, batch_size: int | None, max_time_ms: int | None) -> list[bytes]:
        count_limit = batch_size if batch_size and batch_size > 0 else self._end - self._pos
        stop = min(self._end, self._pos + count_limit)
        encode = self._encode
        out: list[bytes] = []
        budget = MAX_BSON_OBJECT_SIZE
        pos = self._pos
        while pos < stop:
            raw = encode(self._items[pos])
            if out and len(raw) > budget:
                break
            budget -= len(raw)
            out.append(raw)
            pos += 1
        self._pos = pos
        if pos >= self._end and not (batch_size and batch_size > 0 and len(out) >= batch_size):
            self._done = True
        return out

    def extra_fields(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self._items = ()
        self._pos = self._end = 0
        self._done = True


class TailableFindCursor:
    """A tailable find on a capped collection or ``local.oplog.rs``: it stays open at the end of the
    data, and with ``awaitData`` a getMore waits (up to its maxTimeMS, 1 s by default) for more.

    ``poll(limit)`` returns the next matching documents, encoded, and raises CappedPositionLost
    (136) once capping removed the position the cursor stood at, as mongod does.
    """

    def __init__(self, ns: str, poll: Callable[[int | None], list[bytes]], await_data: bool,
                 wait: Callable[[float], bool], done: Callable[[], bool]) -> None:  # fmt: skip
        self.ns = ns
        self._poll = poll
        self._await = await_data
        self._wait = wait  # blocks until something was written (True) or the time is up (False)
        self._done = done  # the find's limit was reached
        self._closed = False
        self.time_limited = False

    @property
    def exhausted(self) -> bool:
        return self._closed or self._done()

    def next_batch(self, batch_size: int | None, max_time_ms: int | None) -> list[bytes]:
        try:
            batch = self._poll(batch_size if batch_size and batch_size > 0 else None)
            if batch or not self._await or not max_time_ms:
                return batch
            deadline = time.monotonic() + max_time_ms / 1000.0
            while not batch:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._wait(remaining):
                    break
                batch = self._poll(batch_size if batch_size and batch_size > 0 else None)
            return batch
        except Exception:
            self._closed = True
            raise

    def extra_fields(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self._closed = True


class ChangeStreamSource(Protocol):
    """What ``changestream.open_change_stream`` returns (see the emulator contract)."""

    @property
    def closed(self) -> bool: ...

    @property
    def post_batch_resume_token(self) -> dict[str, Any]: ...

    def next_batch(self, batch_size: int | None, max_time_ms: int | None) -> list[bytes]: ...


class TailableCursor:
    """A tailable-await cursor over a change stream: getMore waits up to maxTimeMS for events."""

    def __init__(self, ns: str, source: ChangeStreamSource) -> None:
        self.ns = ns
        self.source = source

    @property
    def exhausted(self) -> bool:
        return self.source.closed

    def next_batch(self, batch_size: int | None, max_time_ms: int | None) -> list[bytes]:
        return self.source.next_batch(batch_size, max_time_ms)

    def extra_fields(self) -> dict[str, Any]:
        return {"postBatchResumeToken": self.source.post_batch_resume_token}

    def close(self) -> None:
        """Nothing to release: the source only reads the shared oplog."""


class CursorRegistry:
    """Open cursors by id (positive Int64, never 0); idle ones expire after ten minutes."""

    def __init__(self, idle_timeout: float = IDLE_TIMEOUT_SECONDS) -> None:
        self._lock = threading.Lock()
        self._cursors: dict[int, tuple[Cursor, float]] = {}
        self._idle_timeout = idle_timeout
        self._busy: set[int] = set()

    def register(self, cursor: Cursor) -> int:
        with self._lock:
            self._expire()
            while True:
                cursor_id = random.randint(1, 2**62)
                if cursor_id not in self._cursors:
                    break
            self._cursors[cursor_id] = (cursor, time.monotonic())
            return cursor_id

    def checkout(self, cursor_id: int, ns: str) -> Cursor:
        """Take a cursor for one getMore (mongod's errors for unknown ids or wrong namespaces)."""
        with self._lock:
            self._expire()
            found = self._cursors.get(cursor_id)
            if found is None or cursor_id in self._busy:
                raise command_error(CURSOR_NOT_FOUND, f"cursor id {cursor_id} not found")
            cursor = found[0]
            if cursor.ns != ns:
                raise command_error(
                    (13, "Unauthorized"),
                    f"Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {cursor.ns}",
                )
            self._busy.add(cursor_id)
            return cursor

    def release(self, cursor_id: int, cursor: Cursor) -> None:
        with self._lock:
            self._busy.discard(cursor_id)
            if cursor_id in self._cursors:
                if cursor.exhausted:
                    del self._cursors[cursor_id]
                else:
                    self._cursors[cursor_id] = (cursor, time.monotonic())

    def is_tailable(self, cursor_id: int) -> bool:
        with self._lock:
            found = self._cursors.get(cursor_id)
            return found is not None and isinstance(found[0], TailableCursor)

    def kill(self, cursor_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        killed: list[int] = []
        missing: list[int] = []
        with self._lock:
            for cursor_id in cursor_ids:
                found = self._cursors.pop(int(cursor_id), None)
                if found is None:
                    missing.append(int(cursor_id))
                else:
                    found[0].close()
                    killed.append(int(cursor_id))
        return killed, missing

    def clear(self) -> None:
        with self._lock:
            for cursor, _ in self._cursors.values():
                cursor.close()
            self._cursors.clear()

    def __len__(self) -> int:
        return len(self._cursors)

    def _expire(self) -> None:
        deadline = time.monotonic() - self._idle_timeout
        stale = [cid for cid, (_, used) in self._cursors.items() if used < deadline and cid not in self._busy]
        for cursor_id in stale:
            self._cursors.pop(cursor_id)[0].close()
