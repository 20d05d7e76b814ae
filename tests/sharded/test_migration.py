"""Migrating a chunk that holds documents (``moveChunk``), as drivers, change streams and the connector see it.

Against the emulator or a real cluster (``MONGOCDC_TEST_MONGODB_SHARDED_URI``). Every move passes
``_waitForDelete: true`` so that a real donor has deleted the range when the command returns (the
emulator always deletes at once), which the per-shard counts rely on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from bson import Timestamp
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import OperationFailure

from mongocdc_core.api import current_cluster_time
from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import MemoryOffsetStore
from tests.engine.engine_support import (
    Background,
    MemorySink,
    make_config,
    replay,
    run_engine,
    source_state,
    wait_for,
)
from tests.sharded.conftest import ShardedDeployment, Streaming, drain


def _move(sharded: ShardedDeployment, db: Database, at: int, to: str) -> None:
    sharded.client.admin.command("moveChunk", f"{db.name}.orders", find={"_id": at}, to=to, _waitForDelete=True)


@pytest.fixture
def direct(sharded: ShardedDeployment) -> Iterator[dict[str, MongoClient]]:
    """A client on each of the first two shards' replica sets."""
    clients: dict[str, MongoClient] = {s: MongoClient(sharded.shard_host(s)) for s in sharded.shards[:2]}
    yield clients
    for client in clients.values():
        client.close()


def _ids(client: MongoClient, db: Database) -> list[Any]:
    return sorted(d["_id"] for d in client[db.name].orders.find())


def _oplog(client: MongoClient, db: Database, after: Timestamp) -> list[dict[str, Any]]:
    return list(client.local["oplog.rs"].find({"ns": f"{db.name}.orders", "ts": {"$gt": after}}))


def _chunk(sharded: ShardedDeployment, db: Database, low: int) -> dict[str, Any]:
    coll = sharded.client.config.collections.find_one({"_id": f"{db.name}.orders"})
    assert coll is not None
    found = sharded.client.config.chunks.find_one({"uuid": coll["uuid"], "min": {"_id": low}})
    assert found is not None
    return found


def test_move_chunk_migrates_its_documents(sharded: ShardedDeployment, spread: Database, direct: dict[str, MongoClient]) -> None:
    first, second = sharded.shards[:2]
    docs = [{"_id": i, "v": f"doc {i}", "nested": {"n": i}} for i in [*range(20), *range(1000, 1010)]]
    spread.orders.insert_many(docs)
    sharded.client.admin.command("split", f"{spread.name}.orders", middle={"_id": 10})
    version_before = _chunk(sharded, spread, 10)["lastmod"]
    _move(sharded, spread, 10, second)
    assert _ids(direct[first], spread) == list(range(10))
    assert _ids(direct[second], spread) == [*range(10, 20), *range(1000, 1010)]
    assert list(direct[second][spread.name].orders.find({"_id": {"$lt": 1000}}).sort("_id", 1)) == docs[10:20]
    assert list(spread.orders.find().sort("_id", 1)) == docs  # through mongos: each document once
    assert spread.orders.count_documents({}) == 30
    assert spread.orders.find_one({"_id": 15}) == docs[15]  # routed by the new owner
    moved = _chunk(sharded, spread, 10)
    assert moved["shard"] == second and moved["max"] == {"_id": 1000}
    assert moved["lastmod"].time > version_before.time  # a migration bumps the major version
    # writes after the move go to the new owner, reads see them once
    spread.orders.update_one({"_id": 15}, {"$set": {"v": "after"}})
    spread.orders.insert_one({"_id": 16.5})
    assert direct[second][spread.name].orders.find_one({"_id": 15}) == {"_id": 15, "v": "after", "nested": {"n": 15}}
    assert spread.orders.count_documents({"_id": {"$gte": 10, "$lt": 20}}) == 11


def test_the_oplog_entries_of_a_migration_carry_from_migrate(sharded: ShardedDeployment, spread: Database,
                                                             direct: dict[str, MongoClient]) -> None:  # fmt: skip
    first, second = sharded.shards[:2]
    spread.orders.insert_many([{"_id": i} for i in range(12)])
    sharded.client.admin.command("split", f"{spread.name}.orders", middle={"_id": 4})
    marks = {s: c.admin.command("hello")["$clusterTime"]["clusterTime"] for s, c in direct.items()}
    _move(sharded, spread, 4, second)
    inserted = [e for e in _oplog(direct[second], spread, marks[second]) if e["op"] == "i"]
    deleted = [e for e in _oplog(direct[first], spread, marks[first]) if e["op"] == "d"]
    assert sorted(e["o"]["_id"] for e in inserted) == list(range(4, 12))
    assert sorted(e["o"]["_id"] for e in deleted) == list(range(4, 12))
    assert all(e.get("fromMigrate") is True for e in inserted + deleted)
    assert inserted[0]["o"] == {"_id": inserted[0]["o"]["_id"]}  # the whole document, as copied


