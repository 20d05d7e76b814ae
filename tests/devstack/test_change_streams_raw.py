"""The change stream's direct BSON encoding of CRUD events equals the document path, byte for byte.

Streams without user stages encode insert/update/replace/delete events straight to BSON from
cached fragments (for throughput); streams with stages build documents. Both must give exactly
the same bytes, field order included, for every kind of event and stream option.
"""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import Iterator
from typing import Any

import bson
import pytest
from bson import Int64, ObjectId, Timestamp
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.database import Database

from mongocdc_devstack import changestream
from mongocdc_devstack.fixture import EmulatedReplicaSet

pytestmark = pytest.mark.fault


def _drain(cursor: changestream.ChangeStreamCursor) -> list[bytes]:
    out: list[bytes] = []
    while batch := cursor.next_batch(7, 0):
        out.extend(batch)
    return out


def _open(emulator: EmulatedReplicaSet, db: str, coll: str | None, spec: dict[str, Any], raw: bool) -> changestream.ChangeStreamCursor:
    assert emulator.server is not None
    cursor = changestream.open_change_stream(emulator.server.state, db, coll, [{"$changeStream": spec}], {})
    cursor._raw_events = raw  # the switch between the two encodings under comparison
    return cursor


@pytest.fixture
def workload(emulator: EmulatedReplicaSet, mongo_client: MongoClient[Any]) -> Iterator[tuple[Database[Any], Timestamp]]:
    """Every CRUD event shape: many _id types, nested/dotted/array updates, replaces, deletes, a transaction."""
    db = mongo_client[f"raw_events_{uuid.uuid4().hex[:8]}"]
    db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
    db.create_collection("plain")
    start = mongo_client.admin.command("ping")["operationTime"]
    ids: list[Any] = [1, 2**31 + 5, -3, 0, Int64(7), 2.5, "s", "nul\x00in", "", ObjectId(), {"a": 1, "b": "x"},
                      101, uuid.UUID(int=9), datetime.datetime(2024, 1, 2, 3, 4, 5)]  # fmt: skip
    coll: Collection[Any] = db.get_collection("c", codec_options=bson.CodecOptions(uuid_representation=4))
    for i, _id in enumerate(ids):
        coll.insert_one({"_id": _id, "n": i, "sub": {"x": i, "arr": [1, 2, 3], "ns": None}, "ns": None,
                         "when": datetime.datetime(2024, 5, 1)})  # fmt: skip
    for _id in ids:
        coll.update_one({"_id": _id}, {"$set": {"n": -1, "sub.x": "y", "sub.arr.1": 9, "new.deep": 1}})
        coll.update_one({"_id": _id}, {"$unset": {"when": ""}, "$push": {"sub.arr": 4}})
        coll.update_one({"_id": _id}, {"$set": {"sub.arr": [7]}, "$inc": {"n": 2}})
    coll.update_one({"_id": 1}, {"$set": {"a.b": 1}})  # a missing parent: an insert section
    coll.update_one({"_id": 1}, {"$set": {"dot": {"x.y": 1}}})
    coll.update_one({"_id": 2**31 + 5}, {"$set": {"ns": None, "sub.ns": 1}})  # "ns" elements inside the event
    coll.replace_one({"_id": "s"}, {"replaced": True})
    coll.delete_one({"_id": 0})
    db.plain.insert_many([{"_id": i, "v": i} for i in range(5)])
    db.plain.update_many({}, {"$set": {"v": 0}})
    with mongo_client.start_session() as session, session.start_transaction():
        coll.insert_one({"_id": "txn-1"}, session=session)
        coll.update_one({"_id": 1}, {"$set": {"t": 1}}, session=session)
        db.plain.delete_one({"_id": 3}, session=session)
        coll.replace_one({"_id": "txn-1"}, {"r": 1}, session=session)
    db.plain.drop()
    try:
        yield db, start
    finally:
        mongo_client.drop_database(db.name)


