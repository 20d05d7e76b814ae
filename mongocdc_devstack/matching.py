"""Query semantics of the emulator: BSON ordering, filters, projections, updates, pipelines.

Filters, projections and most aggregation stages are evaluated by mongomock (a well-kept
pure-Python implementation of MongoDB's query language). Where mongomock differs from mongod or
lacks a feature the emulator overrides it here: BSON comparison order (``bson_sort_key``, used for
every sort and for ``_id`` keys), ``$sort``, ``$bucketAuto``, ``$unset``, ``$replaceWith``,
``$sortByCount`` and the whole update-operator language (mongomock lacks ``$mul``,
``arrayFilters`` and ``$[]``). Anything unsupported raises a ``CommandError`` with mongod's code;
nothing silently answers wrong.
"""

from __future__ import annotations

import copy
import datetime
import functools
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import bson
import mongomock
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS
from mongomock import aggregate as mm_aggregate
from mongomock import filtering as mm_filtering

from . import oplog_diff
from .errors import BAD_VALUE, CommandError, command_error

NOT_IMPLEMENTED = (238, "NotImplemented")
IMMUTABLE_FIELD = (66, "ImmutableField")
CONFLICTING_UPDATE_OPERATORS = (40, "ConflictingUpdateOperators")
TYPE_MISMATCH = (14, "TypeMismatch")
FAILED_TO_PARSE = (9, "FailedToParse")
LOCATION_40324 = (40324, "Location40324")

_EPOCH = datetime.datetime(1970, 1, 1)
_UTC_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MS = datetime.timedelta(milliseconds=1)


# --------------------------------------------------------------------------------------------
# BSON comparison order
# --------------------------------------------------------------------------------------------
def _date_ms(value: datetime.datetime) -> int:
    if value.tzinfo is None:
        return (value - _EPOCH) // _MS
    return (value - _UTC_EPOCH) // _MS


