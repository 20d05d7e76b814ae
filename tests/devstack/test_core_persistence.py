"""``--dbpath``: data, indexes and the oplog survive a clean stop and a kill -9."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import DuplicateKeyError

from mongocdc_devstack.fixture import EmulatedReplicaSet
from mongocdc_devstack.persistence import JOURNAL

pytestmark = pytest.mark.fault


def _client(rs: EmulatedReplicaSet) -> MongoClient:
    return MongoClient(rs.uri, serverSelectionTimeoutMS=20_000)


def _write_some(client: MongoClient) -> dict[str, Any]:
    db = client.app
    db.create_collection("imaged", changeStreamPreAndPostImages={"enabled": True})
    db.users.create_index("email", unique=True)
    db.users.insert_many([{"_id": i, "email": f"u{i}@x", "n": i} for i in range(50)])
    db.users.update_many({"n": {"$lt": 10}}, {"$set": {"low": True}})
    db.users.delete_many({"n": {"$gte": 45}})
    db.imaged.insert_one({"_id": 1, "v": 1})
    db.imaged.update_one({"_id": 1}, {"$set": {"v": 2}})
    with client.start_session() as session, session.start_transaction():
        db.users.insert_one({"_id": 100, "email": "txn@x"}, session=session)
        db.users.delete_one({"_id": 0}, session=session)
    uuid_before = next(db.list_collections(filter={"name": "users"}))["info"]["uuid"]
    last = client.local["oplog.rs"].find_one(sort=[("$natural", -1)])
    assert last is not None
    return {"uuid": uuid_before, "last_ts": last["ts"], "count": db.users.count_documents({})}


def _check(client: MongoClient, before: dict[str, Any]) -> None:
    db = client.app
    assert db.users.count_documents({}) == before["count"] == 45
    assert db.users.count_documents({"low": True}) == 9
    assert db.users.find_one({"_id": 100}) == {"_id": 100, "email": "txn@x"}
    assert next(db.list_collections(filter={"name": "users"}))["info"]["uuid"] == before["uuid"]
    assert db.imaged.options()["changeStreamPreAndPostImages"] == {"enabled": True}
    with pytest.raises(DuplicateKeyError):
        db.users.insert_one({"email": "u5@x"})
    oplog = client.local["oplog.rs"]
    assert oplog.find_one({"ts": before["last_ts"]}) is not None
    assert oplog.count_documents({"ns": "app.users", "op": "i"}) == 50
    db.users.insert_one({"_id": 200, "email": "after@x"})  # writes keep working after a restart
    newest = oplog.find_one(sort=[("$natural", -1)])
    assert newest is not None and newest["ts"] > before["last_ts"]


def test_clean_stop_and_restart(tmp_path: Path) -> None:
    rs = EmulatedReplicaSet(dbpath=str(tmp_path), noop_interval=0)
    with rs:
        with _client(rs) as client:
            before = _write_some(client)
    rs.start()
    try:
        with _client(rs) as client:
            _check(client, before)
    finally:
        rs.stop()


def test_crash_keeps_acknowledged_writes(tmp_path: Path) -> None:
    rs = EmulatedReplicaSet(dbpath=str(tmp_path), noop_interval=0, in_process=False)
    rs.start()
    try:
        with _client(rs) as client:
            before = _write_some(client)
        rs.kill()
        assert os.path.getsize(tmp_path / JOURNAL) > 0
        rs.start()
        with _client(rs) as client:
            _check(client, before)
        rs.kill()  # a crash right after a restart loses nothing either
        rs.start()
        with _client(rs) as client:
            assert client.app.users.find_one({"_id": 200}) is not None
    finally:
        rs.stop()


def test_torn_journal_tail_is_ignored(tmp_path: Path) -> None:
    rs = EmulatedReplicaSet(dbpath=str(tmp_path), noop_interval=0, in_process=False)
    rs.start()
    try:
        with _client(rs) as client:
            client.app.c.insert_many([{"_id": i} for i in range(10)])
        rs.kill()
        with open(tmp_path / JOURNAL, "ab") as journal:
            journal.write(b"\x40\x00\x00\x00\x03partial")  # a record cut short by the crash
        rs.start()
        with _client(rs) as client:
            assert client.app.c.count_documents({}) == 10
            client.app.c.insert_one({"_id": 10})
        rs.stop()
        rs.start()
        with _client(rs) as client:
            assert client.app.c.count_documents({}) == 11
    finally:
        rs.stop()
