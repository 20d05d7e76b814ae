"""The emulated ``local.oplog.rs``: a capped, time-ordered log of every write.

Everything that reads history (change streams, ``find`` on the oplog, persistence) reads this
one structure, so ordering, capping and truncation are decided in a single place. Writers hold
``Oplog.cond`` while they assign timestamps, apply a write and append its entries, which makes
the order of the log the order of the writes; readers wait on the same condition for new entries.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import bson
from bson import Timestamp

TsKey = tuple[int, int]


def ts_key(ts: Timestamp) -> TsKey:
    """A sortable tuple for a BSON timestamp."""
    return (ts.time, ts.inc)


class ClusterClock:
    """Issues strictly increasing cluster times, as mongod's logical clock does."""

    def __init__(self, start: Timestamp | None = None) -> None:
        self._last: TsKey = ts_key(start) if start is not None else (0, 0)

    def next(self) -> Timestamp:
        now = int(time.time())
        seconds, inc = self._last
        self._last = (now, 1) if now > seconds else (seconds, inc + 1)
        return Timestamp(*self._last)

    def current(self) -> Timestamp:
        """The latest issued time (or now, if nothing was issued yet this second)."""
        seconds, inc = self._last
        if seconds == 0:
            return Timestamp(int(time.time()), 0)
        return Timestamp(seconds, inc)

    def advance_to(self, ts: Timestamp) -> None:
        """Never issue a time at or before ``ts`` (used when reloading a persisted oplog)."""
        if ts_key(ts) > self._last:
            self._last = ts_key(ts)


class Oplog:
    """A capped list of oplog entries (mongod's field layout), ordered by ``ts``.

    ``max_bytes`` caps the summed BSON size of the entries, like ``--oplogSize``; the oldest
    entries go first. The newest entry is never removed by capping, as in mongod.
    """

    def __init__(self, max_bytes: int, clock: ClusterClock | None = None) -> None:
        if max_bytes <= 0:
            raise ValueError(f"oplog size must be positive, got {max_bytes} bytes")
        self.max_bytes = max_bytes
        self.clock = clock or ClusterClock()
        # One lock for every mutation of emulator state; readers wait on it for new entries.
        self.cond = threading.Condition(threading.RLock())
        self._entries: list[dict[str, Any]] = []
        self._keys: list[TsKey] = []
        self._sizes: list[int] = []
        self._head = 0  # index of the first live entry; the prefix before it awaits compaction
        self._bytes = 0
        self._truncated_before: TsKey | None = None
        self._interrupts = 0  # bumped by ``interrupt`` (step-down) to end every waiting reader

    # -- writing ---------------------------------------------------------------------------
    def append(self, entries: Sequence[dict[str, Any]]) -> None:
        """Append entries whose ``ts`` values are increasing and newer than the last entry."""
        with self.cond:
            for entry in entries:
                key = ts_key(entry["ts"])
                if self._keys and key <= self._keys[-1]:
                    raise ValueError(f"oplog entry {key} is not after the last entry {self._keys[-1]}")
                size = len(bson.encode(entry))
                self._entries.append(entry)
                self._keys.append(key)
                self._sizes.append(size)
                self._bytes += size
                self.clock.advance_to(entry["ts"])
            self._cap()
            self.cond.notify_all()

    def truncate_before(self, ts: Timestamp) -> int:
        """Drop every entry older than ``ts`` (fault injection: provokes history loss)."""
        with self.cond:
            cut = bisect.bisect_left(self._keys, ts_key(ts), lo=self._head)
            dropped = cut - self._head
            self._drop_to(cut)
            self._truncated_before = ts_key(ts)
            return dropped

    def _cap(self) -> None:
        cut = self._head
        end = len(self._entries) - 1
        while self._bytes > self.max_bytes and cut < end:
            self._bytes -= self._sizes[cut]
            cut += 1
        if cut != self._head:
            self._drop_to(cut, already_counted=True)

    def _drop_to(self, cut: int, already_counted: bool = False) -> None:
        if not already_counted:
            self._bytes -= sum(self._sizes[self._head : cut])
        self._head = cut
        if self._head > 4096 and self._head * 2 > len(self._entries):
            del self._entries[: self._head]
            del self._keys[: self._head]
            del self._sizes[: self._head]
            self._head = 0

    # -- reading ---------------------------------------------------------------------------
    def first_ts(self) -> Timestamp | None:
        with self.cond:
            return self._entries[self._head]["ts"] if self._head < len(self._entries) else None

    def last_ts(self) -> Timestamp | None:
        with self.cond:
            return self._entries[-1]["ts"] if self._head < len(self._entries) else None

    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries) - self._head

    def read(self, after: Timestamp | None, inclusive: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
        """Entries at (``inclusive``) or after ``after`` in oplog order, at most ``limit``."""
        with self.cond:
            if after is None:
                start = self._head
            elif inclusive:
                start = bisect.bisect_left(self._keys, ts_key(after), lo=self._head)
            else:
                start = bisect.bisect_right(self._keys, ts_key(after), lo=self._head)
            stop = len(self._entries) if limit is None else min(len(self._entries), start + limit)
            return self._entries[start:stop]

    def covers(self, ts: Timestamp) -> bool:
        """Whether history at ``ts`` is still complete: no entry at or after it was removed."""
        first = self.first_ts()
        return first is not None and ts_key(first) <= ts_key(ts)

    def interrupt(self) -> None:
        """Wake every ``wait_for_entries_after`` with False, as a step-down kills waiting getMores."""
        with self.cond:
            self._interrupts += 1
            self.cond.notify_all()

    def wait_for_entries_after(self, ts: Timestamp | None, timeout: float) -> bool:
        """Block until an entry newer than ``ts`` exists (True) or ``timeout`` seconds pass or
        ``interrupt`` is called (False)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            interrupts = self._interrupts
            while True:
                last = self._keys[-1] if self._head < len(self._keys) else None
                if last is not None and (ts is None or last > ts_key(ts)):
                    return True
                if self._interrupts != interrupts:
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(remaining)

    def entries(self) -> Iterable[dict[str, Any]]:
        """All live entries, oldest first (for persistence and ``find`` on the oplog)."""
        with self.cond:
            return list(self._entries[self._head :])
