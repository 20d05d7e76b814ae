"""Change stream documents to Debezium records, checked against the examples of the 000 seed."""

from __future__ import annotations

import datetime
from typing import Any

import orjson
import pytest
from bson import encode, json_util
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions
from bson.datetime_ms import DatetimeMS
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.options import EventOptions
from mongocdc_core.positions import Position

from .helpers import (
    DOC,
    DOC_JSON,
    LSID,
    NOW_NS,
    POSITION,
    change,
    converter,
    insert,
    options,
    payload,
    schema,
    update,
)
from .strategies import documents, id_values, normalized, same_bson

SEED_SOURCE = {
    "connector": "mongodb",
    "name": "fulfillment",
    "ts_ms": 1558965508000,
    "ts_us": 1558965508000000,
    "ts_ns": 1558965508000000000,
    "snapshot": "false",
    "db": "inventory",
    "rs": "rs0",
    "collection": "customers",
    "ord": 31,
}
BEFORE_JSON = DOC_JSON.replace('"Anne"', '"unknown"')
AFTER_JSON = DOC_JSON.replace('"Anne"', '"Anne Marie"')


def test_key_record_matches_seed_example_exactly() -> None:
    (record,) = converter().convert_change(insert({**DOC, "_id": 1004}), POSITION)
    assert record.key == (
        b'{"schema":{"type":"struct","fields":[{"type":"string","optional":false,"field":"id"}],'
        b'"optional":false,"name":"fulfillment.inventory.customers.Key"},"payload":{"id":"1004"}}'
    )


@pytest.mark.parametrize(
    ("doc_id", "expected"),
    [
        (1234, "1234"),
        (12.34, "12.34"),
        ("1234", '"1234"'),
        ({"hi": "kafka", "nums": [10.0, 100.0, 1000.0]}, '{"hi" : "kafka", "nums" : [10.0, 100.0, 1000.0]}'),
        (ObjectId("596e275826f08b2730779e1f"), '{"$oid" : "596e275826f08b2730779e1f"}'),
        (b"kafka", '{"$binary" : "a2Fma2E=", "$type" : "00"}'),
    ],
)
def test_key_table_rows_in_records(doc_id: Any, expected: str) -> None:
    (record,) = converter(schemas_enable=False).convert_change(insert({"_id": doc_id}), POSITION)
    assert record.key is not None
    assert orjson.loads(record.key) == {"id": expected}


def test_create_event() -> None:
    (record,) = converter().convert_change(insert(), POSITION)
    assert (record.topic, record.collection, record.op, record.position) == (
        "fulfillment.inventory.customers",
        "inventory.customers",
        "c",
        POSITION,
    )
    p = payload(record)
    assert p["after"] == DOC_JSON
    assert p["before"] is None and p["updateDescription"] is None and p["transaction"] is None
    assert (p["op"], p["ts_ms"], p["ts_us"], p["ts_ns"]) == ("c", 1558965515240, 1558965515240142, NOW_NS)
    assert {k: p["source"][k] for k in SEED_SOURCE} == SEED_SOURCE
    assert p["source"]["wallTime"] == 1558965508123
    assert p["source"]["lsid"] is None and p["source"]["txnNumber"] is None


@pytest.mark.parametrize(
    ("mode", "has_before", "has_after"),
    [
        ("change_streams", False, False),
        ("change_streams_update_full", False, True),
        ("change_streams_with_pre_image", True, False),
        ("change_streams_update_full_with_pre_image", True, True),
    ],
)
def test_update_event_in_each_capture_mode(mode: str, has_before: bool, has_after: bool) -> None:
    (record,) = converter(capture_mode=mode).convert_change(update(lsid=LSID, txnNumber=Int64(1)), POSITION)
    p = payload(record)
    assert p["op"] == "u"
    assert p["before"] == (BEFORE_JSON if has_before else None)
    assert p["after"] == (AFTER_JSON if has_after else None)
    assert p["updateDescription"] == {
        "removedFields": None,
        "updatedFields": '{"first_name": "Anne Marie"}',
        "truncatedArrays": None,
    }
    # The seed's update example: lsid as strict JSON text and the transaction number.
    assert p["source"]["lsid"] == (
        '{"id": {"$binary": "FA7YEzXgQXSX9OxmzllH2w==","$type": "04"},'
        '"uid": {"$binary": "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=","$type": "00"}}'
    )
    assert p["source"]["txnNumber"] == 1
    assert (p["source"]["h"], p["source"]["tord"], p["source"]["stxnid"]) == (None, None, None)


