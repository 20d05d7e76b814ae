"""Columns typed to the documents: every BSON type of the zoo, awkward field names, the key as users query it."""

from __future__ import annotations

import datetime
import json
import math
import random
import re
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import UuidRepresentation
from bson.datetime_ms import DatetimeMS
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mongocdc_core.positions import Position
from mongocdc_core.tables import (
    CollectionTables,
    current_state,
    read_current_state,
    refresh_changelog,
    refresh_current_state,
    typed_columns,
)
from mongocdc_core.tables.changelog import latest_version, table_properties
from mongocdc_core.tables.current_state import KINDS_PROPERTY

from .support import build, comparable, read_file

OID = ObjectId("65f0a1b2c3d4e5f6a7b8c9d0")
UUID = uuid.UUID("4571054c-0dba-4dfe-bd52-0478795099b4")
WHEN = datetime.datetime(2024, 5, 6, 7, 8, 9, 123000)
YEAR_60 = datetime.datetime(60, 3, 1, 12, 0)

ZOO = {
    "_id": "sku-0000",
    "int32": 7,
    "int64": Int64(2**40),
    "double": 1.5,
    "nan": float("nan"),
    "inf": float("inf"),
    "ninf": float("-inf"),
    "dec": Decimal128("1.50"),
    "dec_nan": Decimal128("NaN"),
    "date": WHEN,
    "year60": YEAR_60,
    "far": DatetimeMS(2**62),
    "oid": OID,
    "uuid": Binary.from_uuid(UUID, UuidRepresentation.STANDARD),
    "bin": Binary(b"\x00abc"),
    "regex": Regex("^a.*", "i"),
    "bts": Timestamp(5, 6),
    "minkey": MinKey(),
    "maxkey": MaxKey(),
    "code": Code("f()"),
    "bool": True,
    "str": "ünï",
    "null": None,
    "nested": {"customer": {"address": {"city": "Berlin", "zip": 10115}}},
    "arr": [1, 2, 3],
    "docs": [{"x": 1}, {"x": 2, "y": "a"}],
    "mixed_arr": [1, "a"],
    "varies": 1,
}
SECOND = {"_id": "sku-0001", "int32": 8, "varies": "one", "dec": Decimal128("12.3456"), "double": 2}


