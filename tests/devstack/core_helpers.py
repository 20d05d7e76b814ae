"""Small helpers shared by the emulator core tests."""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping
from typing import Any

import bson
from pymongo.collection import Collection


def one(coll: Collection[Any], query: Mapping[str, Any], projection: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``find_one`` that must find something."""
    found = coll.find_one(query, projection)
    assert found is not None, f"no document matches {dict(query)!r} in {coll.full_name}"
    return dict(found)


def recv_message(sock: socket.socket) -> bytes | None:
    """One whole wire message, or None when the server closed the connection."""
    header = _recv(sock, 16)
    if header is None:
        return None
    (length,) = struct.unpack_from("<i", header)
    rest = _recv(sock, length - 16)
    return None if rest is None else header + rest


def _recv(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except (ConnectionResetError, TimeoutError):
            return None
        if not chunk:
            return None
        data += chunk
    return data


def op_msg(request_id: int, body: Mapping[str, Any], flags: int = 0,
           sequences: Mapping[str, list[Mapping[str, Any]]] | None = None) -> bytes:  # fmt: skip
    """An OP_MSG with a kind-0 body and optional kind-1 document sequences."""
    sections = b"\x00" + bson.encode(body)
    for ident, docs in (sequences or {}).items():
        payload = ident.encode() + b"\x00" + b"".join(bson.encode(d) for d in docs)
        sections += b"\x01" + struct.pack("<i", len(payload) + 4) + payload
    message = struct.pack("<I", flags) + sections
    return struct.pack("<iiii", 16 + len(message), request_id, 0, 2013) + message


def reply_document(message: bytes) -> dict[str, Any]:
    """The body of an OP_MSG (2013) or OP_REPLY (1) reply."""
    (op_code,) = struct.unpack_from("<i", message, 12)
    if op_code == 1:
        return bson.decode(message[36:])
    assert op_code == 2013, op_code
    (flags,) = struct.unpack_from("<I", message, 16)
    end = len(message) - (4 if flags & 1 else 0)
    assert message[20] == 0
    return bson.decode(message[21:end])
