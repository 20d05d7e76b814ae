"""provide.transaction.metadata: BEGIN/END records and the envelope's transaction block."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from bson.binary import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from mongocdc_core.events.records import Record
from mongocdc_core.events.transactions import transaction_id
from mongocdc_core.positions import Position

from .helpers import DOC, LSID, change, converter, insert, payload, update

TXN = "140ed813-35e0-4174-97f4-ec66ce5947db:7"
TS = Timestamp(1_700_000_000, 5)


def in_txn(event: dict[str, Any], txn_number: int = 7) -> dict[str, Any]:
    return {**event, "lsid": LSID, "txnNumber": Int64(txn_number), "clusterTime": TS}


def ns(coll: str) -> dict[str, str]:
    return {"db": "testDB", "coll": coll}


def kinds(records: list[Record]) -> list[str]:
    out = []
    for r in records:
        if r.topic == "fulfillment.transaction":
            out.append(payload(r)["status"])
        else:
            out.append(r.op or "tombstone")
    return out


def test_transaction_id_format() -> None:
    assert transaction_id(LSID, Int64(7)) == TXN
    assert transaction_id(None, None) is None
    assert transaction_id(LSID, None) is None
    assert transaction_id({"id": "session-x"}, 3) == '"session-x":3'
    with pytest.raises(ValueError, match="lsid"):
        transaction_id("bad", 1)


def test_begin_events_end_with_per_collection_counts() -> None:
    conv = converter(provide_transaction_metadata=True)
    events = [
        in_txn(insert({**DOC, "_id": 1}, ns=ns("collectiona"))),
        in_txn(insert({**DOC, "_id": 2}, ns=ns("collectionb"))),
        in_txn(change("delete", ns=ns("collectiona"), documentKey={"_id": 1})),
        insert({**DOC, "_id": 3}, ns=ns("collectiona")),
    ]
    records = [
        r for i, ev in enumerate(events) for r in conv.convert_change(ev, Position(TS.time, TS.inc, i))
    ]
    assert kinds(records) == ["BEGIN", "c", "c", "d", "tombstone", "END", "c"]
    begin, end = payload(records[0]), payload(records[5])
    assert begin == {
        "status": "BEGIN",
        "id": TXN,
        "event_count": None,
        "data_collections": None,
        "ts_ms": 1_700_000_000_000,
    }
    assert end == {
        "status": "END",
        "id": TXN,
        "event_count": 3,
        "data_collections": [
            {"data_collection": "rs0.testDB.collectiona", "event_count": 2},
            {"data_collection": "rs0.testDB.collectionb", "event_count": 1},
        ],
        "ts_ms": 1_700_000_000_000,
    }
    blocks = [payload(r)["transaction"] for r in records if r.op in ("c", "d")]
    assert blocks == [
        {"id": TXN, "total_order": 1, "data_collection_order": 1},
        {"id": TXN, "total_order": 2, "data_collection_order": 1},
        {"id": TXN, "total_order": 3, "data_collection_order": 2},
        None,
    ]
    assert records[0].position == Position(TS.time, TS.inc, 0)
    assert records[5].position == Position(TS.time, TS.inc, 2)
    for r in (records[0], records[5]):
        assert (r.collection, r.op) == (None, None)
        assert r.key is not None
        key = orjson.loads(r.key)
        assert key["payload"] == {"id": TXN}
        assert key["schema"]["name"] == "io.debezium.connector.common.TransactionMetadataKey"
        assert schema_name(r) == "io.debezium.connector.common.TransactionMetadataValue"


def schema_name(record: Record) -> str:
    assert record.value is not None
    return str(orjson.loads(record.value)["schema"]["name"])


def test_consecutive_transactions_and_flush() -> None:
    conv = converter(provide_transaction_metadata=True)
    first = conv.convert_change(in_txn(insert(), 1), Position(1, 1))
    second = conv.convert_change(in_txn(update(), 2), Position(1, 2))
    assert kinds(first) == ["BEGIN", "c"]
    assert kinds(second) == ["END", "BEGIN", "u"]
    assert payload(second[0])["id"].endswith(":1") and payload(second[1])["id"].endswith(":2")
    (end,) = conv.flush()
    assert payload(end)["id"].endswith(":2") and payload(end)["event_count"] == 1
    assert conv.flush() == []


def test_skipped_events_are_not_counted() -> None:
    conv = converter(provide_transaction_metadata=True, skipped_operations=frozenset({"u"}))
    records = conv.convert_change(in_txn(insert()), Position(1, 1)) + conv.convert_change(
        in_txn(update()), Position(1, 1, 1)
    )
    records += conv.flush()
    assert kinds(records) == ["BEGIN", "c", "END"]
    assert payload(records[-1])["event_count"] == 1


def test_disabled_metadata_leaves_block_null() -> None:
    conv = converter()
    records = conv.convert_change(in_txn(insert()), Position(1, 1))
    assert kinds(records) == ["c"] and payload(records[0])["transaction"] is None
    assert conv.flush() == []


def test_data_collection_without_replica_set_name() -> None:
    conv = converter(provide_transaction_metadata=True, rs="")
    conv.convert_change(in_txn(insert(ns=ns("a"))), Position(1, 1))
    (end,) = conv.flush()
    assert payload(end)["data_collections"] == [{"data_collection": "testDB.a", "event_count": 1}]


def test_lsid_uuid_stored_as_subtype_3_or_uuid() -> None:
    legacy = {"id": Binary(bytes.fromhex("140ed81335e0417497f4ec66ce5947db"), 3)}
    assert transaction_id(legacy, 7) == TXN