def test_each_bson_type_lands_in_its_documented_column_type(spark: SparkSession, tmp_path: Path) -> None:
    tables = CollectionTables.under(str(tmp_path / "tables"), "shop.zoo")
    landing = read_file(tmp_path / "zoo.parquet", "shop", "zoo", [ZOO, SECOND], Position(1_700_000_000, 1))
    state = build(spark, tables, landing)
    types = {f.name: f.dataType for f in state.schema.fields}
    expected: dict[str, T.DataType] = {
        "_id": T.StringType(), "int32": T.LongType(), "int64": T.LongType(), "double": T.DoubleType(),
        "nan": T.DoubleType(), "inf": T.DoubleType(), "ninf": T.DoubleType(), "dec": T.DecimalType(38, 4),
        "dec_nan": T.StringType(), "date": T.TimestampType(), "year60": T.TimestampType(), "far": T.VariantType(),
        "oid": T.StringType(), "uuid": T.StringType(), "bin": T.BinaryType(), "regex": T.StringType(),
        "bts": T.StructType([T.StructField("t", T.LongType()), T.StructField("i", T.LongType())]),
        "minkey": T.StringType(), "maxkey": T.StringType(), "code": T.StringType(), "bool": T.BooleanType(),
        "str": T.StringType(), "arr": T.ArrayType(T.LongType()), "mixed_arr": T.ArrayType(T.VariantType()),
        "varies": T.VariantType(), "__doc": T.VariantType(), "__key": T.StringType(), "__position": T.StringType(),
    }
    for name, dtype in expected.items():
        assert types[name] == dtype, name
    assert "null" not in types  # only ever null: no type to give it yet (the value is in __doc)
    assert types["nested"].simpleString() == "struct<customer:struct<address:struct<city:string,zip:bigint>>>"
    assert types["docs"].simpleString() == "array<struct<x:bigint,y:string>>"

    row = state.where("_id = 'sku-0000'").first()  # the key as a user would query it
    assert row is not None
    assert (row["int32"], row["int64"], row["double"]) == (7, 2**40, 1.5)
    assert math.isnan(row["nan"]) and row["inf"] == math.inf and row["ninf"] == -math.inf
    assert row["dec"] == Decimal("1.5000") and row["dec_nan"] == "NaN"
    assert row["date"] == WHEN and row["year60"] == YEAR_60
    assert row["oid"] == str(OID) and row["uuid"] == str(UUID) and row["bin"] == bytearray(b"\x00abc")
    assert row["regex"] == '{"$options":"i","$regex":"^a.*"}' and row["minkey"] == '{"$minKey":1}'
    assert row["bts"] == T.Row(t=5, i=6) and row["code"] == '{"$code":"f()"}'
    assert row["nested"]["customer"]["address"]["city"] == "Berlin"
    assert [d["y"] for d in row["docs"]] == [None, "a"]
    queried = spark.sql(
        f"SELECT __doc:nested.customer.address.city::string AS city, to_json(far) AS far, "
        f"to_json(varies) AS varies, __doc:int64::bigint AS int64 FROM delta.`{tables.current_state}` ORDER BY _id"
    ).collect()
    assert [r["city"] for r in queried] == ["Berlin", None]
    assert queried[0]["far"] == '{"$date":4611686018427387904}'  # beyond Spark's timestamps: kept exactly
    assert [r["varies"] for r in queried] == ["1", '"one"']
    assert queried[0]["int64"] == 2**40  # Int64 round-trips (64-bit) inside the document too
    second = state.where("_id = 'sku-0001'").first()
    assert second is not None and second["dec"] == Decimal("12.3456") and second["double"] == 2.0


def test_awkward_field_names_never_collide_with_the_tables_columns(spark: SparkSession, tmp_path: Path) -> None:
    docs = [
        {"_id": 1, "deleted": True, "op": "mine", "position": 3, "document": "d", "Name": "upper", "name": "lower",
         "a.b": "dotted", "__op": "reserved", "with space": 1, "o": {"K": 1, "k": 2},
         "it's": {"x": 1, "say \"hi\" 'n'": {"y": 2}}, "back\\slash": "b", "both'\"": 3},
        {"_id": 2, "deleted": False, "name": "only lower"},
    ]
    tables = CollectionTables.under(str(tmp_path / "tables"), "shop.names")
    state = build(spark, tables, read_file(tmp_path / "n.parquet", "shop", "names", docs, Position(10, 1)),
                  add_fields=("op", "position"))
    columns = set(state.columns)
    assert {"deleted", "op", "position", "document", "Name", "name__2", "a.b", "___op", "with space", "__op",
            "__position"} <= columns
    rows = {r["_id"]: r for r in state.collect()}
    assert rows[1]["deleted"] is True and rows[1]["op"] == "mine" and rows[1]["__op"] == "r"
    assert (rows[1]["Name"], rows[1]["name__2"], rows[1]["a.b"], rows[1]["___op"]) == ("upper", "lower", "dotted", "reserved")
    assert rows[2]["name__2"] == "only lower" and rows[1]["o"]["k__2"] == 2
    # names a JSON path cannot spell in one quoting style, or at all, at the top level and nested
    assert (rows[1]["it's"]["x"], rows[1]["it's"]["say \"hi\" 'n'"]["y"]) == (1, 2)
    assert (rows[1]["back\\slash"], rows[1]["both'\""]) == ("b", 3) and rows[2]["it's"] is None

    # a later batch of the same collection merges through all of those names (the merge used to crash)
    more = [{"_id": 1, "deleted": False, "Name": "U2", "name": "l2", "a.b": "d2", "new.field": 5}]
    later = read_file(tmp_path / "m.parquet", "shop", "names", more, Position(20, 1))
    state = build(spark, tables, later, add_fields=("op", "position"))
    row = state.where("_id = 1").first()
    assert row is not None and (row["deleted"], row["Name"], row["name__2"], row["a.b"], row["new.field"]) == (
        False, "U2", "l2", "d2", 5
    )


