"""The snapshot's range reader: raw batches from its own find/getMore, or from pymongo's cursor, alike."""

from __future__ import annotations

import datetime
from typing import Any

from bson import Decimal128, Int64, ObjectId
from pymongo import MongoClient, ReadPreference
from pymongo.database import Database
from pymongo.monitoring import CommandFailedEvent, CommandListener, CommandStartedEvent, CommandSucceededEvent

from mongocdc_core.source.snapshot import raw_batches

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
