"""Spark SQL expressions from a document's Extended JSON to typed columns (no Python per row).

Documents arrive as the Extended JSON text of change events (strict, relaxed or canonical).
:func:`document` parses it into a VARIANT after one cheap normalisation (Int64/Int32 and finite
double wrappers become plain JSON numbers; every other BSON type keeps its Extended JSON wrapper, so
nothing is lost). :func:`convert` then turns a variant value into the Spark column of its
:class:`~mongocdc_core.tables.kinds.Kind`; a value that does not fit its column fails the query
(``variant_get`` and ANSI casts raise), it is never silently NULL. :func:`answers` computes, in one
aggregation, what the merged variant schema cannot say (date range, decimal scale, binary subtype,
the BSON types met where a schema conflicts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mongocdc_core.tables.kinds import Answers, Kind, Path, Questions

_INTEGER_WRAPPER = r'\{\s*"\$number(?:Long|Int)"\s*:\s*"(-?\d+)"\s*\}'
_DOUBLE_WRAPPER = r'\{\s*"\$numberDouble"\s*:\s*"(-?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)"\s*\}'
#: A negative zero written ``-0.0`` outside strings, and the text before it: \G continues where the last
#: match ended (so the text before always starts outside a string) and every repetition is possessive,
#: which Java's engine runs as a loop (a backtracking one recurses per step, and long documents overflow
#: its stack).
_NEGATIVE_ZERO = r'\G((?:[^"\-]++|-(?!0\.0+(?![0-9eE]))|"[^"\\]*+(?:\\.[^"\\]*+)*+")*+)-0\.0+(?![0-9eE])'
_DECIMAL_TEXT = r"^[+-]?(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$"
_UUID = r"^(.{8})(.{4})(.{4})(.{4})(.{12})$"


def normalize(text: Column) -> Column:
    """Extended JSON with Int64/Int32 wrappers as plain integers and finite doubles as plain numbers,
    negative zero as ``-0.0E0``.

    The wrapper patterns only match outside strings: inside a JSON string every ``"`` is escaped. A
    plain search decides first whether a pattern can match at all (a document with only decimals or
    dates needs no regex); it is ``contains``, which skips ahead to the rare ``$``, not ``instr``, which
    compares the whole needle at every byte (2.5 µs of a document's 7 to parse). Each search reads the
    original text, which no step changes in a way it looks for: a search of a step's result would run
    that step twice (as the test, then as the value), for every document.

    Spark parses a number without an exponent as a decimal where it fits, and a decimal has no
    negative zero: ``-0.0`` would become ``0``. With an exponent it is a double, sign kept, as MongoDB
    keeps it.
    """
    integers = F.when(
        text.contains('$numberLong"') | text.contains('$numberInt"'), F.regexp_replace(text, _INTEGER_WRAPPER, "$1")
    ).otherwise(text)
    doubles = F.when(
        text.contains('$numberDouble"'), F.regexp_replace(integers, _DOUBLE_WRAPPER, "$1")
    ).otherwise(integers)
    return F.when(text.contains("-0.0"), F.regexp_replace(doubles, _NEGATIVE_ZERO, "$1-0.0E0")).otherwise(doubles)


def document(text: Column) -> Column:
    """The VARIANT of a document's (or ``_id``'s) Extended JSON text, normalised (see the module doc)."""
    return F.parse_json(normalize(text))


def quote(name: str) -> str:
    """A column or field name for Spark SQL text and ``F.col``: backquoted, inner backquotes doubled."""
    return "`" + name.replace("`", "``") + "`"


def _step(name: str) -> str | None:
    """The JSON path step to field ``name`` (None: no path spells it; the field is read through a map)."""
    if "\\" in name:
        return None
    if "'" not in name:
        return f"['{name}']"
    if '"' not in name:
        return f'["{name}"]'
    return None


def child(value: Column, name: str) -> Column:
    """The variant of field ``name`` of a variant document (SQL NULL when the field is absent)."""
    step = _step(name)
    if step is None:
        return F.try_variant_get(value, "$", "map<string,variant>")[name]
    return F.variant_get(value, "$" + step, "variant")


def _member(value: Column, key: str, target: str) -> Column:
    return F.try_variant_get(value, f'$["{key}"]', target)


def _absent(value: Column) -> Column:
    return value.isNull() | F.is_variant_null(value)


def _binary_base64(value: Column) -> Column:
    return F.coalesce(
        _member(value, "$binary", "string"), F.try_variant_get(value, '$["$binary"]["base64"]', "string")
    )


def _uuid(value: Column) -> Column:
    text = F.lower(F.hex(F.unbase64(_binary_base64(value))))
    return F.coalesce(_member(value, "$uuid", "string"), F.regexp_replace(text, _UUID, "$1-$2-$3-$4-$5"))


def _date(value: Column, path: str = "$") -> Column:
    """The timestamp of the ``$date`` at ``path`` of ``value`` (NULL when absent)."""
    millis = F.try_variant_get(value, path + '["$date"]', "bigint")
    return F.when(millis.isNotNull(), F.timestamp_millis(millis)).otherwise(
        F.try_variant_get(value, path + '["$date"]', "string").cast("timestamp")
    )


def id_text(value: Column) -> Column:
    """A readable string for any ``_id``: the string itself, an ObjectId's hex, a number's digits,
    Extended JSON for the rest."""
    return F.coalesce(_member(value, "$oid", "string"), F.variant_get(value, "$", "string"))


_PLAIN_INTEGER = r"^-?(0|[1-9][0-9]{0,17})$"
_PLAIN_STRING = r'^"([^"\\\x00-\x1f]*)"$'
_PLAIN_OID = r'^\{\s*"\$oid"\s*:\s*"([0-9a-fA-F]{24})"\s*\}$'


def key_text(text: Column) -> Column:
    """:func:`id_text` of a key's Extended JSON text. The usual keys (a plain string, an ObjectId, an
    integer that fits a long) are read from the text directly; only the others are parsed."""
    return (
        F.when(text.rlike(_PLAIN_INTEGER), text)
        .when(text.rlike(_PLAIN_STRING), F.regexp_extract(text, _PLAIN_STRING, 1))
        .when(text.rlike(_PLAIN_OID), F.regexp_extract(text, _PLAIN_OID, 1))
        .otherwise(id_text(document(text)))
    )


def _get(value: Column, path: str, target: str, strict: bool) -> Column:
    return F.variant_get(value, path, target) if strict else F.try_variant_get(value, path, target)


def _cast(column: Column, target: T.DataType, strict: bool) -> Column:
    return column.cast(target) if strict else column.try_cast(target)


_ATOMIC: dict[str, Callable[[Column, bool], Column]] = {
    "bool": lambda v, s: _get(v, "$", "boolean", s),
    "int": lambda v, s: _get(v, "$", "bigint", s),
    "string": lambda v, s: _get(v, "$", "string", s),
    "oid": lambda v, s: _get(v, '$["$oid"]', "string", s),
    "uuid": lambda v, s: _uuid(v),
    "binary": lambda v, s: F.unbase64(_binary_base64(v)),
    "date": lambda v, s: _date(v),
    "decstr": lambda v, s: _get(v, '$["$numberDecimal"]', "string", s),
    "bts": lambda v, s: _get(v, '$["$timestamp"]', "struct<t:bigint,i:bigint>", s),
    "ejson": lambda v, s: F.to_json(v),
    "variant": lambda v, s: v,
    "idtext": lambda v, s: id_text(v),
}


def convert(kind: Kind, value: Column, *, strict: bool = True) -> Column:
    """The typed column of ``kind`` for a normalised variant ``value`` (JSON null and absent: NULL).

    Strict (refreshes): a value that does not fit fails the query. Not strict (reconciliation,
    comparing a source document with the table's types): it becomes NULL, so the row differs.
    """
    if kind.tag == "struct" and not kind.nested:  # no typed field yet: the document as it is
        built: Column = value
    elif kind.tag == "struct":
        members = [
            convert(f.kind, child(value, f.name), strict=strict).alias(f.column) for f in kind.fields if f.kind.typed
        ]
        built = F.struct(*members)
    elif kind.tag == "array" and not kind.nested:  # no element seen yet: array<variant>
        built = _get(value, "$", "array<variant>", strict)
    elif kind.tag == "array":
        assert kind.element is not None
        element = kind.element
        built = F.transform(_get(value, "$", "array<variant>", strict), lambda x: convert(element, x, strict=strict))
    elif kind.tag == "double":
        plain = _get(value, "$", "double", strict)
        special = _member(value, "$numberDouble", "string")
        built = F.when(special.isNotNull(), _cast(special, T.DoubleType(), strict)).otherwise(plain) if kind.nonfinite else plain
    elif kind.tag == "decimal":
        text = _get(value, '$["$numberDecimal"]', "string", strict)
        built = _cast(text, T.DecimalType(38, kind.scale), strict)
    else:
        built = _ATOMIC[kind.tag](value, strict)
    return F.when(~_absent(value), built)


#: Kinds read with one typed ``variant_get`` at (path + suffix): (suffix, Spark type). JSON null and
#: an absent path both give NULL there, so these need no test of the value first.
_BY_PATH: dict[str, tuple[str, str]] = {
    "bool": ("", "boolean"),
    "int": ("", "bigint"),
    "string": ("", "string"),
    "oid": ('["$oid"]', "string"),
    "decstr": ('["$numberDecimal"]', "string"),
    "bts": ('["$timestamp"]', "struct<t:bigint,i:bigint>"),
}


def field(kind: Kind, document: Column, name: str, *, strict: bool = True) -> Column:
    """:func:`convert` of field ``name`` of a variant ``document``, reading values by their path.

    The same column as ``convert(kind, child(document, name))``, for less work per row: a leaf is one
    typed ``variant_get`` from the document, instead of a copy of each enclosing field's variant
    (a variant value carries its metadata) read again for every test and cast.
    """
    step = _step(name)
    if step is None:
        return convert(kind, child(document, name), strict=strict)
    return _by_path(kind, document, "$" + step, strict)


def _plain(kind: Kind) -> tuple[str, str] | None:
    """(suffix, Spark type) when ``kind`` is read with one typed ``variant_get`` (see ``_BY_PATH``)."""
    if kind.tag == "double" and not kind.nonfinite:
        return "", "double"
    return _BY_PATH.get(kind.tag)


def _by_path(kind: Kind, base: Column, path: str, strict: bool) -> Column:
    plain = _plain(kind)
    if plain is not None:
        return _get(base, path + plain[0], plain[1], strict)
    element = _plain(kind.element) if kind.tag == "array" and kind.element is not None else None
    if element is not None and not element[0]:  # an array of plain values: cast as a whole
        return _get(base, path, f"array<{element[1]}>", strict)
    if kind.tag == "decimal":
        return _cast(_get(base, path + '["$numberDecimal"]', "string", strict), T.DecimalType(38, kind.scale), strict)
    if kind.tag == "date":
        return _date(base, path)
    value = F.variant_get(base, path, "variant")
    if kind.tag != "struct" or not kind.nested:
        return convert(kind, value, strict=strict)
    members = []
    for f in kind.fields:
        if f.kind.typed:
            step = _step(f.name)
            member = convert(f.kind, child(value, f.name), strict=strict) if step is None else _by_path(f.kind, base, path + step, strict)
            members.append(member.alias(f.column))
    return F.when(~_absent(value), F.struct(*members))


# --------------------------------------------------------------------------- statistics


def leaves(value: Column, path: Path) -> Column:
    """Every value at ``path`` (None steps go through array elements) as one flat array<variant>."""
    if not path:
        return F.array(value)
    head, rest = path[0], path[1:]
    if head is None:
        elements = F.try_variant_get(value, "$", "array<variant>")
        return F.flatten(F.transform(elements, lambda x: leaves(x, rest)))
    return leaves(child(value, head), rest)


def tag(value: Column) -> Column:
    """The BSON type of one variant value, for schema conflicts (``int``, ``double``, ``ndouble`` …)."""
    schema = F.schema_of_variant(value)
    return (
        F.when(_absent(value), F.lit("null"))
        .when(schema == "BIGINT", "int")
        .when(schema.startswith("DECIMAL") | schema.isin("DOUBLE", "FLOAT"), "double")
        .when(schema == "STRING", "string")
        .when(schema == "BOOLEAN", "bool")
        .when(schema.startswith("ARRAY"), "array")
        .when(schema == "OBJECT<`$numberDouble`: STRING>", "ndouble")
        .when(schema.rlike(r"^OBJECT<`\$date`: [A-Z]+>$"), "date")
        .otherwise("other")
    )


def _decimal_parts(value: Column) -> tuple[Column, Column, Column]:
    """(scale, integer digits, not a plain number) of a ``$numberDecimal`` value, as Spark needs them.

    The parts come from the groups of one regular expression. Taking them apart with string functions
    instead nested each intermediate value into the next: the expression tree grew so large that a
    pass answering the questions of one decimal field spent about 40 µs per value on it, against 5."""
    text = _member(value, "$numberDecimal", "string")
    whole = F.regexp_extract(text, _DECIMAL_TEXT, 1)
    fraction = F.regexp_extract(text, _DECIMAL_TEXT, 2)
    exponent = F.coalesce(F.nullif(F.regexp_extract(text, _DECIMAL_TEXT, 3), F.lit("")).cast("int"), F.lit(0))
    significant = F.length(F.ltrim(F.concat(whole, fraction), F.lit("0")))
    shift = F.length(fraction) - exponent
    number = (F.length(whole) + F.length(fraction)) > 0  # a text the expression does not match has neither
    scale = F.when(number, F.greatest(F.lit(0), shift)).otherwise(0)
    digits = F.when(number, F.greatest(F.lit(0), significant - shift)).otherwise(0)
    return scale, digits, F.when(text.isNotNull() & ~number, 1).otherwise(0)


def _at(value: Column, path: Path) -> Column:
    """The variant at ``path`` when it goes through no array."""
    for name in path:
        assert name is not None
        value = child(value, name)
    return value


def _over(value: Column, path: Path, each: Callable[[Column], Column], combine: str) -> Column:
    if None not in path:  # one value per row: no array to build and walk
        return getattr(F, combine)(each(_at(value, path)))
    per_row = getattr(F, f"array_{combine}")(F.transform(leaves(value, path), each))
    return getattr(F, combine)(per_row)


def _distinct(value: Column, path: Path, each: Callable[[Column], Column]) -> Column:
    if None not in path:
        return F.collect_set(each(_at(value, path)))
    return F.array_distinct(F.flatten(F.collect_set(F.array_compact(F.transform(leaves(value, path), each)))))


def questions_aggregates(value: Column, questions: Questions, prefix: str = "") -> list[Column]:
    """Aggregate columns answering ``questions`` over the rows' variant ``value`` (one Spark job);
    their names start with ``prefix``."""
    return [column.alias(name) for name, column in question_columns(value, questions, prefix)]


def question_columns(value: Column, questions: Questions, prefix: str = "") -> list[tuple[str, Column]]:
    """:func:`questions_aggregates` as (name, aggregate) pairs, e.g. for an observation."""
    return [(prefix + name, column) for name, column in _aggregates(value, questions)]


def _aggregates(value: Column, questions: Questions) -> list[tuple[str, Column]]:
    out: list[tuple[str, Column]] = []
    for i, path in enumerate(questions.dates + questions.conflicts):
        out.append((f"date_lo_{i}", _over(value, path, lambda x: _member(x, "$date", "bigint"), "min")))
        out.append((f"date_hi_{i}", _over(value, path, lambda x: _member(x, "$date", "bigint"), "max")))
    for i, path in enumerate(questions.decimals):
        out.append((f"dec_scale_{i}", _over(value, path, lambda x: _decimal_parts(x)[0], "max")))
        out.append((f"dec_digits_{i}", _over(value, path, lambda x: _decimal_parts(x)[1], "max")))
        out.append((f"dec_nan_{i}", _over(value, path, lambda x: _decimal_parts(x)[2], "max")))
    for i, path in enumerate(questions.binaries):
        subtype = lambda x: F.coalesce(  # noqa: E731 - a small lambda reads best here
            _member(x, "$type", "string"), F.try_variant_get(x, '$["$binary"]["subType"]', "string")
        )
        out.append((f"bin_{i}", _distinct(value, path, subtype)))
    for i, path in enumerate(questions.conflicts):
        out.append((f"tags_{i}", _distinct(value, path, tag)))
    return out


def read_answers(values: dict[str, Any], questions: Questions, prefix: str = "") -> Answers:
    """The :class:`Answers` in a row (as a dict) produced by :func:`questions_aggregates`."""
    row = {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}
    answers = Answers()
    for i, path in enumerate(questions.dates + questions.conflicts):
        answers.date_range[path] = (row[f"date_lo_{i}"], row[f"date_hi_{i}"])
    for i, path in enumerate(questions.decimals):
        answers.decimal[path] = (
            int(row[f"dec_scale_{i}"] or 0), int(row[f"dec_digits_{i}"] or 0), bool(row[f"dec_nan_{i}"])
        )
    for i, path in enumerate(questions.binaries):
        answers.subtypes[path] = frozenset(row[f"bin_{i}"] or ())
    for i, path in enumerate(questions.conflicts):
        answers.tags[path] = frozenset(row[f"tags_{i}"] or ())
    return answers
