"""PySpark assets: the ``changelog`` and ``current_state`` Delta tables, partitioned by collection.

``changelog`` reads the collection's landing files (snapshots, incremental snapshots, stream slices)
that are new or were re-written since it last ran; ``current_state`` merges what the changelog gained
and, in the same run, checks (blocking) that the table equals the MongoDB collection.

No ``from __future__ import annotations``: Dagster resolves the resource annotations at definition time.
"""

from pathlib import Path
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    MaterializeResult,
    MetadataValue,
    MultiToSingleDimensionPartitionMapping,
    TableColumn,
    TableColumnDep,
    TableColumnLineage,
    TableSchema,
    asset,
)
from dagster_pyspark import PySparkResource
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from mongocdc_core.tables import (
    CollectionTables,
    Reconciliation,
    landing_files,
    reconcile_at_position,
    refresh_changelog,
    refresh_current_state,
)
from mongocdc_dagster.partitions import COLLECTION_DIM, collections_partitions
from mongocdc_dagster.resources import MongoCdcResource

SNAPSHOT_KEY = AssetKey(["mongocdc", "snapshot"])
STREAM_SLICE_KEY = AssetKey(["mongocdc", "stream_slice"])
CHANGELOG_KEY = AssetKey(["mongocdc", "changelog"])
CURRENT_STATE_KEY = AssetKey(["mongocdc", "current_state"])
RECONCILE_CHECK = "matches_source"
#: Landing-zone folders (under ``<home>/landing``) whose files feed the changelog.
LANDING_KINDS = ("snapshot", "incremental_snapshot", "stream_slice")
_CDC_SOURCES = (SNAPSHOT_KEY, STREAM_SLICE_KEY)

#: changelog column -> the landing-zone columns (of snapshot and stream_slice files) it is made from.
_CHANGELOG_LINEAGE: dict[str, tuple[str, ...]] = {
    "__key": ("key",),
    "_id": ("key",),
    "__op": ("op",),
    "__position": ("position",),
    "__ts_ms": ("ts_ms",),
    "__source_ts_ms": ("source",),
    "before": ("before",),
    "after": ("after",),
    "updated_fields": ("updated_fields",),
    "removed_fields": ("removed_fields",),
    "truncated_arrays": ("truncated_arrays",),
    "snapshot": ("snapshot",),
    "source": ("source",),
    "transaction_id": ("value",),
    "topic": ("topic",),
    "__collection": ("collection",),
    "__change_date": ("position",),
}
#: current_state metadata column -> changelog columns; typed document columns come from after + updates.
_STATE_LINEAGE: dict[str, tuple[str, ...]] = {
    "__key": ("__key",),
    "_id": ("__key",),
    "__position": ("__position",),
    "__op": ("__op",),
    "__source_ts_ms": ("__source_ts_ms",),
    "__collection": ("__collection",),
    "__deleted": ("__op",),
}
_DOCUMENT_SOURCES = ("after", "updated_fields", "removed_fields", "truncated_arrays")


def collection_tables(mongocdc: MongoCdcResource, namespace: str) -> CollectionTables:
    """The collection's tables under ``<MONGOCDC_HOME>/tables``."""
    return CollectionTables.under(str(Path(mongocdc.home) / "tables"), namespace)


def collection_landing_files(mongocdc: MongoCdcResource, namespace: str) -> list[str]:
    """Every landing file of one collection, across the snapshot and slice folders."""
    folders = [mongocdc.landing_dir / kind / namespace for kind in LANDING_KINDS]
    return landing_files([f for f in folders if f.is_dir()])


def table_schema(schema: T.StructType) -> TableSchema:
    return TableSchema(columns=[TableColumn(f.name, f.dataType.simpleString()) for f in schema.fields])


def _changelog_lineage() -> TableColumnLineage:
    return TableColumnLineage(
        deps_by_column={
            column: [TableColumnDep(asset_key=key, column_name=src) for key in _CDC_SOURCES for src in sources]
            for column, sources in _CHANGELOG_LINEAGE.items()
        }
    )


def _state_lineage(schema: T.StructType) -> TableColumnLineage:
    deps: dict[str, list[TableColumnDep]] = {}
    for f in schema.fields:
        sources = _STATE_LINEAGE.get(f.name, _DOCUMENT_SOURCES)
        deps[f.name] = [TableColumnDep(asset_key=CHANGELOG_KEY, column_name=src) for src in sources]
    return TableColumnLineage(deps_by_column=deps)


