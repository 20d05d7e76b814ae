"""Deployments with access control and with TLS, emulated or real.

Access control: ``MONGOCDC_TEST_MONGODB_AUTH_URI`` names a real replica set started with ``--auth``
and carries the credentials of a user who may create users and roles (``root``); the tests create
their own least-privileged users there and drop them afterwards. Without it, an emulator started
with ``--auth`` and a users file holding such an administrator stands in.

TLS: ``MONGOCDC_TEST_MONGODB_TLS_URI`` names a real replica set served over TLS (without ``tls``
options) and ``MONGOCDC_TEST_MONGODB_TLS_CA_FILE`` the CA that signed its certificate. Without them
an emulator serving a certificate the tests generate stands in. Tests that need a certificate for
another host name use the emulator only.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pytest
from pymongo import MongoClient

from mongocdc_devstack.fixture import EmulatedReplicaSet
from mongocdc_devstack.tls import Pki, make_pki

AUTH_URI_ENV = "MONGOCDC_TEST_MONGODB_AUTH_URI"
TLS_URI_ENV = "MONGOCDC_TEST_MONGODB_TLS_URI"
TLS_CA_ENV = "MONGOCDC_TEST_MONGODB_TLS_CA_FILE"
ADMIN_USER, ADMIN_PASSWORD = "clusterAdmin", "admin-Pa55w0rd"


def with_user(uri: str, user: str, password: str, auth_source: str = "admin") -> str:
    """``uri`` with credentials (percent-encoded) in place of any it had."""
    scheme, rest = uri.split("://", 1)
    authority, sep, tail = rest.partition("/")
    host = authority.rsplit("@", 1)[-1]
    query = tail.partition("?")[2] if sep else ""
    options = [o for o in query.split("&") if o and not o.lower().startswith("authsource=")]
    options.append(f"authSource={auth_source}")
    return f"{scheme}://{quote_plus(user)}:{quote_plus(password)}@{host}/?{'&'.join(options)}"


def without_user(uri: str) -> str:
    """``uri`` without credentials or authSource."""
    scheme, rest = uri.split("://", 1)
    authority, sep, tail = rest.partition("/")
    host = authority.rsplit("@", 1)[-1]
    query = tail.partition("?")[2] if sep else ""
    options = [o for o in query.split("&") if o and not o.lower().startswith("authsource=")]
    return f"{scheme}://{host}/?{'&'.join(options)}"


@dataclass
class AuthDeployment:
    """A deployment with access control, and an administrator's client to set up users."""

    admin_uri: str
    admin: MongoClient
    emulated: bool

    def create_user(self, roles: list[dict[str, str] | str], db: str = "admin", password: str | None = None,
                    mechanisms: list[str] | None = None) -> tuple[str, str]:  # fmt: skip
        """A fresh user (dropped at session end) with ``roles``; returns (name, password)."""
        name = f"u_{uuid.uuid4().hex[:10]}"
        password = password or f"pw-{uuid.uuid4().hex[:12]}-§ü!"
        extra: dict[str, Any] = {"mechanisms": mechanisms} if mechanisms else {}
        self.admin[db].command("createUser", name, pwd=password, roles=roles, **extra)
        self._users.append((db, name))
        return name, password

    def create_role(self, privileges: list[dict[str, object]], roles: list[dict[str, str]] | None = None) -> str:
        name = f"r_{uuid.uuid4().hex[:10]}"
        self.admin.admin.command("createRole", name, privileges=privileges, roles=roles or [])
        self._roles.append(name)
        return name

    def uri_for(self, user: str, password: str, auth_source: str = "admin") -> str:
        return with_user(self.admin_uri, user, password, auth_source)

    def __post_init__(self) -> None:
        self._users: list[tuple[str, str]] = []
        self._roles: list[str] = []

    def cleanup(self) -> None:
        for db, name in self._users:
            self.admin[db].command("dropUser", name)
        for name in self._roles:
            self.admin.admin.command("dropRole", name)


@pytest.fixture(scope="session")
def auth_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthDeployment]:
    real = os.environ.get(AUTH_URI_ENV)
    if real:
        client: MongoClient = MongoClient(real, serverSelectionTimeoutMS=10_000)
        deployment = AuthDeployment(real, client, emulated=False)
        yield deployment
        deployment.cleanup()
        client.close()
        return
    users = tmp_path_factory.mktemp("auth") / "users.json"
    users.write_text(json.dumps({"users": [{"user": ADMIN_USER, "pwd": ADMIN_PASSWORD, "db": "admin", "roles": ["root"]}]}))
    with EmulatedReplicaSet(noop_interval=1.0, auth=True, users_file=str(users)) as emulated:
        uri = with_user(emulated.uri, ADMIN_USER, ADMIN_PASSWORD)
        client = MongoClient(uri, serverSelectionTimeoutMS=10_000)
        deployment = AuthDeployment(uri, client, emulated=True)
        yield deployment
        deployment.cleanup()
        client.close()


@dataclass(frozen=True)
class TlsDeployment:
    """A replica set served over TLS: its URI (no tls options) and the CA that signed its certificate."""

    uri: str
    ca_file: str
    emulated: bool

    def tls_uri(self, ca_file: str | None = None, **options: str) -> str:
        extra = "".join(f"&{k}={v}" for k, v in options.items())
        return f"{self.uri}{'&' if '?' in self.uri else '/?'}tls=true&tlsCAFile={ca_file or self.ca_file}{extra}"


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA and a certificate for localhost/127.0.0.1."""
    return make_pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="session")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A second, unrelated CA: certificates of the first are not trusted through it."""
    return make_pki(str(tmp_path_factory.mktemp("other-pki")))


@pytest.fixture(scope="session")
def tls_deployment(pki: Pki) -> Iterator[TlsDeployment]:
    real, ca = os.environ.get(TLS_URI_ENV), os.environ.get(TLS_CA_ENV)
    if real:
        if not ca:
            pytest.fail(f"{TLS_URI_ENV} is set but {TLS_CA_ENV} (the CA of its certificate) is not")
        yield TlsDeployment(real, ca, emulated=False)
        return
    with EmulatedReplicaSet(noop_interval=1.0, tls_certificate_key_file=pki.server_file) as emulated:
        yield TlsDeployment(emulated.uri, pki.ca_file, emulated=True)


@pytest.fixture(scope="session")
def mismatched_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsDeployment]:
    """An emulator whose certificate names another host (``mongo.example.test``), not 127.0.0.1."""
    if os.environ.get(TLS_URI_ENV) or os.environ.get("MONGOCDC_TEST_MONGODB_URI"):
        pytest.skip("needs the emulator: a certificate issued for another host name")
    other = make_pki(str(tmp_path_factory.mktemp("mismatch")), hosts=["mongo.example.test"], ips=[])
    with EmulatedReplicaSet(noop_interval=1.0, tls_certificate_key_file=other.server_file) as emulated:
        yield TlsDeployment(emulated.uri, other.ca_file, emulated=True)


def read_all(directory: Path) -> str:
    """Every file under ``directory`` as text (for searching secrets in what the connector wrote)."""
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in sorted(directory.rglob("*")) if p.is_file())
