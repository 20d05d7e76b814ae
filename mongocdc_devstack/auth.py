"""Access control of the emulated mongod and mongos: users, SCRAM, roles and privileges.

mongod's model, reduced to what drivers and a CDC connector meet. Users (``createUser``, or a
users file at start) authenticate with SCRAM-SHA-256 or SCRAM-SHA-1 in the SASL conversation the
drivers run (``saslStart``/``saslContinue``, ``saslSupportedMechs`` and speculative
authentication in ``hello``). With access control on (``--auth``) every command except the
handshake needs an authenticated user whose roles grant the actions mongod requires for it on
its resource; anything else is refused with mongod's code 13 ``Unauthorized``. Built-in roles
(``read``, ``readWrite``, ``readAnyDatabase``, ``clusterMonitor``, ``root``, ...) and custom roles
(``createRole`` with privileges) decide it, so least-privilege setups behave as on mongod.

The SCRAM primitives are hashlib (PBKDF2, SHA-1/256), hmac and pymongo's own ``saslprep``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import threading
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bson import Binary
from pymongo.saslprep import saslprep

from .errors import (
    BAD_VALUE,
    FAILED_TO_PARSE,
    PROTOCOL_ERROR,
    TYPE_MISMATCH,
    UNAUTHORIZED,
    CommandError,
    command_error,
)
from .state import format_value

AUTHENTICATION_FAILED = (18, "AuthenticationFailed")
USER_NOT_FOUND = (11, "UserNotFound")
ROLE_NOT_FOUND = (31, "RoleNotFound")
MECHANISM_UNAVAILABLE = (334, "MechanismUnavailable")
DUPLICATE_USER = (51003, "Location51003")
DUPLICATE_ROLE = (51002, "Location51002")

MECHANISMS = ("SCRAM-SHA-1", "SCRAM-SHA-256")
_DIGESTS = {"SCRAM-SHA-1": "sha1", "SCRAM-SHA-256": "sha256"}
_ITERATIONS = {"SCRAM-SHA-1": 10000, "SCRAM-SHA-256": 15000}  # mongod's scramIterationCount defaults
INTERNAL_DATABASES = frozenset({"local", "config"})

# Commands a client may run before authenticating (mongod's ``requiresAuth() == false``).
_NO_AUTH = frozenset(
    {"hello", "isMaster", "ismaster", "buildInfo", "buildinfo", "ping", "saslStart", "saslContinue",
     "authenticate", "logout", "getnonce", "whatsmyuri", "connectionStatus", "endSessions", "listCommands",
     "getFreeMonitoringStatus"}
)  # fmt: skip
# Commands any authenticated user may run: no privilege beyond being somebody (cursors are checked
# against their namespace, transactions and sessions belong to the caller).
_AUTHENTICATED = frozenset(
    {"getMore", "killCursors", "startSession", "refreshSessions", "killSessions", "commitTransaction",
     "abortTransaction", "hostInfo"}
)  # fmt: skip

READ_ACTIONS = frozenset(
    {"find", "changeStream", "collStats", "dbHash", "dbStats", "killCursors", "listCollections", "listIndexes",
     "listSearchIndexes"}
)  # fmt: skip
READ_WRITE_ACTIONS = READ_ACTIONS | {
    "insert", "update", "remove", "createCollection", "createIndex", "dropCollection", "dropIndex",
    "renameCollectionSameDB", "convertToCapped",
}  # fmt: skip
DB_ADMIN_ACTIONS = frozenset(
    {"bypassDocumentValidation", "collMod", "collStats", "compact", "convertToCapped", "createCollection",
     "createIndex", "dbStats", "dropCollection", "dropDatabase", "dropIndex", "enableProfiler", "listCollections",
     "listIndexes", "reIndex", "renameCollectionSameDB", "validate"}
)  # fmt: skip
USER_ADMIN_ACTIONS = frozenset(
    {"changeCustomData", "changePassword", "createRole", "createUser", "dropRole", "dropUser", "grantRole",
     "revokeRole", "setAuthenticationRestriction", "viewRole", "viewUser"}
)  # fmt: skip
CLUSTER_MONITOR_ACTIONS = frozenset(
    {"connPoolStats", "getCmdLineOpts", "getLog", "getParameter", "hostInfo", "inprog", "listDatabases",
     "listSessions", "listShards", "netstat", "replSetGetConfig", "replSetGetStatus", "serverStatus", "top",
     "getShardMap", "checkFreeMonitoringStatus"}
)  # fmt: skip
CLUSTER_MANAGER_ACTIONS = frozenset(
    {"appendOplogNote", "replSetConfigure", "replSetStateChange", "resync", "enableSharding", "addShard",
     "removeShard", "flushRouterConfig", "splitChunk", "moveChunk", "shardCollection"}
)  # fmt: skip
HOST_MANAGER_ACTIONS = frozenset(
    {"fsync", "killop", "killAnySession", "setParameter", "shutdown", "logRotate", "unlock", "applicationMessage"}
)  # fmt: skip
ALL_ACTIONS = (
    READ_WRITE_ACTIONS | DB_ADMIN_ACTIONS | USER_ADMIN_ACTIONS | CLUSTER_MONITOR_ACTIONS | CLUSTER_MANAGER_ACTIONS
    | HOST_MANAGER_ACTIONS | {"anyAction", "internal"}
)  # fmt: skip
_ADMIN_ONLY_ROLES = frozenset(
    {"readAnyDatabase", "readWriteAnyDatabase", "userAdminAnyDatabase", "dbAdminAnyDatabase", "clusterMonitor",
     "clusterManager", "hostManager", "clusterAdmin", "root", "__system"}
)  # fmt: skip
_DATABASE_ROLES = frozenset({"read", "readWrite", "dbAdmin", "dbOwner", "userAdmin"})
_SYSTEM = ("local", "__system")  # the cluster-internal user (keyfile authentication)


# -- resources and privileges ------------------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    """A privilege's resource: the cluster, any resource, or ``{db, collection}`` ("" = any)."""

    cluster: bool = False
    any_resource: bool = False
    db: str = ""
    collection: str = ""

    @classmethod
    def parse(cls, value: Any) -> Resource:
        if not isinstance(value, Mapping):
            raise command_error(FAILED_TO_PARSE, "Privilege resource must be an object")
        if value.get("cluster") is True and len(value) == 1:
            return cls(cluster=True)
        if value.get("anyResource") is True and len(value) == 1:
            return cls(any_resource=True)
        db, coll = value.get("db"), value.get("collection")
        if not isinstance(db, str) or not isinstance(coll, str) or len(value) != 2:
            raise command_error(
                BAD_VALUE, "resource must have 'cluster: true', 'anyResource: true' or string 'db' and 'collection' fields"
            )
        return cls(db=db, collection=coll)

    def document(self) -> dict[str, Any]:
        if self.cluster:
            return {"cluster": True}
        if self.any_resource:
            return {"anyResource": True}
        return {"db": self.db, "collection": self.collection}

    def covers(self, target: Target) -> bool:
        """mongod's resource matching: exact namespaces, whole databases, any normal resource."""
        if self.any_resource:
            return True
        if target.kind == "cluster" or self.cluster:
            return self.cluster and target.kind == "cluster"
        if target.kind == "any_normal":
            return self.db == "" and self.collection == ""
        db_ok = self.db == target.db or (self.db == "" and target.db not in INTERNAL_DATABASES)
        if target.kind == "database":
            return db_ok and self.collection == ""
        coll = target.collection
        if coll.startswith("system."):  # system collections only through exact grants
            return self.collection == coll and (self.db == target.db or self.db == "")
        if self.collection == "":
            return db_ok
        return self.collection == coll and (self.db == target.db or self.db == "")


