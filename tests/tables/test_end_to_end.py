"""Replica set -> engine (snapshot + stream slices) -> landing files -> tables == the collection."""

from __future__ import annotations

import datetime
import random
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from bson import Binary, Decimal128, Int64, ObjectId
from bson.binary import UuidRepresentation
from bson.timestamp import Timestamp
from pymongo.database import Database
from pyspark.sql import SparkSession

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.sinks.parquet import ParquetSink
from mongocdc_core.tables import (
    CollectionTables,
    landing_files,
    read_changelog,
    read_current_state,
    reconcile_at_position,
    refresh_changelog,
    refresh_current_state,
)


def _workload(db: Database, rng: random.Random, steps: int) -> None:
    """Inserts, dotted/array-index $set, $unset, replaces, deletes and transactions on one collection."""
    coll = db["orders"]
    client = db.client
    for _ in range(steps):
        ids = [d["_id"] for d in coll.find({}, {"_id": 1})]
        r = rng.random()
        if not ids or r < 0.3:
            coll.insert_one({"_id": rng.randint(0, 10**9), "qty": rng.randint(0, 9), "tags": ["a", "b", "c"],
                             "meta": {"k": rng.random()}})
        elif r < 0.5:
            coll.update_one({"_id": rng.choice(ids)}, {"$set": {"qty": rng.choice([1, 2.5, "three"]),
                                                                "tags.1": rng.randint(0, 5), "meta.n": 1}})
        elif r < 0.6:
            coll.update_one({"_id": rng.choice(ids)}, {"$unset": {"meta": ""}, "$set": {"new_field": True}})
        elif r < 0.7:
            coll.replace_one({"_id": rng.choice(ids)}, {"qty": -1, "replaced": "yes"})
        elif r < 0.85:
            coll.delete_one({"_id": rng.choice(ids)})
        else:  # delete and re-insert one document inside one transaction
            target = rng.choice(ids)
            with client.start_session() as session, session.start_transaction():
                coll.delete_one({"_id": target}, session=session)
                coll.insert_one({"_id": target, "qty": 0, "again": True}, session=session)


def _after(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1)


def _config(uri: str, namespace: str, capture_mode: str) -> ConnectorConfig:
    return ConnectorConfig.from_dict({
        "mongodb.connection.string": uri, "topic.prefix": "dbz", "capture.mode": capture_mode,
        "collection.include.list": namespace,
    })


@pytest.mark.parametrize("capture_mode", ["change_streams", "change_streams_update_full_with_pre_image"])
def test_tables_equal_the_source_after_out_of_order_materialisation(
    spark: SparkSession, tmp_path: Path, mongo_uri: str, fresh_db: Database, capture_mode: str
) -> None:
    namespace = f"{fresh_db.name}.orders"
    cfg = _config(mongo_uri, namespace, capture_mode)
    rng = random.Random(capture_mode)
    fresh_db.create_collection("orders", changeStreamPreAndPostImages={"enabled": True})
    fresh_db["orders"].insert_one({"_id": -1, "qty": 0})
    t0 = api.current_cluster_time(cfg)
    _workload(fresh_db, rng, 15)
    landing = tmp_path / "landing"
    snap = landing / "snapshot" / namespace / "snapshot.parquet"
    sink = ParquetSink.to_file(snap)
    api.snapshot_collection(cfg, namespace, sink)
    sink.close()
    _workload(fresh_db, rng, 15)
    t1 = _after(api.current_cluster_time(cfg))
    _workload(fresh_db, rng, 15)
    t2 = _after(api.current_cluster_time(cfg))

    def slice_file(name: str, start: Timestamp, end: Timestamp) -> Path:
        path = landing / "stream_slice" / namespace / f"{name}.parquet"
        out = ParquetSink.to_file(path)
        api.stream_window(cfg, namespace, start, end, out)
        out.close()
        return path

    tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
    late = slice_file("2", t1, t2)
    for files in ([late], [snap, slice_file("1", t0, t1), late], [snap, slice_file("1", t0, t1), slice_file("2", t1, t2)]):
        refresh_changelog(spark, tables, [str(f) for f in files])  # a slice before its snapshot, then re-written
        state = refresh_current_state(spark, tables)
    assert state.pending_keys == 0
    assert state.row_count == fresh_db["orders"].count_documents({})
    changes = read_changelog(spark, tables.changelog).where("__op IN ('u', 'd')")
    with_before = changes.where("before IS NOT NULL").count()
    assert with_before == (changes.count() if capture_mode.endswith("pre_image") else 0) and changes.count() > 0
    result = reconcile_at_position(spark, tables, cfg)
    assert result.passed and result.coverage == 1.0, result


