"""The emulated sharded cluster: a mongos in front of emulated shards, each its own replica set.

Each shard is a whole ``EmulatorServer`` (its own replica set name, port, oplog, cluster clock,
sessions and fault injection; clients may connect to it directly, e.g. to step it down). The
mongos (``MongosServer``) speaks the wire protocol like mongos: ``hello`` answers
``msg: "isdbgrid"``, commands are routed with the ``Layout`` (databases' primary shards, placed
collections, chunks of sharded ones) and run in-process through each shard's own dispatcher, as
the cluster-internal ``__system`` user, gossiping cluster time both ways as MongoDB does.

Change streams through the mongos open one stream per shard from the same point and merge them
(``MergedChangeStream``): an event is returned only once every other shard has reported a
position past it (its events or its post-batch resume token, advanced by each shard's periodic
no-op writes), so the merged stream is in resume token order, which starts with the clusterTime.
Tokens are the shards' own (the same format a replica set uses); resuming sends the token's
clusterTime to every shard and drops what sorts at or before the token, and an event token must
be found again, as mongos requires. Transactions spanning shards commit on every participant at
one shared clusterTime, as a two-phase commit does.

``moveChunk`` migrates the chunk's documents as mongod does: the recipient inserts them and the
donor deletes them, both with ``fromMigrate: true`` (change streams do not report them), and the
chunk changes owner and version in one step. Commands that route by chunk hold the mongos'
migration gate shared, a migration holds it alone (mongod's critical section, here the whole
migration), so every read and write through the mongos sees the chunk wholly before or wholly after
it. Open transactions that touched the collection on either shard are aborted. The recipient's
insert and the donor's delete of a document share one cluster time, so a snapshot read at any past
cluster time (sent to every shard) finds each document exactly once. The donor deletes at once, as
``_waitForDelete: true`` makes mongod do (by default its range deleter runs later).

Limits (documented, refused with an error where a client could notice): a shard key value cannot
be changed by an update, sharded collections cannot be renamed, hashed shard keys are not supported.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import bson
from bson import Int64, ObjectId, Timestamp, json_util
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from . import changestream, matching, wire
from . import resume_token as rt
from .auth import AccessControl
from .commands import auth as auth_commands
from .commands.admin import MAX_WIRE_VERSION, MAX_WRITE_BATCH_SIZE, VERSION, VERSION_ARRAY
from .cursors import DEFAULT_FIRST_BATCH, CursorRegistry, ListCursor, TailableCursor, cursor_document
from .errors import (
    BAD_VALUE,
    CHANGE_STREAM_FATAL_ERROR,
    COMMAND_NOT_FOUND,
    FAILED_TO_PARSE,
    ILLEGAL_OPERATION,
    INVALID_NAMESPACE,
    RETRYABLE_CODES,
    TYPE_MISMATCH,
    UNAUTHORIZED,
    CommandError,
    command_error,
)
from .layout import Chunk, Layout
from .listener import Connection, WireServer
from .mongod import EmulatorServer, ServerConfig
from .state import check_namespace, now_ms

RAW: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)
HOST_UNREACHABLE = (6, "HostUnreachable")
FAILED_TO_SATISFY_READ_PREFERENCE = (133, "FailedToSatisfyReadPreference")
NO_SUCH_TRANSACTION = (251, "NoSuchTransaction")
PRIMARY_WAIT_SECONDS = 15.0  # how long mongos waits for a shard to elect a primary before giving up
_HEADER = wire.Header(0, 0, 0, wire.OP_MSG)
# Fields of a client command the mongos passes on to the shards it targets.
_FORWARDED = ("lsid", "txnNumber", "writeConcern", "readConcern", "maxTimeMS", "comment", "let", "collation", "hint",
              "bypassDocumentValidation")  # fmt: skip
# Aggregation stages a shard can run on its own documents before the mongos merges the results.
_SHARD_LOCAL_STAGES = frozenset({"$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot", "$replaceWith",
                                 "$unwind", "$redact"})  # fmt: skip
# Commands that route by chunk: they run under the migration gate, shared.
_ROUTED = frozenset({"find", "count", "distinct", "aggregate", "insert", "update", "delete", "findAndModify", "findandmodify",
                     "commitTransaction"})  # fmt: skip


class MigrationGate:
    """Routed commands hold it shared, a chunk migration alone; a waiting migration lets no new
    command in, so a writer that never stops cannot starve it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._commands = 0
        self._migrating = False
        self._waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._migrating or self._waiting:
                self._cond.wait()
            self._commands += 1
        try:
            yield
        finally:
            with self._cond:
                self._commands -= 1
                if not self._commands:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                while self._migrating or self._commands:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._migrating = True
        try:
            yield
        finally:
            with self._cond:
                self._migrating = False
                self._cond.notify_all()


@dataclass
class ClusterConfig:
    """A mongos on ``port`` and ``shards`` shards on the next ports (or ``shard_ports``)."""

    host: str = "127.0.0.1"
    port: int = 27017
    shards: int = 2
    shard_ports: Sequence[int] | None = None
    layout: Mapping[str, Any] | None = None
    oplog_size_mb: float = 192.0
    noop_interval: float = 1.0
    dbpath: str | None = None
    auth: bool = False
    users_file: str | None = None
    tls_certificate_key_file: str | None = None

    def shard_names(self) -> list[str]:
        return [f"shard{i}" for i in range(self.shards)]


class _Link:
    """The mongos' connection to one shard: commands run in-process through the shard's dispatcher."""

    def __init__(self, name: str, server: EmulatorServer) -> None:
        self.name = name
        self.server = server
        self.conn = Connection(socket.socket(), f"mongos/{name}")
        server.access.authenticate_internal(self.conn)

    def call(self, cmd: dict[str, Any], cluster_time: Timestamp, raw: bool) -> Mapping[str, Any]:
        with self.server.oplog.cond:  # cluster time gossip: the shard never issues a time the mongos passed
            self.server.oplog.clock.advance_to(cluster_time)
        pieces = self.server.execute(wire.Request(_HEADER, cmd), self.conn)
        if pieces is None:
            raise command_error(HOST_UNREACHABLE, f"connection to shard {self.name} ({self.server.config.address}) was closed")
        data = b"".join(pieces)
        if raw:
            return RawBSONDocument(data)
        decoded: dict[str, Any] = bson.decode(data, wire.CODEC)
        return decoded

    def close(self) -> None:
        self.conn.sock.close()