def bson_sort_key(value: Any) -> tuple[Any, ...]:
    """A tuple whose Python ordering is MongoDB's BSON comparison order.

    MinKey < null < numbers < string < object < array < binData < ObjectId < bool < date <
    timestamp < regex < MaxKey. Numbers of different types compare by value; NaN sorts below all
    other numbers. The key is hashable and equal for values mongod treats as equal (1 == 1.0), so
    it also keys ``_id`` and unique indexes.
    """
    if value is None:
        return (2,)
    if isinstance(value, bool):
        return (9, value)
    if isinstance(value, (int, float)):
        if value != value:  # NaN
            return (3, 0)
        return (3, 1, value)
    if isinstance(value, Code):  # a str subclass, compared after regular expressions
        return (13, str(value), bson_sort_key(dict(value.scope)) if value.scope is not None else ())
    if isinstance(value, str):
        return (4, value)
    if isinstance(value, ObjectId):
        return (8, value.binary)
    if isinstance(value, Mapping):
        return (5, tuple(_element_key(name, v) for name, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (6, tuple(bson_sort_key(v) for v in value))
    if isinstance(value, datetime.datetime):
        return (10, _date_ms(value))
    if isinstance(value, DatetimeMS):
        return (10, int(value))
    if isinstance(value, Decimal128):
        dec = value.to_decimal()
        if dec.is_nan():
            return (3, 0)
        return (3, 1, dec if dec.is_finite() else float(dec))
    if isinstance(value, Decimal):
        return (3, 1, value)
    if isinstance(value, Binary):
        return (7, len(value), value.subtype, bytes(value))
    if isinstance(value, (bytes, bytearray)):
        return (7, len(value), 0, bytes(value))
    if hasattr(value, "bytes") and type(value).__name__ == "UUID":
        return (7, 16, 4, value.bytes)
    if isinstance(value, Timestamp):
        return (11, value.time, value.inc)
    if isinstance(value, Regex):
        return (12, value.pattern, str(value.flags))
    if isinstance(value, re.Pattern):
        return (12, value.pattern, str(value.flags))
    if isinstance(value, MinKey):
        return (1,)
    if isinstance(value, MaxKey):
        return (15,)
    raise command_error(BAD_VALUE, f"cannot compare a value of type {type(value).__name__}")


def _element_key(name: str, value: Any) -> tuple[Any, ...]:
    key = bson_sort_key(value)
    return (key[0], name, key)


_MISSING = object()


def get_path(doc: Any, path: str) -> Any:
    """The value at a dotted path without array traversal (``_MISSING`` if absent)."""
    current = doc
    for part in path.split("."):
        if isinstance(current, Mapping):
            if part not in current:
                return _MISSING
            current = current[part]
        elif isinstance(current, list) and part.isdigit():
            index = int(part)
            if index >= len(current):
                return _MISSING
            current = current[index]
        else:
            return _MISSING
    return current


def _path_values(doc: Any, parts: Sequence[str]) -> list[Any]:
    """Every value a dotted path reaches, traversing arrays as mongod's sort does."""
    if not parts:
        return [doc]
    if isinstance(doc, Mapping):
        if parts[0] not in doc:
            return []
        return _path_values(doc[parts[0]], parts[1:])
    if isinstance(doc, list):
        found: list[Any] = []
        if parts[0].isdigit() and int(parts[0]) < len(doc):
            found.extend(_path_values(doc[int(parts[0])], parts[1:]))
        for item in doc:
            if isinstance(item, Mapping):
                found.extend(_path_values(item, parts))
        return found
    return []


def _field_sort_key(doc: Mapping[str, Any], path: str, descending: bool) -> tuple[Any, ...]:
    values = _path_values(doc, path.split("."))
    keys: list[tuple[Any, ...]] = []
    for value in values:
        if isinstance(value, list):
            keys.extend(bson_sort_key(v) for v in value) if value else keys.append((0,))
        else:
            keys.append(bson_sort_key(value))
    if not keys:
        return (2,)  # missing sorts as null
    return max(keys) if descending else min(keys)


def _sort_key_of(doc: Mapping[str, Any], path: str, descending: bool) -> tuple[Any, ...]:
    return _field_sort_key(doc, path, descending)


def parse_sort(sort: Mapping[str, Any] | None) -> list[tuple[str, int]]:
    """Validate a sort specification into (path, direction) pairs."""
    if not sort:
        return []
    spec: list[tuple[str, int]] = []
    for path, direction in sort.items():
        if isinstance(direction, Mapping):
            if direction.get("$meta") in ("textScore", "searchScore"):
                raise command_error(NOT_IMPLEMENTED, f"$meta sort on {path!r} is not supported by the emulator")
            raise command_error(BAD_VALUE, f"Illegal key in $sort specification: {path}: {direction}")
        if isinstance(direction, bool) or not isinstance(direction, (int, float)) or direction not in (1, -1):
            raise command_error(BAD_VALUE, "$sort key ordering must be 1 (for ascending) or -1 (for descending)")
        spec.append((path, int(direction)))
    return spec


def sort_documents(docs: Iterable[Mapping[str, Any]], sort: Mapping[str, Any] | None) -> list[Any]:
    """Sort documents in MongoDB order (stable; ``$natural`` keeps or reverses storage order)."""
    result = list(docs)
    for path, direction in reversed(parse_sort(sort)):
        if path == "$natural":
            if direction < 0:
                result.reverse()
            continue
        descending = direction < 0
        result.sort(key=functools.partial(_sort_key_of, path=path, descending=descending), reverse=descending)
    return result


# --------------------------------------------------------------------------------------------
# mongomock error translation
# --------------------------------------------------------------------------------------------
def _translate(exc: Exception) -> CommandError:
    if isinstance(exc, CommandError):
        return exc
    message = str(exc)
    if isinstance(exc, NotImplementedError) and "$where" in message:
        # The emulator runs no JavaScript: it answers as a mongod started with --noscripting does.
        return command_error(BAD_VALUE, "no globalScriptEngine in $where parsing")
    if isinstance(exc, NotImplementedError):
        return command_error(NOT_IMPLEMENTED, f"not supported by the emulator: {message}")
    if message.startswith("BadValue "):
        message = message[len("BadValue ") :]
    code = getattr(exc, "code", None)
    if isinstance(code, int) and code > 0:
        return CommandError(code, "Location" + str(code), message)
    return command_error(BAD_VALUE, message)


def _bson_compare(op: Callable[[Any, Any], bool], a: Any, b: Any, can_compare_types: bool = True) -> bool:
    """mongomock's comparison hook, replaced so every BSON type (Timestamp, Decimal128, MinKey,
    MaxKey, ...) compares in MongoDB's order; values of different types only compare when
    ``can_compare_types`` (query operators apply type bracketing)."""
    key_a, key_b = bson_sort_key(a), bson_sort_key(b)
    if key_a[0] != key_b[0]:
        return can_compare_types and op(key_a[0], key_b[0])
    return op(key_a, key_b)


def _bson_eq(doc_val: Any, search_val: Any) -> bool:
    """mongomock's equality hook: numbers of every BSON type (Decimal128 included) compare by
    value, as in mongod."""
    if doc_val is mm_filtering.NOTHING:
        return search_val is None
    if isinstance(doc_val, Decimal128) or isinstance(search_val, Decimal128):
        if isinstance(doc_val, list) or isinstance(search_val, list):
            return False
        return _values_equal(doc_val, search_val)
    return bool(doc_val == search_val)


_mongomock_parse = mm_aggregate._Parser.parse


def _field_name(parser: Any, spec: Mapping[str, Any], operator: str) -> str:
    field = parser.parse(spec.get("field"))
    if not isinstance(field, str):
        raise command_error((4161106, "Location4161106"), f"{operator} requires 'field' to evaluate to type String, but got {bson_type_name(field)}")
    return field


def _object_field_operator(parser: Any, operator: str, spec: Any) -> Any:
    """``$getField``, ``$setField`` and ``$unsetField`` (mongod 5.0): fields whose names contain
    dots or start with ``$``, which paths cannot address. Missing results raise KeyError, as
    mongomock's parser reports a missing value."""
    if operator == "$getField" and not isinstance(spec, Mapping):
        spec = {"field": spec}
    if not isinstance(spec, Mapping) or "field" not in spec:
        raise command_error((4161101, "Location4161101"), f"{operator} requires 'field' to be specified")
    field = _field_name(parser, spec, operator)
    try:
        source = parser.parse(spec.get("input", "$$CURRENT"))
    except KeyError:
        source = None
    if source is None or source is mm_filtering.NOTHING:
        return None
    if not isinstance(source, Mapping):
        if operator == "$getField":
            raise KeyError(field)
        raise command_error((4161105, "Location4161105"), f"{operator} requires 'input' to evaluate to type Object")
    if operator == "$getField":
        return source[field]
    result = dict(source)
    if operator == "$unsetField" or spec.get("value") == "$$REMOVE":
        result.pop(field, None)
        return result
    if "value" not in spec:
        raise command_error((4161103, "Location4161103"), "$setField requires 'value' to be specified")
    result[field] = parser.parse(spec["value"])
    return result


def _parse_expression(parser: Any, expression: Any) -> Any:
    """mongomock's expression parser plus ``$bsonSize``, ``$getField``, ``$setField`` and
    ``$unsetField`` (which mongomock lacks)."""
    if isinstance(expression, dict) and len(expression) == 1:
        operator = next(iter(expression))
        if operator in ("$getField", "$setField", "$unsetField"):
            return _object_field_operator(parser, operator, expression[operator])
        if operator == "$rand":
            if expression[operator] != {}:
                raise command_error((10065, "Location10065"), "invalid parameter: expected an object ({})")
            return random.random()
    if isinstance(expression, dict) and len(expression) == 1 and "$bsonSize" in expression:
        try:
            value = parser.parse(expression["$bsonSize"])
        except KeyError:
            return None
        if value is None or value is mm_filtering.NOTHING:
            return None
        if not isinstance(value, Mapping):
            raise command_error((31393, "Location31393"), f"$bsonSize requires a document input, found: {bson_type_name(value)}")
        return len(bson.encode(value))
    return _mongomock_parse(parser, expression)


_mongomock_in = mm_filtering._in_op


def _bson_in(doc_val: Any, search_val: Any) -> bool:
    """mongomock's ``$in`` (and, through it, ``$nin``) plus numeric equality with Decimal128."""
    if _mongomock_in(doc_val, search_val):
        return True
    candidates = doc_val if isinstance(doc_val, (list, tuple)) else [doc_val]
    return any(
        _bson_eq(value, wanted)
        for wanted in search_val
        if _is_number(wanted)
        for value in candidates
        if _is_number(value) and (isinstance(value, Decimal128) or isinstance(wanted, Decimal128))
    )


def _bson_extreme(pick: Callable[..., Any]) -> Callable[[Any], Any]:
    """``$min``/``$max`` (accumulator and expression) in BSON order: mongomock uses Python's
    ``min``/``max``, which cannot order Decimal128 against other numbers, nor mixed types."""

    def accumulate(values: Any) -> Any:
        present = [v for v in values if v is not None and v is not mm_filtering.NOTHING]
        return pick(present, key=bson_sort_key) if present else None

    return accumulate


mm_aggregate._GROUPING_OPERATOR_MAP["$min"] = _bson_extreme(min)
mm_aggregate._GROUPING_OPERATOR_MAP["$max"] = _bson_extreme(max)
setattr(mm_aggregate._Parser, "parse", _parse_expression)  # noqa: B010 (a deliberate override)
#: ``$type`` as mongod takes it: aliases or numeric codes, alone or in an array, plus ``"number"``.
_TYPE_TESTS: dict[str, Callable[[Any], bool]] = {
    "double": lambda v: isinstance(v, float),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, Mapping),
    "array": lambda v: isinstance(v, list),
    "binData": lambda v: isinstance(v, (bytes, Binary)),
    "undefined": lambda v: False,
    "objectId": lambda v: isinstance(v, ObjectId),
    "bool": lambda v: isinstance(v, bool),
    "date": lambda v: isinstance(v, (datetime.datetime, DatetimeMS)),
    "null": lambda v: v is None,
    "regex": lambda v: isinstance(v, (Regex, re.Pattern)),
    "dbPointer": lambda v: False,
    "javascript": lambda v: isinstance(v, Code) and v.scope is None,
    "symbol": lambda v: False,
    "javascriptWithScope": lambda v: isinstance(v, Code) and v.scope is not None,
    "int": lambda v: isinstance(v, int) and not isinstance(v, (bool, Int64)) and -(2**31) <= v < 2**31,
    "timestamp": lambda v: isinstance(v, Timestamp),
    "long": lambda v: isinstance(v, Int64) or (isinstance(v, int) and not isinstance(v, bool) and not -(2**31) <= v < 2**31),
    "decimal": lambda v: isinstance(v, Decimal128),
    "minKey": lambda v: isinstance(v, MinKey),
    "maxKey": lambda v: isinstance(v, MaxKey),
}
_TYPE_CODES = {1: "double", 2: "string", 3: "object", 4: "array", 5: "binData", 6: "undefined", 7: "objectId",
               8: "bool", 9: "date", 10: "null", 11: "regex", 12: "dbPointer", 13: "javascript", 14: "symbol",
               15: "javascriptWithScope", 16: "int", 17: "timestamp", 18: "long", 19: "decimal", -1: "minKey",
               127: "maxKey"}
_NUMBER_TYPES = ("double", "int", "long", "decimal")


def _type_names(spec: Any) -> list[str]:
    names: list[str] = []
    for item in spec if isinstance(spec, list) else [spec]:
        if isinstance(item, (int, float)) and not isinstance(item, bool) and int(item) in _TYPE_CODES:
            names.append(_TYPE_CODES[int(item)])
        elif item == "number":
            names.extend(_NUMBER_TYPES)
        elif isinstance(item, str) and item in _TYPE_TESTS:
            names.append(item)
        else:
            raise command_error(BAD_VALUE, f"Unknown type name alias: {item}")
    return names


def _type_op(doc_val: Any, spec: Any, in_array: bool = False) -> bool:
    names = _type_names(spec)
    if any(_TYPE_TESTS[name](doc_val) for name in names):
        return True
    return isinstance(doc_val, list) and not in_array and any(_type_op(v, spec, in_array=True) for v in doc_val)


mm_filtering.bson_compare = _bson_compare
mm_filtering.operator_eq = _bson_eq
mm_filtering._filterer_inst._operator_map["$eq"] = mm_filtering._list_expand(_bson_eq)
mm_filtering._in_op = _bson_in  # ``$nin`` looks the module global up at call time
mm_filtering._filterer_inst._operator_map["$in"] = _bson_in
mm_filtering._filterer_inst._operator_map["$type"] = _type_op

_MOCK_ERRORS = (mongomock.OperationFailure, NotImplementedError, ValueError, TypeError, KeyError)


# --------------------------------------------------------------------------------------------
# filters
# --------------------------------------------------------------------------------------------
def validate_filter(query: Any) -> None:
    """Reject malformed filters and unknown operators even when no document is examined."""
    if not isinstance(query, Mapping):
        raise command_error(TYPE_MISMATCH, "filter must be an object")
    if query:
        matches(query, {})


def _numbers_by_value(query: Mapping[str, Any]) -> Mapping[str, Any]:
    """``query`` with implicit equality to a number spelled ``{$eq: n}``.

    mongomock's implicit equality uses Python ``==``, for which ``Decimal128('1') != 1``; mongod
    compares numbers of all types by value, which the ``$eq`` hook above does.
    """
    changed: dict[str, Any] = {}
    for key, value in query.items():
        if key in ("$and", "$or", "$nor") and isinstance(value, list):
            parts = [_numbers_by_value(part) if isinstance(part, Mapping) else part for part in value]
            if any(new is not old for new, old in zip(parts, value, strict=True)):
                changed[key] = parts
        elif key.startswith("$"):
            continue
        elif _is_number(value):
            changed[key] = {"$eq": value}
        elif isinstance(value, Mapping) and isinstance(value.get("$elemMatch"), Mapping):
            inner = _numbers_by_value(value["$elemMatch"])
            if inner is not value["$elemMatch"]:
                changed[key] = {**value, "$elemMatch": inner}
    return {**query, **changed} if changed else query


_last_rewrite: tuple[Any, Mapping[str, Any]] = (None, {})  # (query, its rewrite): filters run per document


def matches(query: Mapping[str, Any], doc: Mapping[str, Any]) -> bool:
    """Whether ``doc`` satisfies the filter ``query`` (mongod's matching rules, via mongomock)."""
    global _last_rewrite
    if not query:
        return True
    last = _last_rewrite
    if last[0] is query:
        rewritten = last[1]
    else:
        rewritten = _numbers_by_value(query)
        _last_rewrite = (query, rewritten)
    try:
        return bool(mm_filtering.filter_applies(rewritten, doc))
    except KeyError:
        # mongomock's $expr raises KeyError for a missing field, which mongod evaluates as
        # missing; no document with a missing field can then satisfy the expression.
        return False
    except _MOCK_ERRORS as exc:
        raise _translate(exc) from exc


_SYSTEM_VARIABLES = frozenset({"ROOT", "CURRENT", "REMOVE", "NOW", "CLUSTER_TIME", "DESCEND", "PRUNE", "KEEP",
                               "SEARCH_META", "USER_ROLES"})  # fmt: skip


def bind_variables(expression: Any, variables: Mapping[str, Any] | None) -> Any:
    """``expression`` with the command's ``let`` variables (``$$name``, ``$$name.path``) replaced by
    their values as literals, which is how mongod evaluates them in ``$expr`` and pipelines."""
    if not variables:
        return expression
    for name in variables:
        if not isinstance(name, str) or not name or name in _SYSTEM_VARIABLES or not (name[0].islower() or name[0] == "_"):
            raise command_error((16867, "Location16867"), f"'{name}' starts with an invalid character for a user variable name")

    def bind(value: Any) -> Any:
        if isinstance(value, str) and value.startswith("$$"):
            name, _, path = value[2:].partition(".")
            if name in variables:
                found = variables[name] if not path else get_path(variables[name], path)
                return {"$literal": None if found is _MISSING else found}
            return value
        if isinstance(value, Mapping):
            if set(value) == {"$literal"}:
                return value
            return {key: bind(item) for key, item in value.items()}
        if isinstance(value, list):
            return [bind(item) for item in value]
        return value

    return bind(expression)


def evaluate_constant(expression: Any) -> Any:
    """An aggregation expression without field paths (a ``let`` value) evaluated once."""
    if isinstance(expression, (Mapping, list)) or (isinstance(expression, str) and expression.startswith("$")):
        try:
            return mm_aggregate._parse_expression(expression, {}, ignore_missing_keys=False)
        except KeyError:
            return None
        except _MOCK_ERRORS as exc:
            raise _translate(exc) from exc
    return expression


def collation_key(collation: Mapping[str, Any] | None) -> Callable[[Any], Any] | None:
    """A function folding strings the way a collation compares them (None: binary comparison).

    Strength 1 ignores case and diacritics, strength 2 case only (``caseLevel`` off); higher
    strengths and the ``simple`` locale compare as stored. This covers what a query or update
    matches; mongod's full ICU ordering of different strings is not reproduced.
    """
    if not collation:
        return None
    if not isinstance(collation, Mapping):
        raise command_error(TYPE_MISMATCH, "collation must be an object")
    if "locale" not in collation:
        raise command_error((40414, "Location40414"), "BSON field 'locale' is missing but a required field")
    strength = collation.get("strength", 3)
    if collation["locale"] == "simple" or strength not in (1, 2):
        return None
    import unicodedata

    def fold_text(text: str) -> str:
        text = text.casefold()
        if strength == 1:
            text = "".join(ch for ch in unicodedata.normalize("NFD", text) if not unicodedata.combining(ch))
        return text

    def fold(value: Any) -> Any:
        if isinstance(value, str):
            return fold_text(value)
        if isinstance(value, Mapping):
            return {key: fold(item) for key, item in value.items()}
        if isinstance(value, list):
            return [fold(item) for item in value]
        return value

    return fold


class _Uncompilable(Exception):
    """A filter ``compile_filter`` leaves to the general matcher."""


Predicate = Callable[[Mapping[str, Any]], bool]
_SCALARS = (str, int, float, bool, type(None), ObjectId, datetime.datetime)


def compile_filter(query: Mapping[str, Any]) -> Predicate | None:
    """A predicate equal to ``matches(query, doc)``, built once, for filters of the usual operators
    (equality, ``$eq``/``$ne``/``$in``/``$nin``/``$regex``/``$not``/``$exists``, ``$and``/``$or``/
    ``$nor``) on scalar values — as a change stream's ``$match`` stages are. Documents whose value at a
    path is an array or a document are passed to the general matcher. None: not compilable."""
    try:
        compiled = _compile_query(query)
    except _Uncompilable:
        return None

    def predicate(doc: Mapping[str, Any]) -> bool:
        result = compiled(doc)
        return matches(query, doc) if result is None else result

    return predicate


def _compile_query(query: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool | None]:
    tests = []
    for key, condition in query.items():
        if key in ("$and", "$or", "$nor"):
            if not isinstance(condition, list) or not condition:
                raise _Uncompilable
            parts = [_compile_query(part) for part in condition if isinstance(part, Mapping)]
            if len(parts) != len(condition):
                raise _Uncompilable
            tests.append(_combine(key, parts))
        elif key.startswith("$"):
            raise _Uncompilable
        else:
            tests.append(_compile_path(key, condition))

    def conjunction(doc: Mapping[str, Any]) -> bool | None:
        for test in tests:
            result = test(doc)
            if result is not True:
                return result
        return True

    return conjunction


def _combine(operator: str, parts: list[Callable[[Mapping[str, Any]], bool | None]]) -> Callable[[Mapping[str, Any]], bool | None]:
    def combined(doc: Mapping[str, Any]) -> bool | None:
        results = [part(doc) for part in parts]
        if None in results:
            return None
        if operator == "$and":
            return all(results)
        if operator == "$or":
            return any(results)
        return not any(results)

    return combined


def _compile_path(path: str, condition: Any) -> Callable[[Mapping[str, Any]], bool | None]:
    parts = path.split(".")
    value_test = _compile_value(condition)

    def test(doc: Mapping[str, Any]) -> bool | None:
        current: Any = doc
        for part in parts:
            if isinstance(current, Mapping):
                current = current.get(part, _MISSING)
            elif current is _MISSING:
                break
            else:
                return None  # through an array or a scalar: the general matcher decides
        if isinstance(current, (list, Mapping)):
            return None
        return value_test(current)

    return test


def _scalar_equal(value: Any, wanted: Any) -> bool:
    if wanted is None:
        return value is None or value is _MISSING
    if value is _MISSING or value is None:
        return False
    if isinstance(wanted, bool) or isinstance(value, bool):
        return type(value) is type(wanted) and value == wanted
    if isinstance(wanted, (int, float)) and isinstance(value, (int, float)):
        return bool(value == wanted)
    return type(value) is type(wanted) and bool(value == wanted)


def _regex_test(pattern: Any, options: str = "") -> Callable[[Any], bool]:
    if isinstance(pattern, re.Pattern):
        compiled = pattern
    elif isinstance(pattern, Regex):
        compiled = pattern.try_compile()
    elif isinstance(pattern, str):
        flags = (re.IGNORECASE if "i" in options else 0) | (re.MULTILINE if "m" in options else 0) | \
            (re.DOTALL if "s" in options else 0) | (re.VERBOSE if "x" in options else 0)  # fmt: skip
        compiled = re.compile(pattern, flags)
    else:
        raise _Uncompilable
    return lambda value: isinstance(value, str) and compiled.search(value) is not None


def _compile_value(condition: Any) -> Callable[[Any], bool]:
    if isinstance(condition, (re.Pattern, Regex)):
        return _regex_test(condition)
    if isinstance(condition, Mapping):
        if not condition or not all(key.startswith("$") for key in condition):
            raise _Uncompilable
        tests = [_compile_operator(op, operand, condition) for op, operand in condition.items() if op != "$options"]
        return lambda value: all(test(value) for test in tests)
    if isinstance(condition, _SCALARS):
        return lambda value: _scalar_equal(value, condition)
    raise _Uncompilable


def _equals(wanted: Any) -> Callable[[Any], bool]:
    return lambda value: _scalar_equal(value, wanted)


def _compile_operator(op: str, operand: Any, condition: Mapping[str, Any]) -> Callable[[Any], bool]:
    if op == "$eq" and isinstance(operand, _SCALARS):
        return lambda value: _scalar_equal(value, operand)
    if op == "$ne" and isinstance(operand, _SCALARS):
        return lambda value: not _scalar_equal(value, operand)
    if op in ("$in", "$nin") and isinstance(operand, list):
        members = [_regex_test(item) if isinstance(item, (re.Pattern, Regex)) else _equals(item)
                   for item in operand if isinstance(item, (re.Pattern, Regex, *_SCALARS))]  # fmt: skip
        if len(members) != len(operand):
            raise _Uncompilable
        if op == "$in":
            return lambda value: any(member(value) for member in members)
        return lambda value: not any(member(value) for member in members)
    if op == "$regex":
        options = condition.get("$options", "")
        return _regex_test(operand, options if isinstance(options, str) else "")
    if op == "$not":
        inner = _compile_value(operand)
        return lambda value: not inner(value)
    if op == "$exists":
        return lambda value: (value is not _MISSING) == bool(operand)
    raise _Uncompilable


def filter_documents(docs: Iterable[Mapping[str, Any]], query: Mapping[str, Any] | None) -> list[Any]:
    if not query:
        return list(docs)
    validate_filter(query)
    return [d for d in docs if matches(query, d)]


# --------------------------------------------------------------------------------------------
# projections
# --------------------------------------------------------------------------------------------
_PROJECTOR: Any = mongomock.MongoClient().get_database("projector").get_collection("projector")


def project(doc: Mapping[str, Any], projection: Mapping[str, Any] | None) -> Any:
    """Apply a find projection; an empty projection returns the document unchanged (no copy)."""
    if not projection:
        return doc
    try:
        return _PROJECTOR._copy_only_fields(doc, dict(projection), dict)
    except _MOCK_ERRORS as exc:
        raise _translate(exc) from exc


# --------------------------------------------------------------------------------------------
# updates
# --------------------------------------------------------------------------------------------
UPDATE_OPERATORS = frozenset(
    {
        "$set", "$unset", "$inc", "$mul", "$min", "$max", "$rename", "$setOnInsert",
        "$currentDate", "$push", "$addToSet", "$pop", "$pull", "$pullAll", "$bit",
    }
)  # fmt: skip


def is_operator_update(update: Mapping[str, Any]) -> bool:
    """True for ``{$set: ...}``-style updates, False for replacement documents."""
    return any(key.startswith("$") for key in update)


def validate_update(update: Any) -> None:
    """mongod's parse errors for an update document or pipeline."""
    if isinstance(update, list):
        for stage in update:
            if not isinstance(stage, Mapping) or len(stage) != 1:
                raise command_error(FAILED_TO_PARSE, "A pipeline stage specification object must contain exactly one field.")
            name = next(iter(stage))
            if name not in ("$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith"):
                raise command_error(
                    (72, "InvalidOptions"),
                    f"{name} is not allowed to be used within an update",
                )
        return
    if not isinstance(update, Mapping):
        raise command_error(FAILED_TO_PARSE, "Update argument must be either an object or an array")
    if not is_operator_update(update):
        for key in update:
            if key.startswith("$"):
                raise command_error(BAD_VALUE, f"The dollar ($) prefixed field '{key}' in '{key}' is not allowed in the context of an update's replacement document.")
        return
    for key, value in update.items():
        if key not in UPDATE_OPERATORS:
            raise command_error(
                FAILED_TO_PARSE,
                f"Unknown modifier: {key}. Expected a valid update modifier or pipeline-style update "
                "specified as an array",
            )
        if not isinstance(value, Mapping):
            raise command_error(
                FAILED_TO_PARSE,
                f"Modifiers operate on fields but we found type {type(value).__name__} instead. For example: "
                "{$mod: {<field>: ...}} not {$set: <value>}",
            )


def _number_result(a: Any, b: Any, result: Any) -> Any:
    if isinstance(a, Decimal128) or isinstance(b, Decimal128):
        return Decimal128(Decimal(str(result)))
    if isinstance(result, int) and not isinstance(result, bool):
        if isinstance(a, Int64) or isinstance(b, Int64) or not -(2**31) <= result < 2**31:
            return Int64(result)
    return result


def _as_number(value: Any) -> Any:
    if isinstance(value, Decimal128):
        return value.to_decimal()
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal128)) and not isinstance(value, bool)