def test_the_type_zoo_and_a_collection_added_while_running(
    spark: SparkSession, tmp_path: Path, mongo_uri: str, fresh_db: Database
) -> None:
    """Through the real connector: reads and change events of every BSON type land in their column types."""
    cfg = ConnectorConfig.from_dict({
        "mongodb.connection.string": mongo_uri, "topic.prefix": "dbz",
        "database.include.list": fresh_db.name,
    })
    when = datetime.datetime(2024, 5, 6, 7, 8, 9, 123000)
    key = uuid.UUID(int=7)
    fresh_db.zoo.insert_one({
        "_id": ObjectId("65f0a1b2c3d4e5f6a7b8c9d0"), "int64": Int64(2**40), "dec": Decimal128("1.25"),
        "when": when, "old": datetime.datetime(60, 1, 1), "nan": float("nan"),
        "uid": Binary.from_uuid(key, UuidRepresentation.STANDARD), "nested": {"a": [1, 2]},
    })
    t0 = api.current_cluster_time(cfg)
    landing = tmp_path / "landing"
    snap_sink = ParquetSink(landing)
    api.snapshot_collection(cfg, f"{fresh_db.name}.zoo", snap_sink)
    snap_sink.close()
    fresh_db.zoo.update_one({}, {"$set": {"int64": Int64(-(2**40)), "inf": float("inf")}})
    fresh_db.create_collection("added")  # a collection that appears while the stream runs
    fresh_db.added.insert_many([{"_id": "x", "v": 1}, {"_id": "y", "v": 2}])
    fresh_db.added.delete_one({"_id": "y"})
    end = _after(api.current_cluster_time(cfg))
    stream_sink = ParquetSink(landing)
    api.stream_window(cfg, None, t0, end, stream_sink)  # every captured collection, one landing folder per topic
    stream_sink.close()

    topics = sorted(p.name for p in landing.iterdir())
    assert topics == [f"dbz.{fresh_db.name}.added", f"dbz.{fresh_db.name}.zoo"]
    states = {}
    for topic in topics:
        namespace = topic.removeprefix("dbz.")
        tables = CollectionTables.under(str(tmp_path / "tables"), namespace)
        refresh_changelog(spark, tables, landing_files([landing / topic]))
        refresh_current_state(spark, tables)
        states[namespace.split(".")[1]] = read_current_state(spark, tables.current_state)
    assert [(r["_id"], r["v"]) for r in states["added"].collect()] == [("x", 1)]
    zoo = states["zoo"]
    assert {n: t for n, t in zoo.dtypes if not n.startswith("__")} == {
        "_id": "string", "dec": "decimal(38,2)", "inf": "double", "int64": "bigint", "nan": "double",
        "nested": "struct<a:array<bigint>>", "old": "timestamp", "uid": "string", "when": "timestamp",
    }
    row = zoo.first()
    assert row is not None
    assert (row["_id"], row["int64"], row["dec"], row["when"], row["uid"]) == (
        "65f0a1b2c3d4e5f6a7b8c9d0", -(2**40), Decimal("1.25"), when, str(key)
    )
    assert row["old"] == datetime.datetime(60, 1, 1) and row["inf"] == float("inf") and row["nan"] != row["nan"]
