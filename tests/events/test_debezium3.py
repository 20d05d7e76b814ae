"""mongocdc.event.format=debezium_3x: the bytes the released Debezium 3.4/3.6 MongoDB connector writes.

The expected strings below were copied from records the real connector wrote (tests/compat runs it
beside mongocdc on every kind of change); these tests pin the pieces without a JVM.
"""

from __future__ import annotations

import datetime
import math
import uuid
from typing import Any

import bson
import orjson
import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp

from mongocdc_core.config import ConfigError, ConnectorConfig
from mongocdc_core.events import javajson
from mongocdc_core.events.debezium3 import java_hash_map_order, key_id
from mongocdc_core.events.raw import RawChange, RawDocuments
from mongocdc_core.positions import Position
from tests.events.helpers import LSID, POSITION, WALL_TIME, change, converter, insert, payload, update
from tests.events.test_raw_reads import ENGINE_OPTIONS

#: The value schema Debezium 3.6.1 wrote for inventory.customers (schemas on).
ENVELOPE_SCHEMA = '{"type":"struct","fields":[{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"before"},{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"after"},{"type":"struct","fields":[{"type":"array","items":{"type":"string","optional":false},"optional":true,"field":"removedFields"},{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"updatedFields"},{"type":"array","items":{"type":"struct","fields":[{"type":"string","optional":false,"field":"field"},{"type":"int32","optional":false,"field":"size"}],"optional":false,"name":"io.debezium.connector.mongodb.changestream.truncatedarray","version":1},"optional":true,"field":"truncatedArrays"}],"optional":true,"name":"io.debezium.connector.mongodb.changestream.updatedescription","version":1,"field":"updateDescription"},{"type":"struct","fields":[{"type":"string","optional":false,"field":"version"},{"type":"string","optional":false,"field":"connector"},{"type":"string","optional":false,"field":"name"},{"type":"int64","optional":false,"field":"ts_ms"},{"type":"string","optional":true,"name":"io.debezium.data.Enum","version":1,"parameters":{"allowed":"true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},"default":"false","field":"snapshot"},{"type":"string","optional":false,"field":"db"},{"type":"string","optional":true,"field":"sequence"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"},{"type":"string","optional":false,"field":"collection"},{"type":"int32","optional":false,"field":"ord"},{"type":"string","optional":true,"field":"lsid"},{"type":"int64","optional":true,"field":"txnNumber"},{"type":"int64","optional":true,"field":"wallTime"}],"optional":false,"name":"io.debezium.connector.mongo.Source","version":1,"field":"source"},{"type":"string","optional":true,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"},{"type":"struct","fields":[{"type":"string","optional":false,"field":"id"},{"type":"int64","optional":false,"field":"total_order"},{"type":"int64","optional":false,"field":"data_collection_order"}],"optional":true,"name":"event.block","version":1,"field":"transaction"}],"optional":false,"name":"fulfillment.inventory.customers.Envelope"}'
LSID_JSON = (
    '{"id": {"$binary": "FA7YEzXgQXSX9OxmzllH2w==","$type": "04"},'
    '"uid": {"$binary": "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=","$type": "00"}}'
)
WALL_MS = 1558965508123


def d3(**overrides: Any) -> Any:
    return converter(event_format="debezium_3x", **overrides)


