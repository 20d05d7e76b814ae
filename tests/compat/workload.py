"""The writes both connectors capture in the compatibility suite.

Snapshot data: one document per ``_id`` type of the key table (seed 000, table 9) plus UUID, Int64
and date, inserted in the server's ``_id`` order (Debezium reads a collection in natural order,
mongocdc in ``_id`` order: the same order for these collections), and documents holding every BSON
type and strings the Java writer escapes. Streaming: the same ``_id`` types inserted, updated and
deleted; every update operator that changes ``updateDescription``; replaces, deletes and upserts;
two committed transactions over two collections and an aborted one; and a closing plain insert, so
every transaction is followed by an event (Debezium writes a transaction's END only then).
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from pymongo import MongoClient
from pymongo.database import Database

#: The key table's types plus UUID, Int64 and date, in the server's _id order (numbers, strings,
#: documents, binaries, ObjectId, dates).
KEY_IDS: list[Any] = [
    12.34,
    1234,
    Int64(1 << 40),
    "1234",
    "ké\u0301y 😀",
    {"hi": "kafka", "nums": [10.0, 100.0, 1000.0]},
    Binary(b"kafka", 0),
    Binary(uuid.UUID("12345678-1234-5678-1234-567812345678").bytes, 4),
    ObjectId("596e275826f08b2730779e1f"),
    datetime.datetime(2024, 1, 2, 3, 4, 5, 678000),
]
#: Streaming _ids: the same types with other values (snapshot ids are updated and deleted too).
STREAM_IDS: list[Any] = [
    5678,
    Int64(-7),
    -0.5,
    "5678",
    {"hi": "again", "n": Int64(3)},
    Binary(b"\x00\xff", 0),
    Binary(uuid.UUID("87654321-4321-8765-4321-876543218765").bytes, 4),
    ObjectId("65a0f1e2d3c4b5a697887766"),
    datetime.datetime(1969, 12, 31, 23, 59, 59, 500000),
]
WHEN = datetime.datetime(2024, 5, 6, 7, 8, 9, 10000)


def rich_document(doc_id: Any) -> dict[str, Any]:
    """Every BSON type pymongo keeps, doubles Java spells its own way, and strings it escapes."""
    return {
        "_id": doc_id,
        "int": 42,
        "long": Int64(1 << 40),
        "double": 1.5,
        "big": 1.0e300,
        "small": 1.0e-5,
        "whole": 100.0,
        "million": 12345678.9,
        "neg_zero": -0.0,
        "decimal": Decimal128("1234.5670"),
        "text": "héllo \"quoted\" \\ / \t\n",
        "controls": "\u0001\u001f\u007f\u0085",
        "marks": "e\u0301 ʰ \u200b \u2028 😀 \ue000",
        "fïeld ñame": True,
        "none": None,
        "oid": ObjectId("5f0c5a4e6c3e0c5a4e6c3e0c"),
        "when": WHEN,
        "epoch": datetime.datetime(1970, 1, 1),
        "bin": Binary(b"\x00\x01\x02", 0),
        "uuid": Binary(uuid.UUID("0e3a3a6a-6d1b-4a2e-9c3e-3b3b3b3b3b3b").bytes, 4),
        "custom_bin": Binary(b"xyz", 0x80),
        "regex": Regex("^a.*z$", "im"),
        "ts": Timestamp(1700000000, 7),
        "min": MinKey(),
        "max": MaxKey(),
        "code": Code("function () { return 1; }"),
        "sub": {"a": [1, Int64(2), 3.5, {"deep": ["x", None]}], "empty": {}, "empty_list": []},
        "arr": [1, 2, 3, 4, 5],
    }


def create_collections(db: Database[Any], names: list[str]) -> None:
    """Collections with pre- and post-images (harmless for the modes that do not read them)."""
    for name in names:
        db.create_collection(name, changeStreamPreAndPostImages={"enabled": True})


def load_snapshot_data(db: Database[Any]) -> None:
    """What the snapshot copies: key types in ``keys``, rich documents in ``docs``."""
    db.keys.insert_many([{"_id": doc_id, "n": i} for i, doc_id in enumerate(KEY_IDS)])
    db.docs.insert_many([rich_document(1), rich_document(2)])


def stream_workload(client: MongoClient[Any], db: Database[Any]) -> None:
    """Every kind of change the suite compares (see the module docstring)."""
    keys, ops, other = db.keys, db.ops, db.other
    # _id types: insert, update, delete (the delete's tombstone has the same key).
    for i, doc_id in enumerate(STREAM_IDS):
        keys.insert_one({"_id": doc_id, "n": i})
    for doc_id in STREAM_IDS[:4] + KEY_IDS[-3:]:
        keys.update_one({"_id": doc_id}, {"$set": {"touched": True}})
    for doc_id in STREAM_IDS[4:] + KEY_IDS[:2]:
        keys.delete_one({"_id": doc_id})

    # Update operators, one update each, on a document that has something for every one of them.
    ops.insert_one(rich_document("u"))
    updates: list[Any] = [
        {"$set": {"long": Int64(7), "when": datetime.datetime(2030, 1, 1), "big": -2.5e-300, "sub.a.0": "first",
                  "new": {"x": [Int64(1), 2.0]}}},
        {"$unset": {"none": "", "sub.empty": ""}},
        {"$inc": {"int": 1, "long": Int64(5), "double": 0.25}},
        {"$mul": {"int": 2}},
        {"$min": {"int": -1}},
        {"$max": {"whole": 1.0e7}},
        {"$push": {"arr": {"$each": [6, 7]}}},
        {"$addToSet": {"arr": 8}},
        {"$pop": {"arr": 1}},
        {"$pop": {"arr": -1}},
        {"$pull": {"arr": {"$in": [3, 4]}}},
        {"$pullAll": {"arr": [2]}},
        {"$rename": {"text": "renamed", "sub.empty_list": "moved"}},
        {"$set": {"arr.1": 99}},
        {"$set": {"arr.$[]": 0}},
        {"$currentDate": {"stamped": True}},
        {"$set": {"nan": float("nan"), "inf": float("inf"), "ninf": float("-inf")}},
        {"$setOnInsert": {"never": 1}, "$set": {"seen": 1}},
        [{"$set": {"computed": {"$add": ["$int", 1]}, "arr": {"$slice": ["$arr", 2]}}}],
        [{"$unset": ["computed"]}],
        [{"$replaceWith": {"_id": "$_id", "only": "this", "long": "$long"}}],
        {"$set": {"only": "this"}},  # a no-op update: empty updatedFields
    ]
    for update in updates:
        ops.update_one({"_id": "u"}, update)

    # Replaces, upserts, deletes.
    ops.insert_one({"_id": "r", "v": 1})
    ops.replace_one({"_id": "r"}, {"v": 2, "w": [1, {"x": Int64(9)}]})
    ops.replace_one({"_id": "new-by-replace"}, {"v": 1}, upsert=True)
    ops.update_one({"_id": "new-by-update"}, {"$set": {"v": 1}, "$setOnInsert": {"created": WHEN}}, upsert=True)
    ops.update_one({"_id": "new-by-update"}, {"$set": {"v": 2}}, upsert=True)
    ops.delete_one({"_id": "r"})
    ops.delete_many({"_id": {"$in": ["new-by-replace", "missing"]}})

    # Transactions: two committed back to back over two collections, one aborted.
    with client.start_session() as session:
        with session.start_transaction():
            ops.insert_one({"_id": "t1", "v": 1}, session=session)
            other.insert_one({"_id": "t1", "v": 1}, session=session)
            ops.update_one({"_id": "t1"}, {"$inc": {"v": 1}}, session=session)
            other.delete_one({"_id": "t1"}, session=session)
        with session.start_transaction():
            other.insert_one({"_id": "t2", "v": Int64(2)}, session=session)
    with client.start_session() as session:
        session.start_transaction()
        ops.insert_one({"_id": "aborted"}, session=session)
        session.abort_transaction()
    with client.start_session() as session:
        with session.start_transaction():
            ops.insert_one({"_id": "t3"}, session=session)
            ops.replace_one({"_id": "t3"}, {"v": 3}, session=session)
    other.insert_one({"_id": "closing"})  # the event after the last transaction