def _values_equal(a: Any, b: Any) -> bool:
    return bson_sort_key(a) == bson_sort_key(b)


class _UpdateContext:
    """Everything one update needs besides the document: query, array filters, insert flag."""

    def __init__(
        self,
        doc_id: Any,
        query: Mapping[str, Any],
        array_filters: Sequence[Mapping[str, Any]] | None,
        is_insert: bool,
        now: datetime.datetime,
        now_ts: Timestamp | None,
    ) -> None:
        self.doc_id = doc_id
        self.query = query
        self.is_insert = is_insert
        self.now = now
        self.now_ts = now_ts
        self.filters: dict[str, dict[str, Any]] = {}
        for spec in array_filters or ():
            if not isinstance(spec, Mapping) or not spec:
                raise command_error(FAILED_TO_PARSE, "Cannot use an expression without a top-level field name in arrayFilters")
            idents = {key.split(".", 1)[0] for key in spec}
            if len(idents) != 1:
                raise command_error(FAILED_TO_PARSE, "Error parsing array filter :: caused by :: Expected a single top-level field name, found "
                                    + " and ".join(sorted(idents)))  # fmt: skip
            ident = idents.pop()
            if ident in self.filters:
                raise command_error(FAILED_TO_PARSE, f"Found multiple array filters with the same top-level field name {ident}")
            self.filters[ident] = {
                ("v" + key[len(ident) :]): value for key, value in spec.items()
            }
        self.used_filters: set[str] = set()

    def element_matches(self, ident: str, element: Any) -> bool:
        if ident not in self.filters:
            raise command_error(BAD_VALUE, f"No array filter found for identifier '{ident}' in path")
        self.used_filters.add(ident)
        return matches(self.filters[ident], {"v": element})

    def positional_index(self, doc: Mapping[str, Any], prefix: Sequence[str], array: list[Any]) -> int:
        """Index of the first array element that satisfies the query's conditions on the array."""
        prefix_path = ".".join(prefix)
        relevant = {
            key: value
            for key, value in self.query.items()
            if key == prefix_path or key.startswith(prefix_path + ".")
        }
        if relevant:
            for index, element in enumerate(array):
                probe = copy.copy(dict(doc))
                _set_path_value(probe, list(prefix), [element])
                if matches(relevant, probe):
                    return index
        raise command_error(BAD_VALUE, "The positional operator did not find the match needed from the query.")