@pytest.mark.parametrize(
    ("doc_id", "expected"),
    [
        (1234, "1234"),
        (12.34, "12.34"),
        ("1234", '"1234"'),
        ({"hi": "kafka", "nums": [10.0, 100.0, 1000.0]}, '{"hi": "kafka","nums": [10.0,100.0,1000.0]}'),
        (ObjectId("596e275826f08b2730779e1f"), '{"$oid": "596e275826f08b2730779e1f"}'),
        (Binary(b"kafka", 0), '{"$binary": {"base64": "a2Fma2E=","subType": "00"}}'),
        (b"\x01\x02\x03", '{"$binary": {"base64": "AQID","subType": "00"}}'),
        (Binary(uuid.UUID("12345678-1234-5678-1234-567812345678").bytes, 4),
         '{"$binary": {"base64": "EjRWeBI0VngSNFZ4EjRWeA==","subType": "04"}}'),
        (uuid.UUID("12345678-1234-5678-1234-567812345678"),
         '{"$binary": {"base64": "EjRWeBI0VngSNFZ4EjRWeA==","subType": "04"}}'),
        (Int64(5), "5"),
        (datetime.datetime(2024, 1, 2, 3, 4, 5, 678000), '{"$date": "2024-01-02T03:04:05.678Z"}'),
        (datetime.datetime(2024, 1, 2, 3, 4, 5, 500000), '{"$date": "2024-01-02T03:04:05.5Z"}'),
        (datetime.datetime(2024, 1, 2, 3, 4), '{"$date": "2024-01-02T03:04:00Z"}'),
        (datetime.datetime(1969, 12, 31, 23, 59, 59), '{"$date": {"$numberLong": "-1000"}}'),
        (Decimal128("1.5"), '{"$numberDecimal": "1.5"}'),
        (True, "true"),
        (math.nan, '{"$numberDouble": "NaN"}'),
    ],
)
def test_key_ids_are_the_java_drivers_relaxed_json(doc_id: Any, expected: str) -> None:
    assert key_id(doc_id) == expected


def test_documents_are_the_java_drivers_strict_json_kept_valid() -> None:
    doc = {
        "_id": 1, "l": Int64(1 << 40), "d": 1.0e300, "f": 1.5, "dt": datetime.datetime(2024, 1, 2, 3, 4, 5, 678000),
        "arr": [1, 2, {"x": 1}], "s": "h\u00e9llo\u0001", "oid": ObjectId("5f0c5a4e6c3e0c5a4e6c3e0c"),
        "bin": Binary(b"abc", 0), "u": Binary(uuid.UUID("12345678-1234-5678-1234-567812345678").bytes, 4),
        "dec": Decimal128("1.5"), "re": Regex("^a", "i"), "ts": Timestamp(5, 6), "mn": MinKey(), "mx": MaxKey(),
        "code": Code("x=1"), "nul": None, "b": True, "sub": {"a": 1, "b": [1, 2]}, "nan": math.nan,
    }
    # Debezium wrote exactly this, except "nan": NaN (bare, invalid JSON).
    assert javajson.dumps(doc, javajson.STRICT_INDENTED).endswith('"nan": NaN}')
    record = d3().convert_read(doc, "inventory", "customers", POSITION, "true")
    assert payload(record)["after"] == (
        '{"_id": 1,"l": {"$numberLong": "1099511627776"},"d": 1.0E300,"f": 1.5,"dt": {"$date": 1704164645678},'
        '"arr": [1,2,{"x": 1}],"s": "h\u00e9llo\\u0001","oid": {"$oid": "5f0c5a4e6c3e0c5a4e6c3e0c"},'
        '"bin": {"$binary": "YWJj","$type": "00"},"u": {"$binary": "EjRWeBI0VngSNFZ4EjRWeA==","$type": "04"},'
        '"dec": {"$numberDecimal": "1.5"},"re": {"$regex": "^a","$options": "i"},"ts": {"$timestamp": {"t": 5,"i": 6}},'
        '"mn": {"$minKey": 1},"mx": {"$maxKey": 1},"code": {"$code": "x=1"},"nul": null,"b": true,'
        '"sub": {"a": 1,"b": [1,2]},"nan": {"$numberDouble": "NaN"}}'
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [(100.0, "100.0"), (1e7, "1.0E7"), (12345678.9, "1.23456789E7"), (0.001, "0.001"), (1e-4, "1.0E-4"),
     (-2.5e-300, "-2.5E-300"), (0.0, "0.0"), (-0.0, "-0.0"), (1e300, "1.0E300"), (123.456, "123.456"),
     (math.inf, "Infinity"), (-math.inf, "-Infinity")],
)
def test_doubles_are_spelled_like_java(value: float, text: str) -> None:
    assert javajson.java_double(value) == text