@dataclass(frozen=True)
class Target:
    """What a command touches: the cluster, a namespace, a whole database, or every database."""

    kind: str  # "cluster" | "namespace" | "database" | "any_normal"
    db: str = ""
    collection: str = ""


CLUSTER = Target("cluster")


def namespace(db: str, coll: str) -> Target:
    return Target("namespace", db, coll)


def database(db: str) -> Target:
    return Target("database", db)


@dataclass(frozen=True)
class Privilege:
    resource: Resource
    actions: frozenset[str]

    @classmethod
    def parse(cls, value: Any) -> Privilege:
        if not isinstance(value, Mapping) or "resource" not in value or "actions" not in value:
            raise command_error(FAILED_TO_PARSE, "Privilege must have 'resource' and 'actions' fields")
        actions = value["actions"]
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise command_error(TYPE_MISMATCH, "Privilege 'actions' must be an array of strings")
        for action in actions:
            if action not in ALL_ACTIONS:
                raise command_error(BAD_VALUE, f"Unrecognized action privilege string: {action}")
        return cls(Resource.parse(value["resource"]), frozenset(actions))

    def document(self) -> dict[str, Any]:
        return {"resource": self.resource.document(), "actions": sorted(self.actions)}

    def allows(self, target: Target, action: str) -> bool:
        return ("anyAction" in self.actions or action in self.actions) and self.resource.covers(target)


def _on(resource: Resource, actions: Iterable[str]) -> Privilege:
    return Privilege(resource, frozenset(actions))


