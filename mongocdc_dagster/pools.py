"""The concurrency pools the assets declare, per connector, and the limits a mongocdc instance starts with.

This module is the one home of pool names. Pools are enforced by the Dagster instance for every run (UI
launches, backfills, schedules, sensors). ``dagster.yaml`` sets ``default_limit: 1`` for any pool without
a limit of its own: slices, tables and checks run one at a time; :func:`configure_pools` raises the
snapshot pools (``make dev`` calls it, or ``dagster instance concurrency set <pool> <n>``). Limits an
operator already set are kept. Each connector has pools of its own (see :mod:`mongocdc_dagster.naming`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster import DagsterInstance

from mongocdc_dagster.naming import DEFAULT_NAMES, ConnectorNames


@dataclass(frozen=True)
class Pools:
    """One connector's pools."""

    snapshots: str
    snapshot_ranges: str
    slices: str
    tables: str

    @classmethod
    def of(cls, names: ConnectorNames = DEFAULT_NAMES) -> Pools:
        return cls(names.of("snapshots"), names.of("snapshot_ranges"), names.of("slices"), names.of("tables"))

    @property
    def default_limits(self) -> dict[str, int]:
        """Whole-collection snapshots two at a time; the ranges of a ranged snapshot four at a time (parallel
        copy); slices serial (one change stream serves every collection of a window); Spark table work serial."""
        return {self.snapshots: 2, self.snapshot_ranges: 4, self.slices: 1, self.tables: 1}


DEFAULT_POOLS = Pools.of()


def configure_pools(instance: DagsterInstance, limits: dict[str, int] | None = None) -> dict[str, int]:
    """Set the limits of pools that have none yet (default: the default connector's); returns their limits."""
    wanted = limits if limits is not None else DEFAULT_POOLS.default_limits
    storage = instance.event_log_storage
    existing = storage.get_concurrency_keys()
    for pool, limit in wanted.items():
        if pool not in existing:
            storage.set_concurrency_slots(pool, limit)
    return {pool: storage.get_concurrency_info(pool).slot_count for pool in wanted}