def _set_path_value(doc: dict[str, Any], parts: list[str], value: Any) -> None:
    current: Any = doc
    for part in parts[:-1]:
        current = current[int(part)] if isinstance(current, list) else current.setdefault(part, {})
    if isinstance(current, list):
        current[int(parts[-1])] = value
    else:
        current[parts[-1]] = value


def _expand_paths(root: dict[str, Any], node: Any, parts: list[str], done: list[str], ctx: _UpdateContext) -> list[list[str]]:
    """Concrete paths for a path with ``$``, ``$[]`` and ``$[ident]`` placeholders."""
    for position, part in enumerate(parts):
        if part == "$" or (part.startswith("$[") and part.endswith("]")):
            prefix = done + parts[:position]
            array = get_path(root, ".".join(prefix)) if prefix else _MISSING
            if not isinstance(array, list):
                raise command_error(
                    BAD_VALUE,
                    f"The path '{'.'.join(prefix)}' must exist in the document in order to apply array updates.",
                )
            rest = parts[position + 1 :]
            if part == "$":
                indices = [ctx.positional_index(root, prefix, array)]
            elif part == "$[]":
                indices = list(range(len(array)))
            else:
                ident = part[2:-1]
                indices = [i for i, element in enumerate(array) if ctx.element_matches(ident, element)]
            result: list[list[str]] = []
            for index in indices:
                result.extend(_expand_paths(root, array[index], rest, prefix + [str(index)], ctx))
            return result
    return [done + parts]


