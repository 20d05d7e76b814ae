"""Each collection's tables through Dagster: snapshot -> changelog -> current_state in one launch, then the
reconciliation at the table's position: passing while writes continue, failing on a corrupted row."""

from __future__ import annotations

import sys
import threading
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    AssetSelection,
    DagsterInstance,
    DagsterRunStatus,
    Definitions,
    RunRequest,
    build_sensor_context,
    define_asset_job,
    evaluate_automation_conditions,
)
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from delta.tables import DeltaTable
from pymongo import MongoClient
from pymongo.database import Database
from pyspark.sql import functions as F

from mongocdc_core.tables import spark_session
from mongocdc_dagster import check_cli
from mongocdc_dagster.partitions import floor_to
from mongocdc_dagster.source_reads import EARLY_READS
from tests.dagster.cdc_helpers import (
    CdcEnv,
    checks_of,
    make_env,
    materialization_metadata,
    partition_metadata,
)
from tests.dagster.time_travel import travelling_replica_set


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
    graph = env.defs.resolve_asset_graph()  # materialisations name the table as the definition does
    for meta, kind, name in ((log, "changelog", f"{db.name}__orders__changelog"),
                             (state, "current_state", f"{db.name}__orders__current")):
        key = env.key("orders", kind)
        assert meta["dagster/table_name"] == graph.get(key).metadata["dagster/table_name"] == name
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

    # nothing landed since: refreshing the tables again runs no Spark job, and their materialisations say so
    again = env.materialize(instance, keys[1:])
    assert again.success and all(checks_of(again).values())
    for kind in ("changelog", "current_state"):
        meta = materialization_metadata(instance, env.key("orders", kind))
        assert (meta["new_data"], meta["spark_jobs"], meta["dagster/row_count"]) == (False, 0, 30), (kind, meta)
        assert meta["dagster/column_schema"] == (log if kind == "changelog" else state)["dagster/column_schema"]
    said = [e.user_message for e in instance.all_logs(again.run_id)]
    assert any(m.startswith(f"{db.name}.orders: nothing new landed") for m in said), said

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


def _refresh_with_checks(env: CdcEnv, instance: DagsterInstance, colls: list[str],
                         kinds: tuple[str, ...] = ("snapshot", "changelog", "current_state")) -> Any:
    """One run refreshing the collections' tables, their checks riding along (as the table automation's
    runs and a UI launch have them): the reconciliation runs right after the refresh."""
    keys = [env.key(c, k) for c in colls for k in kinds]
    job = define_asset_job("refresh", AssetSelection.assets(*keys))
    defs = Definitions.merge(env.defs, Definitions(jobs=[job]))
    return defs.resolve_job_def("refresh").execute_in_process(instance=instance)


