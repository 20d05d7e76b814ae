"""The connector against a deployment with access control.

Credentials through ``mongodb.user``/``mongodb.password``/``mongodb.authsource`` and
``mongodb.authentication.class``, or in the connection string; the least privileges the seeds
list (read on the captured database or every database, read on ``local``, write on the signaling
collection) suffice for snapshot, streaming and incremental snapshots, and less is refused with a
message naming what is missing. No password ever shows in logs, metrics, offsets, records,
notifications, errors or what the orchestration API returns.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from bson import Timestamp
from pymongo.database import Database

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import FileOffsetStore, MemoryOffsetStore
from mongocdc_core.positions import Position
from mongocdc_core.receiver import ProgressListener
from mongocdc_core.source.errors import AuthenticationError, PrivilegeError
from tests.adhoc.support import engine_config, kinds, notifications, wait_for
from tests.adhoc.support import make_config as signal_config
from tests.engine.engine_support import Background, MemorySink, make_config, replay, run_engine, source_state
from tests.security.conftest import AuthDeployment, read_all, without_user

SECRET = "Sécr3t:P@ss/wörd%+ü"


def _secret_forms(password: str) -> list[str]:
    return [password, quote_plus(password), quote(password, safe="")]


@pytest.fixture
def db(auth_deployment: AuthDeployment) -> Iterator[Database]:
    database = auth_deployment.admin[f"cdc_{uuid.uuid4().hex[:8]}"]
    database.items.insert_many([{"_id": i, "v": i} for i in range(10)])
    yield database
    auth_deployment.admin.drop_database(database.name)


def _signal_writer(auth: AuthDeployment, db: str) -> dict[str, str]:
    """Write on the signaling collection only (incremental snapshot watermarks are inserts and deletes)."""
    role = auth.create_role([{"resource": {"db": db, "collection": "signals"}, "actions": ["find", "insert", "remove"]}])
    return {"role": role, "db": "admin"}


def _credentials(user: str, password: str, source: str = "admin") -> dict[str, str]:
    return {"mongodb.user": user, "mongodb.password": password, "mongodb.authsource": source}


def _in(db: Database) -> dict[str, str]:
    """capture.scope=database: what a user with read on that one database can capture."""
    return {"capture.scope": "database", "capture.target": db.name}


def test_user_password_and_authsource_properties(auth_deployment: AuthDeployment, db: Database, tmp_path: Path) -> None:
    # A user defined in the captured database itself: mongodb.authsource names it.
    user, password = auth_deployment.create_user([{"role": "read", "db": db.name}], db=db.name)
    uri = without_user(auth_deployment.admin_uri)
    cfg = make_config(uri, db.name, **_credentials(user, password, db.name), **_in(db),
                      **{"mongodb.authentication.class": "io.debezium.connector.mongodb.connection.DefaultMongoDbAuthProvider"})  # fmt: skip
    offsets = FileOffsetStore(tmp_path / "offsets.json")
    sink = MemorySink()
    summary = run_engine(cfg, sink, offsets)
    assert summary.snapshot_documents == 10
    db.items.update_one({"_id": 3}, {"$set": {"v": 33}})
    db.items.insert_one({"_id": 10})
    run_engine(cfg, sink, offsets)
    assert replay(sink.records, f"{db.name}.items") == source_state(db.items)
    wrong_source = make_config(uri, db.name, **_credentials(user, password, "admin"), **_in(db))
    with pytest.raises(AuthenticationError, match="refused the credentials"):
        run_engine(wrong_source, MemorySink(), MemoryOffsetStore(), max_events=1)


def test_password_in_the_connection_string(auth_deployment: AuthDeployment, db: Database) -> None:
    user, password = auth_deployment.create_user([{"role": "read", "db": db.name}], password=SECRET)
    uri = auth_deployment.uri_for(user, password)
    # The connection string wins over mongodb.user/mongodb.password, as in Debezium.
    cfg = make_config(uri, db.name, **_credentials("someone-else", "not-used"), **_in(db))
    sink = MemorySink()
    assert run_engine(cfg, sink, MemoryOffsetStore()).snapshot_documents == 10


def test_wrong_password_is_refused_without_echoing_it(auth_deployment: AuthDeployment, db: Database) -> None:
    user, _ = auth_deployment.create_user([{"role": "read", "db": db.name}])
    for cfg in (
        make_config(without_user(auth_deployment.admin_uri), db.name, **_credentials(user, SECRET), **_in(db)),
        make_config(auth_deployment.uri_for(user, SECRET), db.name, **_in(db)),
    ):
        with pytest.raises(AuthenticationError) as refused:
            run_engine(cfg, MemorySink(), MemoryOffsetStore(), max_events=1)
        text = f"{refused.value} {refused.value.__cause__}"
        assert "check the user, password and authSource" in text
        assert not any(form in text for form in _secret_forms(SECRET))


class _Streaming(ProgressListener):
    def __init__(self) -> None:
        self.started = threading.Event()

    def streaming_started(self, position: Position | None) -> None:
        self.started.set()


def _incremental_snapshot(cfg: ConnectorConfig, db: Database, admin_db: Database) -> MemorySink:
    """Stream, send an execute-snapshot signal (as the administrator), wait for its completion."""
    sink = MemorySink()
    streaming = _Streaming()
    engine = Background(Engine(cfg, sink, MemoryOffsetStore(), progress=streaming)).start()
    try:
        wait_for(streaming.started.is_set, engine)
        admin_db.signals.insert_one({"type": "execute-snapshot", "data": {"data-collections": [f"{db.name}\\.items"]}})
        wait_for(lambda: "COMPLETED" in kinds(sink, "Incremental Snapshot"), engine)
    finally:
        engine.stop()
    return sink


@pytest.mark.parametrize("scope", ["database", "deployment"])
def test_least_privileges_suffice(auth_deployment: AuthDeployment, db: Database, scope: str) -> None:
    reads = {"role": "read", "db": db.name} if scope == "database" else {"role": "readAnyDatabase", "db": "admin"}
    roles = [reads, {"role": "read", "db": "local"}, _signal_writer(auth_deployment, db.name)]
    user, password = auth_deployment.create_user(roles)
    uri = without_user(auth_deployment.admin_uri)
    scope_props = {"capture.scope": "database", "capture.target": db.name} if scope == "database" else {}
    props = {**_credentials(user, password), **scope_props}
    snapshot = MemorySink()
    offsets = MemoryOffsetStore()
    run_engine(signal_config(uri, db.name, **props), snapshot, offsets)
    assert len(snapshot.data(f"{db.name}.items")) == 10
    db.items.delete_one({"_id": 0})
    run_engine(signal_config(uri, db.name, **props), snapshot, offsets)
    assert [r.op for r in snapshot.data(f"{db.name}.items") if r.value is not None][-1] == "d"
    incremental = _incremental_snapshot(engine_config(uri, db.name, **props), db, db)
    assert len([r for r in incremental.data(f"{db.name}.items") if r.op == "r"]) == 9


def test_deployment_scope_with_read_on_one_database_is_refused(auth_deployment: AuthDeployment, db: Database) -> None:
    user, password = auth_deployment.create_user([{"role": "read", "db": db.name}])
    cfg = make_config(without_user(auth_deployment.admin_uri), db.name, **_credentials(user, password))
    with pytest.raises(PrivilegeError) as refused:
        run_engine(cfg, MemorySink(), MemoryOffsetStore(), max_events=1)
    message = str(refused.value)
    assert f"MongoDB user {user!r} lacks a privilege" in message
    assert "not authorized on admin" in message and "allChangesForCluster" in message and "readAnyDatabase" in message


def test_streaming_without_change_stream_privilege_is_refused(auth_deployment: AuthDeployment, db: Database) -> None:
    role = auth_deployment.create_role([{"resource": {"db": db.name, "collection": ""}, "actions": ["find", "listCollections"]}])
    user, password = auth_deployment.create_user([{"role": role, "db": "admin"}])
    cfg = make_config(without_user(auth_deployment.admin_uri), db.name, **_credentials(user, password),
                      **{"capture.scope": "database", "capture.target": db.name, "snapshot.mode": "no_data"})  # fmt: skip
    with pytest.raises(PrivilegeError, match="not authorized on"):
        run_engine(cfg, MemorySink(), MemoryOffsetStore(), max_events=1)


def test_no_secret_anywhere(auth_deployment: AuthDeployment, db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    roles = [{"role": "read", "db": db.name}, {"role": "read", "db": "local"}, _signal_writer(auth_deployment, db.name)]
    user, password = auth_deployment.create_user(roles, password=SECRET)
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    # 1. The engine with mongodb.password, then with the password in the connection string.
    for cfg in (
        engine_config(without_user(auth_deployment.admin_uri), db.name, **_credentials(user, password), **_in(db),
                      **{"mongocdc.metrics.file": str(tmp_path / "metrics.json"), "snapshot.mode": "initial"}),
        engine_config(auth_deployment.uri_for(user, password), db.name, **_in(db), **{"snapshot.mode": "initial"}),
    ):  # fmt: skip
        seen.append(repr(cfg))
        seen.append(json.dumps(cfg.redacted_properties()))
        sink = _incremental_snapshot(cfg, db, db)
        seen += [f"{r.topic} {r.key!r} {r.value!r}" for r in sink.records]
        seen += [json.dumps(n) for n in notifications(sink)]
    # 2. What the orchestration API returns (the Dagster assets' metadata is built from it).
    cfg = make_config(auth_deployment.uri_for(user, password), db.name, **_in(db))
    snap = MemorySink()
    result = api.snapshot_collection(cfg, f"{db.name}.items", snap)
    db.items.insert_one({"_id": "after the snapshot"})
    now = api.current_cluster_time(cfg)
    end = Timestamp(now.time, now.inc + 1)
    window = api.stream_window(cfg, f"{db.name}.items", result.position.timestamp, end, MemorySink())
    seen += [repr(result), repr(window), repr(api.list_captured_collections(cfg)), repr(api.oplog_window(cfg))]
    seen += [repr(r) for r in api.plan_snapshot_ranges(cfg, f"{db.name}.items")]
    # 3. Errors: refused credentials and missing privileges.
    for bad in (make_config(auth_deployment.uri_for(user, password + "x"), db.name, **_in(db)),
                make_config(auth_deployment.uri_for(user, password), db.name, **{"capture.scope": "deployment"})):  # fmt: skip
        with pytest.raises((AuthenticationError, PrivilegeError)) as refused:
            run_engine(bad, MemorySink(), MemoryOffsetStore(), max_events=1)
        seen.append(f"{refused.value} {refused.value.__cause__!r}")
    # 4. The command line: its log at DEBUG, its records, offsets and metrics files.
    config_file = tmp_path / "connector.json"
    config_file.write_text(json.dumps({"name": "c", "config": {
        "mongodb.connection.string": without_user(auth_deployment.admin_uri), "topic.prefix": "srv",
        "mongodb.user": user, "mongodb.password": password, "collection.include.list": f"{db.name}\\..*",
        "capture.scope": "database", "capture.target": db.name}}))
    now = api.current_cluster_time(cfg)
    done = subprocess.run(
        [sys.executable, "-m", "mongocdc_core.cli", "run", "--config", str(config_file), "--sink", f"jsonl:{tmp_path / 'out'}",
         "--offsets", str(tmp_path / "cli-offsets.json"), "--metrics-file", str(tmp_path / "cli-metrics.json"),
         "--stop-at", f"{now.time}:{now.inc}", "--no-progress", "--log-level", "DEBUG"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen += [done.stdout, done.stderr]
    seen.append(read_all(tmp_path))
    seen.append(caplog.text)
    everything = "\n".join(seen)
    assert f"{db.name}.items" in everything and "srv." in everything  # the haystack is the real output
    for form in _secret_forms(SECRET):
        assert form not in everything, f"the password ({form!r}) leaked"


def test_the_dagster_component_discovers_with_the_password_secret_from_the_environment(
        auth_deployment: AuthDeployment, db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A code location whose connector config names the user but keeps the password in
    ``MONGOCDC_MONGODB_PASSWORD`` (as docs/dagster.md tells) discovers the collections when it loads, as its runs
    connect: the load used the config without the secret, failed to authenticate and fell back."""
    from mongocdc_dagster.component import MongoCdcComponent
    from mongocdc_dagster.discovery import DiscoveryState

    user, password = auth_deployment.create_user([{"role": "read", "db": db.name}, {"role": "read", "db": "local"}])
    config_file = tmp_path / "connector.json"
    config_file.write_text(json.dumps({"name": "c", "config": {
        "mongodb.connection.string": without_user(auth_deployment.admin_uri), "topic.prefix": "srv",
        "mongodb.user": user, "collection.include.list": f"{db.name}\\..*",
        "capture.scope": "database", "capture.target": db.name}}))
    monkeypatch.setenv("MONGOCDC_MONGODB_PASSWORD", password)
    component = MongoCdcComponent(connector_config=str(config_file), home=str(tmp_path / "home"))
    component.write_state_to_path(tmp_path / "state")
    assert DiscoveryState.from_json((tmp_path / "state").read_text()).namespaces == (f"{db.name}.items",)
