"""The concurrency pools the assets declare, and the limits a mongocdc instance starts with.

Pools are enforced by the Dagster instance for every run (UI launches, backfills, schedules, sensors).
``dagster.yaml`` sets ``default_limit: 1`` for any pool without a limit of its own: slices, tables and
checks run one at a time; :func:`configure_pools` raises the snapshot pools (``make dev`` calls it, or
``dagster instance concurrency set <pool> <n>``). Limits an operator already set are kept.
"""

from __future__ import annotations

from dagster import DagsterInstance

from mongocdc_dagster.assets.cdc import POOL_SLICES, POOL_SNAPSHOT_RANGES, POOL_SNAPSHOTS
from mongocdc_dagster.assets.tables import POOL_TABLES

#: Whole-collection snapshots two at a time; the ranges of a ranged snapshot four at a time (parallel copy);
#: slices serial (one change stream serves every collection of a window); Spark table work serial.
DEFAULT_LIMITS = {POOL_SNAPSHOTS: 2, POOL_SNAPSHOT_RANGES: 4, POOL_SLICES: 1, POOL_TABLES: 1}


def configure_pools(instance: DagsterInstance, limits: dict[str, int] | None = None) -> dict[str, int]:
    """Set the limits of pools that have none yet; returns every mongocdc pool's limit."""
    storage = instance.event_log_storage
    existing = storage.get_concurrency_keys()
    for pool, limit in (limits or DEFAULT_LIMITS).items():
        if pool not in existing:
            storage.set_concurrency_slots(pool, limit)
    return {pool: storage.get_concurrency_info(pool).slot_count for pool in (limits or DEFAULT_LIMITS)}
