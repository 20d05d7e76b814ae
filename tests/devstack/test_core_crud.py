"""CRUD through pymongo: inserts, updates (operators, upserts, arrayFilters), deletes, finds."""

from __future__ import annotations

import datetime

import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from pymongo import ASCENDING, DESCENDING, ReturnDocument
from pymongo.database import Database
from pymongo.errors import BulkWriteError, DocumentTooLarge, DuplicateKeyError, OperationFailure, WriteError

from .core_helpers import one


def test_insert_generates_object_id_first(fresh_db: Database) -> None:
    result = fresh_db.c.insert_one({"a": 1})
    assert isinstance(result.inserted_id, ObjectId)
    raw = one(fresh_db.c, {}, {"_id": 1, "a": 1})
    assert list(raw) == ["_id", "a"]
    fresh_db.c.insert_one({"b": 2, "_id": 7})
    assert list(one(fresh_db.c, {"_id": 7})) == ["_id", "b"]


def test_duplicate_id_is_rejected_with_mongod_error(fresh_db: Database) -> None:
    fresh_db.c.insert_one({"_id": 1})
    with pytest.raises(DuplicateKeyError) as info:
        fresh_db.c.insert_one({"_id": 1.0})
    assert info.value.code == 11000
    assert "dup key: { _id: 1" in str(info.value)
    assert (info.value.details or {})["keyPattern"] == {"_id": 1}


def test_ordered_and_unordered_insert_many(fresh_db: Database) -> None:
    docs = [{"_id": 1}, {"_id": 1}, {"_id": 2}]
    with pytest.raises(BulkWriteError) as ordered:
        fresh_db.o.insert_many(docs, ordered=True)
    assert ordered.value.details["nInserted"] == 1
    assert [e["index"] for e in ordered.value.details["writeErrors"]] == [1]
    with pytest.raises(BulkWriteError) as unordered:
        fresh_db.u.insert_many(docs, ordered=False)
    assert unordered.value.details["nInserted"] == 2
    assert fresh_db.u.count_documents({}) == 2


def test_update_operators(fresh_db: Database) -> None:
    c = fresh_db.c
    c.insert_one({"_id": 1, "n": 2, "f": 1.5, "arr": [1, 2, 3], "tags": ["a"], "sub": {"x": 1}, "old": 1})
    c.update_one(
        {"_id": 1},
        {
            "$inc": {"n": 3, "sub.y": 1},
            "$mul": {"f": 2},
            "$push": {"arr": {"$each": [4, 5], "$slice": -4}},
            "$addToSet": {"tags": {"$each": ["a", "b"]}},
            "$rename": {"old": "new"},
            "$set": {"sub.x": 10},
            "$min": {"lo": 5},
        },
    )
    doc = one(c, {"_id": 1})
    assert doc == {"_id": 1, "n": 5, "f": 3.0, "arr": [2, 3, 4, 5], "tags": ["a", "b"],
                   "sub": {"x": 10, "y": 1}, "new": 1, "lo": 5}  # fmt: skip
    c.update_one({"_id": 1}, {"$pull": {"arr": {"$gte": 4}}, "$unset": {"lo": ""}, "$pop": {"tags": -1}})
    doc = one(c, {"_id": 1})
    assert doc["arr"] == [2, 3] and "lo" not in doc and doc["tags"] == ["b"]


def test_update_counts_and_no_op(fresh_db: Database) -> None:
    c = fresh_db.c
    c.insert_many([{"_id": i, "g": i % 2} for i in range(6)])
    result = c.update_many({"g": 1}, {"$set": {"seen": True}})
    assert (result.matched_count, result.modified_count) == (3, 3)
    again = c.update_many({"g": 1}, {"$set": {"seen": True}})
    assert (again.matched_count, again.modified_count) == (3, 0)
    none = c.update_one({"g": 7}, {"$set": {"x": 1}})
    assert (none.matched_count, none.modified_count, none.upserted_id) == (0, 0, None)


