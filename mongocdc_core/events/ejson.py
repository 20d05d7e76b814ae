"""MongoDB Extended JSON in the exact textual forms the Debezium documentation shows.

The type mapping is pymongo's :mod:`bson.json_util` (strict mode = its LEGACY mode with
``$numberLong`` for Int64 and ``{"$date": <millis>}``), the text is written by orjson. Debezium's
Java writer differs from any stock Python serializer only in whitespace: documents use
``"name": value`` and ``,`` between members, arrays use ``, ``, and event keys use
``"name" : value`` with ``, `` (the key table of the seed).

Fast path (one orjson call plus a few C-level byte operations): orjson writes compact JSON; when
no string in it holds an escaped quote, every ``"`` is a string delimiter, so splitting at the
quotes leaves the structure alone in every other piece. Joined with a NUL per string, the
structure is restyled with byte replaces (every colon there is a name separator; a comma is an
array separator unless a member name follows it), then the strings are put back. Text with an
escaped quote takes the slow path: orjson's indented output, where every member starts a line,
restyled by regular expressions. Canonical mode and values holding non-finite doubles or
``uuid.UUID`` (which orjson would write as ``null`` / a plain string) go through json_util's
converter instead.
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
import secrets
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
from bson import json_util
from bson.binary import UuidRepresentation
from bson.code import Code
from bson.codec_options import DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.json_util import DatetimeRepresentation, JSONMode, JSONOptions
from bson.objectid import ObjectId

from mongocdc_core.events.dates import datetime_millis


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
    #: orjson's own output (no space anywhere), and the separators as bytes; derived.
    compact: bool = field(init=False, compare=False)
    name_bytes: bytes = field(init=False, compare=False)
    item_bytes: bytes = field(init=False, compare=False)
    array_bytes: bytes = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if self.name_sep.strip() != ":" or self.item_sep.strip() != "," or self.array_sep.strip() != ",":
            raise ValueError(f"a JSON style needs ':' and ',' separators padded only with spaces: {self!r}")
        object.__setattr__(self, "compact", self.name_sep == ":" and self.item_sep == "," and self.array_sep == ",")
        object.__setattr__(self, "name_bytes", self.name_sep.encode())
        object.__setattr__(self, "item_bytes", self.item_sep.encode())
        object.__setattr__(self, "array_bytes", self.array_sep.encode())


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


_DECIMAL_SPECIAL = 0x7800000000000000  # infinity and NaN bits of the high word
_DECIMAL_LARGE_FORM = 0x6000000000000000  # the "11" combination field: non-canonical or special
_DECIMAL_COEFFICIENT = (1 << 113) - 1
_DECIMAL_MAX_COEFFICIENT = 10**34 - 1


def decimal128_text(value: Decimal128) -> str:
    """``str(value)``, computed in C: pymongo decodes the coefficient digit by digit in Python.

    The coefficient and exponent come from the public BID bytes; ``decimal.Decimal`` parses their
    text exactly and prints it as pymongo does. The rare forms (infinities, NaN, non-canonical
    encodings) are left to pymongo.
    """
    n = int.from_bytes(value.bid, "little")
    high = n >> 64
    if high & _DECIMAL_SPECIAL == _DECIMAL_SPECIAL or high & _DECIMAL_LARGE_FORM == _DECIMAL_LARGE_FORM:
        return str(value)
    coefficient = n & _DECIMAL_COEFFICIENT
    if coefficient > _DECIMAL_MAX_COEFFICIENT:
        return str(value)
    exponent = ((high & 0x7FFF800000000000) >> 49) - 6176
    return str(decimal.Decimal(f"-{coefficient}E{exponent}" if high >> 63 else f"{coefficient}E{exponent}"))


def _code(value: Code) -> dict[str, Any]:
    """``$code`` with its scope left as a document, so the scope's values go through the same writer."""
    if value.scope is None:
        return {"$code": str(value)}
    return {"$code": str(value), "$scope": value.scope}


