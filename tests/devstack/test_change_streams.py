"""Change streams through pymongo's ``watch()``, as a MongoDB 7.0 replica set produces them.

Everything here except the ``fault`` tests also runs against a real mongod
(``MONGOCDC_TEST_MONGODB_URI``), so the assertions are about mongod's behaviour only.
"""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from bson import Decimal128, Int64, Timestamp
from pymongo import MongoClient
from pymongo.change_stream import ChangeStream
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import OperationFailure

AWAIT_MS = 200


def next_event(stream: ChangeStream[Any], timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = stream.try_next()
        if event is not None:
            return dict(event)
    raise AssertionError("no change event within the timeout")


def events(stream: ChangeStream[Any], count: int) -> list[dict[str, Any]]:
    return [next_event(stream) for _ in range(count)]


def no_more_events(stream: ChangeStream[Any]) -> None:
    assert stream.try_next() is None


def token_time(token: dict[str, Any]) -> Timestamp:
    """Decode the clusterTime the way a tool written for real MongoDB does."""
    raw = bytes.fromhex(token["_data"])
    assert raw[0] == 130
    seconds, inc = struct.unpack(">II", raw[1:9])
    return Timestamp(seconds, inc)


@pytest.fixture
def coll(fresh_db: Database[Any]) -> Collection[Any]:
    fresh_db.create_collection("items")
    return fresh_db["items"]


@pytest.fixture
def image_coll(fresh_db: Database[Any]) -> Collection[Any]:
    fresh_db.create_collection("imaged", changeStreamPreAndPostImages={"enabled": True})
    return fresh_db["imaged"]


@pytest.fixture
def stream(coll: Collection[Any]) -> Iterator[ChangeStream[Any]]:
    with coll.watch(max_await_time_ms=AWAIT_MS) as opened:
        yield opened


# -- CRUD events ----------------------------------------------------------------------------------


def test_crud_events_fields_and_order(coll: Collection[Any], stream: ChangeStream[Any]) -> None:
    db = coll.database.name
    coll.insert_one({"_id": 1, "a": {"b": 1, "c": 1}, "arr": [1, 2], "n": 1, "gone": True})
    coll.update_one({"_id": 1}, {"$set": {"a.b": 2}, "$unset": {"gone": ""}, "$push": {"arr": 3}, "$inc": {"n": 1}})
    coll.replace_one({"_id": 1}, {"x": 1})
    coll.delete_one({"_id": 1})
    insert, update, replace, delete = events(stream, 4)

    assert list(insert) == ["_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns", "documentKey"]
    assert insert["operationType"] == "insert"
    assert insert["fullDocument"] == {"_id": 1, "a": {"b": 1, "c": 1}, "arr": [1, 2], "n": 1, "gone": True}
    assert insert["ns"] == {"db": db, "coll": "items"}
    assert insert["documentKey"] == {"_id": 1}
    assert isinstance(insert["clusterTime"], Timestamp)

    assert list(update) == ["_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey", "updateDescription"]
    desc = update["updateDescription"]
    assert list(desc) == ["updatedFields", "removedFields", "truncatedArrays"]
    assert desc["updatedFields"] == {"a.b": 2, "arr.2": 3, "n": 2}
    assert desc["removedFields"] == ["gone"]
    assert desc["truncatedArrays"] == []

    assert list(replace) == ["_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns", "documentKey"]
    assert replace["operationType"] == "replace" and replace["fullDocument"] == {"_id": 1, "x": 1}

    assert list(delete) == ["_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey"]
    assert delete["operationType"] == "delete" and delete["documentKey"] == {"_id": 1}

    times = [e["clusterTime"] for e in (insert, update, replace, delete)]
    assert times == sorted(times) and len(set(times)) == 4


def test_pipeline_update_truncates_arrays(coll: Collection[Any], stream: ChangeStream[Any]) -> None:
    coll.insert_one({"_id": 1, "arr": [1, 2, 3, 4], "note": "a document larger than its update's diff"})
    coll.update_one({"_id": 1}, [{"$set": {"arr": {"$slice": ["$arr", 2]}}}])
    _, update = events(stream, 2)
    assert update["updateDescription"]["truncatedArrays"] == [{"field": "arr", "newSize": 2}]
    assert update["updateDescription"]["updatedFields"] == {}


def test_pipeline_update_of_a_small_document_is_a_replace(coll: Collection[Any], stream: ChangeStream[Any]) -> None:
    """mongod logs a pipeline update as a replacement when the diff would be larger than the document."""
    coll.insert_one({"_id": 1, "arr": [1, 2, 3, 4]})
    coll.update_one({"_id": 1}, [{"$set": {"arr": {"$slice": ["$arr", 2]}}}])
    _, update = events(stream, 2)
    assert update["operationType"] == "replace" and update["fullDocument"] == {"_id": 1, "arr": [1, 2]}


def test_update_description_comes_from_the_update(coll: Collection[Any], stream: ChangeStream[Any]) -> None:
    """What the modifiers did, as mongod logs it, not a comparison of the documents."""
    coll.insert_one({"_id": 1, "a": {"b": 1, "c": 2}, "arr": [1, 2, 3], "n": 1})
    coll.update_one({"_id": 1}, {"$set": {"a": {"b": 1, "c": 3}}})  # a whole sub-document is that field
    coll.update_one({"_id": 1}, {"$pop": {"arr": 1}})  # the last element: the new array, not a truncation
    coll.update_one({"_id": 1}, {"$push": {"arr": 9}})  # appended by index
    coll.update_one({"_id": 1}, {"$rename": {"n": "m"}, "$unset": {"a.b": ""}})
    descriptions = [event["updateDescription"] for event in events(stream, 5)[1:]]
    assert descriptions[0] == {"updatedFields": {"a": {"b": 1, "c": 3}}, "removedFields": [], "truncatedArrays": []}
    assert descriptions[1] == {"updatedFields": {"arr": [1, 2]}, "removedFields": [], "truncatedArrays": []}
    assert descriptions[2] == {"updatedFields": {"arr.2": 9}, "removedFields": [], "truncatedArrays": []}
    assert descriptions[3]["updatedFields"] == {"m": 1} and sorted(descriptions[3]["removedFields"]) == ["a.b", "n"]


def test_disambiguated_paths_of_array_indexes(coll: Collection[Any]) -> None:
    coll.insert_one({"_id": 1, "a": [{"1": 1}]})
    with coll.watch(show_expanded_events=True, max_await_time_ms=AWAIT_MS) as opened:
        coll.update_one({"_id": 1}, {"$set": {"a.0.1": 2}})
        description = next_event(opened)["updateDescription"]
    assert description["updatedFields"] == {"a.0.1": 2}
    assert description["disambiguatedPaths"] == {"a.0.1": ["a", 0, "1"]}


def test_replacing_an_array_element(coll: Collection[Any], stream: ChangeStream[Any]) -> None:
    coll.insert_one({"_id": 1, "arr": [1, 2, 3]})
    coll.update_one({"_id": 1}, {"$set": {"arr.1": 20}})
    assert events(stream, 2)[1]["updateDescription"]["updatedFields"] == {"arr.1": 20}


# -- resume tokens --------------------------------------------------------------------------------


def test_resume_token_layout_and_order(coll: Collection[Any], stream: ChangeStream[Any]) -> None:
    coll.insert_many([{"_id": i} for i in range(5)])
    seen = events(stream, 5)
    for event in seen:
        assert token_time(event["_id"]) == event["clusterTime"]
        assert event["_id"]["_data"] == event["_id"]["_data"].upper()
    hexes = [e["_id"]["_data"] for e in seen]
    assert hexes == sorted(hexes)


def test_resume_after_start_after_and_start_at_operation_time(coll: Collection[Any], stream: ChangeStream[Any]) -> None:
    coll.insert_many([{"_id": i} for i in range(4)])
    seen = events(stream, 4)
    with coll.watch(resume_after=seen[1]["_id"], max_await_time_ms=AWAIT_MS) as resumed:
        assert [e["documentKey"]["_id"] for e in events(resumed, 2)] == [2, 3]
    with coll.watch(start_after=seen[2]["_id"], max_await_time_ms=AWAIT_MS) as resumed:
        assert next_event(resumed)["documentKey"]["_id"] == 3
    with coll.watch(start_at_operation_time=seen[1]["clusterTime"], max_await_time_ms=AWAIT_MS) as resumed:
        assert [e["documentKey"]["_id"] for e in events(resumed, 3)] == [1, 2, 3]


def test_post_batch_resume_token_advances_past_irrelevant_writes(
    fresh_db: Database[Any], coll: Collection[Any], stream: ChangeStream[Any]
) -> None:
    no_more_events(stream)
    before = stream.resume_token
    assert before is not None
    fresh_db["other"].insert_one({"_id": 1})
    deadline = time.monotonic() + 10
    while stream.resume_token == before and time.monotonic() < deadline:
        no_more_events(stream)
    after = stream.resume_token
    assert after is not None and after["_data"] > before["_data"]
    coll.insert_one({"_id": 1})
    event = next_event(stream)
    assert event["_id"]["_data"] > after["_data"]
    with coll.watch(resume_after=after, max_await_time_ms=AWAIT_MS) as resumed:
        assert next_event(resumed)["_id"] == event["_id"]


@pytest.mark.fault
def test_post_batch_resume_token_advances_on_idle_stream(emulator: Any, stream: ChangeStream[Any]) -> None:
    """The emulator's periodic no-op entries (1 s in the tests) move the high-water mark."""
    no_more_events(stream)
    before = stream.resume_token
    assert before is not None
    deadline = time.monotonic() + 10
    while stream.resume_token == before and time.monotonic() < deadline:
        no_more_events(stream)
    assert stream.resume_token is not None and stream.resume_token["_data"] > before["_data"]


# -- DDL, invalidation and scopes -----------------------------------------------------------------


def test_drop_invalidates_collection_stream(coll: Collection[Any], stream: ChangeStream[Any]) -> None:
    coll.insert_one({"_id": 1})
    coll.drop()
    insert, drop, invalidate = events(stream, 3)
    assert drop["operationType"] == "drop" and drop["ns"] == {"db": coll.database.name, "coll": "items"}
    assert list(invalidate) == ["_id", "operationType", "clusterTime", "wallTime"]
    assert invalidate["operationType"] == "invalidate"
    assert invalidate["clusterTime"] == drop["clusterTime"]
    assert invalidate["_id"]["_data"] > drop["_id"]["_data"]
    assert not stream.alive

    with pytest.raises(OperationFailure) as info:
        coll.watch(resume_after=invalidate["_id"])
    assert info.value.code == 260

    coll.insert_one({"_id": 2})
    with coll.watch(start_after=invalidate["_id"], max_await_time_ms=AWAIT_MS) as restarted:
        event = next_event(restarted)
        assert event["operationType"] == "insert" and event["documentKey"] == {"_id": 2}


def test_rename_invalidates_collection_stream(coll: Collection[Any], stream: ChangeStream[Any]) -> None:
    db = coll.database.name
    coll.insert_one({"_id": 1})
    coll.rename("renamed")
    _, rename, invalidate = events(stream, 3)
    assert rename["operationType"] == "rename"
    assert rename["ns"] == {"db": db, "coll": "items"}
    assert rename["to"] == {"db": db, "coll": "renamed"}
    assert invalidate["operationType"] == "invalidate"


def test_database_stream(fresh_db: Database[Any]) -> None:
    fresh_db.create_collection("one")
    with fresh_db.watch(max_await_time_ms=AWAIT_MS) as stream:
        fresh_db["one"].insert_one({"_id": 1})
        fresh_db["two"].insert_one({"_id": 2})
        fresh_db.client.drop_database(fresh_db.name)
        got = events(stream, 6)
    kinds = [(e["operationType"], e.get("ns", {}).get("coll")) for e in got]
    assert kinds[:2] == [("insert", "one"), ("insert", "two")]
    assert sorted(kinds[2:4]) == [("drop", "one"), ("drop", "two")]
    assert kinds[4] == ("dropDatabase", None) and got[4]["ns"] == {"db": fresh_db.name}
    assert kinds[5] == ("invalidate", None) and "ns" not in got[5]


def test_cluster_stream_sees_every_database(mongo_client: MongoClient[Any], fresh_db: Database[Any]) -> None:
    with mongo_client.watch(max_await_time_ms=AWAIT_MS) as stream:
        fresh_db["a"].insert_one({"_id": 1})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            event = next_event(stream)
            if event["ns"].get("db") == fresh_db.name:
                break
        assert event["ns"] == {"db": fresh_db.name, "coll": "a"} and event["operationType"] == "insert"


def test_admin_database_stream_is_rejected(mongo_client: MongoClient[Any]) -> None:
    with pytest.raises(OperationFailure) as info:
        mongo_client.admin.watch()
    assert info.value.code == 73


def test_show_expanded_events(fresh_db: Database[Any]) -> None:
    with fresh_db.watch(show_expanded_events=True, max_await_time_ms=AWAIT_MS) as stream:
        fresh_db.create_collection("x")
        fresh_db["x"].create_index("k")
        fresh_db.command("collMod", "x", changeStreamPreAndPostImages={"enabled": True})
        fresh_db["x"].insert_one({"_id": 1})
        create, create_indexes, modify, insert = events(stream, 4)
    uuid = create["collectionUUID"]
    assert create["operationType"] == "create"
    assert list(create)[:4] == ["_id", "operationType", "clusterTime", "collectionUUID"]
    assert create["operationDescription"]["idIndex"]["key"] == {"_id": 1}
    assert create_indexes["operationType"] == "createIndexes"
    assert create_indexes["operationDescription"]["indexes"][0]["key"] == {"k": 1}
    assert modify["operationType"] == "modify"
    assert modify["operationDescription"]["changeStreamPreAndPostImages"] == {"enabled": True}
    assert insert["collectionUUID"] == uuid
    assert list(insert)[3] == "collectionUUID"


# -- full documents and images --------------------------------------------------------------------


def test_full_document_update_lookup(coll: Collection[Any]) -> None:
    with coll.watch(full_document="updateLookup", max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1, "v": 1})
        coll.update_one({"_id": 1}, {"$set": {"v": 2}})
        _, update = events(stream, 2)
    assert list(update)[-1] == "fullDocument"
    assert update["fullDocument"] == {"_id": 1, "v": 2}


