"""Root fixtures: a MongoDB replica set for every test that needs one.

By default the tests run against the emulated replica set (started once per session, in this
process). Set ``MONGOCDC_TEST_MONGODB_URI`` to run them against a real MongoDB 7.0 replica set
instead; tests marked ``fault`` need the emulator's fault injection and are then skipped.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from mongocdc_devstack.fixture import EmulatedReplicaSet

REAL_URI_ENV = "MONGOCDC_TEST_MONGODB_URI"
_RELIABILITY_ROWS: list[dict[str, object]] = []


#: Fixtures that put a test in a stage of its own (``make test-fast`` leaves these stages out).
STAGE_FIXTURES = {"kafka_broker": "kafka", "kafka_bootstrap": "kafka", "spark": "spark"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, marker in STAGE_FIXTURES.items():
            if fixture in fixtures:
                item.add_marker(marker)
        # Under pytest-xdist (--dist loadgroup) a file stays on one worker, so its module fixtures are built
        # once; every Spark test shares one worker, so the run starts one Spark JVM, not one per worker.
        group = "spark" if "spark" in item.keywords else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    if not os.environ.get(REAL_URI_ENV):
        return
    skip = pytest.mark.skip(reason=f"needs the emulator's fault injection ({REAL_URI_ENV} is set)")
    for item in items:
        if "fault" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _session_emulator() -> Iterator[EmulatedReplicaSet | None]:
    if os.environ.get(REAL_URI_ENV):
        yield None
        return
    with EmulatedReplicaSet(noop_interval=1.0) as emulated:
        yield emulated


@pytest.fixture(scope="session")
def mongo_uri(_session_emulator: EmulatedReplicaSet | None) -> str:
    """Connection string of the replica set under test (``...?replicaSet=rs0``)."""
    real = os.environ.get(REAL_URI_ENV)
    if real:
        return real
    assert _session_emulator is not None
    return _session_emulator.uri


@pytest.fixture(scope="session")
def emulator(_session_emulator: EmulatedReplicaSet | None) -> EmulatedReplicaSet:
    """The session's emulator handle (fault injection); tests using it are marked ``fault``."""
    if _session_emulator is None:
        pytest.skip(f"needs the emulator's fault injection ({REAL_URI_ENV} is set)")
    return _session_emulator


@pytest.fixture(scope="session")
def mongo_client(mongo_uri: str) -> Iterator[MongoClient]:
    client: MongoClient = MongoClient(mongo_uri, serverSelectionTimeoutMS=10_000, uuidRepresentation="standard")
    yield client
    client.close()


@pytest.fixture
def fresh_db(mongo_client: MongoClient) -> Iterator[Database]:
    """A uniquely named database, dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield mongo_client[name]
    mongo_client.drop_database(name)


# -- the reliability table -----------------------------------------------------------------------------------
# The trials of tests/reliability report their figures as user properties; under pytest-xdist those travel
# with the test reports to the controller, which prints them all as one table at the end of the run.


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == "reliability" and isinstance(value, str):
            _RELIABILITY_ROWS.append(json.loads(value))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _RELIABILITY_ROWS:
        return
    from tests.reliability.harness import Figures

    terminalreporter.section("reliability trials")
    for row in sorted(_RELIABILITY_ROWS, key=lambda r: str(r["trial"])):
        terminalreporter.write_line(Figures(**row).line())  # type: ignore[arg-type]
