"""Jobs that are not asset materialisations: re-planning a collection's snapshot ranges, table upkeep.

No ``from __future__ import annotations``: Dagster resolves the resource annotations at definition time.
"""

from collections.abc import Mapping

from dagster import (
    Config,
    DefaultScheduleStatus,
    Failure,
    JobDefinition,
    OpExecutionContext,
    ScheduleDefinition,
    job,
    op,
)
from dagster_pyspark import PySparkResource
from pydantic import Field

from mongocdc_core.tables.collection import CollectionTables, maintain
from mongocdc_dagster.assets.cdc import write_plan
from mongocdc_dagster.naming import ConnectorNames
from mongocdc_dagster.partitions import ranges_partitions_name
from mongocdc_dagster.pools import Pools
from mongocdc_dagster.resources import MongoCdcResource, resource_of


class PlanConfig(Config):  # type: ignore[misc]
    collection: str = Field(description="the '<db>.<collection>' whose _id ranges are planned again")


class MaintenanceConfig(Config):  # type: ignore[misc]
    retention_hours: int = Field(default=168, description="VACUUM keeps files needed by this many hours of history")


def build_plan_job(ranged: Mapping[str, int], names: ConnectorNames) -> JobDefinition:
    """Plans a ranged collection's ``_id`` ranges again (its partitions become the new plan's ranges)."""

    @op(name=names.of("plan_ranges"), required_resource_keys={names.mongocdc})
    def plan_ranges(context: OpExecutionContext, config: PlanConfig) -> None:
        mongocdc = resource_of(context, names.mongocdc, MongoCdcResource)
        namespace = config.collection
        if namespace not in ranged:
            raise Failure(f"{namespace!r} is not snapshotted in ranges (ranged_snapshots: {', '.join(ranged) or 'none'})",
                          allow_retries=False)
        keys = write_plan(mongocdc, namespace, ranged[namespace])
        name = ranges_partitions_name(namespace, names)
        for old in context.instance.get_dynamic_partitions(name):
            context.instance.delete_dynamic_partition(name, old)
        context.instance.add_dynamic_partitions(name, keys)
        context.log.info(f"{namespace}: planned {len(keys)} _id range(s); backfill all partitions of its snapshot")

    @job(name=names.of("plan_snapshot_ranges"), description="Plans a ranged collection's _id ranges again.")
    def plan_job() -> None:
        plan_ranges()

    return plan_job


def build_maintenance(tables: Mapping[str, CollectionTables],
                      names: ConnectorNames) -> tuple[JobDefinition, ScheduleDefinition]:
    """OPTIMIZE and VACUUM of every collection's tables, weekly (the schedule starts stopped)."""

    # Spark table work, one at a time like the refreshes
    @op(name=names.of("maintain_tables"), pool=Pools.of(names).tables, required_resource_keys={names.pyspark})
    def maintenance(context: OpExecutionContext, config: MaintenanceConfig) -> None:
        pyspark = resource_of(context, names.pyspark, PySparkResource)
        for namespace, collection_tables in sorted(tables.items()):
            figures = maintain(pyspark.spark_session, collection_tables, retention_hours=config.retention_hours,
                               progress=context.log.info)
            context.log.info(f"{namespace}: {figures}")

    @job(name=names.of("table_maintenance"), description="OPTIMIZE and VACUUM of every collection's Delta tables.")
    def maintenance_job() -> None:
        maintenance()

    return maintenance_job, ScheduleDefinition(
        name=names.of("weekly_table_maintenance"), job=maintenance_job, cron_schedule="0 3 * * 0",
        execution_timezone="UTC", default_status=DefaultScheduleStatus.STOPPED,
        description="Compacts and vacuums the tables on Sunday nights.")