def test_array_filters_and_positional(fresh_db: Database) -> None:
    c = fresh_db.c
    c.insert_one({"_id": 1, "grades": [{"g": 80, "m": 1}, {"g": 95, "m": 1}, {"g": 90, "m": 1}], "xs": [1, 5, 9]})
    c.update_one({"_id": 1}, {"$set": {"grades.$[hi].m": 2}}, array_filters=[{"hi.g": {"$gte": 90}}])
    c.update_one({"_id": 1, "xs": 5}, {"$set": {"xs.$": 50}})
    c.update_one({"_id": 1}, {"$inc": {"grades.$[].g": 1}})
    doc = one(c, {"_id": 1})
    assert [g["m"] for g in doc["grades"]] == [1, 2, 2]
    assert [g["g"] for g in doc["grades"]] == [81, 96, 91]
    assert doc["xs"] == [1, 50, 9]


def test_upserts(fresh_db: Database) -> None:
    c = fresh_db.c
    result = c.update_one({"k": "a", "n": {"$gt": 1}}, {"$set": {"v": 1}, "$setOnInsert": {"created": True}}, upsert=True)
    assert result.upserted_id is not None and result.matched_count == 0
    assert c.find_one({"k": "a"}, {"_id": 0}) == {"k": "a", "v": 1, "created": True}
    replaced = c.replace_one({"_id": "r"}, {"x": 1}, upsert=True)
    assert replaced.upserted_id == "r"
    c.update_one({"k": "a"}, {"$set": {"v": 2}, "$setOnInsert": {"created": False}}, upsert=True)
    assert c.find_one({"k": "a"}, {"_id": 0}) == {"k": "a", "v": 2, "created": True}


def test_replacement_keeps_id_and_rejects_changing_it(fresh_db: Database) -> None:
    c = fresh_db.c
    c.insert_one({"_id": 1, "a": 1, "b": 2})
    c.replace_one({"_id": 1}, {"c": 3})
    assert c.find_one({"_id": 1}) == {"_id": 1, "c": 3}
    with pytest.raises(WriteError) as info:
        c.replace_one({"_id": 1}, {"_id": 2, "c": 3})
    assert info.value.code == 66


def test_update_errors_match_mongod(fresh_db: Database) -> None:
    c = fresh_db.c
    c.insert_one({"_id": 1, "s": "text"})
    with pytest.raises(WriteError) as inc:
        c.update_one({"_id": 1}, {"$inc": {"s": 1}})
    assert inc.value.code == 14
    with pytest.raises(WriteError) as unknown:
        c.update_one({"_id": 1}, {"$foo": {"s": 1}})
    assert unknown.value.code == 9 and "Unknown modifier: $foo" in str(unknown.value)
    with pytest.raises(WriteError) as conflict:
        c.update_one({"_id": 1}, {"$set": {"a": 1}, "$inc": {"a": 1}})
    assert conflict.value.code == 40


def test_unknown_query_operator_is_bad_value(fresh_db: Database) -> None:
    fresh_db.c.insert_one({"a": 1})
    with pytest.raises(OperationFailure) as info:
        list(fresh_db.c.find({"a": {"$foo": 1}}))
    assert info.value.code == 2 and "unknown operator: $foo" in str(info.value)
    with pytest.raises(OperationFailure) as empty:
        list(fresh_db.empty.find({"a": {"$foo": 1}}))
    assert empty.value.code == 2


def test_delete_one_and_many(fresh_db: Database) -> None:
    c = fresh_db.c
    c.insert_many([{"_id": i, "g": i % 3} for i in range(9)])
    assert c.delete_one({"g": 0}).deleted_count == 1
    assert c.delete_many({"g": 1}).deleted_count == 3
    assert c.delete_many({"g": 42}).deleted_count == 0
    assert sorted(d["_id"] for d in c.find()) == [2, 3, 5, 6, 8]