def test_a_change_stream_reports_no_migration_and_every_write_once(sharded: ShardedDeployment, spread: Database,
                                                                   direct: dict[str, MongoClient]) -> None:  # fmt: skip
    second = sharded.shards[1]
    spread.orders.insert_many([{"_id": i} for i in range(10)])
    sharded.client.admin.command("split", f"{spread.name}.orders", middle={"_id": 5})
    with spread.orders.watch(max_await_time_ms=100) as stream, direct[second][spread.name].orders.watch(max_await_time_ms=100) as on_shard:
        spread.orders.insert_one({"_id": 20})
        _move(sharded, spread, 5, second)
        spread.orders.update_one({"_id": 6}, {"$set": {"w": "after"}})
        spread.orders.delete_one({"_id": 20})
        spread.orders.insert_one({"_id": 1500})
        events = drain(stream, 4)
        assert stream.try_next() is None  # nothing more: no event from the migration
        shard_events = drain(on_shard, 3)
    assert [(e["operationType"], e["documentKey"]["_id"]) for e in events] == [("insert", 20), ("update", 6), ("delete", 20),
                                                                             ("insert", 1500)]  # fmt: skip
    assert [(e["operationType"], e["documentKey"]["_id"]) for e in shard_events] == [("update", 6), ("delete", 20), ("insert", 1500)]
    times = [(e["clusterTime"].time, e["clusterTime"].inc) for e in events]
    assert times == sorted(times)


def test_show_migration_events_is_refused_by_mongos_and_shown_by_a_shard(sharded: ShardedDeployment, spread: Database,
                                                                         direct: dict[str, MongoClient]) -> None:  # fmt: skip
    second = sharded.shards[1]
    spread.orders.insert_many([{"_id": i} for i in range(4)])
    with pytest.raises(OperationFailure) as refused:
        spread.orders.aggregate([{"$changeStream": {"showMigrationEvents": True}}])
    assert refused.value.code == 31123
    start = direct[second].admin.command("hello")["$clusterTime"]["clusterTime"]
    _move(sharded, spread, 0, second)
    on_shard = direct[second][spread.name].orders
    with on_shard.aggregate([{"$changeStream": {"showMigrationEvents": True, "startAtOperationTime": start}}],
                            maxAwaitTimeMS=100) as shown:  # fmt: skip
        events = drain(shown, 4)
    assert [(e["operationType"], e["documentKey"]["_id"]) for e in events] == [("insert", i) for i in range(4)]