def test_images_when_available_and_required(image_coll: Collection[Any]) -> None:
    image_coll.insert_one({"_id": 1, "v": 1})
    with image_coll.watch(
        full_document="required", full_document_before_change="required", max_await_time_ms=AWAIT_MS
    ) as stream:
        image_coll.update_one({"_id": 1}, {"$set": {"v": 2}})
        image_coll.replace_one({"_id": 1}, {"v": 3})
        image_coll.delete_one({"_id": 1})
        update, replace, delete = events(stream, 3)
    assert list(update)[-2:] == ["fullDocumentBeforeChange", "fullDocument"]
    assert update["fullDocumentBeforeChange"] == {"_id": 1, "v": 1}
    assert update["fullDocument"] == {"_id": 1, "v": 2}
    assert replace["fullDocumentBeforeChange"] == {"_id": 1, "v": 2} and replace["fullDocument"] == {"_id": 1, "v": 3}
    assert delete["fullDocumentBeforeChange"] == {"_id": 1, "v": 3} and "fullDocument" not in delete


def test_images_missing_when_not_enabled(coll: Collection[Any]) -> None:
    coll.insert_one({"_id": 1, "v": 1})
    with coll.watch(
        full_document="whenAvailable", full_document_before_change="whenAvailable", max_await_time_ms=AWAIT_MS
    ) as stream:
        coll.update_one({"_id": 1}, {"$set": {"v": 2}})
        update = next_event(stream)
    assert update["fullDocumentBeforeChange"] is None and update["fullDocument"] is None

    with coll.watch(full_document_before_change="required", max_await_time_ms=AWAIT_MS) as stream:
        coll.update_one({"_id": 1}, {"$set": {"v": 3}})
        with pytest.raises(OperationFailure) as info:
            next_event(stream)
    assert info.value.code == 47  # NoMatchingDocument