def test_each_collections_current_state_is_refreshed_right_after_its_changelog_in_one_step(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """The changelogs and current_states of every collection are one step, and a collection's current_state
    is materialised as soon as its own changelog is refreshed, not once every changelog is: the run's first
    current_state materialisation comes before its last changelog materialisation."""
    colls = ["orders", "customers"]
    for name in colls:
        db[name].insert_many([{"_id": i, "n": i} for i in range(3)])
    env = make_env(tmp_path, mongo_uri, db, colls)
    result = _refresh_with_checks(env, instance, colls)
    assert result.success and all(checks_of(result).values())
    tables = {env.key(c, kind): kind for c in colls for kind in ("changelog", "current_state")}
    made = [e for e in result.all_events if e.event_type == DagsterEventType.ASSET_MATERIALIZATION
            and e.asset_key in tables]
    assert sorted(tables[e.asset_key] for e in made) == sorted(tables.values())
    assert len({e.step_key for e in made}) == 1
    kinds = [tables[e.asset_key] for e in made]
    assert kinds.index("current_state") < len(kinds) - 1 - kinds[::-1].index("changelog"), kinds


def test_a_hot_collection_reconciled_in_its_refreshs_run_compares_every_key(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    db.orders.insert_many([{"_id": i, "qty": i} for i in range(200)])
    env = make_env(tmp_path, mongo_uri, db, ["orders"])
    graph = env.defs.resolve_asset_graph()
    check_key = AssetCheckKey(env.key("orders", "current_state"), "matches_source")
    # no condition of its own: the automation's refresh runs take it along, after the refresh
    assert graph.get(check_key).automation_condition is None
    env.materialize(instance, [env.key("orders", "snapshot")])
    stop = threading.Event()
    written = [0]

    def writer() -> None:  # changes every key, again and again, while the tables refresh and reconcile
        while not stop.is_set():
            db.orders.update_one({"_id": written[0] % 200}, {"$inc": {"qty": 1}})
            written[0] += 1

    thread = threading.Thread(target=writer, name="writer")
    thread.start()
    try:
        result = _refresh_with_checks(env, instance, ["orders"], ("changelog", "current_state"))
    finally:
        stop.set()
        thread.join()
    assert written[0] >= 200, "the writer did not change every key during the run"
    (check,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "matches_source"]
    meta = {k: v.value for k, v in check.metadata.items()}
    assert check.passed, check.description
    assert meta["method"].startswith("snapshot read at"), meta  # at a position the server still holds
    assert meta["source_read"] == "after the changelog refresh", meta  # read once its changelog was refreshed
    assert meta["keys_compared"] == 200 and meta["keys_excluded"] == 0 and meta["coverage"] == 1.0, meta
    assert "200 of 200 keys compared (100%); matches" in (check.description or "")


def _cli(env: CdcEnv, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``mongocdc check -m <these definitions> args``: its exit code and what it printed."""
    module = types.ModuleType("mongocdc_test_definitions")
    module.defs = env.defs  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        code = check_cli.main(["-m", f"{module.__name__}:defs", *args])
    finally:
        del sys.modules[module.__name__]
    return code, capsys.readouterr().out


@pytest.mark.fault
def test_a_check_that_compared_no_key_is_not_a_pass_in_dagster_nor_on_the_command_line(
        tmp_path: Path, instance: DagsterInstance, capsys: pytest.CaptureFixture[str]) -> None:
    """The table's position left the snapshot history (the emulator's clock jumps past its 300 s) and every
    key changed since: the check compared nothing, so it is not a PASS; ``mongocdc check`` says so."""
    with travelling_replica_set(behind_s=3600) as (uri, clock), MongoClient(uri) as client:
        db = client["hist"]
        db.create_collection("signals")
        db.orders.insert_many([{"_id": i, "qty": i} for i in range(40)])
        env = make_env(tmp_path, uri, db, ["orders"])
        assert _refresh_with_checks(env, instance, ["orders"]).success
        db.orders.update_many({}, {"$inc": {"qty": 1}})
        now = db.command("ping")["operationTime"]
        clock.jump_to(datetime.fromtimestamp(now.time + 400, UTC))
        db.other.insert_one({"_id": 1})  # the cluster time moves on

        (check,) = _reconcile(env, instance, ["orders"]).values()
        meta = {k: v.value for k, v in check.metadata.items()}
        assert not check.passed and meta["verdict"] == "unverified", check.description
        # nothing is known to be wrong: a warning, which fails no run and blocks nothing downstream
        assert check.severity == AssetCheckSeverity.WARN and meta["source_read"] == "at the check", meta
        assert (meta["keys_compared"], meta["keys_excluded"], meta["coverage"]) == (0, 40, 0.0), meta
        assert "0 of 40 keys compared (0%), below the 90% required: NOT VERIFIED" in (check.description or "")

        code, unverified = _cli(env, capsys, "--collection", "hist.orders", "--check", "matches_source")
        lenient, passing = _cli(env, capsys, "--collection", "hist.orders", "--check", "matches_source",
                                "--min-coverage", "0")
        assert code == check_cli.EXIT_UNVERIFIED, unverified
        assert "UNVERIFIED hist/orders/current_state  matches_source  blocking" in unverified
        assert "1 check(s), 0 blocking failure(s), 1 not verified" in unverified
        assert lenient == 0 and "PASS  hist/orders/current_state" in passing, passing


@pytest.mark.fault
def test_the_check_in_a_refresh_run_compares_with_the_source_read_after_the_changelog_refresh(
        tmp_path: Path, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch) -> None:
    """The changelog step reads each collection at the position its current_state is about to get, in the
    background; the check in the same run compares with that read. Here the run takes longer than the
    server's snapshot history before its check (the emulator's clock jumps past its 300 s once the read is
    done) and every key changed meanwhile: the check still compares every key, and passes; reconciled on its
    own afterwards, reading the source then, it compares none (a warning, not a pass)."""
    with travelling_replica_set(behind_s=3600) as (uri, clock), MongoClient(uri) as client:
        db = client["early"]
        db.create_collection("signals")
        db.orders.insert_many([{"_id": i, "qty": i} for i in range(40)])
        env = make_env(tmp_path, uri, db, ["orders"])
        assert env.materialize(instance, [env.key("orders", "snapshot")]).success
        take = EARLY_READS.take

        def history_lost_before_the_check(run_id: str, namespace: str) -> Any:
            read = take(run_id, namespace)  # the read is done
            db.orders.update_many({}, {"$inc": {"qty": 1}})
            now = db.command("ping")["operationTime"]
            clock.jump_to(datetime.fromtimestamp(now.time + 400, UTC))
            db.other.insert_one({"_id": 1})  # the cluster time moves on
            return read

        monkeypatch.setattr(EARLY_READS, "take", history_lost_before_the_check)
        result = _refresh_with_checks(env, instance, ["orders"], ("changelog", "current_state"))
        assert result.success
        (check,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "matches_source"]
        meta = {k: v.value for k, v in check.metadata.items()}
        assert check.passed and meta["source_read"] == "after the changelog refresh", check.description
        assert (meta["keys_compared"], meta["keys_excluded"], meta["coverage"]) == (40, 0, 1.0), meta
        monkeypatch.undo()

        (alone,) = _reconcile(env, instance, ["orders"]).values()
        meta = {k: v.value for k, v in alone.metadata.items()}
        assert not alone.passed and alone.severity == AssetCheckSeverity.WARN and meta["keys_compared"] == 0, meta


def test_the_table_automation_refreshes_what_landed_once_and_queues_none_behind_a_running_refresh(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A fresh deployment builds no table before something landed; a landing requests one refresh of
    that collection's tables only, and while it is queued or running a further landing requests none
    (the next refresh takes it, once)."""
    db.orders.insert_many([{"_id": i, "qty": i} for i in range(5)])
    db.quiet.insert_many([{"_id": i} for i in range(3)])  # never snapshotted: nothing of it lands
    env = make_env(tmp_path, mongo_uri, db, ["orders", "quiet"])
    tables = [env.key(c, k) for c in ("orders", "quiet") for k in ("changelog", "current_state")]
    first = evaluate_automation_conditions(defs=env.defs, instance=instance)
    assert first.total_requested == 0  # nothing landed: no empty tables

    env.materialize(instance, [env.key("orders", "snapshot")])
    landed = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=first.cursor)
    orders = [env.key("orders", "changelog"), env.key("orders", "current_state")]
    assert {k for k in tables if landed.get_num_requested(k)} == set(orders)

    job = Definitions.merge(env.defs, Definitions(jobs=[define_asset_job("refresh", AssetSelection.assets(*orders))]))
    running = instance.create_run_for_job(job.resolve_job_def("refresh"), status=DagsterRunStatus.STARTED)
    tick = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=landed.cursor)
    assert tick.total_requested == 0
    env.materialize(instance, [env.key("orders", "snapshot")])  # lands again while the refresh runs
    behind = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=tick.cursor)
    assert behind.total_requested == 0, "a second refresh was queued behind the running one"
    instance.report_run_canceled(running)
    after = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=behind.cursor)
    assert {k for k in tables if after.get_num_requested(k)} == set(orders)  # the landing is refreshed once

    # a refresh that selects a collection with nothing landed (its empty slices landed, say) builds no table
    # for it, and its check warns instead of failing on an empty table against a collection never copied
    result = _refresh_with_checks(env, instance, ["orders", "quiet"], ("changelog", "current_state"))
    assert result.success
    assert not any(Path(env.settings.tables_root).glob(f"{db.name}__quiet__*"))
    for kind in ("changelog", "current_state"):
        assert materialization_metadata(instance, env.key("quiet", kind))["built"] is False
    checks = {e.asset_key.path[1]: e for e in result.get_asset_check_evaluations()}
    assert checks["orders"].passed
    quiet = checks["quiet"]
    assert not quiet.passed and quiet.severity == AssetCheckSeverity.WARN and "nothing of it has landed" in (
        quiet.description or "")
    code, said = _cli(env, capsys, "--collection", env.ns("quiet"), "--check", "matches_source")
    assert code == 0 and f"WARN  {db.name}/quiet/current_state  matches_source  blocking" in said, said


