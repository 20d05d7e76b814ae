"""The snapshot's range reader: raw batches from its own find/getMore, or from pymongo's cursor, alike."""

from __future__ import annotations

import datetime
import logging
import uuid
from collections import Counter
from typing import Any

import orjson
import pytest
from bson import Decimal128, Int64, ObjectId
from pymongo import MongoClient, ReadPreference
from pymongo.database import Database
from pymongo.monitoring import CommandFailedEvent, CommandListener, CommandStartedEvent, CommandSucceededEvent

from mongocdc_core.offsets import MemoryOffsetStore
from mongocdc_core.source import snapshot
from mongocdc_core.source.snapshot import raw_batches
from tests.engine.engine_support import MemorySink, make_config, run_engine

DOCS: list[dict[str, Any]] = [
    *({"_id": i, "n": f"doc-{i}", "when": datetime.datetime(2020, 1, 1)} for i in range(1_200)),
    *({"_id": f"s-{i:04d}", "d": Decimal128("1.5"), "tags": ["a", {"b": i}]} for i in range(500)),
    *({"_id": ObjectId(f"{i:024x}"), "big": Int64(2**40)} for i in range(1, 300)),
]


class Commands(CommandListener):
    """The names of the commands a client sent."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: CommandStartedEvent) -> None:
        if event.command_name not in ("ping", "endSessions"):  # a new client's wait for the primary; its close
            self.names.append(event.command_name)

    def succeeded(self, event: CommandSucceededEvent) -> None:
        """Only what was sent matters here."""

    def failed(self, event: CommandFailedEvent) -> None:
        """Only what was sent matters here."""


def test_both_readers_give_the_documents_of_a_find_in_id_order(fresh_db: Database[Any]) -> None:
    fresh_db.big.insert_many(DOCS)
    query = {"_id": {"$gte": 100}}
    expected = list(fresh_db.big.find(query).sort("_id", 1))
    own = list(raw_batches(fresh_db.big, query, 250))
    # Any read preference but primary leaves the cursor to pymongo (it keeps it on its server).
    pymongos = list(raw_batches(fresh_db.big.with_options(read_preference=ReadPreference.PRIMARY_PREFERRED), query, 250))
    assert [doc for batch in own for doc in batch] == expected
    assert [doc for batch in pymongos for doc in batch] == expected
    assert [len(batch) for batch in own] == [len(batch) for batch in pymongos]
    assert max(len(batch) for batch in own) == 250 and len(own) == -(-len(expected) // 250)
    assert list(raw_batches(fresh_db.big, {"_id": "none such"}, 250)) == []


def test_range_bounds_in_the_clients_uuid_representation(fresh_db: Database[Any]) -> None:
    """The find is encoded with the collection's codec options: UUID bounds (from a range plan) go through."""
    ids = [uuid.UUID(int=i) for i in range(1, 9)]
    fresh_db.big.insert_many([{"_id": i} for i in ids])
    batches = list(raw_batches(fresh_db.big, {"_id": {"$gte": ids[2], "$lt": ids[6]}}, 3))
    assert [doc["_id"] for batch in batches for doc in batch] == ids[2:6]


def test_without_the_compiled_module_the_own_cursor_gives_the_same_batches(
    fresh_db: Database[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh_db.big.insert_many(DOCS)
    compiled = [list(batch) for batch in raw_batches(fresh_db.big, {}, 400)]
    monkeypatch.setattr(snapshot, "native", None)
    assert [list(batch) for batch in raw_batches(fresh_db.big, {}, 400)] == compiled
    assert [doc for batch in compiled for doc in batch] == list(fresh_db.big.find().sort("_id", 1))


def test_a_range_reader_stopped_early_kills_its_cursor(mongo_uri: str, fresh_db: Database[Any]) -> None:
    fresh_db.big.insert_many(DOCS)
    commands = Commands()
    with MongoClient(mongo_uri, event_listeners=[commands]) as client:
        batches = raw_batches(client[fresh_db.name].big, {}, 100)
        assert len(next(batches)) == 100 and len(next(batches)) == 100
        batches.close()
        assert commands.names == ["find", "getMore", "killCursors"]
        done = list(raw_batches(client[fresh_db.name].big, {"_id": {"$lt": 150}}, 100))
    assert [len(batch) for batch in done] == [100, 50]
    assert commands.names[3:] == ["find", "getMore"]  # an exhausted cursor is not killed


@pytest.mark.fault
def test_a_range_whose_getmore_loses_its_connection_resumes_after_the_restart(
    fresh_db: Database[Any], mongo_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The reading thread's error reaches the copy; the connector restarts and copies only what is left."""
    fresh_db.big.insert_many([{"_id": i, "v": i} for i in range(3_000)])
    cfg = make_config(mongo_uri, fresh_db.name, **{
        "snapshot.mode": "initial_only", "mongocdc.snapshot.split.size": 500, "snapshot.max.threads": 1,
        "snapshot.fetch.size": 50, "retriable.restart.connector.wait.ms": 100,
    })
    admin = fresh_db.client.admin
    # The 25th getMore (the middle of the third range) and pymongo's view of it: a dropped connection.
    admin.command("configureFailPoint", "failCommand", mode={"skip": 24, "times": 1},
                  data={"failCommands": ["getMore"], "closeConnection": True})
    sink = MemorySink()
    try:
        with caplog.at_level(logging.WARNING, logger="mongocdc_core.coordinator"):
            run_engine(cfg, sink, MemoryOffsetStore())
    finally:
        admin.command("configureFailPoint", "failCommand", mode="off")
    assert any("restart 1 of" in message for message in caplog.messages), caplog.messages
    ids = [orjson.loads(orjson.loads(r.key or b"")["id"]) for r in sink.data(f"{fresh_db.name}.big") if r.op == "r"]
    assert Counter(ids) == Counter(range(3_000)), "every document exactly once across the restart"
    markers = Counter(orjson.loads(r.value or b"")["source"]["snapshot"] for r in sink.data() if r.op == "r")
    assert markers["first"] == 1 and markers["last"] == 1
