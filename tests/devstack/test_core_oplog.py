"""``local.oplog.rs`` as drivers and tools read it: entry layout, ``ts`` ranges, natural order."""

from __future__ import annotations

import datetime
import os
import uuid
from typing import Any

import pytest
from bson import Binary, Timestamp
from pymongo import MongoClient
from pymongo.database import Database

from mongocdc_devstack.oplog import Oplog
from tests.conftest import REAL_URI_ENV


def _oplog(client: MongoClient) -> Any:
    return client.local["oplog.rs"]


def _last_ts(client: MongoClient) -> Timestamp:
    last = _oplog(client).find_one(sort=[("$natural", -1)])
    assert last is not None
    return last["ts"]


def _as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(bytes=bytes(value))


def _entries_for(client: MongoClient, start: Timestamp, ns: str) -> list[dict[str, Any]]:
    return [e for e in _oplog(client).find({"ts": {"$gt": start}}) if e["ns"] in (ns, ns.split(".")[0] + ".$cmd")]


def test_crud_entries_have_mongod_layout(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.create_collection("c")
    info = next(fresh_db.list_collections(filter={"name": "c"}))
    ui = _as_uuid(info["info"]["uuid"])
    start = _last_ts(mongo_client)
    ns = f"{fresh_db.name}.c"
    fresh_db.c.insert_one({"_id": 1, "a": 1})
    fresh_db.c.update_one({"_id": 1}, {"$set": {"a": 2}})
    fresh_db.c.replace_one({"_id": 1}, {"b": 1})
    fresh_db.c.delete_one({"_id": 1})
    entries = _entries_for(mongo_client, start, ns)
    assert [e["op"] for e in entries] == ["i", "u", "u", "d"]
    insert, update, replace, delete = entries
    assert insert["o"] == {"_id": 1, "a": 1} and insert["o2"] == {"_id": 1}
    assert update["o"]["$v"] == 2 and "diff" in update["o"] and update["o2"] == {"_id": 1}
    assert replace["o"] == {"_id": 1, "b": 1} and "$v" not in replace["o"]
    assert delete["o"] == {"_id": 1}
    keys = [(e["ts"].time, e["ts"].inc) for e in entries]
    assert keys == sorted(keys) and len(set(keys)) == 4
    for entry in entries:
        assert entry["ns"] == ns and _as_uuid(entry["ui"]) == ui
        assert entry["v"] == 2 and isinstance(entry["t"], int) and isinstance(entry["wall"], datetime.datetime)


def test_command_entries(mongo_client: MongoClient, fresh_db: Database) -> None:
    start = _last_ts(mongo_client)
    fresh_db.create_collection("x", changeStreamPreAndPostImages={"enabled": True})
    fresh_db.x.create_index("k")
    fresh_db.x.drop()
    commands = [e for e in _oplog(mongo_client).find({"ts": {"$gt": start}, "op": "c"}) if e["ns"] == f"{fresh_db.name}.$cmd"]
    bodies = [e["o"] for e in commands]
    assert bodies[0]["create"] == "x" and bodies[0]["changeStreamPreAndPostImages"] == {"enabled": True}
    assert bodies[1]["createIndexes"] == "x" and bodies[1]["key"] == {"k": 1}
    assert bodies[2] == {"drop": "x"}
    assert all(isinstance(e["ui"], (uuid.UUID, Binary)) for e in commands)


def test_ts_range_and_natural_order(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.c.insert_many([{"_id": i} for i in range(5)])
    ns = f"{fresh_db.name}.c"
    inserts = list(_oplog(mongo_client).find({"ns": ns, "op": "i"}))
    assert [e["o"]["_id"] for e in inserts] == list(range(5))
    third = inserts[2]["ts"]
    from_third = list(_oplog(mongo_client).find({"ts": {"$gte": third}, "ns": ns}))
    assert [e["o"]["_id"] for e in from_third] == [2, 3, 4]
    newest_first = list(_oplog(mongo_client).find({"ns": ns}).sort("$natural", -1).limit(2))
    assert [e["o"]["_id"] for e in newest_first] == [4, 3]
    assert _oplog(mongo_client).count_documents({"ts": {"$lt": third}, "ns": ns, "op": "i"}) == 2


def test_limited_reads_in_oplog_order_read_what_the_whole_oplog_gives(
        mongo_client: MongoClient, fresh_db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A find with a limit in oplog order reads only what it returns (the oldest entry, read at every start of
    the connector, costs the same with a million entries as with ten); it returns what the whole read gives.
    On the emulator, its oplog reads show the limit handed down and only that many entries copied."""
    fresh_db.c.insert_many([{"_id": i} for i in range(6)])
    oplog = _oplog(mongo_client)
    every = list(oplog.find({}))
    assert len(every) > 6
    emulated = not os.environ.get(REAL_URI_ENV)
    reads: list[tuple[int | None, int]] = []  # (limit, entries copied) of each read of the emulator's oplog
    read = Oplog.read

    def counted(self: Oplog, after: Timestamp | None, inclusive: bool = False,
                limit: int | None = None) -> list[dict[str, Any]]:
        entries = read(self, after, inclusive, limit)
        reads.append((limit, len(entries)))
        return entries

    monkeypatch.setattr(Oplog, "read", counted)
    assert oplog.find_one({}, {"ts": 1}, sort=[("$natural", 1)])["ts"] == every[0]["ts"]
    assert not emulated or (1, 1) in reads
    reads.clear()
    assert [e["ts"] for e in oplog.find({}).limit(3)] == [e["ts"] for e in every[:3]]
    assert not emulated or (3, 3) in reads
    third = every[2]["ts"]
    reads.clear()
    assert [e["ts"] for e in oplog.find({"ts": {"$gt": third}}).skip(1).limit(2)] == [e["ts"] for e in every[4:6]]
    assert not emulated or (3, 3) in reads  # the skipped entry and the two returned
    assert [e["ts"] for e in oplog.find({"ts": third}).limit(1)] == [third]
    inserts = [e for e in every if e.get("ns") == f"{fresh_db.name}.c" and e["op"] == "i"]
    # other conditions than the lower bound filter the whole range before the limit
    assert [e["o"]["_id"] for e in oplog.find({"ts": {"$gte": third}, "ns": f"{fresh_db.name}.c", "op": "i"}).limit(2)] == \
        [e["o"]["_id"] for e in inserts if e["ts"] >= third][:2]
    # the newest entries: read again after the limited read (entries written meanwhile, a no-op's or another
    # test's, are newer than what it returned, and left out of the comparison)
    newest = [e["ts"] for e in oplog.find({}).sort("$natural", -1).limit(2)]
    assert newest == [e["ts"] for e in oplog.find({}) if e["ts"] <= newest[0]][::-1][:2]
