"""A huge collection's snapshot fanned out by ``_id`` range: one partition per range, the union is the snapshot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from bson import ObjectId
from dagster import DagsterInstance
from pymongo.database import Database

from mongocdc_dagster.assets.cdc import write_plan
from mongocdc_dagster.partitions import ranges_partitions_name
from tests.dagster.cdc_helpers import make_env, partition_metadata

KEY_COLUMNS = ["key", "op", "after"]


def test_the_range_partitions_land_the_same_records_as_one_snapshot_run(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    docs: list[dict[str, Any]] = [{"_id": i, "n": i} for i in range(120)]
    docs += [{"_id": f"s{i:03d}", "n": i} for i in range(60)] + [{"_id": ObjectId(), "n": i} for i in range(60)]
    db.big.insert_many(docs)
    (tmp_path / "whole").mkdir()
    (tmp_path / "ranged").mkdir()
    whole = make_env(tmp_path / "whole", mongo_uri, db, ["big"])
    assert whole.materialize(instance, [whole.key("big", "snapshot")]).success
    one_run = pq.read_table(whole.mongocdc.snapshot_path(f"{db.name}.big")).select(KEY_COLUMNS).to_pylist()

    env = make_env(tmp_path / "ranged", mongo_uri, db, ["big"], ranged={f"{db.name}.big": 50})
    key = env.key("big", "snapshot")
    env.mongocdc.snapshot_path(f"{db.name}.big").parent.mkdir(parents=True, exist_ok=True)
    env.mongocdc.snapshot_path(f"{db.name}.big").write_bytes(b"an older full snapshot")
    partitions = write_plan(env.mongocdc, f"{db.name}.big", 50)
    assert len(partitions) >= 3
    instance.add_dynamic_partitions(ranges_partitions_name(f"{db.name}.big"), partitions)
    for index, partition in enumerate(partitions):
        assert env.materialize(instance, [key], partition_key=partition).success
        meta = partition_metadata(instance, key, partition)
        assert meta["ranges_done"] == f"{index + 1} of {len(partitions)}"
        complete = index == len(partitions) - 1
        assert (meta["covers_from_raw"] is not None) == complete and meta["partial"] == (not complete)
    folder = Path(meta["dagster/uri"]).parent
    files = sorted(folder.glob("range-*.parquet"))
    assert len(files) == len(partitions)
    union = [row for f in files for row in pq.read_table(f).select(KEY_COLUMNS).to_pylist()]
    assert sorted(union, key=str) == sorted(one_run, key=str) and len(union) == len(docs)  # each document once
    assert not env.mongocdc.snapshot_path(f"{db.name}.big").exists()  # the older snapshot was superseded
    assert meta["superseded_snapshots_removed"] == [str(env.mongocdc.snapshot_path(f"{db.name}.big"))]
