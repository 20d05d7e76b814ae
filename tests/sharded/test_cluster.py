"""The sharded cluster as drivers see it through mongos: routing, merged change streams, resume.

Against the emulator or a real cluster (``MONGOCDC_TEST_MONGODB_SHARDED_URI``).
"""

from __future__ import annotations

import pytest
from bson import Timestamp
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import OperationFailure

from tests.sharded.conftest import ShardedDeployment, drain


def _key(ts: Timestamp) -> tuple[int, int]:
    return (ts.time, ts.inc)


def test_mongos_handshake_and_shards(sharded: ShardedDeployment) -> None:
    hello = sharded.client.admin.command("hello")
    assert hello["msg"] == "isdbgrid" and "setName" not in hello
    assert sharded.client.topology_description.topology_type_name == "Sharded"
    shards = sharded.client.config.shards.find()
    assert [s["_id"] for s in shards] == sharded.shards and len(sharded.shards) >= 2


def test_documents_land_on_the_shard_of_their_chunk(sharded: ShardedDeployment, spread: Database) -> None:
    first, second = sharded.shards[:2]
    spread.orders.insert_many([{"_id": i} for i in (5, 999, 1000, 5000)])
    spread.notes.insert_one({"_id": "n"})
    on_first: MongoClient = MongoClient(sharded.shard_host(first))
    on_second: MongoClient = MongoClient(sharded.shard_host(second))
    assert sorted(d["_id"] for d in on_first[spread.name].orders.find()) == [5, 999]
    assert sorted(d["_id"] for d in on_second[spread.name].orders.find()) == [1000, 5000]
    assert on_first[spread.name].notes.count_documents({}) == 1
    assert spread.orders.count_documents({}) == 4 and spread.orders.count_documents({"_id": {"$gte": 999}}) == 3
    assert [d["_id"] for d in spread.orders.find().sort("_id", -1).limit(3)] == [5000, 1000, 999]
    assert spread.orders.find_one({"_id": 5000}) == {"_id": 5000}
    assert spread.orders.update_one({"_id": 1000}, {"$set": {"x": 1}}).modified_count == 1
    assert spread.orders.update_many({}, {"$set": {"y": 1}}).modified_count == 4
    assert spread.orders.delete_one({"y": 1}).deleted_count == 1  # without the shard key: one document
    assert spread.orders.count_documents({}) == 3
    on_first.close()
    on_second.close()


def test_change_streams_merge_shards_in_cluster_time_order(sharded: ShardedDeployment, spread: Database) -> None:
    client = sharded.client
    with client.watch() as deployment, spread.watch() as database, spread.orders.watch() as collection:
        for i in range(10):
            spread.orders.insert_one({"_id": i if i % 2 else 1000 + i})  # alternating shards
        spread.notes.insert_one({"_id": "after"})
        spread.orders.update_many({}, {"$set": {"u": 1}})
        everything = drain(database, 21)
        assert [e["operationType"] for e in everything] == ["insert"] * 11 + ["update"] * 10
        times = [_key(e["clusterTime"]) for e in everything]
        assert times == sorted(times)
        tokens = [e["_id"]["_data"] for e in everything]
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)  # resume-token order
        assert [e["documentKey"]["_id"] for e in everything[:10]] == [i if i % 2 else 1000 + i for i in range(10)]
        assert [e["_id"] for e in drain(collection, 20)] == [e["_id"] for e in everything if e["ns"]["coll"] == "orders"]
        cluster_wide = [e for e in drain(deployment, 21) if e["ns"]["db"] == spread.name]
        assert [e["_id"] for e in cluster_wide] == [e["_id"] for e in everything]