@asset(
    key=CHANGELOG_KEY,
    partitions_def=collections_partitions,
    deps=[
        AssetDep(SNAPSHOT_KEY),
        AssetDep(
            STREAM_SLICE_KEY,
            partition_mapping=MultiToSingleDimensionPartitionMapping(partition_dimension_name=COLLECTION_DIM),
        ),
    ],
    group_name="mongocdc",
    kinds={"spark", "delta"},
    description=(
        "Every change event of the collection (one row per event: op, position, key, before/after, update "
        "description, source fields) as a Delta table partitioned by collection. Re-materialised landing "
        "files replace their rows, never duplicate them."
    ),
)
def changelog(context: AssetExecutionContext, mongocdc: MongoCdcResource, pyspark: PySparkResource) -> MaterializeResult:
    namespace = context.partition_key
    spark: SparkSession = pyspark.spark_session
    tables = collection_tables(mongocdc, namespace)
    files = collection_landing_files(mongocdc, namespace)
    result = refresh_changelog(spark, tables, files)
    if not result.files_read:
        context.log.info(f"{namespace}: no new or re-written landing files among {len(files)}")
    return MaterializeResult(metadata={
        "dagster/uri": MetadataValue.path(tables.changelog),
        "landing_files": len(files),
        "landing_files_written": result.files_read,
        "events_written": result.rows_added,
        "events_by_op": MetadataValue.json(result.counts),
        "dagster/column_lineage": _changelog_lineage(),
        "dagster/column_schema": table_schema(result.schema),
        "dagster/partition_row_count": result.row_count,
    })


def _reconciliation_result(result: Reconciliation) -> AssetCheckResult:
    return AssetCheckResult(
        asset_key=CURRENT_STATE_KEY,
        check_name=RECONCILE_CHECK,
        passed=result.matches,
        severity=AssetCheckSeverity.ERROR,
        description=(
            f"{result.namespace} at {result.position} ({result.method}): current_state has {result.table_rows} "
            f"rows, MongoDB {result.source_rows}; "
            + ("equal" if result.matches else f"first mismatching keys: {', '.join(result.mismatching_keys)}")
        ),
        metadata={
            "table_count": result.table_rows,
            "source_count": result.source_rows,
            "keys_excluded": result.keys_excluded,
            "mismatching_keys": MetadataValue.json(list(result.mismatching_keys)),
        },
    )


@asset(
    key=CURRENT_STATE_KEY,
    partitions_def=collections_partitions,
    deps=[AssetDep(CHANGELOG_KEY)],
    group_name="mongocdc",
    kinds={"spark", "delta"},
    check_specs=[
        AssetCheckSpec(
            RECONCILE_CHECK,
            asset=CURRENT_STATE_KEY,
            blocking=True,
            description="current_state equals the MongoDB collection: same count and order-independent hash",
        )
    ],
    description=(
        "The latest version of every document (highest position wins; deletes remove the row), with the "
        "top-level fields as typed columns (new fields add columns, type conflicts widen) and the whole "
        "document as Extended JSON."
    ),
)
def current_state(
    context: AssetExecutionContext, mongocdc: MongoCdcResource, pyspark: PySparkResource
) -> MaterializeResult:
    namespace = context.partition_key
    spark: SparkSession = pyspark.spark_session
    tables = collection_tables(mongocdc, namespace)
    merged = refresh_current_state(spark, tables)
    if merged.schema_changes:
        context.log.warning(f"{namespace}: schema changes: {merged.schema_changes}")
    check = reconcile_at_position(spark, tables, mongocdc.load_config())
    return MaterializeResult(
        metadata={
            "dagster/uri": MetadataValue.path(tables.current_state),
            "dagster/column_schema": table_schema(merged.schema),
            "dagster/column_lineage": _state_lineage(merged.schema),
            "dagster/partition_row_count": merged.row_count,
            "keys_merged": merged.keys_merged,
            "rows_upserted": merged.upserted,
            "rows_deleted": merged.deleted,
            "keys_waiting_for_a_full_document": merged.pending_keys,
            "schema_changes": MetadataValue.json(merged.schema_changes),
        },
        check_results=[_reconciliation_result(check)],
    )


table_assets = [changelog, current_state]
#: The reconciliation check is declared on ``current_state`` (``check_specs``) and runs with it, so it
#: knows the partition it reconciles; there are no separate check definitions.
table_checks: list[Any] = []

__all__ = ["changelog", "current_state", "table_assets", "table_checks"]
