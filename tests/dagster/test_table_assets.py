"""Each collection's tables through Dagster: snapshot -> changelog -> current_state in one launch, then the
reconciliation at the table's position: passing while writes continue, failing on a corrupted row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dagster import AssetCheckKey, AssetKey, AssetSelection, DagsterInstance, Definitions, define_asset_job
from delta.tables import DeltaTable
from pymongo.database import Database
from pyspark.sql import functions as F

from mongocdc_core.tables import spark_session
from tests.dagster.cdc_helpers import CdcEnv, checks_of, make_env, materialization_metadata


def _reconcile(env: CdcEnv, instance: DagsterInstance, colls: list[str]) -> dict[str, Any]:
    """Run the standalone reconciliation checks of some collections (as the headless command does)."""
    keys = [AssetCheckKey(env.key(c, "current_state"), "matches_source") for c in colls]
    defs = Definitions.merge(env.defs, Definitions(jobs=[define_asset_job("reconcile", AssetSelection.checks(*keys))]))
    result = defs.resolve_job_def("reconcile").execute_in_process(instance=instance, raise_on_error=False)
    return {e.asset_key.path[1]: e for e in result.get_asset_check_evaluations()}


def test_one_launch_builds_a_collections_tables_and_reconciliation_holds_under_writes(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    db.orders.insert_many([{"_id": i, "qty": i, "tags": ["a"] * (i % 3)} for i in range(30)])
    db.customers.insert_many([{"_id": i, "name": f"c{i}"} for i in range(5)])
    env = make_env(tmp_path, mongo_uri, db, ["orders", "customers"])
    keys = [env.key("orders", k) for k in ("snapshot", "changelog", "current_state")]
    result = env.materialize(instance, keys)
    assert result.success and all(checks_of(result).values())
    log = materialization_metadata(instance, env.key("orders", "changelog"))
    state = materialization_metadata(instance, env.key("orders", "current_state"))
    assert log["dagster/row_count"] == 30 and state["dagster/row_count"] == 30
    assert "(clusterTime " in state["position"]
    for meta, rate, label in ((log, "rows_added_per_s", "changelog"), (state, "keys_merged_per_s", "current_state")):
        assert meta["spark_jobs"] >= 1 and meta["spark_tasks"] >= 1 and meta["duration_s"] > 0 and meta[rate] > 0
        said = [e.user_message for e in instance.all_logs(result.run_id)]
        assert any(m.startswith(f"{label} of {db.name}.orders: done in ") and
                   m.endswith(f", {meta['spark_jobs']} Spark job(s), {meta['spark_tasks']} task(s)") for m in said)
    assert "_id" in {c.name for c in state["dagster/column_schema"].columns}
    lineage = state["dagster/column_lineage"].deps_by_column
    log_columns = {c.name for c in log["dagster/column_schema"].columns}
    assert lineage and all(d.column_name in log_columns and d.asset_key == env.key("orders", "changelog")
                           for deps in lineage.values() for d in deps)  # only real columns
    log_lineage = log["dagster/column_lineage"].deps_by_column
    assert {d.asset_key for deps in log_lineage.values() for d in deps} == {
        env.key("orders", k) for k in ("snapshot", "incremental_snapshot", "slices")}
    assert instance.get_latest_materialization_event(env.key("customers", "current_state")) is None

    # writes after the table's position: the table is behind the source, yet equal to it at its position
    db.orders.insert_many([{"_id": 100 + i, "qty": 1} for i in range(5)])
    db.orders.update_one({"_id": 3}, {"$set": {"qty": 333}})
    db.orders.delete_one({"_id": 4})
    (check,) = _reconcile(env, instance, ["orders"]).values()
    meta = {k: v.value for k, v in check.metadata.items()}
    assert check.passed, check.description
    assert meta["table_rows"] == 30
    if meta["method"].startswith("snapshot read"):  # the source as it was at the table's position
        assert meta["keys_excluded"] == 0 and meta["source_rows"] == 30, meta
    else:  # read now, the 7 keys changed since (5 inserts, 1 update, 1 delete) left out
        assert meta["keys_excluded"] == 7 and meta["source_rows"] == 34, meta

    # a corrupted row is found, and named
    table = env.settings.tables_root + f"/{db.name}__orders__current"
    DeltaTable.forPath(spark_session("local[2]"), table).update(F.col("_id") == "7", {"qty": F.lit(-1)})
    (bad,) = _reconcile(env, instance, ["orders"]).values()
    assert not bad.passed and "DIFFERS" in (bad.description or "") and "7" in (bad.description or "")
    assert bad.asset_key == AssetKey([db.name, "orders", "current_state"])


def test_tables_built_before_the_first_snapshot_reconcile_once_it_lands(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """Issue 37, defect 1: the table automation built a collection's tables before anything had landed;
    then its first snapshot lands (integer keys) and the tables refresh: the blocking reconciliation
    passes, every key compared, and ``_id`` is typed by the keys."""
    env = make_env(tmp_path, mongo_uri, db, ["customers"])
    tables = [env.key("customers", k) for k in ("changelog", "current_state")]
    assert env.materialize(instance, tables).success
    assert materialization_metadata(instance, env.key("customers", "current_state"))["dagster/row_count"] == 0

    db.customers.insert_many([{"_id": i, "name": f"c{i}"} for i in range(4)])
    assert env.materialize(instance, [env.key("customers", "snapshot")]).success
    assert env.materialize(instance, tables).success
    (check,) = _reconcile(env, instance, ["customers"]).values()
    meta = {k: v.value for k, v in check.metadata.items()}
    assert check.passed, check.description
    assert meta["table_rows"] == meta["source_rows"] == 4 and meta["keys_excluded"] == 0, meta
    state = materialization_metadata(instance, env.key("customers", "current_state"))
    assert {c.name: c.type for c in state["dagster/column_schema"].columns}["_id"] == "bigint"
    assert state["schema_changes"] == ["field _id: string -> bigint", "added column name (string)"]
