"""The connector over TLS: ``mongodb.ssl.enabled`` and ``mongodb.ssl.invalid.hostname.allowed``.

Against the emulator serving a certificate the tests generate, or a real TLS deployment
(``MONGOCDC_TEST_MONGODB_TLS_URI`` and ``MONGOCDC_TEST_MONGODB_TLS_CA_FILE``); the host-name
cases need a certificate for another name and use the emulator only.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from mongocdc_core.offsets import FileOffsetStore
from mongocdc_core.source.errors import ConnectError, TlsError
from mongocdc_devstack.tls import Pki
from tests.engine.engine_support import MemorySink, make_config, replay, run_engine, source_state
from tests.security.conftest import TlsDeployment

FAST_FAIL = {"mongodb.server.selection.timeout.ms": 1500, "connect.max.attempts": 1, "errors.max.retries": 0}


@pytest.fixture
def tls_db(tls_deployment: TlsDeployment) -> Iterator[Database]:
    client: MongoClient = MongoClient(tls_deployment.tls_uri(), serverSelectionTimeoutMS=10_000)
    db = client[f"tls_{uuid.uuid4().hex[:8]}"]
    yield db
    client.drop_database(db.name)
    client.close()


def _capture(uri: str, db: Database, tmp_path: Path, **props: Any) -> MemorySink:
    cfg = make_config(uri, db.name, **props)
    sink = MemorySink()
    run_engine(cfg, sink, FileOffsetStore(tmp_path / "offsets.json"))
    return sink


def test_ssl_enabled_captures_over_tls(tls_deployment: TlsDeployment, tls_db: Database, tmp_path: Path) -> None:
    tls_db.c.insert_many([{"_id": i, "v": i} for i in range(5)])
    # The CA of a private PKI comes with the connection string; mongodb.ssl.enabled turns TLS on.
    uri = f"{tls_deployment.uri}{'&' if '?' in tls_deployment.uri else '/?'}tlsCAFile={tls_deployment.ca_file}"
    sink = _capture(uri, tls_db, tmp_path, **{"mongodb.ssl.enabled": "true"})
    assert len(sink.data(f"{tls_db.name}.c")) == 5
    tls_db.c.update_one({"_id": 1}, {"$set": {"v": 10}})
    tls_db.c.delete_one({"_id": 2})
    more = _capture(uri, tls_db, tmp_path, **{"mongodb.ssl.enabled": "true"})  # resumes from the stored offset
    assert [r.op for r in more.data(f"{tls_db.name}.c") if r.value is not None] == ["u", "d"]
    assert replay(sink.records + more.records, f"{tls_db.name}.c") == source_state(tls_db.c)


def test_untrusted_ca_is_refused_at_once_with_the_fix(tls_deployment: TlsDeployment, tls_db: Database,
                                                      other_ca: Pki, tmp_path: Path) -> None:  # fmt: skip
    uri = f"{tls_deployment.uri}{'&' if '?' in tls_deployment.uri else '/?'}tlsCAFile={other_ca.ca_file}"
    cfg = make_config(uri, tls_db.name, **{"mongodb.ssl.enabled": "true", "connect.max.attempts": 16,
                                            "mongodb.server.selection.timeout.ms": 1500})  # fmt: skip
    started = time.monotonic()
    with pytest.raises(TlsError, match="TLS certificate of MongoDB was refused") as refused:
        run_engine(cfg, MemorySink(), FileOffsetStore(tmp_path / "offsets.json"), stop_at=None, max_events=1)
    assert "tlsCAFile" in str(refused.value)
    # One server selection, no backoff: 16 attempts would take minutes (the bound is generous, not a timing claim).
    assert time.monotonic() - started < 60


def test_plaintext_client_cannot_reach_a_tls_server(tls_deployment: TlsDeployment, tls_db: Database, tmp_path: Path) -> None:
    cfg = make_config(tls_deployment.uri, tls_db.name, **FAST_FAIL)
    with pytest.raises(ConnectError, match="unreachable"):
        run_engine(cfg, MemorySink(), FileOffsetStore(tmp_path / "offsets.json"), max_events=1)


def test_hostname_mismatch_is_refused_unless_allowed(mismatched_tls: TlsDeployment, tmp_path: Path) -> None:
    admin: MongoClient = MongoClient(mismatched_tls.tls_uri(tlsAllowInvalidHostnames="true"), serverSelectionTimeoutMS=10_000)
    db = admin[f"tls_{uuid.uuid4().hex[:8]}"]
    db.c.insert_many([{"_id": i} for i in range(3)])
    uri = f"{mismatched_tls.uri}&tlsCAFile={mismatched_tls.ca_file}"
    cfg = make_config(uri, db.name, **{"mongodb.ssl.enabled": "true", **FAST_FAIL})
    with pytest.raises(TlsError, match="mongodb.ssl.invalid.hostname.allowed=true") as refused:
        run_engine(cfg, MemorySink(), FileOffsetStore(tmp_path / "refused.json"), max_events=1)
    assert "127.0.0.1" in str(refused.value)  # OpenSSL names the address the certificate does not cover
    sink = _capture(uri, db, tmp_path, **{"mongodb.ssl.enabled": "true", "mongodb.ssl.invalid.hostname.allowed": "true"})
    assert len(sink.data(f"{db.name}.c")) == 3
    admin.drop_database(db.name)
    admin.close()


def test_invalid_hostname_allowed_does_not_trust_an_unknown_ca(mismatched_tls: TlsDeployment, other_ca: Pki, tmp_path: Path) -> None:
    uri = f"{mismatched_tls.uri}&tlsCAFile={other_ca.ca_file}"
    cfg = make_config(uri, "t", **{"mongodb.ssl.enabled": "true", "mongodb.ssl.invalid.hostname.allowed": "true", **FAST_FAIL})
    with pytest.raises(TlsError, match="refused"):
        run_engine(cfg, MemorySink(), FileOffsetStore(tmp_path / "offsets.json"), max_events=1)


def test_ssl_enabled_against_a_plaintext_server_fails(mongo_uri: str, tmp_path: Path) -> None:
    cfg = make_config(mongo_uri, "t", **{"mongodb.ssl.enabled": "true", **FAST_FAIL})
    with pytest.raises(ConnectError, match="unreachable"):
        run_engine(cfg, MemorySink(), FileOffsetStore(tmp_path / "offsets.json"), max_events=1)
