"""Behaviour where the emulator used to differ from mongod 7.0: numeric equality with Decimal128,
``$min``/``$max`` over mixed numbers, oversized update results, unknown ``find`` fields."""

from __future__ import annotations

from typing import Any

import pytest
from bson import Decimal128, Int64
from pymongo.database import Database
from pymongo.errors import OperationFailure, WriteError

DOCS: list[dict[str, Any]] = [
    {"_id": 1, "d": Decimal128("1")},
    {"_id": 2, "d": 1},
    {"_id": 3, "d": 1.0},
    {"_id": 4, "d": Int64(1)},
    {"_id": 5, "d": Decimal128("1.00")},
    {"_id": 6, "d": [Decimal128("1"), 7]},
    {"_id": 7, "d": Decimal128("2")},
    {"_id": 8, "d": "1"},
]
ONES = [1, 2, 3, 4, 5, 6]


def _ids(db: Database[Any], query: dict[str, Any]) -> list[int]:
    return sorted(doc["_id"] for doc in db.c.find(query))


@pytest.mark.parametrize("value", [1, 1.0, Int64(1), Decimal128("1"), Decimal128("1.0")])
def test_numbers_equal_decimal128_by_value(fresh_db: Database[Any], value: Any) -> None:
    fresh_db.c.insert_many(DOCS)
    assert _ids(fresh_db, {"d": value}) == ONES
    assert _ids(fresh_db, {"d": {"$eq": value}}) == ONES
    assert _ids(fresh_db, {"d": {"$in": [value, 99]}}) == ONES
    assert _ids(fresh_db, {"d": {"$nin": [value]}}) == [7, 8]
    assert _ids(fresh_db, {"$or": [{"d": value}, {"_id": 8}]}) == [*ONES, 8]
    assert fresh_db.c.count_documents({"d": value}) == len(ONES)


def test_min_max_order_decimal128_among_numbers(fresh_db: Database[Any]) -> None:
    fresh_db.c.insert_many([
        {"g": 1, "v": Decimal128("1.5")}, {"g": 1, "v": 2}, {"g": 1, "v": Decimal128("10")}, {"g": 1, "v": 3.5},
        {"g": 1, "v": None}, {"g": 1},
    ])  # fmt: skip
    grouped = list(fresh_db.c.aggregate([{"$group": {"_id": "$g", "mx": {"$max": "$v"}, "mn": {"$min": "$v"}}}]))
    assert grouped == [{"_id": 1, "mx": Decimal128("10"), "mn": Decimal128("1.5")}]
    projected = list(
        fresh_db.c.aggregate([
            {"$match": {"v": 2}},
            {"$project": {"_id": 0, "mx": {"$max": [Decimal128("2.5"), "$v"]}, "mn": {"$min": [Decimal128("2.5"), "$v"]}}},
        ])
    )  # fmt: skip
    assert projected == [{"mx": Decimal128("2.5"), "mn": 2}]


def test_update_result_over_16_mib_is_17419(fresh_db: Database[Any]) -> None:
    fresh_db.c.insert_one({"_id": 1, "a": "x" * (9 * 1024 * 1024)})
    with pytest.raises(WriteError) as info:
        fresh_db.c.update_one({"_id": 1}, {"$set": {"b": "y" * (8 * 1024 * 1024)}})
    assert info.value.code == 17419
    assert "Resulting document after update is larger than 16777216" in str(info.value)
    with pytest.raises(OperationFailure) as by_find_and_modify:
        fresh_db.c.find_one_and_update({"_id": 1}, {"$set": {"b": "y" * (8 * 1024 * 1024)}})
    assert by_find_and_modify.value.code == 17419
    stored = fresh_db.c.find_one({"_id": 1})
    assert stored is not None and len(stored["a"]) == 9 * 1024 * 1024 and "b" not in stored  # unchanged


def test_upsert_over_16_mib_is_17420(fresh_db: Database[Any]) -> None:
    big = "z" * (8 * 1024 * 1024 + 100)
    with pytest.raises(WriteError) as info:
        fresh_db.c.update_one({"_id": 2}, {"$set": {"a": big, "b": big}}, upsert=True)
    assert info.value.code == 17420
    assert fresh_db.c.count_documents({}) == 0


def test_find_rejects_unknown_fields(fresh_db: Database[Any]) -> None:
    fresh_db.c.insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as info:
        fresh_db.command("find", "c", filter={}, x=1)
    assert info.value.code == 40415
    assert info.value.details is not None
    assert info.value.details["errmsg"] == "BSON field 'find.x' is an unknown field."
    reply = fresh_db.command("find", "c", filter={}, comment="known", maxTimeMS=1000, allowDiskUse=True)
    assert reply["cursor"]["firstBatch"] == [{"_id": 1}]
