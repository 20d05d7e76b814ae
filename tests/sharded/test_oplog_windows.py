"""Each shard's oplog window, read from the shard's replica set (mongos has no ``local``), and the Dagster
oplog-window sensor warning about the shard whose oplog lost a collection's history."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bson import Timestamp
from dagster import AssetMaterialization, DagsterInstance, build_sensor_context, instance_for_test
from pymongo import MongoClient
from pymongo.database import Database

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.config.uri import replica_set_uri
from mongocdc_core.positions import Position
from mongocdc_dagster.landed_history import COVERS_FROM, PARTIAL
from mongocdc_dagster.sensors import build_oplog_window_sensor
from tests.dagster.cdc_helpers import make_env
from tests.sharded.conftest import ShardedDeployment


def _key(ts: Timestamp) -> tuple[int, int]:
    return (ts.time, ts.inc)


def _last_entry(shard: MongoClient[Any]) -> Timestamp:
    entry = shard.local["oplog.rs"].find_one({}, {"ts": 1}, sort=[("$natural", -1)])
    assert entry is not None
    return entry["ts"]


class _Said(logging.Handler):
    """What a sensor logged (its context's logger does not propagate to Python's root logger)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as inst:
        yield inst


def test_a_shard_connection_string_keeps_the_connectors_credentials_and_options() -> None:
    through_mongos = "mongodb://cdc:s%40cret@mongos1:27017,mongos2:27017/admin?authSource=admin&tlsCAFile=/ca.pem" \
                     "&directConnection=false"
    assert replica_set_uri(through_mongos, "shard1/h1:27018,h2:27018") == (
        "mongodb://cdc:s%40cret@h1:27018,h2:27018/admin?authSource=admin&tlsCAFile=/ca.pem&replicaSet=shard1")
    assert replica_set_uri("mongodb+srv://cdc:pw@cluster.example.com/?retryWrites=true", "shard0/h:1") == (
        "mongodb://cdc:pw@h:1/?retryWrites=true&tls=true&replicaSet=shard0")


@pytest.mark.fault
def test_each_shards_oplog_window_is_read_and_a_truncated_one_is_named(
        sharded: ShardedDeployment, spread: Database[Any], tmp_path: Path, instance: DagsterInstance) -> None:
    first, second = sharded.shards[:2]
    spread.orders.insert_many([{"_id": 1}, {"_id": 2000}])  # one on each shard
    cfg = ConnectorConfig.from_dict({"mongodb.connection.string": sharded.uri, "topic.prefix": "t"})
    windows = api.oplog_windows(cfg)
    assert windows.sharded and not windows.unreadable and sorted(windows.windows) == sorted(sharded.shards)

    env = make_env(tmp_path, sharded.uri, spread, ["orders"])
    snapshot_at = sharded.client.admin.command("hello")["$clusterTime"]["clusterTime"]
    instance.report_runless_asset_event(AssetMaterialization(env.key("orders", "snapshot"), metadata={
        COVERS_FROM: Position(snapshot_at.time, snapshot_at.inc).to_str(), PARTIAL: False}))
    on_second: MongoClient[Any] = MongoClient(sharded.shard_host(second), serverSelectionTimeoutMS=10_000)
    try:
        for i in range(10_000):  # the second shard's oplog reaches the next second (awaited by position)
            spread.orders.insert_one({"_id": 3000 + i})
            if _last_entry(on_second).time > snapshot_at.time:
                break
        cut = Timestamp(snapshot_at.time + 1, 0)
        on_second.admin.command("mongocdcTruncateOplog", before=cut)  # history after the snapshot is gone there
        first_left = on_second.local["oplog.rs"].find_one({}, {"ts": 1}, sort=[("$natural", 1)])
    finally:
        on_second.close()
    assert first_left is not None and _key(first_left["ts"]) >= _key(cut)

    windows = api.oplog_windows(cfg)
    assert _key(windows.windows[second].first) >= _key(cut) > _key(windows.windows[first].first)
    assert windows.common is not None and windows.common.first == windows.windows[second].first
    assert api.oplog_window(cfg).first == windows.windows[second].first  # what a stream through mongos can resume in

    context = build_sensor_context(instance=instance, resources={"mongocdc": env.mongocdc})
    said = _Said()
    context.log.addHandler(said)
    result = build_oplog_window_sensor(30, env.cdc)(context)
    (request,) = result.run_requests
    assert request.asset_selection == [env.key("orders", "snapshot")]
    lost = [m for m in said.messages if "have left the oplog" in m]
    assert len(lost) == 1 and f"of shard {second} " in lost[0] and f"{spread.name}.orders" in lost[0], lost
    observed = {k: v.value for k, v in result.asset_events[0].metadata.items()}
    assert observed["history_lost"] is True and sorted(observed["oplog_shards"]) == sorted(sharded.shards)