def test_a_landing_during_a_refresh_is_refreshed_once_the_refresh_ends(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """Data that lands while a refresh runs is refreshed when that refresh ends, having materialised the
    tables from what had landed before (it was picked up only after the next landing: the refresh's
    own materialisation counted as handling it), and no second refresh is queued while it runs."""
    db.orders.insert_many([{"_id": i, "qty": i} for i in range(5)])
    env = make_env(tmp_path, mongo_uri, db, ["orders"])
    orders = [env.key("orders", "changelog"), env.key("orders", "current_state")]
    first = evaluate_automation_conditions(defs=env.defs, instance=instance)
    env.materialize(instance, [env.key("orders", "snapshot")])
    landed = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=first.cursor)
    assert {k for k in orders if landed.get_num_requested(k)} == set(orders)

    job = Definitions.merge(env.defs, Definitions(jobs=[define_asset_job("refresh", AssetSelection.assets(*orders))]))
    running = instance.create_run_for_job(job.resolve_job_def("refresh"), status=DagsterRunStatus.STARTED,
                                          asset_selection=frozenset(orders))
    env.materialize(instance, [env.key("orders", "snapshot")])  # lands while the refresh runs
    behind = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=landed.cursor)
    assert behind.total_requested == 0, "a second refresh was queued behind the running one"
    for key in orders:  # the running refresh ends, having materialised the tables
        instance.report_dagster_event(DagsterEvent(
            event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value, job_name=running.job_name,
            event_specific_data=StepMaterializationData(AssetMaterialization(key))), run_id=running.run_id)
    instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.RUN_SUCCESS.value,
                                               job_name=running.job_name), run_id=running.run_id)
    assert instance.get_run_by_id(running.run_id).status == DagsterRunStatus.SUCCESS  # type: ignore[union-attr]
    after = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=behind.cursor)
    assert {k for k in orders if after.get_num_requested(k)} == set(orders)  # what landed during it, once
    instance.create_run_for_job(job.resolve_job_def("refresh"), status=DagsterRunStatus.STARTED,
                                asset_selection=frozenset(orders))
    again = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=after.cursor)
    assert again.total_requested == 0  # requested once: that refresh handles it


