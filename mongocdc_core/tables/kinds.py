"""BSON kinds of document fields, and the Spark column each kind becomes (pure Python, no Spark session).

A :class:`Kind` describes what a field holds across many documents: one BSON type (``int``, ``date``,
``oid`` …), a document (``struct``, with its fields), an array (with its element kind), or ``variant``
when the type varies. Kinds come from Spark's ``schema_of_variant_agg`` over the documents'
Extended JSON (:func:`from_variant_schema`), are refined by value statistics (date range, decimal
scale, binary subtype), and merge across refreshes (:func:`merge`): a new field adds a column, int and
double widen to double, any other change makes the field ``variant``. The table keeps its kinds as
JSON in the state each refresh records (``mongocdc.kinds``), so the next refresh merges with what the
table already holds.

Column names: the field's own name, except names the table reserves (``__doc``, ``__key`` …: one more
leading underscore) and names that differ only by case from a column already there (Delta columns are
case-insensitive: ``name__2``, ``name__3`` …). Any other name, dots and spaces included, is kept
(the tables use Delta column mapping).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.sql import types as T

#: Columns the tables own in current_state; a user field of the same name (any case) is renamed.
RESERVED = ("__doc", "__key", "__position", "__op", "__source_ts_ms", "__collection", "__deleted")
MAX_DECIMAL_DIGITS = 38
#: Spark timestamps hold years 1..9999: the milliseconds of 0001-01-01 and of 10000-01-01 (exclusive).
MIN_DATE_MS = -62_135_596_800_000
END_DATE_MS = 253_402_300_800_000

# tags of atomic kinds and the Spark type they map to
_ATOMIC: dict[str, T.DataType] = {
    "bool": T.BooleanType(),
    "int": T.LongType(),
    "double": T.DoubleType(),
    "string": T.StringType(),
    "oid": T.StringType(),
    "uuid": T.StringType(),
    "binary": T.BinaryType(),
    "date": T.TimestampType(),
    "decstr": T.StringType(),
    "bts": T.StructType([T.StructField("t", T.LongType()), T.StructField("i", T.LongType())]),
    "ejson": T.StringType(),
    "variant": T.VariantType(),
    "idtext": T.StringType(),
}
_NUMERIC = {"int", "double"}

#: Extended JSON wrapper documents (their key sets) and the kind each one is.
_WRAPPERS: dict[frozenset[str], str] = {
    frozenset({"$oid"}): "oid",
    frozenset({"$date"}): "date",
    frozenset({"$numberDecimal"}): "decimal",
    frozenset({"$numberDouble"}): "double",
    frozenset({"$numberLong"}): "int",
    frozenset({"$numberInt"}): "int",
    frozenset({"$binary", "$type"}): "binary",
    frozenset({"$binary"}): "binary",
    frozenset({"$uuid"}): "uuid",
    frozenset({"$timestamp"}): "bts",
    frozenset({"$regex", "$options"}): "ejson",
    frozenset({"$regularExpression"}): "ejson",
    frozenset({"$minKey"}): "ejson",
    frozenset({"$maxKey"}): "ejson",
    frozenset({"$code"}): "ejson",
    frozenset({"$code", "$scope"}): "ejson",
    frozenset({"$symbol"}): "ejson",
    frozenset({"$undefined"}): "ejson",
    frozenset({"$dbPointer"}): "ejson",
}


@dataclass(frozen=True)
class Field:
    """A document field: its name in MongoDB, its column name, and its kind."""

    name: str
    column: str
    kind: Kind


@dataclass(frozen=True)
class Kind:
    """What a field holds. ``scale``/``digits``: decimal scale and integer digits; ``nonfinite``: some
    doubles are NaN/Infinity (written as ``$numberDouble`` wrappers); ``fields``/``element``: documents
    and arrays."""

    tag: str
    scale: int = 0
    digits: int = 0
    nonfinite: bool = False
    fields: tuple[Field, ...] = ()
    element: Kind | None = None

    def field(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.name == name), None)

    @property
    def typed(self) -> bool:
        """Whether values of this kind can be a column: all but a field only ever null (no type yet)."""
        return self.tag != "null"

    @property
    def nested(self) -> bool:
        """Whether the column is a struct or an array of a known type, compared part by part. A document
        with no typed field yet (``{}``, only nulls) is a ``VARIANT`` column (Delta has no empty
        struct), an array with no element yet an ``array<variant>``, until their first typed value."""
        if self.tag == "struct":
            return any(f.kind.typed for f in self.fields)
        return self.tag == "array" and self.element is not None and self.element.typed

    def spark_type(self) -> T.DataType:
        if self.tag == "decimal":
            return T.DecimalType(MAX_DECIMAL_DIGITS, self.scale)
        if self.tag == "struct" and not self.nested:
            return T.VariantType()
        if self.tag == "struct":
            return T.StructType([T.StructField(f.column, f.kind.spark_type()) for f in self.fields if f.kind.typed])
        if self.tag == "array":
            element = self.element
            return T.ArrayType(element.spark_type() if element is not None and element.typed else T.VariantType())
        return _ATOMIC[self.tag]

    def describe(self) -> str:
        """Readable type for schema-change messages (the Spark type, plus the BSON kind where it helps)."""
        if self.tag in ("oid", "uuid", "decstr", "ejson", "idtext"):
            return f"string ({self.tag})"
        return self.spark_type().simpleString().replace("variant", "VARIANT")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.tag}
        if self.tag == "decimal":
            out["s"], out["d"] = self.scale, self.digits
        if self.nonfinite:
            out["n"] = True
        if self.fields:
            out["f"] = [[f.name, f.column, f.kind.to_json()] for f in self.fields]
        if self.element is not None:
            out["e"] = self.element.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Kind:
        return cls(
            tag=data["t"],
            scale=int(data.get("s", 0)),
            digits=int(data.get("d", 0)),
            nonfinite=bool(data.get("n", False)),
            fields=tuple(Field(n, c, cls.from_json(k)) for n, c, k in data.get("f", [])),
            element=cls.from_json(data["e"]) if "e" in data else None,
        )


NULL = Kind("null")
VARIANT = Kind("variant")


def struct(fields: Iterable[tuple[str, Kind]]) -> Kind:
    """A document kind with column names equal to field names (:func:`name_columns` fixes them)."""
    return Kind("struct", fields=tuple(Field(n, n, k) for n, k in fields))


# --------------------------------------------------------------------------- Spark's variant schemas


class _SchemaText:
    """Parser of the type strings ``schema_of_variant``/``schema_of_variant_agg`` print."""

    _TOKEN = re.compile(r"\s*(`(?:[^`]|``)*`|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            match = self._TOKEN.match(text, pos)
            if match is None:
                raise ValueError(f"cannot parse variant schema at {pos}: {text[pos:pos + 40]!r}")
            self.tokens.append(match.group(1))
            pos = match.end()
        self.i = 0

    def _next(self) -> str:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def _expect(self, token: str) -> None:
        got = self._next()
        if got != token:
            raise ValueError(f"variant schema: expected {token!r}, got {got!r}")

    def parse(self) -> Any:
        """Nested Python form: ``("object", [(name, type)])``, ``("array", type)`` or a type name."""
        word = self._next().upper()
        if word == "OBJECT":
            self._expect("<")
            members: list[tuple[str, Any]] = []
            if self.tokens[self.i] == ">":
                self.i += 1
                return ("object", members)
            while True:
                raw = self._next()
                name = raw[1:-1].replace("``", "`") if raw.startswith("`") else raw
                self._expect(":")
                members.append((name, self.parse()))
                sep = self._next()
                if sep == ">":
                    return ("object", members)
                if sep != ",":
                    raise ValueError(f"variant schema: unexpected {sep!r}")
        if word == "ARRAY":
            self._expect("<")
            element = self.parse()
            self._expect(">")
            return ("array", element)
        if word == "DECIMAL" and self.i < len(self.tokens) and self.tokens[self.i] == "(":
            self.i += 1
            self._next()
            self._expect(",")
            self._next()
            self._expect(")")
        return word


Path = tuple[str | None, ...]
"""A position inside a document: field names, and None for "every element of the array"."""


@dataclass
class Questions:
    """What the variant schema alone cannot tell, to be answered by one aggregation over the values."""

    dates: list[Path] = field(default_factory=list)
    decimals: list[Path] = field(default_factory=list)
    binaries: list[Path] = field(default_factory=list)
    conflicts: list[Path] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.dates or self.decimals or self.binaries or self.conflicts)

    def within(self, known: Questions) -> bool:
        """Whether ``known`` asks all of these questions already."""
        return (
            set(self.conflicts) <= set(known.conflicts) and set(self.dates) <= set(known.dates)
            and set(self.decimals) <= set(known.decimals) and set(self.binaries) <= set(known.binaries)
        )


@dataclass(frozen=True)
class Answers:
    """Statistics per path (see :mod:`mongocdc_core.tables.typed_columns` for how they are computed)."""

    date_range: dict[Path, tuple[int | None, int | None]] = field(default_factory=dict)
    decimal: dict[Path, tuple[int, int, bool]] = field(default_factory=dict)  # scale, digits, not a number
    subtypes: dict[Path, frozenset[str]] = field(default_factory=dict)
    tags: dict[Path, frozenset[str]] = field(default_factory=dict)


def _classify(parsed: Any, path: Path, questions: Questions) -> Kind:
    if isinstance(parsed, tuple) and parsed[0] == "array":
        return Kind("array", element=_classify(parsed[1], (*path, None), questions))
    if isinstance(parsed, tuple):
        members: list[tuple[str, Any]] = parsed[1]
        names = frozenset(n for n, _ in members)
        wrapper = _WRAPPERS.get(names)
        if wrapper is None and any(n.startswith("$") for n in names) and any(
            names & key for key in _WRAPPERS
        ):
            # wrapper keys mixed with others: two BSON types (or a wrapper and a document) met here
            questions.conflicts.append(path)
            return VARIANT
        if wrapper == "date":
            questions.dates.append(path)
        elif wrapper == "decimal":
            questions.decimals.append(path)
            return Kind("decimal")
        elif wrapper == "binary":
            questions.binaries.append(path)
        elif wrapper == "double":
            return Kind("double", nonfinite=True)
        if wrapper is not None:
            return Kind(wrapper)
        return struct((name, _classify(sub, (*path, name), questions)) for name, sub in members)
    if parsed == "VOID":
        return NULL
    if parsed == "BIGINT":
        return Kind("int")
    if parsed in ("DECIMAL", "DOUBLE", "FLOAT"):
        return Kind("double")
    if parsed == "STRING":
        return Kind("string")
    if parsed == "BOOLEAN":
        return Kind("bool")
    if parsed == "VARIANT":
        questions.conflicts.append(path)
        return VARIANT
    raise ValueError(f"unexpected type {parsed!r} in the documents' variant schema")


def from_variant_schema(text: str, path: Path = ()) -> tuple[Kind, Questions]:
    """The kind of values whose merged variant schema is ``text``, and the questions it leaves open."""
    questions = Questions()
    return _classify(_SchemaText(text).parse(), path, questions), questions


def known_questions(kind: Kind, path: Path = ()) -> Questions:
    """The questions a batch will ask about the fields ``kind`` already holds (dates, decimals, binaries),
    so they can be answered in the pass that reads the batch anyway."""
    questions = Questions()
    if kind.tag == "struct":
        for f in kind.fields:
            sub = known_questions(f.kind, (*path, f.name))
            questions.dates += sub.dates
            questions.decimals += sub.decimals
            questions.binaries += sub.binaries
    elif kind.tag == "array" and kind.element is not None:
        return known_questions(kind.element, (*path, None))
    elif kind.tag == "date":
        questions.dates.append(path)
    elif kind.tag in ("decimal", "decstr"):
        questions.decimals.append(path)
    elif kind.tag in ("binary", "uuid"):
        questions.binaries.append(path)
    return questions


def _resolve(kind: Kind, path: Path, answers: Answers) -> Kind:
    if kind.tag == "struct":
        return replace(kind, fields=tuple(
            replace(f, kind=_resolve(f.kind, (*path, f.name), answers)) for f in kind.fields
        ))
    if kind.tag == "array" and kind.element is not None:
        return replace(kind, element=_resolve(kind.element, (*path, None), answers))
    if kind.tag == "date" and path in answers.date_range:
        low, high = answers.date_range[path]
        if (low is not None and low < MIN_DATE_MS) or (high is not None and high >= END_DATE_MS):
            return VARIANT  # Spark timestamps cannot hold it: the Extended JSON date stays in a variant
    if kind.tag == "decimal" and path in answers.decimal:
        scale, digits, not_a_number = answers.decimal[path]
        if not_a_number or scale + digits > MAX_DECIMAL_DIGITS:
            return Kind("decstr")
        return Kind("decimal", scale=scale, digits=digits)
    if kind.tag == "binary" and path in answers.subtypes:
        subtypes = answers.subtypes[path]
        if subtypes and subtypes <= {"04"}:
            return Kind("uuid")
        if "04" in subtypes:
            return VARIANT
    if kind.tag == "variant" and path in answers.tags:
        tags = answers.tags[path] - {"null"}
        if tags and tags <= {"int", "double", "ndouble"}:
            return Kind("double" if tags != {"int"} else "int", nonfinite="ndouble" in tags)
        if tags == {"date"}:
            return _resolve(Kind("date"), path, answers)
    return kind


def resolve(kind: Kind, answers: Answers, path: Path = ()) -> Kind:
    """``kind`` with its open questions answered (dates out of Spark's range and varying binary
    subtypes become ``variant``; decimals get their scale, or ``decstr`` when they do not fit)."""
    return _resolve(kind, path, answers)


# --------------------------------------------------------------------------- merging


def merge(old: Kind, new: Kind) -> Kind:
    """The kind holding both: numeric widening, decimal scale growth, documents and arrays field by
    field; any other difference is ``variant``."""
    if old.tag == "null":
        return new
    if new.tag == "null":
        return old
    if old.tag == "idtext" or new.tag == "idtext":
        return Kind("idtext")
    if old.tag == "variant" or new.tag == "variant":
        return VARIANT
    if {old.tag, new.tag} <= _NUMERIC:
        tag = "double" if "double" in (old.tag, new.tag) else "int"
        return Kind(tag, nonfinite=old.nonfinite or new.nonfinite)
    if {old.tag, new.tag} <= {"decimal", "decstr"}:
        if "decstr" in (old.tag, new.tag):
            return Kind("decstr")
        scale, digits = max(old.scale, new.scale), max(old.digits, new.digits)
        return Kind("decstr") if scale + digits > MAX_DECIMAL_DIGITS else Kind("decimal", scale=scale, digits=digits)
    if old.tag != new.tag:
        return VARIANT
    if old.tag == "struct":
        fields = []
        for f in old.fields:
            other = new.field(f.name)
            fields.append(replace(f, kind=merge(f.kind, other.kind)) if other is not None else f)
        fields += [f for f in new.fields if old.field(f.name) is None]
        return replace(old, fields=tuple(fields))
    if old.tag == "array":
        return Kind("array", element=merge(old.element or NULL, new.element or NULL))
    return old


def as_id(kind: Kind) -> Kind:
    """The ``_id`` column's kind: typed like any field, a readable string (``idtext``) once it varies."""
    return Kind("idtext") if kind.tag == "variant" else kind