class _Writer:
    """Writes through the mongos until stopped: inserts, updates and deletes on both sides of a moving chunk."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.writes = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        orders = self.db.orders
        try:
            i = 0
            while not self.stop.is_set():
                key = 100 + i % 300  # inside the chunk that moves
                orders.insert_one({"_id": 10_000 + i, "n": i})  # another chunk
                orders.update_one({"_id": key}, {"$inc": {"n": 1}}, upsert=True)
                self.writes += 2
                if i % 7 == 6:
                    self.writes += orders.delete_one({"_id": 100 + (i * 13) % 300}).deleted_count
                i += 1
        except BaseException as exc:
            self.error = exc

    def wait_for_more(self, writes: int) -> None:
        """Until the writer has written ``writes`` more times (so a move happens amid its writes)."""
        mark = self.writes
        wait_for(lambda: self.writes > mark + writes)

    def __enter__(self) -> _Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(60)
        if self.error is not None:
            raise self.error


def test_writes_during_migrations_land_once(sharded: ShardedDeployment, spread: Database, direct: dict[str, MongoClient]) -> None:
    first, second = sharded.shards[:2]
    spread.orders.insert_many([{"_id": i, "n": 0} for i in range(400)])  # 0-99 stay untouched, the writer uses 100-399
    reads: list[list[Any]] = []

    def read_untouched() -> None:
        while not writer.stop.is_set():
            reads.append(sorted(d["_id"] for d in spread.orders.find({"_id": {"$lt": 100}})))

    with spread.orders.watch(max_await_time_ms=100) as stream:
        with _Writer(spread) as writer:
            reader = threading.Thread(target=read_untouched, daemon=True)
            reader.start()
            for to in (second, first) * 3:
                writer.wait_for_more(20)
                _move(sharded, spread, 100, to)
        reader.join(60)
        events = drain(stream, writer.writes, attempts=writer.writes + 400)
        assert stream.try_next() is None
    assert len(events) == writer.writes and len({e["_id"]["_data"] for e in events}) == writer.writes
    assert reads and all(ids == list(range(100)) for ids in reads)  # every read during the moves saw each document once
    through_mongos = sorted(d["_id"] for d in spread.orders.find())
    on_shards = _ids(direct[first], spread) + _ids(direct[second], spread)
    assert sorted(on_shards) == through_mongos  # each document on exactly one shard
    assert [i for i in _ids(direct[first], spread) if i < 1000] == [i for i in through_mongos if i < 1000]


def test_capture_across_a_migration_rebuilds_the_source(sharded: ShardedDeployment, spread: Database) -> None:
    first, second = sharded.shards[:2]
    spread.orders.insert_many([{"_id": 100 + i, "n": 0} for i in range(300)])
    cfg = make_config(sharded.uri, spread.name)
    sink, offsets = MemorySink(), MemoryOffsetStore()
    streaming = Streaming()
    engine = Background(Engine(cfg, sink, offsets, progress=streaming)).start()
    try:
        wait_for(streaming.started.is_set)
        with _Writer(spread) as writer:
            for to in (second, first):
                writer.wait_for_more(30)
                _move(sharded, spread, 100, to)
        end = current_cluster_time(cfg)
        engine.stop()
    finally:
        engine.engine.stop()
    rest = MemorySink()
    run_engine(cfg, rest, offsets, stop_at=end)
    records = sink.records + rest.records
    namespace = f"{spread.name}.orders"
    changes = [r for r in records if r.collection == namespace and r.value is not None and r.op != "r"]
    assert len(changes) == writer.writes  # every write once: no loss, no duplicate, nothing from the migrations
    assert replay(records, namespace) == source_state(spread.orders)


def test_a_snapshot_read_from_before_a_migration_finds_each_document_once(sharded: ShardedDeployment, spread: Database) -> None:
    second = sharded.shards[1]
    spread.orders.insert_many([{"_id": i, "v": 0} for i in [*range(10), *range(1000, 1005)]])
    before = sharded.client.admin.command("hello")["$clusterTime"]["clusterTime"]
    spread.orders.update_one({"_id": 3}, {"$set": {"v": 1}})
    _move(sharded, spread, 0, second)  # the first shard keeps no chunk of orders

    def at(ts: Timestamp) -> list[dict[str, Any]]:
        reply = spread.command("find", "orders", sort={"_id": 1}, batchSize=100,
                               readConcern={"level": "snapshot", "atClusterTime": ts})  # fmt: skip
        return list(reply["cursor"]["firstBatch"])

    assert at(before) == [{"_id": i, "v": 0} for i in [*range(10), *range(1000, 1005)]]
    now = sharded.client.admin.command("hello")["$clusterTime"]["clusterTime"]
    assert at(now) == [{"_id": i, "v": int(i == 3)} for i in [*range(10), *range(1000, 1005)]]


def test_a_transaction_a_migration_interrupts_commits_nowhere(sharded: ShardedDeployment, spread: Database) -> None:
    if sharded.emulated is None:
        pytest.skip("a real donor's critical section waits for the transaction this test keeps open")
    first = sharded.shards[0]
    with sharded.client.start_session() as session:
        session.start_transaction()
        spread.notes.insert_one({"_id": 1}, session=session)  # the first shard, which commits first
        spread.orders.insert_one({"_id": 2000}, session=session)  # the second, whose chunk now moves away
        _move(sharded, spread, 2000, first)
        with pytest.raises(OperationFailure) as failed:
            session.commit_transaction()
    assert failed.value.code == 251 and failed.value.has_error_label("TransientTransactionError")
    assert spread.notes.count_documents({}) + spread.orders.count_documents({}) == 0  # no participant committed its part


def test_a_chunk_of_a_compound_shard_key_moves_with_its_documents(sharded: ShardedDeployment, spread: Database,
                                                                  direct: dict[str, MongoClient]) -> None:  # fmt: skip
    first, second = sharded.shards[:2]
    ns = f"{spread.name}.visits"
    sharded.client.admin.command("shardCollection", ns, key={"region": 1, "_id": 1})
    docs = [{"_id": i, "region": region} for i, region in enumerate(["eu", "eu", "us", "us", "ap"])]
    spread.visits.insert_many(docs)
    sharded.client.admin.command("split", ns, middle={"region": "eu", "_id": 1})
    sharded.client.admin.command("moveChunk", ns, find={"region": "us", "_id": 3}, to=second, _waitForDelete=True)
    assert sorted(d["_id"] for d in direct[first][spread.name].visits.find()) == [0, 4]  # ap, and eu below the split
    assert sorted(d["_id"] for d in direct[second][spread.name].visits.find()) == [1, 2, 3]
    assert sorted(spread.visits.find(), key=lambda d: d["_id"]) == docs
