"""Server-side errors of the emulated replica set, shaped as mongod reports them.

Drivers decide whether to retry, resume or give up from the numeric ``code`` and the
``errorLabels``, so every error the emulator raises carries mongod's own code, code name and
labels rather than a free-form message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class CommandError(Exception):
    """A command failure that becomes an ``{ok: 0, code, codeName, errmsg}`` reply."""

    def __init__(self, code: int, code_name: str, errmsg: str, labels: Sequence[str] = ()) -> None:
        super().__init__(f"{code_name} ({code}): {errmsg}")
        self.code = code
        self.code_name = code_name
        self.errmsg = errmsg
        self.labels = tuple(labels)

    def to_reply(self) -> dict[str, Any]:
        reply: dict[str, Any] = {
            "ok": 0.0,
            "errmsg": self.errmsg,
            "code": self.code,
            "codeName": self.code_name,
        }
        if self.labels:
            reply["errorLabels"] = list(self.labels)
        return reply


# mongod's codes for the errors the emulator reports (src/mongo/base/error_codes.yml).
BAD_VALUE = (2, "BadValue")
FAILED_TO_PARSE = (9, "FailedToParse")
UNAUTHORIZED = (13, "Unauthorized")
TYPE_MISMATCH = (14, "TypeMismatch")
PROTOCOL_ERROR = (17, "ProtocolError")
ILLEGAL_OPERATION = (20, "IllegalOperation")
NAMESPACE_NOT_FOUND = (26, "NamespaceNotFound")
CURSOR_NOT_FOUND = (43, "CursorNotFound")
NAMESPACE_EXISTS = (48, "NamespaceExists")
MAX_TIME_MS_EXPIRED = (50, "MaxTimeMSExpired")
COMMAND_NOT_FOUND = (59, "CommandNotFound")
INVALID_OPTIONS = (72, "InvalidOptions")
INVALID_NAMESPACE = (73, "InvalidNamespace")
NO_SUCH_TRANSACTION = (251, "NoSuchTransaction")
TRANSACTION_COMMITTED = (256, "TransactionCommitted")
INVALID_RESUME_TOKEN = (260, "InvalidResumeToken")
CHANGE_STREAM_FATAL_ERROR = (280, "ChangeStreamFatalError")
CHANGE_STREAM_HISTORY_LOST = (286, "ChangeStreamHistoryLost")
NOT_WRITABLE_PRIMARY = (10107, "NotWritablePrimary")
NOT_PRIMARY_NO_SECONDARY_OK = (13435, "NotPrimaryNoSecondaryOk")
INTERRUPTED_DUE_TO_REPL_STATE_CHANGE = (11602, "InterruptedDueToReplStateChange")
PRIMARY_STEPPED_DOWN = (189, "PrimarySteppedDown")
DUPLICATE_KEY = (11000, "DuplicateKey")
BSON_OBJECT_TOO_LARGE = (10334, "BSONObjectTooLarge")
LOCATION_UNKNOWN_OPERATOR = (31325, "Location31325")

#: Codes a driver retries a write on (mongod labels them ``RetryableWriteError``).
RETRYABLE_CODES = frozenset({6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436})

#: Names of the codes fail points may be asked to raise (the rest are reported as ``Location<code>``).
CODE_NAMES = {
    1: "InternalError", 2: "BadValue", 6: "HostUnreachable", 7: "HostNotFound", 8: "UnknownError",
    11: "UserNotFound", 13: "Unauthorized", 43: "CursorNotFound", 50: "MaxTimeMSExpired",
    89: "NetworkTimeout", 91: "ShutdownInProgress", 112: "WriteConflict", 133: "FailedToSatisfyReadPreference",
    189: "PrimarySteppedDown", 234: "RetryChangeStream", 251: "NoSuchTransaction", 262: "ExceededTimeLimit",
    280: "ChangeStreamFatalError", 286: "ChangeStreamHistoryLost", 9001: "SocketException",
    10107: "NotWritablePrimary", 11000: "DuplicateKey", 11600: "InterruptedAtShutdown",
    11602: "InterruptedDueToReplStateChange", 13388: "StaleConfig", 13435: "NotPrimaryNoSecondaryOk",
    13436: "NotPrimaryOrSecondary", 24: "LockTimeout", 11601: "Interrupted", 246: "SnapshotUnavailable",
    267: "PreparedTransactionInProgress", 150: "StaleEpoch", 63: "StaleShardVersion", 64: "WriteConcernFailed",
    100: "UnsatisfiableWriteConcern", 79: "UnknownReplWriteConcern", 202: "NetworkInterfaceExceededTimeLimit",
    239: "SnapshotTooOld", 244: "TransactionCoordinatorSteppingDown", 20: "IllegalOperation", 26: "NamespaceNotFound",
    48: "NamespaceExists", 59: "CommandNotFound", 72: "InvalidOptions", 263: "OperationNotSupportedInTransaction",
    317: "ConnectionPoolExpired", 384: "ConnectionError", 402: "ResumeTenantChangeStream", 462: "IngressRequestRateLimitExceeded",
}  # fmt: skip


def command_error(code: tuple[int, str], errmsg: str, labels: Sequence[str] = ()) -> CommandError:
    """Build a ``CommandError`` from one of the ``(code, codeName)`` pairs above."""
    return CommandError(code[0], code[1], errmsg, labels)
