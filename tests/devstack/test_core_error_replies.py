"""Error replies as drivers inspect them: ``topologyVersion`` on NotPrimary errors, change stream labels.

Drivers ignore a NotPrimary error whose ``topologyVersion`` is not newer than the one they know
(so a fail point does not make them mark the server Unknown), and they resume a change stream
after a getMore error only when mongod labelled it ``ResumableChangeStreamError``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import NotPrimaryError, OperationFailure

from mongocdc_devstack.fixture import EmulatedReplicaSet

pytestmark = pytest.mark.fault

NOT_PRIMARY_CODES = (10107, 13435, 13436, 11602, 189)
OTHER_CODES = (91, 11600, 2, 6, 262)
APP = "error-replies-test"


@pytest.fixture
def direct(emulator: EmulatedReplicaSet) -> Iterator[MongoClient[Any]]:
    """A direct connection with its own appName, so fail points only hit this test's commands."""
    client: MongoClient[Any] = MongoClient(
        f"mongodb://127.0.0.1:{emulator.port}/?directConnection=true",
        appName=APP, retryReads=False, retryWrites=False, heartbeatFrequencyMS=500,
    )
    try:
        yield client
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
        client.drop_database("error_replies")
        client.close()


def _fail_once(client: MongoClient[Any], command: str, code: int, labels: list[str] | None = None) -> None:
    data: dict[str, Any] = {"failCommands": [command], "errorCode": code, "appName": APP}
    if labels is not None:
        data["errorLabels"] = labels
    client.admin.command("configureFailPoint", "failCommand", mode={"times": 1}, data=data)


def _reply_of(run: Any) -> dict[str, Any]:
    """The server's error reply of a command pymongo raised on (NotPrimary codes raise NotPrimaryError)."""
    with pytest.raises((OperationFailure, NotPrimaryError)) as info:
        run()
    error = info.value
    details = error.details if isinstance(error, (OperationFailure, NotPrimaryError)) else None
    assert isinstance(details, dict)
    return details


@pytest.mark.parametrize("code", NOT_PRIMARY_CODES)
def test_fail_point_not_primary_errors_carry_the_current_topology_version(direct: MongoClient[Any], code: int) -> None:
    known = direct.admin.command("hello")["topologyVersion"]
    _fail_once(direct, "find", code)
    reply = _reply_of(lambda: direct.error_replies.c.find_one({}))
    assert reply["code"] == code
    assert reply["topologyVersion"] == known


@pytest.mark.parametrize("code", OTHER_CODES)
def test_other_errors_carry_no_topology_version(direct: MongoClient[Any], code: int) -> None:
    _fail_once(direct, "find", code)
    reply = _reply_of(lambda: direct.error_replies.c.find_one({}))
    assert reply["code"] == code
    assert "topologyVersion" not in reply


def test_step_down_errors_carry_the_incremented_topology_version() -> None:
    with EmulatedReplicaSet(noop_interval=0) as rs:
        client: MongoClient[Any] = MongoClient(f"mongodb://127.0.0.1:{rs.port}/?directConnection=true", retryWrites=False)
        try:
            before = client.admin.command("hello")["topologyVersion"]
            client.admin.command("replSetStepDown", 30, secondaryCatchUpPeriodSecs=0, force=True)
            during = client.admin.command("hello")["topologyVersion"]
            assert during["processId"] == before["processId"] and during["counter"] > before["counter"]
            write = _reply_of(lambda: client.app.c.insert_one({"_id": 1}))
            assert write["code"] == 10107 and write["topologyVersion"] == during
        finally:
            client.close()


def _open_change_stream(client: MongoClient[Any]) -> int:
    """A collection change stream opened with a raw aggregate (no driver-side resume)."""
    client.error_replies.create_collection("c")
    reply = client.error_replies.command("aggregate", "c", pipeline=[{"$changeStream": {}}], cursor={})
    return int(reply["cursor"]["id"])


