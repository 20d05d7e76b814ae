"""Asset checks that stand on their own (runnable without materialising, e.g. from CI):

- ``matches_source`` on each ``current_state`` (blocking): the table equals the MongoDB collection as it
  was at the table's position (``reconcile_at_position``), so it holds while writes continue and still
  fails on a corrupted row; one result per collection. It says how many keys it compared, and is no
  pass below ``min_coverage`` of them (run config): a WARN then (nothing is known to be wrong), a
  difference an ERROR. Having no automation condition of its own, it rides along in every run that
  refreshes its current_state, right after the refresh, comparing with the source read when the
  changelog was refreshed (``source_reads.py``): at a position the server still holds, so it compares
  every key even on a hot collection. Before anything of the collection
  landed there is no table to compare: a warning (not a pass, not blocking) says to snapshot it. A dropped
  collection's passes (``verdict: dropped``): nothing is wrong, there is nothing to compare with; so does
  one a run reconciles after the drop and before discovery found it gone, once the server no longer holds
  the table's position (the reconciliation then finds it gone itself).
- ``no_gap_since_snapshot`` on each collection's slices (not blocking, on its own schedule): every closed
  window since the collection's snapshot is landed. Cross-window, so it reads the instance, not a run. A
  window that cannot be landed any more (see ``gaps.py``) is an ERROR, one behind the last landed window
  still to land a WARN; windows closed since the last landed one (the schedule's next run's) pass.

The per-file checks (envelopes, snapshot counts) run inside the materialising run, see assets/cdc.py;
freshness is the translator's ``FreshnessPolicy``.

No ``from __future__ import annotations``: Dagster resolves the resource annotations at definition time.
"""

from collections.abc import Iterator

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    Config,
    MetadataValue,
    multi_asset_check,
)
from dagster._time import get_current_datetime
from dagster_pyspark import PySparkResource
from pydantic import Field
from pyspark.sql import SparkSession

from mongocdc_core.tables.changelog import table_exists
from mongocdc_core.tables.collection import Reconciliation, reconcile_at_position
from mongocdc_core.tables.reconcile import DEFAULT_MIN_COVERAGE
from mongocdc_dagster.assets.cdc import CdcAssets
from mongocdc_dagster.assets.tables import TableAssets, each_finished, landed_anything
from mongocdc_dagster.gaps import GAP_CHECK, failed_repairs, judge, readable_oplog_start
from mongocdc_dagster.metadata import position_time
from mongocdc_dagster.pools import Pools
from mongocdc_dagster.resources import MongoCdcResource, resource_of
from mongocdc_dagster.source_reads import EARLY_READS, RECONCILE_CHECK


class ReconcileConfig(Config):
    """Run config of ``matches_source``."""

    min_coverage: float = Field(
        default=DEFAULT_MIN_COVERAGE, ge=0.0, le=1.0,
        description="the share of keys that must be compared for a pass (keys changed since the table's "
                    "position are left out when the server no longer holds it)")


def build_reconciliation_check(tables: TableAssets) -> AssetChecksDefinition | None:
    """``matches_source`` for every collection's current_state."""
    specs = [
        AssetCheckSpec(RECONCILE_CHECK, asset=key, blocking=True,
                       description="current_state equals the collection as it was at the table's position "
                                   "(keys changed since then are left out and counted; no pass below "
                                   "min_coverage of the keys compared)")
        for key in tables.current_state_keys
    ]
    if not specs:
        return None

    names = tables.names

    @multi_asset_check(name=names.of("reconciliation"), specs=specs, can_subset=True, pool=Pools.of(names).tables,
                       required_resource_keys={names.mongocdc, names.pyspark},
                       description="Reconciles each selected current_state with MongoDB at the table's position.")
    def reconciliation(context: AssetCheckExecutionContext, config: ReconcileConfig) -> Iterator[AssetCheckResult]:
        mongocdc = resource_of(context, names.mongocdc, MongoCdcResource)
        pyspark = resource_of(context, names.pyspark, PySparkResource)
        spark: SparkSession = pyspark.spark_session
        cfg = mongocdc.load_config()
        work: list[tuple[AssetCheckKey, str]] = []
        for check_key in sorted(context.selected_asset_check_keys, key=lambda k: k.asset_key.to_user_string()):
            namespace = tables.current_state_keys[check_key.asset_key]
            if namespace in tables.dropped:
                when = tables.dropped[namespace].isoformat(timespec="seconds")
                yield AssetCheckResult(  # nothing wrong: the table keeps the collection's last state
                    asset_key=check_key.asset_key, check_name=RECONCILE_CHECK, passed=True,
                    description=f"{namespace}: dropped (no longer captured since {when}); no collection to compare "
                                "the table with",
                    metadata={"collection": namespace, "verdict": "dropped", "keys_compared": 0})
                continue
            if (not table_exists(spark, tables.tables[namespace].current_state)
                    and not landed_anything(mongocdc.landing_files(namespace))):
                yield AssetCheckResult(
                    asset_key=check_key.asset_key, check_name=RECONCILE_CHECK, passed=False,
                    severity=AssetCheckSeverity.WARN,
                    description=f"{namespace}: no table to compare yet, nothing of it has landed; snapshot the "
                                "collection to build its tables",
                    metadata={"collection": namespace, "verdict": "not_built", "keys_compared": 0})
                continue
            work.append((check_key, namespace))

        def reconcile(session: SparkSession, item: tuple[AssetCheckKey, str]) -> Reconciliation:
            early = EARLY_READS.take(context.run.run_id, item[1])  # read when its changelog was refreshed
            if isinstance(early, Exception):
                context.log.warning(f"{item[1]}: the source's read after the changelog refresh failed "
                                    f"({type(early).__name__}: {early}); reading it now")
                early = None
            return reconcile_at_position(session, tables.tables[item[1]], cfg, progress=context.log.info,
                                         min_coverage=config.min_coverage, source=early)

        # several collections at once, as their refresh does: one after another, the last ones' positions
        # left the server's snapshot history (5 minutes) on a loaded machine and were NOT VERIFIED
        try:
            yield from (_result(check_key, namespace, result) for (check_key, namespace), result
                        in each_finished(context, spark, work, reconcile, lambda item: item[1]))
        finally:
            EARLY_READS.drop(context.run.run_id)

    return reconciliation


