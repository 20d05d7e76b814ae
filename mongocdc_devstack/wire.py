"""MongoDB wire protocol framing: OP_MSG, legacy OP_QUERY/OP_REPLY, CRC-32C checksums.

Only the framing lives here; what a command means is decided by the server's dispatcher. Parsing
is strict because a malformed message must become an error for that one connection, never a
crash of the server: every problem raises ``WireError`` with a message naming what is wrong.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013

FLAG_CHECKSUM_PRESENT = 1 << 0
FLAG_MORE_TO_COME = 1 << 1
FLAG_EXHAUST_ALLOWED = 1 << 16
# Bits 0-15 are "required": a receiver must reject a message with a required bit it does not know.
_KNOWN_REQUIRED_BITS = FLAG_CHECKSUM_PRESENT | FLAG_MORE_TO_COME

HEADER = struct.Struct("<iiii")
MAX_MESSAGE_SIZE = 48_000_000
MAX_BSON_OBJECT_SIZE = 16 * 1024 * 1024

# Decode commands as plain dicts; UUIDs stay bson Binary (subtype 4) so every stored value
# re-encodes with default codec options, as the oplog does when it sizes entries. Dates outside
# Python's datetime range (MongoDB stores any 64-bit millisecond count) stay DatetimeMS.
CODEC: CodecOptions[dict[str, Any]] = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)


class WireError(Exception):
    """A message that cannot be parsed; the connection replies with an error or is closed."""


def _make_crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C_TABLE = _make_crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) as OP_MSG checksums use it; table driven, only used when clients ask."""
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@dataclass
class Header:
    length: int
    request_id: int
    response_to: int
    op_code: int


def parse_header(data: bytes) -> Header:
    """Parse and bound-check the 16-byte message header."""
    length, request_id, response_to, op_code = HEADER.unpack(data)
    if length < HEADER.size + 1 or length > MAX_MESSAGE_SIZE:
        raise WireError(f"message length {length} is outside 17..{MAX_MESSAGE_SIZE} bytes")
    return Header(length, request_id, response_to, op_code)


@dataclass
class Request:
    """One decoded client request: the command document and how to answer it."""

    header: Header
    command: dict[str, Any]
    flags: int = 0
    legacy: bool = False  # OP_QUERY: answer with OP_REPLY
    checksum: bool = False

    @property
    def more_to_come(self) -> bool:
        return bool(self.flags & FLAG_MORE_TO_COME)

    @property
    def exhaust_allowed(self) -> bool:
        """A getMore whose later batches the server may stream without further requests."""
        return bool(self.flags & FLAG_EXHAUST_ALLOWED)


def _decode_one(data: bytes | memoryview, what: str) -> dict[str, Any]:
    try:
        return bson.decode(data, CODEC)
    except Exception as exc:  # bson raises InvalidBSON, but also ValueError/struct errors
        raise WireError(f"invalid BSON in {what}: {exc}") from exc


def _bson_length(body: memoryview, pos: int, what: str) -> int:
    if pos + 5 > len(body):
        raise WireError(f"truncated BSON document in {what}")
    (size,) = struct.unpack_from("<i", body, pos)
    if size < 5 or pos + size > len(body):
        raise WireError(f"BSON document length {size} in {what} overruns the message")
    return size


def parse_op_msg(header: Header, body: bytes) -> Request:
    """Decode an OP_MSG body (everything after the header) into a command document.

    Kind-1 document sequences are merged into the command as arrays, as mongod does.
    """
    if len(body) < 5:
        raise WireError("OP_MSG is too short")
    (flags,) = struct.unpack_from("<I", body, 0)
    unknown = flags & 0xFFFF & ~_KNOWN_REQUIRED_BITS
    if unknown:
        raise WireError(f"OP_MSG has unknown required flag bits {unknown:#x}")
    end = len(body)
    checksum = bool(flags & FLAG_CHECKSUM_PRESENT)
    if checksum:
        if end < 9:
            raise WireError("OP_MSG with checksumPresent is too short")
        end -= 4
        (expected,) = struct.unpack_from("<I", body, end)
        whole = HEADER.pack(header.length, header.request_id, header.response_to, header.op_code) + body[:end]
        if crc32c(whole) != expected:
            raise WireError("OP_MSG checksum mismatch")
    view = memoryview(body)[:end]
    pos = 4
    command: dict[str, Any] | None = None
    sequences: dict[str, list[dict[str, Any]]] = {}
    while pos < end:
        kind = view[pos]
        pos += 1
        if kind == 0:
            if command is not None:
                raise WireError("OP_MSG has more than one kind-0 section")
            size = _bson_length(view, pos, "OP_MSG body")
            command = _decode_one(view[pos : pos + size], "OP_MSG body")
            pos += size
        elif kind == 1:
            if pos + 4 > end:
                raise WireError("truncated OP_MSG document sequence")
            (size,) = struct.unpack_from("<i", view, pos)
            stop = pos + size
            if size < 5 or stop > end:
                raise WireError(f"OP_MSG document sequence length {size} overruns the message")
            nul = body.find(b"\x00", pos + 4, stop)
            if nul < 0:
                raise WireError("OP_MSG document sequence identifier is not terminated")
            ident = bytes(view[pos + 4 : nul]).decode("utf-8", "replace")
            cursor = nul + 1
            docs = sequences.setdefault(ident, [])
            while cursor < stop:
                dsize = _bson_length(view[:stop], cursor, f"document sequence {ident!r}")
                docs.append(_decode_one(view[cursor : cursor + dsize], f"document sequence {ident!r}"))
                cursor += dsize
            pos = stop
        else:
            raise WireError(f"OP_MSG section kind {kind} is not 0 or 1")
    if command is None:
        raise WireError("OP_MSG has no kind-0 body section")
    for ident, docs in sequences.items():
        if ident in command:
            raise WireError(f"OP_MSG document sequence {ident!r} duplicates a body field")
        command[ident] = docs
    return Request(header, command, flags=flags, checksum=checksum)


