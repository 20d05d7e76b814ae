"""PySpark assets: each collection's Delta ``changelog`` and ``current_state`` tables.

``changelog`` reads the collection's landing files (snapshots, range files, incremental snapshots,
slices) that are new or were re-written since it last ran; ``current_state`` merges what the changelog
gained. Both kinds of every collection are one subsettable multi-asset (one step, as dagster-sling and
dagster-dlt have it), refreshed automatically when what they read lands (the translator's
``automation_condition``): each collection's current_state follows its own changelog's refresh
(``collection.refresh_collections``), so the first collections' tables are up to date while the others
still refresh, instead of every current_state waiting for the last changelog; a hot collection (500 rows
or more in its changelog's latest append) of which another window landed meanwhile (in the step that builds its
tables, 500 rows or more) is refreshed once more in the same step, so its new windows do not wait behind the
quiet collections for the next run (its materialisation, after that, reports both refreshes). A collection's tables are
built once something has landed for it (a landing file holding a row): before that a refresh records that
nothing is built (``built: false``) and writes no table, so no empty table fixes column types, and no check
compares an empty table with a collection never copied. (It still materialises: leaving one collection's
output out of a multi-asset would skip the next step for every collection of the run.) A collection
with nothing new since its last refresh costs no Spark job: its materialisation says ``new_data: false``
(the table is up to date, so its freshness holds). Several collections refresh at once, each in its own
Spark session and FAIR scheduler pool (``collection.concurrently``). Whether
``current_state`` equals the source is checked at the table's position by ``checks.py`` (blocking), in
the refresh's run, so it holds while writes go on; right after a collection's changelog refresh the step
starts reading it at the position its table is about to get, in the background, for that check
(``source_reads.py``).

The table functions are the tables package's per-collection API (``mongocdc_core.tables.collection``).

No ``from __future__ import annotations``: Dagster resolves the resource annotations at definition time.
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import pyarrow.parquet as pq
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    Failure,
    MaterializeResult,
    MetadataValue,
    TableColumnDep,
    TableColumnLineage,
    multi_asset,
)
from dagster_pyspark import PySparkResource
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from mongocdc_core.sinks.parquet import LANDING_SCHEMA
from mongocdc_core.tables.changelog import look, table_exists
from mongocdc_core.tables.collection import (
    ChangelogRefresh,
    CollectionTables,
    StateRefresh,
    concurrently,
    read_source_at,
    refresh_collections,
)
from mongocdc_core.tables.spark_progress import SparkWork
from mongocdc_dagster.assets.cdc import CdcAssets, collection_props, mark_dropped
from mongocdc_dagster.discovery import DiscoveryState
from mongocdc_dagster.metadata import position_metadata, spark_schema
from mongocdc_dagster.naming import DEFAULT_NAMES, ConnectorNames
from mongocdc_dagster.resources import MongoCdcResource, resource_of
from mongocdc_dagster.settings import CdcSettings
from mongocdc_dagster.source_reads import EARLY_READS, RECONCILE_CHECK, checks_in_run
from mongocdc_dagster.translator import CDC_KINDS, NEW_DATA, MongoCdcTranslator

#: Table columns made from landing columns of another name (the rest map to the landing column of their own
#: name, when one exists). Only columns that exist on both sides are ever named in the lineage.
_FROM_LANDING: dict[str, tuple[str, ...]] = {
    "_id": ("key",), "__op": ("op",), "__position": ("position",), "__collection": ("collection",),
    "__source_ts_ms": ("source",), "event_time": ("ts_ms",), "source_ts_ms": ("source",), "source_rs": ("source",),
    "source_lsid": ("source",), "source_txn_number": ("source",), "source_wall_time": ("source",),
    "transaction_id": ("value",), "_id_bson": ("key",), "before": ("before",),
}
#: The changelog columns a document field of current_state is folded from.
_DOCUMENT_SOURCES = ("after", "updated_fields", "removed_fields", "truncated_arrays", "document", "doc")
_STATE_FROM_LOG: dict[str, tuple[str, ...]] = {
    "op": ("op",), "__op": ("op", "__op"), "position": ("position",), "__position": ("position", "__position"),
    "__deleted": ("op", "__op"), "ts_ms": ("ts_ms",), "__source_ts_ms": ("source_ts_ms", "__source_ts_ms"),
    "_id": ("_id",), "collection": ("collection",), "__collection": ("collection", "__collection"),
}
_LANDING_COLUMNS = frozenset(LANDING_SCHEMA.names)
_T = TypeVar("_T")
_R = TypeVar("_R")


def changelog_lineage(schema: T.StructType, upstream: Sequence[AssetKey]) -> TableColumnLineage:
    """Each changelog column from the landing columns it is made of (landing files of every CDC kind)."""
    deps: dict[str, list[TableColumnDep]] = {}
    for f in schema.fields:
        sources = [c for c in _FROM_LANDING.get(f.name, (f.name,)) if c in _LANDING_COLUMNS]
        if sources:
            deps[f.name] = [TableColumnDep(asset_key=key, column_name=c) for key in upstream for c in sources]
    return TableColumnLineage(deps_by_column=deps)


def state_lineage(schema: T.StructType, changelog: T.StructType, changelog_key: AssetKey) -> TableColumnLineage:
    """Each current_state column from the changelog columns it comes from; document fields from the
    changelog's document columns (only columns the changelog really has)."""
    present = {f.name for f in changelog.fields}
    deps: dict[str, list[TableColumnDep]] = {}
    for f in schema.fields:
        named = [c for c in _STATE_FROM_LOG.get(f.name, (f.name,)) if c in present]
        sources = named or [c for c in _DOCUMENT_SOURCES if c in present]
        if sources:
            deps[f.name] = [TableColumnDep(asset_key=changelog_key, column_name=c) for c in sources]
    return TableColumnLineage(deps_by_column=deps)