def _resolve_parent(doc: dict[str, Any], parts: list[str], create: bool) -> Any:
    """The container holding the last path part (created as needed when ``create``)."""
    current: Any = doc
    for index, part in enumerate(parts[:-1]):
        if isinstance(current, list):
            if not part.isdigit():
                raise command_error(
                    (28, "PathNotViable"),
                    f"Cannot create field '{part}' in element {{{'.'.join(parts[:index])}: [...]}}",
                )
            position = int(part)
            if position >= len(current):
                if not create:
                    return None
                current.extend([None] * (position + 1 - len(current)))
                current[position] = {}
            if current[position] is None and create:
                current[position] = {}
            current = current[position]
        elif isinstance(current, dict):
            if part not in current:
                if not create:
                    return None
                current[part] = {}
            current = current[part]
        else:
            if not create:
                return None
            raise command_error(
                (28, "PathNotViable"),
                f"Cannot create field '{part}' in element {{{parts[index - 1] if index else ''}: {current!r}}}",
            )
    if not isinstance(current, (dict, list)):
        if not create:
            return None
        raise command_error(
            (28, "PathNotViable"), f"Cannot create field '{parts[-1]}' in element {{{'.'.join(parts[:-1])}: {current!r}}}"
        )
    return current


def _get_in(parent: Any, key: str) -> Any:
    if isinstance(parent, list):
        if not key.isdigit():
            return _MISSING
        index = int(key)
        return parent[index] if index < len(parent) else _MISSING
    return parent.get(key, _MISSING)


def _put_in(parent: Any, key: str, value: Any) -> None:
    if isinstance(parent, list):
        if not key.isdigit():
            raise command_error((28, "PathNotViable"), f"Cannot create field '{key}' in an array")
        index = int(key)
        if index >= len(parent):
            parent.extend([None] * (index + 1 - len(parent)))
        parent[index] = value
    else:
        parent[key] = value


