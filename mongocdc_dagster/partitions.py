"""Partitions: a dynamic `collections` dimension, and collection x time window for stream slices."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from dagster import (
    DynamicPartitionsDefinition,
    MultiPartitionKey,
    MultiPartitionsDefinition,
    TimeWindow,
    TimeWindowPartitionsDefinition,
)

from mongocdc_dagster.settings import CdcSettings

COLLECTIONS_PARTITIONS_NAME = "collections"
COLLECTION_DIM = "collection"
WINDOW_DIM = "window"

collections_partitions = DynamicPartitionsDefinition(name=COLLECTIONS_PARTITIONS_NAME)


@dataclass(frozen=True)
class CdcPartitions:
    """The partition definitions one set of CDC assets shares with its sensors, schedule and checks."""

    collections: DynamicPartitionsDefinition
    windows: TimeWindowPartitionsDefinition
    slices: MultiPartitionsDefinition
    seconds: int

    @classmethod
    def from_settings(cls, settings: CdcSettings) -> CdcPartitions:
        windows = TimeWindowPartitionsDefinition(
            start=settings.start,
            fmt=settings.granularity.fmt,
            cron_schedule=settings.granularity.cron,
            timezone="UTC",
        )
        slices = MultiPartitionsDefinition({COLLECTION_DIM: collections_partitions, WINDOW_DIM: windows})
        return cls(collections_partitions, windows, slices, settings.granularity.seconds)

    def slice_key(self, namespace: str, window_key: str) -> MultiPartitionKey:
        return MultiPartitionKey({COLLECTION_DIM: namespace, WINDOW_DIM: window_key})

    def split_slice_key(self, key: str) -> tuple[str, str]:
        """(collection, window key) of a stream slice partition key."""
        parsed = self.slices.get_partition_key_from_str(key)
        dims = parsed.keys_by_dimension
        return dims[COLLECTION_DIM], dims[WINDOW_DIM]

    def window(self, window_key: str) -> TimeWindow:
        return self.windows.time_window_for_partition_key(window_key)

    def window_key_containing(self, when: datetime) -> str | None:
        """The key of the window that contains `when` (None before the first window)."""
        if when < self.windows.start:
            return None
        return self.windows.get_partition_key_for_timestamp(when.timestamp())

    def latest_closed_window(self, now: datetime) -> str | None:
        """The newest window that ended at or before `now` (what the schedule materialises)."""
        return self.window_key_containing(now - timedelta(seconds=self.seconds))