def parse_op_query(header: Header, body: bytes) -> Request:
    """Decode a legacy OP_QUERY; only commands on ``<db>.$cmd`` are accepted (the handshake)."""
    if len(body) < 4 + 1 + 8 + 5:
        raise WireError("OP_QUERY is too short")
    nul = body.find(b"\x00", 4)
    if nul < 0:
        raise WireError("OP_QUERY collection name is not terminated")
    full_name = body[4:nul].decode("utf-8", "replace")
    pos = nul + 1 + 8
    view = memoryview(body)
    size = _bson_length(view, pos, "OP_QUERY query")
    query = _decode_one(view[pos : pos + size], "OP_QUERY query")
    db, _, coll = full_name.partition(".")
    if coll != "$cmd":
        raise WireError(f"OP_QUERY on {full_name!r} is not supported; only commands on <db>.$cmd are")
    if "$query" in query:
        query = dict(query["$query"])
    query["$db"] = db
    return Request(header, query, legacy=True)


def parse_message(header: Header, body: bytes) -> Request:
    if header.op_code == OP_MSG:
        return parse_op_msg(header, body)
    if header.op_code == OP_QUERY:
        return parse_op_query(header, body)
    raise WireError(f"unsupported opCode {header.op_code}")


def encode_op_msg(request_id: int, response_to: int, payload: bytes | Sequence[bytes], checksum: bool = False,
                  more_to_come: bool = False) -> bytes:  # fmt: skip
    """Frame a BSON-encoded reply document (whole, or as consecutive pieces) as an OP_MSG.

    The pieces are joined once, together with the header: a change stream reply can be 16 MiB,
    and every extra copy of it costs as much as encoding a few thousand events.
    """
    parts = (payload,) if isinstance(payload, bytes) else payload
    flags = (FLAG_CHECKSUM_PRESENT if checksum else 0) | (FLAG_MORE_TO_COME if more_to_come else 0)
    length = HEADER.size + 4 + 1 + sum(map(len, parts)) + (4 if checksum else 0)
    message = b"".join((HEADER.pack(length, request_id, response_to, OP_MSG), struct.pack("<I", flags), b"\x00", *parts))
    if checksum:
        message += struct.pack("<I", crc32c(message))
    return message


def encode_op_reply(request_id: int, response_to: int, payload: bytes | Sequence[bytes]) -> bytes:
    """Frame a reply document (whole, or as consecutive pieces) as a legacy OP_REPLY with one document."""
    parts = (payload,) if isinstance(payload, bytes) else payload
    length = HEADER.size + 20 + sum(map(len, parts))
    return b"".join((HEADER.pack(length, request_id, response_to, OP_REPLY), struct.pack("<iqii", 0, 0, 0, 1), *parts))


_CURSOR_ELEMENT = b"\x03cursor\x00"


def encode_reply(reply: dict[str, Any]) -> list[bytes]:
    """The reply's BSON as pieces to frame; a leading raw ``cursor`` (a batch) is not copied here."""
    cursor = reply.get("cursor")
    if isinstance(cursor, RawBSONDocument) and next(iter(reply)) == "cursor":
        rest = bson.encode({key: value for key, value in reply.items() if key != "cursor"})
        raw = bytes(cursor.raw)  # no copy: it already is bytes
        size = 4 + len(_CURSOR_ELEMENT) + len(raw) + len(rest) - 4
        return [struct.pack("<i", size), _CURSOR_ELEMENT, raw, rest[4:]]
    return [bson.encode(reply)]