# -- transactions ---------------------------------------------------------------------------------


def test_transaction_events(mongo_client: MongoClient[Any], coll: Collection[Any], stream: ChangeStream[Any]) -> None:
    with mongo_client.start_session() as session:
        with session.start_transaction():
            coll.insert_one({"_id": 1}, session=session)
            coll.insert_one({"_id": 2}, session=session)
            coll.update_one({"_id": 1}, {"$set": {"v": 1}}, session=session)
        lsid = session.session_id
    got = events(stream, 3)
    assert [e["operationType"] for e in got] == ["insert", "insert", "update"]
    assert len({e["clusterTime"] for e in got}) == 1
    for event in got:
        assert list(event)[:3] == ["txnNumber", "lsid", "_id"]  # mongod adds them before the token
        assert uuid.UUID(bytes=bytes(lsid["id"])) == event["lsid"]["id"]
        assert isinstance(event["txnNumber"], int) and event["txnNumber"] >= 1
    assert got[0]["txnNumber"] == got[2]["txnNumber"]
    hexes = [e["_id"]["_data"] for e in got]
    assert hexes == sorted(hexes) and len(set(hexes)) == 3
    with coll.watch(resume_after=got[0]["_id"], max_await_time_ms=AWAIT_MS) as resumed:
        assert [e["_id"] for e in events(resumed, 2)] == [got[1]["_id"], got[2]["_id"]]