def _result(check_key: AssetCheckKey, namespace: str, result: Reconciliation) -> AssetCheckResult:
    """``matches_source``'s result: a difference found is an ERROR (blocking); no difference found with too
    few keys compared (the table's position left the server's snapshot history and most keys changed since)
    is no pass but a WARN: nothing is known to be wrong, so it neither fails the run nor blocks what is
    downstream, and its metadata says how much was compared (``verdict: unverified``, ``coverage``)."""
    where = position_time(result.position) or "no position (empty table)"
    return AssetCheckResult(
        asset_key=check_key.asset_key,
        check_name=RECONCILE_CHECK,
        passed=result.passed,
        severity=AssetCheckSeverity.WARN if result.verdict == "unverified" else AssetCheckSeverity.ERROR,
        description=(f"{namespace} at {where}: table {result.table_rows} rows, source {result.source_rows} "
                     f"({result.method}); {result.summary()}"),
        metadata={
            "collection": namespace,
            "position": where,
            "method": result.method,
            "verdict": result.verdict,
            "table_rows": result.table_rows,
            "source_rows": result.source_rows,
            "keys_compared": result.keys_compared,
            "keys_excluded": result.keys_excluded,
            "coverage": round(result.coverage, 4),
            "min_coverage": result.min_coverage,
            "mismatching_keys": MetadataValue.json(list(result.mismatching_keys)),
            "source_read": "after the changelog refresh" if result.read_early else "at the check",
        },
    )


def build_gap_check(cdc: CdcAssets) -> AssetChecksDefinition | None:
    """``no_gap_since_snapshot`` for every collection's slices."""
    slices = cdc.keys_of("slices")
    specs = [AssetCheckSpec(GAP_CHECK, asset=key, blocking=False,
                            description="every closed window since the collection's snapshot is landed")
             for key in slices]
    if not specs:
        return None

    @multi_asset_check(name=cdc.names.of("continuity"), specs=specs, can_subset=True,
                       required_resource_keys={cdc.names.mongocdc},
                       description="Finds windows missing between each collection's snapshot and now, and fails "
                                   "(ERROR) on those that cannot be landed any more.")
    def continuity(context: AssetCheckExecutionContext) -> Iterator[AssetCheckResult]:
        now = get_current_datetime()
        # None: judged by the attempts alone; the oplog-window sensor reports the rest
        oplog_first = readable_oplog_start(resource_of(context, cdc.names.mongocdc, MongoCdcResource))
        failed = failed_repairs(context.instance, cdc.windows)
        selected = sorted(context.selected_asset_check_keys, key=lambda k: k.asset_key.to_user_string())
        histories = cdc.histories(context.instance, [slices[check_key.asset_key] for check_key in selected])
        for check_key in selected:
            verdict = judge(cdc, histories[slices[check_key.asset_key]], now, oplog_first, failed)
            yield verdict.result(check_key.asset_key)

    return continuity


def blocking_check_keys(checks: list[AssetChecksDefinition]) -> set[AssetCheckKey]:
    """The checks whose failure blocks downstream assets (and fails the headless CI command)."""
    return {spec.key for definition in checks for spec in definition.check_specs if spec.blocking}
