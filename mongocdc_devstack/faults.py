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
from .errors import BAD_VALUE, NOT_WRITABLE_PRIMARY, CommandError, command_error

if TYPE_CHECKING:
    from .server import Connection, EmulatorServer

EXCEEDED_TIME_LIMIT = (262, "ExceededTimeLimit")
_HANDSHAKE = frozenset({"hello", "isMaster", "ismaster"})
_FAULT_COMMANDS = frozenset({"configureFailPoint", "mongocdcDropConnections", "mongocdcDelayReplies", "mongocdcTruncateOplog"})
CODE_NAMES = {
    1: "InternalError", 2: "BadValue", 6: "HostUnreachable", 7: "HostNotFound", 8: "UnknownError",
    11: "UserNotFound", 13: "Unauthorized", 43: "CursorNotFound", 50: "MaxTimeMSExpired",
    89: "NetworkTimeout", 91: "ShutdownInProgress", 112: "WriteConflict", 133: "FailedToSatisfyReadPreference",
    189: "PrimarySteppedDown", 234: "RetryChangeStream", 251: "NoSuchTransaction", 262: "ExceededTimeLimit",
    280: "ChangeStreamFatalError", 286: "ChangeStreamHistoryLost", 9001: "SocketException",
    10107: "NotWritablePrimary", 11000: "DuplicateKey", 11600: "InterruptedAtShutdown",
    11602: "InterruptedDueToReplStateChange", 13388: "StaleConfig", 13435: "NotPrimaryNoSecondaryOk",
    13436: "NotPrimaryOrSecondary",
}  # fmt: skip


class DropConnection(Exception):
    """Close the client connection instead of replying (``closeConnection`` fail point)."""


class FailPointError(CommandError):
    """An error produced by ``failCommand``; ``explicit_labels`` disables automatic labels."""

    def __init__(self, code: int, labels: list[str] | None) -> None:
        super().__init__(code, CODE_NAMES.get(code, f"Location{code}"), "Failing command via 'failCommand' failpoint", labels or ())
        self.explicit_labels = labels is not None


@dataclass(frozen=True)
class FailPointOutcome:
    """A ``writeConcernError`` the fail point adds to a command that otherwise succeeds."""

    write_concern_error: dict[str, Any]
    labels: list[str] | None  # the fail point's ``errorLabels``; None: the labels mongod adds


class Faults:
    """Fail point state plus the re-election timer of the server it belongs to."""

    def __init__(self, server: EmulatorServer) -> None:
        self.server = server
        self._lock = threading.Lock()
        self.fail_data: dict[str, Any] | None = None
        self.fail_times: int | None = None  # None: alwaysOn
        self.fail_skip = 0
        self.fail_count = 0
        self.delay_ms = 0
        self._election_timer: threading.Timer | None = None

    def before_command(self, name: str, conn: Connection) -> FailPointOutcome | None:
        """Apply the reply delay and the ``failCommand`` fail point to one command.

        Returns what to add to the command's reply (a ``writeConcernError``), if anything.
        """
        if name in _FAULT_COMMANDS:
            return None
        if self.delay_ms and name not in _HANDSHAKE:
            time.sleep(self.delay_ms / 1000.0)
        with self._lock:
            data = self.fail_data
            if data is None or name not in data.get("failCommands", ()):
                return None
            app = data.get("appName")
            if app is not None and app != getattr(conn, "app_name", None):
                return None
            if self.fail_skip:
                self.fail_skip -= 1
                return None
            if self.fail_times is not None:
                self.fail_times -= 1
                if self.fail_times <= 0:
                    self.fail_data = None
            self.fail_count += 1
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

    def configure_fail_point(self, name: str, mode: Any, data: Any) -> int:
        if name != "failCommand":
            raise command_error(BAD_VALUE, f"Cannot find failpoint: {name}")
        with self._lock:
            previous = self.fail_count
            if mode == "off":
                self.fail_data = None
                return previous
            if not isinstance(data, Mapping) or not isinstance(data.get("failCommands"), list):
                raise command_error(BAD_VALUE, "'data' must contain 'failCommands', an array of command names")
            times: int | None = None
            skip = 0
            if mode == "alwaysOn":
                times = None
            elif isinstance(mode, Mapping) and "times" in mode:
                times = int(mode["times"])
            elif isinstance(mode, Mapping) and "skip" in mode:
                skip = int(mode["skip"])
            else:
                raise command_error(BAD_VALUE, f"unsupported fail point mode: {mode!r}")
            self.fail_data = dict(data)
            self.fail_times = times
            self.fail_skip = skip
            self.fail_count = 0
            if times is not None and times <= 0:
                self.fail_data = None
            return previous

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
