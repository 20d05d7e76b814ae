"""Aggregation through pymongo: common stages, cursor replies, mongod's errors."""

from __future__ import annotations

import pytest
from pymongo.database import Database
from pymongo.errors import OperationFailure


@pytest.fixture
def sales(fresh_db: Database) -> Database:
    fresh_db.sales.insert_many(
        [{"_id": i, "item": "abc"[i % 3], "qty": i, "tags": ["t1", "t2"] if i % 2 else ["t1"]} for i in range(1, 13)]
    )
    fresh_db.items.insert_many([{"_id": "a", "name": "Apple"}, {"_id": "b", "name": "Banana"}])
    return fresh_db


def test_match_group_sort_project(sales: Database) -> None:
    result = list(
        sales.sales.aggregate(
            [
                {"$match": {"qty": {"$gt": 2}}},
                {"$group": {"_id": "$item", "total": {"$sum": "$qty"}, "n": {"$sum": 1}}},
                {"$sort": {"total": -1}},
                {"$project": {"_id": 0, "item": "$_id", "total": 1, "n": 1}},
            ]
        )
    )
    assert result == [
        {"total": 30, "n": 4, "item": "a"},
        {"total": 24, "n": 3, "item": "c"},
        {"total": 21, "n": 3, "item": "b"},
    ]


def test_unwind_count_skip_limit_addfields(sales: Database) -> None:
    unwound = list(sales.sales.aggregate([{"$unwind": "$tags"}, {"$count": "n"}]))
    assert unwound == [{"n": 18}]
    page = list(sales.sales.aggregate([{"$sort": {"qty": 1}}, {"$skip": 3}, {"$limit": 2},
                                        {"$addFields": {"double": {"$multiply": ["$qty", 2]}}},
                                        {"$set": {"flag": True}}, {"$project": {"double": 1, "flag": 1}}]))  # fmt: skip
    assert page == [{"_id": 4, "double": 8, "flag": True}, {"_id": 5, "double": 10, "flag": True}]


def test_lookup(sales: Database) -> None:
    joined = list(
        sales.sales.aggregate(
            [{"$match": {"_id": {"$lte": 2}}}, {"$lookup": {"from": "items", "localField": "item", "foreignField": "_id", "as": "info"}},
             {"$project": {"info.name": 1}}]  # fmt: skip
        )
    )
    assert joined == [{"_id": 1, "info": [{"name": "Banana"}]}, {"_id": 2, "info": []}]


def test_sample_and_bucket_auto(sales: Database) -> None:
    sample = list(sales.sales.aggregate([{"$sample": {"size": 5}}]))
    assert len(sample) == 5 and len({d["_id"] for d in sample}) == 5
    everything = list(sales.sales.aggregate([{"$sample": {"size": 1000}}, {"$sort": {"_id": 1}}]))
    assert everything == list(sales.sales.find().sort("_id", 1))  # fewer documents than asked: all of them
    ids = list(sales.sales.aggregate([{"$sample": {"size": 3}}, {"$project": {"_id": 1}}, {"$sort": {"_id": 1}}]))
    assert len(ids) == 3 and all(list(d) == ["_id"] for d in ids) and ids == sorted(ids, key=lambda d: d["_id"])
    for spec, code in (({"size": "5"}, 28746), ({"size": -1}, 28747), ({}, 28749), ({"size": 1, "x": 1}, 28748)):
        with pytest.raises(OperationFailure) as raised:
            list(sales.sales.aggregate([{"$sample": spec}]))
        assert raised.value.code == code, spec
    with pytest.raises(OperationFailure) as raised:  # the whole pipeline is parsed before anything runs
        list(sales.sales.aggregate([{"$sample": {"size": 2}}, {"$nope": 1}]))
    assert raised.value.code == 40324
    buckets = list(sales.sales.aggregate([{"$bucketAuto": {"groupBy": "$qty", "buckets": 3}}]))
    assert buckets == [
        {"_id": {"min": 1, "max": 5}, "count": 4},
        {"_id": {"min": 5, "max": 9}, "count": 4},
        {"_id": {"min": 9, "max": 12}, "count": 4},
    ]


def test_aggregate_batches_through_getmore(fresh_db: Database) -> None:
    fresh_db.c.insert_many([{"_id": i} for i in range(300)])
    cursor = fresh_db.c.aggregate([{"$match": {}}], batchSize=50)
    assert [d["_id"] for d in cursor] == list(range(300))
    reply = fresh_db.command("aggregate", "c", pipeline=[{"$limit": 3}], cursor={})
    assert reply["cursor"]["id"] == 0 and len(reply["cursor"]["firstBatch"]) == 3
    assert reply["cursor"]["ns"] == f"{fresh_db.name}.c"


def test_unknown_stage_and_missing_cursor(fresh_db: Database) -> None:
    fresh_db.c.insert_one({"a": 1})
    with pytest.raises(OperationFailure) as unknown:
        list(fresh_db.c.aggregate([{"$frobnicate": {}}]))
    assert unknown.value.code == 40324
    assert "Unrecognized pipeline stage name: '$frobnicate'" in str(unknown.value)
    with pytest.raises(OperationFailure) as no_cursor:
        fresh_db.command("aggregate", "c", pipeline=[])
    assert no_cursor.value.code == 9


def test_aggregate_on_missing_collection_is_empty(fresh_db: Database) -> None:
    assert list(fresh_db.nothing.aggregate([{"$match": {"a": 1}}])) == []


def test_bson_size_and_expr_with_missing_fields(fresh_db: Database) -> None:
    fresh_db.c.insert_many([{"_id": 1, "d": {"a": 1}, "n": 7}, {"_id": 2}])
    sizes = list(fresh_db.c.aggregate([{"$project": {"s": {"$bsonSize": "$d"}}}]))
    assert sizes == [{"_id": 1, "s": 12}, {"_id": 2, "s": None}]
    small = {"$expr": {"$lte": [{"$ifNull": [{"$bsonSize": "$d"}, 0]}, 5]}}
    assert [d["_id"] for d in fresh_db.c.find(small)] == [2]
    assert [d["_id"] for d in fresh_db.c.find({"$expr": {"$gt": ["$n", 5]}})] == [1]
