"""The emulator's listener: TCP (optionally TLS) connections speaking MongoDB's wire protocol.

``WireServer`` owns the socket, the connections, the framing of requests and replies, TLS and the
access-control hooks; the emulated mongod (``server.EmulatorServer``) and mongos
(``sharding.MongosServer``) derive from it and answer requests in their own ``execute``.
"""

from __future__ import annotations

import ipaddress
import itertools
import socket
import socketserver
import ssl
import threading
from abc import ABC, abstractmethod
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument

from . import wire
from .auth import AccessControl
from .errors import PROTOCOL_ERROR, command_error


class Connection:
    """One client connection; ``close`` is used by fault injection to drop it."""

    _ids = itertools.count(1)

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.id = next(self._ids)
        self.closed = False
        self.app_name: str | None = None
        self.send_lock = threading.Lock()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(socketserver.BaseRequestHandler):
    server: _TCPServer

    def handle(self) -> None:
        listener = self.server.listener
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if listener.tls_context is not None:
            try:
                sock = listener.tls_context.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, OSError):
                return  # a client that does not speak TLS, or refused our certificate
        conn = Connection(sock, f"{self.client_address[0]}:{self.client_address[1]}")
        listener.add_connection(conn)
        try:
            listener.serve_connection(conn)
        finally:
            listener.remove_connection(conn)


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], listener: WireServer) -> None:
        self.listener = listener
        super().__init__(address, _Handler)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class WireServer(ABC):
    """A TCP listener speaking MongoDB's wire protocol: connections, framing, TLS, access control.

    The emulated mongod (``EmulatorServer``) and mongos (``sharding.MongosServer``) are both one;
    each answers requests in its own ``execute``.
    """

    def __init__(self, host: str, port: int, tls_certificate_key_file: str | None, access: AccessControl) -> None:
        self.access = access
        self.tls_context: ssl.SSLContext | None = None
        if tls_certificate_key_file:
            self.tls_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls_context.load_cert_chain(tls_certificate_key_file)
        self._connections: dict[int, Connection] = {}
        self._conn_lock = threading.Lock()
        self._request_ids = itertools.count(1)
        self._stop = threading.Event()
        self._tcp = _TCPServer((host, port), self)

    @property
    def port(self) -> int:
        return int(self._tcp.server_address[1])

    @abstractmethod
    def execute(self, request: wire.Request, conn: Connection) -> list[bytes] | None:
        """The encoded reply to one request (None: the connection was dropped)."""

    def authorize(self, conn: Connection, db: str, name: str, cmd: dict[str, Any]) -> None:
        """mongod's access control before a command runs (code 13 Unauthorized)."""
        self.access.authorize(conn, _is_loopback(conn.peer), db, name, cmd)

    def amend_reply(self, conn: Connection, name: str, cmd: dict[str, Any], reply: dict[str, Any]) -> None:
        """What access control adds to replies: SASL in the handshake, only visible databases."""
        if name in ("hello", "isMaster", "ismaster"):
            self.access.amend_hello(conn, cmd, reply)
        elif name == "listDatabases" and isinstance(reply.get("databases"), list):
            visible = set(self.access.visible_databases(conn, [d.get("name") for d in reply["databases"]]))
            if len(visible) != len(reply["databases"]):
                reply["databases"] = [d for d in reply["databases"] if d.get("name") in visible]
                if "totalSize" in reply:
                    reply["totalSize"] = sum(d.get("sizeOnDisk", 0) for d in reply["databases"])

    # -- connections ----------------------------------------------------------------------
    def add_connection(self, conn: Connection) -> None:
        with self._conn_lock:
            self._connections[conn.id] = conn

    def remove_connection(self, conn: Connection) -> None:
        with self._conn_lock:
            self._connections.pop(conn.id, None)

    def connection_count(self) -> int:
        with self._conn_lock:
            return len(self._connections)

    def drop_connections(self, keep: Connection | None = None) -> int:
        with self._conn_lock:
            victims = [c for c in self._connections.values() if c is not keep]
        for conn in victims:
            conn.close()
        return len(victims)

    def serve_connection(self, conn: Connection) -> None:
        """Read messages until the client goes away; malformed framing closes the connection."""
        sock = conn.sock
        while not conn.closed and not self._stop.is_set():
            try:
                head = _recv_exact(sock, wire.HEADER.size)
                if head is None:
                    return
                header = wire.parse_header(head)
                body = _recv_exact(sock, header.length - wire.HEADER.size)
                if body is None:
                    return
            except wire.WireError:
                return  # the stream cannot be re-synchronised
            except OSError:
                return
            try:
                request = wire.parse_message(header, body)
            except wire.WireError as exc:
                if header.op_code not in (wire.OP_MSG, wire.OP_QUERY):
                    return
                payload = bson.encode(command_error(PROTOCOL_ERROR, str(exc)).to_reply())
                self._send(conn, wire.encode_op_msg(next(self._request_ids), header.request_id, payload)
                           if header.op_code == wire.OP_MSG
                           else wire.encode_op_reply(next(self._request_ids), header.request_id, payload))  # fmt: skip
                continue
            reply = self.execute(request, conn)
            if reply is None or request.more_to_come:
                continue
            if request.legacy:
                message = wire.encode_op_reply(next(self._request_ids), header.request_id, reply)
            elif request.exhaust_allowed and next(iter(request.command), None) == "getMore":
                if not self._stream_exhaust(conn, request, reply):
                    return
                continue
            else:
                message = wire.encode_op_msg(next(self._request_ids), header.request_id, reply, request.checksum)
            if not self._send(conn, message):
                return

    def _stream_exhaust(self, conn: Connection, request: wire.Request, reply: list[bytes]) -> bool:
        """An exhaust getMore: while the cursor stays open, reply with ``moreToCome`` and run the
        getMore again on the client's behalf, each reply answering the previous one."""
        response_to = request.header.request_id
        while True:
            open_cursor = _cursor_id(reply) != 0
            request_id = next(self._request_ids)
            message = wire.encode_op_msg(request_id, response_to, reply, request.checksum, more_to_come=open_cursor)
            if not self._send(conn, message):
                return False
            if not open_cursor:
                return True
            response_to = request_id
            next_reply = self.execute(request, conn)
            if next_reply is None:
                return False
            reply = next_reply

    def _send(self, conn: Connection, message: bytes) -> bool:
        try:
            with conn.send_lock:
                conn.sock.sendall(message)
            return True
        except OSError:
            return False


def _cursor_id(reply: list[bytes]) -> int:
    """The cursor id of an encoded reply (0 when it has none or is an error)."""
    try:
        document = bson.decode(b"".join(reply), codec_options=bson.CodecOptions(document_class=RawBSONDocument))
        cursor = document.get("cursor")
        return int(cursor["id"]) if cursor is not None and document.get("ok") == 1 else 0
    except Exception:
        return 0


def _is_loopback(peer: str) -> bool:
    """Whether a ``host:port`` peer connects from this machine (mongod's localhost exception)."""
    host = peer.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
