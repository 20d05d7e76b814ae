"""Fault injection for the emulator, driven by admin commands so tests use plain pymongo.

mongod's own commands (same syntax and behaviour as a real single-member replica set):

- ``{replSetStepDown: <secs>, force: true, secondaryCatchUpPeriodSecs: 0}`` — the node becomes
  SECONDARY: ``hello`` reports ``isWritablePrimary: false, secondary: true`` and no ``primary``;
  writes fail with NotWritablePrimary (10107, with ``RetryableWriteError`` on retryable writes),
  reads without secondaryOk with NotPrimaryNoSecondaryOk (13435); in-flight reads/getMores finish
  with InterruptedDueToReplStateChange (11602) and open transactions are aborted. As in a real
  single-node set, ``force: true`` is required (otherwise ExceededTimeLimit 262, no electable
  secondary) and the node elects itself again after ``<secs>`` seconds with a new term and
  ``electionId`` (it logs a ``new primary`` no-op). Connections stay open, as on mongod >= 4.2.
- ``{configureFailPoint: 'failCommand', mode: 'alwaysOn' | 'off' | {times: n} | {skip: n},
  data: {failCommands: [...], errorCode, errorLabels, writeConcernError, closeConnection,
  blockConnection, blockTimeMS, appName}}`` — mongod's test fail point: matching commands sleep
  ``blockTimeMS`` when ``blockConnection``, then either have their connection closed without a
  reply (``closeConnection``), or fail with ``errorCode`` (labels from ``errorLabels``, else the
  labels mongod would add), or run and get ``writeConcernError`` added to their reply. The reply's
  ``count`` is how often the fail point had triggered.
- ``failGetMoreAfterCursorCheckout`` (``data: {errorCode, errorLabels, closeConnection}``) — a
  getMore fails after its cursor was checked out, so a change stream's error gets mongod's change
  stream labels (``ResumableChangeStreamError`` for resumable codes).
- ``onPrimaryTransactionalWrite`` (``data: {closeConnection: true, failBeforeCommitExceptionCode}``)
  — each statement of a retryable write (``txnNumber`` outside a transaction) that reaches it either
  commits and has its connection closed before the reply (the driver's retry then gets the recorded
  result), or with ``failBeforeCommitExceptionCode`` fails uncommitted.
- ``maxTimeAlwaysTimeOut`` — every operation with a ``maxTimeMS`` (also a getMore of a cursor
  opened with one) fails with MaxTimeMSExpired (50).

Emulator-only commands (run on ``admin``):

- ``{mongocdcDropConnections: 1}`` — close every other client connection (reply ``dropped``).
- ``{mongocdcDelayReplies: 1, ms: N}`` — delay every later command except the handshake by N ms
  (``ms: 0`` turns it off).
- ``{mongocdcTruncateOplog: 1, before: Timestamp}`` — drop oplog entries older than ``before``
  to provoke ChangeStreamHistoryLost (reply ``dropped``: the number of entries removed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bson import Timestamp

from .commands import Context, command
from .errors import BAD_VALUE, CODE_NAMES, NOT_WRITABLE_PRIMARY, CommandError, command_error

if TYPE_CHECKING:
    from .listener import Connection
    from .mongod import EmulatorServer

EXCEEDED_TIME_LIMIT = (262, "ExceededTimeLimit")
_HANDSHAKE = frozenset({"hello", "isMaster", "ismaster"})
_FAULT_COMMANDS = frozenset({"configureFailPoint", "mongocdcDropConnections", "mongocdcDelayReplies", "mongocdcTruncateOplog"})



class DropConnection(Exception):
    """Close the client connection instead of replying (``closeConnection`` fail point)."""


class FailPointError(CommandError):
    """An error produced by a fail point; ``explicit_labels`` disables automatic labels.

    ``after_checkout`` marks a getMore failed after its cursor was checked out
    (``failGetMoreAfterCursorCheckout``): mongod then knows the cursor is a change stream and labels
    the error like any other change stream error, which ``failCommand`` (before checkout) does not.
    """

    def __init__(self, code: int, labels: list[str] | None, errmsg: str = "Failing command via 'failCommand' failpoint",
                 after_checkout: bool = False) -> None:  # fmt: skip
        super().__init__(code, CODE_NAMES.get(code, f"Location{code}"), errmsg, labels or ())
        self.explicit_labels = labels is not None
        self.after_checkout = after_checkout


@dataclass(frozen=True)
class FailPointOutcome:
    """A ``writeConcernError`` the fail point adds to a command that otherwise succeeds."""

    write_concern_error: dict[str, Any]
    labels: list[str] | None  # the fail point's ``errorLabels``; None: the labels mongod adds


@dataclass(frozen=True)
class TransactionalWriteFault:
    """What ``onPrimaryTransactionalWrite`` does to one statement of a retryable write."""

    close_connection: bool
    fail_code: int | None  # fail before the statement commits, with this code


class FailPoint:
    """One named fail point: its mode (``alwaysOn``, ``off``, ``{times: n}``, ``{skip: n}``) and data."""

    def __init__(self) -> None:
        self.data: dict[str, Any] | None = None  # None: off
        self.times: int | None = None  # None: unlimited
        self.skip = 0
        self.count = 0  # how often it fired since configured

    def configure(self, mode: Any, data: Any) -> int:
        previous = self.count
        if mode == "off":
            self.data = None
            return previous
        if data is not None and not isinstance(data, Mapping):
            raise command_error(BAD_VALUE, "'data' must be an object")
        times: int | None = None
        skip = 0
        if mode == "alwaysOn":
            pass
        elif isinstance(mode, Mapping) and "times" in mode:
            times = int(mode["times"])
        elif isinstance(mode, Mapping) and "skip" in mode:
            skip = int(mode["skip"])
        else:
            raise command_error(BAD_VALUE, f"unsupported fail point mode: {mode!r}")
        self.data = dict(data or {})
        self.times, self.skip, self.count = times, skip, 0
        if times is not None and times <= 0:
            self.data = None
        return previous

    def fire(self) -> dict[str, Any] | None:
        """The fail point's data if it fires now (consuming one of its ``times``), else None."""
        data = self.data
        if data is None:
            return None
        if self.skip:
            self.skip -= 1
            return None
        if self.times is not None:
            self.times -= 1
            if self.times <= 0:
                self.data = None
        self.count += 1
        return data


