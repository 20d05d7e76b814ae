"""Command handlers of the emulated mongod, registered by name.

Each handler takes a ``Context`` (the server, the connection, the database, the decoded command,
the session and transaction it runs in) and returns the reply document without ``ok``,
``$clusterTime`` and ``operationTime``, which the dispatcher adds. Failures raise ``CommandError``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BAD_VALUE, TYPE_MISMATCH, command_error

if TYPE_CHECKING:
    from ..cursors import CursorRegistry
    from ..server import Connection, EmulatorServer
    from ..state import ServerState, Session, Transaction


@dataclass
class Context:
    server: EmulatorServer
    conn: Connection
    db: str
    cmd: dict[str, Any]
    name: str
    session: Session | None = None
    txn: Transaction | None = None

    @property
    def state(self) -> ServerState:
        return self.server.state

    @property
    def cursors(self) -> CursorRegistry:
        return self.server.cursors

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


def load_all() -> dict[str, CommandSpec]:
    """Import every handler module (they register themselves) and return the registry."""
    from .. import faults  # noqa: F401
    from . import admin, auth, catalog, crud  # noqa: F401

    return COMMANDS
