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
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings
from pymongo import MongoClient
from pymongo.database import Database

from mongocdc_devstack.fixture import EmulatedReplicaSet

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler import Scheduling

REAL_URI_ENV = "MONGOCDC_TEST_MONGODB_URI"

# The property tests judge what they generate, never how fast: on a loaded CI machine (three workers, Spark
# JVMs and brokers on two cores) a stalled first draw failed Hypothesis's input-speed health check
# (test_signals, 1 input in 1.5 s), and a stalled example its deadline.
settings.register_profile("mongocdc", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("mongocdc")
_RELIABILITY_ROWS: list[dict[str, object]] = []

# The suite's Spark sessions leave the user's ahead-of-time cache alone (a JAVA_HOME of Java 25 would record
# into ~/.cache): tests/tables/test_aot.py gives its sessions a directory of their own.
os.environ.setdefault("MONGOCDC_SPARK_AOT_CACHE", "off")


#: Fixtures that put a test in a stage of its own (``make test-fast`` leaves these stages out).
STAGE_FIXTURES = {"kafka_broker": "kafka", "kafka_bootstrap": "kafka", "spark": "spark"}

#: Rough seconds one test of a long stage takes in CI (3 workers on 2 cores); a test of no stage counts 1.
#: Only the order in which groups are handed to the workers follows from these: the longest first, so that
#: short files fill in at the end and no worker waits alone for a long group.
STAGE_SECONDS = {"soak": 600, "conformance": 600, "daemon": 120, "packaging": 120, "slow": 60, "bench": 40,
                 "compat": 40, "reliability": 30, "spark": 20, "kafka": 15}
#: The same for a fixture that makes a test long without a stage: a Dagster instance (tests/dagster) runs jobs
#: in the test's process, the table assets' jobs with Spark.
FIXTURE_SECONDS = {"instance": 20}
#: Files of tests/tables that run apart from the others' Spark JVM, in groups of their own, with their rough
#: seconds in CI: as one group, tests/tables kept one worker busy about 7 minutes after the other two had
#: finished, the run's one long tail. Each of these starts a Spark JVM (and a Kafka broker) of its own, about a
#: minute of work, to take some 14 minutes off that tail.
TABLES_APART = {"tests/tables/test_cluster.py": 500, "tests/tables/test_command.py": 360}


def xdist_group(nodeid: str) -> str:
    """The group a test runs in under pytest-xdist (``make test``): one worker runs a group's tests in order, so a
    file's module fixtures are built once and its later tests see what its earlier ones did; every test of
    tests/tables, where the ``spark`` fixture lives, is one group, so the run starts one Spark JVM for them (but
    for the long files of :data:`TABLES_APART`, a group each)."""
    path = nodeid.split("::", 1)[0]
    return "tests/tables" if path.startswith("tests/tables/") and path not in TABLES_APART else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    """``--dist loadgroup`` by :func:`xdist_group`. pytest-xdist 3.8 groups by the ``xdist_group`` mark through
    the node id, which pytest 9.2 no longer lets a plugin change (pytest-xdist issue 1386): every test was its
    own group, so a file's module fixtures (the Dagster stack, the packaging builds) were built on both
    workers, and both started Spark."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return GroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, marker in STAGE_FIXTURES.items():
            if fixture in fixtures:
                item.add_marker(marker)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its order is the order groups are handed out
        _longest_groups_first(items)
    if not os.environ.get(REAL_URI_ENV):
        return
    skip = pytest.mark.skip(reason=f"needs the emulator's fault injection ({REAL_URI_ENV} is set)")
    for item in items:
        if "fault" in item.keywords:
            item.add_marker(skip)


def _longest_groups_first(items: list[pytest.Item]) -> None:
    """Order the items by their group's estimated length, longest first; a stable sort, so a group keeps its
    order. ``make test`` passes ``--no-loadscope-reorder`` so that xdist keeps this order (its own, by number
    of tests, would hand out the one-test pymongo suite last)."""

    def seconds(item: pytest.Item) -> int:
        fixtures = getattr(item, "fixturenames", ())
        return max([1, *(s for stage, s in STAGE_SECONDS.items() if item.get_closest_marker(stage)),
                    *(s for fixture, s in FIXTURE_SECONDS.items() if fixture in fixtures)])

    length: dict[str, int] = dict(TABLES_APART)
    for item in items:
        group = xdist_group(item.nodeid)
        if group not in TABLES_APART:
            length[group] = length.get(group, 0) + seconds(item)
    items.sort(key=lambda item: -length[xdist_group(item.nodeid)])


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
