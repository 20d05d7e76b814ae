"""Access control as mongod enforces it: SCRAM users, authSource, roles, and code 13 beyond them.

Runs against the emulator started with ``--auth`` or a real one (``MONGOCDC_TEST_MONGODB_AUTH_URI``);
the last tests start emulators of their own (localhost exception, users file, persistence).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from mongocdc_devstack.fixture import EmulatedReplicaSet
from tests.security.conftest import AuthDeployment, with_user, without_user


def _client(uri: str, **kwargs: object) -> MongoClient:
    return MongoClient(uri, serverSelectionTimeoutMS=5000, **kwargs)  # type: ignore[arg-type]


def _code(call: object) -> int:
    with pytest.raises(OperationFailure) as failure:
        call()  # type: ignore[operator]
    return int(failure.value.code or 0)


@pytest.fixture
def dbs(auth_deployment: AuthDeployment) -> Iterator[tuple[str, str]]:
    """Two databases with a document each, dropped afterwards."""
    names = (f"a_{uuid.uuid4().hex[:8]}", f"b_{uuid.uuid4().hex[:8]}")
    for name in names:
        auth_deployment.admin[name].c.insert_one({"_id": 1, "x": name})
    yield names
    for name in names:
        auth_deployment.admin.drop_database(name)


def test_unauthenticated_commands_are_refused_but_the_handshake_works(auth_deployment: AuthDeployment, dbs: tuple[str, str]) -> None:
    anonymous = _client(without_user(auth_deployment.admin_uri))
    assert anonymous.admin.command("hello")["ok"] == 1
    assert anonymous.admin.command("ping")["ok"] == 1
    with pytest.raises(OperationFailure) as failure:
        anonymous[dbs[0]].c.find_one()
    assert failure.value.code == 13 and (failure.value.details or {}).get("codeName") == "Unauthorized"
    assert "requires authentication" in str(failure.value)
    assert _code(lambda: anonymous.list_database_names()) == 13
    anonymous.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1", None])
def test_scram_mechanisms_authenticate(auth_deployment: AuthDeployment, dbs: tuple[str, str], mechanism: str | None) -> None:
    user, password = auth_deployment.create_user([{"role": "read", "db": dbs[0]}])
    options = {"authMechanism": mechanism} if mechanism else {}
    client = _client(auth_deployment.uri_for(user, password), **options)
    assert client[dbs[0]].c.find_one() == {"_id": 1, "x": dbs[0]}
    status = client.admin.command("connectionStatus")["authInfo"]
    assert status["authenticatedUsers"] == [{"user": user, "db": "admin"}]
    assert {"role": "read", "db": dbs[0]} in status["authenticatedUserRoles"]
    client.close()


def test_a_sha1_only_user_is_negotiated_to_sha1(auth_deployment: AuthDeployment, dbs: tuple[str, str]) -> None:
    user, password = auth_deployment.create_user([{"role": "read", "db": dbs[0]}], mechanisms=["SCRAM-SHA-1"])
    client = _client(auth_deployment.uri_for(user, password))  # the driver asks saslSupportedMechs
    assert client[dbs[0]].c.count_documents({}) == 1
    client.close()
    forced = _client(auth_deployment.uri_for(user, password), authMechanism="SCRAM-SHA-256")
    assert _code(lambda: forced[dbs[0]].c.count_documents({})) in (18, 334)
    forced.close()


def test_wrong_password_unknown_user_and_wrong_auth_source_fail_with_18(auth_deployment: AuthDeployment, dbs: tuple[str, str]) -> None:
    user, password = auth_deployment.create_user([{"role": "read", "db": dbs[0]}], db=dbs[0])
    good = _client(auth_deployment.uri_for(user, password, auth_source=dbs[0]))
    assert good[dbs[0]].c.count_documents({}) == 1
    good.close()
    for uri in (
        auth_deployment.uri_for(user, password + "x", auth_source=dbs[0]),
        auth_deployment.uri_for(user, password, auth_source="admin"),  # the user lives in another database
        auth_deployment.uri_for("nobody-" + user, password),
    ):
        client = _client(uri)
        with pytest.raises(OperationFailure) as failure:
            client.admin.command("listDatabases")
        assert failure.value.code == 18 and "Authentication failed" in str(failure.value)
        client.close()


def test_read_role_allows_reads_and_refuses_writes_and_other_databases(auth_deployment: AuthDeployment, dbs: tuple[str, str]) -> None:
    user, password = auth_deployment.create_user([{"role": "read", "db": dbs[0]}])
    client = _client(auth_deployment.uri_for(user, password))
    mine, other = client[dbs[0]], client[dbs[1]]
    assert mine.c.find_one({"_id": 1}) is not None
    assert mine.c.count_documents({}) == 1 and mine.list_collection_names() == ["c"]
    assert _code(lambda: mine.c.insert_one({"_id": 2})) == 13
    assert _code(lambda: mine.c.delete_one({"_id": 1})) == 13
    assert _code(lambda: other.c.find_one()) == 13
    with pytest.raises(OperationFailure, match=f"not authorized on {dbs[1]} to execute command"):
        other.c.find_one()
    # Without the listDatabases action, listDatabases shows only the databases the user may use.
    assert client.list_database_names() == [dbs[0]]
    client.close()


def test_change_stream_privileges_per_scope(auth_deployment: AuthDeployment, dbs: tuple[str, str]) -> None:
    reader, reader_pw = auth_deployment.create_user([{"role": "read", "db": dbs[0]}])
    client = _client(auth_deployment.uri_for(reader, reader_pw))
    with client[dbs[0]].c.watch() as stream:
        assert stream.try_next() is None
    with client[dbs[0]].watch() as stream:
        assert stream.try_next() is None
    assert _code(lambda: client[dbs[1]].c.watch().close()) == 13
    assert _code(lambda: client.watch().close()) == 13  # the whole deployment needs more than read on one database
    client.close()
    cluster_reader, cluster_pw = auth_deployment.create_user([{"role": "readAnyDatabase", "db": "admin"}])
    wide = _client(auth_deployment.uri_for(cluster_reader, cluster_pw))
    with wide.watch() as stream:
        assert stream.try_next() is None
    assert _code(lambda: wide[dbs[0]].c.insert_one({})) == 13
    wide.close()


def test_oplog_needs_read_on_local(auth_deployment: AuthDeployment, dbs: tuple[str, str]) -> None:
    plain, plain_pw = auth_deployment.create_user([{"role": "readAnyDatabase", "db": "admin"}])
    client = _client(auth_deployment.uri_for(plain, plain_pw))
    assert _code(lambda: client.local["oplog.rs"].find_one()) == 13  # readAnyDatabase excludes local
    client.close()
    oplog_reader, pw = auth_deployment.create_user([{"role": "read", "db": "local"}])
    client = _client(auth_deployment.uri_for(oplog_reader, pw))
    assert client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)]) is not None
    client.close()


def test_custom_role_grants_exactly_its_privileges(auth_deployment: AuthDeployment, dbs: tuple[str, str]) -> None:
    db = dbs[0]
    role = auth_deployment.create_role([
        {"resource": {"db": db, "collection": "c"}, "actions": ["find", "changeStream"]},
        {"resource": {"db": db, "collection": "signals"}, "actions": ["find", "insert", "remove"]},
    ])
    user, password = auth_deployment.create_user([{"role": role, "db": "admin"}])
    client = _client(auth_deployment.uri_for(user, password))
    assert client[db].c.find_one() is not None
    with client[db].c.watch() as stream:
        assert stream.try_next() is None
    client[db].signals.insert_one({"_id": "s1"})
    assert client[db].signals.delete_one({"_id": "s1"}).deleted_count == 1
    assert _code(lambda: client[db].c.insert_one({})) == 13
    assert _code(lambda: client[db].other.find_one()) == 13
    assert _code(lambda: client[db].watch().close()) == 13  # a database stream needs the database resource
    assert _code(lambda: client[db].list_collection_names()) == 13
    client.close()


def test_granting_and_dropping_take_effect_on_open_connections(auth_deployment: AuthDeployment, dbs: tuple[str, str]) -> None:
    user, password = auth_deployment.create_user([{"role": "read", "db": dbs[0]}])
    client = _client(auth_deployment.uri_for(user, password), maxPoolSize=1)
    assert _code(lambda: client[dbs[1]].c.find_one()) == 13
    auth_deployment.admin.admin.command("grantRolesToUser", user, roles=[{"role": "read", "db": dbs[1]}])
    assert client[dbs[1]].c.find_one() is not None
    info = auth_deployment.admin.admin.command("usersInfo", user)["users"][0]
    assert {"role": "read", "db": dbs[1]} in info["roles"] and "credentials" not in info
    auth_deployment.admin.admin.command("revokeRolesFromUser", user, roles=[{"role": "read", "db": dbs[1]}])
    assert _code(lambda: client[dbs[1]].c.find_one()) == 13
    client.close()


def test_user_management_errors(auth_deployment: AuthDeployment, dbs: tuple[str, str]) -> None:
    admin = auth_deployment.admin.admin
    user, _ = auth_deployment.create_user(["read"], db=dbs[0])
    assert _code(lambda: auth_deployment.admin[dbs[0]].command("createUser", user, pwd="x", roles=[])) == 51003
    assert _code(lambda: admin.command("createUser", "u_" + uuid.uuid4().hex, pwd="x", roles=["noSuchRole"])) == 31
    assert _code(lambda: admin.command("dropUser", "u_" + uuid.uuid4().hex)) == 11
    assert _code(lambda: auth_deployment.admin[dbs[0]].command("createUser", "u_" + uuid.uuid4().hex, pwd="x",
                                                                roles=["readAnyDatabase"])) == 31  # admin-only role


# -- the emulator's own start options ----------------------------------------------------------------


def _emulator_only(auth_deployment: AuthDeployment) -> None:
    if not auth_deployment.emulated:
        pytest.skip("start options of the emulator (a real deployment is configured)")


def test_localhost_exception_allows_only_the_first_user(auth_deployment: AuthDeployment) -> None:
    _emulator_only(auth_deployment)
    with EmulatedReplicaSet(noop_interval=0, auth=True) as emulated:
        anonymous = _client(emulated.uri)
        assert _code(lambda: anonymous.t.c.find_one()) == 13
        anonymous.admin.command("createUser", "first", pwd="first-pw", roles=["root"])
        assert _code(lambda: anonymous.admin.command("createUser", "second", pwd="x", roles=["root"])) == 13
        first = _client(with_user(emulated.uri, "first", "first-pw"))
        first.t.c.insert_one({"_id": 1})
        assert first.t.c.count_documents({}) == 1
        first.close()
        anonymous.close()


def test_users_file_and_dbpath_keep_users_across_restarts(auth_deployment: AuthDeployment, tmp_path: Path) -> None:
    _emulator_only(auth_deployment)
    users = tmp_path / "users.json"
    users.write_text(json.dumps({
        "roles": [{"role": "streamer", "db": "admin",
                   "privileges": [{"resource": {"db": "", "collection": ""}, "actions": ["find", "changeStream"]}]}],
        "users": [{"user": "boss", "pwd": "boss-pw", "roles": ["root"]},
                  {"user": "cdc", "pwd": "cdc-pw", "db": "admin", "roles": ["streamer", {"role": "read", "db": "local"}]}],
    }))  # fmt: skip
    emulated = EmulatedReplicaSet(noop_interval=0, auth=True, users_file=str(users), dbpath=str(tmp_path / "data"))
    with emulated:
        boss = _client(with_user(emulated.uri, "boss", "boss-pw"))
        boss.admin.command("createUser", "later", pwd="later-pw", roles=[{"role": "read", "db": "t"}])
        boss.t.c.insert_one({"_id": 1})
        boss.close()
    emulated.users_file = None
    with emulated:  # restarted from its dbpath: users and roles are still there
        for name, password in (("cdc", "cdc-pw"), ("later", "later-pw")):
            client = _client(with_user(emulated.uri, name, password))
            assert client.t.c.find_one() == {"_id": 1}
            client.close()
        cdc = _client(with_user(emulated.uri, "cdc", "cdc-pw"))
        with cdc.watch() as stream:
            assert stream.try_next() is None
        assert _code(lambda: cdc.t.c.insert_one({})) == 13
        cdc.close()


def test_bad_users_file_is_one_clear_line(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"users": [{"user": "x", "pwd": "y", "roles": ["noSuchRole"]}]}))
    done = subprocess.run([sys.executable, "-m", "mongocdc_devstack.server", "--port", "0", "--auth", "--users-file", str(users)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == f"users file {users}: Could not find role: noSuchRole@admin"
    missing = subprocess.run([sys.executable, "-m", "mongocdc_devstack.server", "--port", "0", "--users-file", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 2 and "no such file" in missing.stderr