def bson_type_name(value: Any) -> str:
    """mongod's name for a value's BSON type, as its error messages write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Int64):
        return "long"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _apply_array_modifiers(current: list[Any], spec: Mapping[str, Any]) -> list[Any]:
    unknown = set(spec) - {"$each", "$slice", "$sort", "$position"}
    if unknown:
        raise command_error(BAD_VALUE, f"Unrecognized clause in $push: {sorted(unknown)[0]}")
    each = spec.get("$each")
    if not isinstance(each, list):
        raise command_error(BAD_VALUE, "The argument to $each in $push must be an array")
    position = spec.get("$position")
    items = copy.deepcopy(each)
    if position is None:
        current.extend(items)
    else:
        index = int(position)
        if index < 0:
            index = max(0, len(current) + index)
        current[index:index] = items
    if "$sort" in spec:
        order = spec["$sort"]
        if isinstance(order, Mapping):
            current[:] = sort_documents(current, order)
        elif order in (1, -1):
            current.sort(key=bson_sort_key, reverse=order == -1)
        else:
            raise command_error(BAD_VALUE, "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort embedded fields")
    if "$slice" in spec:
        limit = int(spec["$slice"])
        current[:] = current[:limit] if limit >= 0 else current[limit:]
    return current


def _apply_one(op: str, doc: dict[str, Any], parts: list[str], value: Any, ctx: _UpdateContext) -> None:
    path = ".".join(parts)
    if op == "$rename":
        if not isinstance(value, str) or not value:
            raise command_error(BAD_VALUE, f"The 'to' field for $rename must be a string: {path}: {value!r}")
        parent = _resolve_parent(doc, parts, create=False)
        if parent is None or isinstance(parent, list):
            return
        moved = parent.get(parts[-1], _MISSING)
        if moved is _MISSING:
            return
        del parent[parts[-1]]
        target = value.split(".")
        _put_in(_resolve_parent(doc, target, create=True), target[-1], moved)
        return
    if op == "$unset":
        parent = _resolve_parent(doc, parts, create=False)
        if isinstance(parent, dict):
            parent.pop(parts[-1], None)
        elif isinstance(parent, list) and parts[-1].isdigit() and int(parts[-1]) < len(parent):
            parent[int(parts[-1])] = None
        return
    if op in ("$pop", "$pull", "$pullAll"):
        parent = _resolve_parent(doc, parts, create=False)
        current = _MISSING if parent is None else _get_in(parent, parts[-1])
        if current is _MISSING:
            return
        if not isinstance(current, list):
            raise command_error(BAD_VALUE, f"Cannot apply {op} to a non-array value")
        if op == "$pop":
            if value not in (1, -1):
                raise command_error(FAILED_TO_PARSE, f"$pop expects 1 or -1, found: {value}")
            if current:
                current.pop(-1 if value == 1 else 0)
        elif op == "$pullAll":
            if not isinstance(value, list):
                raise command_error(BAD_VALUE, f"$pullAll requires an array argument but was given a {bson_type_name(value)}")
            keys = {bson_sort_key(v) for v in value}
            current[:] = [item for item in current if bson_sort_key(item) not in keys]
        else:
            current[:] = [item for item in current if not _pull_matches(value, item)]
        return
    parent = _resolve_parent(doc, parts, create=True)
    current = _get_in(parent, parts[-1])
    if op in ("$set", "$setOnInsert"):
        _put_in(parent, parts[-1], copy.deepcopy(value))
    elif op in ("$inc", "$mul"):
        if not _is_number(value):
            raise command_error(TYPE_MISMATCH, f"Cannot {op[1:]}rement with non-numeric argument: {{{path}: {value!r}}}"
                                if op == "$inc" else f"Cannot multiply with non-numeric argument: {{{path}: {value!r}}}")  # fmt: skip
        if current is _MISSING:
            base: Any = 0
        elif not _is_number(current):
            raise command_error(
                TYPE_MISMATCH,
                f"Cannot apply {op} to a value of non-numeric type. {{_id: {ctx.doc_id!r}}} has the field "
                f"'{parts[-1]}' of non-numeric type {bson_type_name(current)}",
            )
        else:
            base = current
        a, b = _as_number(base), _as_number(value)
        if isinstance(a, Decimal) != isinstance(b, Decimal):
            a, b = Decimal(str(a)), Decimal(str(b))
        result = a + b if op == "$inc" else a * b
        _put_in(parent, parts[-1], _number_result(current if current is not _MISSING else value, value, result))
    elif op in ("$min", "$max"):
        if current is _MISSING:
            _put_in(parent, parts[-1], copy.deepcopy(value))
        else:
            smaller = bson_sort_key(value) < bson_sort_key(current)
            if smaller == (op == "$min") and not _values_equal(value, current):
                _put_in(parent, parts[-1], copy.deepcopy(value))
    elif op == "$currentDate":
        kind = value.get("$type") if isinstance(value, Mapping) else ("date" if value is True else None)
        if kind == "date" or value is True:
            _put_in(parent, parts[-1], ctx.now)
        elif kind == "timestamp":
            _put_in(parent, parts[-1], ctx.now_ts or Timestamp(int(ctx.now.timestamp()), 1))
        else:
            raise command_error(BAD_VALUE, f"{value!r} is not valid type for $currentDate. Please use a boolean ('true') or a $type expression ({{$type: 'timestamp/date'}}).")
    elif op in ("$push", "$addToSet"):
        if current is _MISSING:
            current = []
            _put_in(parent, parts[-1], current)
        elif not isinstance(current, list):
            raise command_error(
                BAD_VALUE,
                f"The field '{path}' must be an array but is of type {bson_type_name(current)} in document {{_id: {ctx.doc_id!r}}}",
            )
        if op == "$push":
            if isinstance(value, Mapping) and "$each" in value:
                _apply_array_modifiers(current, value)
            else:
                current.append(copy.deepcopy(value))
        else:
            items = value["$each"] if isinstance(value, Mapping) and "$each" in value else [value]
            for item in items:
                if not any(_values_equal(item, existing) for existing in current):
                    current.append(copy.deepcopy(item))
    elif op == "$bit":
        if not isinstance(value, Mapping) or not value:
            raise command_error(BAD_VALUE, "$bit should be a document with at least one of and/or/xor")
        result_value = 0 if current is _MISSING else current
        if not isinstance(result_value, int) or isinstance(result_value, bool):
            raise command_error(BAD_VALUE, f"Cannot apply $bit to a value of non-integral type.{{_id: {ctx.doc_id!r}}} has the field {parts[-1]} of non-integer type {bson_type_name(result_value)}")
        for kind, operand in value.items():
            if kind == "and":
                result_value &= operand
            elif kind == "or":
                result_value |= operand
            elif kind == "xor":
                result_value ^= operand
            else:
                raise command_error(BAD_VALUE, f"The $bit modifier only supports 'and', 'or', and 'xor', not '{kind}' which is an unknown operator: {{{kind}: {operand}}}")
        _put_in(parent, parts[-1], _number_result(current if current is not _MISSING else 0, 0, result_value))


def _pull_matches(condition: Any, item: Any) -> bool:
    if isinstance(condition, Mapping) and condition:
        if all(key.startswith("$") for key in condition):
            return matches({"v": condition}, {"v": item})
        if isinstance(item, Mapping):
            return matches(condition, item)
        return False
    return _values_equal(condition, item)


def _check_conflicts(update: Mapping[str, Any]) -> None:
    seen: list[tuple[str, str]] = []
    for op, fields in update.items():
        for path in fields:
            targets = [path]
            if op == "$rename" and isinstance(fields[path], str):
                targets.append(fields[path])
            for target in targets:
                for _other_op, other in seen:
                    if target == other or target.startswith(other + ".") or other.startswith(target + "."):
                        raise command_error(
                            CONFLICTING_UPDATE_OPERATORS,
                            f"Updating the path '{target}' would create a conflict at '{other if len(other) <= len(target) else target}'",
                        )
                seen.append((op, target))


def apply_update(
    doc: Mapping[str, Any],
    update: Mapping[str, Any] | list[Any],
    *,
    query: Mapping[str, Any] | None = None,
    array_filters: Sequence[Mapping[str, Any]] | None = None,
    is_insert: bool = False,
    now_ts: Timestamp | None = None,
) -> dict[str, Any]:
    """Return the document after an update (operators, replacement or pipeline); input untouched."""
    return apply_update_with_diff(doc, update, query=query, array_filters=array_filters, is_insert=is_insert,
                                  now_ts=now_ts)[0]  # fmt: skip


def _path_order(path: str) -> tuple[tuple[int, int, str], ...]:
    """mongod applies the modifiers of an update in field-name order (array indexes numerically),
    whatever their order in the update document — which decides where new fields go."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.split("."))


def _parts_value(doc: Any, parts: Sequence[str]) -> Any:
    """The value at a path of components (names or indexes; names may contain dots), or _MISSING."""
    current = doc
    for part in parts:
        if isinstance(current, Mapping):
            if part not in current:
                return _MISSING
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return _MISSING
    return current


def _existing_depth(doc: Any, parts: Sequence[str]) -> int:
    """How many leading components of a path exist in ``doc``."""
    current = doc
    for depth, part in enumerate(parts):
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return depth
    return len(parts)


def _plain_push(value: Any) -> bool:
    return not (isinstance(value, Mapping) and any(k in value for k in ("$position", "$sort", "$slice")))


def _apply_logged(op: str, doc: dict[str, Any], parts: list[str], value: Any, ctx: _UpdateContext,
                  log: oplog_diff.UpdateLog) -> None:  # fmt: skip
    """Apply one modifier to one concrete path and log what it did, as mongod's modifiers do."""
    if op == "$rename":
        moved = _parts_value(doc, parts)
        target = str(value).split(".") if isinstance(value, str) else []
        target_depth = _existing_depth(doc, target)
        _apply_one(op, doc, parts, value, ctx)
        if moved is not _MISSING and _parts_value(doc, parts) is _MISSING:
            log.deleted(parts)
            if target_depth == len(target):
                log.updated(target)
            else:
                log.created(target[: target_depth + 1])
        return
    depth = _existing_depth(doc, parts)
    before = copy.deepcopy(_parts_value(doc, parts)) if depth == len(parts) else _MISSING
    _apply_one(op, doc, parts, value, ctx)
    after = _parts_value(doc, parts)
    if after is _MISSING:
        if before is not _MISSING:
            log.deleted(parts)
        return
    if before is _MISSING:
        log.created(parts[: depth + 1])
        return
    if oplog_diff.strict_equal(before, after):
        return  # a no-op modification is not logged
    if (op == "$push" and _plain_push(value) and isinstance(before, list) and isinstance(after, list)
            and len(after) > len(before) and all(oplog_diff.strict_equal(x, y) for x, y in zip(before, after, strict=False))):  # fmt: skip
        for index in range(len(before), len(after)):
            log.updated([*parts, str(index)])  # appended elements are logged by index
        return
    log.updated(parts)


