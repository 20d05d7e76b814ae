"""Catalog commands through pymongo: collections, options, indexes, uniqueness, renames."""

from __future__ import annotations

import uuid

import pytest
from bson import Binary
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure


def test_list_collections_with_uuid_options_and_filter(fresh_db: Database) -> None:
    fresh_db.create_collection("plain")
    fresh_db.create_collection("imaged", changeStreamPreAndPostImages={"enabled": True})
    fresh_db.create_collection("capped", capped=True, size=4096, max=10)
    infos = {info["name"]: info for info in fresh_db.list_collections()}
    assert set(infos) == {"plain", "imaged", "capped"}
    ui = infos["plain"]["info"]["uuid"]
    assert isinstance(ui, uuid.UUID) or (isinstance(ui, Binary) and ui.subtype == 4)
    assert infos["imaged"]["options"]["changeStreamPreAndPostImages"] == {"enabled": True}
    assert infos["capped"]["options"]["capped"] is True and infos["capped"]["options"]["max"] == 10
    assert fresh_db.list_collection_names(filter={"name": "plain"}) == ["plain"]
    names_only = fresh_db.command("listCollections", nameOnly=True)["cursor"]["firstBatch"]
    assert sorted(d["name"] for d in names_only) == ["capped", "imaged", "plain"]
    assert all(set(d) == {"name", "type"} for d in names_only)


def test_create_existing_and_coll_mod(fresh_db: Database) -> None:
    fresh_db.create_collection("c")
    with pytest.raises(OperationFailure) as info:
        fresh_db.command("create", "c", capped=True, size=1000)
    assert info.value.code == 48
    fresh_db.command("collMod", "c", changeStreamPreAndPostImages={"enabled": True})
    options = fresh_db.c.options()
    assert options["changeStreamPreAndPostImages"] == {"enabled": True}
    with pytest.raises(OperationFailure) as missing:
        fresh_db.command("collMod", "nope", changeStreamPreAndPostImages={"enabled": True})
    assert missing.value.code == 26


def test_unique_index_is_enforced(fresh_db: Database) -> None:
    c = fresh_db.people
    c.insert_many([{"email": "a@x"}, {"email": "b@x"}])
    name = c.create_index("email", unique=True)
    assert name == "email_1"
    with pytest.raises(DuplicateKeyError) as info:
        c.insert_one({"email": "a@x"})
    details = info.value.details or {}
    assert details["keyPattern"] == {"email": 1} and details["keyValue"] == {"email": "a@x"}
    assert 'index: email_1 dup key: { email: "a@x" }' in str(info.value)
    with pytest.raises(DuplicateKeyError):
        c.update_one({"email": "b@x"}, {"$set": {"email": "a@x"}})
    c.update_one({"email": "b@x"}, {"$set": {"email": "c@x"}})
    c.insert_one({"email": "b@x"})
    c.delete_one({"email": "a@x"})
    c.insert_one({"email": "a@x"})
    with pytest.raises(BulkWriteError) as bulk:
        c.insert_many([{"email": "z@x"}, {"email": "z@x"}], ordered=False)
    assert bulk.value.details["writeErrors"][0]["code"] == 11000


def test_unique_index_build_fails_on_duplicates(fresh_db: Database) -> None:
    fresh_db.c.insert_many([{"k": 1}, {"k": 1}])
    with pytest.raises(OperationFailure) as info:
        fresh_db.c.create_index("k", unique=True)
    assert info.value.code == 11000
    assert [ix["name"] for ix in fresh_db.c.list_indexes()] == ["_id_"]


def test_compound_sparse_partial_indexes(fresh_db: Database) -> None:
    c = fresh_db.c
    c.create_index([("a", 1), ("b", -1)], unique=True)
    c.insert_many([{"a": 1, "b": 1}, {"a": 1, "b": 2}, {"a": 2}])
    with pytest.raises(DuplicateKeyError):
        c.insert_one({"a": 1, "b": 2})
    with pytest.raises(DuplicateKeyError):  # a missing field indexes as null
        c.insert_one({"a": 2, "b": None})
    other = fresh_db.other
    other.create_index("s", unique=True, sparse=True)
    other.create_index("p", unique=True, partialFilterExpression={"active": True})
    other.insert_many([{}, {}, {"p": 1}, {"p": 1}, {"p": 2, "active": True}])
    with pytest.raises(DuplicateKeyError):
        other.insert_one({"p": 2, "active": True})
    indexes = {ix["name"]: ix for ix in c.list_indexes()} | {ix["name"]: ix for ix in other.list_indexes()}
    assert set(indexes) == {"_id_", "a_1_b_-1", "s_1", "p_1"}
    assert indexes["a_1_b_-1"]["key"] == {"a": 1, "b": -1} and indexes["s_1"]["sparse"] is True