@dataclass
class TableAssets:
    definitions: list[AssetsDefinition] = field(default_factory=list)
    changelog_keys: dict[AssetKey, str] = field(default_factory=dict)
    current_state_keys: dict[AssetKey, str] = field(default_factory=dict)
    tables: dict[str, CollectionTables] = field(default_factory=dict)
    #: ``dagster/table_name`` of each table asset, as its definition has it, repeated on its materialisations
    table_names: dict[AssetKey, str] = field(default_factory=dict)
    names: ConnectorNames = DEFAULT_NAMES
    #: Dropped collection -> when discovery found it gone (``CdcAssets.dropped``).
    dropped: dict[str, datetime] = field(default_factory=dict)

    def key(self, namespace: str, kind: str) -> AssetKey:
        keys = self.changelog_keys if kind == "changelog" else self.current_state_keys
        return next(k for k, ns in keys.items() if ns == namespace)


def _table_names(*specs: AssetSpec) -> dict[AssetKey, str]:
    """The specs' ``dagster/table_name`` (a translator may give none)."""
    return {spec.key: str(name) for spec in specs if (name := spec.metadata.get("dagster/table_name")) is not None}


def work_metadata(work: SparkWork, **rates: int) -> dict[str, float | int | None]:
    """How long a refresh took and what it ran in Spark; ``rates``: name -> count, shown per second."""
    out: dict[str, float | int | None] = {
        "duration_s": round(work.seconds, 3), "spark_jobs": work.jobs, "spark_tasks": work.tasks,
    }
    for name, count in rates.items():
        out[name] = round(count / work.seconds, 1) if work.seconds > 0 else None
    return out


def landed_anything(files: Sequence[str]) -> bool:
    """Whether any of a collection's landing files holds a row (read from the Parquet footers only)."""
    return any(pq.read_metadata(f).num_rows > 0 for f in files)


def not_built(namespace: str, why: str) -> dict[str, Any]:
    """The metadata of a refresh that built nothing for a collection with nothing landed yet."""
    return {"collection": namespace, "built": False, "dagster/row_count": 0,
            "not_built": f"nothing of {namespace} has landed yet ({why}): its tables are built once a snapshot "
                         "or a change lands; snapshot the collection to copy what it holds"}


def failed(context: AssetExecutionContext | AssetCheckExecutionContext, namespace: str,
           error: Exception) -> tuple[str, Exception]:
    """A collection's failure, logged with its name as it happens."""
    context.log.error(f"{namespace}: failed: {type(error).__name__}: {error}")
    return namespace, error


