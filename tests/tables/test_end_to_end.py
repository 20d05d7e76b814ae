"""Replica set -> engine (snapshot + stream slices) -> landing files -> tables == the live collection."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.database import Database
from pyspark.sql import SparkSession

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.sinks.parquet import ParquetSink
from mongocdc_core.tables import TableLocations, materialize, reconcile


def _workload(db: Database, rng: random.Random, steps: int) -> None:
    """Inserts, dotted/array-index $set, $unset, replaces and deletes on one collection."""
    coll = db["orders"]
    for _ in range(steps):
        ids = [d["_id"] for d in coll.find({}, {"_id": 1})]
        r = rng.random()
        if not ids or r < 0.3:
            coll.insert_one({"_id": rng.randint(0, 10**9), "qty": rng.randint(0, 9), "tags": ["a", "b", "c"],
                             "meta": {"k": rng.random()}})
        elif r < 0.55:
            coll.update_one({"_id": rng.choice(ids)}, {"$set": {"qty": rng.choice([1, 2.5, "three"]),
                                                                "tags.1": rng.randint(0, 5), "meta.n": 1}})
        elif r < 0.7:
            coll.update_one({"_id": rng.choice(ids)}, {"$unset": {"meta": ""}, "$set": {"new_field": True}})
        elif r < 0.85:
            coll.replace_one({"_id": rng.choice(ids)}, {"qty": -1, "replaced": "yes"})
        else:
            coll.delete_one({"_id": rng.choice(ids)})


def _after(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1)


@pytest.mark.parametrize("capture_mode", ["change_streams", "change_streams_update_full"])
def test_tables_equal_source_after_out_of_order_materialisation(
    spark: SparkSession, tmp_path: Path, mongo_uri: str, mongo_client: MongoClient, fresh_db: Database,
    capture_mode: str,
) -> None:
    namespace = f"{fresh_db.name}.orders"
    cfg = ConnectorConfig.from_dict({
        "mongodb.connection.string": mongo_uri, "topic.prefix": "dbz", "capture.mode": capture_mode,
        "collection.include.list": namespace,
    })
    rng = random.Random(capture_mode)
    fresh_db["orders"].insert_one({"_id": -1, "qty": 0})
    t0 = api.current_cluster_time(cfg)
    _workload(fresh_db, rng, 25)
    snap = tmp_path / "snapshot.parquet"
    sink = ParquetSink.to_file(snap)
    api.snapshot_collection(cfg, namespace, sink)
    sink.close()
    _workload(fresh_db, rng, 25)
    t1 = _after(api.current_cluster_time(cfg))
    _workload(fresh_db, rng, 25)
    t2 = _after(api.current_cluster_time(cfg))

    def slice_file(name: str, start: Timestamp, end: Timestamp) -> Path:
        path = tmp_path / f"{name}.parquet"
        out = ParquetSink.to_file(path)
        api.stream_window(cfg, namespace, start, end, out)
        out.close()
        return path

    tables = TableLocations(str(tmp_path / "tables"))
    late = slice_file("slice2", t1, t2)
    materialize(spark, tables, [late])  # a slice before its snapshot and before the earlier slice
    materialize(spark, tables, [snap, slice_file("slice1", t0, t1)])
    _, merged = materialize(spark, tables, [slice_file("slice2", t1, t2)])  # re-materialised
    assert merged.pending_keys == 0
    result = reconcile(spark, tables.current_state, mongo_client, [namespace])
    assert result.matches, result
    assert result.source_count == fresh_db["orders"].count_documents({}) == result.table_count