def test_keys_are_typed_and_their_identity_is_exact(spark: SparkSession, tmp_path: Path) -> None:
    cases = {
        "oid": ([{"_id": OID}], T.StringType(), str(OID)),
        "long": ([{"_id": Int64(2)}], T.LongType(), 2),
        "date": ([{"_id": WHEN}], T.TimestampType(), WHEN),
        "docid": ([{"_id": {"a": 1, "b": "two"}}, {"_id": {"b": "two", "a": 1}}], None, None),
    }
    for name, (docs, dtype, value) in cases.items():
        tables = CollectionTables.under(str(tmp_path / name), f"shop.{name}")
        state = build(spark, tables, read_file(tmp_path / f"{name}.parquet", "shop", name, docs, Position(1, 1)))
        if dtype is not None:
            assert state.schema["_id"].dataType == dtype
            assert state.first()["_id"] == value  # type: ignore[index]
        else:  # two different MongoDB keys (field order differs): two rows, each with its exact identity
            assert state.count() == 2
            assert sorted(r["__key"] for r in state.collect()) == [
                '{"a" : 1, "b" : "two"}', '{"b" : "two", "a" : 1}'
            ]


def _decimal_parts_by_rule(text: str | None) -> tuple[int, int, int]:
    """(scale, integer digits, not a plain number) of a ``$numberDecimal`` text, spelled out: sign,
    digits, an optional fraction, an optional exponent; the scale and the integer digits Spark needs
    for it as written (leading zeros do not count)."""
    if text is None:
        return 0, 0, 0
    found = re.fullmatch(r"[+-]?(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?", text, flags=re.ASCII)
    if found is None or not (found[1] or found[2]):
        return 0, 0, 1
    whole, fraction, exponent = found[1], found[2] or "", int(found[3] or 0)
    shift = len(fraction) - exponent
    return max(0, shift), max(0, len((whole + fraction).lstrip("0")) - shift), 0


def test_decimal_scale_and_digits_follow_the_written_number(spark: SparkSession) -> None:
    """What a new table's first pass asks of each decimal (the column's scale and precision, or a string
    column for NaN and Infinity) for every spelling a Decimal128 has, and some it never has."""
    texts = ["0", "-0", "00", "1", "-1", "+1", "1.50", "-0.001", "000123.4500", "1E+5", "1e-5", "1.23E+3",
             "-1.23e-10", ".5", "5.", "-.5", "+.", "", ".", "NaN", "-NaN", "Infinity", "-Infinity", "1e", "e5",
             "1.2.3", "12345678901234567890123456789012345678", "0.000000000000000000000000000000000001",
             "1E+6144", "9.999999999999999999999999999999999E+6144", "0E-6176", "abc", " 1", "1 ", "0.0e0"]
    rng = random.Random(7)
    texts += ["".join(rng.choice("0123456789.eE+-") for _ in range(rng.randint(1, 10))) for _ in range(300)]
    documents = [json.dumps({"$numberDecimal": t}) for t in texts] + ['{"other": 1}']
    frame = spark.createDataFrame([(d,) for d in documents], "d string").select(F.parse_json("d").alias("v"))
    parts = typed_columns._decimal_parts(F.col("v"))
    rows = frame.select(F.col("v").cast("string").alias("d"), *[p.alias(f"p{i}") for i, p in enumerate(parts)])
    for row in rows.collect():
        text = json.loads(row["d"]).get("$numberDecimal")
        assert (row["p0"], row["p1"], row["p2"]) == _decimal_parts_by_rule(text), text