SPECS = [
    {},
    {"showExpandedEvents": True},
    {"fullDocument": "updateLookup"},
    {"fullDocument": "whenAvailable", "fullDocumentBeforeChange": "whenAvailable"},
    {"fullDocument": "required", "fullDocumentBeforeChange": "required", "showExpandedEvents": True},
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("scope", ["collection", "database"])
def test_raw_encoding_equals_document_encoding(
    emulator: EmulatedReplicaSet, workload: tuple[Database[Any], Timestamp], spec: dict[str, Any], scope: str
) -> None:
    db, start = workload
    if scope == "database" and spec.get("fullDocument") == "required":
        spec = {**spec, "fullDocument": "whenAvailable", "fullDocumentBeforeChange": "whenAvailable"}
    coll = "c" if scope == "collection" else None
    full = {**spec, "startAtOperationTime": start}
    raw = _drain(_open(emulator, db.name, coll, full, raw=True))
    documents = _drain(_open(emulator, db.name, coll, full, raw=False))
    assert len(raw) > 60
    assert raw == documents
    # Resuming in the middle (the resume filter runs before encoding) gives the same tail.
    token = bson.decode(raw[len(raw) // 2])["_id"]
    resumed = {**spec, "resumeAfter": token}
    assert _drain(_open(emulator, db.name, coll, resumed, raw=True)) == raw[len(raw) // 2 + 1 :]
    assert _drain(_open(emulator, db.name, coll, resumed, raw=False)) == raw[len(raw) // 2 + 1 :]


def test_required_pre_image_error_is_the_same(emulator: EmulatedReplicaSet, mongo_client: MongoClient[Any]) -> None:
    db = mongo_client[f"raw_events_{uuid.uuid4().hex[:8]}"]
    try:
        start = mongo_client.admin.command("ping")["operationTime"]
        db.plain.insert_one({"_id": 1})
        db.plain.update_one({"_id": 1}, {"$set": {"x": 1}})
        spec = {"fullDocumentBeforeChange": "required", "startAtOperationTime": start}
        errors = []
        for raw in (True, False):
            with pytest.raises(changestream.CommandError) as info:
                _drain(_open(emulator, db.name, "plain", spec, raw=raw))
            errors.append((info.value.code, info.value.errmsg))
        assert errors[0] == errors[1]
        assert errors[0][0] == 47 and "operationType: \"update\"" in errors[0][1]
    finally:
        mongo_client.drop_database(db.name)


# The connector's stages (mongocdc_core.source.stream.internal_pipeline): they only filter.
FILTER_STAGES: list[dict[str, Any]] = [
    {"$addFields": {"__ns": {"$concat": ["$ns.db", ".", "$ns.coll"]}}},
    {"$match": {"$or": [
        {"$and": [{"operationType": {"$in": ["insert", "update", "replace", "delete"]}},
                  {"ns.coll": {"$not": re.compile("^system\\.")}}, {"ns.db": {"$nin": ["admin", "config", "local"]}},
                  {"$or": [{"__ns": {"$regex": "^(?:raw_events_.*\\.c)$", "$options": "i"}}]}]},
        {"__ns": "elsewhere.signals", "operationType": {"$in": ["insert", "delete"]}},
    ]}},
    {"$project": {"__ns": 0}},
]  # fmt: skip


@pytest.mark.parametrize("spec", SPECS[:4])
def test_compiled_filter_stages_equal_the_pipeline(
    emulator: EmulatedReplicaSet, workload: tuple[Database[Any], Timestamp], spec: dict[str, Any]
) -> None:
    """Stages that only filter run as one predicate per cursor on the raw path; the events are the
    ones the general pipeline (documents, mongomock) gives, byte for byte."""
    db, start = workload
    assert emulator.server is not None
    pipeline = [{"$changeStream": {**spec, "startAtOperationTime": start}}, *FILTER_STAGES]
    compiled = changestream.open_change_stream(emulator.server.state, db.name, None, pipeline, {})
    assert compiled._filter is not None and compiled._raw_events
    general = changestream.open_change_stream(emulator.server.state, db.name, None, pipeline, {})
    general._filter, general.stages, general._raw_events = None, list(FILTER_STAGES), False
    fast, slow = _drain(compiled), _drain(general)
    assert len(fast) > 60 and fast == slow
    assert all(bson.decode(event)["ns"]["coll"] == "c" for event in fast)


def test_stages_that_change_events_are_not_compiled() -> None:
    assert changestream.compile_filter_stages([{"$match": {"fullDocument.x": 1}}]) is None
    assert changestream.compile_filter_stages([{"$addFields": {"k": {"$concat": ["$ns.db"]}}}]) is None  # kept
    assert changestream.compile_filter_stages([{"$project": {"ns": 1}}]) is None
    assert changestream.compile_filter_stages([{"$match": {"operationType": "insert"}}]) is not None