class ShardedCluster:
    """The shards, the routing layout and the mongos of one emulated sharded cluster."""

    def __init__(self, config: ClusterConfig) -> None:
        if config.shards < 1:
            raise ValueError(f"a sharded cluster needs at least one shard, got {config.shards}")
        self.config = config
        names = config.shard_names()
        ports = list(config.shard_ports) if config.shard_ports else [0] * len(names)
        if len(ports) != len(names):
            raise ValueError(f"{len(names)} shards need {len(names)} shard ports, got {len(ports)}")
        self.shards: dict[str, EmulatorServer] = {}
        try:
            for name, port in zip(names, ports, strict=True):
                dbpath = os.path.join(config.dbpath, name) if config.dbpath else None
                self.shards[name] = EmulatorServer(ServerConfig(
                    config.host, port, name, config.oplog_size_mb, config.noop_interval, dbpath, config.auth,
                    config.users_file, config.tls_certificate_key_file,
                ))  # fmt: skip
            self.links = {name: _Link(name, server) for name, server in self.shards.items()}
            self.layout = Layout(names, {n: f"{n}/{s.config.address}" for n, s in self.shards.items()})
            layout_file = os.path.join(config.dbpath, "layout.json") if config.dbpath else None
            self.layout_file = layout_file
            if layout_file and os.path.exists(layout_file):
                with open(layout_file, encoding="utf-8") as handle:
                    self.layout.load(json_util.loads(handle.read()))
            elif config.layout:
                self.layout.load(config.layout)
            self.mongos = MongosServer(self)
        except BaseException:
            for server in self.shards.values():
                server._tcp.server_close()  # never started: nothing to stop but the listening socket
            raise
        self.save_layout()

    @property
    def port(self) -> int:
        return self.mongos.port

    def save_layout(self) -> None:
        """Keep the routing table with ``--dbpath`` (config servers persist it in MongoDB)."""
        if self.layout_file is None:
            return
        layout = self.layout
        with layout.lock:
            data = {
                "databases": dict(layout.primaries),
                "collections": {
                    **{ns: {"shard": shard} for ns, shard in layout.placed.items()},
                    **{ns: {"key": c.key, "chunks": [
                        {"shard": ch.shard, **({"max": ch.high_doc} if ch.high is not None else {})} for ch in c.chunks]}
                       for ns, c in layout.sharded.items()},
                },
            }  # fmt: skip
        tmp = self.layout_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(json_util.dumps(data, json_options=json_util.CANONICAL_JSON_OPTIONS))
        os.replace(tmp, self.layout_file)

    def start(self) -> ShardedCluster:
        for server in self.shards.values():
            server.start()
        self.mongos.start()
        return self

    def shutdown(self) -> None:
        self.mongos.shutdown()
        for name, server in self.shards.items():
            server.faults.cancel()
            server.shutdown()
            self.links[name].close()

    def migrate(self, ns: str, chunk: Chunk, to: str) -> None:
        """Move ``chunk``'s documents from its shard to ``to`` and hand the chunk over (the caller
        holds the migration gate). Both shards are held throughout: transactions on the collection
        are aborted, the recipient gets the collection if it lacks it, then each document is
        inserted on the recipient and deleted from the donor at one cluster time, and the chunk
        moves as of the last of them."""
        db, coll = ns.split(".", 1)
        donor_name = chunk.shard
        donor, recipient = self.shards[donor_name].state, self.shards[to].state
        for name in (donor_name, to):
            self.wait_for_primary(name)
        sharded = self.layout.sharded[ns]
        with contextlib.ExitStack() as stack:
            for name in sorted((donor_name, to), key=self.layout.shards.index):
                stack.enter_context(self.shards[name].oplog.cond)
            for state in (donor, recipient):
                state.abort_transactions_on(db, coll)
            source = donor.catalog.get(db, {}).get(coll)
            moving = [(key, stored) for key, stored in source.docs.items() if chunk.holds(sharded.point(stored[0]))] if source else []
            if source is not None:
                recipient.receive_collection(source)
            start = max((donor.oplog.clock.current(), recipient.oplog.clock.current(), self.mongos.cluster_time),
                        key=lambda t: (t.time, t.inc))  # fmt: skip
            for state in (donor, recipient):
                state.oplog.clock.advance_to(start)
            moves = [(recipient.oplog.clock.next(), key, stored) for key, stored in moving]
            if moves:
                recipient.migrate_documents(db, coll, moves, incoming=True)
                donor.migrate_documents(db, coll, moves, incoming=False)
            commit = moves[-1][0] if moves else start
            self.layout.move(ns, chunk, to, commit)
            self.mongos.advance(commit)

    def wait_for_primary(self, shard: str) -> None:
        """Block until ``shard`` has a primary (an election after a step-down), as mongos targeting does."""
        topology = self.shards[shard].topology
        deadline = time.monotonic() + PRIMARY_WAIT_SECONDS
        with topology.cond:
            while not topology.primary and not topology.stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise command_error(
                        FAILED_TO_SATISFY_READ_PREFERENCE,
                        f'Could not find host matching read preference {{ mode: "primary" }} for set {shard}',
                    )
                topology.cond.wait(remaining)


@dataclass
class _RouterTxn:
    """A transaction as the mongos tracks it: which shards joined it."""

    number: int
    participants: list[str] = field(default_factory=list)
    read_concern: Any = None


@dataclass
class MongosContext:
    server: MongosServer
    conn: Connection
    db: str
    cmd: dict[str, Any]
    name: str
    txn: _RouterTxn | None = None

    @property
    def arg(self) -> Any:
        return self.cmd[self.name]

    @property
    def layout(self) -> Layout:
        return self.server.cluster.layout

    def collection(self) -> str:
        value = self.arg
        if not isinstance(value, str) or not value:
            raise command_error(INVALID_NAMESPACE, f"collection name has invalid type {type(value).__name__}"
                                if not isinstance(value, str) else "Invalid namespace specified ''")  # fmt: skip
        check_namespace(self.db, value)
        if self.db == "local":
            raise command_error(ILLEGAL_OPERATION, "Can't use 'local' database through mongos")
        return value

    def forward(self, shard: str, body: dict[str, Any], raw: bool = False, retryable: bool = True,
                at: Timestamp | None = None) -> Mapping[str, Any]:  # fmt: skip
        """Run ``body`` on ``shard`` with the client's session, transaction and generic fields
        (``at``: the cluster time to gossip instead of the mongos' own)."""
        cmd = dict(body)
        cmd.setdefault("$db", self.db)
        for name in _FORWARDED:
            if name in self.cmd and name not in cmd and (retryable or name != "txnNumber"):
                cmd[name] = self.cmd[name]
        if self.txn is not None:
            self.server.join_transaction(self, shard, cmd)
        return self.server.call(shard, cmd, raw=raw, at=at)

    def exhaust(self, shard: str, body: dict[str, Any]) -> list[RawBSONDocument]:
        """Every document of a cursor command on ``shard`` (first batch and getMores)."""
        reply = self.forward(shard, body, raw=True)
        cursor = reply["cursor"]
        docs = list(cursor["firstBatch"])
        cursor_id, ns = int(cursor["id"]), str(cursor["ns"])
        while cursor_id:
            more = self.forward(shard, {"getMore": Int64(cursor_id), "collection": ns.split(".", 1)[1]}, raw=True)["cursor"]
            docs.extend(more["nextBatch"])
            cursor_id = int(more["id"])
        return docs


Handler = Callable[[MongosContext], dict[str, Any]]
MONGOS_COMMANDS: dict[str, Handler] = {}
_ADMIN_ONLY: set[str] = set()


def mongos_command(*names: str, admin_only: bool = False) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for name in names:
            MONGOS_COMMANDS[name] = handler
            if admin_only:
                _ADMIN_ONLY.add(name)
        return handler

    return register


