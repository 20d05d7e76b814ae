"""Document history for point-in-time reads: snapshot read concern and transaction snapshots.

mongod keeps old versions of documents for ``minSnapshotHistoryWindowInSeconds`` (300 s by default)
so that a read can be pinned to a cluster time (``readConcern: {level: "snapshot", atClusterTime}``)
and every multi-document transaction reads the data as of its start. The emulator keeps, for each
committed change to a document, the version it replaced, keyed by the change's cluster time; a
collection as of time T is the current collection with every change after T undone. Reads older
than the window answer SnapshotTooOld (239), as mongod does.

The catalog is read at that time too (mongod 7.0's point-in-time catalog lookups): a collection dropped or
renamed after T is read under the name it had at T, and a name that came to a collection after T (a
rename's target) held nothing then. A collection created after T needs no record: every insert into it
is undone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import bson
from bson import Timestamp

from .errors import BAD_VALUE, command_error
from .oplog import TsKey, ts_key

if TYPE_CHECKING:
    from .state import Collection, IdKey

SNAPSHOT_TOO_OLD = (239, "SnapshotTooOld")
DEFAULT_WINDOW_SECONDS = 300  # mongod's minSnapshotHistoryWindowInSeconds
# Like mongod under cache pressure, history is also bounded in size: beyond this many changes the
# oldest go, and reads before them answer SnapshotTooOld.
MAX_CHANGES = 1_000_000


@dataclass(frozen=True, slots=True)
class CatalogChange:
    """A name's collection changing: at ``ts`` the namespace stopped (a drop, a rename's source or dropped
    target) or started (a rename's target) naming ``collection``."""

    ts: TsKey
    db: str
    name: str
    collection: Collection
    started: bool


@dataclass(frozen=True, slots=True)
class Change:
    """One committed change of one document: the version it replaced (None: it did not exist)."""

    ts: TsKey
    collection: Collection
    key: IdKey
    before: dict[str, Any] | None


class History:
    """Replaced document versions, oldest first, kept for ``window_seconds``."""

    def __init__(self, window_seconds: float = DEFAULT_WINDOW_SECONDS) -> None:
        self.window_seconds = window_seconds
        self._changes: deque[Change] = deque()
        self._catalog: deque[CatalogChange] = deque()
        self._oldest: TsKey = (0, 0)  # snapshots at or after this time are complete

    def start(self, now: Timestamp) -> None:
        """History is complete from ``now`` on (the server's start)."""
        self._oldest = ts_key(now)

    def record(self, ts: Timestamp, collection: Collection, key: IdKey, before: dict[str, Any] | None) -> None:
        self._changes.append(Change(ts_key(ts), collection, key, before))
        self._prune(ts.time)

    def record_catalog(self, ts: Timestamp, db: str, name: str, collection: Collection, *, started: bool) -> None:
        """``db.name`` stopped (or, ``started``, began) naming ``collection`` at ``ts``."""
        self._catalog.append(CatalogChange(ts_key(ts), db, name, collection, started))
        self._prune(ts.time)

    def _prune(self, now_seconds: int) -> None:
        horizon = now_seconds - self.window_seconds
        while self._catalog and self._catalog[0].ts[0] < horizon:
            self._catalog.popleft()
        changes = self._changes
        while changes and (changes[0].ts[0] < horizon or len(changes) > MAX_CHANGES):
            self._oldest = changes.popleft().ts
        if self._oldest[0] < horizon:
            self._oldest = (int(horizon), 0)

    def check(self, at: Timestamp, current: Timestamp) -> None:
        """mongod's errors for a read timestamp outside what can be read."""
        if ts_key(at) > ts_key(current):
            raise command_error(
                BAD_VALUE,
                "readConcern atClusterTime value must not be greater than the current clusterTime. Requested "
                f"clusterTime: {{ ts: Timestamp({at.time}, {at.inc}) }}; current clusterTime: "
                f"{{ ts: Timestamp({current.time}, {current.inc}) }}",
            )
        self._prune(current.time)  # the window trails the cluster's time, as mongod's oldest timestamp does
        if ts_key(at) < self._oldest:
            oldest = Timestamp(*self._oldest)
            raise command_error(
                SNAPSHOT_TOO_OLD,
                f"Read timestamp Timestamp({at.time}, {at.inc}) is older than the oldest available timestamp "
                f"Timestamp({oldest.time}, {oldest.inc}).",
            )

    def named_at(self, db: str, name: str, current: Collection | None, at: Timestamp) -> Collection | None:
        """The collection ``db.name`` named at ``at``, from the one it names now (``current``)."""
        at_key = ts_key(at)
        named = current
        for change in reversed(self._catalog):
            if change.ts <= at_key:
                break
            if (change.db, change.name) == (db, name):
                named = None if change.started else change.collection
        return named

    def as_of(self, collection: Collection, at: Timestamp) -> Collection:
        """``collection`` as it was at cluster time ``at`` (itself when nothing changed since)."""
        at_key = ts_key(at)
        undo: list[Change] = []
        for change in reversed(self._changes):
            if change.ts <= at_key:
                break
            if change.collection is collection:
                undo.append(change)
        if not undo:
            return collection
        oldest: dict[IdKey, dict[str, Any] | None] = {}  # each document as it was before its first change
        for change in reversed(undo):
            oldest.setdefault(change.key, change.before)
        view = collection.clone()
        # Documents still there keep their place; documents deleted since come back in the order of
        # their first change after ``at`` (the emulator keeps no record ids).
        for key, before in oldest.items():
            if before is None:
                view.docs.pop(key, None)
            else:
                view.docs[key] = (before, bson.encode(before))
        view.rebuild_unique_indexes()
        return view
