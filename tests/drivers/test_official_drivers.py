"""Official MongoDB drivers other than pymongo against the replica set under test.

The emulator must look like mongod to every driver, not only to pymongo: the Java sync driver and
the Node.js driver each run the same scenario (``java/.../DriverCheck.java``, ``node/check.mjs``):
connect with a ``replicaSet`` URI, write, read a collection change stream, resume it with
``resumeAfter`` and ``startAfter`` from an event token and from the post-batch resume token,
``startAfter`` an invalidate, see a committed transaction with ``fullDocument: updateLookup``, and
open a deployment-wide stream with ``startAtOperationTime`` (what a CDC connector does);
against the emulator they also resume by themselves after getMore failures (fail points).
Each prints one JSON line that is checked here. Both programs are built by ``make setup``
(``mvn package``, ``npm ci``); without them the tests skip, or fail in CI. With
``MONGOCDC_TEST_MONGODB_URI`` set they run against that real replica set instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from pymongo.database import Database

from mongocdc_devstack.fixture import EmulatedReplicaSet

DRIVERS_DIR = Path(__file__).resolve().parent
JAVA_JAR = DRIVERS_DIR / "java" / "target" / "driver-check.jar"
NODE_SCRIPT = DRIVERS_DIR / "node" / "check.mjs"
NODE_DRIVER = DRIVERS_DIR / "node" / "node_modules" / "mongodb" / "package.json"
# A safety net only: each program gives up on its own after 20 s without an expected event.
RUN_TIMEOUT_SECONDS = 180


def require(present: bool, what: str) -> None:
    """Skip when a driver program is not built, except in CI (env CI set), where that is a failure."""
    if present:
        return
    reason = f"{what}; `make setup` builds it"
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so a missing driver build is an error, not a skip)")
    pytest.skip(reason)


def java_command() -> list[str]:
    java = shutil.which("java")
    require(java is not None, "`java` (Java 17) is not on PATH")
    require(JAVA_JAR.is_file(), f"the Java driver check is not built: {JAVA_JAR} is missing")
    assert java is not None
    return [java, "-jar", str(JAVA_JAR)]


def node_command() -> list[str]:
    node = shutil.which("node")
    require(node is not None, "`node` (Node.js 20) is not on PATH")
    require(NODE_DRIVER.is_file(), f"the Node.js driver is not installed: {NODE_DRIVER} is missing")
    assert node is not None
    return [node, str(NODE_SCRIPT)]


def run_check(command: list[str], uri: str, database: str, *scenario: str) -> dict[str, Any]:
    """Runs one driver program and returns its JSON report; its stderr explains any failure."""
    completed = subprocess.run(
        [*command, uri, database, *scenario],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
        check=False,
    )
    if completed.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited {completed.returncode}\n--- stderr ---\n{completed.stderr[-6000:]}"
            f"\n--- stdout ---\n{completed.stdout[-2000:]}"
        )
    lines = completed.stdout.strip().splitlines()
    assert lines, f"no JSON report on stdout; stderr:\n{completed.stderr[-4000:]}"
    report = orjson.loads(lines[-1])
    assert isinstance(report, dict)
    return report


def ops(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(event["op"], event["id"]) for event in events]


def assert_tokens_increase(events: list[dict[str, Any]]) -> None:
    """mongod's ``_data`` tokens are order-preserving hex, so a stream's tokens strictly increase."""
    tokens = [event["token"] for event in events]
    assert all(isinstance(token, str) and token for token in tokens), tokens
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens


def check_report(report: dict[str, Any], database: str) -> None:
    """The same expectations for every driver: what mongod 7.0 gives for the scenario."""
    assert isinstance(report["server"]["setName"], str) and report["server"]["setName"]
    assert report["server"]["isWritablePrimary"] is True
    assert report["writes"] == {"inserted": [1, 2], "matched": [1, 1], "modified": [1, 1], "deleted": 1}
    assert report["documents"] == [{"_id": 2, "v": 3}]

    events = report["events"]
    assert ops(events) == [("insert", 1), ("insert", 2), ("update", 1), ("replace", 2), ("delete", 1)]
    assert [event["doc"] for event in events] == [
        {"_id": 1, "v": 1},
        {"_id": 2, "v": 1},
        None,
        {"_id": 2, "v": 3},
        None,
    ]
    assert (events[2]["updated"], events[2]["removed"]) == ({"v": 2}, [])
    assert [(event["txn"], event["lsid"]) for event in events] == [(None, False)] * 5  # no transaction
    assert_tokens_increase(events)

    # Resuming after the update's token continues with exactly the events after it: the two
    # already seen (same tokens as the first time) and the two written while no stream was open.
    resumed = report["resumeAfter"]
    assert ops(resumed) == [("replace", 2), ("delete", 1), ("insert", 3), ("update", 3)]
    assert resumed[:2] == events[3:]
    assert resumed[2]["doc"] == {"_id": 3, "v": 1, "tmp": True}
    assert (resumed[3]["updated"], resumed[3]["removed"]) == ({"v": 4}, ["tmp"])
    assert_tokens_increase(events + resumed[2:])
    assert report["startAfter"] == resumed

    # The first stream's resume token after its last batch (a post-batch resume token) resumes
    # with only what was written after it.
    assert report["resumeLatest"] == resumed[2:]

    # Dropping the collection ends a collection stream with drop + invalidate; startAfter the
    # invalidate token follows the re-created collection.
    invalidate = report["invalidate"]
    assert ops(invalidate) == [("drop", None), ("invalidate", None)]
    assert_tokens_increase(resumed + invalidate)
    after = report["afterInvalidate"]
    assert ops(after) == [("insert", 10)]
    assert after[0]["doc"] == {"_id": 10, "v": 1}
    assert_tokens_increase(invalidate + after)

    # A committed multi-document transaction: one event per operation, both carrying the
    # transaction's lsid and txnNumber; fullDocument updateLookup fills in the updated document.
    txn = report["transaction"]
    assert ops(txn) == [("insert", 20), ("update", 10)]
    assert [event["doc"] for event in txn] == [{"_id": 20, "v": 1}, {"_id": 10, "v": 2}]
    assert all(event["lsid"] is True for event in txn)
    assert isinstance(txn[0]["txn"], int) and txn[0]["txn"] == txn[1]["txn"]
    assert_tokens_increase(after + txn)

    # A deployment-wide stream from a write's operationTime starts with that write.
    deployment = report["deployment"]
    assert ops(deployment) == [("insert", 30), ("delete", 30)]
    assert_tokens_increase(txn + deployment)

    namespace = f"{database}.driver_check"
    for phase in (
        "events",
        "resumeAfter",
        "startAfter",
        "resumeLatest",
        "afterInvalidate",
        "transaction",
        "deployment",
    ):
        assert {event["ns"] for event in report[phase]} == {namespace}, phase
    assert [event["ns"] for event in invalidate] == [namespace, None]  # invalidate names no namespace


# Each driver's command builder and the version prefix its report must name.
DRIVERS: dict[str, tuple[Callable[[], list[str]], str]] = {
    "java-sync": (java_command, "java-sync 5."),
    "node": (node_command, "node 6."),
}


@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_driver_writes_and_resumes_change_streams(driver: str, mongo_uri: str, fresh_db: Database) -> None:
    command, version = DRIVERS[driver]
    report = run_check(command(), mongo_uri, fresh_db.name)
    assert report["driver"].startswith(version)
    check_report(report, fresh_db.name)


@pytest.mark.fault
@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_driver_resumes_by_itself_after_getmore_failures(
    driver: str, emulator: EmulatedReplicaSet, fresh_db: Database
) -> None:
    """A closed connection and a ResumableChangeStreamError on getMore: no event lost or repeated."""
    command, version = DRIVERS[driver]
    report = run_check(command(), emulator.uri, fresh_db.name, "auto-resume")
    assert report["driver"].startswith(version)
    assert report["faultsTriggered"] == [1, 1]  # each fail point hit the stream's getMore once
    events = report["events"]
    assert ops(events) == [("insert", 1), ("insert", 2), ("insert", 3), ("insert", 4)]
    assert [event["doc"] for event in events] == [{"_id": 1}, {"_id": 2}, {"_id": 3}, {"_id": 4}]
    assert_tokens_increase(events)


@pytest.mark.parametrize(("ci", "outcome"), [(None, pytest.skip.Exception), ("true", pytest.fail.Exception)])
def test_missing_build_skips_locally_and_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str | None, outcome: type[BaseException]
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="make setup"):
        require(False, "the Java driver check is not built")
    require(True, "present, so nothing happens")