class MongosServer(WireServer):
    """The emulated mongos: routing, merging, cluster time, transactions across shards."""

    def __init__(self, cluster: ShardedCluster) -> None:
        config = cluster.config
        access = AccessControl(config.auth, os.path.join(config.dbpath, "access.json") if config.dbpath else None)
        if config.users_file:
            access.load_users_file(config.users_file)
        super().__init__(config.host, config.port, config.tls_certificate_key_file, access)
        self.cluster = cluster
        self.cursors = CursorRegistry()
        self.process_id = ObjectId()
        self.started = time.time()
        self._time_lock = threading.Lock()
        self._cluster_time = max((s.oplog.clock.current() for s in cluster.shards.values()), key=lambda t: (t.time, t.inc))
        self._txns: dict[bytes, _RouterTxn] = {}
        self._txn_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.gate = MigrationGate()

    @property
    def address(self) -> str:
        return f"{self.cluster.config.host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._tcp.serve_forever, args=(0.2,), name="mongos-accept", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._tcp.shutdown()
        self._tcp.server_close()
        self.drop_connections()
        self.cursors.clear()

    # -- cluster time ------------------------------------------------------------------------------------
    @property
    def cluster_time(self) -> Timestamp:
        with self._time_lock:
            return self._cluster_time

    def advance(self, ts: Any) -> None:
        if isinstance(ts, Timestamp):
            with self._time_lock:
                if (ts.time, ts.inc) > (self._cluster_time.time, self._cluster_time.inc):
                    self._cluster_time = ts

    # -- shards -----------------------------------------------------------------------------------------
    def call(self, shard: str, cmd: dict[str, Any], raw: bool = False, at: Timestamp | None = None) -> Mapping[str, Any]:
        """Run a command on ``shard`` (waiting for its primary); a failure becomes that error, labels kept."""
        self.cluster.wait_for_primary(shard)
        reply = self.cluster.links[shard].call(cmd, at or self.cluster_time, raw)
        gossip = reply.get("$clusterTime")
        if isinstance(gossip, Mapping):
            self.advance(gossip.get("clusterTime"))
        if not reply.get("ok"):
            labels = reply.get("errorLabels") or []
            raise CommandError(int(reply.get("code", 1)), str(reply.get("codeName", "UnknownError")),
                               str(reply.get("errmsg", "")), [str(label) for label in labels])  # fmt: skip
        return reply

    # -- transactions -------------------------------------------------------------------------------------
    def _transaction(self, ctx: MongosContext) -> _RouterTxn | None:
        """The router's record of the transaction a command belongs to (``autocommit: false``)."""
        cmd = ctx.cmd
        if cmd.get("autocommit") is not False:
            return None
        lsid = cmd.get("lsid")
        number = cmd.get("txnNumber")
        if not isinstance(lsid, Mapping) or not isinstance(number, int):
            raise command_error((50768, "Location50768"), "'autocommit' field requires a transaction number to also be specified")
        key = bson.encode(dict(lsid))
        with self._txn_lock:
            txn = self._txns.get(key)
            if cmd.get("startTransaction"):
                txn = self._txns[key] = _RouterTxn(int(number), [], cmd.get("readConcern"))
            elif txn is None or txn.number != int(number):
                raise command_error(NO_SUCH_TRANSACTION, f"Transaction with {{ txnNumber: {number} }} has been aborted.",
                                    ("TransientTransactionError",))  # fmt: skip
            return txn

    def join_transaction(self, ctx: MongosContext, shard: str, cmd: dict[str, Any]) -> None:
        """Transaction fields for ``shard``: the first command a shard sees starts its part of it."""
        txn = ctx.txn
        assert txn is not None
        cmd["lsid"] = ctx.cmd["lsid"]
        cmd["txnNumber"] = Int64(txn.number)
        cmd["autocommit"] = False
        cmd.pop("startTransaction", None)
        cmd.pop("readConcern", None)
        with self._txn_lock:
            if shard not in txn.participants:
                txn.participants.append(shard)
                cmd["startTransaction"] = True
                if txn.read_concern is not None:
                    cmd["readConcern"] = txn.read_concern

    def abort_participants(self, ctx: MongosContext) -> None:
        txn = ctx.txn
        if txn is None:
            return
        for shard in list(txn.participants):
            with contextlib.suppress(CommandError):
                ctx.forward(shard, {"abortTransaction": 1, "$db": "admin"})

    # -- dispatch -------------------------------------------------------------------------------------
    def execute(self, request: wire.Request, conn: Connection) -> list[bytes] | None:
        cmd = request.command
        try:
            reply = self._run(cmd, conn)
        except CommandError as exc:
            if _is_change_stream(cmd, self.cursors):
                extra = [label for label in changestream.change_stream_error_labels(exc.code) if label not in exc.labels]
                exc.labels = (*exc.labels, *extra)
            elif "txnNumber" in cmd and cmd.get("autocommit") is None and exc.code in RETRYABLE_CODES:
                if "RetryableWriteError" not in exc.labels:
                    exc.labels = (*exc.labels, "RetryableWriteError")
            reply = exc.to_reply()
        except Exception as exc:  # a bug must fail the command, not the mongos
            reply = CommandError(1, "InternalError", f"{type(exc).__name__}: {exc}").to_reply()
        if conn.closed:
            return None
        now = self.cluster_time
        reply.setdefault("$clusterTime", {"clusterTime": now, "signature": {"hash": bson.Binary(b"\x00" * 20), "keyId": Int64(0)}})
        reply.setdefault("operationTime", now)
        try:
            return wire.encode_reply(reply)
        except Exception as exc:
            return [bson.encode(CommandError(1, "InternalError", f"reply could not be encoded: {exc}").to_reply())]

    def _run(self, cmd: dict[str, Any], conn: Connection) -> dict[str, Any]:
        if not cmd:
            raise command_error((40415, "Location40415"), "empty command")
        name = next(iter(cmd))
        db = cmd.get("$db")
        if not isinstance(db, str):
            raise command_error((40571, "Location40571"), "OP_MSG requests require a $db argument")
        gossip = cmd.get("$clusterTime")
        if isinstance(gossip, Mapping):
            self.advance(gossip.get("clusterTime"))
        handler = MONGOS_COMMANDS.get(name)
        if handler is None:
            raise command_error(COMMAND_NOT_FOUND, f"no such command: '{name}'")
        if name in _ADMIN_ONLY and db != "admin":
            raise command_error(UNAUTHORIZED, f"{name} may only be run against the admin database.")
        self.authorize(conn, db, name, cmd)
        ctx = MongosContext(self, conn, db, cmd, name)
        ctx.txn = self._transaction(ctx)
        try:
            with self.gate.shared() if name in _ROUTED else contextlib.nullcontext():
                reply = handler(ctx)
        except CommandError as exc:
            if ctx.txn is not None and name not in ("commitTransaction", "abortTransaction"):
                self.abort_participants(ctx)
                if exc.code in (112, 10107, 11602, 189, 13435, 6) and "TransientTransactionError" not in exc.labels:
                    exc.labels = (*exc.labels, "TransientTransactionError")
            raise
        self.amend_reply(conn, name, cmd, reply)
        reply.setdefault("ok", 1.0)
        return reply


def _is_change_stream(cmd: Mapping[str, Any], cursors: CursorRegistry) -> bool:
    if "aggregate" in cmd:
        pipeline = cmd.get("pipeline")
        return bool(pipeline) and isinstance(pipeline, list) and isinstance(pipeline[0], Mapping) and "$changeStream" in pipeline[0]
    cursor_id = cmd.get("getMore")
    return isinstance(cursor_id, int) and cursors.is_tailable(cursor_id)


def _raw(doc: Any) -> bytes:
    return bytes(doc.raw) if isinstance(doc, RawBSONDocument) else bson.encode(doc)


def _cursor_reply(ctx: MongosContext, ns: str, docs: Sequence[Any], batch_size: Any, single: bool = False,
                  read_at: Timestamp | None = None) -> dict[str, Any]:  # fmt: skip
    """The first batch of ``docs`` (the rest kept for getMore); ``read_at``: the time a snapshot read read at,
    which the reply reports as mongos does (``cursor.atClusterTime``)."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, (int, float)) or batch_size < 0):
        raise command_error(BAD_VALUE, "batchSize must be a non-negative number")
    size = DEFAULT_FIRST_BATCH if batch_size is None else int(batch_size)
    cursor = ListCursor(ns, docs, _raw)
    batch = cursor.next_batch(size, 0) if size else []
    cursor_id = 0 if single or cursor.exhausted else ctx.server.cursors.register(cursor)
    extra = {"atClusterTime": read_at} if read_at is not None else None
    return {"cursor": cursor_document(cursor_id, ns, "firstBatch", batch, extra)}


def _snapshot_time(ctx: MongosContext) -> Timestamp | None:
    """For a snapshot read outside a transaction, the one cluster time every shard reads at: the client's
    ``atClusterTime``, else the mongos' latest cluster time, which it then forwards (None for other reads)."""
    concern = ctx.cmd.get("readConcern")
    if ctx.txn is not None or not isinstance(concern, Mapping) or concern.get("level") != "snapshot":
        return None
    at = concern.get("atClusterTime")
    if not isinstance(at, Timestamp):
        at = ctx.server.cluster_time
        ctx.cmd["readConcern"] = {**concern, "atClusterTime": at}
    return at


def _batch_size(ctx: MongosContext) -> Any:
    """``cursor.batchSize`` of a cursor-returning command (None: the default first batch)."""
    opts = ctx.cmd.get("cursor")
    return opts.get("batchSize") if isinstance(opts, Mapping) else None


def _read_targets(ctx: MongosContext, ns: str, query: Mapping[str, Any] | None) -> list[str]:
    """The shards a read visits. A read at a past cluster time (``atClusterTime``) visits every shard:
    chunks may have moved since, and a migration moves each document at one time on both shards, so
    the shards' snapshots at that time hold it exactly once (mongod routes by the chunks' history)."""
    concern = ctx.cmd.get("readConcern")
    if isinstance(concern, Mapping) and concern.get("atClusterTime") is not None and ctx.layout.is_sharded(ns):
        return list(ctx.layout.shards)
    return ctx.layout.target(ns, query)


def _plain(doc: Any) -> dict[str, Any]:
    return bson.decode(doc.raw, wire.CODEC) if isinstance(doc, RawBSONDocument) else dict(doc)


# -- handshake and diagnostics ----------------------------------------------------------------------------