def failure(failures: Sequence[tuple[str, Exception]]) -> Failure:
    """The step's failure once the other collections are done, naming every collection that failed (raised
    from the first one's error)."""
    lines = [f"{namespace}: {type(exc).__name__}: {exc}" for namespace, exc in failures]
    return Failure(description=f"{len(failures)} collection(s) failed:\n" + "\n".join(lines),
                   metadata={"failed": MetadataValue.json([ns for ns, _ in failures])})


def each_finished(context: AssetExecutionContext | AssetCheckExecutionContext, spark: SparkSession,
                  items: Sequence[_T], refresh: Callable[[SparkSession, _T], _R], namespace_of: Callable[[_T], str],
                  ) -> Iterator[tuple[_T, _R]]:  # fmt: skip
    """``refresh`` (or a check) of every item, several collections at once (``concurrently``), as each
    finishes. A collection's failure is logged with its name as it happens; once the others are done (their
    materialisations or check results recorded) the step fails naming every collection that failed."""
    failures: list[tuple[str, Exception]] = []
    for item, outcome in concurrently(spark, items, refresh):
        if isinstance(outcome, Exception):
            failures.append(failed(context, namespace_of(item), outcome))
        else:
            yield item, outcome
    if failures:
        raise failure(failures) from failures[0][1]


def build_table_assets(settings: CdcSettings, cfg: Any, state: DiscoveryState, translator: MongoCdcTranslator,
                       cdc: CdcAssets) -> TableAssets:
    out = TableAssets(names=cdc.names, dropped=cdc.dropped)
    log_specs: list[AssetSpec] = []
    state_specs: list[AssetSpec] = []
    for namespace in state.namespaces:
        log_props = collection_props("changelog", namespace, cfg, settings, state)
        state_props = collection_props("current_state", namespace, cfg, settings, state)
        log_spec = mark_dropped(translator.get_asset_spec(log_props), state, namespace)
        state_spec = mark_dropped(translator.get_asset_spec(state_props), state, namespace)
        log_specs.append(log_spec)
        state_specs.append(state_spec)
        out.changelog_keys[log_spec.key] = namespace
        out.current_state_keys[state_spec.key] = namespace
        out.tables[namespace] = CollectionTables.under(
            settings.tables_root, namespace, changelog_name=translator.get_table_name(log_props),
            current_state_name=translator.get_table_name(state_props))
        out.table_names.update(_table_names(log_spec, state_spec))
    if not log_specs:
        return out
    upstream = {ns: [cdc.key(ns, kind) for kind in CDC_KINDS] for ns in state.namespaces}

    names = cdc.names

    @multi_asset(name=names.of("tables"), specs=[*log_specs, *state_specs], can_subset=True, pool=cdc.pools.tables,
                 required_resource_keys={names.mongocdc, names.pyspark},
                 description="Refreshes the selected collections' changelog tables from their landing files and "
                             "merges what each changelog gained into its current_state, collection by collection.")
    def tables_asset(context: AssetExecutionContext) -> Iterator[MaterializeResult]:
        mongocdc = resource_of(context, names.mongocdc, MongoCdcResource)
        pyspark = resource_of(context, names.pyspark, PySparkResource)
        spark: SparkSession = pyspark.spark_session
        selected = context.selected_asset_keys
        logs = {out.changelog_keys[k] for k in selected if k in out.changelog_keys}
        states = {out.current_state_keys[k] for k in selected if k in out.current_state_keys}
        work: list[tuple[CollectionTables, list[str] | None]] = []
        for namespace in sorted(logs | states):
            tables = out.tables[namespace]
            files = mongocdc.landing_files(namespace) if namespace in logs else None
            if table_exists(spark, tables.changelog) or (files is not None and landed_anything(files)):
                work.append((tables, files))
                continue
            if files is not None:
                context.log.info(f"{namespace}: nothing landed yet ({len(files)} empty landing file(s)); no table built")
                yield MaterializeResult(asset_key=out.key(namespace, "changelog"), metadata={
                    **not_built(namespace, f"{len(files)} landing file(s), none holding a row"),
                    "landing_files": len(files)})
            if namespace in states:
                context.log.info(f"{namespace}: no changelog yet (nothing landed); no table built")
                yield MaterializeResult(asset_key=out.key(namespace, "current_state"),
                                        metadata=not_built(namespace, "no changelog"))

        checked = checks_in_run(context) if work else set()
        # its check in this run compares the table at the position it is about to get: read the source there
        # while the server holds it (source_reads.py)
        reconciled = {ns for ns in states if ns not in out.dropped
                      and AssetCheckKey(out.key(ns, "current_state"), RECONCILE_CHECK) in checked}
        connector = mongocdc.load_config() if reconciled else None

        def read_early(tables: CollectionTables, done: ChangelogRefresh) -> None:
            if done.files_read and tables.namespace in reconciled and connector is not None:
                EARLY_READS.start(context.run.run_id, tables.namespace,
                                  partial(read_source_at, spark, tables, connector))

        failures: list[tuple[str, Exception]] = []
        for done in refresh_collections(spark, work, progress=context.log.info, states=states,
                                        after_changelog=read_early, landed=lambda t: mongocdc.landing_files(t.namespace)):
            namespace = done.namespace
            if done.changelog is not None:
                yield _changelog_result(context, out, done.changelog, len(done.landing_files or ()), upstream[namespace])
            if done.current_state is not None:
                # the changelog's schema as its refresh in this run left it (else as its table has it)
                log_schema = (done.changelog.schema if done.changelog is not None
                              else look(spark, out.tables[namespace].changelog).schema)
                yield _state_result(context, out, done.current_state, log_schema)
            if done.error is not None:
                failures.append(failed(context, namespace, done.error))
        if failures:
            raise failure(failures) from failures[0][1]

    out.definitions = [tables_asset]
    return out


