"""mongocdc.event.format=oplog_1x: the 1.x envelope of the 001 seed (after / patch / filter)."""

from __future__ import annotations

import orjson

from mongocdc_core.events.convert import EventConverter
from mongocdc_core.positions import Position

from .helpers import DOC, LSID, NOW_NS, POSITION, change, converter, insert, payload, schema, update

LEGACY_AFTER = '{"_id" : {"$numberLong" : "1004"},"first_name" : "Anne","last_name" : "Kretchmar","email" : "annek@noanswer.org"}'
LEGACY_FILTER = '{"_id" : {"$numberLong" : "1004"}}'
SOURCE_1X = {
    "connector": "mongodb",
    "name": "fulfillment",
    "ts_ms": 1558965508000,
    "snapshot": False,
    "db": "inventory",
    "rs": "rs0",
    "collection": "customers",
    "ord": 31,
    "h": None,
    "stxnid": None,
}


def legacy() -> EventConverter:
    return converter(event_format="oplog_1x")


def test_create_event_matches_1x_example() -> None:
    (record,) = legacy().convert_change(insert(), POSITION)
    p = payload(record)
    assert p["after"] == LEGACY_AFTER
    assert (p["patch"], p["filter"], p["op"], p["ts_ms"], p["transaction"]) == (
        None,
        None,
        "c",
        NOW_NS // 10**6,
        None,
    )
    assert {k: v for k, v in p["source"].items() if k != "version"} == SOURCE_1X


def test_update_event_has_patch_and_filter() -> None:
    (record,) = legacy().convert_change(update(), POSITION)
    p = payload(record)
    assert (p["op"], p["after"]) == ("u", None)
    assert p["patch"] == '{"$set":{"first_name":"Anne Marie"}}'
    assert p["filter"] == LEGACY_FILTER


def test_update_with_removed_fields_and_replace() -> None:
    desc = {"updatedFields": {}, "removedFields": ["phone"], "truncatedArrays": []}
    (record,) = legacy().convert_change(update(updateDescription=desc), POSITION)
    assert payload(record)["patch"] == '{"$unset":{"phone":true}}'
    (record,) = legacy().convert_change(change("replace", fullDocument={"_id": 1, "a": [1, 2]}), POSITION)
    assert payload(record)["patch"] == '{"_id":1,"a":[1,2]}'


def test_delete_event_has_filter_then_tombstone() -> None:
    delete, tombstone = legacy().convert_change(change("delete"), POSITION)
    p = payload(delete)
    assert (p["op"], p["after"], p["patch"], p["filter"]) == ("d", None, None, LEGACY_FILTER)
    assert tombstone.value is None


def test_read_is_an_after_with_snapshot_true() -> None:
    record = legacy().convert_read(DOC, "inventory", "customers", Position(1_558_965_508, 2), "last")
    p = payload(record)
    assert (p["op"], p["after"], p["source"]["snapshot"], p["source"]["ord"]) == ("r", LEGACY_AFTER, True, 2)


def test_transaction_events_carry_stxnid() -> None:
    (record,) = legacy().convert_change(insert(lsid=LSID, txnNumber=3), POSITION)
    assert payload(record)["source"]["stxnid"] == "140ed813-35e0-4174-97f4-ec66ce5947db:3"


def test_1x_schema_fields() -> None:
    (record,) = legacy().convert_change(insert(), POSITION)
    s = schema(record)
    assert [f["field"] for f in s["fields"]] == [
        "after",
        "patch",
        "filter",
        "source",
        "op",
        "ts_ms",
        "transaction",
    ]
    source = s["fields"][3]
    assert source["name"] == "io.debezium.connector.mongo.Source"
    snapshot = next(f for f in source["fields"] if f["field"] == "snapshot")
    assert snapshot == {"type": "boolean", "optional": True, "default": False, "field": "snapshot"}
    assert record.key is not None and orjson.loads(record.key)["payload"] == {
        "id": '{"$numberLong" : "1004"}'
    }
