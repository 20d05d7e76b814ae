"""The MongoDB Java driver's ``JsonWriter``, byte for byte, in the three settings Debezium 3.x uses.

Debezium's MongoDB connector writes BSON as text with the Java driver (``org.bson.json``), and a
team replacing it needs the same bytes: the event key decides a record's partition and its
compaction identity. The driver's text differs from every Python serializer in small ways, all
reproduced here:

- ``STRICT_INDENTED`` (Debezium's ``COMPACT_JSON_SETTINGS``: ``JsonMode.STRICT``, indent on with
  empty indent and newline strings) for ``before``/``after``/``lsid``: ``{"a": 1,"b": [1,2]}``,
  Int64 as ``{"$numberLong": "5"}``, dates as ``{"$date": <millis>}``, binary as
  ``{"$binary": "<base64>","$type": "00"}``, non-finite doubles as bare ``NaN``/``Infinity``.
- ``RELAXED_INDENTED`` (``SIMPLE_JSON_SETTINGS``, ``JsonMode.RELAXED``) for event keys: Int64 as a
  plain number, dates as ``{"$date": "<ISO-8601>"}`` inside 1970..9999, binary as
  ``{"$binary": {"base64": "…","subType": "04"}}``, non-finite doubles as ``{"$numberDouble": "NaN"}``.
- ``RELAXED`` (``Document.toJson()`` defaults) for ``updatedFields``: the relaxed types with
  ``", "`` between members and array elements.

Doubles are spelled like ``Double.toString`` (``1.0E300``, ``1.0E-4``, ``100.0``) with the shortest
digits that round-trip (what Java 19+ writes). Strings escape every UTF-16 unit whose Unicode
category the driver does not list as printable (controls, format characters, combining marks,
modifier letters, surrogates: so ``\\ud83d\\ude00`` for an emoji), with lowercase hex.

``allow_nan=False`` writes non-finite doubles of the strict flavour as the relaxed
``{"$numberDouble": "NaN"}`` instead of bare ``NaN``, so the text stays valid JSON.
"""

from __future__ import annotations

import base64
import datetime
import math
import re
import unicodedata
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from mongocdc_core.events.dates import datetime_millis


@dataclass(frozen=True, slots=True)
class JavaJsonSettings:
    """One ``JsonWriterSettings`` of the Java driver: output mode and whether it indents."""

    relaxed: bool
    indented: bool
    allow_nan: bool = True

    @property
    def member_sep(self) -> str:
        return "," if self.indented else ", "

    def valid_json(self) -> JavaJsonSettings:
        """The same settings writing non-finite doubles as ``{"$numberDouble": …}`` (valid JSON)."""
        return JavaJsonSettings(self.relaxed, self.indented, allow_nan=False)


#: Debezium's ``JsonSerialization.COMPACT_JSON_SETTINGS``: document values and ``lsid``.
STRICT_INDENTED = JavaJsonSettings(relaxed=False, indented=True)
#: Debezium's ``JsonSerialization.SIMPLE_JSON_SETTINGS``: the ``_id`` in event keys.
RELAXED_INDENTED = JavaJsonSettings(relaxed=True, indented=True)
#: ``BsonDocument.toJson()`` with the driver's defaults: ``updatedFields``.
RELAXED = JavaJsonSettings(relaxed=True, indented=False)

# -- scalars -----------------------------------------------------------------------------------------------

