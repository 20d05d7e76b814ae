"""MongoDB Extended JSON in the exact textual forms the Debezium documentation shows.

The type mapping is pymongo's :mod:`bson.json_util` (strict mode = its LEGACY mode with
``$numberLong`` for Int64 and ``{"$date": <millis>}``), the text is written by orjson. Debezium's
Java writer differs from any stock Python serializer only in whitespace: documents use
``"name": value`` and ``,`` between members, arrays use ``, ``, and event keys use
``"name" : value`` with ``, `` (the key table of the seed). orjson's indented output marks every
member boundary with a newline (strings never contain a raw newline), so three C-level regular
expression passes turn it into the wanted style. Canonical mode and values holding non-finite
doubles or ``uuid.UUID`` (which orjson would write as ``null`` / a plain string) go through
json_util's converter instead.
"""

from __future__ import annotations

import calendar
import datetime
import math
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from bson import json_util
from bson.binary import UuidRepresentation
from bson.code import Code
from bson.codec_options import DatetimeConversion
from bson.int64 import Int64
from bson.json_util import DatetimeRepresentation, JSONMode, JSONOptions
from bson.objectid import ObjectId


class EjsonMode(StrEnum):
    """Extended JSON flavour: Debezium's strict mode (the default), or MongoDB's v2 modes."""

    STRICT = "strict"
    RELAXED = "relaxed"
    CANONICAL = "canonical"


@dataclass(frozen=True, slots=True)
class JsonStyle:
    """Separators of one textual style; ``name_sep`` sits between a member name and its value."""

    name_sep: str
    item_sep: str
    array_sep: str

    def __post_init__(self) -> None:
        if self.name_sep.strip() != ":" or self.item_sep.strip() != "," or self.array_sep.strip() != ",":
            raise ValueError(f"a JSON style needs ':' and ',' separators padded only with spaces: {self!r}")


#: ``before``/``after``/``updatedFields``/``lsid`` strings (update, delete and lsid examples of 000).
DOCUMENT_STYLE = JsonStyle(": ", ",", ", ")
#: Event key ``id`` strings (table 9 of 000: ``{"$oid" : "..."}``, ``{"hi" : "kafka", "nums" : [...]}``).
KEY_STYLE = JsonStyle(" : ", ", ", ", ")
#: 1.x ``after``/``filter`` strings (001: ``{"_id" : {"$numberLong" : "1004"},"first_name" : ...}``).
LEGACY_STYLE = JsonStyle(" : ", ",", ", ")
#: 1.x ``patch`` strings (001: ``{"$set":{"first_name":"Anne Marie"}}``).
COMPACT_STYLE = JsonStyle(":", ",", ",")

_JSON_OPTIONS: dict[EjsonMode, JSONOptions] = {
    EjsonMode.STRICT: JSONOptions(
        json_mode=JSONMode.LEGACY,
        strict_number_long=True,
        datetime_representation=DatetimeRepresentation.LEGACY,
        strict_uuid=True,
        uuid_representation=UuidRepresentation.STANDARD,
    ),
    EjsonMode.RELAXED: json_util.RELAXED_JSON_OPTIONS.with_options(
        uuid_representation=UuidRepresentation.STANDARD
    ),
    EjsonMode.CANONICAL: json_util.CANONICAL_JSON_OPTIONS.with_options(
        uuid_representation=UuidRepresentation.STANDARD
    ),
}
#: Parsing keeps every BSON type (UUID subtype 4 stays Binary), naive UTC datetimes like bson.decode,
#: and dates outside Python's datetime range as DatetimeMS (as the engine decodes them).
LOADS_OPTIONS = JSONOptions(
    json_mode=JSONMode.RELAXED, tz_aware=False, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)

_EPOCH = datetime.datetime(1970, 1, 1)


def _datetime_millis(value: datetime.datetime) -> int:
    """Milliseconds since the epoch; naive datetimes are UTC (as bson.decode returns them)."""
    if value.tzinfo is not None:
        return calendar.timegm(value.utctimetuple()) * 1000 + value.microsecond // 1000
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _code(value: Code) -> dict[str, Any]:
    """``$code`` with its scope left as a document, so the scope's values go through the same writer."""
    if value.scope is None:
        return {"$code": str(value)}
    return {"$code": str(value), "$scope": value.scope}


_STRICT_FAST: dict[type, Callable[[Any], Any]] = {
    ObjectId: lambda o: {"$oid": str(o)},
    Int64: lambda o: {"$numberLong": str(o)},
    datetime.datetime: lambda o: {"$date": _datetime_millis(o)},
    Code: _code,
}
_RELAXED_FAST: dict[type, Callable[[Any], Any]] = {
    ObjectId: lambda o: {"$oid": str(o)},
    Int64: int,
    Code: _code,
}


def _make_default(mode: EjsonMode) -> Callable[[Any], Any]:
    """orjson ``default`` hook: BSON types to their Extended JSON documents."""
    fast = _STRICT_FAST if mode is EjsonMode.STRICT else _RELAXED_FAST
    options = _JSON_OPTIONS[mode]

    def default(obj: Any) -> Any:
        convert = fast.get(type(obj))
        if convert is not None:
            return convert(obj)
        if isinstance(obj, Mapping):
            return dict(obj)
        if isinstance(obj, list):
            return list(obj)
        try:
            return json_util.default(obj, options)
        except TypeError:
            raise TypeError(f"{type(obj).__name__} value {obj!r} has no Extended JSON form") from None

    return default


