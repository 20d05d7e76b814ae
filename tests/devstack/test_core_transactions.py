"""Sessions and multi-document transactions through pymongo, and their single applyOps entry."""

from __future__ import annotations

import socket
import uuid
from typing import Any

import pytest
from bson import Binary, Int64, Timestamp
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError, OperationFailure

from .core_helpers import one, op_msg, recv_message, reply_document


def _oplog_after(client: MongoClient, ts: Timestamp) -> list[dict[str, Any]]:
    return list(client.local["oplog.rs"].find({"ts": {"$gt": ts}}))


def _uuid_bytes(value: Any) -> bytes:
    return value.bytes if isinstance(value, uuid.UUID) else bytes(value)


def _last_ts(client: MongoClient) -> Timestamp:
    last = client.local["oplog.rs"].find_one(sort=[("$natural", -1)])
    assert last is not None
    return last["ts"]


def test_commit_applies_atomically_as_one_apply_ops(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.create_collection("a")
    fresh_db.create_collection("b")
    fresh_db.a.insert_one({"_id": 1, "n": 0})
    start = _last_ts(mongo_client)
    with mongo_client.start_session() as session:
        with session.start_transaction():
            fresh_db.a.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=session)
            fresh_db.b.insert_one({"_id": "x"}, session=session)
            fresh_db.a.insert_one({"_id": 2}, session=session)
            fresh_db.a.delete_one({"_id": 2}, session=session)
            assert one(fresh_db.a, {"_id": 1})["n"] == 0  # not visible outside yet
            inside = fresh_db.a.find_one({"_id": 1}, session=session)
            assert inside is not None and inside["n"] == 1  # the transaction sees its own writes
            assert fresh_db.b.count_documents({}, session=session) == 1
            assert fresh_db.b.count_documents({}) == 0
        lsid = session.session_id
    assert one(fresh_db.a, {"_id": 1})["n"] == 1 and fresh_db.b.count_documents({}) == 1
    entries = [e for e in _oplog_after(mongo_client, start) if e["op"] != "n"]
    assert len(entries) == 1
    entry = entries[0]
    assert entry["op"] == "c" and entry["ns"] == "admin.$cmd"
    assert _uuid_bytes(entry["lsid"]["id"]) == _uuid_bytes(lsid["id"]) and entry["txnNumber"] >= 1
    assert isinstance(entry["lsid"]["uid"], bytes) and len(entry["lsid"]["uid"]) == 32
    ops = entry["o"]["applyOps"]
    assert [(op["op"], op["ns"]) for op in ops] == [
        ("u", f"{fresh_db.name}.a"), ("i", f"{fresh_db.name}.b"), ("i", f"{fresh_db.name}.a"), ("d", f"{fresh_db.name}.a"),
    ]  # fmt: skip
    assert ops[0]["o2"] == {"_id": 1} and ops[1]["o"] == {"_id": "x"}


def test_abort_discards(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.create_collection("c")
    with mongo_client.start_session() as session:
        session.start_transaction()
        fresh_db.c.insert_one({"_id": 1}, session=session)
        session.abort_transaction()
    assert fresh_db.c.count_documents({}) == 0


def test_error_aborts_transaction_and_commit_reports_no_such_transaction(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.c.insert_one({"_id": 1})
    with mongo_client.start_session() as session:
        session.start_transaction()
        fresh_db.c.insert_one({"_id": 2}, session=session)
        with pytest.raises(DuplicateKeyError):
            fresh_db.c.insert_one({"_id": 1}, session=session)
        with pytest.raises(OperationFailure) as info:
            session.commit_transaction()
        assert info.value.code == 251
        assert info.value.has_error_label("TransientTransactionError")
    assert fresh_db.c.count_documents({}) == 1


def test_commit_retry_is_idempotent(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.create_collection("c")
    with mongo_client.start_session() as session:
        session.start_transaction()
        fresh_db.c.insert_one({"_id": 1}, session=session)
        session.commit_transaction()
        session.commit_transaction()  # pymongo re-sends commitTransaction
    assert fresh_db.c.count_documents({}) == 1


def test_with_transaction_callback(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.create_collection("acct")
    fresh_db.acct.insert_many([{"_id": "a", "bal": 10}, {"_id": "b", "bal": 0}])

    def transfer(session: Any) -> None:
        fresh_db.acct.update_one({"_id": "a"}, {"$inc": {"bal": -4}}, session=session)
        fresh_db.acct.update_one({"_id": "b"}, {"$inc": {"bal": 4}}, session=session)

    with mongo_client.start_session() as session:
        session.with_transaction(transfer)
    assert {d["_id"]: d["bal"] for d in fresh_db.acct.find()} == {"a": 6, "b": 4}


def test_retryable_writes_and_implicit_sessions(mongo_client: MongoClient, fresh_db: Database) -> None:
    with mongo_client.start_session() as session:
        fresh_db.c.insert_one({"_id": 1}, session=session)
        fresh_db.c.update_one({"_id": 1}, {"$set": {"x": 1}}, session=session)
        assert one(fresh_db.c, {"_id": 1}) == {"_id": 1, "x": 1}
    fresh_db.c.delete_one({"_id": 1})
    assert fresh_db.c.count_documents({}) == 0


def test_retried_write_is_not_applied_twice(mongo_client: MongoClient, fresh_db: Database) -> None:
    """A retryable write re-sent with the same (lsid, txnNumber) returns the first result."""
    address = mongo_client.address
    assert address is not None
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
    command = {"insert": "c", "documents": [{"_id": 1}], "lsid": lsid, "txnNumber": Int64(1), "$db": fresh_db.name}
    with socket.create_connection(address, timeout=10) as sock:
        replies = []
        for request_id in (1, 2):
            sock.sendall(op_msg(request_id, command))
            message = recv_message(sock)
            assert message is not None
            replies.append(reply_document(message))
    assert [r["n"] for r in replies] == [1, 1] and not any("writeErrors" in r for r in replies)
    assert fresh_db.c.count_documents({}) == 1
    assert mongo_client.local["oplog.rs"].count_documents({"ns": f"{fresh_db.name}.c", "op": "i"}) == 1


def test_write_conflict_with_a_change_after_the_snapshot(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.c.insert_many([{"_id": 1, "n": 0}, {"_id": 2, "n": 0}])
    with mongo_client.start_session() as session:
        session.start_transaction()
        assert fresh_db.c.count_documents({}, session=session) == 2  # the snapshot is taken
        fresh_db.c.update_one({"_id": 1}, {"$inc": {"n": 1}})  # outside the transaction
        with pytest.raises(OperationFailure) as info:
            fresh_db.c.update_one({"_id": 1}, {"$inc": {"n": 10}}, session=session)
        assert info.value.code == 112 and info.value.has_error_label("TransientTransactionError")
        session.abort_transaction()
    assert one(fresh_db.c, {"_id": 1})["n"] == 1