#: The fail points the emulator implements, as mongod names them.
FAIL_POINTS = ("failCommand", "failGetMoreAfterCursorCheckout", "onPrimaryTransactionalWrite", "maxTimeAlwaysTimeOut")
MAX_TIME_MS_EXPIRED = (50, "MaxTimeMSExpired")


class Faults:
    """Fail point state plus the re-election timer of the server it belongs to."""

    def __init__(self, server: EmulatorServer) -> None:
        self.server = server
        self._lock = threading.Lock()
        self.points = {name: FailPoint() for name in FAIL_POINTS}
        self.delay_ms = 0
        self._election_timer: threading.Timer | None = None

    def before_command(self, name: str, conn: Connection, cmd: Mapping[str, Any]) -> FailPointOutcome | None:
        """Apply the reply delay and the ``failCommand`` / ``maxTimeAlwaysTimeOut`` fail points.

        Returns what to add to the command's reply (a ``writeConcernError``), if anything.
        """
        if name in _FAULT_COMMANDS:
            return None
        if self.delay_ms and name not in _HANDSHAKE:
            time.sleep(self.delay_ms / 1000.0)
        if cmd.get("maxTimeMS") and name != "getMore":
            self.check_max_time()
        point = self.points["failCommand"]
        with self._lock:
            data = point.data
            if data is None or name not in data.get("failCommands", ()):
                return None
            app = data.get("appName")
            if app is not None and app != getattr(conn, "app_name", None):
                return None
            data = point.fire()
        if data is None:
            return None
        if data.get("blockConnection"):
            time.sleep(float(data.get("blockTimeMS", 0)) / 1000.0)
        if data.get("closeConnection"):
            raise DropConnection()
        labels = data.get("errorLabels")
        explicit = list(labels) if isinstance(labels, list) else None
        if "errorCode" in data:
            raise FailPointError(int(data["errorCode"]), explicit)
        concern = data.get("writeConcernError")
        if isinstance(concern, Mapping):
            return FailPointOutcome(dict(concern), explicit)
        return None

    def check_max_time(self) -> None:
        """``maxTimeAlwaysTimeOut``: an operation with a time limit fails as if it had run out of time."""
        point = self.points["maxTimeAlwaysTimeOut"]
        with self._lock:
            fired = point.fire() is not None
        if fired:
            raise command_error(MAX_TIME_MS_EXPIRED, "operation exceeded time limit")

    def after_cursor_checkout(self) -> None:
        """``failGetMoreAfterCursorCheckout``: fail a getMore once its cursor is checked out."""
        point = self.points["failGetMoreAfterCursorCheckout"]
        with self._lock:
            data = point.fire()
        if data is None:
            return
        if data.get("closeConnection"):
            raise DropConnection()
        labels = data.get("errorLabels")
        code = int(data.get("errorCode", 1))
        raise FailPointError(code, list(labels) if isinstance(labels, list) else None,
                             "Failing command via 'failGetMoreAfterCursorCheckout' failpoint", after_checkout=True)  # fmt: skip

    def transactional_write(self) -> TransactionalWriteFault | None:
        """``onPrimaryTransactionalWrite``: what to do to one statement of a retryable write."""
        point = self.points["onPrimaryTransactionalWrite"]
        with self._lock:
            data = point.fire()
        if data is None:
            return None
        code = data.get("failBeforeCommitExceptionCode")
        return TransactionalWriteFault(bool(data.get("closeConnection", True)), None if code is None else int(code))

    def configure_fail_point(self, name: str, mode: Any, data: Any) -> int:
        point = self.points.get(name)
        if point is None:
            raise command_error(BAD_VALUE, f"Cannot find failpoint: {name}")
        if name == "failCommand" and mode != "off" and (not isinstance(data, Mapping) or not isinstance(data.get("failCommands"), list)):
            raise command_error(BAD_VALUE, "'data' must contain 'failCommands', an array of command names")
        with self._lock:
            return point.configure(mode, data)

    def step_down(self, seconds: float) -> None:
        server = self.server
        server.topology.step_down()
        with server.state.lock:
            for session in server.state.sessions.values():
                if session.txn is not None and session.txn.state == "in_progress":
                    session.txn.state = "aborted"
        server.oplog.interrupt()
        if self._election_timer is not None:
            self._election_timer.cancel()
        self._election_timer = threading.Timer(seconds, self._elect)
        self._election_timer.daemon = True
        self._election_timer.start()

    def _elect(self) -> None:
        server = self.server
        if server.topology.stopping:
            return
        server.topology.elect()
        server.state.term = server.topology.term
        server.state.write_noop("new primary")

    def cancel(self) -> None:
        if self._election_timer is not None:
            self._election_timer.cancel()