@mongos_command("hello", "isMaster", "ismaster")
def hello(ctx: MongosContext) -> dict[str, Any]:
    server = ctx.server
    version = {"processId": server.process_id, "counter": Int64(0)}
    client_version, max_await = ctx.cmd.get("topologyVersion"), ctx.cmd.get("maxAwaitTimeMS")
    if isinstance(client_version, Mapping) and client_version.get("processId") == server.process_id:
        if isinstance(max_await, int) and not isinstance(max_await, bool) and max_await >= 0:
            server._stop.wait(max_await / 1000.0)  # a mongos' topology never changes: wait out the poll
    legacy = ctx.name != "hello"
    reply: dict[str, Any] = {"ismaster" if legacy else "isWritablePrimary": True, "msg": "isdbgrid",
                             "topologyVersion": version}  # fmt: skip
    reply.update(
        maxBsonObjectSize=wire.MAX_BSON_OBJECT_SIZE, maxMessageSizeBytes=wire.MAX_MESSAGE_SIZE,
        maxWriteBatchSize=MAX_WRITE_BATCH_SIZE, localTime=now_ms(), logicalSessionTimeoutMinutes=30,
        connectionId=ctx.conn.id, minWireVersion=0, maxWireVersion=MAX_WIRE_VERSION, readOnly=False,
    )  # fmt: skip
    if ctx.cmd.get("helloOk") and legacy:
        reply["helloOk"] = True
    return reply


@mongos_command("ping")
def ping(ctx: MongosContext) -> dict[str, Any]:
    return {}


@mongos_command("buildInfo", "buildinfo")
def build_info(ctx: MongosContext) -> dict[str, Any]:
    return {"version": VERSION, "gitVersion": "mongocdc-emulator", "versionArray": VERSION_ARRAY, "modules": [],
            "bits": 64, "debug": False, "maxBsonObjectSize": wire.MAX_BSON_OBJECT_SIZE}  # fmt: skip


@mongos_command("serverStatus")
def server_status(ctx: MongosContext) -> dict[str, Any]:
    server = ctx.server
    uptime = time.time() - server.started
    return {"host": socket.gethostname(), "version": VERSION, "process": "mongos", "pid": Int64(os.getpid()),
            "uptime": float(int(uptime)), "localTime": now_ms(),
            "connections": {"current": server.connection_count(), "available": 50000}}  # fmt: skip


@mongos_command("getParameter", admin_only=True)
def get_parameter(ctx: MongosContext) -> dict[str, Any]:
    known = {"featureCompatibilityVersion": {"version": "7.0"}, "authenticationMechanisms": ["SCRAM-SHA-1", "SCRAM-SHA-256"]}
    wanted = [k for k in ctx.cmd if k in known]
    if ctx.arg == "*":
        return dict(known)
    if not wanted:
        raise command_error(BAD_VALUE, "no option found to get")
    return {k: known[k] for k in wanted}


@mongos_command("getCmdLineOpts", admin_only=True)
def get_cmd_line_opts(ctx: MongosContext) -> dict[str, Any]:
    return {"argv": ["mongos", "--port", str(ctx.server.port)], "parsed": {"net": {"port": ctx.server.port}}}


@mongos_command("whatsmyuri")
def whats_my_uri(ctx: MongosContext) -> dict[str, Any]:
    return {"you": ctx.conn.peer}


@mongos_command("listCommands")
def list_commands(ctx: MongosContext) -> dict[str, Any]:
    return {"commands": {name: {"help": "", "adminOnly": name in _ADMIN_ONLY} for name in sorted(MONGOS_COMMANDS)}}


@mongos_command("endSessions", "killSessions", "refreshSessions", "startSession", "killAllSessions")
def sessions(ctx: MongosContext) -> dict[str, Any]:
    if ctx.name == "startSession":
        return {"id": {"id": bson.Binary.from_uuid(uuid.uuid4())}, "timeoutMinutes": 30}
    for shard in ctx.layout.shards:
        with contextlib.suppress(CommandError):
            ctx.server.call(shard, {ctx.name: ctx.arg, "$db": "admin"})
    return {}


@mongos_command("mongocdcDropConnections", admin_only=True)
def drop_connections(ctx: MongosContext) -> dict[str, Any]:
    """Fault injection: close every client connection of the mongos but this one."""
    return {"dropped": ctx.server.drop_connections(keep=ctx.conn)}


for _name, _handler in auth_commands.HANDLERS.items():
    MONGOS_COMMANDS[_name] = _handler  # type: ignore[assignment]  # the same handlers serve mongod and mongos


# -- sharding administration ---------------------------------------------------------------------------


@mongos_command("listShards", admin_only=True)
def list_shards(ctx: MongosContext) -> dict[str, Any]:
    return {"shards": ctx.layout.config_documents("shards")}


@mongos_command("enableSharding", admin_only=True)
def enable_sharding(ctx: MongosContext) -> dict[str, Any]:
    db = ctx.arg
    if not isinstance(db, str) or not db:
        raise command_error(TYPE_MISMATCH, "enableSharding takes a database name")
    primary = ctx.cmd.get("primaryShard")
    if primary is not None:
        if primary not in ctx.layout.shards:
            raise command_error((70, "ShardNotFound"), f"Shard {primary} not found")
        with ctx.layout.lock:
            ctx.layout.primaries[db] = str(primary)
    ctx.layout.primary(db)
    ctx.server.cluster.save_layout()
    return {}


def _namespace(value: Any, what: str) -> tuple[str, str]:
    if not isinstance(value, str) or "." not in value:
        raise command_error(INVALID_NAMESPACE, f"{what} must be a '<db>.<collection>' namespace, got {value!r}")
    db, _, coll = value.partition(".")
    check_namespace(db, coll)
    return db, coll


@mongos_command("shardCollection", admin_only=True)
def shard_collection(ctx: MongosContext) -> dict[str, Any]:
    ns = ctx.arg
    db, _ = _namespace(ns, "shardCollection")
    key = ctx.cmd.get("key")
    layout = ctx.layout
    if layout.is_sharded(ns):
        existing = layout.sharded[ns].key
        if dict(existing) == dict(key or {}):
            return {"collectionsharded": ns}
        raise command_error((117, "ConflictingOperationInProgress"), f"{ns} is already sharded with a different key")
    owner = layout.owners(ns)[0]
    try:
        layout.shard_collection(ns, key, [{"shard": owner}])
    except ValueError as exc:
        raise command_error(BAD_VALUE, str(exc)) from None
    ctx.server.cluster.save_layout()
    return {"collectionsharded": ns, "collectionUUID": bson.Binary.from_uuid(layout.sharded[ns].uuid)}


@mongos_command("split", admin_only=True)
def split(ctx: MongosContext) -> dict[str, Any]:
    ns = ctx.arg
    _namespace(ns, "split")
    middle = ctx.cmd.get("middle")
    if not isinstance(middle, Mapping):
        raise command_error(BAD_VALUE, "split needs 'middle', the shard key value to split at (find/bounds are not supported)")
    try:
        ctx.layout.split(ns, middle)
    except ValueError as exc:
        raise command_error(BAD_VALUE, str(exc)) from None
    ctx.server.cluster.save_layout()
    return {}


@mongos_command("moveChunk", admin_only=True)
def move_chunk(ctx: MongosContext) -> dict[str, Any]:
    """Migrate the chunk holding ``find`` (or starting at ``bounds[0]``) to shard ``to``, documents and all."""
    ns = ctx.arg
    _namespace(ns, "moveChunk")
    find, bounds, to = ctx.cmd.get("find"), ctx.cmd.get("bounds"), ctx.cmd.get("to")
    if isinstance(bounds, list) and len(bounds) == 2 and isinstance(bounds[0], Mapping):
        find = bounds[0]
    if not isinstance(find, Mapping) or not isinstance(to, str):
        raise command_error(BAD_VALUE, "moveChunk needs 'find' (or 'bounds') and 'to'")
    layout = ctx.layout
    layout.chunk_of(ns, find)  # names a collection that is not sharded before anything waits
    if to not in layout.shards:
        raise command_error((70, "ShardNotFound"), f"Shard {to} not found")
    started = time.monotonic()
    with ctx.server.gate.exclusive():
        chunk = layout.chunk_of(ns, find)
        if chunk.shard == to:
            return {"millis": 0}
        ctx.server.cluster.migrate(ns, chunk, to)
    ctx.server.cluster.save_layout()
    return {"millis": int((time.monotonic() - started) * 1000)}


# -- catalog --------------------------------------------------------------------------------------------


