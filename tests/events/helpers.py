"""Shared helpers: the seed's ``fulfillment``/``inventory.customers`` example, with a fixed clock."""

from __future__ import annotations

import datetime
from typing import Any

import orjson
from bson.binary import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position

NOW_NS = 1_558_965_515_240_142_879  # the create example's ts_ns
CLUSTER_TIME = Timestamp(1_558_965_508, 31)
POSITION = Position.from_timestamp(CLUSTER_TIME)
WALL_TIME = datetime.datetime(2019, 5, 27, 13, 58, 28, 123000)
LSID = {
    "id": Binary(bytes.fromhex("140ed81335e0417497f4ec66ce5947db"), 4),
    "uid": Binary(bytes.fromhex("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), 0),
}
DOC = {"_id": Int64(1004), "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"}
DOC_JSON = '{"_id": {"$numberLong": "1004"},"first_name": "Anne","last_name": "Kretchmar","email": "annek@noanswer.org"}'


def options(**overrides: Any) -> EventOptions:
    base: dict[str, Any] = {"topic_prefix": "fulfillment", "rs": "rs0", "now_ns": lambda: NOW_NS}
    base.update(overrides)
    return EventOptions(**base)


def change(op: str, **fields: Any) -> dict[str, Any]:
    """A raw change stream document in the shape of the 003 seed."""
    doc: dict[str, Any] = {
        "_id": {"_data": "82" + "00" * 20},
        "operationType": op,
        "clusterTime": CLUSTER_TIME,
        "wallTime": WALL_TIME,
        "ns": {"db": "inventory", "coll": "customers"},
        "documentKey": {"_id": DOC["_id"]},
    }
    doc.update(fields)
    return doc


def insert(doc: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    doc = DOC if doc is None else doc
    return change("insert", fullDocument=doc, documentKey={"_id": doc["_id"]}, **fields)


def update(**fields: Any) -> dict[str, Any]:
    base = {
        "updateDescription": {
            "updatedFields": {"first_name": "Anne Marie"},
            "removedFields": [],
            "truncatedArrays": [],
        },
        "fullDocument": {**DOC, "first_name": "Anne Marie"},
        "fullDocumentBeforeChange": {**DOC, "first_name": "unknown"},
    }
    base.update(fields)
    return change("update", **base)


def payload(record: Record) -> Any:
    assert record.value is not None
    doc = orjson.loads(record.value)
    return doc["payload"] if set(doc) == {"schema", "payload"} else doc


def schema(record: Record) -> Any:
    assert record.value is not None
    return orjson.loads(record.value)["schema"]


def converter(**overrides: Any) -> EventConverter:
    return EventConverter(options(**overrides))