def test_negative_zero_keeps_its_sign_in_the_column_and_in_doc(spark: SparkSession, tmp_path: Path) -> None:
    """MongoDB keeps -0.0 apart from 0.0; Spark parses ``-0.0`` as a decimal zero unless told otherwise."""
    docs = [{"_id": 1, "z": -0.0, "n": {"z": -0.0}, "a": [-0.0, 1.5], "s": "-0.0, in a string", "p": 0.0},
            {"_id": 2, "z": 2.5, "n": {"z": 1.0}, "a": [], "s": "x", "p": -0.05}]
    tables = CollectionTables.under(str(tmp_path / "tables"), "shop.zeros")
    state = build(spark, tables, read_file(tmp_path / "z.parquet", "shop", "zeros", docs, Position(1, 1)))
    assert state.schema["z"].dataType == T.DoubleType()
    row = state.where("_id = 1").first()
    assert row is not None
    signs = [math.copysign(1.0, v) for v in (row["z"], row["n"]["z"], row["a"][0], row["p"])]
    assert signs == [-1.0, -1.0, -1.0, 1.0] and row["s"] == "-0.0, in a string"
    doc = spark.sql(
        f"SELECT to_json(__doc) AS d, __doc:z::double AS z FROM delta.`{tables.current_state}` WHERE _id = 1"
    ).first()
    assert doc is not None and math.copysign(1.0, doc["z"]) == -1.0
    assert json.loads(doc["d"]) == {"_id": 1, "a": [-0.0, 1.5], "n": {"z": -0.0}, "p": 0.0,
                                    "s": "-0.0, in a string", "z": -0.0}
    assert '"z":-0.0' in doc["d"] and '"p":0,' in doc["d"]  # json.loads equates the zeros: the text tells them apart
    other = state.where("_id = 2").first()
    assert other is not None and other["p"] == -0.05 and other["a"] == []


def test_empty_documents_and_arrays_get_a_column(spark: SparkSession, tmp_path: Path) -> None:
    """Only a field that was only ever null has no column: ``{}`` is a document (a VARIANT column until
    it has a typed field: Delta has no empty struct), ``[]`` an array (``array<variant>``)."""
    docs = [{"_id": 1, "meta": {}, "tags": [], "holes": {"a": None}}, {"_id": 2, "meta": {}, "tags": []}]
    tables = CollectionTables.under(str(tmp_path / "tables"), "shop.empty")
    state = build(spark, tables, read_file(tmp_path / "e1.parquet", "shop", "empty", docs, Position(1, 1)))
    types = {f.name: f.dataType for f in state.schema.fields}
    assert (types["meta"], types["tags"], types["holes"]) == (
        T.VariantType(), T.ArrayType(T.VariantType()), T.VariantType()
    )
    shown = {r["_id"]: r for r in state.select("_id", F.to_json("meta").alias("meta"), "tags",
                                               F.to_json("holes").alias("holes")).collect()}
    assert (shown[1]["meta"], shown[1]["tags"], shown[1]["holes"]) == ("{}", [], '{"a":null}')
    assert (shown[2]["meta"], shown[2]["tags"], shown[2]["holes"]) == ("{}", [], None)

    # their first typed values give them their types; the rows already there are converted again
    later = [{"_id": 3, "meta": {"k": 7}, "tags": ["x"], "holes": {"a": "full"}}]
    refresh_changelog(spark, tables, [str(read_file(tmp_path / "e2.parquet", "shop", "empty", later, Position(2, 1)))])
    refreshed = refresh_current_state(spark, tables)
    assert sorted(refreshed.schema_changes) == [
        "field holes: VARIANT -> struct<a:string>", "field meta: VARIANT -> struct<k:bigint>",
        "field tags: array<VARIANT> -> array<string>",
    ]
    state = read_current_state(spark, tables.current_state)
    assert state.schema["meta"].dataType.simpleString() == "struct<k:bigint>"
    rows = {r["_id"]: r for r in state.collect()}
    assert (rows[1]["meta"]["k"], rows[1]["tags"], rows[1]["holes"]["a"]) == (None, [], None)
    assert (rows[3]["meta"]["k"], rows[3]["tags"], rows[3]["holes"]["a"]) == (7, ["x"], "full")