@mongos_command("listDatabases", admin_only=True)
def list_databases(ctx: MongosContext) -> dict[str, Any]:
    sizes: dict[str, int] = {"admin": 4096, "config": 4096}
    query = ctx.cmd.get("filter")
    names_only = bool(ctx.cmd.get("nameOnly")) and (not isinstance(query, Mapping) or set(query) <= {"name"})
    ask: dict[str, Any] = {"listDatabases": 1, "$db": "admin", **({"nameOnly": True} if names_only else {})}
    for shard in ctx.layout.shards:
        for entry in ctx.server.call(shard, ask)["databases"]:
            if entry["name"] not in ("admin", "config", "local"):
                sizes[entry["name"]] = sizes.get(entry["name"], 0) + int(entry.get("sizeOnDisk", 0))
    entries = [{"name": name, "sizeOnDisk": Int64(size), "empty": False} for name, size in sorted(sizes.items())]
    if isinstance(query, Mapping) and query:
        entries = matching.filter_documents(entries, query)
    if ctx.cmd.get("nameOnly"):
        return {"databases": [{"name": e["name"]} for e in entries]}
    total = sum(int(e["sizeOnDisk"]) for e in entries)  # type: ignore[call-overload]
    return {"databases": entries, "totalSize": Int64(total), "totalSizeMb": Int64(total // (1024 * 1024))}


def _config_collection(ctx: MongosContext, coll: str) -> list[dict[str, Any]]:
    return ctx.layout.config_documents(coll)


@mongos_command("listCollections")
def list_collections(ctx: MongosContext) -> dict[str, Any]:
    check_namespace(ctx.db)
    if ctx.db == "local":
        raise command_error(ILLEGAL_OPERATION, "Can't use 'local' database through mongos")
    seen: dict[str, dict[str, Any]] = {}
    if ctx.db == "config":
        for coll in ("shards", "databases", "collections", "chunks"):
            seen[coll] = {"name": coll, "type": "collection", "options": {}, "info": {"readOnly": False}}
    else:
        body = {"listCollections": 1, **({"nameOnly": True} if ctx.cmd.get("nameOnly") else {})}
        for shard in ctx.layout.shards:
            for info in ctx.exhaust(shard, body):
                seen.setdefault(str(info["name"]), _plain(info))
    infos = list(seen.values())
    query = ctx.cmd.get("filter")
    if isinstance(query, Mapping) and query:
        infos = matching.filter_documents(infos, query)
    return _cursor_reply(ctx, f"{ctx.db}.$cmd.listCollections", infos, _batch_size(ctx))


def _first_owner_reply(ctx: MongosContext, body: dict[str, Any], ns: str, shards: Sequence[str] | None = None) -> Mapping[str, Any]:
    """Run a catalog command on every owner of ``ns``; the first reply stands for all (as mongos aggregates)."""
    replies = [ctx.forward(shard, body) for shard in (shards or ctx.layout.owners(ns))]
    return replies[0]


@mongos_command("listIndexes")
def list_indexes(ctx: MongosContext) -> dict[str, Any]:
    coll = ctx.collection()
    ns = f"{ctx.db}.{coll}"
    docs = ctx.exhaust(ctx.layout.owners(ns)[0], {"listIndexes": coll})
    return _cursor_reply(ctx, ns, docs, _batch_size(ctx))


@mongos_command("create", "createIndexes", "dropIndexes", "deleteIndexes", "collMod")
def catalog_change(ctx: MongosContext) -> dict[str, Any]:
    coll = ctx.collection()
    body = {k: v for k, v in ctx.cmd.items() if k not in _FORWARDED and not k.startswith("$") and k not in
            ("txnNumber", "autocommit", "startTransaction")}  # fmt: skip
    reply = _first_owner_reply(ctx, body, f"{ctx.db}.{coll}")
    return {k: v for k, v in reply.items() if k not in ("ok", "$clusterTime", "operationTime")}


def _holders(ctx: MongosContext, db: str, coll: str) -> list[str]:
    """Shards that have ``db.coll`` now (the primary first)."""
    primary = ctx.layout.primary(db)
    order = [primary, *[s for s in ctx.layout.shards if s != primary]]
    found = []
    for shard in order:
        names = [str(i["name"]) for i in ctx.exhaust(shard, {"listCollections": 1, "nameOnly": True, "filter": {"name": coll}, "$db": db})]
        if coll in names:
            found.append(shard)
    return found


def _drop_everywhere(ctx: MongosContext, db: str, coll: str) -> int | None:
    """Drop a collection on every shard; only one of them reports the drop to change streams."""
    holders = _holders(ctx, db, coll)
    indexes = None
    for shard in holders[1:]:
        indexes = ctx.server.cluster.shards[shard].state.drop_collection(db, coll, from_migrate=True)
    if holders:
        reply = ctx.forward(holders[0], {"drop": coll, "$db": db})
        indexes = int(reply.get("nIndexesWas", indexes or 0))
    return indexes


@mongos_command("drop")
def drop(ctx: MongosContext) -> dict[str, Any]:
    coll = ctx.collection()
    indexes = _drop_everywhere(ctx, ctx.db, coll)
    ctx.layout.forget(ns=f"{ctx.db}.{coll}")
    ctx.server.cluster.save_layout()
    return {"ns": f"{ctx.db}.{coll}", "nIndexesWas": indexes or 0}


@mongos_command("dropDatabase")
def drop_database(ctx: MongosContext) -> dict[str, Any]:
    db = ctx.db
    if db in ("admin", "config", "local"):
        raise command_error(ILLEGAL_OPERATION, f"Cannot drop the '{db}' database through mongos")
    primary = ctx.layout.primary(db)
    names: set[str] = set()
    for shard in ctx.layout.shards:
        names.update(str(i["name"]) for i in ctx.exhaust(shard, {"listCollections": 1, "nameOnly": True, "$db": db}))
    for coll in sorted(names):
        holders = _holders(ctx, db, coll)
        for shard in holders[1:]:  # one copy reports the drop: the primary's, else the first holder's
            ctx.server.cluster.shards[shard].state.drop_collection(db, coll, from_migrate=True)
        if holders and holders[0] != primary:
            ctx.forward(holders[0], {"drop": coll, "$db": db})
    ctx.forward(primary, {"dropDatabase": 1, "$db": db})
    ctx.layout.forget(db=db)
    ctx.server.cluster.save_layout()
    return {"dropped": db}


@mongos_command("renameCollection", admin_only=True)
def rename_collection(ctx: MongosContext) -> dict[str, Any]:
    source, target = ctx.arg, ctx.cmd.get("to")
    sdb, scoll = _namespace(source, "renameCollection")
    tdb, _ = _namespace(target, "to")
    if sdb != tdb:
        raise command_error(ILLEGAL_OPERATION, "the emulated mongos renames collections within one database only")
    ctx.layout.rename(source, str(target))
    shard = ctx.layout.owners(str(target))[0]
    body = {k: v for k, v in ctx.cmd.items() if not k.startswith("$") and k not in _FORWARDED}
    ctx.forward(shard, {**body, "$db": "admin"})
    ctx.server.cluster.save_layout()
    return {}


@mongos_command("collStats", "collstats")
def coll_stats(ctx: MongosContext) -> dict[str, Any]:
    coll = ctx.collection()
    ns = f"{ctx.db}.{coll}"
    shards: dict[str, Any] = {}
    count = size = 0
    for shard in ctx.layout.owners(ns):
        try:
            reply = ctx.forward(shard, {"collStats": coll})
        except CommandError as exc:
            if exc.code == 26:
                continue
            raise
        shards[shard] = {k: v for k, v in reply.items() if k not in ("ok", "$clusterTime", "operationTime")}
        count += int(reply.get("count", 0))
        size += int(reply.get("size", 0))
    if not shards:
        raise command_error((26, "NamespaceNotFound"), f"Collection [{ns}] not found.")
    return {"sharded": ctx.layout.is_sharded(ns), "ns": ns, "count": count, "size": size,
            "avgObjSize": size // count if count else 0, "nchunks": len(ctx.layout.sharded[ns].chunks) if ctx.layout.is_sharded(ns) else 1,
            "shards": shards}  # fmt: skip


@mongos_command("dbStats", "dbstats")
def db_stats(ctx: MongosContext) -> dict[str, Any]:
    totals = {"collections": 0, "objects": 0, "dataSize": 0.0, "storageSize": 0.0, "indexes": 0}
    raw: dict[str, Any] = {}
    for shard in ctx.layout.shards:
        reply = ctx.server.call(shard, {"dbStats": 1, "$db": ctx.db})
        raw[shard] = {k: v for k, v in reply.items() if k not in ("ok", "$clusterTime", "operationTime")}
        for key in totals:
            totals[key] += reply.get(key, 0)
    return {"raw": raw, "db": ctx.db, "collections": int(totals["collections"]), "objects": Int64(int(totals["objects"])),
            "dataSize": float(totals["dataSize"]), "storageSize": float(totals["storageSize"]),
            "indexes": int(totals["indexes"])}  # fmt: skip


# -- reads ----------------------------------------------------------------------------------------------

_FIND_OPTIONS = ("filter", "projection", "sort", "hint", "collation", "let", "min", "max", "returnKey", "showRecordId",
                 "allowDiskUse")  # fmt: skip


@mongos_command("find")
def find(ctx: MongosContext) -> dict[str, Any]:
    coll = ctx.collection()
    ns = f"{ctx.db}.{coll}"
    cmd = ctx.cmd
    query = cmd.get("filter") if isinstance(cmd.get("filter"), Mapping) else {}
    sort = cmd.get("sort") if isinstance(cmd.get("sort"), Mapping) and cmd.get("sort") else None
    projection = cmd.get("projection") if isinstance(cmd.get("projection"), Mapping) and cmd.get("projection") else None
    skip = int(cmd.get("skip") or 0)
    limit = abs(int(cmd.get("limit") or 0))
    if cmd.get("tailable"):
        raise command_error(matching.NOT_IMPLEMENTED, "tailable find cursors are not supported by the emulator")
    read_at = None if ctx.db == "config" else _snapshot_time(ctx)
    if ctx.db == "config":
        docs: list[Any] = matching.filter_documents(_config_collection(ctx, coll), query)
        docs = matching.sort_documents(docs, sort) if sort else docs
    else:
        shards = _read_targets(ctx, ns, query)
        body = {"find": coll, **{k: cmd[k] for k in _FIND_OPTIONS if k in cmd}}
        if len(shards) == 1:
            body.update({k: cmd[k] for k in ("skip", "limit") if k in cmd})
            docs = ctx.exhaust(shards[0], body)
            return _cursor_reply(ctx, ns, docs, cmd.get("batchSize"), bool(cmd.get("singleBatch")), read_at)
        if limit:
            body["limit"] = skip + limit
        if sort and projection:
            body.pop("projection")  # the mongos sorts on fields the projection may drop
        docs = [doc for shard in shards for doc in ctx.exhaust(shard, body)]
        if sort:
            docs = matching.sort_documents([_plain(d) for d in docs], sort)
    docs = docs[skip:]
    if limit:
        docs = docs[:limit]
    if projection and (sort or ctx.db == "config"):
        docs = [matching.project(_plain(d), projection) for d in docs]
    return _cursor_reply(ctx, ns, docs, cmd.get("batchSize"), bool(cmd.get("singleBatch")), read_at)


@mongos_command("getMore")
def get_more(ctx: MongosContext) -> dict[str, Any]:
    cursor_id = ctx.arg
    if isinstance(cursor_id, bool) or not isinstance(cursor_id, int):
        raise command_error(TYPE_MISMATCH, "BSON field 'getMore.getMore' is the wrong type, expected type 'long'")
    coll = ctx.cmd.get("collection")
    if not isinstance(coll, str) or not coll:
        raise command_error(FAILED_TO_PARSE, "BSON field 'getMore.collection' is missing but a required field")
    batch_size = ctx.cmd.get("batchSize")
    max_time_ms = ctx.cmd.get("maxTimeMS")
    ns = f"{ctx.db}.{coll}"
    cursor = ctx.server.cursors.checkout(int(cursor_id), ns)
    try:
        wait = max_time_ms if isinstance(max_time_ms, int) else (1000 if isinstance(cursor, TailableCursor) else None)
        batch = cursor.next_batch(int(batch_size) if batch_size else None, wait)
        extra = cursor.extra_fields()
        exhausted = cursor.exhausted
    finally:
        ctx.server.cursors.release(int(cursor_id), cursor)
    return {"cursor": cursor_document(0 if exhausted else int(cursor_id), ns, "nextBatch", batch, extra)}


@mongos_command("killCursors")
def kill_cursors(ctx: MongosContext) -> dict[str, Any]:
    ids = ctx.cmd.get("cursors")
    if not isinstance(ids, list):
        raise command_error(TYPE_MISMATCH, "BSON field 'killCursors.cursors' must be an array of cursor ids")
    killed, missing = ctx.server.cursors.kill(ids)
    return {"cursorsKilled": [Int64(i) for i in killed], "cursorsNotFound": [Int64(i) for i in missing],
            "cursorsAlive": [], "cursorsUnknown": []}  # fmt: skip


@mongos_command("count")
def count(ctx: MongosContext) -> dict[str, Any]:
    coll = ctx.collection()
    query: Mapping[str, Any] = ctx.cmd["query"] if isinstance(ctx.cmd.get("query"), Mapping) else {}
    if ctx.db == "config":
        total = len(matching.filter_documents(_config_collection(ctx, coll), query))
    else:
        body: dict[str, Any] = {"count": coll, "query": dict(query)}
        total = sum(int(ctx.forward(s, body).get("n", 0)) for s in _read_targets(ctx, f"{ctx.db}.{coll}", query))
    skip = int(ctx.cmd.get("skip") or 0)
    limit = abs(int(ctx.cmd.get("limit") or 0))
    total = max(0, total - skip)
    return {"n": min(total, limit) if limit else total}


@mongos_command("distinct")
def distinct(ctx: MongosContext) -> dict[str, Any]:
    coll = ctx.collection()
    query = ctx.cmd.get("query") if isinstance(ctx.cmd.get("query"), Mapping) else {}
    body = {k: v for k, v in ctx.cmd.items() if k in ("distinct", "key", "query", "collation", "hint")}
    seen: dict[Any, Any] = {}
    for shard in _read_targets(ctx, f"{ctx.db}.{coll}", query):
        for value in ctx.forward(shard, body).get("values", []):
            seen.setdefault(matching.bson_sort_key(value), value)
    return {"values": [seen[k] for k in sorted(seen)]}


@mongos_command("aggregate")
def aggregate(ctx: MongosContext) -> dict[str, Any]:
    pipeline = matching.validate_pipeline(ctx.cmd.get("pipeline"))
    opts = ctx.cmd.get("cursor")
    if not isinstance(opts, Mapping):
        raise command_error(FAILED_TO_PARSE, "The 'cursor' option is required, except for aggregate with the explain argument")
    target = ctx.arg
    if pipeline and "$changeStream" in pipeline[0]:
        return _change_stream(ctx, pipeline, opts)
    if not isinstance(target, str):
        first = next(iter(pipeline[0])) if pipeline else None
        if first == "$documents" and isinstance(pipeline[0]["$documents"], list):
            docs = matching.run_pipeline(list(pipeline[0]["$documents"]), pipeline[1:])
        elif first == "$currentOp":
            docs = []
        else:
            raise command_error(FAILED_TO_PARSE, "aggregate with 'aggregate: 1' requires a collectionless first stage")
        return _cursor_reply(ctx, f"{ctx.db}.$cmd.aggregate", docs, opts.get("batchSize"))
    coll = ctx.collection()
    ns = f"{ctx.db}.{coll}"
    if ctx.db == "config":
        docs = matching.run_pipeline(_config_collection(ctx, coll), pipeline)
        return _cursor_reply(ctx, ns, docs, opts.get("batchSize"))
    leading = pipeline[0].get("$match") if pipeline and isinstance(pipeline[0].get("$match"), Mapping) else None
    read_at = _snapshot_time(ctx)
    shards = _read_targets(ctx, ns, leading)
    body = {k: v for k, v in ctx.cmd.items() if k in ("aggregate", "allowDiskUse", "hint", "let", "collation")}
    if len(shards) == 1:
        single = ctx.exhaust(shards[0], {**body, "pipeline": pipeline, "cursor": {}})
        return _cursor_reply(ctx, ns, single, opts.get("batchSize"), read_at=read_at)
    split = 0
    while split < len(pipeline) and next(iter(pipeline[split])) in _SHARD_LOCAL_STAGES:
        split += 1
    pushed = pipeline[:split]
    if split < len(pipeline) and next(iter(pipeline[split])) == "$sample":
        pushed = [*pushed, pipeline[split]]  # each shard samples; the mongos samples the union again
    merged = [_plain(d) for shard in shards for d in ctx.exhaust(shard, {**body, "pipeline": pushed, "cursor": {}})]

    def resolve(name: str) -> list[dict[str, Any]]:
        other = f"{ctx.db}.{name}"
        return [_plain(d) for s in ctx.layout.owners(other) for d in ctx.exhaust(s, {"find": name})]

    docs = matching.run_pipeline(merged, pipeline[split:], resolve)
    return _cursor_reply(ctx, ns, docs, opts.get("batchSize"), read_at=read_at)


# -- writes ---------------------------------------------------------------------------------------------


def _statements(ctx: MongosContext, field_name: str) -> list[Any]:
    value = ctx.cmd.get(field_name)
    if not isinstance(value, list) or not value:
        raise command_error((16, "InvalidLength") if isinstance(value, list) else FAILED_TO_PARSE,
                            f"BSON field '{ctx.name}.{field_name}' must be a non-empty array")  # fmt: skip
    return value


def _envelope(ctx: MongosContext) -> dict[str, Any]:
    """The write command without its statements (collection, ordered, bypassDocumentValidation, ...)."""
    return {k: v for k, v in ctx.cmd.items() if k in (ctx.name, "ordered", "bypassDocumentValidation", "let")}


class _WriteResult:
    """Replies of per-shard sub-batches folded into one, write errors at the client's indices."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self.upserted: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []

    def add(self, reply: Mapping[str, Any], indices: Sequence[int]) -> None:
        for key in ("n", "nModified"):
            if key in reply:
                self.totals[key] = self.totals.get(key, 0) + int(reply[key])
        for item in reply.get("upserted", []):
            self.upserted.append({"index": indices[int(item["index"])], "_id": item["_id"]})
        for error in reply.get("writeErrors", []):
            self.errors.append({**dict(error), "index": indices[int(error["index"])]})

    def reply(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.totals)
        if self.upserted:
            out["upserted"] = sorted(self.upserted, key=lambda u: u["index"])
        if self.errors:
            out["writeErrors"] = sorted(self.errors, key=lambda e: e["index"])
        return out


def _run_batches(ctx: MongosContext, field_name: str, plan: list[tuple[str, list[int]]], items: list[Any],
                 result: _WriteResult) -> None:  # fmt: skip
    """Send each shard its statements (one sub-command per shard per client command, so a retry
    finds every shard's cached reply); an ordered batch stops at the first error."""
    ordered = ctx.cmd.get("ordered", True) is not False
    for shard, indices in plan:
        if ordered and result.errors:
            first_error = min(e["index"] for e in result.errors)
            indices = [i for i in indices if i < first_error]
            if not indices:
                continue
        reply = ctx.forward(shard, {**_envelope(ctx), field_name: [items[i] for i in indices]})
        result.add(reply, indices)


def _group(assignments: Sequence[tuple[int, str]]) -> list[tuple[str, list[int]]]:
    """Statement indices per shard, shards in the order of their first statement."""
    plan: dict[str, list[int]] = {}
    for index, shard in assignments:
        plan.setdefault(shard, []).append(index)
    return list(plan.items())


@mongos_command("insert")
def insert(ctx: MongosContext) -> dict[str, Any]:
    coll = ctx.collection()
    ns = f"{ctx.db}.{coll}"
    docs = [d if not isinstance(d, dict) or "_id" in d else {"_id": ObjectId(), **d} for d in _statements(ctx, "documents")]
    assignments = [(i, ctx.layout.shard_for(ns, d) if isinstance(d, Mapping) else ctx.layout.owners(ns)[0])
                   for i, d in enumerate(docs)]  # fmt: skip
    result = _WriteResult()
    _run_batches(ctx, "documents", _group(assignments), docs, result)
    return result.reply()


def _targeted_writes(ctx: MongosContext, field_name: str, query_key: str, multi: Callable[[Mapping[str, Any]], bool]) -> dict[str, Any]:
    """update/delete: statements pinned to one shard go there; multi statements to every targeted
    shard; a single-document statement without the shard key tries shards in turn (7.0's
    updateOne/deleteOne without shard key)."""
    coll = ctx.collection()
    ns = f"{ctx.db}.{coll}"
    items = _statements(ctx, field_name)
    layout = ctx.layout
    assignments: list[tuple[int, str]] = []
    searching: list[int] = []
    for index, stmt in enumerate(items):
        if not isinstance(stmt, Mapping):
            raise command_error(FAILED_TO_PARSE, f"{field_name} statements must be objects")
        query: Mapping[str, Any] = stmt[query_key] if isinstance(stmt.get(query_key), Mapping) else {}
        if field_name == "updates" and stmt.get("upsert"):
            assignments.append((index, layout.upsert_shard(ns, query)))
            continue
        shards = layout.target(ns, query)
        if len(shards) == 1 or multi(stmt):
            assignments.extend((index, shard) for shard in shards)
        else:
            searching.append(index)
    result = _WriteResult()
    _run_batches(ctx, field_name, _group(assignments), items, result)
    single_statement = len(items) == 1
    for index in searching:
        stmt = items[index]
        query = stmt.get(query_key) if isinstance(stmt.get(query_key), Mapping) else {}
        for shard in layout.target(ns, query):
            reply = ctx.forward(shard, {**_envelope(ctx), field_name: [stmt]}, retryable=single_statement)
            result.add(reply, [index])
            if int(reply.get("n", 0)) or reply.get("writeErrors"):
                break
    return result.reply()


@mongos_command("update")
def update(ctx: MongosContext) -> dict[str, Any]:
    return _targeted_writes(ctx, "updates", "q", lambda s: bool(s.get("multi")))


@mongos_command("delete")
def delete(ctx: MongosContext) -> dict[str, Any]:
    return _targeted_writes(ctx, "deletes", "q", lambda s: s.get("limit") == 0)


@mongos_command("findAndModify", "findandmodify")
def find_and_modify(ctx: MongosContext) -> dict[str, Any]:
    coll = ctx.collection()
    ns = f"{ctx.db}.{coll}"
    query: Mapping[str, Any] = ctx.cmd["query"] if isinstance(ctx.cmd.get("query"), Mapping) else {}
    body = {k: v for k, v in ctx.cmd.items() if not k.startswith("$") and k not in _FORWARDED and k not in
            ("txnNumber", "autocommit", "startTransaction")}  # fmt: skip
    shards = [ctx.layout.upsert_shard(ns, query)] if ctx.cmd.get("upsert") else ctx.layout.target(ns, query)
    reply: Mapping[str, Any] = {}
    for shard in shards:
        reply = ctx.forward(shard, body)
        if reply.get("lastErrorObject", {}).get("n"):
            break
    return {k: v for k, v in reply.items() if k not in ("ok", "$clusterTime", "operationTime")}


# -- transactions ---------------------------------------------------------------------------------------


@mongos_command("commitTransaction", admin_only=True)
def commit_transaction(ctx: MongosContext) -> dict[str, Any]:
    txn = ctx.txn
    if txn is None:
        raise command_error((50768, "InvalidOptions"), "commitTransaction must be run within a transaction")
    participants = list(txn.participants)
    body = {"commitTransaction": 1, "$db": "admin"}
    if len(participants) <= 1:
        for shard in participants:
            ctx.forward(shard, body)
        return {}
    # Every participant commits at one clusterTime, as a two-phase commit does: hold their oplogs,
    # move their clocks to a common time, commit each (no other write can slip in between).
    cluster = ctx.server.cluster
    servers = [cluster.shards[s] for s in sorted(participants, key=cluster.layout.shards.index)]
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.enter_context(server.oplog.cond)
        candidates = [server.oplog.clock.current() for server in servers]
        candidates += [ctx.server.cluster_time, Timestamp(int(time.time()) + 1, 0)]
        common = max(candidates, key=lambda t: (t.time, t.inc))
        if not all(server.state.transaction_open(ctx.cmd["lsid"], txn.number) for server in servers):
            # a participant lost its part (a migration or a write conflict aborted it): the prepare
            # fails, and no participant commits
            for shard in participants:
                with contextlib.suppress(CommandError):
                    ctx.forward(shard, {"abortTransaction": 1, "$db": "admin"})
            raise command_error(NO_SUCH_TRANSACTION, f"Transaction with {{ txnNumber: {txn.number} }} has been aborted.",
                                ("TransientTransactionError",))  # fmt: skip
        for server in servers:
            server.oplog.clock.advance_to(common)
        for shard in participants:
            ctx.forward(shard, body, at=common)
    return {}


@mongos_command("abortTransaction", admin_only=True)
def abort_transaction(ctx: MongosContext) -> dict[str, Any]:
    txn = ctx.txn
    if txn is None:
        raise command_error((50768, "InvalidOptions"), "abortTransaction must be run within a transaction")
    for shard in list(txn.participants):
        with contextlib.suppress(CommandError):
            ctx.forward(shard, {"abortTransaction": 1, "$db": "admin"})
    return {}


# -- change streams -------------------------------------------------------------------------------------


@dataclass
class _ShardStream:
    """One shard's change stream under a merged one: its cursor, buffered events and progress."""

    shard: str
    cursor_id: int
    collection: str  # for getMore
    pbrt: dict[str, Any]
    buffer: deque[tuple[str, RawBSONDocument]] = field(default_factory=deque)
    done: bool = False

    @property
    def pbrt_hex(self) -> str:
        return str(self.pbrt["_data"]).upper()


def _token(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: doc[k] for k in doc}


class MergedChangeStream:
    """A change stream through the mongos: the shards' streams merged in resume token order."""

    def __init__(self, ctx: MongosContext, coll: str | None, pipeline: list[dict[str, Any]]) -> None:
        self.server = ctx.server
        self.db = ctx.db
        spec = changestream.parse_spec(pipeline[0]["$changeStream"])
        if spec.show_migration_events:
            raise command_error((31123, "Location31123"), "Change streams from mongos may not show migration events.")
        shard_spec = {k: v for k, v in dict(pipeline[0]["$changeStream"]).items()
                      if k not in ("resumeAfter", "startAfter", "startAtOperationTime")}  # fmt: skip
        self._resume_hex: str | None = None
        self._must_find = False
        if spec.resume is not None and spec.resume_token is not None:
            start = spec.resume.cluster_time
            self._resume_hex = str(spec.resume_token["_data"]).upper()
            self._must_find = not spec.resume.is_high_water_mark
            self._pbrt = dict(spec.resume_token)
        else:
            if spec.start_at_operation_time is not None:
                start = spec.start_at_operation_time
            else:
                now = ctx.server.cluster_time
                start = Timestamp(now.time, now.inc + 1)
            self._pbrt = rt.high_water_mark(start)
        shard_spec["startAtOperationTime"] = start
        body = {"aggregate": coll if coll is not None else 1, "pipeline": [{"$changeStream": shard_spec}, *pipeline[1:]],
                "cursor": {"batchSize": 0}, "$db": ctx.db}  # fmt: skip
        self._streams: list[_ShardStream] = []
        self._closed = False
        self._failed: CommandError | None = None
        try:
            for shard in ctx.layout.shards:
                cursor = ctx.server.call(shard, dict(body), raw=True)["cursor"]
                ns = str(cursor["ns"])
                self._streams.append(_ShardStream(shard, int(cursor["id"]), ns.split(".", 1)[1],
                                                  _token(cursor["postBatchResumeToken"]), done=not int(cursor["id"])))  # fmt: skip
        except CommandError:
            self.close()
            raise

    # -- the ChangeStreamSource protocol ------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def post_batch_resume_token(self) -> dict[str, Any]:
        return self._pbrt

    def next_batch(self, batch_size: int | None, max_time_ms: int | None) -> list[bytes]:
        if self._failed is not None:
            raise self._failed
        limit = batch_size if batch_size and batch_size > 0 else None
        wait_ms = 1000 if max_time_ms is None else max_time_ms
        deadline = time.monotonic() + wait_ms / 1000.0
        out: list[bytes] = []
        try:
            self._poll(0)
            self._emit(out, limit)
            while not out and not self._closed:
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                if remaining_ms <= 0:
                    break
                self._poll(min(remaining_ms, 20))
                self._emit(out, limit)
        except CommandError as exc:
            self._failed = exc
            self.close()
            raise
        self._advance_pbrt()
        return out

    def close(self) -> None:
        for stream in self._streams:
            if not stream.done:
                with contextlib.suppress(CommandError):
                    self.server.call(stream.shard, {"killCursors": stream.collection, "cursors": [Int64(stream.cursor_id)], "$db": self.db})
                stream.done = True
        self._closed = True

    # -- merging -------------------------------------------------------------------------------------
    def _poll(self, wait_ms: int) -> None:
        """A getMore on every shard with nothing buffered; only the first waits, up to ``wait_ms``."""
        waited = False
        for stream in self._streams:
            if stream.buffer or stream.done:
                continue
            reply = self.server.call(stream.shard, {"getMore": Int64(stream.cursor_id), "collection": stream.collection,
                                                   "maxTimeMS": 0 if waited else wait_ms, "$db": self.db}, raw=True)  # fmt: skip
            waited = waited or wait_ms > 0
            cursor = reply["cursor"]
            for event in cursor["nextBatch"]:
                stream.buffer.append((str(event["_id"]["_data"]).upper(), event))
            stream.pbrt = _token(cursor["postBatchResumeToken"])
            if not int(cursor["id"]):
                stream.done = True

    def _emit(self, out: list[bytes], limit: int | None) -> None:
        budget = changestream.BSON_OBJ_MAX_USER_SIZE
        while (limit is None or len(out) < limit) and not self._closed:
            heads = [s for s in self._streams if s.buffer]
            if not heads:
                return
            source = min(heads, key=lambda s: s.buffer[0][0])
            hex_, event = source.buffer[0]
            # Safe only once every other shard is past it: it cannot produce an earlier event any more.
            if any(not s.buffer and not s.done and s.pbrt_hex < hex_ for s in self._streams):
                return
            if out and len(event.raw) > budget:
                return
            source.buffer.popleft()
            if not self._admit(hex_):
                continue
            budget -= len(event.raw)
            out.append(bytes(event.raw))
            self._pbrt = _token(event["_id"])
            if event.get("operationType") == "invalidate":
                self.close()

    def _admit(self, hex_: str) -> bool:
        """Drop what the client saw before resuming; an event token must be found again (mongos' check)."""
        resume = self._resume_hex
        if resume is None:
            return True
        if hex_ <= resume:
            if hex_ == resume:
                self._must_find = False
            return False
        if self._must_find:
            raise command_error(CHANGE_STREAM_FATAL_ERROR, f'cannot resume stream; the resume token was not found. {{_data: "{hex_}"}}',
                                changestream.NON_RESUMABLE)  # fmt: skip
        self._resume_hex = None
        return True

    def _advance_pbrt(self) -> None:
        """Move the post-batch resume token to what every shard has passed, below anything still buffered."""
        if self._closed or self._must_find:
            return
        idle = [s for s in self._streams if not s.buffer and not s.done]
        if not idle:
            return
        low = min(idle, key=lambda s: s.pbrt_hex)
        buffered = [s.buffer[0][0] for s in self._streams if s.buffer]
        if buffered and low.pbrt_hex >= min(buffered):
            return
        if low.pbrt_hex > str(self._pbrt["_data"]).upper():
            self._pbrt = dict(low.pbrt)


class _MergedCursor(TailableCursor):
    """The mongos' tailable cursor over a merged stream; killing it kills the shards' cursors."""

    source: MergedChangeStream

    def close(self) -> None:
        self.source.close()


def _change_stream(ctx: MongosContext, pipeline: list[dict[str, Any]], opts: Mapping[str, Any]) -> dict[str, Any]:
    if ctx.txn is not None:
        raise command_error((263, "OperationNotSupportedInTransaction"), "Cannot run aggregate with $changeStream in a multi-document transaction.")
    target = ctx.arg
    coll = target if isinstance(target, str) else None
    if coll is not None:
        check_namespace(ctx.db, coll)
    ns = f"{ctx.db}.{coll}" if coll is not None else f"{ctx.db}.$cmd.aggregate"
    cursor = _MergedCursor(ns, MergedChangeStream(ctx, coll, pipeline))
    batch_size = opts.get("batchSize")
    size = DEFAULT_FIRST_BATCH if batch_size is None else int(batch_size)
    batch = cursor.next_batch(size, 0) if size else []
    cursor_id = 0 if cursor.exhausted else ctx.server.cursors.register(cursor)
    return {"cursor": cursor_document(cursor_id, ns, "firstBatch", batch, cursor.extra_fields())}
