"""``api.snapshot_collection(at_cluster_time=…)``: the collection as it was at a cluster time, or a clear refusal."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from bson.timestamp import Timestamp
from pymongo.database import Database

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position


class _Collect:
    def __init__(self) -> None:
        self.records: list[Record] = []

    def write(self, records: list[Record]) -> None:
        self.records.extend(records)

    def flush(self, timeout: float | None = None) -> None:
        """Nothing buffered."""

    def close(self) -> None:
        """Nothing to close."""


def _after(record: Record) -> Any:
    assert record.value is not None
    return orjson.loads(orjson.loads(record.value)["payload"]["after"])


def test_a_read_at_a_cluster_time_sees_that_time_or_is_refused(mongo_uri: str, fresh_db: Database) -> None:
    namespace = f"{fresh_db.name}.items"
    cfg = ConnectorConfig.from_dict({"mongodb.connection.string": mongo_uri, "topic.prefix": "dbz"})
    fresh_db.items.insert_many([{"_id": i, "v": "old"} for i in range(3)])
    at = api.current_cluster_time(cfg)
    fresh_db.items.update_one({"_id": 0}, {"$set": {"v": "new"}})
    fresh_db.items.insert_one({"_id": 9})
    sink = _Collect()
    try:
        result = api.snapshot_collection(cfg, namespace, sink, filter={}, at_cluster_time=at)
    except api.SnapshotReadUnavailable as exc:  # e.g. a server without snapshot reads at a cluster time
        assert f"at Timestamp({at.time}, {at.inc})" in str(exc) and namespace in str(exc)
        return
    assert result.position == Position.from_timestamp(at) and result.documents == 3
    assert [_after(r) for r in sink.records] == [{"_id": i, "v": "old"} for i in range(3)]
    assert {r.position for r in sink.records} == {Position.from_timestamp(at)}


def test_a_time_older_than_the_snapshot_history_is_refused(mongo_uri: str, fresh_db: Database) -> None:
    cfg = ConnectorConfig.from_dict({"mongodb.connection.string": mongo_uri, "topic.prefix": "dbz"})
    fresh_db.items.insert_one({"_id": 1})
    with pytest.raises(api.SnapshotReadUnavailable, match="snapshot read of"):
        api.snapshot_collection(cfg, f"{fresh_db.name}.items", _Collect(), at_cluster_time=Timestamp(1, 1))


def test_a_read_at_a_cluster_time_is_copied_like_any_snapshot(mongo_uri: str, fresh_db: Database) -> None:
    """The same copy as a snapshot now: Debezium's markers, and only the asked ``_id`` range."""
    namespace = f"{fresh_db.name}.items"
    cfg = ConnectorConfig.from_dict({"mongodb.connection.string": mongo_uri, "topic.prefix": "dbz"})
    fresh_db.items.insert_many([{"_id": i, "v": "old"} for i in range(6)])
    at = api.current_cluster_time(cfg)
    fresh_db.items.delete_many({})
    whole, ranged = _Collect(), _Collect()
    try:
        api.snapshot_collection(cfg, namespace, whole, filter={}, at_cluster_time=at)
    except api.SnapshotReadUnavailable:  # a server without snapshot reads at a cluster time: nothing to compare
        pytest.skip("the server cannot read at a cluster time")
    api.snapshot_collection(cfg, namespace, ranged, filter={}, at_cluster_time=at, id_range=api.IdRange(low=2, high=5))
    assert [_source(r)["snapshot"] for r in whole.records] == ["first", "true", "true", "true", "true", "last"]
    assert [_after(r)["_id"] for r in ranged.records] == [2, 3, 4]
    assert [_source(r)["snapshot"] for r in ranged.records] == ["first", "true", "last"]


def _source(record: Record) -> Any:
    assert record.value is not None
    return orjson.loads(record.value)["payload"]["source"]