def builtin_privileges(role: str, db: str) -> list[Privilege] | None:
    """The privileges of a built-in role granted on ``db`` (None: no such built-in role)."""
    if role in _ADMIN_ONLY_ROLES and db != "admin":
        return None
    in_db = Resource(db=db)
    any_normal = Resource()
    cluster = Resource(cluster=True)
    if role == "read":
        return [_on(in_db, READ_ACTIONS)]
    if role == "readWrite":
        return [_on(in_db, READ_WRITE_ACTIONS)]
    if role == "dbAdmin":
        return [_on(in_db, DB_ADMIN_ACTIONS)]
    if role == "userAdmin":
        return [_on(in_db, USER_ADMIN_ACTIONS)]
    if role == "dbOwner":
        return [_on(in_db, READ_WRITE_ACTIONS | DB_ADMIN_ACTIONS | USER_ADMIN_ACTIONS)]
    if role == "readAnyDatabase":
        return [_on(any_normal, READ_ACTIONS), _on(cluster, {"listDatabases"})]
    if role == "readWriteAnyDatabase":
        return [_on(any_normal, READ_WRITE_ACTIONS), _on(cluster, {"listDatabases"})]
    if role == "userAdminAnyDatabase":
        return [_on(any_normal, USER_ADMIN_ACTIONS), _on(cluster, {"listDatabases", "viewUser", "viewRole"})]
    if role == "dbAdminAnyDatabase":
        return [_on(any_normal, DB_ADMIN_ACTIONS), _on(cluster, {"listDatabases"})]
    monitor = [
        _on(cluster, CLUSTER_MONITOR_ACTIONS),
        _on(Resource(db="config"), {"find", "listCollections", "listIndexes", "collStats", "dbStats"}),
        _on(Resource(db="local"), {"find", "listCollections", "listIndexes", "collStats", "dbStats"}),
    ]
    if role == "clusterMonitor":
        return monitor
    if role == "clusterManager":
        return [_on(cluster, CLUSTER_MANAGER_ACTIONS | {"listDatabases", "listShards"})]
    if role == "hostManager":
        return [_on(cluster, HOST_MANAGER_ACTIONS)]
    if role == "clusterAdmin":
        return [*monitor, _on(cluster, CLUSTER_MANAGER_ACTIONS | HOST_MANAGER_ACTIONS),
                _on(any_normal, {"dropDatabase"})]  # fmt: skip
    if role in ("root", "__system"):
        return [_on(Resource(any_resource=True), {"anyAction"})]
    return None


# -- users and roles ---------------------------------------------------------------------------------


@dataclass
class Credential:
    """A SCRAM credential as mongod stores it: never the password, only what verifies a proof."""

    iteration_count: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    @classmethod
    def derive(cls, mechanism: str, user: str, password: str, salt: bytes | None = None) -> Credential:
        digest = _DIGESTS[mechanism]
        if mechanism == "SCRAM-SHA-1":
            # MongoDB's SCRAM-SHA-1 hashes the password digest, not the password itself.
            secret = hashlib.md5(f"{user}:mongo:{password}".encode()).hexdigest().encode()  # noqa: S324
        else:
            secret = saslprep(password).encode("utf-8")
        salt = salt if salt is not None else os.urandom(16 if mechanism == "SCRAM-SHA-1" else 28)
        iterations = _ITERATIONS[mechanism]
        salted = hashlib.pbkdf2_hmac(digest, secret, salt, iterations)
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        server_key = hmac.new(salted, b"Server Key", digest).digest()
        return cls(iterations, salt, hashlib.new(digest, client_key).digest(), server_key)

    def document(self) -> dict[str, Any]:
        b64 = base64.standard_b64encode
        return {"iterationCount": self.iteration_count, "salt": b64(self.salt).decode(),
                "storedKey": b64(self.stored_key).decode(), "serverKey": b64(self.server_key).decode()}  # fmt: skip

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> Credential:
        b64 = base64.standard_b64decode
        return cls(int(doc["iterationCount"]), b64(doc["salt"]), b64(doc["storedKey"]), b64(doc["serverKey"]))


RoleRef = tuple[str, str]  # (role, db)


@dataclass
class User:
    name: str
    db: str
    credentials: dict[str, Credential]
    roles: list[RoleRef]
    user_id: uuid.UUID = field(default_factory=uuid.uuid4)
    custom_data: dict[str, Any] | None = None

    def info(self, show_credentials: bool = False) -> dict[str, Any]:
        doc: dict[str, Any] = {"_id": f"{self.db}.{self.name}", "userId": Binary.from_uuid(self.user_id),
                               "user": self.name, "db": self.db}  # fmt: skip
        if self.custom_data is not None:
            doc["customData"] = self.custom_data
        doc["roles"] = [{"role": role, "db": db} for role, db in self.roles]
        if show_credentials:
            doc["credentials"] = {m: c.document() for m, c in self.credentials.items()}
        doc["mechanisms"] = [m for m in MECHANISMS if m in self.credentials]
        return doc

    def document(self) -> dict[str, Any]:
        doc = self.info(show_credentials=True)
        doc["userId"] = str(self.user_id)
        return doc

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> User:
        return cls(
            doc["user"], doc["db"], {m: Credential.from_document(c) for m, c in doc["credentials"].items()},
            [(r["role"], r["db"]) for r in doc["roles"]], uuid.UUID(doc["userId"]), doc.get("customData"),
        )  # fmt: skip


@dataclass
class Role:
    name: str
    db: str
    privileges: list[Privilege]
    roles: list[RoleRef]

    def info(self) -> dict[str, Any]:
        return {"_id": f"{self.db}.{self.name}", "role": self.name, "db": self.db,
                "privileges": [p.document() for p in self.privileges],
                "roles": [{"role": r, "db": d} for r, d in self.roles], "isBuiltin": False}  # fmt: skip


def _user_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise command_error(BAD_VALUE, f"{what} must be a non-empty string")
    return value


# -- the SCRAM conversation (server side, RFC 5802 / RFC 7677) -----------------------------------------


@dataclass
class _Conversation:
    mechanism: str
    user: User
    credential: Credential
    client_first_bare: bytes
    server_first: bytes
    nonce: bytes
    skip_empty_exchange: bool
    step: int = 1