def test_a_new_table_written_in_one_pass_is_the_table_typed_from_all_its_rows(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new table is typed by a sample's shape while the same pass observes every row's: kept when the
    two agree, written again the general way when the sample missed something. Both give the table,
    and the ``mongocdc.kinds``, of the general way (two passes: the rows' shape first, then the write).
    A guess that did not hold leaves no trace: no version of the table holds its rows, and the change
    data feed from version 0 is the final rows, inserted."""
    later = [  # what the first document alone does not predict: a new field, wider decimals, NaN, a new type
        {"_id": "sku-0002", "int32": 9, "dec": Decimal128("3.141592"), "double": float("nan"), "added": {"k": 1}},
        {"_id": "sku-0003", "int32": 10, "varies": [1], "year60": WHEN, "oid": "not an ObjectId"},
        {"_id": "sku-0004", "int32": 11, "dec": Decimal128("123456.7")},  # more integer digits only
    ]
    docs = [ZOO, SECOND, *later]
    built = {}
    guesses: list[current_state.Shape | None] = []  # what each one-pass build of the sampled table kept
    build_once = current_state._build

    def watched_build(*args: Any) -> current_state.Shape | None:
        guesses.append(build_once(*args))
        return guesses[-1]

    for name, sample, one_pass in (("one", None, True), ("sampled-one", 1, None), ("general", None, False)):
        if sample is not None:
            monkeypatch.setattr(current_state, "_SAMPLE_ROWS", sample)
            monkeypatch.setattr(current_state, "_build", watched_build)
        if one_pass is False:
            monkeypatch.setattr(current_state, "_build", lambda *args: None)
        tables = CollectionTables.under(str(tmp_path / name), "shop.zoo")
        landing = read_file(tmp_path / f"{name}.parquet", "shop", "zoo", docs, Position(1_700_000_000, 1))
        state = build(spark, tables, landing)
        built[name] = (comparable(state), table_properties(spark, tables.current_state)[KINDS_PROPERTY],
                       latest_version(spark, tables.current_state))
        monkeypatch.undo()
    (rows, kinds_json, version), (sampled_rows, sampled_kinds, sampled_version), general = (
        built["one"], built["sampled-one"], built["general"]
    )
    assert version == 2  # created, written, its properties recorded: one pass
    assert guesses == [None]  # the first document's shape did not hold: written again
    assert sampled_version == general[2] == 2  # created afresh, so its history is that of the general way
    assert rows == sampled_rows == general[0] and len(rows) == len(docs) + 1
    sampled = CollectionTables.under(str(tmp_path / "sampled-one"), "shop.zoo").current_state
    versions = [spark.read.format("delta").option("versionAsOf", v).load(sampled) for v in range(sampled_version + 1)]
    assert [comparable(v) for v in versions if not v.isEmpty()] == [rows, rows]  # its rows, then its properties
    feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(sampled)
    assert [tuple(r) for r in feed.select("_change_type", "_commit_version").distinct().collect()] == [("insert", 1)]
    assert comparable(feed.drop("_change_type", "_commit_version", "_commit_timestamp")) == rows
    assert kinds_json == sampled_kinds == general[1]
    shape = current_state.Shape.from_json(kinds_json)
    fields = {f.name: f.kind for f in shape.doc.fields}
    assert (fields["dec"].tag, fields["dec"].scale, fields["dec"].digits) == ("decimal", 6, 6)
    assert fields["double"].nonfinite and fields["added"].tag == "struct" and fields["varies"].tag == "variant"
    assert fields["year60"].tag == "date" and fields["oid"].tag == "variant"
