"""A sharded cluster for the tests: the emulated one, or a real one (``MONGOCDC_TEST_MONGODB_SHARDED_URI``).

The real cluster's URI names a mongos and carries a user allowed to shard databases (``enableSharding``,
``shardCollection``, ``split``, ``moveChunk``) and to step down shard primaries; it needs two shards or
more. Each test shards its own database with those commands and drops it afterwards.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from mongocdc_core.positions import Position
from mongocdc_core.receiver import ProgressListener
from mongocdc_devstack.fixture import EmulatedShardedCluster

SHARDED_URI_ENV = "MONGOCDC_TEST_MONGODB_SHARDED_URI"


@dataclass
class ShardedDeployment:
    uri: str
    client: MongoClient
    emulated: EmulatedShardedCluster | None

    @property
    def shards(self) -> list[str]:
        return [s["_id"] for s in self.client.admin.command("listShards")["shards"]]

    def shard_host(self, shard: str) -> str:
        """``mongodb://`` URI of one shard's replica set (from ``config.shards``)."""
        host = next(s["host"] for s in self.client.admin.command("listShards")["shards"] if s["_id"] == shard)
        name, _, members = host.partition("/")
        return f"mongodb://{members}/?replicaSet={name}"

    def database(self, primary: str) -> Database:
        """A fresh database whose primary shard is ``primary``."""
        name = f"sh_{uuid.uuid4().hex[:10]}"
        self.client.admin.command("enableSharding", name, primaryShard=primary)
        return self.client[name]

    def shard_range(self, db: Database, coll: str, split_at: Any, upper_shard: str) -> None:
        """Shard ``db.coll`` on ``_id``: ``[MinKey, split_at)`` stays on the primary, the rest on ``upper_shard``."""
        ns = f"{db.name}.{coll}"
        self.client.admin.command("shardCollection", ns, key={"_id": 1})
        self.client.admin.command("split", ns, middle={"_id": split_at})
        self.client.admin.command("moveChunk", ns, find={"_id": split_at}, to=upper_shard)

    def step_down(self, shard: str, seconds: int = 2) -> None:
        """Make ``shard``'s primary step down (a real multi-member shard elects another member)."""
        direct: MongoClient = MongoClient(self.shard_host(shard), serverSelectionTimeoutMS=10_000)
        try:
            direct.admin.command("replSetStepDown", seconds, secondaryCatchUpPeriodSecs=0, force=True)
        finally:
            direct.close()


def drain(stream: Any, count: int, attempts: int = 400) -> list[dict[str, Any]]:
    """``count`` events (each try_next waits up to the stream's maxAwaitTimeMS)."""
    events: list[dict[str, Any]] = []
    for _ in range(attempts):
        if len(events) == count:
            break
        event = stream.try_next()
        if event is not None:
            events.append(event)
    return events


class Streaming(ProgressListener):
    """Set once the engine streams (its snapshot, if any, is done)."""

    def __init__(self) -> None:
        self.started = threading.Event()

    def streaming_started(self, position: Position | None) -> None:
        self.started.set()


@pytest.fixture(scope="session")
def sharded() -> Iterator[ShardedDeployment]:
    real = os.environ.get(SHARDED_URI_ENV)
    if real:
        client: MongoClient = MongoClient(real, serverSelectionTimeoutMS=10_000)
        if len(client.admin.command("listShards")["shards"]) < 2:
            pytest.fail(f"{SHARDED_URI_ENV} must name a cluster with at least two shards")
        yield ShardedDeployment(real, client, None)
        client.close()
        return
    with EmulatedShardedCluster(shards=2, noop_interval=0.5) as emulated:
        client = MongoClient(emulated.uri, serverSelectionTimeoutMS=10_000)
        yield ShardedDeployment(emulated.uri, client, emulated)
        client.close()


@pytest.fixture
def spread(sharded: ShardedDeployment) -> Iterator[Database]:
    """A database on shard 0 with ``orders`` sharded by ``_id`` (``< 1000`` on shard 0, the rest on
    shard 1) and ``notes`` unsharded on shard 0; dropped afterwards."""
    first, second = sharded.shards[:2]
    db = sharded.database(first)
    sharded.shard_range(db, "orders", 1000, second)
    db.create_collection("notes")
    yield db
    sharded.client.drop_database(db.name)