def apply_update_with_diff(
    doc: Mapping[str, Any],
    update: Mapping[str, Any] | list[Any],
    *,
    query: Mapping[str, Any] | None = None,
    array_filters: Sequence[Mapping[str, Any]] | None = None,
    is_insert: bool = False,
    now_ts: Timestamp | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The document after an update, and for an operator update the ``$v: 2`` diff its modifiers
    logged (None for replacements and pipelines, whose oplog entry is computed from the documents)."""
    validate_update(update)
    diff: dict[str, Any] | None = None
    original_id = doc.get("_id", _MISSING)
    if isinstance(update, list):
        result = run_pipeline([copy.deepcopy(dict(doc))], update)
        if len(result) != 1:
            raise command_error(BAD_VALUE, "an update pipeline must produce exactly one document")
        new_doc = result[0]
        if original_id is not _MISSING and "_id" not in new_doc:
            new_doc = {"_id": original_id, **new_doc}  # mongod keeps the _id a pipeline dropped
    elif not is_operator_update(update):
        new_doc = {"_id": original_id} if original_id is not _MISSING else {}
        for key, value in update.items():
            if key == "_id":
                continue
            new_doc[key] = copy.deepcopy(value)
        if "_id" in update:
            if original_id is _MISSING:
                new_doc = {"_id": update["_id"], **new_doc}
            elif not _values_equal(update["_id"], original_id):
                raise command_error(
                    IMMUTABLE_FIELD,
                    f"After applying the update, the (immutable) field '_id' was found to have been altered to _id: {update['_id']!r}",
                )
    else:
        _check_conflicts(update)
        new_doc = copy.deepcopy(dict(doc))
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)
        ctx = _UpdateContext(original_id, query or {}, array_filters, is_insert, now, now_ts)
        log = oplog_diff.UpdateLog()
        modifiers = [(op, path, value) for op, fields in update.items() if op != "$setOnInsert" or is_insert
                     for path, value in fields.items()]  # fmt: skip
        for op, path, value in sorted(modifiers, key=lambda modifier: _path_order(modifier[1])):
            if not path or path.startswith(".") or path.endswith(".") or ".." in path:
                raise command_error((56, "EmptyFieldName"), f"An empty update path is not valid: {path!r}")
            for parts in _expand_paths(new_doc, new_doc, path.split("."), [], ctx):
                _apply_logged(op, new_doc, parts, value, ctx, log)
        diff = log.diff(new_doc)
        unused = set(ctx.filters) - ctx.used_filters
        if unused and not any("$[" in p for fields in update.values() for p in fields):
            raise command_error(FAILED_TO_PARSE, f"The array filter for identifier '{sorted(unused)[0]}' was not used in the update {dict(update)!r}")
    if original_id is not _MISSING and not _values_equal(new_doc.get("_id", _MISSING) if "_id" in new_doc else None, original_id):
        raise command_error(
            IMMUTABLE_FIELD,
            f"After applying the update, the (immutable) field '_id' was found to have been altered to _id: {new_doc.get('_id')!r}",
        )
    if original_id is not _MISSING and next(iter(new_doc)) != "_id":
        new_doc = {"_id": new_doc.pop("_id"), **new_doc}
    return new_doc, diff


def upsert_seed(query: Mapping[str, Any]) -> dict[str, Any]:
    """The document an upsert starts from: the query's equality conditions (mongod's rule)."""
    seed: dict[str, Any] = {}

    def absorb(conditions: Mapping[str, Any]) -> None:
        for key, value in conditions.items():
            if key == "$and" and isinstance(value, list):
                for part in value:
                    if isinstance(part, Mapping):
                        absorb(part)
                continue
            if key.startswith("$"):
                continue
            if isinstance(value, Mapping) and value and all(k.startswith("$") for k in value):
                if set(value) == {"$eq"}:
                    value = value["$eq"]
                else:
                    continue
            _set_path_value(seed, key.split("."), copy.deepcopy(value)) if "." not in key else _put_nested(seed, key, value)

    absorb(query)
    if "_id" in seed and next(iter(seed)) != "_id":
        seed = {"_id": seed.pop("_id"), **seed}
    return seed


def _put_nested(doc: dict[str, Any], path: str, value: Any) -> None:
    current = doc
    parts = path.split(".")
    for part in parts[:-1]:
        nxt = current.setdefault(part, {})
        if not isinstance(nxt, dict):
            return
        current = nxt
    current[parts[-1]] = copy.deepcopy(value)


# --------------------------------------------------------------------------------------------
# aggregation
# --------------------------------------------------------------------------------------------
KNOWN_STAGES = frozenset(
    {
        "$addFields", "$bucket", "$bucketAuto", "$changeStream", "$collStats", "$count", "$currentOp",
        "$densify", "$documents", "$facet", "$fill", "$geoNear", "$graphLookup", "$group", "$indexStats",
        "$limit", "$listLocalSessions", "$listSessions", "$lookup", "$match", "$merge", "$out",
        "$planCacheStats", "$project", "$redact", "$replaceRoot", "$replaceWith", "$sample", "$set",
        "$setWindowFields", "$skip", "$sort", "$sortByCount", "$unionWith", "$unset", "$unwind",
        "$changeStreamSplitLargeEvent", "$search", "$searchMeta", "$listSearchIndexes",
    }
)  # fmt: skip

CollectionResolver = Callable[[str], list[dict[str, Any]]]


class _ForeignCollection:
    """What mongomock's ``$lookup``/``$graphLookup`` expect from ``database.get_collection``."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self._docs = docs

    def find(self, query: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(d) for d in filter_documents(self._docs, query or {})]


class _ForeignDatabase:
    def __init__(self, resolver: CollectionResolver | None) -> None:
        self._resolver = resolver

    def get_collection(self, name: str) -> _ForeignCollection:
        if self._resolver is None:
            raise command_error(NOT_IMPLEMENTED, "this pipeline cannot read other collections")
        return _ForeignCollection(self._resolver(name))


def validate_pipeline(stages: Any) -> list[dict[str, Any]]:
    """mongod's parse errors for an aggregation pipeline."""
    if not isinstance(stages, list):
        raise command_error(TYPE_MISMATCH, "'pipeline' option must be specified as an array")
    for stage in stages:
        if not isinstance(stage, Mapping) or len(stage) != 1:
            raise command_error(
                (40323, "Location40323"), "A pipeline stage specification object must contain exactly one field."
            )
        name = next(iter(stage))
        if name not in KNOWN_STAGES:
            raise command_error(LOCATION_40324, f"Unrecognized pipeline stage name: '{name}'")
    return list(stages)


def _evaluate(expression: Any, doc: Mapping[str, Any]) -> Any:
    try:
        return mm_aggregate._parse_expression(expression, doc, ignore_missing_keys=True)
    except KeyError:
        return None