def test_collections_that_land_during_another_refresh_are_refreshed_together_in_one_run(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """A collection that lands while another's refresh runs waits for it, and the next tick refreshes both in
    one run (their changelog and current_state, with their blocking checks). It was requested alone, to queue
    behind the running refresh for the tables' pool, and from then on the two were refreshed in runs of their
    own, each starting a Spark session."""
    for coll in ("orders", "items"):
        db[coll].insert_many([{"_id": i, "qty": i} for i in range(3)])
    env = make_env(tmp_path, mongo_uri, db, ["orders", "items"])
    sensor = env.defs.get_sensor_def("mongocdc_table_automation")
    repository = env.defs.get_repository_def()

    def tick(cursor: str | None) -> tuple[list[RunRequest], str | None]:
        result = sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=cursor,
                                                           repository_def=repository))
        return list(result.run_requests or []), result.cursor

    requests, cursor = tick(None)
    assert requests == []
    env.materialize(instance, [env.key("orders", "snapshot")])
    requests, cursor = tick(cursor)
    orders = {env.key("orders", "changelog"), env.key("orders", "current_state")}
    assert [set(r.asset_selection or ()) for r in requests] == [orders]
    job = Definitions.merge(env.defs, Definitions(jobs=[define_asset_job("refresh", AssetSelection.assets(*orders))]))
    running = instance.create_run_for_job(job.resolve_job_def("refresh"), status=DagsterRunStatus.STARTED,
                                          asset_selection=frozenset(orders))

    env.materialize(instance, [env.key("items", "snapshot")])  # lands while orders' refresh runs
    requests, cursor = tick(cursor)
    assert requests == [], "a refresh of items alone was queued behind orders' refresh"
    for key in orders:  # orders' refresh ends, having materialised its tables
        instance.report_dagster_event(DagsterEvent(
            event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value, job_name=running.job_name,
            event_specific_data=StepMaterializationData(AssetMaterialization(key))), run_id=running.run_id)
    instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.RUN_SUCCESS.value,
                                               job_name=running.job_name), run_id=running.run_id)
    env.materialize(instance, [env.key("orders", "snapshot")])  # and orders lands again
    requests, cursor = tick(cursor)
    tables = {env.key(c, k) for c in ("orders", "items") for k in ("changelog", "current_state")}
    assert [set(r.asset_selection or ()) for r in requests] == [tables], requests
    checks = requests[0].asset_check_keys
    assert checks is None or {AssetCheckKey(env.key(c, "current_state"), "matches_source")
                              for c in ("orders", "items")} <= set(checks)