def _changelog_result(context: AssetExecutionContext, out: TableAssets, done: ChangelogRefresh, given: int,
                      upstream: Sequence[AssetKey]) -> MaterializeResult:
    """A changelog's materialisation from its refresh of ``given`` landing files (what it did logged)."""
    namespace = done.namespace
    key = out.key(namespace, "changelog")
    if done.files_read:
        context.log.info(f"{namespace}: {done.files_read} new or re-written landing file(s) of {given}, "
                         f"{done.rows_added} rows added, {done.row_count} in the table")
    else:
        context.log.info(f"{namespace}: nothing new landed (all {given} landing file(s) read before); "
                         f"{done.work.jobs or 'no'} Spark job(s)")
    return MaterializeResult(asset_key=key, metadata={
        "collection": namespace,
        **({"dagster/table_name": out.table_names[key]} if key in out.table_names else {}),
        "dagster/uri": MetadataValue.path(out.tables[namespace].changelog),
        "dagster/row_count": done.row_count,
        "dagster/column_schema": spark_schema(done.schema),
        "dagster/column_lineage": changelog_lineage(done.schema, upstream),
        NEW_DATA: bool(done.files_read),
        "landing_files": given,
        "landing_files_read": done.files_read,
        "rows_added": done.rows_added,
        "rows_added_by_op": MetadataValue.json(dict(done.counts)),
        **work_metadata(done.work, rows_added_per_s=done.rows_added),
        **position_metadata("position", done.position),
    })


def _state_result(context: AssetExecutionContext, out: TableAssets, done: StateRefresh,
                  changelog: T.StructType) -> MaterializeResult:
    """A current_state's materialisation from its refresh (its schema changes logged as warnings), its lineage
    from the ``changelog`` schema."""
    namespace = done.namespace
    key = out.key(namespace, "current_state")
    tables = out.tables[namespace]
    for change in done.schema_changes:
        context.log.warning(f"{namespace}: {change}")
    new_data = bool(done.keys_merged)
    if not new_data:
        context.log.info(f"{namespace}: nothing new in the changelog since the table's version; "
                         f"{done.work.jobs or 'no'} Spark job(s)")
    return MaterializeResult(asset_key=key, metadata={
        "collection": namespace,
        **({"dagster/table_name": out.table_names[key]} if key in out.table_names else {}),
        "dagster/uri": MetadataValue.path(tables.current_state),
        "dagster/row_count": done.row_count,
        "dagster/column_schema": spark_schema(done.schema),
        "dagster/column_lineage": state_lineage(done.schema, changelog, out.key(namespace, "changelog")),
        NEW_DATA: new_data,
        "keys_merged": done.keys_merged,
        "rows_upserted": done.upserted,
        "rows_deleted": done.deleted,
        "schema_changes": MetadataValue.json(list(done.schema_changes)),
        **work_metadata(done.work, keys_merged_per_s=done.keys_merged),
        **position_metadata("position", done.position),
    })
