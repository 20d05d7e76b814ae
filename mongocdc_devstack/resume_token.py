"""Change stream resume tokens in mongod's own KeyString format.

A mongod resume token is ``{_data: <hex>}`` where the hex string is a KeyString (index key
encoding, version V1) of the sequence ``clusterTime, version, tokenType, txnOpIndex,
fromInvalidate, uuid, eventIdentifier[, fragmentNum]``. KeyStrings compare bytewise in the same
order as the values they encode, so comparing two tokens' ``_data`` strings orders them like the
events they stand for, and tools written for real MongoDB (read byte 0 == 130, then the 8-byte
timestamp) work on the emulator's tokens unchanged. Numeric BSON types that the KeyString alone
cannot tell apart (int64 and double ``_id`` values) are recorded in ``_typeBits`` as mongod does.

Tokens are version 2 (mongod 6.0+): the event identifier is ``{operationType, documentKey}`` for
CRUD events and ``{operationType, operationDescription}`` for DDL events.
"""

from __future__ import annotations

import datetime
import math
import re
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, Context, Decimal, Inexact, InvalidOperation
from typing import Any

from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS

from mongocdc_devstack.errors import FAILED_TO_PARSE, INVALID_RESUME_TOKEN, CommandError, command_error

TOKEN_VERSION = 2
EVENT_TOKEN = 128
HIGH_WATER_MARK_TOKEN = 0

# KeyString canonical type bytes (mongod src/mongo/db/storage/key_string.cpp).
_MIN_KEY = 10
_UNDEFINED = 15
_NULLISH = 20
_NUMERIC = 30
_NUM_NAN = 30
_NUM_NEG_LARGE = 31
_NUM_NEG_8BYTE = 32
_NUM_NEG_1BYTE = 39
_NUM_NEG_SMALL = 40
_NUM_ZERO = 41
_NUM_POS_SMALL = 42
_NUM_POS_1BYTE = 43
_NUM_POS_8BYTE = 50
_NUM_POS_LARGE = 51
_STRING = 60
_OBJECT = 70
_ARRAY = 80
_BINDATA = 90
_OID = 100
_BOOL_FALSE = 110
_BOOL_TRUE = 111
_DATE = 120
_TIMESTAMP = 130
_REGEX = 140
_CODE = 160
_MAX_KEY = 240
_END = 4

# Type bits: strings take one bit, numbers two (mongod's TypeBits, KeyString V1).
_TB_INT = (0, 0)
_TB_DOUBLE = (0, 1)
_TB_LONG = (1, 0)

_TB_DECIMAL = (1, 1)

# NumberDecimal in KeyString V1: the decimal continuation marker in a double's spare bits.
_DCM_LESS = 1  # a continuation follows; the decimal is below the double rounded to 15 digits
_DCM_EQUAL_15_DIGITS = 2  # the decimal is the double rounded (away from zero) to 15 digits
_DCM_LARGER = 3  # a continuation follows; the decimal is above it
_DECIMAL_EXPONENT_BIAS = 6176
_DECIMAL_MAX_BIASED_EXPONENT = 12287
_DBL_MIN = 2.2250738585072014e-308
_TINIEST_2BIT_DCM = math.ldexp(1, -255)
_MAX_INT_FOR_DOUBLE = float(1 << 53)


_WIDE = Context(prec=1000, Emax=10**6, Emin=-(10**6))  # exact arithmetic on doubles' expansions


def _toward_zero_double(magnitude: Decimal) -> float | None:
    """The largest double not above ``magnitude`` (>= 0); None when it exceeds every double."""
    try:
        candidate = float(magnitude)
    except OverflowError:
        return None
    if math.isinf(candidate):
        return None
    if Decimal(candidate) > magnitude:
        candidate = math.nextafter(candidate, 0.0)
    return candidate


def _round_digits(value: Decimal, digits: int, rounding: str) -> Decimal:
    """``value`` rounded to ``digits`` significant digits in the given direction."""
    if value.is_zero():
        return value
    exponent = value.adjusted() - digits + 1
    return value.quantize(Decimal(1).scaleb(exponent), rounding=rounding, context=_WIDE)


def _to_34_digits(value: Decimal) -> Decimal:
    """The same number with a 34-digit coefficient (mongod's ``Decimal128::normalize``)."""
    if value.is_zero():
        return value
    exponent = value.adjusted() - 33
    return value.quantize(Decimal(1).scaleb(exponent), context=_WIDE)


_HEX_RE = re.compile(r"\A(?:[0-9A-Fa-f]{2})*\Z")
_TWO_POW_63 = float(1 << 63)


@dataclass(frozen=True)
class ResumeTokenData:
    """The decoded content of a resume token (mongod's ``ResumeTokenData``)."""

    cluster_time: Timestamp
    version: int = TOKEN_VERSION
    token_type: int = EVENT_TOKEN
    txn_op_index: int = 0
    from_invalidate: bool = False
    uuid: uuid.UUID | None = None
    event_identifier: dict[str, Any] | None = None
    fragment_num: int | None = None

    @property
    def is_high_water_mark(self) -> bool:
        return self.token_type == HIGH_WATER_MARK_TOKEN


