"""What the Dagster instance knows about materialised CDC partitions (shared by sensors and checks).

The instance is the record of which windows were landed and where each collection's last full
snapshot stands; the oplog window sensor and the continuity and freshness checks all reason from it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, TimeWindow

from mongocdc_core.positions import Position
from mongocdc_dagster.partitions import COLLECTIONS_PARTITIONS_NAME, CdcPartitions


@dataclass(frozen=True)
class CollectionHistory:
    """One collection's landed state: its last full snapshot and its materialised windows (sorted)."""

    namespace: str
    snapshot_position: Position | None
    window_keys: tuple[str, ...]

    @property
    def snapshot_time(self) -> datetime | None:
        if self.snapshot_position is None:
            return None
        return datetime.fromtimestamp(self.snapshot_position.seconds, UTC)


def known_collections(instance: DagsterInstance) -> list[str]:
    """The collections partition keys the discovery sensor registered."""
    return sorted(instance.get_dynamic_partitions(COLLECTIONS_PARTITIONS_NAME))


def last_full_snapshot(instance: DagsterInstance, snapshot_keys: Sequence[AssetKey], namespace: str) -> Position | None:
    """Position of the newest unfiltered snapshot of `namespace` of any kind (filtered ones do not reset the baseline)."""
    found = [p for p in (_last_full(instance, key, namespace) for key in snapshot_keys) if p is not None]
    return max(found) if found else None


def _last_full(instance: DagsterInstance, snapshot_key: AssetKey, namespace: str) -> Position | None:
    cursor: str | None = None
    while True:
        result = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=snapshot_key, asset_partitions=[namespace]), limit=20, cursor=cursor
        )
        for record in result.records:
            materialization = record.asset_materialization
            if materialization is None:
                continue
            meta = materialization.metadata
            filt = meta.get("filter")
            if filt is not None and filt.value:
                continue
            position = meta.get("position")
            if position is not None and isinstance(position.value, str):
                return Position.parse(position.value)
        if not result.has_more:
            return None
        cursor = result.cursor


def collection_histories(
    instance: DagsterInstance, partitions: CdcPartitions, snapshot_keys: Sequence[AssetKey], slice_key: AssetKey
) -> dict[str, CollectionHistory]:
    """Every known collection's history, keyed by namespace."""
    windows: dict[str, list[str]] = defaultdict(list)
    for key in instance.get_materialized_partitions(slice_key):
        namespace, window_key = partitions.split_slice_key(key)
        windows[namespace].append(window_key)
    names = set(known_collections(instance)) | set(windows)
    return {
        ns: CollectionHistory(
            ns, last_full_snapshot(instance, snapshot_keys, ns),
            tuple(sorted(windows.get(ns, []), key=lambda k: partitions.window(k).start)),
        )
        for ns in sorted(names)
    }


def needed_window_start(history: CollectionHistory, partitions: CdcPartitions) -> datetime | None:
    """Where the collection's next slice must start so nothing since its last snapshot is skipped.

    After the last materialised window; but a newer full snapshot resets it to the window holding the
    snapshot position. None when the collection was never landed (nothing to protect yet).
    """
    after_slices = partitions.window(history.window_keys[-1]).end if history.window_keys else None
    snap = history.snapshot_time
    snap_window: TimeWindow | None = None
    if snap is not None:
        key = partitions.window_key_containing(snap)
        snap_window = partitions.window(key) if key is not None else None
    snap_start = snap_window.start if snap_window is not None else partitions.windows.start if snap else None
    candidates = [t for t in (after_slices, snap_start) if t is not None]
    return max(candidates) if candidates else None


def missing_windows(history: CollectionHistory, partitions: CdcPartitions) -> list[str]:
    """Window keys not materialised between the baseline (last snapshot, else first slice) and the last slice."""
    if not history.window_keys:
        return []
    last = history.window_keys[-1]
    first = history.window_keys[0]
    snap = history.snapshot_time
    if snap is not None:
        snap_key = partitions.window_key_containing(snap)
        if snap_key is None:
            snap_key = partitions.windows.get_first_partition_key()
        if snap_key is not None and partitions.window(snap_key).start <= partitions.window(last).start:
            first = snap_key
        else:
            return []  # the snapshot is newer than every slice: nothing after it yet
    landed = set(history.window_keys)
    span = TimeWindow(partitions.window(first).start, partitions.window(last).end)
    return [k for k in partitions.windows.get_partition_keys_in_time_window(span) if k not in landed]