def test_strings_escape_what_the_java_writer_escapes() -> None:
    # Combining marks, modifier letters, format/control characters and surrogates are escaped (lowercase hex).
    text = "e\u0301 \u02b0 \u200b \u2028 \U0001f600 \ue000 \u007f \u0085 \u00e9 \u20ac /"
    assert javajson.java_string(text) == (
        '"e\\u0301 \\u02b0 \\u200b \\u2028 \\ud83d\\ude00 \\ue000 \\u007f \\u0085 \u00e9 \u20ac /"'
    )


def test_updated_fields_use_the_default_relaxed_writer() -> None:
    desc = {"updatedFields": {"l": Int64(7), "o": ObjectId("5f0c5a4e6c3e0c5a4e6c3e0c"), "lst": [Int64(1), 2.0, 3],
                              "nan": math.inf}, "removedFields": ["d"], "truncatedArrays": []}
    (record,) = d3().convert_change(update(updateDescription=desc), POSITION)
    assert payload(record)["updateDescription"] == {
        "removedFields": ["d"],
        "updatedFields": '{"l": 7, "o": {"$oid": "5f0c5a4e6c3e0c5a4e6c3e0c"}, "lst": [1, 2.0, 3], '
                         '"nan": {"$numberDouble": "Infinity"}}',
        "truncatedArrays": None,
    }
    removals = {"updatedFields": {}, "removedFields": [], "truncatedArrays": [{"field": "arr", "newSize": 4}]}
    (record,) = d3().convert_change(update(updateDescription=removals), POSITION)
    assert payload(record)["updateDescription"] == {
        "removedFields": None, "updatedFields": "{}", "truncatedArrays": [{"field": "arr", "size": 4}]
    }


def test_schema_and_source_block_of_3x() -> None:
    (record,) = d3().convert_change(insert(), POSITION)
    assert record.value is not None
    assert record.value.startswith(b'{"schema":' + ENVELOPE_SCHEMA.encode() + b',"payload":')
    body = payload(record)
    assert list(body) == ["before", "after", "updateDescription", "source", "op", "ts_ms", "transaction"]
    source = body["source"]
    assert list(source) == ["version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "ts_us",
                            "ts_ns", "collection", "ord", "lsid", "txnNumber", "wallTime"]
    assert (source["ts_ms"], source["ts_us"], source["ts_ns"]) == (WALL_MS, WALL_MS * 1000, WALL_MS * 1_000_000)
    assert (source["snapshot"], source["sequence"], source["ord"], source["wallTime"]) == ("false", None, 31, WALL_MS)
    assert record.key == (b'{"schema":{"type":"struct","fields":[{"type":"string","optional":false,"field":"id"}],'
                          b'"optional":false,"name":"fulfillment.inventory.customers.Key"},"payload":{"id":"1004"}}')


def test_without_wall_time_the_cluster_time_seconds() -> None:
    event = insert()
    del event["wallTime"]
    (record,) = d3(schemas_enable=False).convert_change(event, POSITION)
    source = payload(record)["source"]
    assert (source["ts_ms"], source["wallTime"]) == (POSITION.seconds * 1000, None)


def test_snapshot_reads_have_ord_minus_one_and_only_true_or_last() -> None:
    read_at = datetime.datetime(2024, 1, 1, 0, 0, 0, 123456)
    conv = d3(schemas_enable=False)
    markers = ["first", "true", "first_in_data_collection", "last_in_data_collection", "last"]
    sources = [payload(conv.convert_read({"_id": i}, "inventory", "customers", POSITION, m, read_at))["source"]
               for i, m in enumerate(markers)]
    assert [s["snapshot"] for s in sources] == ["true", "true", "true", "true", "last"]
    assert {(s["ord"], s["ts_us"], s["wallTime"]) for s in sources} == {(-1, 1704067200123456, None)}