def test_find_options(fresh_db: Database) -> None:
    c = fresh_db.c
    c.insert_many([{"_id": i, "v": i % 5, "sub": {"x": i}} for i in range(50)])
    docs = list(c.find({"v": {"$in": [1, 2]}}, {"sub": 0}).sort([("v", DESCENDING), ("_id", ASCENDING)]).skip(2).limit(5))
    assert [d["_id"] for d in docs] == [12, 17, 22, 27, 32]
    assert all(set(d) == {"_id", "v"} for d in docs)
    assert c.find_one({"sub.x": 7}, {"_id": 0, "sub.x": 1}) == {"sub": {"x": 7}}
    assert [d["_id"] for d in c.find().sort("$natural", -1).limit(3)] == [49, 48, 47]
    assert [d["_id"] for d in c.find({}, hint=[("$natural", 1)]).limit(2)] == [0, 1]


def test_getmore_batches_and_kill_cursors(fresh_db: Database) -> None:
    c = fresh_db.c
    c.insert_many([{"_id": i} for i in range(250)])
    cursor = c.find().batch_size(7)
    assert [d["_id"] for d in cursor] == list(range(250))
    partial = c.find().batch_size(10)
    next(partial)
    assert partial.cursor_id
    partial.close()
    reply = fresh_db.command("find", "c", batchSize=2)
    cursor_id = reply["cursor"]["id"]
    assert isinstance(cursor_id, Int64) and cursor_id != 0
    killed = fresh_db.command("killCursors", "c", cursors=[cursor_id, Int64(12345)])
    assert killed["cursorsKilled"] == [cursor_id] and killed["cursorsNotFound"] == [12345]
    with pytest.raises(OperationFailure) as info:
        fresh_db.command("getMore", cursor_id, collection="c")
    assert info.value.code == 43
    single = fresh_db.command("find", "c", batchSize=5, singleBatch=True)
    assert single["cursor"]["id"] == 0 and len(single["cursor"]["firstBatch"]) == 5


def test_bson_type_sort_order(fresh_db: Database) -> None:
    values = [MaxKey(), Regex("a"), Timestamp(1, 1), datetime.datetime(2020, 1, 1), True, ObjectId(),
              Binary(b"x", 0), [1], {"a": 1}, "s", 5, Decimal128("2.5"), 1.5, None, MinKey()]  # fmt: skip
    fresh_db.c.insert_many([{"_id": i, "v": v} for i, v in enumerate(values)])
    order = [d["_id"] for d in fresh_db.c.find({}, {"_id": 1}).sort([("v", ASCENDING), ("_id", ASCENDING)])]
    # numbers compare by value across types; the array [1] sorts as its element 1 (a number)
    assert order == [14, 13, 7, 12, 11, 10, 9, 8, 6, 5, 4, 3, 2, 1, 0]


def test_mixed_id_types_range_and_sort(fresh_db: Database) -> None:
    ids = ["b", 3, 1.5, Int64(2), ObjectId(), "a"]
    fresh_db.c.insert_many([{"_id": i} for i in ids])
    numbers = [d["_id"] for d in fresh_db.c.find({"_id": {"$gte": 1, "$lt": 3}}).sort("_id", 1)]
    assert numbers == [1.5, 2]
    everything = [d["_id"] for d in fresh_db.c.find().sort("_id", -1)]
    assert isinstance(everything[0], ObjectId) and everything[1:3] == ["b", "a"] and everything[3:] == [3, 2, 1.5]


def test_count_distinct_and_estimated(fresh_db: Database) -> None:
    c = fresh_db.c
    c.insert_many([{"k": i % 3, "tags": ["x", "y"] if i % 2 else ["z"]} for i in range(10)])
    assert c.count_documents({"k": 1}) == 3
    assert c.count_documents({}, skip=2, limit=5) == 5
    assert c.estimated_document_count() == 10
    assert sorted(c.distinct("k")) == [0, 1, 2]
    assert sorted(c.distinct("tags", {"k": 0})) == ["x", "y", "z"]


