"""The emulated MongoDB 7.0 single-member replica set: TCP server, topology and dispatch.

A development and test stand-in for mongod (no MongoDB server can be installed on the project's
machines). pymongo and the official drivers connect to it over TCP exactly as to mongod, with
``?replicaSet=<name>``. One thread serves each connection; all data lives in ``ServerState``.

The command line that runs it (or a sharded cluster of them) is :mod:`mongocdc_devstack.server`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import bson
from bson import Int64, ObjectId, Timestamp

from . import wire
from .auth import AccessControl
from .changestream import change_stream_error_labels
from .commands import COMMANDS, CommandSpec, Context
from .commands import admin as _admin  # noqa: F401  (each handler module registers its commands on import)
from .commands import auth as _auth  # noqa: F401
from .commands import catalog as _catalog  # noqa: F401
from .commands import crud as _crud  # noqa: F401
from .cursors import CursorRegistry
from .errors import (
    COMMAND_NOT_FOUND,
    INTERRUPTED_DUE_TO_REPL_STATE_CHANGE,
    INVALID_OPTIONS,
    NOT_PRIMARY_NO_SECONDARY_OK,
    NOT_WRITABLE_PRIMARY,
    RETRYABLE_CODES,
    TYPE_MISMATCH,
    UNAUTHORIZED,
    CommandError,
    command_error,
)
from .faults import DropConnection, FailPointError, FailPointOutcome, Faults
from .listener import Connection, WireServer
from .oplog import ClusterClock, Oplog
from .state import OPERATION_NOT_SUPPORTED_IN_TRANSACTION, ServerState

# mongod's NotPrimaryError category: error replies with these codes carry ``topologyVersion``.
NOT_PRIMARY_CODES = frozenset({10107, 11602, 13435, 13436, 189})
# Commands a secondary answers; everything else needs the primary (reads without secondaryOk too).
_SECONDARY_OK_READS = frozenset({"find", "getMore", "aggregate", "count", "distinct", "listCollections",
                                 "listIndexes", "listDatabases", "dbStats", "collStats", "killCursors"})  # fmt: skip


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 27017
    replset: str = "rs0"
    oplog_size_mb: float = 192.0
    noop_interval: float = 10.0
    dbpath: str | None = None
    auth: bool = False  # --auth: refuse unauthenticated and unauthorized commands
    users_file: str | None = None  # users and roles to create at start (JSON)
    tls_certificate_key_file: str | None = None  # PEM with certificate and key: serve TLS only

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class Topology:
    """Replica set state as ``hello`` reports it; waiters are woken on every change."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.process_id = ObjectId()
        self.counter = 0
        self.term = 1
        self.primary = True
        self.set_version = 1
        self.election_id = self.new_election_id()
        self.stopping = False

    def new_election_id(self) -> ObjectId:
        """mongod's election id layout: 0x7fffffff then the term."""
        return ObjectId(bytes.fromhex("7fffffff") + self.term.to_bytes(8, "big"))

    def version(self) -> dict[str, Any]:
        return {"processId": self.process_id, "counter": Int64(self.counter)}

    def step_down(self) -> None:
        with self.cond:
            self.primary = False
            self.counter += 1
            self.cond.notify_all()

    def elect(self) -> None:
        with self.cond:
            self.term += 1
            self.election_id = self.new_election_id()
            self.primary = True
            self.counter += 1
            self.cond.notify_all()

    def wait_for_change(self, counter: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.counter == counter and not self.stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self.cond.wait(remaining)


class EmulatorServer(WireServer):
    """The whole emulated replica set member: state, cursors, topology, faults and the socket."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.oplog = Oplog(max(1, int(config.oplog_size_mb * 1024 * 1024)), ClusterClock())
        self.state = ServerState(self.oplog)
        self.cursors = CursorRegistry()
        self.topology = Topology()
        self.faults = Faults(self)
        self.started = time.time()
        self._threads: list[threading.Thread] = []
        self.persistence: Any = None
        if config.dbpath:
            from .persistence import Persistence

            self.persistence = Persistence(config.dbpath, self.state)
            self.persistence.load()
            self.topology.term = self.state.term
            self.topology.election_id = self.topology.new_election_id()
        if not len(self.oplog):
            self.state.write_noop("initiating set")  # mongod's oplog is never empty either
        access = AccessControl(config.auth, os.path.join(config.dbpath, "access.json") if config.dbpath else None)
        if config.users_file:
            access.load_users_file(config.users_file)
        super().__init__(config.host, config.port, config.tls_certificate_key_file, access)
        self.config.port = self.port

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Serve in background threads (returns once the socket accepts connections)."""
        self._spawn(self._tcp.serve_forever, "emulator-accept", 0.2)
        self._spawn(self._noop_loop, "emulator-noop")
        if self.persistence is not None:
            self._spawn(self._checkpoint_loop, "emulator-checkpoint")

    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def shutdown(self) -> None:
        """Stop accepting, close every connection, checkpoint (with --dbpath) and return."""
        if self._stop.is_set():
            return
        self._stop.set()
        with self.topology.cond:
            self.topology.stopping = True
            self.topology.cond.notify_all()
        self._tcp.shutdown()
        self._tcp.server_close()
        self.drop_connections()
        with self.oplog.cond:
            self.oplog.cond.notify_all()
        if self.persistence is not None:
            self.persistence.checkpoint()
            self.persistence.close()
        self.cursors.clear()

    def _noop_loop(self) -> None:
        interval = self.config.noop_interval
        if interval <= 0:
            return
        while not self._stop.wait(interval):
            if self.topology.primary:
                self.state.write_noop()

    def _checkpoint_loop(self) -> None:
        while not self._stop.wait(30.0):
            self.persistence.checkpoint_if_large()

    # -- dispatch -------------------------------------------------------------------------
    def execute(self, request: wire.Request, conn: Connection) -> list[bytes] | None:
        """Run one command and return the encoded reply, in pieces (None: the connection was dropped)."""
        cmd = request.command
        try:
            reply = self._run(cmd, conn)
        except CommandError as exc:
            if self._labels_change_stream_error(cmd, exc):
                extra = [label for label in change_stream_error_labels(exc.code) if label not in exc.labels]
                exc.labels = (*exc.labels, *extra)
            reply = exc.to_reply()
            if exc.code in NOT_PRIMARY_CODES:
                # Drivers compare it with the hello they know to ignore stale NotPrimary errors.
                reply["topologyVersion"] = self.topology.version()
        except DropConnection:
            conn.close()
            return None
        except Exception as exc:  # a bug must fail the command, not the server
            reply = CommandError(1, "InternalError", f"{type(exc).__name__}: {exc}").to_reply()
        if conn.closed:
            return None
        now = self.oplog.clock.current()
        reply.setdefault("$clusterTime", {"clusterTime": now, "signature": {"hash": bson.Binary(b"\x00" * 20), "keyId": Int64(0)}})
        reply.setdefault("operationTime", now)
        try:
            return wire.encode_reply(reply)
        except Exception as exc:
            return [bson.encode(CommandError(1, "InternalError", f"reply could not be encoded: {exc}").to_reply())]

    def _labels_change_stream_error(self, cmd: dict[str, Any], exc: CommandError) -> bool:
        """Whether mongod would add its change stream labels to this error.

        A ``failCommand`` error with explicit ``errorLabels`` keeps exactly those. Without them, a
        getMore's fail point fires before the cursor is checked out, so mongod never learns the
        cursor is a change stream and adds nothing; an aggregate's command is known up front.
        """
        if isinstance(exc, FailPointError) and (
            exc.explicit_labels or (next(iter(cmd), None) == "getMore" and not exc.after_checkout)
        ):
            return False
        return self._is_change_stream(cmd)

    def _is_change_stream(self, cmd: dict[str, Any]) -> bool:
        """A ``$changeStream`` aggregate or a getMore on a change stream cursor."""
        if "aggregate" in cmd:
            pipeline = cmd.get("pipeline")
            return bool(pipeline) and isinstance(pipeline, list) and isinstance(pipeline[0], dict) and "$changeStream" in pipeline[0]
        cursor_id = cmd.get("getMore")
        return isinstance(cursor_id, int) and self.cursors.is_tailable(cursor_id)

    def _run(self, cmd: dict[str, Any], conn: Connection) -> dict[str, Any]:
        if not cmd:
            raise command_error((40415, "Location40415"), "empty command")
        name = next(iter(cmd))
        db = cmd.get("$db")
        if not isinstance(db, str):
            raise command_error((40571, "Location40571"), "OP_MSG requests require a $db argument")
        spec = COMMANDS.get(name)
        if spec is None:
            raise command_error(COMMAND_NOT_FOUND, f"no such command: '{name}'")
        if spec.admin_only and db != "admin":
            raise command_error(UNAUTHORIZED, f"{name} may only be run against the admin database.")
        self.authorize(conn, db, name, cmd)
        ctx = Context(self, conn, db, cmd, name)
        # mongod evaluates failCommand before it checks the session out: a failed first command of a
        # transaction leaves no transaction behind.
        try:
            outcome = self.faults.before_command(name, conn, cmd)
        except FailPointError as exc:
            if not exc.explicit_labels:
                exc.labels = error_labels(name, cmd, spec.write, exc.code, exc.labels)
            raise
        try:
            return self._run_in_session(ctx, spec, outcome)
        except CommandError as exc:
            exc.labels = error_labels(name, cmd, spec.write, exc.code, exc.labels)
            raise

    def _run_in_session(self, ctx: Context, spec: CommandSpec, outcome: FailPointOutcome | None) -> dict[str, Any]:
        cmd, name = ctx.cmd, ctx.name
        self._attach_session(ctx, spec.in_transaction)
        ctx.read_at = self._snapshot_read_time(ctx)
        topology_at_start = self.topology.counter
        if spec.primary and not self.topology.primary:
            if name in _SECONDARY_OK_READS and _secondary_ok(cmd):
                pass
            elif name in _SECONDARY_OK_READS:
                raise command_error(NOT_PRIMARY_NO_SECONDARY_OK, "not primary and secondaryOk=false")
            else:
                raise command_error(NOT_WRITABLE_PRIMARY, "not primary")
        retry_key = None
        if spec.write and ctx.retryable_write and ctx.session is not None:
            retry_key = int(cmd["txnNumber"])
            previous = ctx.session.retry_replies.get(retry_key)
            if previous is not None:
                reply = dict(previous)
                if outcome is not None:
                    self._add_write_concern_error(ctx, spec.write, reply, outcome)
                return reply
        try:
            reply = spec.handler(ctx)
        except CommandError as exc:
            if ctx.drop_connection:
                raise DropConnection() from None  # onPrimaryTransactionalWrite: no reply reaches the client
            if ctx.txn is not None and exc.code not in (251, 256) and name not in ("commitTransaction", "abortTransaction"):
                ctx.txn.state = "aborted"
            raise
        if ctx.drop_connection:
            if retry_key is not None and ctx.session is not None and not reply.get("writeErrors"):
                ctx.session.retry_replies = {retry_key: {"ok": 1.0, **reply}}
            raise DropConnection()  # onPrimaryTransactionalWrite: the write committed, the reply is lost
        if self.topology.counter != topology_at_start and name in ("getMore", "aggregate", "find"):
            raise command_error(INTERRUPTED_DUE_TO_REPL_STATE_CHANGE, "operation was interrupted because the node stepped down")
        self.amend_reply(ctx.conn, name, cmd, reply)
        reply.setdefault("ok", 1.0)
        self._check_write_concern(ctx, reply)
        if retry_key is not None and ctx.session is not None and not reply.get("writeErrors"):
            ctx.session.retry_replies = {retry_key: dict(reply)}
        if outcome is not None:  # after caching: a retry gets the write's result without it
            self._add_write_concern_error(ctx, spec.write, reply, outcome)
        return reply

    @staticmethod
    def _check_write_concern(ctx: Context, reply: dict[str, Any]) -> None:
        """A write concern one member cannot satisfy is reported as mongod reports it: the write
        happens, and the reply carries a ``writeConcernError``."""
        concern = ctx.cmd.get("writeConcern")
        writes = ctx.name in _WRITE_CONCERN_COMMANDS or (ctx.name == "aggregate" and _writes_out(ctx.cmd))
        if not isinstance(concern, Mapping) or not writes or "writeConcernError" in reply:
            return
        w = concern.get("w")
        if isinstance(w, (int, float)) and not isinstance(w, bool) and w > 1:
            reply["writeConcernError"] = {"code": 100, "codeName": "UnsatisfiableWriteConcern", "errmsg": "Not enough data-bearing nodes"}
        elif isinstance(w, str) and w != "majority":  # tag sets: the emulated set has none
            reply["writeConcernError"] = {"code": 79, "codeName": "UnknownReplWriteConcern",
                                          "errmsg": f"No write concern mode named '{w}' found in replica set configuration"}  # fmt: skip

    def _snapshot_read_time(self, ctx: Context) -> Timestamp | None:
        """``readConcern: {level: "snapshot"}``: the cluster time to read at, within the history window.

        Outside a transaction only find, aggregate and distinct take it (mongod 5.0+); without
        ``atClusterTime`` they read at the latest cluster time and report it. A transaction started
        with ``atClusterTime`` reads as of that time.
        """
        concern = ctx.cmd.get("readConcern")
        if not isinstance(concern, Mapping) or concern.get("level") != "snapshot":
            return None
        at = concern.get("atClusterTime")
        if at is not None and not isinstance(at, Timestamp):
            raise command_error(TYPE_MISMATCH, f"BSON field 'atClusterTime' is the wrong type '{type(at).__name__}', expected type 'timestamp'")
        current = self.oplog.clock.current()
        if ctx.txn is not None:
            if at is not None and ctx.cmd.get("startTransaction"):
                with self.state.lock:
                    self.state.history.check(at, current)
                    ctx.txn.snapshot_ts = at
            return None
        if ctx.name not in _SNAPSHOT_READS:
            raise command_error(
                INVALID_OPTIONS,
                f"Command {ctx.name} does not support {{ readConcern: {{ level: \"snapshot\" }} }} :: caused by :: "
                "read concern snapshot is only supported for find, aggregate and distinct outside transactions",
            )
        if at is None:
            return current
        with self.state.lock:
            self.state.history.check(at, current)
        return at

    def _add_write_concern_error(self, ctx: Context, write: bool, reply: dict[str, Any], outcome: FailPointOutcome) -> None:
        """A fail point's ``writeConcernError``, with the labels and topologyVersion mongod adds."""
        concern = outcome.write_concern_error
        reply["writeConcernError"] = concern
        code = concern.get("code")
        labels = outcome.labels
        if labels is None:
            retryable_cmd = (write and "txnNumber" in ctx.cmd and ctx.txn is None) or ctx.name in ("commitTransaction", "abortTransaction")
            labels = ["RetryableWriteError"] if retryable_cmd and code in RETRYABLE_CODES else []
        if labels:
            reply["errorLabels"] = list(labels)
        if code in NOT_PRIMARY_CODES:
            reply["topologyVersion"] = self.topology.version()

    def _attach_session(self, ctx: Context, in_transaction: bool) -> None:
        cmd = ctx.cmd
        lsid = cmd.get("lsid")
        if lsid is None:
            if "txnNumber" in cmd:
                raise command_error((50768, "Location50768"), "Transaction number requires a session ID to also be specified")
            return
        session = self.state.session(lsid)
        ctx.session = session
        autocommit = cmd.get("autocommit")
        if autocommit is None:
            if cmd.get("startTransaction"):
                raise command_error((72, "InvalidOptions"), "txnNumber may only be provided for multi-document transactions and retryable write commands. autocommit:false was not provided, and startTransaction was specified")
            if "txnNumber" in cmd and ctx.name not in ("commitTransaction", "abortTransaction"):
                txn_number = int(cmd["txnNumber"])
                if txn_number > session.txn_number:
                    session.txn_number = txn_number
                    session.retry_replies = {}
                    session.executed = {}
            return
        if autocommit is not False:
            raise command_error((72, "InvalidOptions"), "Specifying autocommit=true is not allowed.")
        if "txnNumber" not in cmd:
            raise command_error((50768, "Location50768"), "'autocommit' field requires a transaction number to also be specified")
        if not in_transaction:
            raise command_error(OPERATION_NOT_SUPPORTED_IN_TRANSACTION, f"Cannot run '{ctx.name}' in a multi-document transaction.")
        if ctx.name in ("commitTransaction", "abortTransaction"):
            return
        if not self.topology.primary:
            raise command_error(NOT_WRITABLE_PRIMARY, "not primary", labels=("TransientTransactionError",))
        ctx.txn = self.state.transaction_for(session, int(cmd["txnNumber"]), bool(cmd.get("startTransaction")))


# ErrorCodes::isSnapshotError and isNeedRetargettingError (plus StaleDbVersion), and the codes mongod
# treats as transient in a transaction on top of the retriable ones (src/mongo/db/error_labels.cpp).
_TRANSIENT_CODES = frozenset({112, 24, 267, 239, 246, 249, 13388, 63, 150})
_TRANSACTION_END = ("commitTransaction", "abortTransaction")


def error_labels(name: str, cmd: dict[str, Any], write: bool, code: int, present: Sequence[str] = ()) -> tuple[str, ...]:
    """The ``errorLabels`` mongod's ErrorLabelBuilder gives an error, from the command's session fields.

    ``RetryableWriteError``: a retriable code on a retryable write (``txnNumber`` without
    ``autocommit``) or on commit/abort. ``TransientTransactionError``: inside a transaction
    (``autocommit: false``) for write conflicts, lock timeouts, snapshot and retargeting errors,
    and — except on commit/abort, where only NoSuchTransaction counts — retriable errors and
    NoSuchTransaction.
    """
    labels = list(present)
    in_transaction = "txnNumber" in cmd and "autocommit" in cmd
    ends_transaction = name in _TRANSACTION_END
    retryable = ("txnNumber" in cmd and not in_transaction and write) or ends_transaction
    if retryable and code in RETRYABLE_CODES and "RetryableWriteError" not in labels:
        labels.append("RetryableWriteError")
    if in_transaction:
        transient = code in _TRANSIENT_CODES or code == 251
        if not ends_transaction:
            transient = transient or code in RETRYABLE_CODES
        if transient and "TransientTransactionError" not in labels:
            labels.append("TransientTransactionError")
    return tuple(labels)


_WRITE_CONCERN_COMMANDS = frozenset({"insert", "update", "delete", "findAndModify", "findandmodify", "create", "drop",
                                     "createIndexes", "dropIndexes", "deleteIndexes", "renameCollection", "collMod",
                                     "dropDatabase", "commitTransaction", "abortTransaction"})  # fmt: skip
_SNAPSHOT_READS = frozenset({"find", "aggregate", "distinct", "getMore"})


def _writes_out(cmd: dict[str, Any]) -> bool:
    """An aggregate ending in ``$out`` or ``$merge``."""
    pipeline = cmd.get("pipeline")
    return isinstance(pipeline, list) and bool(pipeline) and isinstance(pipeline[-1], dict) and \
        next(iter(pipeline[-1]), None) in ("$out", "$merge")  # fmt: skip



def _secondary_ok(cmd: dict[str, Any]) -> bool:
    pref = cmd.get("$readPreference")
    return isinstance(pref, dict) and pref.get("mode") not in (None, "primary")