def _txn(op: str, txn_number: int, **fields: Any) -> dict[str, Any]:
    return change(op, lsid=LSID, txnNumber=Int64(txn_number), **fields)


def test_transaction_metadata_as_debezium_writes_it() -> None:
    conv = d3(schemas_enable=False, provide_transaction_metadata=True)
    other = {"ns": {"db": "inventory", "coll": "orders"}}
    later = WALL_TIME + datetime.timedelta(milliseconds=5)
    records = [
        *conv.convert_change(_txn("insert", 3, fullDocument={"_id": 1}, documentKey={"_id": 1}), POSITION),
        *conv.convert_change(_txn("insert", 3, fullDocument={"_id": 2}, documentKey={"_id": 2}, **other), POSITION),
        *conv.convert_change(insert({"_id": 9}, wallTime=later), Position(POSITION.seconds, 32)),
    ]
    topics = [r.topic for r in records]
    assert topics == ["fulfillment.transaction", "fulfillment.inventory.customers", "fulfillment.inventory.orders",
                      "fulfillment.transaction", "fulfillment.inventory.customers"]
    txn_id = LSID_JSON + ":3"
    assert orjson.loads(records[0].key or b"") == {"id": txn_id}
    assert payload(records[0]) == {"status": "BEGIN", "id": txn_id, "event_count": None, "data_collections": None,
                                   "ts_ms": WALL_MS}
    assert payload(records[2])["transaction"] == {"id": txn_id, "total_order": 2, "data_collection_order": 1}
    assert payload(records[2])["source"]["lsid"] == LSID_JSON
    # END at the time of the event that followed; collections named db.coll, in Java HashMap order.
    assert payload(records[3]) == {
        "status": "END", "id": txn_id, "event_count": 2, "ts_ms": WALL_MS + 5,
        "data_collections": [{"data_collection": "inventory.customers", "event_count": 1},
                             {"data_collection": "inventory.orders", "event_count": 1}],
    }
    assert conv.flush() == []


def test_an_end_without_a_following_event_is_written_once() -> None:
    conv = d3(schemas_enable=False, provide_transaction_metadata=True)
    conv.convert_change(_txn("insert", 4, fullDocument={"_id": 1}, documentKey={"_id": 1}), POSITION)
    assert conv.end_transaction_before(POSITION.timestamp) == []  # the scan has not passed it
    (end,) = conv.end_transaction_before(Timestamp(POSITION.seconds, POSITION.increment + 1))
    assert (payload(end)["status"], payload(end)["ts_ms"]) == ("END", WALL_MS)
    assert conv.flush() == [] and conv.end_transaction_before(Timestamp(POSITION.seconds + 9, 0)) == []


def test_java_hash_map_order() -> None:
    """As ``new HashMap<>()`` iterates (printed by Java 17's ``keySet()``)."""
    assert java_hash_map_order(["explore2.a", "explore2.b"]) == ["explore2.b", "explore2.a"]
    assert java_hash_map_order(["δb.é", "db.😀", "a.b"]) == ["a.b", "δb.é", "db.😀"]
    names = [f"db.c{i}" for i in range(40)]  # past two resizes of the table
    assert java_hash_map_order(names) == [f"db.c{i}" for i in (
        9, 7, 8, 5, 6, 3, 4, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 1, 30, 2, 31, 10, 32, 0, 11, 33, 12, 34, 13,
        35, 14, 36, 15, 37, 16, 38, 17, 39, 18, 19)]