def test_resume_after_any_event_continues_exactly(sharded: ShardedDeployment, spread: Database) -> None:
    with spread.watch() as stream:
        for i in range(6):
            spread.orders.insert_one({"_id": 1000 * (i % 2) + i})
        events = drain(stream, 6)
        start_at = events[0]["clusterTime"]
    for cut in range(6):
        with spread.watch(resume_after=events[cut]["_id"]) as resumed:
            assert [e["_id"] for e in drain(resumed, 5 - cut)] == [e["_id"] for e in events[cut + 1 :]]
    with spread.watch(start_after=events[2]["_id"]) as after:
        assert [e["_id"] for e in drain(after, 3)] == [e["_id"] for e in events[3:]]
    with spread.watch(start_at_operation_time=start_at) as from_time:
        assert [e["_id"] for e in drain(from_time, 6)] == [e["_id"] for e in events]


def test_a_transaction_across_shards_commits_at_one_cluster_time(sharded: ShardedDeployment, spread: Database) -> None:
    with spread.watch() as stream:
        with sharded.client.start_session() as session, session.start_transaction():
            spread.orders.insert_one({"_id": 1}, session=session)
            spread.orders.insert_one({"_id": 2000}, session=session)
            spread.notes.insert_one({"_id": "t"}, session=session)
        events = drain(stream, 3)
    assert {e["documentKey"]["_id"] for e in events} == {1, 2000, "t"}
    assert len({e["clusterTime"] for e in events}) == 1
    assert len({(e["txnNumber"], e["lsid"]["id"]) for e in events}) == 1


def test_a_snapshot_read_through_mongos_reads_every_shard_at_one_time_and_says_which(
        sharded: ShardedDeployment, spread: Database) -> None:
    """mongos reports the time a snapshot read read at (``cursor.atClusterTime``: the client's, or one it
    chose for every shard), as a reader pinned to a time checks; the emulated mongos left it out, so the
    reconciliation of a sharded cluster never read at the table's position. An unsharded collection dropped
    since is read as it was then (mongod 7.0's point-in-time catalog on its shard)."""
    spread.orders.insert_many([{"_id": i} for i in (5, 1000)])
    spread.notes.insert_one({"_id": "n"})
    chosen = spread.command("find", "orders", readConcern={"level": "snapshot"})["cursor"]
    at = chosen["atClusterTime"]
    assert isinstance(at, Timestamp) and sorted(d["_id"] for d in chosen["firstBatch"]) == [5, 1000]
    spread.orders.insert_one({"_id": 5000})
    spread.drop_collection("notes")

    def read(name: str) -> tuple[Timestamp, list[object]]:
        found = spread.command("find", name, readConcern={"level": "snapshot", "atClusterTime": at})["cursor"]
        return found["atClusterTime"], sorted(d["_id"] for d in found["firstBatch"])

    assert read("orders") == (at, [5, 1000])
    assert read("notes") == (at, ["n"])
    counted = spread.command("aggregate", "orders", pipeline=[{"$count": "n"}], cursor={},
                             readConcern={"level": "snapshot", "atClusterTime": at})["cursor"]
    assert counted["atClusterTime"] == at and counted["firstBatch"] == [{"n": 2}]


def test_dropping_a_sharded_collection_reports_one_drop(sharded: ShardedDeployment, spread: Database) -> None:
    spread.orders.insert_many([{"_id": 1}, {"_id": 2000}])
    with spread.orders.watch() as stream:
        spread.orders.drop()
        events = drain(stream, 2)
    assert [e["operationType"] for e in events] == ["drop", "invalidate"]


def test_a_shard_step_down_is_resumed_transparently(sharded: ShardedDeployment, spread: Database) -> None:
    first, second = sharded.shards[:2]
    with spread.orders.watch(max_await_time_ms=100) as stream:
        spread.orders.insert_many([{"_id": 1}, {"_id": 2000}])
        before = drain(stream, 2)
        sharded.step_down(second)
        spread.orders.insert_many([{"_id": 2}, {"_id": 3000}])  # the mongos waits for shard 1's new primary
        after = drain(stream, 2)
    assert [e["documentKey"]["_id"] for e in before + after] == [1, 2000, 2, 3000]


def test_local_database_is_not_reachable_through_mongos(sharded: ShardedDeployment) -> None:
    with pytest.raises(OperationFailure) as refused:
        sharded.client.local["oplog.rs"].find_one()
    assert refused.value.code == 20