def test_drop_indexes(fresh_db: Database) -> None:
    c = fresh_db.c
    c.create_index("a")
    c.create_index("b")
    c.drop_index("a_1")
    assert sorted(ix["name"] for ix in c.list_indexes()) == ["_id_", "b_1"]
    with pytest.raises(OperationFailure) as info:
        c.drop_index("nope_1")
    assert info.value.code == 27
    c.drop_indexes()
    assert [ix["name"] for ix in c.list_indexes()] == ["_id_"]
    assert list(fresh_db.nothing.list_indexes()) == []  # pymongo hides NamespaceNotFound here
    with pytest.raises(OperationFailure) as missing:
        fresh_db.command("listIndexes", "nothing")
    assert missing.value.code == 26


def test_drop_and_drop_database(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.c.insert_one({})
    fresh_db.c.drop()
    assert fresh_db.list_collection_names() == []
    fresh_db.d.insert_one({})
    assert fresh_db.name in mongo_client.list_database_names()
    mongo_client.drop_database(fresh_db.name)
    assert fresh_db.name not in mongo_client.list_database_names()


def test_rename_same_and_cross_database(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.a.insert_many([{"_id": 1}, {"_id": 2}])
    fresh_db.b.insert_one({"_id": "old"})
    with pytest.raises(OperationFailure) as exists:
        fresh_db.a.rename("b")
    assert exists.value.code == 48
    fresh_db.a.rename("b", dropTarget=True)
    assert fresh_db.list_collection_names() == ["b"]
    assert sorted(d["_id"] for d in fresh_db.b.find()) == [1, 2]
    other = mongo_client[fresh_db.name + "_x"]
    try:
        mongo_client.admin.command("renameCollection", f"{fresh_db.name}.b", to=f"{other.name}.moved")
        assert fresh_db.list_collection_names() == []
        assert other.moved.count_documents({}) == 2
    finally:
        mongo_client.drop_database(other.name)
    with pytest.raises(OperationFailure) as missing:
        mongo_client.admin.command("renameCollection", f"{fresh_db.name}.nope", to=f"{fresh_db.name}.x")
    assert missing.value.code == 26


def test_list_databases(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.c.insert_one({"x": 1})
    listed = mongo_client.admin.command("listDatabases")
    names = {d["name"] for d in listed["databases"]}
    assert {fresh_db.name, "admin", "local"} <= names
    only = mongo_client.admin.command("listDatabases", nameOnly=True, filter={"name": fresh_db.name})
    assert only["databases"] == [{"name": fresh_db.name}]
    every = mongo_client.admin.command("listDatabases", nameOnly=True)["databases"]
    assert {fresh_db.name, "admin", "local"} <= {d["name"] for d in every}
    assert all(d.keys() == {"name"} for d in every)
    # A filter on the size still filters by size (mongod computes it for the filter, then names only).
    sized = mongo_client.admin.command("listDatabases", nameOnly=True,
                                       filter={"name": fresh_db.name, "sizeOnDisk": {"$gt": 0}})
    assert sized["databases"] == [{"name": fresh_db.name}]
    assert mongo_client.admin.command("listDatabases", nameOnly=True,
                                      filter={"name": fresh_db.name, "sizeOnDisk": {"$lt": 0}})["databases"] == []


def test_capped_collection_keeps_the_newest(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.create_collection("log", capped=True, size=100_000, max=3)
    fresh_db.log.insert_many([{"_id": i} for i in range(5)])
    assert [d["_id"] for d in fresh_db.log.find()] == [2, 3, 4]
    deletes = mongo_client.local["oplog.rs"].count_documents({"ns": f"{fresh_db.name}.log", "op": "d"})
    assert deletes == 2  # FCV >= 5.0 replicates capped deletes explicitly