def test_the_format_is_a_value_of_mongocdc_event_format() -> None:
    base = {"mongodb.connection.string": "mongodb://h:1/?replicaSet=rs0", "topic.prefix": "p",
            "mongocdc.event.format": "debezium_3x"}
    assert ConnectorConfig.from_dict(base).mongocdc_event_format == "debezium_3x"
    assert ConnectorConfig.from_dict({**base, "key.converter.schemas.enable": "false",
                                      "value.converter.schemas.enable": "false"}).mongocdc_schemas_enable is False
    with pytest.raises(ConfigError, match="one JsonConverter schemas setting"):
        ConnectorConfig.from_dict({**base, "key.converter.schemas.enable": "false",
                                   "value.converter.schemas.enable": "true"})


def test_renamed_fields_become_the_last_of_their_document() -> None:
    """Debezium renames by remove-then-put (seen in the compat suite's post_image scenario)."""
    conv = d3(schemas_enable=False, field_renames=("inventory.customers.a:z", "inventory.customers.s.x:y"))
    doc = {"_id": 1, "a": 1, "b": 2, "s": {"x": 1, "w": 2}}
    assert payload(conv.convert_read(doc, "inventory", "customers", POSITION, "true"))["after"] == (
        '{"_id": 1,"b": 2,"s": {"w": 2,"y": 1},"z": 1}'
    )
    desc = {"updatedFields": {"a": 5, "b": 6, "s": {"x": 1, "w": 2}}, "removedFields": ["a"], "truncatedArrays": []}
    (record,) = conv.convert_change(update(updateDescription=desc, documentKey={"_id": 1}), POSITION)
    assert payload(record)["updateDescription"]["updatedFields"] == '{"b": 6, "s": {"w": 2, "y": 1}, "z": 5}'
    assert payload(record)["updateDescription"]["removedFields"] == ["z"]
    # The default format keeps the place.
    default = converter(schemas_enable=False, field_renames=("inventory.customers.a:z",))
    read = default.convert_read(doc, "inventory", "customers", POSITION, "true")
    assert payload(read)["after"].startswith('{"_id": 1,"z": 1,"b": 2')


def test_heartbeats_as_debezium_writes_them() -> None:
    record = d3().heartbeat_record(POSITION, 1795691282942)
    assert record.topic == "__debezium-heartbeat.fulfillment"
    assert record.key == (
        b'{"schema":{"type":"struct","fields":[{"type":"string","optional":false,"field":"serverName"}],'
        b'"optional":false,"name":"io.debezium.connector.common.ServerNameKey","version":1},'
        b'"payload":{"serverName":"fulfillment"}}'
    )
    assert record.value == (
        b'{"schema":{"type":"struct","fields":[{"type":"int64","optional":false,"field":"ts_ms"}],'
        b'"optional":false,"name":"io.debezium.connector.common.Heartbeat","version":1},"payload":{"ts_ms":1795691282942}}'
    )


@pytest.mark.parametrize("schemas", [True, False])
def test_records_carry_the_schema_parts_they_were_written_after(schemas: bool) -> None:
    """As in the default format (``Record.heads``): every change record, tombstone and raw snapshot run
    of a collection shares one pair, the key's and the value's schema parts, which its bytes start
    with; without the schema part there is none."""
    conv = d3(schemas_enable=schemas)
    decoded = conv.convert_change(change("delete"), POSITION)
    raw_event = RawChange(bson.encode(insert()), ENGINE_OPTIONS.with_options(document_class=RawChange))
    written = conv.convert_change(raw_event, POSITION)
    run = conv.convert_reads(RawDocuments(bson.encode({"_id": 1}) * 3, ENGINE_OPTIONS), ["true"] * 3,
                             "inventory", "customers", POSITION)  # fmt: skip
    heads = [r.heads for r in (*decoded, *written)] + [getattr(run, "heads", None)]
    if not schemas:
        assert heads == [None] * 4
        return
    assert len(heads) == 4 and heads[0] is not None and all(h is heads[0] for h in heads)
    key_head, value_head = heads[0]
    assert all(r.key is not None and r.key.startswith(key_head) for r in (*decoded, *written, *run))
    assert all(r.value is None or r.value.startswith(value_head) for r in (*decoded, *written, *run))