#: Unicode categories ``StrictCharacterStreamJsonWriter`` writes as they are; every other UTF-16 unit
#: is written as ``\uXXXX``.
_PRINTABLE_CATEGORIES = frozenset(
    {"Lu", "Ll", "Lt", "Lo", "Nd", "Nl", "No", "Zs", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So"}
)
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Printable ASCII other than '"' and '\': written as is by the driver.
_PLAIN_ASCII = re.compile(r'[ !#-\[\]-~]*')
_char_cache: dict[str, str] = {}


def _escape_char(ch: str) -> str:
    out = _SHORT_ESCAPES.get(ch)
    if out is not None:
        return out
    code = ord(ch)
    if code > 0xFFFF:  # Java sees two surrogates (category Cs): both escaped
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    if unicodedata.category(ch) in _PRINTABLE_CATEGORIES:
        return ch
    return f"\\u{code:04x}"


_printable_bitmap: bytes | None = None


def printable_bitmap() -> bytes:
    """A bit per BMP code point (bit ``c & 7`` of byte ``c >> 3``), set where :func:`java_string`
    writes the character as it is: the compiled module's table, from the same Unicode database."""
    global _printable_bitmap
    if _printable_bitmap is None:
        bits = bytearray(0x10000 // 8)
        for code in range(0x10000):
            if unicodedata.category(chr(code)) in _PRINTABLE_CATEGORIES:
                bits[code >> 3] |= 1 << (code & 7)
        _printable_bitmap = bytes(bits)
    return _printable_bitmap


_names: dict[str, str] = {}


def java_name(name: str) -> str:
    """A member name as :func:`java_string` writes it (cached: documents repeat their field names)."""
    text = _names.get(name)
    if text is None:
        text = java_string(name)
        if len(_names) < 100_000:
            _names[name] = text
    return text


def java_string(text: str) -> str:
    """A JSON string as ``StrictCharacterStreamJsonWriter.writeStringHelper`` writes it."""
    if _PLAIN_ASCII.fullmatch(text) is not None:
        return '"' + text + '"'
    parts = ['"']
    for ch in text:
        escaped = _char_cache.get(ch)
        if escaped is None:
            escaped = _escape_char(ch)
            if len(_char_cache) < 65536:
                _char_cache[ch] = escaped
        parts.append(escaped)
    parts.append('"')
    return "".join(parts)


def java_double(value: float) -> str:
    """``Double.toString``: plain between 1e-3 and 1e7, else ``d.dddE±n``; shortest round-trip digits."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0.0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    if 1e-3 <= abs(value) < 1e7:
        return repr(value)  # Python's shortest digits, without an exponent in this range: Java's text
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    # value = 0.<text> * 10**point, i.e. the decimal point sits after `point` digits of `text`
    point = len(digits) + exponent
    minus = "-" if sign else ""
    return f"{minus}{text[0]}.{text[1:] or '0'}E{point - 1}"


_EPOCH = datetime.datetime(1970, 1, 1)
_LAST_MS_OF_YEAR_9999 = 253402300799999


def iso_millis(millis: int) -> str:
    """``ISO_OFFSET_DATE_TIME`` of an instant in UTC: seconds always, the fraction without trailing zeros."""
    moment = _EPOCH + datetime.timedelta(milliseconds=millis)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    ms = millis % 1000
    if ms:
        text += "." + f"{ms:03d}".rstrip("0")
    return text + "Z"


_REGEX_FLAGS = (("i", 2), ("l", 4), ("m", 8), ("s", 16), ("u", 32), ("x", 64))


def _regex_options(flags: int | str) -> str:
    if isinstance(flags, str):
        return "".join(sorted(flags))
    return "".join(letter for letter, bit in _REGEX_FLAGS if flags & bit)


# -- the writer --------------------------------------------------------------------------------------------


class _Writer:
    """Writes BSON values (as bson.decode returns them) in one setting; ``write`` appends text to ``out``."""

    __slots__ = ("settings", "sep", "_scalars")

    def __init__(self, settings: JavaJsonSettings) -> None:
        self.settings = settings
        self.sep = settings.member_sep
        self._scalars: dict[type, Callable[[Any], str]] = {
            str: java_string,
            int: str,
            Int64: self._int64,
            float: self._double,
            bool: lambda v: "true" if v else "false",
            type(None): lambda v: "null",
            ObjectId: lambda v: '{"$oid": "' + str(v) + '"}',
            datetime.datetime: self._date,
            DatetimeMS: self._date,
            bytes: lambda v: self._binary(v, 0),
            Binary: lambda v: self._binary(bytes(v), v.subtype),
            uuid.UUID: lambda v: self._binary(v.bytes, 4),
            Decimal128: lambda v: '{"$numberDecimal": "' + str(v) + '"}',
            Timestamp: lambda v: '{"$timestamp": {"t": ' + str(v.time) + self.sep + '"i": ' + str(v.inc) + "}}",
            MinKey: lambda v: '{"$minKey": 1}',
            MaxKey: lambda v: '{"$maxKey": 1}',
            Regex: self._regex,
        }

    def _int64(self, value: int) -> str:
        return str(int(value)) if self.settings.relaxed else '{"$numberLong": "' + str(int(value)) + '"}'

    def _double(self, value: float) -> str:
        if math.isfinite(value) or (self.settings.allow_nan and not self.settings.relaxed):
            return java_double(value)
        return '{"$numberDouble": "' + java_double(value) + '"}'

    def _date(self, value: datetime.datetime | DatetimeMS) -> str:
        millis = datetime_millis(value)
        if not self.settings.relaxed:
            return '{"$date": ' + str(millis) + "}"
        if 0 <= millis <= _LAST_MS_OF_YEAR_9999:
            return '{"$date": "' + iso_millis(millis) + '"}'
        return '{"$date": {"$numberLong": "' + str(millis) + '"}}'

    def _binary(self, data: bytes, subtype: int) -> str:
        encoded = base64.b64encode(data).decode("ascii")
        if self.settings.relaxed:
            return '{"$binary": {"base64": "' + encoded + '"' + self.sep + '"subType": "' + f"{subtype:02X}" + '"}}'
        return '{"$binary": "' + encoded + '"' + self.sep + '"$type": "' + f"{subtype:02X}" + '"}'

    def _regex(self, value: Regex[Any]) -> str:
        pattern = java_string(str(value.pattern))
        options = java_string(_regex_options(value.flags))
        if self.settings.relaxed:
            return '{"$regularExpression": {"pattern": ' + pattern + self.sep + '"options": ' + options + "}}"
        return '{"$regex": ' + pattern + self.sep + '"$options": ' + options + "}"

    def write(self, value: Any, out: list[str]) -> None:
        scalar = self._scalars.get(type(value))
        if scalar is not None:
            out.append(scalar(value))
        elif isinstance(value, Mapping):
            self._document(value.items(), out)
        elif isinstance(value, (list, tuple)):
            if not value:
                out.append("[]")
                return
            out.append("[")
            first = True
            for item in value:
                if not first:
                    out.append(self.sep)
                first = False
                self.write(item, out)
            out.append("]")
        elif isinstance(value, DBRef):
            self._document(value.as_doc().items(), out)
        elif isinstance(value, Code):
            members: list[tuple[str, Any]] = [("$code", str(value))]
            if value.scope is not None:
                members.append(("$scope", value.scope))
            self._document(members, out)
        else:
            for kind, convert in self._scalars.items():  # subclasses (e.g. of str or datetime)
                if isinstance(value, kind) and kind is not bool:
                    out.append(convert(value))
                    return
            raise TypeError(f"{type(value).__name__} value {value!r} has no MongoDB Extended JSON form")

    def _document(self, items: Any, out: list[str]) -> None:
        out.append("{")
        first = True
        for name, item in items:
            if not first:
                out.append(self.sep)
            first = False
            out.append(java_name(name))
            out.append(": ")
            self.write(item, out)
        out.append("}")


_WRITERS: dict[JavaJsonSettings, _Writer] = {}


def dumps(value: Any, settings: JavaJsonSettings) -> str:
    """Any BSON value (document, array or scalar) as the Java driver writes it with ``settings``."""
    writer = _WRITERS.get(settings)
    if writer is None:
        writer = _WRITERS[settings] = _Writer(settings)
    out: list[str] = []
    writer.write(value, out)
    return "".join(out)