_DEFAULTS = {mode: _make_default(mode) for mode in (EjsonMode.STRICT, EjsonMode.RELAXED)}
_INDENT = orjson.OPT_INDENT_2 | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME
_COMPACT = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME
# A JSON string token (no raw newlines inside), as an unrolled loop: sre runs it far faster.
_STRING = rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
# A line that starts with a string followed by the name separator (':' with optional spaces) is
# a member; a string element of an array is followed by ',' or a line break instead.
_MEMBER_SEP = re.compile(rb",\n +(?=" + _STRING + rb"[ :])")
_ELEMENT_SEP = re.compile(rb",\n +")
_LINE_BREAK = re.compile(rb"\n *")
# Member names start their line in indented output: anchoring there keeps string contents untouched.
_NAME_SEP = re.compile(rb"(\n +" + _STRING + rb"): ")


# orjson writes uuid.UUID natively as a plain string (no passthrough option exists); seeing that
# text in the output is the cue to check the value for UUIDs (documents decoded with
# uuid_representation=STANDARD) and write them as $binary subtype 04 instead.
_UUID_TEXT = re.compile(rb'"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"')


def _needs_json_util(value: Any) -> bool:
    """Whether a value holds what orjson cannot write faithfully: NaN/Infinity (written as null)
    or uuid.UUID (written as a plain string)."""
    if type(value) is float:
        return not math.isfinite(value)
    if isinstance(value, uuid.UUID):
        return True
    if isinstance(value, Mapping):
        return any(_needs_json_util(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_needs_json_util(v) for v in value)
    if isinstance(value, Code) and value.scope is not None:
        return _needs_json_util(value.scope)
    return False


def _to_jsonable(value: Any, options: JSONOptions) -> Any:
    """json_util's conversion to plain JSON values, with non-finite doubles kept in strict mode."""
    if isinstance(value, Mapping):
        return {k: _to_jsonable(v, options) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v, options) for v in value]
    if type(value) is float and not math.isfinite(value):
        return {"$numberDouble": repr(value).replace("inf", "Infinity").replace("nan", "NaN")}
    if value is None or type(value) in (str, bool):
        return value
    if isinstance(value, Code):
        return {k: _to_jsonable(v, options) for k, v in _code(value).items()}
    return json_util.default(value, options)


def _styled(raw: bytes, style: JsonStyle) -> bytes:
    out = raw
    if style.name_sep != ": ":
        out = _NAME_SEP.sub(b"\\1" + style.name_sep.encode(), out)
    out = _MEMBER_SEP.sub(style.item_sep.encode(), out)
    out = _ELEMENT_SEP.sub(style.array_sep.encode(), out)
    return _LINE_BREAK.sub(b"", out)


def dumps_bytes(value: Any, style: JsonStyle = DOCUMENT_STYLE, mode: EjsonMode = EjsonMode.STRICT) -> bytes:
    """Extended JSON of any BSON value (document, array or scalar) as UTF-8 bytes."""
    compact = style.name_sep == ":" and style.item_sep == "," and style.array_sep == ","
    if mode is EjsonMode.CANONICAL:
        plain = _to_jsonable(value, _JSON_OPTIONS[mode])
        return (
            orjson.dumps(plain)
            if compact
            else _styled(orjson.dumps(plain, option=orjson.OPT_INDENT_2), style)
        )
    default = _DEFAULTS[mode]
    try:
        raw = orjson.dumps(value, default=default, option=_COMPACT if compact else _INDENT)
    except orjson.JSONEncodeError as exc:
        raise TypeError(str(exc.__cause__ or exc)) from exc
    if (b"null" in raw or _UUID_TEXT.search(raw) is not None) and _needs_json_util(value):
        plain = _to_jsonable(value, _JSON_OPTIONS[mode])
        raw = orjson.dumps(plain, option=0 if compact else orjson.OPT_INDENT_2)
    return raw if compact else _styled(raw, style)


def dumps(value: Any, style: JsonStyle = DOCUMENT_STYLE, mode: EjsonMode = EjsonMode.STRICT) -> str:
    """Extended JSON of any BSON value as text, in the given style and mode."""
    return dumps_bytes(value, style, mode).decode()


_KEY_FAST: dict[type, Callable[[Any], str]] = {
    ObjectId: lambda v: '{"$oid" : "' + str(v) + '"}',
    Int64: lambda v: '{"$numberLong" : "' + str(int(v)) + '"}',
    int: str,
    str: lambda v: orjson.dumps(v).decode(),
}


def key_id(value: Any) -> str:
    """The ``id`` of an event key: the ``_id`` value in strict mode, key-table style."""
    fast = _KEY_FAST.get(type(value))
    if fast is not None:
        return fast(value)
    return dumps_bytes(value, KEY_STYLE, EjsonMode.STRICT).decode()


def loads(text: str | bytes) -> Any:
    """Parse any of the forms written here back to BSON values (``bson.decode``-compatible types)."""
    return json_util.loads(text, json_options=LOADS_OPTIONS)