def test_a_landing_is_refreshed_while_the_next_window_is_being_landed(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """Slices land every window; on a loaded machine the next window's run is always queued or running, so
    a refresh that waited for no slice run in progress never came (the soak's tables never refreshed)."""
    db.orders.insert_many([{"_id": i, "qty": i} for i in range(5)])
    env = make_env(tmp_path, mongo_uri, db, ["orders"])
    first = evaluate_automation_conditions(defs=env.defs, instance=instance)
    env.materialize(instance, [env.key("orders", "snapshot")])
    slices = env.key("orders", "slices")
    job = Definitions.merge(env.defs, Definitions(jobs=[define_asset_job("land", AssetSelection.assets(slices))]))
    landing = instance.create_run_for_job(job.resolve_job_def("land"), status=DagsterRunStatus.STARTED,
                                          tags={"dagster/partition": "2026-01-01-00:00"})
    assert instance.get_run_by_id(landing.run_id) is not None
    tick = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=first.cursor)
    orders = {env.key("orders", "changelog"), env.key("orders", "current_state")}
    assert {k for k in orders if tick.get_num_requested(k)} == orders


def test_tables_built_before_the_first_snapshot_reconcile_once_it_lands(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """Issue 37, defect 1: the table automation refreshed a collection's tables before anything had landed
    (no table is written then, so none fixes a type; a table built empty decides none either, see
    tests/tables/test_reconcile.py); then its first snapshot lands (integer keys) and the tables refresh:
    the blocking reconciliation passes, every key compared, and ``_id`` is typed by the keys."""
    env = make_env(tmp_path, mongo_uri, db, ["customers"])
    tables = [env.key("customers", k) for k in ("changelog", "current_state")]
    assert env.materialize(instance, tables).success
    assert materialization_metadata(instance, env.key("customers", "current_state"))["built"] is False

    db.customers.insert_many([{"_id": i, "name": f"c{i}"} for i in range(4)])
    assert env.materialize(instance, [env.key("customers", "snapshot")]).success
    assert env.materialize(instance, tables).success
    (check,) = _reconcile(env, instance, ["customers"]).values()
    meta = {k: v.value for k, v in check.metadata.items()}
    assert check.passed, check.description
    assert meta["table_rows"] == meta["source_rows"] == 4 and meta["keys_excluded"] == 0, meta
    state = materialization_metadata(instance, env.key("customers", "current_state"))
    assert {c.name: c.type for c in state["dagster/column_schema"].columns}["_id"] == "bigint"
    assert state["dagster/row_count"] == 4


def test_a_failed_refresh_is_retried_after_its_back_off_without_a_new_landing(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """A refresh that failed (its landing file unreadable: a torn copy, then restored) is requested again
    once its back-off passed, with nothing new landed (before, the failed request counted as handled: a
    quiet collection's tables were never refreshed again); one that keeps failing is requested once per
    back-off period (``*/5 * * * *``), not on every tick."""
    db.orders.insert_many([{"_id": i, "qty": i} for i in range(5)])
    env = make_env(tmp_path, mongo_uri, db, ["orders"])
    orders = [env.key("orders", "changelog"), env.key("orders", "current_state")]
    job = Definitions.merge(env.defs, Definitions(jobs=[define_asset_job("refresh", AssetSelection.assets(*orders))]))

    def refresh() -> bool:  # the requested refresh, run as the automation's run is (selecting the tables)
        return job.resolve_job_def("refresh").execute_in_process(
            instance=instance, asset_selection=orders, raise_on_error=False).success

    now = datetime.now(UTC).replace(second=0, microsecond=0)
    clock = now.replace(minute=now.minute - now.minute % 5) + timedelta(seconds=10)  # just after a back-off tick
    tick = evaluate_automation_conditions(defs=env.defs, instance=instance, evaluation_time=clock)

    def ticks(minutes: float) -> list[datetime]:
        """Evaluate the automation every 30 s for ``minutes``; when it requests the tables, run that refresh.
        The times of the requests."""
        nonlocal tick, clock
        requested = []
        for _ in range(int(minutes * 2)):
            clock += timedelta(seconds=30)
            tick = evaluate_automation_conditions(defs=env.defs, instance=instance, evaluation_time=clock,
                                                  cursor=tick.cursor)
            if tick.total_requested:
                assert {k for k in orders if tick.get_num_requested(k)} == set(orders)
                requested.append(clock)
                refresh()
        return requested

    env.materialize(instance, [env.key("orders", "snapshot")])
    (landing,) = [Path(f) for f in env.mongocdc.landing_files(env.ns("orders"))]
    good = landing.read_bytes()
    landing.write_bytes(good[: len(good) // 2])  # torn: the refresh the landing requests fails
    clock += timedelta(seconds=30)
    tick = evaluate_automation_conditions(defs=env.defs, instance=instance, evaluation_time=clock, cursor=tick.cursor)
    assert {k for k in orders if tick.get_num_requested(k)} == set(orders)
    assert not refresh()
    landing.write_bytes(good)  # restored; nothing new lands

    assert ticks(4) == []  # within the back-off: not retried
    (retried,) = ticks(1)  # the back-off's tick passed: retried, and the retry succeeds
    assert (retried.minute % 5, retried.second) == (0, 10), retried
    assert materialization_metadata(instance, env.key("orders", "current_state"))["dagster/row_count"] == 5
    assert ticks(11) == []  # refreshed: nothing failed, nothing landed

    landing.write_bytes(good[: len(good) // 2])  # the landing file turns unreadable for good
    assert not refresh()  # a refresh launched by hand fails: retried after the back-off, not on the next tick
    requested = ticks(20)
    assert len(requested) == 4, requested  # once per back-off period of the 20 minutes, not every tick
    assert all((at.minute % 5, at.second) == (0, 10) for at in requested), requested


def test_a_window_that_landed_empty_requests_no_refresh(tmp_path: Path, instance: DagsterInstance) -> None:
    """Issue 37, defect 6: a quiet collection's slices land every window, nearly all of them empty, and each
    asked for a refresh of its tables. Only a window that held an event does now (real slice runs)."""
    with travelling_replica_set(behind_s=3600) as (uri, clock), MongoClient(uri) as client:
        db = client["quietly"]
        db.create_collection("signals")
        db.orders.insert_many([{"_id": i, "qty": i} for i in range(3)])
        first = floor_to(clock.now(), 60) + timedelta(minutes=1)
        env = make_env(tmp_path, uri, db, ["orders"], start=first.isoformat())
        orders = {env.key("orders", "changelog"), env.key("orders", "current_state")}
        slices = env.key("orders", "slices")
        tick = evaluate_automation_conditions(defs=env.defs, instance=instance)
        assert env.materialize(instance, [env.key("orders", "snapshot")]).success
        tick = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=tick.cursor)
        assert {k for k in orders if tick.get_num_requested(k)} == orders  # the snapshot landed
        tick = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=tick.cursor)
        assert tick.total_requested == 0

        clock.jump_to(first + timedelta(minutes=1, seconds=5))  # window 0 passes without a write
        db.other.insert_one({"_id": "tick"})
        assert env.materialize(instance, [slices], partition_key=first.strftime("%Y-%m-%d-%H:%M")).success
        assert partition_metadata(instance, slices, first.strftime("%Y-%m-%d-%H:%M"))["new_data"] is False
        tick = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=tick.cursor)
        assert tick.total_requested == 0, "an empty window requested a refresh"

        db.orders.update_one({"_id": 1}, {"$set": {"qty": 10}})  # window 1 holds a change
        clock.jump_to(first + timedelta(minutes=2, seconds=5))
        db.other.insert_one({"_id": "tock"})
        second = (first + timedelta(minutes=1)).strftime("%Y-%m-%d-%H:%M")
        assert env.materialize(instance, [slices], partition_key=second).success
        assert partition_metadata(instance, slices, second)["dagster/row_count"] == 1
        tick = evaluate_automation_conditions(defs=env.defs, instance=instance, cursor=tick.cursor)
        assert {k for k in orders if tick.get_num_requested(k)} == orders
