"""Materialising the per-collection CDC assets against the replica set under test (emulated unless a real URI is set)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from dagster import AssetKey, DagsterInstance
from pymongo.database import Database

from mongocdc_core.positions import Position
from mongocdc_dagster.assets.cdc import source_count_result
from mongocdc_dagster.landing_checks import count_rows_at
from mongocdc_dagster.translator import MongoCdcAssetProps, MongoCdcTranslator
from tests.dagster.cdc_helpers import checks_of, make_env, materialization_metadata


def test_one_run_snapshots_the_selected_collections_each_its_own_asset(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    db.customers.insert_many([{"_id": i, "name": f"c{i}", "tier": i % 3} for i in range(25)])
    db.orders.insert_many([{"_id": i, "qty": i} for i in range(7)])
    env = make_env(tmp_path, mongo_uri, db, ["customers", "orders", "products"])
    customers, orders = env.key("customers", "snapshot"), env.key("orders", "snapshot")
    assert customers == AssetKey([db.name, "customers", "snapshot"])
    result = env.materialize(instance, [customers, orders])
    assert result.success
    assert checks_of(result) == {(k.to_user_string(), c): True for k in (customers, orders)
                                 for c in ("landing_envelopes", "source_count")}
    meta = materialization_metadata(instance, customers)
    assert meta["dagster/row_count"] == 25 and meta["collection"] == env.ns("customers")
    assert "(clusterTime " in meta["position"] and meta["debezium/snapshot/SnapshotCompleted"] is True
    path = Path(meta["dagster/uri"])
    assert path == env.settings.landing_dir / "snapshot" / env.ns("customers") / "snapshot.parquet"
    table = pq.read_table(path)
    assert table.num_rows == 25 and set(table["op"].to_pylist()) == {"r"}
    assert set(table["position"].to_pylist()) == {meta["position_raw"]}
    assert materialization_metadata(instance, orders)["dagster/row_count"] == 7
    assert instance.get_latest_materialization_event(env.key("products", "snapshot")) is None  # not selected

    db.customers.delete_many({"_id": {"$gte": 20}})
    assert env.materialize(instance, [customers]).success
    again = materialization_metadata(instance, customers)
    assert Position.parse(again["position_raw"]) > Position.parse(meta["position_raw"])
    assert pq.read_table(path).num_rows == 20
    assert [p.name for p in path.parent.iterdir()] == ["snapshot.parquet"]  # replaced, no temp files left


def test_incremental_snapshot_lands_reads_with_their_chunk_positions(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    db.ledger.insert_many([{"_id": i, "amount": i * 10} for i in range(40)])
    env = make_env(tmp_path, mongo_uri, db, ["ledger"])
    key = env.key("ledger", "incremental_snapshot")
    result = env.materialize(instance, [key])
    assert result.success and all(checks_of(result).values()) and len(checks_of(result)) == 2
    meta = materialization_metadata(instance, key)
    assert meta["dagster/row_count"] == 40
    path = Path(meta["dagster/uri"])
    assert path == env.settings.landing_dir / "incremental_snapshot" / env.ns("ledger") / "snapshot.parquet"
    reads = [row for row in pq.read_table(path, columns=["op", "snapshot", "position"]).to_pylist() if row["op"] == "r"]
    assert len(reads) == 40 and {row["snapshot"] for row in reads} == {"incremental"}
    assert max(row["position"] for row in reads) <= meta["position_raw"] == meta["covers_from_raw"]


def test_count_check_corrects_for_writes_after_the_snapshot_position(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    db.stock.insert_many([{"_id": i} for i in range(10)])
    env = make_env(tmp_path, mongo_uri, db, ["stock"])
    key = env.key("stock", "snapshot")
    assert env.materialize(instance, [key]).success
    meta = materialization_metadata(instance, key)
    path, position = Path(meta["dagster/uri"]), Position.parse(meta["position_raw"])
    db.stock.insert_many([{"_id": 100 + i} for i in range(3)])
    db.stock.delete_one({"_id": 0})
    cfg = env.mongocdc.load_config()
    check = source_count_result(key, env.mongocdc, cfg, env.ns("stock"), count_rows_at(path, position), position, None)
    values = {k: v.value for k, v in check.metadata.items()}
    assert check.passed and values["source_count_now"] == 12 and values["expected_at_position"] == 10
    assert (values["inserts_since"], values["deletes_since"]) == (3, 1)
    pq.write_table(pq.read_table(path).slice(1), path)  # a read lost from the landing file
    lost = count_rows_at(path, position)
    assert lost == 9
    assert not source_count_result(key, env.mongocdc, cfg, env.ns("stock"), lost, position, None).passed


def test_filtered_snapshot_from_run_config_gets_its_own_file_and_does_not_cover(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    db.products.insert_many([{"_id": i, "color": "blue" if i % 2 else "red"} for i in range(10)])
    env = make_env(tmp_path, mongo_uri, db, ["products"])
    key = env.key("products", "snapshot")
    result = env.materialize(instance, [key], run_config={"ops": {"mongocdc_snapshot": {"config": {
        "filters": {env.ns("products"): '{"color": "blue"}'}, "signal_id": "s1"}}}})
    assert result.success and all(checks_of(result).values())
    meta = materialization_metadata(instance, key)
    assert meta["dagster/row_count"] == 5 and meta["signal_id"] == "s1" and meta["partial"] is True
    assert Path(meta["dagster/uri"]).name.startswith("filtered-")


def test_snapshot_of_a_dropped_collection_fails_clearly(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    env = make_env(tmp_path, mongo_uri, db, ["gone"])  # discovered, then dropped (never created here)
    result = env.materialize(instance, [env.key("gone", "snapshot")], raise_on_error=False)
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert f"'{env.ns('gone')}'" in str(failure.step_failure_data.error) and "not captured" in str(
        failure.step_failure_data.error)


def test_bad_filter_is_a_clear_failure(tmp_path: Path, mongo_uri: str, db: Database[Any],
                                       instance: DagsterInstance) -> None:
    db.things.insert_one({"_id": 1})
    env = make_env(tmp_path, mongo_uri, db, ["things"])
    result = env.materialize(instance, [env.key("things", "snapshot")], raise_on_error=False,
                             run_config={"ops": {"mongocdc_snapshot": {"config": {"filters": {env.ns("things"): "[1, 2]"}}}}})
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "must be a JSON object" in str(failure.step_failure_data.error)


def test_translator_is_the_one_override_point_for_keys_groups_and_deps(
        tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    class Custom(MongoCdcTranslator):
        key_prefix = ("lake", "raw")

        def get_group_name(self, props: MongoCdcAssetProps) -> str:
            return f"cdc_{props.collection}"

    env = make_env(tmp_path, mongo_uri, db, ["orders"], translator=Custom())
    specs = {s.key: s for s in env.defs.resolve_all_asset_specs()}
    log_key = AssetKey(["lake", "raw", db.name, "orders", "changelog"])
    assert set(specs) >= {AssetKey(["lake", "raw", db.name, "orders", k]) for k in
                          ("snapshot", "incremental_snapshot", "slices", "changelog", "current_state")}
    assert {d.asset_key for d in specs[log_key].deps} == {
        AssetKey(["lake", "raw", db.name, "orders", k]) for k in ("snapshot", "incremental_snapshot", "slices")}
    state = specs[AssetKey(["lake", "raw", db.name, "orders", "current_state"])]
    assert [d.asset_key for d in state.deps] == [log_key]
    assert state.group_name == "cdc_orders" and state.kinds == {"spark", "delta"}
    assert state.metadata["dagster/table_name"] == f"{db.name}__orders__current"
    assert state.freshness_policy is not None and state.automation_condition is not None
    slices = specs[AssetKey(["lake", "raw", db.name, "orders", "slices"])]
    assert slices.tags["mongocdc/collection"] == f"{db.name}.orders" and slices.kinds == {"mongodb", "parquet"}
    assert [c.name for c in slices.metadata["dagster/column_schema"].columns][:3] == ["topic", "collection", "key"]