def test_update_with_removed_fields_and_truncated_arrays() -> None:
    desc = {
        "updatedFields": {"email": "alice@10gen.com"},
        "removedFields": ["phoneNumber"],
        "truncatedArrays": [{"field": "vacation_time", "newSize": 36}],
    }
    (record,) = converter().convert_change(update(updateDescription=desc), POSITION)
    assert payload(record)["updateDescription"] == {
        "removedFields": ["phoneNumber"],
        "updatedFields": '{"email": "alice@10gen.com"}',
        "truncatedArrays": [{"field": "vacation_time", "size": 36}],
    }


def test_update_full_without_looked_up_document_has_null_after() -> None:
    (record,) = converter().convert_change(update(fullDocument=None), POSITION)
    assert payload(record)["after"] is None


@pytest.mark.parametrize("mode", ["change_streams", "change_streams_with_pre_image"])
def test_replace_is_an_update_with_the_new_document(mode: str) -> None:
    doc = {**DOC, "first_name": "Anne Marie"}
    ch = change("replace", fullDocument=doc, fullDocumentBeforeChange={**DOC, "first_name": "unknown"})
    (record,) = converter(capture_mode=mode).convert_change(ch, POSITION)
    p = payload(record)
    assert (p["op"], p["after"], p["updateDescription"]) == ("u", AFTER_JSON, None)
    assert p["before"] == (BEFORE_JSON if "pre_image" in mode else None)


@pytest.mark.parametrize("mode", ["change_streams_update_full", "change_streams_update_full_with_pre_image"])
def test_delete_is_followed_by_a_tombstone(mode: str) -> None:
    ch = change("delete", fullDocumentBeforeChange={**DOC, "first_name": "Anne Marie"})
    delete, tombstone = converter(capture_mode=mode).convert_change(ch, POSITION)
    p = payload(delete)
    assert (delete.op, p["op"], p["after"], p["updateDescription"]) == ("d", "d", None, None)
    assert p["before"] == (AFTER_JSON if "pre_image" in mode else None)
    assert (tombstone.topic, tombstone.key, tombstone.value) == (delete.topic, delete.key, None)
    assert (tombstone.position, tombstone.collection, tombstone.op) == (POSITION, "inventory.customers", None)


def test_no_tombstone_when_disabled() -> None:
    records = converter(tombstones_on_delete=False).convert_change(change("delete"), POSITION)
    assert [r.op for r in records] == ["d"]


@pytest.mark.parametrize(
    ("skipped", "kept"),
    [
        (frozenset({"c"}), ["u", "u", "d", None]),
        (frozenset({"u"}), ["c", "d", None]),
        (frozenset({"d"}), ["c", "u", "u"]),
        (frozenset({"t"}), ["c", "u", "u", "d", None]),
        (frozenset({"none"}), ["c", "u", "u", "d", None]),
        (frozenset({"c", "u", "d"}), []),
    ],
)
def test_skipped_operations(skipped: frozenset[str], kept: list[str | None]) -> None:
    conv = converter(skipped_operations=skipped)
    events = [insert(), update(), change("replace", fullDocument=DOC), change("delete")]
    assert [r.op for ev in events for r in conv.convert_change(ev, POSITION)] == kept


