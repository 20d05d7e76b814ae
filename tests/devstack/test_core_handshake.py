"""Handshake, topology and diagnostics commands, plus the raw wire protocol over a socket."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import bson
import pytest
from bson import ObjectId
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import OperationFailure

from mongocdc_devstack.wire import crc32c

from .core_helpers import op_msg, recv_message, reply_document


@pytest.fixture
def raw(mongo_client: MongoClient) -> Iterator[socket.socket]:
    address = mongo_client.address
    assert address is not None
    sock = socket.create_connection(address, timeout=10)
    yield sock
    sock.close()


def test_hello_describes_a_writable_primary(mongo_client: MongoClient) -> None:
    reply = mongo_client.admin.command("hello")
    assert reply["isWritablePrimary"] is True and reply["secondary"] is False
    assert reply["setName"] and reply["primary"] in reply["hosts"] and reply["me"] == reply["primary"]
    assert isinstance(reply["electionId"], ObjectId) and reply["setVersion"] >= 1
    assert isinstance(reply["topologyVersion"]["processId"], ObjectId)
    assert reply["maxWireVersion"] >= 21 and reply["minWireVersion"] == 0
    assert reply["maxBsonObjectSize"] == 16 * 1024 * 1024 and reply["maxWriteBatchSize"] == 100_000
    assert reply["maxMessageSizeBytes"] == 48_000_000 and reply["logicalSessionTimeoutMinutes"] == 30
    assert "opTime" in reply["lastWrite"] and reply["readOnly"] is False
    assert "clusterTime" in reply["$clusterTime"] and "operationTime" in reply
    legacy = mongo_client.admin.command("isMaster")
    assert legacy["ismaster"] is True


def test_awaitable_hello_returns(mongo_client: MongoClient) -> None:
    first = mongo_client.admin.command("hello")
    again = mongo_client.admin.command("hello", topologyVersion=first["topologyVersion"], maxAwaitTimeMS=100)
    assert again["topologyVersion"] == first["topologyVersion"]


def test_diagnostic_commands(mongo_client: MongoClient) -> None:
    admin = mongo_client.admin
    info = admin.command("buildInfo")
    assert info["version"].startswith("7.0.") and info["versionArray"][:2] == [7, 0]
    assert admin.command("ping")["ok"] == 1.0
    status = admin.command("serverStatus")
    assert status["process"] == "mongod" and status["connections"]["current"] >= 1
    repl = admin.command("replSetGetStatus")
    assert repl["myState"] == 1 and repl["members"][0]["stateStr"] == "PRIMARY"
    assert admin.command("getParameter", 1, featureCompatibilityVersion=1)["featureCompatibilityVersion"]["version"]
    assert "authInfo" in admin.command("connectionStatus")
    assert "system" in admin.command("hostInfo")


def test_unknown_command(fresh_db: Database) -> None:
    with pytest.raises(OperationFailure) as info:
        fresh_db.command("frobnicate")
    assert info.value.code == 59 and "no such command: 'frobnicate'" in str(info.value)


def test_legacy_op_query_handshake(raw: socket.socket) -> None:
    query = bson.encode({"isMaster": 1})
    body = struct.pack("<i", 0) + b"admin.$cmd\x00" + struct.pack("<ii", 0, -1) + query
    raw.sendall(struct.pack("<iiii", 16 + len(body), 7, 0, 2004) + body)
    message = recv_message(raw)
    assert message is not None
    length, _, response_to, op_code = struct.unpack_from("<iiii", message)
    assert (op_code, response_to, length) == (1, 7, len(message))
    reply = reply_document(message)
    assert reply["ismaster"] is True and reply["ok"] == 1.0


def test_document_sequences_and_more_to_come(raw: socket.socket, fresh_db: Database) -> None:
    raw.sendall(op_msg(1, {"insert": "c", "$db": fresh_db.name}, sequences={"documents": [{"_id": 1}, {"_id": 2}]}))
    message = recv_message(raw)
    assert message is not None and reply_document(message)["n"] == 2
    unacknowledged = {"insert": "c", "$db": fresh_db.name, "writeConcern": {"w": 0}}
    raw.sendall(op_msg(2, unacknowledged, flags=2, sequences={"documents": [{"_id": 3}]}))
    raw.sendall(op_msg(3, {"count": "c", "$db": fresh_db.name}))
    message = recv_message(raw)
    assert message is not None
    assert struct.unpack_from("<i", message, 8)[0] == 3  # the reply answers request 3, not 2
    assert reply_document(message)["n"] == 3


def test_checksum_is_verified(raw: socket.socket) -> None:
    plain = op_msg(5, {"ping": 1, "$db": "admin"}, flags=1)
    length = struct.unpack_from("<i", plain)[0] + 4
    framed = struct.pack("<i", length) + plain[4:]
    raw.sendall(framed + struct.pack("<I", crc32c(framed)))
    message = recv_message(raw)
    assert message is not None and reply_document(message)["ok"] == 1.0


def _bad_checksum() -> bytes:
    plain = op_msg(9, {"ping": 1, "$db": "admin"}, flags=1)
    return struct.pack("<i", len(plain) + 4) + plain[4:] + b"\x01\x02\x03\x04"


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack("<iiii", 10, 1, 0, 2013),  # length shorter than a header
        struct.pack("<iiii", 200_000_000, 1, 0, 2013),  # longer than maxMessageSizeBytes
        struct.pack("<iiii", 21, 1, 0, 9999) + b"\x00" * 5,  # unknown opcode
        struct.pack("<iiii", 30, 1, 0, 2013) + struct.pack("<I", 0) + b"\x00" + struct.pack("<i", 9) + b"\x00" * 5,  # bad BSON
        _bad_checksum(),
    ],
)
def test_malformed_messages_never_take_the_server_down(raw: socket.socket, mongo_client: MongoClient, garbage: bytes) -> None:
    raw.sendall(garbage)
    raw.settimeout(5)
    message = recv_message(raw)
    if message is not None:  # an error reply instead of closing is acceptable
        assert reply_document(message)["ok"] == 0
    assert mongo_client.admin.command("ping")["ok"] == 1.0
