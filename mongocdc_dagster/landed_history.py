"""What the Dagster instance knows about a collection's landed history (shared by assets, sensors, checks).

A collection's *snapshot position* is where its newest complete full snapshot leaves off: from there
on, its slices must be landed without a gap. A blocking snapshot's reads carry the position taken
before the copy; an incremental snapshot holds every change until its end position; a range plan
is complete when all its ranges landed, and holds from its earliest range's position. Filtered
snapshots copy part of a collection and never count.

The oplog-window sensor, the gap sensor and the continuity check each read every collection's history; a
history is read again only when one of its assets was materialised since (one query for all the collections
of a tick says so), as the tick of a sensor over hundreds of collections would otherwise read them all each time.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, TimeWindow

from mongocdc_core.positions import Position
from mongocdc_dagster.partitions import SliceWindows

#: The materialisation metadata entry holding the position a snapshot covers from (exact, sortable).
COVERS_FROM = "covers_from_raw"
#: Set on a materialisation whose snapshot copied only part of the collection (a filter, an unfinished plan).
PARTIAL = "partial"


def _covering(instance: DagsterInstance, key: AssetKey, limit: int = 50) -> Iterator[Position]:
    """The positions from which the newest ``limit`` materialisations of ``key`` (any partition) that cover
    the whole collection cover it, newest first (read a page at a time, as far as the caller takes them)."""
    cursor: str | None = None
    seen = 0
    while seen < limit:
        result = instance.fetch_materializations(AssetRecordsFilter(asset_key=key), limit=20, cursor=cursor)
        for record in result.records:
            seen += 1
            materialization = record.asset_materialization
            if materialization is None:
                continue
            meta = materialization.metadata
            partial = meta.get(PARTIAL)
            if partial is not None and partial.value:
                continue
            covers = meta.get(COVERS_FROM)
            if covers is not None and isinstance(covers.value, str):
                yield Position.parse(covers.value)
        if not result.has_more:
            return
        cursor = result.cursor


def snapshot_positions(instance: DagsterInstance, snapshot_keys: Iterable[AssetKey]) -> list[Position]:
    """Every position from which one of the collection's recent snapshots covers it, oldest first (empty:
    never snapshotted). A slice whose window start left the oplog reads from the oldest of them the oplog
    still holds (``plan_window_read``): a later one, such as an incremental snapshot taken since, would skip
    the changes made between the two."""
    return sorted(p for key in snapshot_keys for p in _covering(instance, key))


def snapshot_position(instance: DagsterInstance, snapshot_keys: Iterable[AssetKey]) -> Position | None:
    """The newest position from which one of the collection's snapshots covers it (None: never snapshotted)."""
    found = [p for p in (next(_covering(instance, key), None) for key in snapshot_keys) if p is not None]
    return max(found) if found else None


def position_datetime(position: Position) -> datetime:
    return datetime.fromtimestamp(position.seconds, UTC)


@dataclass(frozen=True)
class CollectionHistory:
    """One collection's snapshot position and its materialised windows (sorted)."""

    namespace: str
    snapshot: Position | None
    window_keys: tuple[str, ...]

    @property
    def snapshot_time(self) -> datetime | None:
        return None if self.snapshot is None else position_datetime(self.snapshot)


#: What a history was read from, per asset: the latest materialisation's storage id, time and partition, and the
#: asset's wipe time. The storage id alone is not enough: a wipe of the whole instance deletes the asset rows (no
#: wipe time survives) and SQLite then hands out the same ids again, so as many landings after it would look
#: unchanged; their time and partition differ. A storage id lower than the one read (it went down) differs too.
_Stamp = tuple[int | None, float | None, str | None, float | None]
_Read = tuple[tuple[_Stamp, ...], tuple[AssetKey, ...], SliceWindows, CollectionHistory]
#: The most histories held (least recently used dropped first): a few per collection of every storage in use.
_READ_LIMIT = 4096
#: The histories read, by event storage and slices asset: the oplog-window sensor, the gap sensor and the
#: continuity check each read every collection's; read again only once one of its assets changed. Sensor ticks
#: and checks may run in threads of one process: the lock makes each look-up and update of the cache whole (the
#: reads themselves run outside it; two threads reading one history at once both read it, and the one stored
#: last, stamped before its read, is as good as the other).
_READ: OrderedDict[tuple[Hashable, AssetKey], _Read] = OrderedDict()
_READ_LOCK = threading.Lock()