# -- encoding ------------------------------------------------------------------------------------


class _Writer:
    """Accumulates KeyString bytes and type bits."""

    __slots__ = ("buf", "bits")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.bits: list[int] = []

    def type_bits(self) -> bytes:
        """mongod's serialized TypeBits; empty when every bit is zero."""
        if not any(self.bits):
            return b""
        data = bytearray((len(self.bits) + 7) // 8)
        for i, bit in enumerate(self.bits):
            if bit:
                data[i // 8] |= 1 << (i % 8)
        if len(data) == 1 and data[0] < 0x80:
            return bytes(data)
        if len(data) <= 127:
            return bytes([0x80 | len(data)]) + bytes(data)
        return b"\x80" + struct.pack("<I", len(data)) + bytes(data)

    def value(self, v: Any) -> None:
        """Append one BSON value with its own type byte."""
        buf = self.buf
        if v is None:
            buf.append(_NULLISH)
        elif v is True:
            buf.append(_BOOL_TRUE)
        elif v is False:
            buf.append(_BOOL_FALSE)
        elif isinstance(v, Int64):
            self.bits.extend(_TB_LONG)
            self._integer(int(v))
        elif isinstance(v, int):
            if -(1 << 31) <= v < (1 << 31):
                self.bits.extend(_TB_INT)
            elif -(1 << 63) <= v < (1 << 63):
                self.bits.extend(_TB_LONG)
            else:
                raise ValueError(f"integer {v} does not fit in a BSON int64")
            self._integer(v)
        elif isinstance(v, float):
            self.bits.extend(_TB_DOUBLE)
            self._double(v)
        elif isinstance(v, Decimal128):
            self._decimal(v.to_decimal())
        elif isinstance(v, str):
            self.bits.append(0)
            buf.append(_STRING)
            self._string_like(v.encode())
        elif isinstance(v, ObjectId):
            buf.append(_OID)
            buf += v.binary
        elif isinstance(v, Mapping):
            buf.append(_OBJECT)
            self._object_body(v)
        elif isinstance(v, (list, tuple)):
            buf.append(_ARRAY)
            for item in v:
                self.value(item)
            buf.append(0)
        elif isinstance(v, uuid.UUID):
            self._bindata(v.bytes, 4)
        elif isinstance(v, Binary):
            self._bindata(bytes(v), v.subtype)
        elif isinstance(v, bytes):
            self._bindata(v, 0)
        elif isinstance(v, Timestamp):
            buf.append(_TIMESTAMP)
            buf += struct.pack(">II", v.time, v.inc)
        elif isinstance(v, (datetime.datetime, DatetimeMS)):
            millis = _datetime_millis(v)
            buf.append(_DATE)
            buf += struct.pack(">Q", (millis & 0xFFFFFFFFFFFFFFFF) ^ (1 << 63))
        elif isinstance(v, Regex):
            buf.append(_REGEX)
            buf += str(v.pattern).encode() + b"\x00" + _regex_flags(v.flags).encode() + b"\x00"
        elif isinstance(v, Code):
            buf.append(_CODE)
            self._string_like(str(v).encode())
        elif isinstance(v, MinKey):
            buf.append(_MIN_KEY)
        elif isinstance(v, MaxKey):
            buf.append(_MAX_KEY)
        else:
            raise ValueError(f"values of type {type(v).__name__} cannot be encoded in a resume token")

    def _object_body(self, obj: Mapping[str, Any]) -> None:
        buf = self.buf
        for name, item in obj.items():
            buf.append(_generic_type(item))
            buf += name.encode() + b"\x00"
            self.value(item)
        buf.append(0)

    def _string_like(self, raw: bytes) -> None:
        self.buf += raw.replace(b"\x00", b"\x00\xff") + b"\x00"

    def _bindata(self, data: bytes, subtype: int) -> None:
        buf = self.buf
        buf.append(_BINDATA)
        if len(data) < 0xFF:
            buf.append(len(data))
        else:
            buf.append(0xFF)
            buf += struct.pack(">i", len(data))
        buf.append(subtype)
        buf += data

    def _integer(self, v: int) -> None:
        if v == 0:
            self.buf.append(_NUM_ZERO)
        elif v == -(1 << 63):
            self._large_double(float(v))
        else:
            self._preshifted(abs(v) << 1, v < 0)

    def _preshifted(self, value: int, negative: bool) -> None:
        nbytes = (value.bit_length() + 7) // 8
        raw = value.to_bytes(nbytes, "big")
        if negative:
            self.buf.append(_NUM_NEG_1BYTE - (nbytes - 1))
            self.buf += bytes(b ^ 0xFF for b in raw)
        else:
            self.buf.append(_NUM_POS_1BYTE + (nbytes - 1))
            self.buf += raw

    def _decimal(self, dec: Decimal) -> None:
        """A NumberDecimal as mongod's KeyString V1 encodes it: the double nearest toward zero
        with a decimal continuation marker (and, when needed, 8 continuation bytes); the exponent's
        low bits and the decimal type are in the type bits."""
        negative = dec.is_signed()
        if dec.is_nan():
            self.buf.append(_NUM_NAN)
            self.bits.extend(_TB_DECIMAL)
            return
        if dec.is_infinite():
            self.buf.append(_NUM_NEG_LARGE if negative else _NUM_POS_LARGE)
            self._maybe_inverted(b"\xff" * 8, negative)
            self.bits.extend(_TB_DECIMAL)
            return
        biased = int(dec.as_tuple().exponent) + _DECIMAL_EXPONENT_BIAS
        if dec.is_zero():
            which = biased + (_DECIMAL_MAX_BIASED_EXPONENT + 1 if negative else 0)
            zero_type = (which >> 12) + 0x1A
            self.bits.extend((zero_type >> shift) & 1 for shift in range(4, -1, -1))
            self.bits.extend((which >> shift) & 1 for shift in range(11, -1, -1))
            self.buf.append(_NUM_ZERO)
            return
        self.bits.extend(_TB_DECIMAL)
        self.bits.extend(((biased & 63) >> shift) & 1 for shift in range(5, -1, -1))
        magnitude = dec.copy_abs()  # exact: unary minus would round to the context's precision
        bin_ = _toward_zero_double(magnitude)
        if bin_ is None or bin_ < _DBL_MIN:
            raise ValueError(f"Decimal128 {dec} is outside the range the emulator's resume tokens encode")
        if Decimal(bin_) == magnitude:
            self._double(-bin_ if negative else bin_)
            return
        away = ROUND_CEILING  # toward larger magnitude (the sign is applied afterwards)
        if bin_ >= _TWO_POW_63:
            self._large_double(-bin_ if negative else bin_, _DCM_LARGER)
            stored = _round_digits(Decimal(bin_), 34, away)
        elif bin_ < _TINIEST_2BIT_DCM:
            raise ValueError(f"Decimal128 {dec} is outside the range the emulator's resume tokens encode")
        elif bin_ >= _MAX_INT_FOR_DOUBLE:
            integer_part = int(magnitude)
            has_fraction = Decimal(integer_part) != magnitude
            self._preshifted((integer_part << 1) | int(has_fraction), negative)
            if not has_fraction:
                return
            if integer_part < (1 << 55):
                self._maybe_inverted(bytes([_DCM_LARGER]), negative)
            stored = Decimal(integer_part)
        else:
            coefficient = int("".join(map(str, magnitude.as_tuple().digits)))
            from_bin = _round_digits(Decimal(bin_), 15, away)
            if coefficient < 10**15 or from_bin == magnitude:
                self._double(-bin_ if negative else bin_, _DCM_EQUAL_15_DIGITS)
                return
            dcm = _DCM_LESS if magnitude < from_bin else _DCM_LARGER
            self._double(-bin_ if negative else bin_, dcm)
            stored = _round_digits(Decimal(bin_), 34, away)
        stored = _to_34_digits(stored)
        difference = _WIDE.subtract(magnitude, stored)
        exponent = int(stored.as_tuple().exponent)
        continuation = int(difference.scaleb(-exponent, context=_WIDE))
        self._maybe_inverted(struct.pack(">Q", continuation), negative)

    def _double(self, v: float, dcm: int = 0) -> None:
        if math.isnan(v):
            self.buf.append(_NUM_NAN)
            return
        negative = v < 0
        magnitude = -v if negative else v
        if magnitude == 0.0:
            self.buf.append(_NUM_ZERO)
        elif magnitude < 1.0:
            if magnitude < math.ldexp(1, -255):
                raise ValueError(f"double {v!r} is too small to be encoded in a resume token")
            (bits,) = struct.unpack(">Q", struct.pack(">d", magnitude))
            self.buf.append(_NUM_NEG_SMALL if negative else _NUM_POS_SMALL)
            self._maybe_inverted(struct.pack(">Q", ((bits << 2) & 0xFFFFFFFFFFFFFFFF) | dcm), negative)
        elif magnitude < _TWO_POW_63:
            integer_part = int(magnitude)
            if float(integer_part) == magnitude and dcm == 0:
                self._preshifted(integer_part << 1, negative)
                return
            fractional_bytes = (64 - (integer_part << 1).bit_length()) // 8
            ctype = _NUM_NEG_8BYTE + fractional_bytes if negative else _NUM_POS_8BYTE - fractional_bytes
            self.buf.append(ctype)
            encoding = int(magnitude * (256**fractional_bytes))
            encoding += (integer_part + 1) << (fractional_bytes * 8)
            self._maybe_inverted(struct.pack(">Q", encoding | dcm), negative)
        else:
            self._large_double(v, dcm)

    def _large_double(self, v: float, dcm: int = 0) -> None:
        self.buf.append(_NUM_POS_LARGE if v > 0 else _NUM_NEG_LARGE)
        if math.isinf(v):
            encoded = 0xFFFFFFFFFFFFFFFF
        else:
            (bits,) = struct.unpack(">Q", struct.pack(">d", v))
            encoded = ((bits << 1) & 0x7FFFFFFFFFFFFFFF) | int(dcm != 0)
        self._maybe_inverted(struct.pack(">Q", encoded), v < 0)

    def _maybe_inverted(self, raw: bytes, invert: bool) -> None:
        self.buf += bytes(b ^ 0xFF for b in raw) if invert else raw


def _generic_type(v: Any) -> int:
    """The canonical type byte written before a field name inside an object."""
    if v is None:
        return _NULLISH
    if isinstance(v, bool):
        return _BOOL_FALSE
    if isinstance(v, (int, float, Decimal128)):
        return _NUMERIC
    if isinstance(v, str):
        return _STRING
    if isinstance(v, Mapping):
        return _OBJECT
    if isinstance(v, (list, tuple)):
        return _ARRAY
    if isinstance(v, (uuid.UUID, Binary, bytes)):
        return _BINDATA
    if isinstance(v, ObjectId):
        return _OID
    if isinstance(v, (datetime.datetime, DatetimeMS)):
        return _DATE
    if isinstance(v, Timestamp):
        return _TIMESTAMP
    if isinstance(v, Regex):
        return _REGEX
    if isinstance(v, Code):
        return _CODE
    if isinstance(v, MinKey):
        return _MIN_KEY
    if isinstance(v, MaxKey):
        return _MAX_KEY
    raise ValueError(f"values of type {type(v).__name__} cannot be encoded in a resume token")


def _datetime_millis(v: datetime.datetime | DatetimeMS) -> int:
    if isinstance(v, DatetimeMS):
        return int(v)
    if v.tzinfo is None:
        v = v.replace(tzinfo=datetime.UTC)
    delta = v - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _regex_flags(flags: int | str) -> str:
    if isinstance(flags, str):
        return flags
    letters = {2: "i", 4: "l", 8: "m", 16: "s", 32: "u", 64: "x"}
    return "".join(letter for bit, letter in sorted(letters.items()) if flags & bit)


def _header(cluster_time: Timestamp, token_type: int, txn_op_index: int, from_invalidate: bool) -> bytes:
    w = _Writer()
    w.buf.append(_TIMESTAMP)
    w.buf += struct.pack(">II", cluster_time.time, cluster_time.inc)
    w._integer(TOKEN_VERSION)
    w._integer(token_type)
    w._integer(txn_op_index)
    w.buf.append(_BOOL_TRUE if from_invalidate else _BOOL_FALSE)
    return bytes(w.buf)


def encode(data: ResumeTokenData) -> dict[str, Any]:
    """The ``{_data[, _typeBits]}`` document for ``data`` (mongod's ``ResumeToken::toDocument``)."""
    if data.version != TOKEN_VERSION:
        raise ValueError(f"only version {TOKEN_VERSION} resume tokens are produced, got {data.version}")
    if data.token_type == HIGH_WATER_MARK_TOKEN and (
        data.txn_op_index or data.from_invalidate or data.uuid or data.event_identifier is not None
    ):
        raise ValueError("a high water mark token carries only clusterTime, version and tokenType")
    if data.token_type == EVENT_TOKEN and data.event_identifier is None:
        raise ValueError("an event resume token needs an event identifier")
    w = _Writer()
    w.buf += _header(data.cluster_time, data.token_type, data.txn_op_index, data.from_invalidate)
    w.bits.extend(_TB_INT * 3)
    if data.uuid is None:
        w.buf.append(_NULLISH)
    else:
        w._bindata(data.uuid.bytes, 4)
    if data.event_identifier is not None:
        w.value(data.event_identifier)
    if data.fragment_num is not None:
        w.bits.extend(_TB_INT)
        w._integer(data.fragment_num)
    w.buf.append(_END)
    token: dict[str, Any] = {"_data": w.buf.hex().upper()}
    type_bits = w.type_bits()
    if type_bits:
        token["_typeBits"] = Binary(type_bits, 0)
    return token


def high_water_mark(cluster_time: Timestamp) -> dict[str, Any]:
    """The token mongod reports as postBatchResumeToken when no event was returned past ``cluster_time``."""
    return {"_data": (_header(cluster_time, HIGH_WATER_MARK_TOKEN, 0, False) + bytes([_NULLISH, _END])).hex().upper()}


class EventTokenEncoder:
    """Fast encoder for the tokens of CRUD events, caching the bytes that repeat between events.

    A change stream emits many events for the same collection and operation type; only the
    cluster time, transaction index and document key change. Building the token from cached
    byte strings keeps the per-event cost to a few concatenations.
    """

    __slots__ = ("_op_parts", "_last_ui", "_last_uuid_part", "_hex_ui", "_hex_middles", "_txn_hex")

    def __init__(self) -> None:
        self._op_parts: dict[str, bytes] = {}
        self._last_ui: Any = None
        self._last_uuid_part = b""
        self._hex_ui: Any = None  # the ``ui`` object ``_hex_middles`` were built for
        self._hex_middles: dict[tuple[str, int], str] = {}
        self._txn_hex: dict[int, str] = {}

    def crud_hex(self, cluster_time: Timestamp, txn_op_index: int, ui: Any, operation_type: str, key_hex: str) -> str:
        """``_data`` of a CRUD event token whose document key is simple (``key_hex``: ``simple_key_hex``).

        Such tokens carry no type bits; the hex string is spliced from cached hex pieces, which
        is what makes the change stream's per-event cost small.
        """
        if ui is not self._hex_ui:
            if not (self._hex_ui is not None and bytes(ui) == bytes(self._hex_ui)):
                self._hex_middles = {}
            self._hex_ui = ui
        middle = self._hex_middles.get((operation_type, txn_op_index))
        if middle is None:
            txn = self._txn_hex.get(txn_op_index)
            if txn is None:
                w = _Writer()
                w._integer(txn_op_index)
                txn = bytes(w.buf).hex().upper()
                if len(self._txn_hex) < 65536:
                    self._txn_hex[txn_op_index] = txn
            middle = (
                b"\x2b\x04\x2c\x01\x00".hex().upper()
                + txn
                + (b"\x6e\x5a\x10\x04" + as_uuid(ui).bytes).hex().upper()
                + (b"\x46\x3coperationType\x00\x3c" + operation_type.encode() + b"\x00\x46documentKey\x00\x46").hex().upper()
            )
            self._hex_middles[(operation_type, txn_op_index)] = middle
        return f"82{cluster_time.time:08X}{cluster_time.inc:08X}{middle}{key_hex}0004"

    def crud(
        self,
        cluster_time: Timestamp,
        txn_op_index: int,
        ui: Any,
        operation_type: str,
        document_key: Mapping[str, Any],
        key_part: bytes | None = None,
    ) -> dict[str, Any]:
        """Token of an insert/update/replace/delete event (``key_part``: ``simple_key_bytes`` if known)."""
        # Oplog entries usually carry a fresh Binary per entry, whose Python-level __hash__ and
        # __eq__ are slow: compare the raw bytes with the previous entry's instead.
        raw_ui = bytes(ui) if type(ui) is Binary else ui
        if raw_ui == self._last_ui:
            uuid_part = self._last_uuid_part
        else:
            uuid_part = self._last_uuid_part = b"\x6e\x5a\x10\x04" + as_uuid(ui).bytes
            self._last_ui = raw_ui
        op_part = self._op_parts.get(operation_type)
        if op_part is None:
            op_part = (
                b"\x46\x3coperationType\x00\x3c" + operation_type.encode() + b"\x00\x46documentKey\x00\x46"
            )
            self._op_parts[operation_type] = op_part
        if txn_op_index == 0:
            txn = b"\x29"
        else:
            w = _Writer()
            w._integer(txn_op_index)
            txn = bytes(w.buf)
        if key_part is None:
            key_part = simple_key_bytes(document_key)
        type_bits = b""
        if key_part is None:
            w = _Writer()
            # Bits so far: version, tokenType, txnOpIndex (ints) and operationType (a string).
            w.bits.extend((0, 0, 0, 0, 0, 0, 0))
            w._object_body(document_key)
            key_part = bytes(w.buf)
            type_bits = w.type_bits()
        data = (
            b"\x82"
            + struct.pack(">II", cluster_time.time, cluster_time.inc)
            + b"\x2b\x04\x2c\x01\x00"
            + txn
            + uuid_part
            + op_part
            + key_part
            + b"\x00\x04"
        )
        token: dict[str, Any] = {"_data": data.hex().upper()}
        if type_bits:
            token["_typeBits"] = Binary(type_bits, 0)
        return token


def simple_key_bytes(document_key: Mapping[str, Any]) -> bytes | None:
    """KeyString body of ``{_id: v}`` for the common ``_id`` types that add no type bits, else None.

    Covers int32, ObjectId and strings without going through the general writer; anything else
    (int64, doubles, compound keys) returns None and takes the general path.
    """
    if len(document_key) != 1:
        return None
    value = document_key.get("_id", _MISSING)
    kind = type(value)
    if kind is int and 0 < value < (1 << 31):
        shifted = value << 1
        nbytes = (shifted.bit_length() + 7) // 8
        return b"\x1e_id\x00" + bytes((_NUM_POS_1BYTE + nbytes - 1,)) + shifted.to_bytes(nbytes, "big") + b"\x00"
    if kind is ObjectId:
        return b"\x64_id\x00\x64" + value.binary + b"\x00"
    if kind is str:
        return b"\x3c_id\x00\x3c" + value.encode().replace(b"\x00", b"\x00\xff") + b"\x00\x00"
    return None


_OID_KEY_HEX = (b"\x64_id\x00\x64").hex().upper()


def simple_key_hex(document_key: Mapping[str, Any]) -> str | None:
    """``simple_key_bytes`` as upper-case hex (what the token's ``_data`` contains), or None."""
    if len(document_key) != 1:
        return None
    value = document_key.get("_id", _MISSING)
    kind = type(value)
    if kind is int and 0 < value < (1 << 31):
        shifted = value << 1
        nbytes = (shifted.bit_length() + 7) // 8
        return f"1E5F696400{_NUM_POS_1BYTE + nbytes - 1:02X}{shifted:0{2 * nbytes}X}00"
    if kind is ObjectId:
        return _OID_KEY_HEX + value.binary.hex().upper() + "00"
    raw = simple_key_bytes(document_key)
    return None if raw is None else raw.hex().upper()


def as_uuid(ui: Any) -> uuid.UUID:
    """A collection UUID from an oplog ``ui`` value (uuid.UUID or Binary subtype 4)."""
    if isinstance(ui, uuid.UUID):
        return ui
    if isinstance(ui, Binary) and ui.subtype == 4 and len(ui) == 16:
        return uuid.UUID(bytes=bytes(ui))
    raise ValueError(f"not a collection UUID: {ui!r}")


# -- decoding ------------------------------------------------------------------------------------


def _bad(code: int, errmsg: str) -> CommandError:
    return CommandError(code, f"Location{code}", errmsg)


class _Reader:
    """Reads KeyString values back (mongod's ``KeyString::toBsonSafe``)."""

    __slots__ = ("data", "pos", "bits", "bit_pos")

    def __init__(self, data: bytes, type_bits: bytes) -> None:
        self.data = data
        self.pos = 0
        self.bits = _type_bits_from_buffer(type_bits)
        self.bit_pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise command_error(INVALID_RESUME_TOKEN, "KeyString format error: resume token ended unexpectedly")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        return self.take(1)[0]

    def bit(self) -> int:
        i = self.bit_pos
        self.bit_pos += 1
        if i // 8 >= len(self.bits):
            return 0
        return (self.bits[i // 8] >> (i % 8)) & 1

    def cstring(self) -> bytes:
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise command_error(INVALID_RESUME_TOKEN, "KeyString format error: Failed to find null terminator in string.")
        out = self.data[self.pos : end]
        self.pos = end + 1
        return out

    def string_like(self) -> str:
        parts = [self.cstring()]
        while self.pos < len(self.data) and self.data[self.pos] == 0xFF:
            self.pos += 1
            parts.append(self.cstring())
        try:
            return b"\x00".join(parts).decode()
        except UnicodeDecodeError as exc:
            raise command_error(INVALID_RESUME_TOKEN, f"KeyString format error: invalid UTF-8 string: {exc}") from None

    def number_type(self) -> tuple[int, int]:
        return (self.bit(), self.bit())

    def value(self, ctype: int) -> Any:
        if ctype == _NULLISH:
            return None
        if ctype == _BOOL_TRUE:
            return True
        if ctype == _BOOL_FALSE:
            return False
        if ctype == _MIN_KEY:
            return MinKey()
        if ctype == _MAX_KEY:
            return MaxKey()
        if _NUM_NAN <= ctype <= _NUM_POS_LARGE:
            return self._number(ctype)
        if ctype == _STRING:
            self.bit()
            return self.string_like()
        if ctype == _OID:
            return ObjectId(self.take(12))
        if ctype == _OBJECT:
            return self.object_body()
        if ctype == _ARRAY:
            items = []
            while (c := self.byte()) != 0:
                items.append(self.value(c))
            return items
        if ctype == _BINDATA:
            size = self.byte()
            if size == 0xFF:
                (size,) = struct.unpack(">i", self.take(4))
            subtype = self.byte()
            raw = self.take(size)
            return uuid.UUID(bytes=raw) if subtype == 4 and size == 16 else Binary(raw, subtype)
        if ctype == _TIMESTAMP:
            seconds, inc = struct.unpack(">II", self.take(8))
            return Timestamp(seconds, inc)
        if ctype == _DATE:
            (raw_date,) = struct.unpack(">Q", self.take(8))
            millis = raw_date ^ (1 << 63)
            if millis >= 1 << 63:
                millis -= 1 << 64
            return DatetimeMS(millis)
        if ctype == _REGEX:
            return Regex(self.cstring().decode(), self.cstring().decode())
        if ctype == _CODE:
            return Code(self.string_like())
        raise command_error(INVALID_RESUME_TOKEN, f"KeyString format error: Unknown type: {ctype}")

    def object_body(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        while self.byte() != 0:
            name = self.cstring().decode(errors="replace")
            out[name] = self.value(self.byte())
        return out

    def _number(self, ctype: int) -> Any:
        kind = self.number_type()
        if ctype == _NUM_ZERO:
            if kind == _TB_DECIMAL:
                return self._special_zero()
            return _typed(0, kind)
        exponent_bits = None
        if kind == _TB_DECIMAL and ctype != _NUM_NAN and not self._is_infinity(ctype):
            exponent_bits = sum(self.bit() << shift for shift in range(5, -1, -1))
        if ctype == _NUM_NAN:
            return Decimal128("NaN") if kind == _TB_DECIMAL else math.nan
        negative = ctype < _NUM_ZERO
        dcm = 0
        if ctype in (_NUM_POS_LARGE, _NUM_NEG_LARGE):
            (enc,) = struct.unpack(">Q", _inv(self.take(8), negative))
            if enc == 0xFFFFFFFFFFFFFFFF:
                if kind == _TB_DECIMAL:
                    return Decimal128("-Infinity" if negative else "Infinity")
                return -math.inf if negative else math.inf
            dcm = _DCM_LARGER if enc & 1 else 0
            (magnitude,) = struct.unpack(">d", struct.pack(">Q", (enc >> 1) | (1 << 62)))
            value: float | int = magnitude
        elif ctype in (_NUM_POS_SMALL, _NUM_NEG_SMALL):
            (enc,) = struct.unpack(">Q", _inv(self.take(8), negative))
            if enc >> 62 != 3:
                raise command_error(INVALID_RESUME_TOKEN, "KeyString format error: unsupported tiny number")
            dcm = enc & 3
            (value,) = struct.unpack(">d", struct.pack(">Q", enc >> 2))
        else:
            nbytes = ctype - _NUM_POS_1BYTE + 1 if not negative else _NUM_NEG_1BYTE - ctype + 1
            if not 1 <= nbytes <= 8:
                raise command_error(INVALID_RESUME_TOKEN, f"KeyString format error: Unknown type: {ctype}")
            head = int.from_bytes(_inv(self.take(nbytes), negative), "big")
            if not head & 1:
                value = head >> 1
            else:
                fractional_bytes = 8 - nbytes
                tail = int.from_bytes(_inv(self.take(fractional_bytes), negative), "big") if fractional_bytes else 0
                dcm = tail & 3 if fractional_bytes else _DCM_LARGER
                value = (head >> 1) + (tail & ~3) / (256**fractional_bytes)
                if kind == _TB_DECIMAL and (head >> 1) >= (1 << 53):
                    value = head >> 1  # the integer part; the continuation holds the fraction
        if exponent_bits is not None:
            return self._decimal(value, dcm, exponent_bits, negative)
        return _typed(-value if negative else value, kind)

    @staticmethod
    def _is_infinity(ctype: int) -> bool:
        return False  # the exponent bits precede the value even for large magnitudes; infinity has none

    def _special_zero(self) -> Any:
        rest = [self.bit() for _ in range(3)]
        zero_type = 0b11000 | rest[0] << 2 | rest[1] << 1 | rest[2]
        if zero_type == 0x18:
            return -0.0
        which = ((zero_type - 0x1A) << 12) | sum(self.bit() << shift for shift in range(11, -1, -1))
        negative = which > _DECIMAL_MAX_BIASED_EXPONENT
        biased = which - (_DECIMAL_MAX_BIASED_EXPONENT + 1) if negative else which
        return Decimal128(Decimal((1 if negative else 0, (0,), biased - _DECIMAL_EXPONENT_BIAS)))

    def _decimal(self, value: float | int, dcm: int, exponent_bits: int, negative: bool) -> Decimal128:
        """Rebuild a NumberDecimal from its double, continuation and stored exponent bits."""
        if dcm in (_DCM_LESS, _DCM_LARGER):
            stored = Decimal(value) if isinstance(value, int) else _round_digits(Decimal(value), 34, ROUND_CEILING)
            stored = _to_34_digits(stored)
            (continuation,) = struct.unpack(">Q", _inv(self.take(8), negative))
            magnitude = _WIDE.add(stored, Decimal(continuation).scaleb(int(stored.as_tuple().exponent), context=_WIDE))
        elif dcm == _DCM_EQUAL_15_DIGITS:
            magnitude = _round_digits(Decimal(value), 15, ROUND_CEILING)
        else:
            magnitude = Decimal(value)
        return Decimal128(_with_exponent(magnitude.copy_negate() if negative else magnitude, exponent_bits))


def _with_exponent(value: Decimal, low_bits: int) -> Decimal:
    """``value`` at the exponent whose low six biased bits are ``low_bits`` (mongod keeps only
    those in the type bits) and that represents it exactly in at most 34 digits."""
    current = int(value.normalize(_WIDE).as_tuple().exponent) + _DECIMAL_EXPONENT_BIAS
    base = current - (current & 63) + low_bits
    for biased in sorted((base - 64, base, base + 64, base - 128), key=lambda e: (e > current, abs(e - current))):
        exponent = biased - _DECIMAL_EXPONENT_BIAS
        try:
            candidate = value.quantize(Decimal(1).scaleb(exponent), context=Context(prec=34, traps=[Inexact, InvalidOperation]))
        except (Inexact, InvalidOperation):
            continue
        if candidate == value:
            return candidate
    return value


def _typed(value: float | int, kind: tuple[int, int]) -> Any:
    if kind == _TB_DOUBLE or not float(value).is_integer():
        return float(value)
    if kind == _TB_LONG:
        return Int64(int(value))
    return int(value)


def _inv(raw: bytes, invert: bool) -> bytes:
    return bytes(b ^ 0xFF for b in raw) if invert else raw


def _type_bits_from_buffer(raw: bytes) -> bytes:
    if not raw:
        return b""
    first = raw[0]
    if 0 < first < 0x80:
        return raw[:1]
    if first > 0x80:
        return raw[1 : 1 + (first & 0x7F)]
    if first == 0x80 and len(raw) >= 5:
        (size,) = struct.unpack("<I", raw[1:5])
        return raw[5 : 5 + size]
    return b""


def token_bytes(token: Any) -> bytes:
    """The raw KeyString of a token document, validated as mongod's ``ResumeToken`` parser does."""
    if not isinstance(token, Mapping) or not isinstance(token.get("_data"), str):
        raise _bad(
            40647,
            f"Bad resume token: _data of missing or of wrong type. Expected string, got {token!r}",
        )
    data = token["_data"]
    type_bits = token.get("_typeBits")
    # BinData subtype 0 arrives as plain bytes (the server decodes commands with default options).
    if type_bits is not None and not (
        isinstance(type_bits, bytes) and (not isinstance(type_bits, Binary) or type_bits.subtype == 0)
    ):
        raise _bad(40648, f"Bad resume token: _typeBits of wrong type {token!r}")
    if not _HEX_RE.match(data):
        raise command_error(FAILED_TO_PARSE, "resume token string was not a valid hex string")
    return bytes.fromhex(data)


def decode(token: Any) -> ResumeTokenData:
    """Decode a ``{_data[, _typeBits]}`` document; raise mongod's errors for malformed tokens."""
    raw = token_bytes(token)
    if not raw:
        raise _bad(40649, "invalid empty resume token")
    type_bits = token.get("_typeBits")
    r = _Reader(raw, bytes(type_bits) if type_bits is not None else b"")
    if r.byte() != _TIMESTAMP:
        raise command_error(INVALID_RESUME_TOKEN, "Bad resume token: the first value is not the clusterTime timestamp")
    seconds, inc = struct.unpack(">II", r.take(8))
    values: list[Any] = []
    while (ctype := r.byte()) != _END:
        values.append(r.value(ctype))
        if r.pos >= len(raw):
            raise command_error(INVALID_RESUME_TOKEN, "KeyString format error: resume token has no end marker")
    return _token_data(Timestamp(seconds, inc), values)


def _token_data(cluster_time: Timestamp, values: list[Any]) -> ResumeTokenData:
    it = iter(values)
    version = next(it, None)
    if version is None:
        raise _bad(50796, "Resume Token does not contain version")
    if type(version) is not int:
        raise _bad(50854, "Invalid resume token: wrong type for version")
    if version not in (0, 1, 2):
        raise _bad(50795, "Invalid Resume Token: only supports version 0, 1 and 2")
    token_type = EVENT_TOKEN
    if version >= 1:
        token_type_value = next(it, None)
        if token_type_value is None:
            raise _bad(51055, "Resume Token does not contain tokenType")
        if type(token_type_value) is not int:
            raise _bad(51056, "Resume Token tokenType is not an int.")
        if token_type_value not in (EVENT_TOKEN, HIGH_WATER_MARK_TOKEN):
            raise _bad(51057, f"Token type {token_type_value} not recognized")
        token_type = token_type_value
    txn_op_index = next(it, None)
    if txn_op_index is None:
        raise _bad(50793, "Resume Token does not contain txnOpIndex")
    if type(txn_op_index) is not int:
        raise _bad(50855, "Resume Token txnOpIndex is not an integer")
    if txn_op_index < 0:
        raise _bad(50794, "Invalid Resume Token: txnOpIndex should be non-negative")
    from_invalidate = False
    if version >= 1:
        flag = next(it, _MISSING)
        if flag is _MISSING:
            raise _bad(50872, "Resume Token does not contain fromInvalidate")
        if not isinstance(flag, bool):
            raise _bad(50870, "Resume Token fromInvalidate is not a boolean.")
        from_invalidate = flag
    base = ResumeTokenData(cluster_time, version, token_type, txn_op_index, from_invalidate)
    ui = next(it, _MISSING)
    if ui is _MISSING:
        if version >= 2:
            raise _bad(6189500, "Expected UUID or null")
        return base
    if ui is not None and not isinstance(ui, uuid.UUID):
        raise command_error(INVALID_RESUME_TOKEN, f"Bad resume token: expected a collection UUID, got {ui!r}")
    event_identifier = next(it, _MISSING)
    if token_type == HIGH_WATER_MARK_TOKEN and event_identifier is not _MISSING:
        raise _bad(6189504, "Invalid high water mark token")
    if event_identifier is _MISSING:
        if token_type == EVENT_TOKEN and version >= 2:
            raise _bad(6189501, "Expected an eventIdentifier for an event resume token")
        return replace(base, uuid=ui)
    if not isinstance(event_identifier, dict):
        raise _bad(6189503, "Resume Token eventIdentifier is not an object")
    fragment = next(it, _MISSING)
    fragment_num = None
    if fragment is not _MISSING and version >= 2:
        if type(fragment) is not int or fragment < 0:
            raise _bad(7182501, "Resume token 'fragmentNum' must be a non-negative integer.")
        fragment_num = fragment
        fragment = next(it, _MISSING)
    if fragment is not _MISSING:
        raise _bad(40646, "invalid oversized resume token")
    return replace(base, uuid=ui, event_identifier=event_identifier, fragment_num=fragment_num)


_MISSING: Any = object()


def cluster_time_of(token: Mapping[str, Any]) -> Timestamp:
    """The clusterTime of a token, read the way tools written for real MongoDB read it."""
    raw = token_bytes(token)
    if len(raw) < 9 or raw[0] != _TIMESTAMP:
        raise command_error(INVALID_RESUME_TOKEN, "Bad resume token: the first value is not the clusterTime timestamp")
    seconds, inc = struct.unpack(">II", raw[1:9])
    return Timestamp(seconds, inc)
