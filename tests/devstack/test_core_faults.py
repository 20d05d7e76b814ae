"""Fault injection: replSetStepDown, the failCommand fail point and the emulator-only commands."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import AutoReconnect, NotPrimaryError, OperationFailure

from mongocdc_devstack.fixture import EmulatedReplicaSet

pytestmark = pytest.mark.fault


@pytest.fixture
def private_rs() -> Iterator[EmulatedReplicaSet]:
    """A dedicated emulator: step-downs must not disturb the session's shared one."""
    with EmulatedReplicaSet(noop_interval=0) as rs:
        yield rs


def _wait_for_primary(direct: MongoClient, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = direct.admin.command("hello")
        if reply["isWritablePrimary"]:
            return reply
        time.sleep(0.05)
    raise AssertionError("the emulator did not elect itself again")


def test_step_down_and_reelection(private_rs: EmulatedReplicaSet) -> None:
    client: MongoClient = MongoClient(private_rs.uri, serverSelectionTimeoutMS=20_000)
    direct: MongoClient = MongoClient(f"mongodb://127.0.0.1:{private_rs.port}/?directConnection=true")
    try:
        client.app.c.insert_one({"_id": 1})
        before = direct.admin.command("hello")
        with pytest.raises(OperationFailure) as unforced:
            client.admin.command("replSetStepDown", 60)
        assert unforced.value.code == 262
        client.admin.command("replSetStepDown", 1, secondaryCatchUpPeriodSecs=0, force=True)
        during = direct.admin.command("hello")
        assert during["isWritablePrimary"] is False and during["secondary"] is True and "primary" not in during
        with pytest.raises(NotPrimaryError) as refused:
            direct.app.c.insert_one({"_id": 2})
        assert isinstance(refused.value.details, dict) and refused.value.details.get("code") == 10107
        after = _wait_for_primary(direct)
        assert after["electionId"] > before["electionId"]
        assert after["topologyVersion"]["counter"] > before["topologyVersion"]["counter"]
        client.app.c.insert_one({"_id": 3})  # the replica-set client follows the new primary
        assert client.app.c.count_documents({}) == 2
        notes = client.local["oplog.rs"].count_documents({"op": "n", "o.msg": "new primary"})
        assert notes == 1
    finally:
        client.close()
        direct.close()


def test_step_down_aborts_open_transactions(private_rs: EmulatedReplicaSet) -> None:
    client: MongoClient = MongoClient(private_rs.uri, serverSelectionTimeoutMS=20_000)
    direct: MongoClient = MongoClient(f"mongodb://127.0.0.1:{private_rs.port}/?directConnection=true")
    try:
        client.app.create_collection("c")
        with client.start_session() as session:
            session.start_transaction()
            client.app.c.insert_one({"_id": 1}, session=session)
            client.admin.command("replSetStepDown", 1, secondaryCatchUpPeriodSecs=0, force=True)
            _wait_for_primary(direct)
            with pytest.raises(OperationFailure) as info:
                session.commit_transaction()
            assert info.value.code == 251
        assert client.app.c.count_documents({}) == 0
    finally:
        client.close()
        direct.close()


def test_fail_command_error_code_and_retry(emulator: EmulatedReplicaSet) -> None:
    client: MongoClient = MongoClient(emulator.uri)
    try:
        client.admin.command("configureFailPoint", "failCommand", mode={"times": 1},
                             data={"failCommands": ["insert"], "errorCode": 89})  # fmt: skip
        # NetworkTimeout on a retryable write carries RetryableWriteError: pymongo retries once
        client.faults.c.insert_one({"_id": 1})
        assert client.faults.c.count_documents({"_id": 1}) == 1
        client.admin.command("configureFailPoint", "failCommand", mode={"times": 1},
                             data={"failCommands": ["find"], "errorCode": 2, "errorLabels": []})  # fmt: skip
        with pytest.raises(OperationFailure) as info:
            client.faults.c.find_one({})
        assert info.value.code == 2 and "failCommand" in str(info.value)
        assert client.faults.c.find_one({}) == {"_id": 1}
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
        client.drop_database("faults")
        client.close()


def test_fail_command_close_and_block(emulator: EmulatedReplicaSet) -> None:
    client: MongoClient = MongoClient(emulator.uri, retryReads=False)
    try:
        client.faults.c.insert_one({"_id": 1})
        client.admin.command("configureFailPoint", "failCommand", mode={"times": 1},
                             data={"failCommands": ["find"], "closeConnection": True})  # fmt: skip
        with pytest.raises(AutoReconnect):
            client.faults.c.find_one({})
        client.admin.command("configureFailPoint", "failCommand", mode={"times": 1},
                             data={"failCommands": ["find"], "blockConnection": True, "blockTimeMS": 100})  # fmt: skip
        assert client.faults.c.find_one({}) == {"_id": 1}
        off = client.admin.command("configureFailPoint", "failCommand", mode="off")
        assert off["count"] == 1
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
        client.drop_database("faults")
        client.close()


def test_drop_connections_and_delay(emulator: EmulatedReplicaSet) -> None:
    victim: MongoClient = MongoClient(emulator.uri)
    admin: MongoClient = MongoClient(emulator.uri)
    try:
        victim.admin.command("ping")
        dropped = admin.admin.command("mongocdcDropConnections", 1)
        assert dropped["dropped"] >= 1
        try:
            victim.admin.command("ping")
        except AutoReconnect:
            pass  # its pooled connection may be used before its monitor saw the drop, as with mongod
        assert victim.admin.command("ping")["ok"] == 1.0  # pymongo reconnects
        admin.admin.command("mongocdcDelayReplies", 1, ms=30)
        assert victim.admin.command("ping")["ok"] == 1.0
    finally:
        admin.admin.command("mongocdcDelayReplies", 1, ms=0)
        victim.close()
        admin.close()


def test_truncate_oplog(private_rs: EmulatedReplicaSet) -> None:
    client: MongoClient = MongoClient(private_rs.uri)
    try:
        client.app.c.insert_many([{"_id": i} for i in range(5)])
        oplog = client.local["oplog.rs"]
        entries = list(oplog.find({"ns": "app.c"}))
        cut: Timestamp = entries[3]["ts"]
        reply = client.admin.command("mongocdcTruncateOplog", 1, before=cut)
        assert reply["dropped"] >= 3
        first = oplog.find_one()
        assert first is not None and first["ts"] == cut
        with pytest.raises(OperationFailure):
            client.admin.command("mongocdcTruncateOplog", 1, before="yesterday")
    finally:
        client.close()


def test_periodic_noop_entries() -> None:
    with EmulatedReplicaSet(noop_interval=0.1) as rs:
        client: MongoClient = MongoClient(rs.uri)
        try:
            deadline = time.monotonic() + 10
            while client.local["oplog.rs"].count_documents({"op": "n", "o.msg": "periodic noop"}) < 2:
                assert time.monotonic() < deadline, "no periodic no-op entries were written"
                time.sleep(0.05)
            entry = client.local["oplog.rs"].find_one({"op": "n"})
            assert entry is not None and entry["ns"] == ""
        finally:
            client.close()