def _storage_of(instance: DagsterInstance) -> Hashable | None:
    """Where the instance's events are stored: the same for every instance made from one instance ref (a sensor
    tick in a code server or the daemon gets a new one each time); None for an ephemeral instance (not cached)."""
    return None if instance.is_ephemeral else instance.get_ref().event_storage_data


class HistorySource(NamedTuple):
    """The assets one collection's landed history is read from."""

    namespace: str
    snapshot_keys: tuple[AssetKey, ...]
    slices_key: AssetKey


def _stamps(instance: DagsterInstance, keys: Sequence[AssetKey]) -> dict[AssetKey, _Stamp]:
    """One query for all ``keys`` (every collection of a tick): the latest materialisation (and wipe) of each
    asset a history is read from; any new one changes its stamp."""
    entries = {record.asset_entry.asset_key: record.asset_entry for record in instance.get_asset_records(list(keys))}
    stamps: dict[AssetKey, _Stamp] = {}
    for key in keys:
        entry = entries.get(key)
        latest = entry.last_materialization_record if entry is not None else None
        details = entry.asset_details if entry is not None else None
        wiped = details.last_wipe_timestamp if details is not None else None
        stamps[key] = ((None, None, None, wiped) if latest is None
                       else (latest.storage_id, latest.timestamp, latest.partition_key, wiped))
    return stamps


def collection_histories(instance: DagsterInstance, sources: Sequence[HistorySource],
                         windows: SliceWindows) -> dict[str, CollectionHistory]:
    """Each collection's history (by namespace), read from the instance only when one of its assets was
    materialised (or wiped) since it was last read in this process: one query for all of them says which (a
    sensor tick over hundreds of collections makes one, not one per collection)."""
    storage = _storage_of(instance)
    if storage is None:
        return {s.namespace: _read_history(instance, *s, windows) for s in sources}
    # before the reads: one landing during them is read again
    stamps = _stamps(instance, [key for s in sources for key in (s.slices_key, *s.snapshot_keys)])
    histories: dict[str, CollectionHistory] = {}
    for source in sources:
        stamp = tuple(stamps[key] for key in (source.slices_key, *source.snapshot_keys))
        entry = (storage, source.slices_key)
        with _READ_LOCK:
            read = _READ.get(entry)
            if (read is not None and read[:3] == (stamp, source.snapshot_keys, windows)
                    and read[3].namespace == source.namespace):
                _READ.move_to_end(entry)
                histories[source.namespace] = read[3]
                continue
        history = _read_history(instance, *source, windows)
        with _READ_LOCK:
            _READ[entry] = (stamp, source.snapshot_keys, windows, history)
            _READ.move_to_end(entry)
            while len(_READ) > _READ_LIMIT:
                _READ.popitem(last=False)
        histories[source.namespace] = history
    return histories


def _read_history(instance: DagsterInstance, namespace: str, snapshot_keys: Sequence[AssetKey], slices_key: AssetKey,
                  windows: SliceWindows) -> CollectionHistory:
    keys = sorted(instance.get_materialized_partitions(slices_key), key=lambda k: windows.window(k).start)
    # the same window keys for every collection: held once, not once per collection in the cache
    return CollectionHistory(namespace, snapshot_position(instance, snapshot_keys), tuple(map(sys.intern, keys)))


def needed_window_start(history: CollectionHistory, windows: SliceWindows) -> datetime | None:
    """Where the collection's next slice must start so nothing since its snapshot is skipped.

    After the last landed window, unless a newer snapshot moved the start to its own position. None
    when the collection was never snapshotted nor sliced (nothing to protect yet).
    """
    after_slices = windows.window(history.window_keys[-1]).end if history.window_keys else None
    snap = history.snapshot_time
    candidates = [t for t in (after_slices, snap) if t is not None]
    return max(candidates) if candidates else None


def missing_windows(history: CollectionHistory, windows: SliceWindows, until: datetime) -> list[str]:
    """Closed windows not landed between the collection's snapshot and ``until`` (None snapshot: since its
    first landed window). A window that ends before the snapshot position is covered by the snapshot."""
    snap = history.snapshot_time
    if snap is None and not history.window_keys:
        return []
    first = snap if snap is not None else windows.window(history.window_keys[0]).start
    first_key = windows.key_containing(first)
    start = windows.window(first_key).start if first_key is not None else windows.start
    landed = set(history.window_keys)
    last_closed = windows.latest_closed(until)
    if last_closed is None:
        return []
    span = TimeWindow(start, windows.window(last_closed).end)
    if span.end <= span.start:
        return []
    return [k for k in windows.definition.get_partition_keys_in_time_window(span) if k not in landed]