@pytest.mark.parametrize("op_type", ["drop", "rename", "dropDatabase", "invalidate", "createIndexes"])
def test_non_data_events_yield_nothing(op_type: str) -> None:
    assert converter().convert_change({"operationType": op_type, "ns": {"db": "inventory"}}, POSITION) == []


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"ns": {"db": "a", "coll": "b"}}, "no string 'operationType'"),
        ({"operationType": "insert", "ns": {"db": "a"}}, "no 'ns.db'/'ns.coll'"),
        ({"operationType": "delete", "ns": {"db": "a", "coll": "b"}}, "no 'documentKey._id'"),
        (
            {"operationType": "insert", "ns": {"db": "a", "coll": "b"}, "documentKey": {"_id": 1}},
            "no 'fullDocument'",
        ),
        (
            {"operationType": "update", "ns": {"db": "a", "coll": "b"}, "documentKey": {"_id": 1}},
            "updateDescription",
        ),
        *[
            (
                {"operationType": "update", "ns": {"db": "a", "coll": "b"}, "documentKey": {"_id": 1},
                 "updateDescription": {"updatedFields": {}, "removedFields": [], "truncatedArrays": [entry]}},
                "'truncatedArrays' entry without a string 'field' and an integer 'newSize'",
            )
            for entry in ({"field": "tags"}, {"field": "tags", "newSize": "2"}, {"newSize": 2}, "tags",
                          {"field": 3, "newSize": 2}, {"field": "tags", "newSize": True})
        ],
    ],
)
def test_malformed_change_events_are_named(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        converter().convert_change(doc, POSITION)


def test_bad_wall_time_is_named() -> None:
    with pytest.raises(ValueError, match="wallTime"):
        converter().convert_change(insert(wallTime="yesterday"), POSITION)


@pytest.mark.parametrize(
    "wall_time",
    [
        datetime.datetime(2019, 5, 27, 13, 58, 28, 123000),  # as bson.decode returns it
        datetime.datetime(2019, 5, 27, 15, 58, 28, 123000, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
        DatetimeMS(1558965508123),  # a codec that keeps out-of-range dates
    ],
)
def test_wall_time_in_each_form_a_decoder_gives_is_milliseconds(wall_time: object) -> None:
    assert payload(converter().convert_change(insert(wallTime=wall_time), POSITION)[0])["source"]["wallTime"] == 1558965508123


@pytest.mark.parametrize(
    "marker", ["true", "first", "first_in_data_collection", "last_in_data_collection", "last", "incremental"]
)
def test_snapshot_read(marker: str) -> None:
    pos = Position(1_700_000_000, 4)
    record = converter().convert_read(DOC, "inventory", "customers", pos, marker)
    p = payload(record)
    assert (record.op, record.position, record.collection) == ("r", pos, "inventory.customers")
    assert (p["op"], p["after"], p["before"], p["updateDescription"]) == ("r", DOC_JSON, None, None)
    assert (p["source"]["snapshot"], p["source"]["ord"], p["source"]["ts_ms"]) == (
        marker,
        4,
        1_700_000_000_000,
    )
    assert p["source"]["wallTime"] is None


def test_snapshot_read_time_and_errors() -> None:
    conv = converter()
    ts = datetime.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)
    p = payload(conv.convert_read(DOC, "inventory", "customers", POSITION, "true", ts))
    assert (p["source"]["ts_ms"], p["source"]["ts_us"]) == (1704164645678, 1704164645678901)
    with pytest.raises(ValueError, match="snapshot marker"):
        conv.convert_read(DOC, "inventory", "customers", POSITION, "false")
    with pytest.raises(ValueError, match="has no '_id'"):
        conv.convert_read({"x": 1}, "inventory", "customers", POSITION, "true")


def test_heartbeat_record() -> None:
    conv = converter()
    record = conv.heartbeat_record(POSITION, 1_700_000_000_123)
    assert (record.topic, record.collection, record.op, record.position) == (
        "__debezium-heartbeat.fulfillment",
        None,
        None,
        POSITION,
    )
    assert record.key is not None and record.value is not None
    key, value = orjson.loads(record.key), orjson.loads(record.value)
    assert key["payload"] == {"serverName": "fulfillment"}
    assert key["schema"]["name"] == "io.debezium.connector.common.ServerNameKey"
    assert value["payload"] == {"ts_ms": 1_700_000_000_123}
    assert value["schema"]["name"] == "io.debezium.connector.common.Heartbeat"


def test_topics_follow_prefix_and_delimiter() -> None:
    conv = converter(topic_delimiter="_", topic_heartbeat_prefix="hb")
    assert conv.topic_for("inventory", "customers") == "fulfillment_inventory_customers"
    assert conv.heartbeat_record(POSITION, 0).topic == "hb_fulfillment"
    assert conv.transaction_topic == "fulfillment_transaction"


def test_without_schemas_only_the_payload_is_written() -> None:
    (record,) = converter(schemas_enable=False).convert_change(insert(), POSITION)
    assert record.key == b'{"id":"{\\"$numberLong\\" : \\"1004\\"}"}'
    assert record.value is not None
    assert orjson.loads(record.value)["after"] == DOC_JSON


def test_value_schema_names_and_seed_field_definitions() -> None:
    (record,) = converter().convert_change(insert(), POSITION)
    s = schema(record)
    assert (s["type"], s["optional"], s["name"]) == (
        "struct",
        False,
        "fulfillment.inventory.customers.Envelope",
    )
    fields = {f["field"]: f for f in s["fields"]}
    assert fields["after"] == {
        "type": "string",
        "optional": True,
        "name": "io.debezium.data.Json",
        "version": 1,
        "field": "after",
    }
    assert fields["before"]["name"] == "io.debezium.data.Json"
    update_desc = {f["field"]: f for f in fields["updateDescription"]["fields"]}
    assert update_desc["updatedFields"]["name"] == "io.debezium.data.Json"
    source = fields["source"]
    assert (source["name"], source["optional"]) == ("io.debezium.connector.mongo.Source", False)
    types = {f["field"]: (f["type"], f["optional"]) for f in source["fields"]}
    for name, expected in {
        "version": ("string", False),
        "connector": ("string", False),
        "name": ("string", False),
        "ts_ms": ("int64", False),
        "ts_us": ("int64", False),
        "ts_ns": ("int64", False),
        "db": ("string", False),
        "rs": ("string", False),
        "collection": ("string", False),
        "ord": ("int32", False),
        "h": ("int64", True),
    }.items():
        assert types[name] == expected
    for name in ("op", "ts_ms", "ts_us", "ts_ns"):
        assert (fields[name]["type"], fields[name]["optional"]) == (
            "string" if name == "op" else "int64",
            True,
        )


def _assert_payload_follows_schema(s: dict[str, Any], p: Any) -> None:
    """JsonConverter writes every struct field, in schema order; recurse into nested structs."""
    assert list(p) == [f["field"] for f in s["fields"]]
    for f in s["fields"]:
        if f["type"] == "struct" and p[f["field"]] is not None:
            _assert_payload_follows_schema(f, p[f["field"]])


@pytest.mark.parametrize("event_format", ["change_streams", "oplog_1x"])
def test_every_payload_follows_its_schema(event_format: str) -> None:
    conv = converter(event_format=event_format, provide_transaction_metadata=True)
    events = [
        insert(lsid=LSID, txnNumber=Int64(2)),
        update(),
        change("replace", fullDocument=DOC),
        change("delete"),
    ]
    records = [r for ev in events for r in conv.convert_change(ev, POSITION)] + conv.flush()
    records.append(conv.convert_read(DOC, "inventory", "customers", POSITION, "last"))
    records.append(conv.heartbeat_record(POSITION, 5))
    for record in records:
        if record.value is not None:
            doc = orjson.loads(record.value)
            _assert_payload_follows_schema(doc["schema"], doc["payload"])
        assert record.key is not None
        key = orjson.loads(record.key)
        _assert_payload_follows_schema(key["schema"], key["payload"])


def test_schema_name_adjustment_for_avro() -> None:
    conv = converter(topic_prefix="my-server", schema_name_adjustment_mode="avro")
    (record,) = conv.convert_change(insert(ns={"db": "inv-1", "coll": "cust omers"}), POSITION)
    assert record.topic == "my-server.inv-1.cust_omers"  # sanitised like every topic (events/naming.py)
    assert schema(record)["name"] == "my_server.inv_1.cust_omers.Envelope"
    assert record.key is not None
    assert orjson.loads(record.key)["schema"]["name"] == "my_server.inv_1.cust_omers.Key"
    conv = converter(topic_prefix="my_srv", schema_name_adjustment_mode="avro_unicode")
    (record,) = conv.convert_change(insert(ns={"db": "1db", "coll": "c-1"}), POSITION)
    assert schema(record)["name"] == "my_u005fsrv._u0031db.c_u002d1.Envelope"


def test_schema_bytes_are_cached_per_collection() -> None:
    conv = converter()
    a = conv.convert_change(insert(), POSITION)[0]
    b = conv.convert_change(insert(ns={"db": "inventory", "coll": "orders"}), POSITION)[0]
    c = conv.convert_change(insert(), POSITION)[0]
    assert schema(a) == schema(c) and schema(a)["name"] != schema(b)["name"]
    assert conv._collection("inventory", "customers") is conv._collection("inventory", "customers")


def test_event_options_validation() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"capture_mode": "oplog"}, "capture.mode"),
        ({"schema_name_adjustment_mode": "x"}, "schema.name.adjustment.mode"),
        ({"field_name_adjustment_mode": "x"}, "field.name.adjustment.mode"),
        ({"event_format": "v1"}, "mongocdc.event.format"),
        ({"skipped_operations": frozenset({"x"})}, "skipped.operations"),
        ({"topic_prefix": ""}, "topic.prefix"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            options(**bad)


def test_event_options_from_config() -> None:
    from mongocdc_core.config import ConnectorConfig

    cfg = ConnectorConfig({
        "mongodb.connection.string": "mongodb://h/?replicaSet=rs0", "topic.prefix": "p",
        "topic.transaction": "tx", "topic.heartbeat.prefix": "hb", "capture.mode": "change_streams",
        "tombstones.on.delete": "false", "skipped.operations": "none", "field.exclude.list": "a.b.c",
        "field.renames": "a.b.c:d", "schema.name.adjustment.mode": "avro", "provide.transaction.metadata": "true",
        "mongocdc.event.format": "oplog_1x", "mongocdc.schemas.enable": "false",
    })
    opts = EventOptions.from_config(cfg, rs="rs9", now_ns=lambda: 7)
    assert opts == EventOptions(
        topic_prefix="p",
        topic_transaction="tx",
        topic_heartbeat_prefix="hb",
        capture_mode="change_streams",
        tombstones_on_delete=False,
        skipped_operations=frozenset(),
        field_exclude_list=("a.b.c",),
        field_renames=("a.b.c:d",),
        schema_name_adjustment_mode="avro",
        provide_transaction_metadata=True,
        event_format="oplog_1x",
        schemas_enable=False,
        rs="rs9",
    )
    assert opts.now_ns() == 7
    assert EventConverter(opts).convert_change(insert(), POSITION)[0].topic == "p.inventory.customers"


@settings(max_examples=150, deadline=None, phases=[Phase.generate])
@given(id_values, documents)
def test_generated_documents_round_trip_through_records(doc_id: Any, body: dict[str, Any]) -> None:
    original = normalized({"_id": doc_id, **body})
    conv = converter(schemas_enable=False)
    for record in (
        conv.convert_change(insert(original), POSITION)[0],
        conv.convert_read(original, "inventory", "customers", POSITION, "true"),
    ):
        assert record.key is not None
        assert same_bson(json_util.loads(orjson.loads(record.key)["id"]), original["_id"])
        assert same_bson(json_util.loads(payload(record)["after"]), original)


def test_raw_bson_change_documents_with_standard_uuids() -> None:
    """The stream may hand over RawBSONDocuments decoded with uuid_representation=STANDARD."""
    opts = CodecOptions(document_class=RawBSONDocument, uuid_representation=UuidRepresentation.STANDARD)
    ev = insert({**DOC, "session": LSID["id"]}, lsid=LSID, txnNumber=Int64(4))
    raw = RawBSONDocument(encode(ev, codec_options=opts), codec_options=opts)
    conv = converter(schemas_enable=False, provide_transaction_metadata=True)
    begin, record = conv.convert_change(raw, POSITION)
    expected = converter(schemas_enable=False, provide_transaction_metadata=True).convert_change(ev, POSITION)
    assert [begin, record] == expected
    assert '"session": {"$binary": "FA7YEzXgQXSX9OxmzllH2w==","$type": "04"}' in payload(record)["after"]


@settings(max_examples=100, deadline=None, phases=[Phase.generate])
@given(st.lists(documents, min_size=1, max_size=5), st.booleans(), st.booleans())
def test_a_chunk_of_reads_equals_its_reads_one_by_one(docs: list[dict[str, Any]], schemas: bool, renamed: bool) -> None:
    conv = converter(schemas_enable=schemas, field_renames=("inventory.customers.a:b",) if renamed else ())
    reads = [{**normalized(doc), "_id": i} for i, doc in enumerate(docs)]
    markers = ["first", *["true"] * (len(reads) - 2), "last"][-len(reads):] if len(reads) > 1 else ["last"]
    ts = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
    chunk = conv.convert_reads(reads, markers, "inventory", "customers", POSITION, ts)
    assert chunk == [conv.convert_read(doc, "inventory", "customers", POSITION, m, ts) for doc, m in zip(reads, markers, strict=True)]


def test_a_chunk_with_a_bad_read_fails_like_the_read() -> None:
    with pytest.raises(ValueError, match="has no '_id'"):
        converter().convert_reads([DOC, {"x": 1}], ["true", "true"], "inventory", "customers", POSITION)
    with pytest.raises(ValueError, match="snapshot marker"):
        converter().convert_reads([DOC, DOC], ["true", "false"], "inventory", "customers", POSITION)