def _bucket_auto(docs: list[dict[str, Any]], options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``$bucketAuto`` as mongod computes it (mongomock does not implement it)."""
    if not isinstance(options, Mapping) or "groupBy" not in options or "buckets" not in options:
        raise command_error((40246, "Location40246"), "$bucketAuto requires 'groupBy' and 'buckets' to be specified")
    unknown = set(options) - {"groupBy", "buckets", "output", "granularity"}
    if unknown:
        raise command_error((40245, "Location40245"), f"Unrecognized option to $bucketAuto: {sorted(unknown)[0]}.")
    if "granularity" in options:
        raise command_error(NOT_IMPLEMENTED, "$bucketAuto granularity is not supported by the emulator")
    buckets = options["buckets"]
    if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets <= 0:
        raise command_error((40243, "Location40243"), f"The $bucketAuto 'buckets' field must be greater than 0, but found: {buckets}")
    output = dict(options.get("output") or {"count": {"$sum": 1}})
    keyed = sorted(((_evaluate(options["groupBy"], d), d) for d in docs), key=lambda pair: bson_sort_key(pair[0]))
    if not keyed:
        return []
    approx = max(1, round(len(keyed) / buckets))
    groups: list[list[tuple[Any, dict[str, Any]]]] = []
    index = 0
    while index < len(keyed):
        if len(groups) == buckets - 1:
            groups.append(keyed[index:])
            break
        end = min(index + approx, len(keyed))
        while end < len(keyed) and _values_equal(keyed[end][0], keyed[end - 1][0]):
            end += 1
        groups.append(keyed[index:end])
        index = end
    result = []
    for position, group in enumerate(groups):
        upper = groups[position + 1][0][0] if position + 1 < len(groups) else group[-1][0]
        accumulated = run_pipeline([d for _, d in group], [{"$group": {"_id": None, **output}}])
        fields = accumulated[0] if accumulated else {}
        fields.pop("_id", None)
        result.append({"_id": {"min": group[0][0], "max": upper}, **fields})
    return result


_PROJECTION_MISSING = object()


def _projection_tree(spec: Mapping[str, Any], top: bool = True) -> dict[str, Any]:
    """A ``$project`` specification as a tree: dotted paths and nested objects become nested
    dicts; leaves are ``True`` (include), ``False`` (exclude) or ``("expr", expression)``."""
    tree: dict[str, Any] = {}
    for key, value in spec.items():
        if not isinstance(key, str) or not key or key.startswith("$"):
            raise command_error((16410, "Location16410"), "FieldPath field names may not start with '$'. Consider using $getField or $setField.")
        if isinstance(value, Mapping) and value and not any(str(k).startswith("$") for k in value):
            leaf: Any = _projection_tree(value, top=False)
        elif isinstance(value, bool) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            leaf = bool(value)
        else:
            leaf = ("expr", value)
        parts = key.split(".")
        node = tree
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                if child is not None:
                    raise command_error((31250, "Location31250"), f"Invalid $project :: caused by :: Path collision at {key}")
                child = node[part] = {}
            node = child
        if parts[-1] in node and isinstance(node[parts[-1]], dict) and isinstance(leaf, dict):
            node[parts[-1]].update(leaf)
        else:
            node[parts[-1]] = leaf
    return tree


def _tree_mode(tree: Mapping[str, Any], top: bool = True) -> set[str]:
    modes: set[str] = set()
    for key, leaf in tree.items():
        if isinstance(leaf, dict):
            modes |= _tree_mode(leaf, top=False)
        elif isinstance(leaf, tuple) or leaf is True:
            modes.add("include")
        elif not (top and key == "_id"):
            modes.add("exclude")
    return modes


def _include(value: Any, tree: Mapping[str, Any], root: Mapping[str, Any]) -> Any:
    """Inclusion projection of one value: included fields in document order, then computed ones."""
    if isinstance(value, list):
        return [_include(item, tree, root) for item in value if isinstance(item, (Mapping, list))]
    source = value if isinstance(value, Mapping) else {}
    out: dict[str, Any] = {}
    for key, item in source.items():
        leaf = tree.get(key)
        if leaf is True:
            out[key] = item
        elif isinstance(leaf, dict) and isinstance(item, (Mapping, list)):
            out[key] = _include(item, leaf, root)
    for key, leaf in tree.items():
        if isinstance(leaf, tuple):
            try:
                result = mm_aggregate._parse_expression(leaf[1], root, ignore_missing_keys=False)
            except KeyError:
                continue
            out[key] = result
        elif isinstance(leaf, dict) and key not in out and _has_computed(leaf):
            nested = _include({}, leaf, root)
            if nested or not isinstance(source.get(key), list):
                out[key] = nested
    return out


def _has_computed(tree: Mapping[str, Any]) -> bool:
    return any(isinstance(leaf, tuple) or (isinstance(leaf, dict) and _has_computed(leaf)) for leaf in tree.values())


def _exclude(value: Any, tree: Mapping[str, Any]) -> Any:
    if isinstance(value, list):
        return [_exclude(item, tree) for item in value]
    if not isinstance(value, Mapping):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        leaf = tree.get(key)
        if leaf is False:
            continue
        out[key] = _exclude(item, leaf) if isinstance(leaf, dict) else item
    return out


def project_stage(docs: list[dict[str, Any]], spec: Any) -> list[dict[str, Any]]:
    """``$project`` as mongod evaluates it: dotted and nested paths alike, inclusion (with computed
    fields, which may also be literals) or exclusion, ``_id`` kept unless excluded."""
    if not isinstance(spec, Mapping) or not spec:
        raise command_error((51272, "Location51272"), "$project specification must be an object with at least one field")
    tree = _projection_tree(spec)
    modes = _tree_mode(tree)
    if modes == {"include", "exclude"}:
        raise command_error((31254, "Location31254"), "Invalid $project :: caused by :: Cannot do exclusion on field in inclusion projection")
    if "include" not in modes:
        return [_exclude(doc, tree) for doc in docs]
    keep_id = tree.get("_id", True)
    if "_id" not in tree:
        tree = {"_id": True, **tree}
    elif keep_id is False:
        tree = {k: v for k, v in tree.items() if k != "_id"}
    return [_include(doc, tree, doc) for doc in docs]


def sample_stage(docs: list[Any], options: Any) -> list[Any]:
    """``$sample``: ``size`` documents picked at random (all of them, shuffled, when there are fewer)."""
    if not isinstance(options, Mapping):
        raise command_error((28745, "Location28745"), "the $sample stage specification must be an object")
    size = options.get("size")
    if size is None:
        raise command_error((28749, "Location28749"), "$sample stage must specify a size")
    if not isinstance(size, int) or isinstance(size, bool):
        raise command_error((28746, "Location28746"), "size argument to $sample must be a number")
    if size < 0:
        raise command_error((28747, "Location28747"), "size argument to $sample must not be negative")
    unknown = [key for key in options if key != "size"]
    if unknown:
        raise command_error((28748, "Location28748"), f"unrecognized option to $sample: {unknown[0]}")
    return random.sample(docs, min(size, len(docs)))


def run_pipeline(
    docs: Iterable[Mapping[str, Any]],
    stages: Sequence[Mapping[str, Any]],
    resolver: CollectionResolver | None = None,
) -> list[dict[str, Any]]:
    """Run aggregation stages over documents; the input documents are never modified."""
    validate_pipeline(list(stages))
    current: list[Any] = list(docs)
    copied = False
    database = _ForeignDatabase(resolver)
    for stage in stages:
        name, options = next(iter(stage.items()))
        if name == "$match":
            current = filter_documents(current, options)
            continue
        if name == "$limit":
            if not isinstance(options, int) or isinstance(options, bool) or options <= 0:
                raise command_error((15958, "Location15958"), "the limit must be positive")
            current = current[:options]
            continue
        if name == "$skip":
            if not isinstance(options, int) or isinstance(options, bool) or options < 0:
                raise command_error((15956, "Location15956"), "Argument to $skip cannot be negative")
            current = current[options:]
            continue
        if name == "$sort":
            if not isinstance(options, Mapping) or not options:
                raise command_error((15976, "Location15976"), "$sort stage must have at least one sort key")
            current = sort_documents(current, options)
            continue
        if name == "$sample":  # only selects: picked before any copy, as mongod's random cursor reads few documents
            current = sample_stage(current, options)
            continue
        if not copied:
            current = [copy.deepcopy(dict(d)) for d in current]
            copied = True
        if name == "$bucketAuto":
            current = _bucket_auto(current, options)
        elif name == "$unset":
            fields = [options] if isinstance(options, str) else options
            if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
                raise command_error((31002, "Location31002"), "$unset specification must be a string or an array containing only string values")
            current = [project(d, {f: 0 for f in fields}) for d in current]
        elif name == "$project":
            current = project_stage(current, options)
        elif name == "$replaceWith":
            current = run_pipeline(current, [{"$replaceRoot": {"newRoot": options}}])
        elif name == "$sortByCount":
            grouped = run_pipeline(current, [{"$group": {"_id": options, "count": {"$sum": 1}}}])
            current = sort_documents(grouped, {"count": -1})
        else:
            handler = mm_aggregate._PIPELINE_HANDLERS.get(name)
            if handler is None or name in ("$out",):
                raise command_error(NOT_IMPLEMENTED, f"the {name} stage is not supported by the emulator")
            try:
                current = list(handler(current, database, options))
            except _MOCK_ERRORS as exc:
                raise _translate(exc) from exc
    return [dict(d) if not isinstance(d, dict) else d for d in current]