@command("replSetStepDown", admin_only=True)
def repl_set_step_down(ctx: Context) -> dict[str, Any]:
    seconds = ctx.arg
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise command_error(BAD_VALUE, "stepdown period must be a positive number of seconds")
    catch_up = ctx.cmd.get("secondaryCatchUpPeriodSecs", 10)
    if not isinstance(catch_up, (int, float)) or catch_up < 0:
        raise command_error(BAD_VALUE, "secondaryCatchUpPeriodSecs must be a non-negative number")
    if seconds < catch_up:
        raise command_error(BAD_VALUE, "stepdown period must be longer than secondaryCatchUpPeriodSecs")
    if not ctx.server.topology.primary:
        raise command_error(NOT_WRITABLE_PRIMARY, "not primary so can't step down")
    if not ctx.cmd.get("force"):
        raise command_error(EXCEEDED_TIME_LIMIT, "No electable secondaries caught up as of the stepdown deadline")
    ctx.server.faults.step_down(float(seconds))
    return {}


@command("configureFailPoint", admin_only=True)
def configure_fail_point(ctx: Context) -> dict[str, Any]:
    count = ctx.server.faults.configure_fail_point(str(ctx.arg), ctx.cmd.get("mode"), ctx.cmd.get("data"))
    return {"count": count}


@command("mongocdcDropConnections", admin_only=True)
def drop_connections(ctx: Context) -> dict[str, Any]:
    return {"dropped": ctx.server.drop_connections(keep=ctx.conn)}


@command("mongocdcDelayReplies", admin_only=True)
def delay_replies(ctx: Context) -> dict[str, Any]:
    ms = ctx.cmd.get("ms")
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms < 0:
        raise command_error(BAD_VALUE, "mongocdcDelayReplies needs 'ms', a non-negative number of milliseconds")
    ctx.server.faults.delay_ms = int(ms)
    return {}


@command("mongocdcTruncateOplog", admin_only=True)
def truncate_oplog(ctx: Context) -> dict[str, Any]:
    before = ctx.cmd.get("before")
    if not isinstance(before, Timestamp):
        raise command_error(BAD_VALUE, "mongocdcTruncateOplog needs 'before', a BSON Timestamp")
    dropped = ctx.server.oplog.truncate_before(before)
    with ctx.state.lock:
        ctx.state._prune_images()
    return {"dropped": dropped}
