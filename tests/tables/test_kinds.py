"""Kinds from Spark's variant schemas, their merging, column names and schema-change reports (no Spark)."""

from __future__ import annotations

from mongocdc_core.tables import kinds
from mongocdc_core.tables.kinds import Answers, Kind


def test_variant_schema_text_with_quoted_names_becomes_kinds() -> None:
    text = (
        "OBJECT<``: BIGINT, `a b`: DECIMAL(2,1), `c:d`: OBJECT<`e,f`: BOOLEAN>, `x``y`: ARRAY<STRING>, "
        "`$weird`: VOID, oid: OBJECT<`$oid`: STRING>, when: OBJECT<`$date`: BIGINT>, "
        "price: OBJECT<`$numberDecimal`: STRING>, v: VARIANT, nan: OBJECT<`$numberDouble`: STRING>>"
    )
    kind, questions = kinds.from_variant_schema(text)
    by_name = {f.name: f.kind for f in kind.fields}
    assert by_name[""].tag == "int" and by_name["a b"].tag == "double"
    assert by_name["c:d"].field("e,f") is not None and by_name["c:d"].field("e,f").kind.tag == "bool"  # type: ignore[union-attr]
    assert by_name["x`y"] == Kind("array", element=Kind("string"))
    assert by_name["$weird"].tag == "null" and not by_name["$weird"].typed
    assert by_name["oid"].tag == "oid" and by_name["when"].tag == "date"
    assert by_name["nan"] == Kind("double", nonfinite=True)
    assert questions.dates == [("when",)] and questions.decimals == [("price",)] and questions.conflicts == [("v",)]


def test_mixed_wrappers_are_conflicts_and_dbrefs_are_documents() -> None:
    kind, questions = kinds.from_variant_schema(
        "OBJECT<a: OBJECT<`$date`: BIGINT, `$oid`: STRING>, ref: OBJECT<`$id`: BIGINT, `$ref`: STRING>>"
    )
    assert kind.field("a").kind.tag == "variant" and questions.conflicts == [("a",)]  # type: ignore[union-attr]
    assert kind.field("ref").kind.tag == "struct"  # type: ignore[union-attr]


def test_answers_decide_dates_decimals_binaries_and_numeric_conflicts() -> None:
    kind, questions = kinds.from_variant_schema(
        "OBJECT<d: OBJECT<`$date`: BIGINT>, far: OBJECT<`$date`: BIGINT>, p: OBJECT<`$numberDecimal`: STRING>, "
        "big: OBJECT<`$numberDecimal`: STRING>, u: OBJECT<`$binary`: STRING, `$type`: STRING>, "
        "n: VARIANT, mixed: VARIANT>"
    )
    answers = Answers(
        date_range={("d",): (-60_000_000_000_000, 0), ("far",): (0, kinds.END_DATE_MS)},
        decimal={("p",): (2, 5, False), ("big",): (30, 10, False)},
        subtypes={("u",): frozenset({"04"})},
        tags={("n",): frozenset({"int", "ndouble", "null"}), ("mixed",): frozenset({"int", "string"})},
    )
    resolved = {f.name: f.kind for f in kinds.resolve(kind, answers).fields}
    assert resolved["d"].tag == "date"  # year 68 fits a Spark timestamp
    assert resolved["far"].tag == "variant"  # year 10000 does not: kept as Extended JSON in a variant
    assert resolved["p"] == Kind("decimal", scale=2, digits=5)
    assert resolved["big"].tag == "decstr"  # 40 digits: a string
    assert resolved["u"].tag == "uuid"
    assert resolved["n"] == Kind("double", nonfinite=True) and resolved["mixed"].tag == "variant"


def test_merge_widens_numbers_and_decimals_and_falls_back_to_variant() -> None:
    assert kinds.merge(Kind("int"), Kind("double")).tag == "double"
    assert kinds.merge(Kind("decimal", scale=2, digits=3), Kind("decimal", scale=4, digits=1)) == Kind(
        "decimal", scale=4, digits=3
    )
    assert kinds.merge(Kind("decimal", scale=30, digits=3), Kind("decimal", scale=1, digits=20)).tag == "decstr"
    assert kinds.merge(Kind("oid"), Kind("string")).tag == "variant"
    assert kinds.merge(kinds.NULL, Kind("date")).tag == "date"
    a = kinds.struct([("x", Kind("int")), ("y", Kind("string"))])
    b = kinds.struct([("y", Kind("string")), ("z", Kind("bool"))])
    assert [f.name for f in kinds.merge(a, b).fields] == ["x", "y", "z"]
    assert kinds.as_id(kinds.merge(Kind("int"), Kind("string"))).tag == "idtext"


def test_column_names_avoid_reserved_and_case_collisions_and_keep_earlier_names() -> None:
    doc = kinds.struct([(n, Kind("int")) for n in ("Name", "name", "__op", "__DOC", "a.b", "deleted", "")])
    named = kinds.name_columns(doc, top=True)
    columns = {f.name: f.column for f in named.fields}
    assert columns == {"Name": "Name", "name": "name__2", "__op": "___op", "__DOC": "___DOC", "a.b": "a.b",
                       "deleted": "deleted", "": "_"}
    later = kinds.name_columns(kinds.merge(named, kinds.struct([("NAME", Kind("int"))])), named, top=True)
    assert {f.name: f.column for f in later.fields}["NAME"] == "NAME__3"
    assert {f.name: f.column for f in later.fields}["name"] == "name__2"  # existing columns never move
    nested = kinds.name_columns(kinds.struct([("o", kinds.struct([("K", Kind("int")), ("k", Kind("int"))]))]), top=True)
    assert [f.column for f in nested.fields[0].kind.fields] == ["K", "k__2"]


def test_changes_and_rewrites_are_reported_readably() -> None:
    old = kinds.name_columns(kinds.struct([("qty", Kind("int")), ("o", kinds.struct([("a", Kind("int"))]))]), top=True)
    added = kinds.name_columns(kinds.merge(old, kinds.struct([("o", kinds.struct([("b", Kind("string"))])),
                                                              ("new", Kind("date"))])), old, top=True)
    assert kinds.changes(old, added) == ["added column o.b (string)", "added column new (timestamp)"]
    assert not kinds.needs_rewrite(old, added)
    varied = kinds.name_columns(kinds.merge(old, kinds.struct([("qty", Kind("string"))])), old, top=True)
    assert kinds.changes(old, varied) == ["field qty: bigint -> VARIANT"] and kinds.needs_rewrite(old, varied)
    widened = kinds.name_columns(kinds.merge(old, kinds.struct([("qty", Kind("double"))])), old, top=True)
    assert kinds.changes(old, widened) == ["field qty: bigint -> double"]


def test_kinds_survive_their_json_form() -> None:
    kind = kinds.name_columns(kinds.struct([
        ("a", Kind("array", element=kinds.struct([("p", Kind("decimal", scale=2, digits=4))]))),
        ("d", Kind("double", nonfinite=True)), ("N", Kind("int")), ("n", Kind("int")),
    ]), top=True)
    assert Kind.from_json(kind.to_json()) == kind
