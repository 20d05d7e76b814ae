"""Partitions: clusterTime windows for slices, and ``_id`` ranges for collections snapshotted in ranges."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dagster import DynamicPartitionsDefinition, TimeWindow, TimeWindowPartitionsDefinition

from mongocdc_dagster.discovery import DiscoveryState
from mongocdc_dagster.naming import DEFAULT_NAMES, ConnectorNames
from mongocdc_dagster.settings import MAX_DEFAULT_WINDOWS, CdcSettings
from mongocdc_dagster.translator import name_part

#: The most windows one slice run lands: a deployment further behind catches up over several runs, oldest first.
MAX_WINDOWS_PER_RUN = 60


def floor_to(when: datetime, seconds: int) -> datetime:
    """The window boundary at or before ``when`` (windows are aligned to the epoch in UTC)."""
    ts = int(when.timestamp())
    return datetime.fromtimestamp(ts - ts % seconds, UTC)


def default_start(state: DiscoveryState, seconds: int) -> datetime:
    """Where windows start when none is configured: the window holding the oplog's first entry (older
    windows can only be read from a snapshot), at most MAX_DEFAULT_WINDOWS back; without an oplog to
    read, the window of the discovery."""
    newest = floor_to(state.discovered_at, seconds)
    if state.oplog_first is None:
        return newest
    oldest = newest - timedelta(seconds=seconds * MAX_DEFAULT_WINDOWS)
    return max(floor_to(state.oplog_first, seconds), oldest)


@dataclass(frozen=True)
class SliceWindows:
    """The time windows every collection's slices are partitioned by."""

    definition: TimeWindowPartitionsDefinition
    seconds: int
    cron: str

    @classmethod
    def build(cls, settings: CdcSettings, state: DiscoveryState) -> SliceWindows:
        granularity = settings.granularity
        start = settings.start or default_start(state, granularity.seconds)
        definition = TimeWindowPartitionsDefinition(
            start=start, fmt=granularity.fmt, cron_schedule=granularity.cron, timezone="UTC",
        )
        return cls(definition, granularity.seconds, granularity.cron)

    @property
    def start(self) -> datetime:
        return self.definition.start

    def window(self, key: str) -> TimeWindow:
        return self.definition.time_window_for_partition_key(key)

    def key_containing(self, when: datetime) -> str | None:
        """The key of the window that contains ``when`` (None before the first window)."""
        if when < self.definition.start:
            return None
        return self.definition.get_partition_key_for_timestamp(when.timestamp())

    def latest_closed(self, now: datetime) -> str | None:
        """The newest window that ended at or before ``now`` (what the schedule materialises)."""
        return self.key_containing(now - timedelta(seconds=self.seconds))

    def keys_between(self, start: datetime, end: datetime) -> list[str]:
        """Keys of the windows overlapping ``[start, end)``."""
        return list(self.definition.get_partition_keys_in_time_window(TimeWindow(max(start, self.start), end)))


def ranges_partitions_name(namespace: str, names: ConnectorNames = DEFAULT_NAMES) -> str:
    return names.of(f"ranges__{name_part(namespace)}")


def ranges_partitions(namespace: str, names: ConnectorNames = DEFAULT_NAMES) -> DynamicPartitionsDefinition:
    """The ``_id`` ranges of one collection's current snapshot plan (keys ``<plan>-<i>-of-<n>``)."""
    return DynamicPartitionsDefinition(name=ranges_partitions_name(namespace, names))