def _scram_fields(payload: bytes) -> dict[bytes, bytes]:
    fields: dict[bytes, bytes] = {}
    for item in payload.split(b","):
        key, sep, value = item.partition(b"=")
        if not sep or len(key) != 1:
            raise command_error(BAD_VALUE, "Incorrect SCRAM message format")
        fields[key] = value
    return fields


def _payload(cmd: Mapping[str, Any]) -> bytes:
    value = cmd.get("payload")
    if isinstance(value, (bytes, Binary)):
        return bytes(value)
    if isinstance(value, str):  # the shell may send base64 text
        return base64.standard_b64decode(value)
    raise command_error(BAD_VALUE, "Missing 'payload' field of type BinData or string")


@dataclass
class _ConnectionAuth:
    """Who is authenticated on one connection, and its SASL conversation in progress."""

    users: dict[tuple[str, str], User] = field(default_factory=dict)
    conversation: _Conversation | None = None
    generation: int = -1
    privileges: list[Privilege] = field(default_factory=list)
    role_names: list[RoleRef] = field(default_factory=list)


class AccessControl:
    """Users, roles and per-connection authentication of one emulated server (mongod or mongos).

    ``enabled`` is ``--auth``: without it users can still authenticate (as on mongod), but nothing
    is refused. ``path`` keeps users and roles across restarts (``<dbpath>/access.json``).
    """

    def __init__(self, enabled: bool = False, path: str | None = None) -> None:
        self.enabled = enabled
        self.path = path
        self.users: dict[tuple[str, str], User] = {}
        self.roles: dict[tuple[str, str], Role] = {}
        self._lock = threading.RLock()
        self._generation = 0  # bumped on every user or role change: cached privileges are stale
        self._connections: weakref.WeakKeyDictionary[Any, _ConnectionAuth] = weakref.WeakKeyDictionary()
        if path is not None and os.path.exists(path):
            self._load(path)

    # -- persistence and bootstrap -------------------------------------------------------------
    def _load(self, path: str) -> None:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        for doc in data.get("roles", []):
            role = Role(doc["role"], doc["db"], [Privilege.parse(p) for p in doc["privileges"]],
                        [(r["role"], r["db"]) for r in doc["roles"]])  # fmt: skip
            self.roles[(role.db, role.name)] = role
        for doc in data.get("users", []):
            user = User.from_document(doc)
            self.users[(user.db, user.name)] = user

    def _save(self) -> None:
        if self.path is None:
            return
        data = {"users": [u.document() for u in self.users.values()],
                "roles": [{k: v for k, v in r.info().items() if k != "isBuiltin"} for r in self.roles.values()]}  # fmt: skip
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        os.replace(tmp, self.path)

    def load_users_file(self, path: str) -> None:
        """Create (or replace) the roles and users a JSON file lists, as ``createRole``/``createUser`` take
        them: ``{"roles": [{"role", "db", "privileges", "roles"}], "users": [{"user", "pwd", "db", "roles"}]}``.

        Raises ``ValueError`` naming what is wrong.
        """
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read users file {path}: {exc}") from exc
        if not isinstance(data, dict) or not set(data) <= {"users", "roles"}:
            raise ValueError(f"users file {path} must be a JSON object with 'users' and/or 'roles' arrays")
        try:
            with self._lock:
                for kind, key in (("roles", "role"), ("users", "user")):
                    for doc in data.get(kind, []):
                        if not isinstance(doc, dict) or not isinstance(doc.get("db", "admin"), str):
                            raise command_error(BAD_VALUE, f"each entry of '{kind}' must be an object")
                        db = str(doc.get("db", "admin"))
                        name = doc.get(key)
                        body = {k: v for k, v in doc.items() if k not in (key, "db")}
                        if kind == "roles":
                            self.roles.pop((db, str(name)), None)
                            self.create_role(db, {"createRole": name, **body})
                        else:
                            self.users.pop((db, str(name)), None)
                            self.create_user(db, {"createUser": name, **body})
        except CommandError as exc:
            raise ValueError(f"users file {path}: {exc.errmsg}") from exc

    # -- user and role management ----------------------------------------------------------------
    def _changed(self) -> None:
        self._generation += 1
        self._save()

    def _role_refs(self, db: str, value: Any) -> list[RoleRef]:
        if not isinstance(value, list):
            raise command_error(BAD_VALUE, "'roles' field must be an array")
        refs: list[RoleRef] = []
        for item in value:
            if isinstance(item, str):
                ref = (item, db)
            elif isinstance(item, Mapping) and isinstance(item.get("role"), str) and isinstance(item.get("db"), str):
                ref = (item["role"], item["db"])
            else:
                raise command_error(BAD_VALUE, "role names must be strings or {role: <name>, db: <db>} objects")
            if builtin_privileges(*ref) is None and ref[::-1] not in self.roles:
                raise command_error(ROLE_NOT_FOUND, f"Could not find role: {ref[0]}@{ref[1]}")
            if ref not in refs:
                refs.append(ref)
        return refs

    def _credentials(self, name: str, cmd: Mapping[str, Any], required: bool) -> dict[str, Credential] | None:
        pwd = cmd.get("pwd")
        if pwd is None:
            if required:
                raise command_error(BAD_VALUE, "Must provide a 'pwd' field for all user documents, except those with '$external' as the user's source db")
            return None
        if not isinstance(pwd, str) or not pwd:
            raise command_error(BAD_VALUE, "'pwd' must be a non-empty string")
        mechanisms = cmd.get("mechanisms", list(MECHANISMS))
        if not isinstance(mechanisms, list) or not mechanisms or any(m not in MECHANISMS for m in mechanisms):
            raise command_error(BAD_VALUE, f"'mechanisms' must be a non-empty subset of {list(MECHANISMS)}")
        return {m: Credential.derive(m, name, pwd) for m in MECHANISMS if m in mechanisms}

    def create_user(self, db: str, cmd: Mapping[str, Any]) -> None:
        name = _user_name(cmd.get("createUser"), "createUser")
        with self._lock:
            if (db, name) in self.users:
                raise command_error(DUPLICATE_USER, f'User "{name}@{db}" already exists')
            roles = self._role_refs(db, cmd.get("roles", []))
            credentials = self._credentials(name, cmd, required=True)
            assert credentials is not None
            custom = cmd.get("customData")
            self.users[(db, name)] = User(name, db, credentials, roles, custom_data=dict(custom) if isinstance(custom, Mapping) else None)
            self._changed()

    def update_user(self, db: str, cmd: Mapping[str, Any]) -> None:
        name = _user_name(cmd.get("updateUser"), "updateUser")
        with self._lock:
            user = self._user(db, name)
            if "roles" in cmd:
                user.roles = self._role_refs(db, cmd["roles"])
            credentials = self._credentials(name, cmd, required=False)
            if credentials is not None:
                user.credentials = credentials
            if isinstance(cmd.get("customData"), Mapping):
                user.custom_data = dict(cmd["customData"])
            self._changed()

    def drop_user(self, db: str, name: Any) -> None:
        name = _user_name(name, "dropUser")
        with self._lock:
            self._user(db, name)
            del self.users[(db, name)]
            self._changed()

    def drop_all_users(self, db: str) -> int:
        with self._lock:
            victims = [key for key in self.users if key[0] == db]
            for key in victims:
                del self.users[key]
            self._changed()
            return len(victims)

    def grant_roles(self, db: str, name: Any, roles: Any, grant: bool) -> None:
        name = _user_name(name, "grantRolesToUser" if grant else "revokeRolesFromUser")
        with self._lock:
            user = self._user(db, name)
            refs = self._role_refs(db, roles)
            if grant:
                user.roles.extend(ref for ref in refs if ref not in user.roles)
            else:
                user.roles = [ref for ref in user.roles if ref not in refs]
            self._changed()

    def _user(self, db: str, name: str) -> User:
        user = self.users.get((db, name))
        if user is None:
            raise command_error(USER_NOT_FOUND, f"Could not find user \"{name}\" for db \"{db}\"")
        return user

    def create_role(self, db: str, cmd: Any) -> None:
        if not isinstance(cmd, Mapping):
            raise command_error(BAD_VALUE, "a role must be an object")
        name = _user_name(cmd.get("createRole"), "createRole")
        with self._lock:
            if (db, name) in self.roles or builtin_privileges(name, db) is not None or name in _DATABASE_ROLES | _ADMIN_ONLY_ROLES:
                raise command_error(DUPLICATE_ROLE, f"Role \"{name}@{db}\" already exists")
            raw = cmd.get("privileges", [])
            if not isinstance(raw, list):
                raise command_error(BAD_VALUE, "'privileges' field must be an array")
            privileges = [Privilege.parse(p) for p in raw]
            if db != "admin":
                for privilege in privileges:
                    resource = privilege.resource
                    if resource.cluster or resource.any_resource or resource.db != db:
                        raise command_error(
                            BAD_VALUE,
                            f"Roles on the '{db}' database cannot be granted privileges that target other databases or the cluster",
                        )
            roles = self._role_refs(db, cmd.get("roles", []))
            self.roles[(db, name)] = Role(name, db, privileges, roles)
            self._changed()

    def drop_role(self, db: str, name: Any) -> None:
        name = _user_name(name, "dropRole")
        with self._lock:
            if (db, name) not in self.roles:
                raise command_error(ROLE_NOT_FOUND, f"Role {name}@{db} not found")
            del self.roles[(db, name)]
            for user in self.users.values():
                user.roles = [ref for ref in user.roles if ref != (name, db)]
            self._changed()

    def users_info(self, db: str, arg: Any, show_credentials: bool) -> list[dict[str, Any]]:
        with self._lock:
            if arg == 1:
                selected = [u for (d, _), u in sorted(self.users.items()) if d == db]
            else:
                wanted = arg if isinstance(arg, list) else [arg]
                selected = []
                for item in wanted:
                    if isinstance(item, str):
                        key = (db, item)
                    elif isinstance(item, Mapping) and isinstance(item.get("user"), str):
                        key = (str(item.get("db", db)), item["user"])
                    else:
                        raise command_error(BAD_VALUE, "usersInfo takes 1, a user name, {user, db} or an array of them")
                    if key in self.users:
                        selected.append(self.users[key])
            return [u.info(show_credentials) for u in selected]

    def roles_info(self, db: str, arg: Any) -> list[dict[str, Any]]:
        with self._lock:
            wanted = [r for (d, _), r in sorted(self.roles.items()) if d == db] if arg == 1 else [
                self.roles[(db, arg)]] if isinstance(arg, str) and (db, arg) in self.roles else []
            return [r.info() for r in wanted]

    # -- privileges --------------------------------------------------------------------------------
    def _resolve(self, refs: Iterable[RoleRef]) -> tuple[list[Privilege], list[RoleRef]]:
        """Every privilege of ``refs`` and of the roles they inherit, and every role name reached."""
        privileges: list[Privilege] = []
        seen: list[RoleRef] = []
        pending = list(refs)
        while pending:
            ref = pending.pop()
            if ref in seen:
                continue
            seen.append(ref)
            builtin = builtin_privileges(*ref)
            if builtin is not None:
                privileges.extend(builtin)
                if ref[0] == "dbOwner":
                    seen.extend([("readWrite", ref[1]), ("dbAdmin", ref[1]), ("userAdmin", ref[1])])
                continue
            role = self.roles.get((ref[1], ref[0]))
            if role is not None:
                privileges.extend(role.privileges)
                pending.extend(role.roles)
        return privileges, seen

    def _state(self, conn: Any) -> _ConnectionAuth:
        state = self._connections.get(conn)
        if state is None:
            state = self._connections[conn] = _ConnectionAuth()
        return state

    def _granted(self, state: _ConnectionAuth) -> list[Privilege]:
        if state.generation != self._generation:
            current = {key: self.users.get(key, user) for key, user in state.users.items()
                       if key in self.users or key == _SYSTEM}  # fmt: skip
            state.users = current  # a dropped user is logged out
            refs = [ref for user in current.values() for ref in user.roles]
            state.privileges, state.role_names = self._resolve(refs)
            state.generation = self._generation
        return state.privileges

    def authorize(self, conn: Any, peer_is_local: bool, db: str, name: str, cmd: Mapping[str, Any]) -> None:
        """Refuse the command, as mongod would, unless the connection's users may run it."""
        if not self.enabled or name in _NO_AUTH:
            return
        with self._lock:
            if name in ("createUser", "createRole") and not self.users and peer_is_local:
                return  # the localhost exception: the first user (or role) of a fresh deployment
            state = self._state(conn)
            privileges = self._granted(state)
            if not state.users:
                raise command_error(UNAUTHORIZED, f"Command {name} requires authentication")
            if name in _AUTHENTICATED:
                return
            for target, actions in required_privileges(db, name, cmd):
                for action in actions:
                    if not any(p.allows(target, action) for p in privileges):
                        raise command_error(UNAUTHORIZED, f"not authorized on {db} to execute command {_redacted(cmd)}")

    def may(self, conn: Any, target: Target, action: str) -> bool:
        """Whether the connection's users hold ``action`` on ``target`` (always, without --auth)."""
        if not self.enabled:
            return True
        with self._lock:
            return any(p.allows(target, action) for p in self._granted(self._state(conn)))

    def visible_databases(self, conn: Any, names: Sequence[str]) -> list[str]:
        """``listDatabases`` without the ``listDatabases`` action: the databases the user has any privilege on."""
        if self.may(conn, CLUSTER, "listDatabases"):
            return list(names)
        with self._lock:
            privileges = self._granted(self._state(conn))
        visible = []
        for db in names:
            if any(p.resource.db == db or (p.resource.db == "" and not p.resource.cluster and db not in INTERNAL_DATABASES)
                   or p.resource.any_resource for p in privileges):  # fmt: skip
                visible.append(db)
        return visible

    def connection_status(self, conn: Any, show_privileges: bool) -> dict[str, Any]:
        with self._lock:
            state = self._state(conn)
            privileges = self._granted(state)
            info: dict[str, Any] = {
                "authenticatedUsers": [{"user": u.name, "db": u.db} for u in state.users.values()],
                "authenticatedUserRoles": [{"role": r, "db": d} for r, d in state.role_names],
            }
            if show_privileges:
                info["authenticatedUserPrivileges"] = [p.document() for p in privileges]
            return {"authInfo": info}

    def authenticate_internal(self, conn: Any) -> None:
        """Authenticate a cluster-internal connection (mongos to a shard) as ``__system``, as a keyfile does."""
        with self._lock:
            state = self._state(conn)
            state.users[_SYSTEM] = User("__system", "local", {}, [("__system", "admin")])
            state.generation = -1

    def logout(self, conn: Any) -> None:
        with self._lock:
            self._connections.pop(conn, None)

    # -- SASL ----------------------------------------------------------------------------------------
    def supported_mechanisms(self, qualified_user: Any) -> list[str] | None:
        """``hello``'s ``saslSupportedMechs`` for ``"<db>.<user>"`` (None: no such user)."""
        if not isinstance(qualified_user, str) or "." not in qualified_user:
            return None
        db, _, name = qualified_user.partition(".")
        user = self.users.get((db, name))
        return None if user is None else [m for m in MECHANISMS if m in user.credentials]

    def sasl_start(self, conn: Any, db: str, cmd: Mapping[str, Any]) -> dict[str, Any]:
        mechanism = cmd.get("mechanism")
        if mechanism not in MECHANISMS:
            raise command_error(MECHANISM_UNAVAILABLE, f"Received authentication for mechanism {mechanism} which is not enabled")
        client_first = _payload(cmd)
        gs2, sep, bare = client_first.partition(b",")
        authzid, sep2, bare = bare.partition(b",")
        if not sep or not sep2 or gs2 not in (b"n", b"y") or not bare.startswith(b"n="):
            raise command_error(BAD_VALUE, "Incorrect SCRAM client|server first message format")
        fields = _scram_fields(bare)
        if b"n" not in fields or b"r" not in fields:
            raise command_error(BAD_VALUE, "Incorrect SCRAM client first message format")
        name = fields[b"n"].replace(b"=2C", b",").replace(b"=3D", b"=").decode("utf-8")
        with self._lock:
            user = self.users.get((db, name))
        if user is None:
            raise command_error(AUTHENTICATION_FAILED, "Authentication failed.")
        credential = user.credentials.get(str(mechanism))
        if credential is None:
            raise command_error(
                MECHANISM_UNAVAILABLE,
                f"Unable to use {mechanism} based authentication for user without any {mechanism} credentials registered",
            )
        nonce = fields[b"r"] + base64.standard_b64encode(os.urandom(24))
        server_first = b"r=" + nonce + b",s=" + base64.standard_b64encode(credential.salt) + b",i=" + str(
            credential.iteration_count).encode()  # fmt: skip
        options = cmd.get("options")
        skip = isinstance(options, Mapping) and bool(options.get("skipEmptyExchange"))
        with self._lock:
            self._state(conn).conversation = _Conversation(str(mechanism), user, credential, bare, server_first, nonce, skip)
        return {"conversationId": 1, "done": False, "payload": Binary(server_first)}

    def sasl_continue(self, conn: Any, db: str, cmd: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            state = self._state(conn)
            conversation = state.conversation
        if conversation is None or cmd.get("conversationId") != 1:
            raise command_error(PROTOCOL_ERROR, "No SASL session state found")
        if conversation.step == 2:  # the empty exchange of clients without skipEmptyExchange
            state.conversation = None
            return {"conversationId": 1, "done": True, "payload": Binary(b"")}
        payload = _payload(cmd)
        fields = _scram_fields(payload)
        proof = fields.get(b"p")
        if fields.get(b"r") != conversation.nonce or proof is None or b"c" not in fields:
            state.conversation = None
            raise command_error(AUTHENTICATION_FAILED, "Authentication failed.")
        without_proof = payload[: payload.rindex(b",p=")]
        auth_message = b",".join((conversation.client_first_bare, conversation.server_first, without_proof))
        digest = _DIGESTS[conversation.mechanism]
        credential = conversation.credential
        signature = hmac.new(credential.stored_key, auth_message, digest).digest()
        try:
            client_key = bytes(a ^ b for a, b in zip(base64.standard_b64decode(proof), signature, strict=True))
        except ValueError:
            client_key = b""
        if not client_key or not hmac.compare_digest(hashlib.new(digest, client_key).digest(), credential.stored_key):
            state.conversation = None
            raise command_error(AUTHENTICATION_FAILED, "Authentication failed.")
        server_signature = hmac.new(credential.server_key, auth_message, digest).digest()
        user = conversation.user
        with self._lock:
            state.users[(user.db, user.name)] = user
            state.generation = -1
            if conversation.skip_empty_exchange:
                state.conversation = None
            else:
                conversation.step = 2
        return {"conversationId": 1, "done": conversation.skip_empty_exchange,
                "payload": Binary(b"v=" + base64.standard_b64encode(server_signature))}  # fmt: skip

    def amend_hello(self, conn: Any, cmd: Mapping[str, Any], reply: dict[str, Any]) -> None:
        """``saslSupportedMechs`` and ``speculativeAuthenticate`` in a handshake reply."""
        mechanisms = self.supported_mechanisms(cmd.get("saslSupportedMechs"))
        if mechanisms is not None:
            reply["saslSupportedMechs"] = mechanisms
        speculative = cmd.get("speculativeAuthenticate")
        if isinstance(speculative, Mapping) and speculative.get("saslStart") and isinstance(speculative.get("db"), str):
            try:
                reply["speculativeAuthenticate"] = self.sasl_start(conn, speculative["db"], speculative)
            except CommandError:
                pass  # as mongod: a failed speculation is silent, the driver authenticates normally


class _Shown:
    """A value printed as mongod prints it (``UUID("...")``) inside ``format_value``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def _printable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    if isinstance(value, Binary) and value.subtype == 4:
        return _Shown(f'UUID("{value.as_uuid()}")')
    if isinstance(value, bytes):
        return _Shown(f'BinData(0, {base64.standard_b64encode(value).decode()})')
    return value


def _redacted(cmd: Mapping[str, Any]) -> str:
    """The command as mongod prints it in an Unauthorized message, passwords redacted."""
    return format_value(_printable({k: ("xxx" if k == "pwd" else v) for k, v in cmd.items()}))


# -- what each command needs -------------------------------------------------------------------------

_NAMESPACE_ACTIONS = {
    "find": ("find",), "count": ("find",), "distinct": ("find",), "listIndexes": ("listIndexes",),
    "insert": ("insert",), "delete": ("remove",), "collStats": ("collStats",), "collstats": ("collStats",),
    "createIndexes": ("createIndex",), "dropIndexes": ("dropIndex",), "deleteIndexes": ("dropIndex",),
    "drop": ("dropCollection",), "create": ("createCollection",), "collMod": ("collMod",),
}  # fmt: skip
_DATABASE_ACTIONS = {
    "listCollections": ("listCollections",), "dbStats": ("dbStats",), "dbstats": ("dbStats",),
    "dropDatabase": ("dropDatabase",), "createUser": ("createUser",), "updateUser": ("createUser",),
    "dropUser": ("dropUser",), "dropAllUsersFromDatabase": ("dropUser",), "usersInfo": ("viewUser",),
    "grantRolesToUser": ("grantRole",), "revokeRolesFromUser": ("revokeRole",), "createRole": ("createRole",),
    "dropRole": ("dropRole",), "rolesInfo": ("viewRole",),
}  # fmt: skip
_CLUSTER_ACTIONS = {
    "listDatabases": (), "serverStatus": ("serverStatus",), "replSetGetStatus": ("replSetGetStatus",),
    "replSetGetConfig": ("replSetGetConfig",), "getParameter": ("getParameter",), "getCmdLineOpts": ("getCmdLineOpts",),
    "getLog": ("getLog",), "currentOp": ("inprog",), "setParameter": ("setParameter",), "fsync": ("fsync",),
    "appendOplogNote": ("appendOplogNote",), "replSetStepDown": ("replSetStateChange",),
    "killAllSessions": ("killAnySession",), "killAllSessionsByPattern": ("killAnySession",),
    "listShards": ("listShards",), "enableSharding": ("enableSharding",), "shardCollection": ("enableSharding",),
}  # fmt: skip


def _collection(cmd: Mapping[str, Any], name: str) -> str:
    value = cmd.get(name)
    return value if isinstance(value, str) else ""


def required_privileges(db: str, name: str, cmd: Mapping[str, Any]) -> list[tuple[Target, tuple[str, ...]]]:
    """The (resource, actions) pairs mongod checks before running ``name`` on ``db``.

    Commands not listed (fault injection, test commands) need every action on every resource:
    only ``root`` may run them, as with mongod's test commands under access control.
    """
    if name in _NAMESPACE_ACTIONS:
        return [(namespace(db, _collection(cmd, name)), _NAMESPACE_ACTIONS[name])]
    if name == "update":
        upsert = any(isinstance(s, Mapping) and s.get("upsert") for s in cmd.get("updates") or [])
        return [(namespace(db, _collection(cmd, name)), ("update", "insert") if upsert else ("update",))]
    if name in ("findAndModify", "findandmodify"):
        actions = ("find", "remove") if cmd.get("remove") else ("find", "update") + (("insert",) if cmd.get("upsert") else ())
        return [(namespace(db, _collection(cmd, name)), actions)]
    if name == "aggregate":
        return _aggregate_privileges(db, cmd)
    if name == "renameCollection":
        source, target = str(cmd.get("renameCollection", "")), str(cmd.get("to", ""))
        sdb, _, scoll = source.partition(".")
        tdb, _, tcoll = target.partition(".")
        if sdb == tdb:
            return [(database(sdb), ("renameCollectionSameDB",))]
        return [(namespace(sdb, scoll), ("find", "dropCollection")), (namespace(tdb, tcoll), ("insert", "createIndex"))]
    if name in _DATABASE_ACTIONS:
        return [(database(db), _DATABASE_ACTIONS[name])]
    if name in _CLUSTER_ACTIONS:
        return [(CLUSTER, _CLUSTER_ACTIONS[name])]
    return [(Target("any_normal"), ("anyAction",)), (CLUSTER, ("anyAction",))]


def _aggregate_privileges(db: str, cmd: Mapping[str, Any]) -> list[tuple[Target, tuple[str, ...]]]:
    target = cmd.get("aggregate")
    pipeline = cmd.get("pipeline") or []
    first = pipeline[0] if pipeline and isinstance(pipeline[0], Mapping) else {}
    needs: list[tuple[Target, tuple[str, ...]]] = []
    if "$changeStream" in first:
        spec = first["$changeStream"] if isinstance(first["$changeStream"], Mapping) else {}
        if spec.get("allChangesForCluster"):
            needs.append((Target("any_normal"), ("changeStream", "find")))
        elif isinstance(target, str):
            needs.append((namespace(db, target), ("changeStream", "find")))
        else:
            needs.append((database(db), ("changeStream", "find")))
    elif isinstance(target, str):
        needs.append((namespace(db, target), ("find",)))
    elif "$currentOp" in first:
        needs.append((CLUSTER, ("inprog",)))
    for stage in pipeline:
        if not isinstance(stage, Mapping):
            continue
        for lookup in ("$lookup", "$graphLookup"):
            source = stage.get(lookup)
            if isinstance(source, Mapping) and isinstance(source.get("from"), str):
                needs.append((namespace(db, source["from"]), ("find",)))
        for output in ("$out", "$merge"):
            into = stage.get(output)
            coll = into if isinstance(into, str) else (into.get("into") if isinstance(into, Mapping) else None)
            if isinstance(coll, str):
                needs.append((namespace(db, coll), ("insert", "remove", "update")))
    return needs