# -- user stages ----------------------------------------------------------------------------------


def test_user_match_and_project_stages(coll: Collection[Any]) -> None:
    pipeline: list[dict[str, Any]] = [
        {"$match": {"operationType": "insert", "fullDocument.keep": True}},
        {"$project": {"fullDocument.keep": 1, "operationType": 1}},
        {"$addFields": {"tag": "x"}},
    ]
    with coll.watch(pipeline, max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1, "keep": False})
        coll.insert_one({"_id": 2, "keep": True, "other": 1})
        coll.delete_one({"_id": 2})
        event = next_event(stream)
        no_more_events(stream)
    assert event["operationType"] == "insert"
    assert event["fullDocument"] == {"keep": True}
    assert event["tag"] == "x"


def test_modifying_the_resume_token_is_fatal(coll: Collection[Any]) -> None:
    with coll.watch([{"$project": {"_id": 0}}], max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1})
        with pytest.raises(OperationFailure) as info:
            next_event(stream)
    assert info.value.code == 280


# -- large events ---------------------------------------------------------------------------------


def _big(n: int) -> str:
    return "x" * (n * 1024 * 1024)


def test_split_large_event(image_coll: Collection[Any]) -> None:
    image_coll.insert_one({"_id": 1, "blob": _big(9)})
    options: dict[str, Any] = {"full_document_before_change": "required", "max_await_time_ms": AWAIT_MS}
    with image_coll.watch([{"$changeStreamSplitLargeEvent": {}}], **options) as stream:
        image_coll.replace_one({"_id": 1}, {"blob": _big(9).replace("x", "y")})
        first, second = events(stream, 2)
    assert first["splitEvent"] == {"fragment": 1, "of": 2}
    assert second["splitEvent"] == {"fragment": 2, "of": 2}
    assert list(first)[:2] == ["_id", "splitEvent"]
    assert first["_id"]["_data"] < second["_id"]["_data"]
    merged = {k: v for part in (first, second) for k, v in part.items() if k not in ("_id", "splitEvent")}
    assert merged["operationType"] == "replace"
    assert merged["fullDocument"]["blob"][0] == "y" and merged["fullDocumentBeforeChange"]["blob"][0] == "x"

    with image_coll.watch([{"$changeStreamSplitLargeEvent": {}}], resume_after=first["_id"], **options) as resumed:
        assert next_event(resumed)["_id"] == second["_id"]

    with image_coll.watch(**options) as unsplit:
        image_coll.replace_one({"_id": 1}, {"blob": _big(9)})
        with pytest.raises(OperationFailure) as info:
            next_event(unsplit)
    assert info.value.code == 10334
    assert "BSONObj size" in str(info.value)