_STRICT_FAST: dict[type, Callable[[Any], Any]] = {
    ObjectId: lambda o: {"$oid": str(o)},
    Int64: lambda o: {"$numberLong": str(o)},
    datetime.datetime: lambda o: {"$date": datetime_millis(o)},
    DatetimeMS: lambda o: {"$date": int(o)},
    Decimal128: lambda o: {"$numberDecimal": decimal128_text(o)},
    Code: _code,
}
_RELAXED_FAST: dict[type, Callable[[Any], Any]] = {
    ObjectId: lambda o: {"$oid": str(o)},
    Int64: int,
    Decimal128: lambda o: {"$numberDecimal": decimal128_text(o)},
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
# Slow path, on indented output: a line that starts with a string followed by the name separator
# (':' with optional spaces) is a member; a string element of an array is followed by ',' or a
# line break instead.
_MEMBER_SEP = re.compile(rb",\n +(?=" + _STRING + rb"[ :])")
_ELEMENT_SEP = re.compile(rb",\n +")
_LINE_BREAK = re.compile(rb"\n *")
# Member names start their line in indented output: anchoring there keeps string contents untouched.
_NAME_SEP = re.compile(rb"(\n +" + _STRING + rb"): ")


# orjson writes uuid.UUID natively as a plain string (no passthrough option exists); seeing that
# text in the output is the cue to check the value for UUIDs (documents decoded with
# uuid_representation=STANDARD) and write them as $binary subtype 04 instead. The search starts
# at the first dash, which sre finds far faster than every quote.
_UUID_TEXT = re.compile(rb'-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"')


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
    """Slow path: restyle orjson's indented output."""
    out = raw
    if style.name_sep != ": ":
        out = _NAME_SEP.sub(b"\\1" + style.name_sep.encode(), out)
    out = _MEMBER_SEP.sub(style.item_sep.encode(), out)
    out = _ELEMENT_SEP.sub(style.array_sep.encode(), out)
    return _LINE_BREAK.sub(b"", out)


def _restyled_parts(compact: bytes, style: JsonStyle) -> list[bytes] | None:
    """Fast path: orjson's compact output restyled, as its pieces between quotes (join them
    with ``"``); None when a string holds an escaped quote."""
    if compact.find(b"\\") >= 0 and b'\\"' in compact:
        return None
    parts = compact.split(b'"')
    structure = b"\x00".join(parts[0::2])  # even pieces are outside strings
    if style.item_sep == style.array_sep:
        structure = structure.replace(b",", style.array_bytes)
    else:  # every comma as an array's, then those before a member name (NUL, colon) as a member's
        structure = structure.replace(b",", style.array_bytes).replace(
            style.array_bytes + b"\x00:", style.item_bytes + b"\x00:"
        )
    structure = structure.replace(b":", style.name_bytes)
    parts[0::2] = structure.split(b"\x00")
    return parts


def _compact(value: Any, mode: EjsonMode) -> bytes:
    """orjson's compact output with the Extended JSON types of ``mode``."""
    if mode is EjsonMode.CANONICAL:
        return _plain(value, mode, 0)
    try:
        raw = orjson.dumps(value, default=_DEFAULTS[mode], option=_COMPACT)
    except orjson.JSONEncodeError as exc:
        raise TypeError(str(exc.__cause__ or exc)) from exc
    if (b"null" in raw or (b"-" in raw and _UUID_TEXT.search(raw) is not None)) and _needs_json_util(value):
        return _plain(value, mode, 0)
    return raw


def _plain(value: Any, mode: EjsonMode, option: int) -> bytes:
    """json_util's conversion written by orjson (non-finite doubles, uuid.UUID, canonical mode)."""
    return orjson.dumps(_to_jsonable(value, _JSON_OPTIONS[mode]), option=option)


def _slow(value: Any, style: JsonStyle, mode: EjsonMode) -> bytes:
    if mode is EjsonMode.CANONICAL or _needs_json_util(value):
        return _styled(_plain(value, mode, orjson.OPT_INDENT_2), style)
    return _styled(orjson.dumps(value, default=_DEFAULTS[mode], option=_INDENT), style)


def dumps_bytes(value: Any, style: JsonStyle = DOCUMENT_STYLE, mode: EjsonMode = EjsonMode.STRICT) -> bytes:
    """Extended JSON of any BSON value (document, array or scalar) as UTF-8 bytes."""
    raw = _compact(value, mode)
    if style.compact:
        return raw
    parts = _restyled_parts(raw, style)
    return _slow(value, style, mode) if parts is None else b'"'.join(parts)


def dumps_string(value: Any, style: JsonStyle = DOCUMENT_STYLE) -> bytes:
    """``dumps_bytes(value, style)`` (strict mode) as a JSON string literal, the way an envelope
    carries ``before``/``after``: the text's quotes are escaped by joining its pieces with ``\\"``."""
    raw = _compact(value, EjsonMode.STRICT)
    parts = None if style.compact else _restyled_parts(raw, style)
    if parts is not None and raw.find(b"\\") < 0:
        return b'"' + b'\\"'.join(parts) + b'"'
    text = raw if style.compact else (_slow(value, style, EjsonMode.STRICT) if parts is None else b'"'.join(parts))
    return orjson.dumps(text.decode())


def dumps_strings(values: Sequence[Any], style: JsonStyle = DOCUMENT_STYLE) -> list[bytes]:
    """``dumps_string`` of each value, the bytes identical, written by one orjson call per batch.

    The values are written as one array with a random token between them (one call, one restyle
    of the structure); the text is then cut at the tokens. Used for snapshot chunks, where the
    per-call overhead outweighs the writing of one small document. A batch that could not be cut
    safely (a string equal to the token, text with escapes, values needing json_util) is written
    value by value instead.
    """
    n = len(values)
    if n < 2 or style.compact:
        return [dumps_string(value, style) for value in values]
    token = secrets.token_hex(16)
    interleaved: list[Any] = [token] * (2 * n - 1)
    interleaved[0::2] = values
    try:
        raw = orjson.dumps(interleaved, default=_DEFAULTS[EjsonMode.STRICT], option=_COMPACT)
    except orjson.JSONEncodeError:
        return [dumps_string(value, style) for value in values]  # raises the value's own error
    mark = token.encode()
    if (
        raw.find(b"\\") >= 0
        or raw.count(mark) != n - 1
        or ((b"null" in raw or (b"-" in raw and _UUID_TEXT.search(raw) is not None))
            and any(_needs_json_util(value) for value in values))
    ):
        return [dumps_string(value, style) for value in values]
    parts = _restyled_parts(raw, style)
    assert parts is not None  # no backslash, so no escaped quote
    separator = style.array_bytes + b'\\"' + mark + b'\\"' + style.array_bytes
    return [b'"' + piece + b'"' for piece in b'\\"'.join(parts)[1:-1].split(separator)]


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