# --------------------------------------------------------------------------- column names


def _free(candidate: str, taken: set[str]) -> str:
    if candidate.lower() not in taken:
        return candidate
    n = 2
    while f"{candidate}__{n}".lower() in taken:
        n += 1
    return f"{candidate}__{n}"


def name_columns(kind: Kind, old: Kind | None = None, *, top: bool = False) -> Kind:
    """Give every field of ``kind`` a column name: the one in ``old`` if it had the field, else its own
    name made unique (case-insensitively) among its siblings and, at the top, the reserved columns."""
    if kind.tag == "array" and kind.element is not None:
        old_element = old.element if old is not None and old.tag == "array" else None
        return replace(kind, element=name_columns(kind.element, old_element))
    if kind.tag != "struct":
        return kind
    taken: set[str] = {"_id"} if top else set()
    if top:
        taken |= {r.lower() for r in RESERVED}
    previous = {f.name: f for f in old.fields} if old is not None and old.tag == "struct" else {}
    taken |= {f.column.lower() for f in previous.values()}
    named: list[Field] = []
    for f in kind.fields:
        before = previous.get(f.name)
        if before is not None:
            column = before.column
        else:
            candidate = f.name or "_"
            if top and candidate.lower() in {r.lower() for r in RESERVED}:
                candidate = "_" + candidate
            column = _free(candidate, taken)
            taken.add(column.lower())
        named.append(Field(f.name, column, name_columns(f.kind, before.kind if before else None)))
    return replace(kind, fields=tuple(named))