# -- errors and resumability ----------------------------------------------------------------------


def test_start_at_operation_time_before_the_oplog_is_history_lost(coll: Collection[Any]) -> None:
    with pytest.raises(OperationFailure) as info:
        coll.watch(start_at_operation_time=Timestamp(1, 1))
    assert info.value.code == 286
    assert info.value.has_error_label("NonResumableChangeStreamError")


def test_garbage_resume_tokens_are_rejected(coll: Collection[Any]) -> None:
    for token in ({"_data": "not hex"}, {"_data": "DEADBEEF"}, {"_data": 5}):
        with pytest.raises(OperationFailure):
            coll.watch(resume_after=token)


def test_token_not_found_is_fatal(coll: Collection[Any], stream: ChangeStream[Any]) -> None:
    coll.insert_one({"_id": 1})
    real = next_event(stream)["_id"]["_data"]
    # Same clusterTime, collection and operation, but a documentKey that never existed.
    forged = real.replace("461E5F6964002B02000004", "461E5F6964002B7E000004")
    assert forged != real
    with coll.watch(resume_after={"_data": forged}, max_await_time_ms=AWAIT_MS) as resumed:
        coll.insert_one({"_id": 2})
        with pytest.raises(OperationFailure) as info:
            next_event(resumed)
    assert info.value.code == 280
    assert "resume token was not found" in str(info.value)


