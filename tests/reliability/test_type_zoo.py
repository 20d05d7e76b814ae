"""A BSON type zoo through snapshot and streaming: every value rebuilt from the records equals the source.

Each value of the zoo is read by the snapshot, inserted, set by an update (so it travels in
``updateDescription.updatedFields``) and written by a replace; documents also use every type that
can be an ``_id``. The state rebuilt from the JSON Lines output must equal the source's, value by value.
Dates beyond year 9999 or before year 1 are left to the decoding fix of issue 14 (its first bullet).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from bson import Binary, Code, DBRef, Decimal128, Int64, ObjectId, Regex, Timestamp
from bson.max_key import MaxKey
from bson.min_key import MinKey

from mongocdc_core.replay import canonical
from tests.reliability.conftest import Source
from tests.reliability.harness import (
    Connector,
    cluster_time,
    compare,
    connector_properties,
    ground_truth,
    read_jsonl,
    stop_at_arg,
    write_config,
)

pytestmark = pytest.mark.reliability

UTC = datetime.UTC
U = uuid.UUID("12345678-1234-5678-1234-567812345678")


def _nested(depth: int) -> Any:
    value: Any = {"leaf": [1, {"x": None}]}
    for i in range(depth):
        value = {f"l{i}": value} if i % 2 else [value, i]
    return value


ZOO: dict[str, Any] = {
    "double": 3.141592653589793, "double_neg_zero": -0.0, "double_nan": float("nan"), "double_inf": float("inf"),
    "double_ninf": float("-inf"), "double_tiny": 5e-324, "double_max": 1.7976931348623157e308, "double_int": 2.0,
    "string": "héllo wörld ✓ 𝄞 日本", "string_empty": "", "string_nul": "a\x00b", "string_escapes": '"\\/\n\t\r\b\f',
    "string_control": "\x01\x1f\x7f", "string_long": "z" * 100_000,
    "object": {"a": 1, "b": {"c": [1, 2, {"d": "e"}]}}, "object_empty": {}, "object_dotted": {"a.b": 1, "c$": 2},
    "array": [1, "two", 3.0, None, [4, [5]], {"six": 6}], "array_empty": [], "array_nested_empty": [[], {}],
    "binary_generic": Binary(b"\x00\x01\xff\xfe", 0), "binary_function": Binary(b"fn", 1),
    "binary_old": Binary(b"\x01\x02\x03", 2), "uuid_legacy": Binary(U.bytes, 3), "uuid": Binary(U.bytes, 4),
    "md5": Binary(bytes(range(16)), 5), "encrypted": Binary(b"\x06enc", 6), "column": Binary(b"\x07col", 7),
    "sensitive": Binary(b"secret", 8), "binary_user": Binary(b"user-defined", 0x80), "binary_empty": Binary(b"", 0),
    "objectid": ObjectId("65f0c0ffee0123456789abcd"), "true": True, "false": False,
    "date": datetime.datetime(2024, 2, 29, 12, 34, 56, 789000, tzinfo=UTC),
    "date_epoch": datetime.datetime(1970, 1, 1, tzinfo=UTC),
    "date_before_epoch": datetime.datetime(1900, 1, 1, 0, 0, 0, 1000, tzinfo=UTC),
    "date_year_1": datetime.datetime(1, 1, 1, tzinfo=UTC),
    "date_year_9999": datetime.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
    "null": None, "regex": Regex("^a.*b$", "imsx"), "regex_plain": Regex("x"),
    "code": Code("function () { return 1; }"), "code_with_scope": Code("x + y", {"x": 1, "y": [2]}),
    "int32": 42, "int32_min": -(2**31), "int32_max": 2**31 - 1, "int32_zero": 0,
    "int64": Int64(2**40), "int64_small": Int64(5), "int64_max": Int64(2**63 - 1), "int64_min": Int64(-(2**63)),
    "timestamp": Timestamp(1_700_000_000, 7), "timestamp_zero": Timestamp(0, 0),
    "decimal": Decimal128("1234.5678"), "decimal_nan": Decimal128("NaN"), "decimal_ninf": Decimal128("-Infinity"),
    "decimal_max": Decimal128("9.999999999999999999999999999999999E+6144"), "decimal_neg_zero": Decimal128("-0"),
    "decimal_tiny": Decimal128("1E-6176"),
    "minkey": MinKey(), "maxkey": MaxKey(), "dbref": DBRef("coll", ObjectId("65f0c0ffee0123456789abce"), "db"),
    "dbref_extra": DBRef("coll", 5, extra="x"), "nested_deep": _nested(60),
    "mixed_array": [MinKey(), Int64(1), Decimal128("2"), Binary(b"3", 0), Timestamp(4, 4), Regex("5"), MaxKey()],
}
IDS: list[Any] = [
    ObjectId("65f0c0ffee0123456789abcf"), 7, -7, "seven", "", Int64(2**40), 2.5,
    Binary(b"\x07", 0), Binary(U.bytes, 4), datetime.datetime(2024, 1, 1, tzinfo=UTC), {"a": 1, "b": "two"}, True, Timestamp(7, 7), MinKey(), MaxKey(), "\u00e9t\u00e9", "𝄞",
]
#: Valid ``_id`` types the emulator cannot yet put in a resume token (real MongoDB can): only against a real one.
REAL_ONLY_IDS: list[Any] = [Decimal128("7.5")]


def test_bson_type_zoo(source: Source, tmp_path: Path, report: Callable[[Any], None]) -> None:
    ids = IDS + (REAL_ONLY_IDS if source.emulator is None else [])
    db = source.fresh_db()
    coll = db.zoo
    coll.insert_one({"_id": "snapshot", **ZOO})
    coll.insert_many([{"_id": doc_id, "id_type": type(doc_id).__name__} for doc_id in ids])
    out = tmp_path / "out"
    config = write_config(tmp_path / "connector.json", connector_properties(source.uri, db.name))
    connector = Connector(config, f"jsonl:{out}", str(tmp_path / "offsets.json"), tmp_path)
    start = cluster_time(source.client)
    assert connector.run("--stop-at", stop_at_arg(start)) == 0, connector.tail()  # the snapshot reads
    coll.insert_one({"_id": "inserted", **ZOO})
    coll.insert_one({"_id": "updated"})
    for name, value in ZOO.items():
        coll.update_one({"_id": "updated"}, {"$set": {name: value}})
    coll.insert_one({"_id": "replaced"})
    coll.replace_one({"_id": "replaced"}, ZOO)
    for doc_id in ids[:8]:
        coll.update_one({"_id": doc_id}, {"$set": {"touched": ZOO["decimal"]}})
    coll.delete_one({"_id": IDS[-1]})
    stop = cluster_time(source.client)
    assert connector.run("--stop-at", stop_at_arg(stop)) == 0, connector.tail()
    delivered = read_jsonl(out / f"rel.{db.name}.zoo.jsonl")
    expected = canonical(coll.find())
    rebuilt = delivered.rebuilt(f"{db.name}.zoo")
    figures = compare("BSON type zoo (snapshot, insert, update, replace)", ground_truth(db, "zoo", start, stop),
                      delivered.events(start, stop), rebuilt, expected, peak_rss_mb=connector.peak_rss_mb)
    values = 4 * len(ZOO) + len(ids)
    equal = _equal_values(rebuilt, expected)
    figures.note += f" values={equal}/{values} equal"
    report(figures)
    source.client.drop_database(db.name)
    assert figures.lost == 0 and figures.mismatch == 0 and equal == values, figures.line()


ZOO_DOCUMENTS = ("snapshot", "inserted", "updated", "replaced")


def _equal_values(rebuilt: list[str], expected: list[str]) -> int:
    """Zoo values of the four zoo documents, ``_id`` documents, and the deleted one gone from both."""
    def by_id(docs: list[str]) -> dict[bytes, dict[str, Any]]:
        return {orjson.dumps(d["_id"]): d for d in map(orjson.loads, docs)}

    left, right = by_id(rebuilt), by_id(expected)
    equal = 0
    for key, doc in right.items():
        other = left.get(key, {})
        if doc["_id"] in ZOO_DOCUMENTS:
            equal += sum(1 for name in ZOO if name in other and other[name] == doc[name])
        else:
            equal += other == doc
    return equal + (orjson.dumps(IDS[-1]) not in left)