# --------------------------------------------------------------------------- schema changes


def changes(old: Kind, new: Kind, prefix: str = "") -> list[str]:
    """Readable differences between two document kinds: added columns and changed types."""
    out: list[str] = []
    for f in new.fields:
        if not f.kind.typed:
            continue
        before = old.field(f.name)
        name = f"{prefix}{f.column}"
        if before is None or not before.kind.typed:
            out.append(f"added column {name} ({f.kind.describe()})")
        else:
            out += _changed(before.kind, f.kind, name)
    return out


def _changed(old: Kind, new: Kind, name: str) -> list[str]:
    """:func:`changes` of one typed column (``name``: its path)."""
    if old.nested and new.nested and old.tag == new.tag == "struct":
        return changes(old, new, name + ".")
    if old.nested and new.nested and old.tag == new.tag == "array":
        assert old.element is not None and new.element is not None
        return _changed(old.element, new.element, name + "[]")
    if old.spark_type() != new.spark_type() or old.tag != new.tag:
        return [f"field {name}: {old.describe()} -> {new.describe()}"]
    return []


def needs_rewrite(old: Kind, new: Kind) -> bool:
    """Whether existing values of two document kinds' fields must be converted (a type changed), as
    opposed to columns only added."""
    return any(_retyped(f.kind, nf.kind) for f in old.fields if (nf := new.field(f.name)) is not None)


def _retyped(old: Kind, new: Kind) -> bool:
    """:func:`needs_rewrite` of one column."""
    if not old.typed:
        return False
    if old.nested and new.nested and old.tag == new.tag == "struct":
        return needs_rewrite(old, new)
    if old.nested and new.nested and old.tag == new.tag == "array":
        assert old.element is not None and new.element is not None
        return _retyped(old.element, new.element)
    return old.spark_type() != new.spark_type() or old.tag != new.tag