def test_find_one_and_modify(fresh_db: Database) -> None:
    c = fresh_db.c
    c.insert_many([{"_id": 1, "n": 1}, {"_id": 2, "n": 2}])
    before = c.find_one_and_update({"n": {"$gte": 1}}, {"$inc": {"n": 10}}, sort=[("n", -1)])
    assert before == {"_id": 2, "n": 2}
    after = c.find_one_and_update({"_id": 1}, {"$inc": {"n": 1}}, return_document=ReturnDocument.AFTER, projection={"_id": 0})
    assert after == {"n": 2}
    upserted = c.find_one_and_update({"_id": 3}, {"$set": {"n": 0}}, upsert=True, return_document=ReturnDocument.AFTER)
    assert upserted == {"_id": 3, "n": 0}
    assert c.find_one_and_replace({"_id": 3}, {"r": 1}, return_document=ReturnDocument.AFTER) == {"_id": 3, "r": 1}
    assert c.find_one_and_delete({"_id": 1}) == {"_id": 1, "n": 2}
    assert c.find_one_and_delete({"_id": 1}) is None


def test_document_too_large(fresh_db: Database) -> None:
    with pytest.raises((DocumentTooLarge, OperationFailure)):
        fresh_db.c.insert_one({"blob": "x" * (16 * 1024 * 1024)})
    fresh_db.c.insert_one({"_id": 1, "blob": "x" * (15 * 1024 * 1024)})
    with pytest.raises(WriteError) as info:
        fresh_db.c.update_one({"_id": 1}, {"$set": {"more": "y" * (2 * 1024 * 1024)}})
    assert info.value.code in (10334, 17419)


def test_id_range_reads_follow_type_bracketing(fresh_db: Database) -> None:
    oids = [ObjectId() for _ in range(3)]
    ids = [5, 1, 3.5, Int64(2), "b", "a", *oids, datetime.datetime(2020, 1, 1), 7]
    fresh_db.c.insert_many([{"_id": i, "k": n % 2} for n, i in enumerate(ids)])
    c = fresh_db.c
    assert [d["_id"] for d in c.find({"_id": {"$gte": 2, "$lt": 7}}).sort("_id", 1)] == [2, 3.5, 5]
    assert [d["_id"] for d in c.find({"_id": {"$gt": 2}}).sort("_id", -1).limit(2)] == [7, 5]
    assert [d["_id"] for d in c.find({"_id": {"$gt": "a"}})] == ["b"]
    assert [d["_id"] for d in c.find({"_id": {"$gte": oids[1]}}).sort("_id", 1)] == oids[1:]
    assert [d["_id"] for d in c.find({"_id": {"$lt": 3}}).sort("_id", 1)] == [1, 2]
    assert [d["_id"] for d in c.find({"_id": {"$gt": 1, "$lt": "z"}})] == []
    assert [d["_id"] for d in c.find({"_id": {"$gte": 1}, "k": 0}).sort("_id", 1).skip(1).limit(2)] == [5, 7]
    c.delete_one({"_id": 5})
    c.insert_one({"_id": 4})
    assert [d["_id"] for d in c.find({"_id": {"$gte": 3}}).sort("_id", 1)] == [3.5, 4, 7]
    # whole-collection reads in index order, limited (the smallest / largest _id, as find_one asks)
    assert c.find_one({}, {"_id": 1}, sort=[("_id", 1)]) == {"_id": 1}
    assert c.find_one({}, {"_id": 1}, sort=[("_id", -1)]) == {"_id": datetime.datetime(2020, 1, 1)}
    assert [d["_id"] for d in c.find().sort("_id", 1).skip(2).limit(2)] == [3.5, 4]


def test_code_values_are_queried_sorted_and_used_as_ids(fresh_db: Database) -> None:
    """A query on a JavaScript value (a ``str`` subclass without a hash) answers like mongod (issue 14)."""
    fresh_db.c.insert_many([{"_id": 1, "c": Code("function() {}")}, {"_id": Code("x"), "c": 2}, {"_id": 3, "c": MaxKey()}])
    assert [d["_id"] for d in fresh_db.c.find({"c": Code("function() {}")})] == [1]
    assert [d["_id"] for d in fresh_db.c.find({"c": {"$in": [Code("function() {}")]}})] == [1]
    assert fresh_db.c.find_one({"_id": Code("x")}) == {"_id": Code("x"), "c": 2}
    # BSON order: numbers < JavaScript < MaxKey
    assert [d["_id"] for d in fresh_db.c.find().sort("c", ASCENDING)] == [Code("x"), 1, 3]
