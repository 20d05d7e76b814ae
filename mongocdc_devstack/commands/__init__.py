"""Command handlers of the emulated mongod, registered by name.

Each handler takes a ``Context`` (the server, the connection, the database, the decoded command,
the session and transaction it runs in) and returns the reply document without ``ok``,
``$clusterTime`` and ``operationTime``, which the dispatcher adds. Failures raise ``CommandError``.

This module is the registry only: each handler module (and :mod:`mongocdc_devstack.faults`) imports
``command`` from here and registers itself when :mod:`mongocdc_devstack.mongod` imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bson import Timestamp

from ..errors import BAD_VALUE, CODE_NAMES, TYPE_MISMATCH, CommandError, command_error

if TYPE_CHECKING:
    from ..cursors import CursorRegistry
    from ..listener import Connection
    from ..mongod import EmulatorServer
    from ..state import Collection, ServerState, Session, Transaction


@dataclass
class Context:
    server: EmulatorServer
    conn: Connection
    db: str
    cmd: dict[str, Any]
    name: str
    session: Session | None = None
    txn: Transaction | None = None
    drop_connection: bool = False  # close the connection instead of replying (a fail point)
    read_at: Timestamp | None = None  # readConcern snapshot outside a transaction: the time read at

    def read_collection(self, name: str) -> Collection | None:
        """The collection a read sees: the transaction's snapshot, a snapshot read's time, or now."""
        coll = self.state.get_collection(self.db, name, self.txn)
        if self.read_at is None:
            return coll
        with self.state.lock:
            coll = self.state.history.named_at(self.db, name, coll, self.read_at)
            return None if coll is None else self.state.history.as_of(coll, self.read_at)

    @property
    def state(self) -> ServerState:
        return self.server.state

    @property
    def cursors(self) -> CursorRegistry:
        return self.server.cursors

    @property
    def retryable_write(self) -> bool:
        """A write with ``txnNumber`` outside a transaction (mongod records its statements)."""
        return self.session is not None and self.txn is None and "txnNumber" in self.cmd

    def statement(self, index: int, execute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run statement ``index`` of a write and return what it contributes to the reply.

        In a retryable write, a statement that already ran under this ``txnNumber`` is not run
        again: its recorded contribution is returned, as mongod answers retried statements. The
        ``onPrimaryTransactionalWrite`` fail point acts here, once per statement that really runs.
        """
        session = self.session
        if session is None or not self.retryable_write:
            return execute()
        done = session.executed.get(index)
        if done is not None:
            return done
        fault = self.server.faults.transactional_write()
        if fault is not None:
            self.drop_connection = self.drop_connection or fault.close_connection
            if fault.fail_code is not None:
                raise CommandError(fault.fail_code, CODE_NAMES.get(fault.fail_code, f"Location{fault.fail_code}"),
                                   f"Failing write for txnNumber {self.cmd['txnNumber']} due to failpoint. "
                                   "The write must not be reflected.")  # fmt: skip
        result = execute()
        session.executed[index] = result
        return result

    @property
    def arg(self) -> Any:
        """The value of the command's first field (``{find: 'coll'}`` -> ``'coll'``)."""
        return self.cmd[self.name]

    def collection_name(self) -> str:
        value = self.arg
        if not isinstance(value, str) or not value:
            raise command_error(
                (73, "InvalidNamespace"),
                f"collection name has invalid type {type(value).__name__}" if not isinstance(value, str)
                else "Invalid namespace specified ''",
            )  # fmt: skip
        return value

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        """An optional command field of the given BSON type (mongod's TypeMismatch otherwise)."""
        value = self.cmd.get(key, default)
        if value is None or value is default:
            return value
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise command_error(TYPE_MISMATCH, f"BSON field '{self.name}.{key}' is the wrong type 'bool'")
        if not isinstance(value, kind):
            raise command_error(
                TYPE_MISMATCH, f"BSON field '{self.name}.{key}' is the wrong type '{type(value).__name__}'"
            )
        return value

    def get_int(self, key: str, default: int | None = None, minimum: int | None = None) -> int | None:
        value = self.cmd.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise command_error(TYPE_MISMATCH, f"BSON field '{self.name}.{key}' is the wrong type '{type(value).__name__}'")
        if isinstance(value, float) and not value.is_integer():
            raise command_error(BAD_VALUE, f"BSON field '{self.name}.{key}' must be an integer, got {value}")
        result = int(value)
        if minimum is not None and result < minimum:
            raise command_error(BAD_VALUE, f"BSON field '{key}' value must be >= {minimum}, actual value '{result}'")
        return result


Handler = Callable[[Context], dict[str, Any]]


@dataclass(frozen=True)
class CommandSpec:
    name: str
    handler: Handler
    primary: bool  # needs a writable primary (writes) or primary reads
    admin_only: bool
    in_transaction: bool  # allowed inside a multi-document transaction
    write: bool  # a retryable write when sent with txnNumber


COMMANDS: dict[str, CommandSpec] = {}


def command(
    *names: str, primary: bool = False, admin_only: bool = False, in_transaction: bool = False, write: bool = False
) -> Callable[[Handler], Handler]:
    """Register a handler under one or more command names."""

    def register(handler: Handler) -> Handler:
        for name in names:
            COMMANDS[name] = CommandSpec(name, handler, primary, admin_only, in_transaction, write)
        return handler

    return register
