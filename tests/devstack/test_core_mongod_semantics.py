"""mongod behaviours the emulator added for issue 16: snapshot reads, transactions' snapshots and
conflicts, DDL in transactions, write semantics of 5.0+, $out/$merge, tailable oplog cursors and the
test fail points. All but the ``fault`` tests hold against a real single-member 7.0 replica set."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from bson import Code, Timestamp
from pymongo import MongoClient
from pymongo.collation import Collation
from pymongo.cursor import CursorType
from pymongo.database import Database
from pymongo.errors import ExecutionTimeout, OperationFailure, WriteError

# -- snapshot reads -------------------------------------------------------------------------------------


def test_snapshot_reads_are_pinned_and_report_their_time(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.c.insert_one({"_id": 1, "v": 1})
    first = fresh_db.command("find", "c", readConcern={"level": "snapshot"})
    at = first["cursor"]["atClusterTime"]
    assert isinstance(at, Timestamp)
    fresh_db.c.update_one({"_id": 1}, {"$set": {"v": 2}})
    fresh_db.c.insert_one({"_id": 2, "v": 3})
    pinned = fresh_db.command("find", "c", readConcern={"level": "snapshot", "atClusterTime": at})
    assert pinned["cursor"]["firstBatch"] == [{"_id": 1, "v": 1}] and pinned["cursor"]["atClusterTime"] == at
    counted = fresh_db.command("aggregate", "c", pipeline=[{"$count": "n"}], cursor={},
                               readConcern={"level": "snapshot", "atClusterTime": at})  # fmt: skip
    assert counted["cursor"]["firstBatch"] == [{"n": 1}]
    with mongo_client.start_session(snapshot=True) as session:  # pymongo's snapshot sessions
        assert [d["v"] for d in fresh_db.c.find({}, session=session)] == [2, 3]
        fresh_db.c.delete_many({})
        assert [d["v"] for d in fresh_db.c.find({}, session=session)] == [2, 3]


def test_snapshot_read_errors(fresh_db: Database) -> None:
    fresh_db.c.insert_one({"_id": 1})
    now = fresh_db.command("ping")["operationTime"]
    with pytest.raises(OperationFailure) as too_old:
        fresh_db.command("find", "c", readConcern={"level": "snapshot", "atClusterTime": Timestamp(now.time - 3600, 1)})
    assert too_old.value.code == 239  # SnapshotTooOld: outside minSnapshotHistoryWindowInSeconds
    with pytest.raises(OperationFailure) as future:
        fresh_db.command("find", "c", readConcern={"level": "snapshot", "atClusterTime": Timestamp(now.time + 3600, 1)})
    assert future.value.code == 2
    with pytest.raises(OperationFailure):  # writes take no snapshot read concern outside transactions
        fresh_db.command("insert", "c", documents=[{"_id": 2}], readConcern={"level": "snapshot"})


def test_snapshot_reads_see_the_catalog_as_of_their_time(fresh_db: Database) -> None:
    """mongod 7.0's point-in-time catalog lookups: a collection renamed or dropped after the read's time is
    read under the name it had then (the reconciliation of a collection dropped since reads it so), a
    name given after that time held nothing then, and a name dropped and created again reads its first
    collection before the drop and its second after."""

    def read(name: str, at: Timestamp) -> list[Any]:
        found = fresh_db.command("find", name, readConcern={"level": "snapshot", "atClusterTime": at})
        return sorted(d["_id"] for d in found["cursor"]["firstBatch"])

    fresh_db.c.insert_many([{"_id": 1}, {"_id": 2}])
    two = fresh_db.command("ping")["operationTime"]
    fresh_db.c.rename("renamed")
    renamed = fresh_db.command("ping")["operationTime"]
    fresh_db.drop_collection("renamed")
    fresh_db.c.insert_one({"_id": 3})  # the name again, a new collection
    again = fresh_db.command("ping")["operationTime"]
    assert read("c", two) == [1, 2] and read("renamed", two) == []
    assert read("c", renamed) == [] and read("renamed", renamed) == [1, 2]
    assert read("c", again) == [3] and read("renamed", again) == []
    fresh_db.gone.insert_one({"_id": "x"})
    before = fresh_db.command("ping")["operationTime"]
    fresh_db.command("dropDatabase")
    assert read("gone", before) == ["x"] and read("c", before) == [3]


# -- transactions -----------------------------------------------------------------------------------------


def test_a_transaction_reads_every_collection_as_of_its_start(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.a.insert_one({"_id": 1, "v": "before"})
    fresh_db.b.insert_one({"_id": 1, "v": "before"})
    with mongo_client.start_session() as session, session.start_transaction():
        assert fresh_db.a.find_one({}, session=session)["v"] == "before"
        fresh_db.b.update_one({"_id": 1}, {"$set": {"v": "after"}})  # outside, before b is first read
        assert fresh_db.b.find_one({}, session=session)["v"] == "before"


def test_concurrent_transactions_writing_one_document_conflict(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.create_collection("c")
    with mongo_client.start_session() as first, mongo_client.start_session() as second:
        first.start_transaction()
        second.start_transaction()
        fresh_db.c.insert_one({"_id": 1}, session=first)
        with pytest.raises(OperationFailure) as conflict:
            fresh_db.c.insert_one({"_id": 1}, session=second)
        assert conflict.value.code == 112 and conflict.value.has_error_label("TransientTransactionError")
        first.commit_transaction()
        second.abort_transaction()
    assert fresh_db.c.count_documents({}) == 1


def test_collections_and_indexes_created_in_a_transaction(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.seed.insert_one({"_id": 0})  # the database exists
    with mongo_client.start_session() as session, session.start_transaction():
        fresh_db.create_collection("made", session=session)
        fresh_db.made.create_index("k", session=session)
        fresh_db.implicit.insert_one({"_id": 1}, session=session)
        assert "made" not in fresh_db.list_collection_names() and "implicit" not in fresh_db.list_collection_names()
    assert {"made", "implicit"} <= set(fresh_db.list_collection_names())
    assert "k_1" in fresh_db.made.index_information()
    commit = mongo_client.local["oplog.rs"].find_one({"o.applyOps.o.create": "made"}, sort=[("$natural", -1)])
    assert commit is not None and [op["op"] for op in commit["o"]["applyOps"]][:2] == ["c", "c"]


# -- write semantics ---------------------------------------------------------------------------------------


def test_dollar_and_dotted_field_names(fresh_db: Database) -> None:
    fresh_db.c.insert_one({"_id": 1, "$a": 1, "b.c": 2, "d": {"$e": 3}})
    fresh_db.c.update_one({"_id": 1}, [{"$replaceWith": {"$setField": {"field": {"$literal": "$x"}, "value": 9, "input": "$$ROOT"}}}])
    assert fresh_db.c.find_one({"_id": 1}) == {"_id": 1, "$a": 1, "b.c": 2, "d": {"$e": 3}, "$x": 9}
    got = list(fresh_db.c.aggregate([{"$project": {"_id": 0, "v": {"$getField": "b.c"}}}]))
    assert got == [{"v": 2}]
    with pytest.raises(WriteError):
        fresh_db.c.insert_one({"_id": {"$bad": 1}})


def test_let_collation_hint_and_upsert_of_null_id(fresh_db: Database) -> None:
    fresh_db.c.insert_many([{"_id": 1, "s": "Ping"}, {"_id": 2, "s": "pong"}])
    ci = Collation(locale="en_US", strength=2)
    assert fresh_db.c.update_many({"s": "PING"}, {"$set": {"hit": True}}, collation=ci).modified_count == 1
    assert fresh_db.c.delete_one({"$expr": {"$eq": ["$_id", "$$target"]}}, let={"target": 2}).deleted_count == 1
    assert fresh_db.c.update_one({"_id": None}, {"$set": {"n": 1}}, upsert=True).upserted_id is None
    assert fresh_db.c.find_one({"_id": None}) == {"_id": None, "n": 1}
    fresh_db.c.create_index([("s", -1)])
    assert [d["_id"] for d in fresh_db.c.find({"s": {"$exists": True}}).hint([("s", -1)])] == [1]
    with pytest.raises(OperationFailure) as no_js:
        fresh_db.c.find_one({"$where": "this.s == 'Ping'"})
    assert no_js.value.code == 2  # as a mongod without a JavaScript engine answers


def test_validators_and_bypass(fresh_db: Database) -> None:
    fresh_db.create_collection("v", validator={"a": {"$exists": True}})
    with pytest.raises(WriteError) as refused:
        fresh_db.v.insert_one({"_id": 1})
    assert refused.value.code == 121
    fresh_db.v.insert_one({"_id": 1}, bypass_document_validation=True)
    fresh_db.v.insert_one({"_id": 2, "a": 1})
    assert fresh_db.v.count_documents({}) == 2


def test_out_and_merge(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.src.insert_many([{"_id": i, "v": i} for i in range(3)])
    before = fresh_db.command("ping")["operationTime"]
    list(fresh_db.src.aggregate([{"$match": {"v": {"$gte": 1}}}, {"$out": "dst"}]))
    assert sorted(d["_id"] for d in fresh_db.dst.find()) == [1, 2]
    renamed = mongo_client.local["oplog.rs"].find_one({"ts": {"$gt": before}, "o.renameCollection": {"$exists": True}})
    assert renamed is not None and renamed["o"]["to"] == f"{fresh_db.name}.dst"  # $out replaces by a rename
    list(fresh_db.src.aggregate([{"$set": {"v": 10}}, {"$merge": {"into": "dst", "whenMatched": "merge"}}]))
    assert sorted((d["_id"], d["v"]) for d in fresh_db.dst.find()) == [(0, 10), (1, 10), (2, 10)]
    with pytest.raises(OperationFailure) as duplicate:
        list(fresh_db.src.aggregate([{"$merge": {"into": "dst", "whenMatched": "fail"}}]))
    assert duplicate.value.code == 11000


def test_code_values_in_filters_and_distinct(fresh_db: Database) -> None:
    fresh_db.c.insert_one({"_id": 1, "f": Code("return 1")})
    assert fresh_db.c.distinct("f", {"f": Code("return 1")}) == [Code("return 1")]


# -- cursors -----------------------------------------------------------------------------------------------


def test_tailable_await_cursor_on_the_oplog(mongo_client: MongoClient, fresh_db: Database) -> None:
    start = fresh_db.command("ping")["operationTime"]
    oplog = mongo_client.local["oplog.rs"]
    cursor = oplog.find({"ts": {"$gt": start}, "ns": f"{fresh_db.name}.c"}, cursor_type=CursorType.TAILABLE_AWAIT).max_await_time_ms(500)
    fresh_db.c.insert_one({"_id": 1})
    assert next(cursor)["o"] == {"_id": 1}
    writer = threading.Timer(0.2, lambda: fresh_db.c.insert_one({"_id": 2}))
    writer.start()
    try:
        deadline = time.monotonic() + 20
        entry: dict[str, Any] | None = None
        while entry is None and time.monotonic() < deadline and cursor.alive:
            try:
                entry = next(cursor)
            except StopIteration:  # an awaitData getMore that found nothing yet
                continue
        assert entry is not None and entry["o"] == {"_id": 2}
    finally:
        writer.join()
        cursor.close()


# -- fail points (mongod's test commands) ----------------------------------------------------------------------


@pytest.mark.fault
def test_fail_get_more_after_checkout_is_resumable(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.create_collection("c")
    with fresh_db.c.watch(max_await_time_ms=100) as stream:
        mongo_client.admin.command("configureFailPoint", "failGetMoreAfterCursorCheckout", mode={"times": 1},
                                   data={"errorCode": 10107})  # fmt: skip
        fresh_db.c.insert_one({"_id": 1})
        deadline = time.monotonic() + 20
        event = None
        while event is None and time.monotonic() < deadline:
            event = stream.try_next()  # the labelled error is resumed by pymongo
        assert event is not None and event["documentKey"] == {"_id": 1}
    off = mongo_client.admin.command("configureFailPoint", "failGetMoreAfterCursorCheckout", mode="off")
    assert off["count"] == 1


@pytest.mark.fault
def test_on_primary_transactional_write_and_max_time(mongo_client: MongoClient, fresh_db: Database) -> None:
    mongo_client.admin.command("configureFailPoint", "onPrimaryTransactionalWrite", mode={"times": 1})
    fresh_db.c.insert_one({"_id": 1})  # committed, reply lost, retried: the retry answers from the record
    assert fresh_db.c.count_documents({}) == 1
    mongo_client.admin.command("configureFailPoint", "maxTimeAlwaysTimeOut", mode="alwaysOn")
    try:
        with pytest.raises(ExecutionTimeout):
            fresh_db.c.find_one({}, max_time_ms=1000)
    finally:
        mongo_client.admin.command("configureFailPoint", "maxTimeAlwaysTimeOut", mode="off")
    assert mongo_client.admin.command("getParameter", 1, enableTestCommands=1)["enableTestCommands"] in (True, 1)