@pytest.mark.fault
def test_truncated_oplog_is_history_lost(emulator: Any, mongo_client: MongoClient[Any], coll: Collection[Any]) -> None:
    coll.insert_one({"_id": 1})
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 2})
        token = next_event(stream)["_id"]
    coll.insert_one({"_id": 3})
    now = mongo_client.admin.command("ping")["operationTime"]
    mongo_client.admin.command("mongocdcTruncateOplog", 1, before=now)
    with pytest.raises(OperationFailure) as info:
        coll.watch(resume_after=token)
    assert info.value.code == 286
    assert info.value.details is not None
    assert "no longer be in the oplog" in info.value.details["errmsg"]


@pytest.mark.fault
def test_pymongo_resumes_after_not_primary_but_not_after_history_loss(
    emulator: Any, mongo_client: MongoClient[Any], coll: Collection[Any]
) -> None:
    with coll.watch(max_await_time_ms=AWAIT_MS) as stream:
        coll.insert_one({"_id": 1})
        assert next_event(stream)["documentKey"] == {"_id": 1}
        mongo_client.admin.command(
            "configureFailPoint", "failCommand", mode={"times": 1},
            data={"failCommands": ["getMore"], "errorCode": 10107},
        )
        coll.insert_one({"_id": 2})
        assert next_event(stream)["documentKey"] == {"_id": 2}  # resumed transparently
        mongo_client.admin.command(
            "configureFailPoint", "failCommand", mode={"times": 1},
            data={"failCommands": ["getMore"], "errorCode": 286},
        )
        coll.insert_one({"_id": 3})
        with pytest.raises(OperationFailure) as info:
            next_event(stream)
    assert info.value.code == 286


def test_resume_after_a_token_with_type_bits(coll: Collection[Any]) -> None:
    """An Int64 ``_id`` puts ``_typeBits`` (BinData subtype 0) in the token; resuming with it works."""
    with coll.watch(max_await_time_ms=AWAIT_MS) as opened:
        coll.insert_one({"_id": Int64(5)})
        coll.insert_one({"_id": 6})
        first = next_event(opened)
    assert "_typeBits" in first["_id"]
    with coll.watch(resume_after=first["_id"], max_await_time_ms=AWAIT_MS) as resumed:
        assert next_event(resumed)["documentKey"] == {"_id": 6}


def test_decimal_ids_stream_and_resume(coll: Collection[Any]) -> None:
    """A Decimal128 ``_id`` is encoded into the resume token (mongod does; issue 11's getMore failed)."""
    ids = [Decimal128("1.5"), Decimal128("3.14159265358979323846264338327950"), Decimal128("-0.1"), Decimal128("0E-3")]
    with coll.watch(max_await_time_ms=AWAIT_MS) as opened:
        for value in ids:
            coll.insert_one({"_id": value})
        seen = events(opened, len(ids))
    assert [event["documentKey"]["_id"] for event in seen] == ids
    assert all("_typeBits" in event["_id"] for event in seen)
    with coll.watch(resume_after=seen[1]["_id"], max_await_time_ms=AWAIT_MS) as resumed:
        assert [event["documentKey"]["_id"] for event in events(resumed, 2)] == ids[2:]
