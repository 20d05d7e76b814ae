"""Materialising the CDC assets against the replica set under test (emulated unless a real URI is set)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from dagster import AssetKey, DagsterInstance, materialize

from mongocdc_core.positions import Position
from mongocdc_dagster.assets.cdc import source_count_result
from mongocdc_dagster.landing import count_rows_at
from mongocdc_dagster.translator import CdcAssetProps, MongoCdcTranslator
from tests.dagster.cdc_helpers import CdcEnv, checks_of, make_env, materialization_metadata, register


def test_snapshot_lands_one_file_and_overwrites_it(cdc: CdcEnv, instance: DagsterInstance) -> None:
    cdc.db.customers.insert_many([{"_id": i, "name": f"c{i}", "tier": i % 3} for i in range(25)])
    ns = cdc.ns("customers")
    register(instance, ns)
    result = materialize([cdc.assets.snapshot], partition_key=ns, resources=cdc.resources, instance=instance)
    assert result.success
    assert checks_of(result) == {"landing_envelopes": True, "source_count": True}
    meta = materialization_metadata(instance, cdc.assets.snapshot_key, ns)
    assert meta["documents"] == 25 and meta["collection"] == ns and meta["topic"] == f"testsrv.{ns}"
    path = Path(meta["path"])
    assert path == cdc.settings.landing_dir / "snapshot" / ns / "snapshot.parquet"
    table = pq.read_table(path)
    assert table.num_rows == 25 and set(table["op"].to_pylist()) == {"r"}
    assert set(table["position"].to_pylist()) == {meta["position"]}
    assert sorted(table["key"].to_pylist())[:2] == ['{"id":"0"}', '{"id":"1"}']

    cdc.db.customers.delete_many({"_id": {"$gte": 20}})
    again = materialize([cdc.assets.snapshot], partition_key=ns, resources=cdc.resources, instance=instance)
    assert again.success
    meta2 = materialization_metadata(instance, cdc.assets.snapshot_key, ns)
    assert Position.parse(meta2["position"]) > Position.parse(meta["position"])
    assert pq.read_table(path).num_rows == 20
    assert [p.name for p in path.parent.iterdir()] == ["snapshot.parquet"]  # replaced, no temp files left


def test_incremental_snapshot_lands_reads_with_their_chunk_positions(cdc: CdcEnv, instance: DagsterInstance) -> None:
    cdc.db.ledger.insert_many([{"_id": i, "amount": i * 10} for i in range(40)])
    ns = cdc.ns("ledger")
    register(instance, ns)
    result = materialize([cdc.assets.incremental_snapshot], partition_key=ns, resources=cdc.resources,
                         instance=instance)
    assert result.success
    assert checks_of(result) == {"landing_envelopes": True, "source_count": True}
    meta = materialization_metadata(instance, cdc.assets.incremental_snapshot_key, ns)
    assert meta["documents"] == 40
    path = Path(meta["path"])
    assert path == cdc.settings.landing_dir / "incremental_snapshot" / ns / "snapshot.parquet"
    table = pq.read_table(path, columns=["op", "snapshot", "position"])
    reads = [row for row in table.to_pylist() if row["op"] == "r"]
    assert len(reads) == 40 and {row["snapshot"] for row in reads} == {"incremental"}
    assert max(row["position"] for row in reads) <= meta["position"]


def test_count_check_corrects_for_writes_after_the_snapshot_position(cdc: CdcEnv, instance: DagsterInstance) -> None:
    cdc.db.stock.insert_many([{"_id": i} for i in range(10)])
    ns = cdc.ns("stock")
    register(instance, ns)
    assert materialize([cdc.assets.snapshot], partition_key=ns, resources=cdc.resources, instance=instance).success
    meta = materialization_metadata(instance, cdc.assets.snapshot_key, ns)
    path, position = Path(meta["path"]), Position.parse(meta["position"])
    cdc.db.stock.insert_many([{"_id": 100 + i} for i in range(3)])
    cdc.db.stock.delete_one({"_id": 0})
    cfg = cdc.mongocdc.load_config()
    check = source_count_result(cdc.assets.snapshot_key, cdc.mongocdc, cfg, ns, count_rows_at(path, position),
                                position, None)
    values = {k: v.value for k, v in check.metadata.items()}
    assert check.passed and values["source_count_now"] == 12 and values["expected_at_position"] == 10
    assert (values["inserts_since"], values["deletes_since"]) == (3, 1)
    table = pq.read_table(path)
    pq.write_table(table.slice(1), path)  # a read lost from the landing file
    lost = count_rows_at(path, position)
    assert lost == 9
    assert not source_count_result(cdc.assets.snapshot_key, cdc.mongocdc, cfg, ns, lost, position, None).passed


def test_filtered_snapshot_from_run_config_gets_its_own_file(cdc: CdcEnv, instance: DagsterInstance) -> None:
    cdc.db.products.insert_many([{"_id": i, "color": "blue" if i % 2 else "red"} for i in range(10)])
    ns = cdc.ns("products")
    register(instance, ns)
    result = materialize(
        [cdc.assets.snapshot], partition_key=ns, resources=cdc.resources, instance=instance,
        run_config={"ops": {"mongocdc_snapshot": {"config": {"filter": '{"color": "blue"}', "signal_id": "s1"}}}},
    )
    assert result.success and checks_of(result)["source_count"]
    meta = materialization_metadata(instance, cdc.assets.snapshot_key, ns)
    assert meta["documents"] == 5 and meta["signal_id"] == "s1"
    assert Path(meta["path"]).name.startswith("filtered-")


def test_snapshot_of_uncaptured_collection_fails_clearly(cdc: CdcEnv, instance: DagsterInstance) -> None:
    register(instance, "elsewhere.things")
    result = materialize([cdc.assets.snapshot], partition_key="elsewhere.things", resources=cdc.resources,
                         instance=instance, raise_on_error=False)
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "'elsewhere.things' is not captured" in str(failure.step_failure_data.error)


def test_bad_filter_is_a_clear_failure(cdc: CdcEnv, instance: DagsterInstance) -> None:
    cdc.db.things.insert_one({"_id": 1})
    ns = cdc.ns("things")
    register(instance, ns)
    result = materialize(
        [cdc.assets.snapshot], partition_key=ns, resources=cdc.resources, instance=instance, raise_on_error=False,
        run_config={"ops": {"mongocdc_snapshot": {"config": {"filter": "[1, 2]"}}}},
    )
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "must be a JSON object" in str(failure.step_failure_data.error)


def test_window_before_the_oplog_fails_with_history_lost(cdc: CdcEnv, instance: DagsterInstance) -> None:
    cdc.db.items.insert_one({"_id": 1})
    ns = cdc.ns("items")
    register(instance, ns)
    key = cdc.partitions.slice_key(ns, "2026-01-01-00:00")
    result = materialize([cdc.assets.stream_slice], partition_key=str(key), resources=cdc.resources,
                         instance=instance, raise_on_error=False)
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "history lost" in str(failure.step_failure_data.error)
    assert not list((cdc.settings.landing_dir / "stream_slice").rglob("*.parquet"))


def test_translator_overrides_keys_group_and_metadata(cdc: CdcEnv) -> None:
    class Custom(MongoCdcTranslator):
        key_prefix = ("lake", "raw")

        def get_group_name(self, props: CdcAssetProps) -> str:
            return f"cdc_{props.topic_prefix}"

    from mongocdc_core.config import ConnectorConfig
    from mongocdc_dagster.assets.cdc import build_cdc_assets

    assets = build_cdc_assets(ConnectorConfig.load(cdc.mongocdc.config_path), cdc.settings.landing_dir,
                              cdc.partitions, Custom())
    assert assets.snapshot_key == AssetKey(["lake", "raw", "snapshot"])
    spec = next(iter(assets.stream_slice.specs))
    assert spec.group_name == "cdc_testsrv" and spec.kinds == {"mongodb", "parquet"}
    assert spec.tags["mongocdc/connector"] == "test-connector"


def test_env_without_partitions_start_before_first_window(tmp_path: Path, mongo_uri: str, fresh_db: Any) -> None:
    env = make_env(tmp_path, mongo_uri, fresh_db, granularity="hourly", start="2030-01-01")
    assert env.partitions.latest_closed_window(datetime(2029, 6, 1, tzinfo=UTC)) is None
    assert env.partitions.latest_closed_window(datetime(2030, 1, 1, 2, 30, tzinfo=UTC)) == "2030-01-01-01:00"