def _get_more(client: MongoClient[Any], cursor_id: int, max_time_ms: int = 50) -> dict[str, Any]:
    return client.error_replies.command("getMore", cursor_id, collection="c", maxTimeMS=max_time_ms)


@pytest.mark.parametrize("code", [6, 11602, 10107])
def test_fail_point_on_change_stream_get_more_adds_no_label(direct: MongoClient[Any], code: int) -> None:
    cursor_id = _open_change_stream(direct)
    _fail_once(direct, "getMore", code)
    reply = _reply_of(lambda: _get_more(direct, cursor_id))
    assert reply["code"] == code
    assert "ResumableChangeStreamError" not in reply.get("errorLabels", [])
    _get_more(direct, cursor_id)  # the cursor is still usable


def test_fail_point_labels_are_used_as_given(direct: MongoClient[Any]) -> None:
    cursor_id = _open_change_stream(direct)
    _fail_once(direct, "getMore", 6, ["ResumableChangeStreamError"])
    reply = _reply_of(lambda: _get_more(direct, cursor_id))
    assert reply["errorLabels"] == ["ResumableChangeStreamError"]


def test_interrupted_change_stream_get_more_is_resumable() -> None:
    """A getMore waiting when the node steps down fails with 11602, labelled by the server itself."""
    with EmulatedReplicaSet(noop_interval=0) as rs:
        client: MongoClient[Any] = MongoClient(f"mongodb://127.0.0.1:{rs.port}/?directConnection=true")
        try:
            cursor_id = _open_change_stream(client)
            known = client.admin.command("hello")["topologyVersion"]
            stepper = threading.Timer(
                0.3, lambda: client.admin.command("replSetStepDown", 30, secondaryCatchUpPeriodSecs=0, force=True)
            )
            stepper.start()
            try:
                reply = _reply_of(lambda: _get_more(client, cursor_id, max_time_ms=20_000))
            finally:
                stepper.join()
            assert reply["code"] == 11602
            assert "ResumableChangeStreamError" in reply["errorLabels"]
            assert reply["topologyVersion"]["counter"] > known["counter"]
        finally:
            client.close()


@pytest.mark.parametrize("code", [*NOT_PRIMARY_CODES, 91, 64])
def test_write_concern_error_from_the_fail_point(direct: MongoClient[Any], code: int) -> None:
    """The write happens; the reply carries the writeConcernError (and topologyVersion for NotPrimary codes)."""
    direct.admin.command(
        "configureFailPoint", "failCommand", mode={"times": 1},
        data={"failCommands": ["insert"], "appName": APP, "writeConcernError": {"code": code, "errmsg": "injected"}},
    )  # fmt: skip
    reply = direct.error_replies.command("insert", "c", documents=[{"_id": code}])
    assert reply["ok"] == 1.0 and reply["n"] == 1
    assert reply["writeConcernError"] == {"code": code, "errmsg": "injected"}
    assert ("topologyVersion" in reply) is (code in NOT_PRIMARY_CODES)
    assert direct.error_replies.c.count_documents({"_id": code}) == 1


def test_retryable_write_concern_error_is_retried(emulator: EmulatedReplicaSet) -> None:
    """A retryable code in writeConcernError labels a retryable write RetryableWriteError; pymongo retries."""
    client: MongoClient[Any] = MongoClient(emulator.uri, appName=APP)
    try:
        client.admin.command(
            "configureFailPoint", "failCommand", mode={"times": 1},
            data={"failCommands": ["insert"], "appName": APP, "writeConcernError": {"code": 89, "errmsg": "timed out"}},
        )  # fmt: skip
        client.error_replies.c.insert_one({"_id": 1})  # the retry answers from the first execution
        assert client.error_replies.c.count_documents({}) == 1
        off = client.admin.command("configureFailPoint", "failCommand", mode="off")
        assert off["count"] == 1
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
        client.drop_database("error_replies")
        client.close()
