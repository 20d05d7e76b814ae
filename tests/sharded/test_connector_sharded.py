"""The connector capturing a sharded cluster through mongos (snapshot, streaming, restarts, a shard's
primary stepping down, transactions across shards, scopes, incremental snapshots).

Against the emulated cluster or a real one (``MONGOCDC_TEST_MONGODB_SHARDED_URI``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from bson import Timestamp
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import OperationFailure

from mongocdc_core.api import current_cluster_time, oplog_windows
from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import MemoryOffsetStore
from mongocdc_core.positions import Position
from mongocdc_core.source.errors import ConnectError, HistoryLostError, PrivilegeError
from mongocdc_devstack.fixture import EmulatedShardedCluster
from mongocdc_devstack.tls import make_pki
from tests.adhoc.support import engine_config, kinds
from tests.engine.engine_support import (
    Background,
    MemorySink,
    make_config,
    replay,
    run_engine,
    source_state,
    wait_for,
)
from tests.security.conftest import with_user
from tests.sharded.conftest import SHARDED_URI_ENV, ShardedDeployment, Streaming


def _values(sink: MemorySink, namespace: str) -> list[dict[str, Any]]:
    return sink.values(namespace)


def _positions(sink: MemorySink) -> list[Position]:
    return [r.position for r in sink.records if r.collection is not None and r.value is not None and r.op != "r"]


def test_snapshot_and_streaming_across_shards(sharded: ShardedDeployment, spread: Database) -> None:
    spread.orders.insert_many([{"_id": i, "v": i} for i in range(0, 3000, 100)])  # both shards
    spread.notes.insert_many([{"_id": n} for n in range(5)])
    cfg = make_config(sharded.uri, spread.name)
    sink, offsets = MemorySink(), MemoryOffsetStore()
    summary = run_engine(cfg, sink, offsets)
    assert summary.snapshot_documents == 35
    spread.orders.update_many({}, {"$inc": {"v": 1}})
    spread.orders.delete_one({"_id": 2900})
    spread.notes.insert_one({"_id": "late"})
    summary = run_engine(cfg, sink, offsets)
    assert summary.counts == {"c": 1, "u": 30, "d": 1}
    for coll in ("orders", "notes"):
        assert replay(sink.records, f"{spread.name}.{coll}") == source_state(spread[coll])
    sources = {v["source"]["rs"] for v in _values(sink, f"{spread.name}.orders")}
    assert sources == {"cluster"}  # Debezium's rs for a connection to mongos
    assert {r.topic for r in sink.data()} == {f"srv.{spread.name}.orders", f"srv.{spread.name}.notes"}
    streamed = _positions(sink)
    assert streamed == sorted(streamed) and len(set(streamed)) == len(streamed)


def test_a_stop_at_a_time_two_shards_wrote_at_delivers_both_shards_writes(sharded: ShardedDeployment, spread: Database) -> None:
    """Each shard's clock is its own, so two shards can write at one clusterTime. A run told to stop there must
    deliver an event of that time even when mongos has already merged the other shard's scan to it: its post-batch
    token is then a high-water mark at that time, which sorts before the events of that time (CI once lost the
    last insert of test_snapshot_and_streaming_across_shards so). Here the second shard's entry at the insert's
    time is a no-op written at it."""
    if sharded.emulated is None:
        pytest.skip("sets a shard's clock to write a no-op at the time another shard wrote")
    first, second = sharded.shards[:2]
    cfg = make_config(sharded.uri, spread.name)
    sink, offsets = MemorySink(), MemoryOffsetStore()
    run_engine(cfg, sink, offsets)
    other = sharded.emulated.shard(second)
    with MongoClient(sharded.shard_host(first)) as one, MongoClient(sharded.shard_host(second)) as two:
        for attempt in range(20):
            spread.notes.insert_one({"_id": attempt})  # the first shard (notes is unsharded there)
            at = one.local["oplog.rs"].find_one({"ns": f"{spread.name}.notes", "o._id": attempt})["ts"]
            with other.state.lock:
                other.oplog.clock.advance_to(Timestamp(at.time, at.inc - 1))
                other.state.write_noop("the other shard at the insert's time")
            if two.local["oplog.rs"].find_one({"ts": at}) is not None:
                break
        else:
            pytest.fail("the second shard never wrote at the time of an insert on the first")
    summary = run_engine(cfg, sink, offsets, stop_at=at)
    assert summary.counts["c"] == attempt + 1
    assert replay(sink.records, f"{spread.name}.notes") == source_state(spread.notes)


def test_restart_resumes_without_loss_or_repeat(sharded: ShardedDeployment, spread: Database) -> None:
    cfg = make_config(sharded.uri, spread.name, **{"snapshot.mode": "no_data"})
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)  # the first run pins where streaming starts
    runs: list[MemorySink] = []
    expected = 0
    for round_ in range(4):
        spread.orders.insert_many([{"_id": round_ * 10 + i} for i in range(3)] + [{"_id": 5000 + round_ * 10 + i} for i in range(3)])
        expected += 6
        sink = MemorySink()
        run_engine(cfg, sink, offsets)
        runs.append(sink)
    keys = [r.key for sink in runs for r in sink.data(f"{spread.name}.orders")]
    assert len(keys) == expected and len(set(keys)) == expected
    positions = [p for sink in runs for p in _positions(sink)]
    assert positions == sorted(positions)


def test_capture_scopes_on_a_sharded_cluster(sharded: ShardedDeployment, spread: Database) -> None:
    other = sharded.database(sharded.shards[1])  # its primary is the other shard
    try:
        spread.orders.insert_many([{"_id": 1}, {"_id": 2000}])
        other.items.insert_one({"_id": "x"})
        wide = make_config(sharded.uri, spread.name, **{"collection.include.list": f"({spread.name}|{other.name})\\..*"})
        one_db = make_config(sharded.uri, spread.name, **{"capture.scope": "database", "capture.target": other.name,
                                                          "collection.include.list": ""})  # fmt: skip
        one_coll = make_config(sharded.uri, spread.name, **{"capture.scope": "collection",
                                                            "capture.target": f"{spread.name}.orders"})  # fmt: skip
        found = {}
        for name, cfg in (("deployment", wide), ("database", one_db), ("collection", one_coll)):
            sink = MemorySink()
            run_engine(cfg, sink, MemoryOffsetStore())
            found[name] = sorted({r.collection for r in sink.data() if r.collection})
        assert found == {
            "deployment": sorted([f"{spread.name}.orders", f"{other.name}.items"]),
            "database": [f"{other.name}.items"],
            "collection": [f"{spread.name}.orders"],
        }
    finally:
        sharded.client.drop_database(other.name)


def test_a_shard_primary_stepping_down_loses_nothing(sharded: ShardedDeployment, spread: Database) -> None:
    cfg = make_config(sharded.uri, spread.name, **{"snapshot.mode": "no_data"})
    sink = MemorySink()
    streaming = Streaming()
    engine = Background(Engine(cfg, sink, MemoryOffsetStore(), progress=streaming)).start()
    try:
        wait_for(streaming.started.is_set)
        spread.orders.insert_many([{"_id": i} for i in range(5)] + [{"_id": 2000 + i} for i in range(5)])
        wait_for(lambda: len(sink.data(f"{spread.name}.orders")) == 10)
        sharded.step_down(sharded.shards[1])
        spread.orders.insert_many([{"_id": 10 + i} for i in range(5)] + [{"_id": 3000 + i} for i in range(5)])
        end = current_cluster_time(cfg)
        engine.engine.stop()
        engine.stop()
    finally:
        engine.engine.stop()
    rest = MemorySink()
    offsets_after = engine.engine.offsets
    run_engine(cfg, rest, offsets_after, stop_at=end)
    keys = [r.key for r in sink.data(f"{spread.name}.orders") + rest.data(f"{spread.name}.orders")]
    assert len(keys) == 20 and len(set(keys)) == 20  # every write captured exactly once
    assert replay(sink.records + rest.records, f"{spread.name}.orders") == source_state(spread.orders)


def test_transaction_metadata_spans_the_shards(sharded: ShardedDeployment, spread: Database) -> None:
    cfg = make_config(sharded.uri, spread.name, **{"snapshot.mode": "no_data", "provide.transaction.metadata": "true"})
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)  # pins the stream's start
    with sharded.client.start_session() as session, session.start_transaction():
        spread.orders.insert_one({"_id": 1}, session=session)
        spread.orders.insert_one({"_id": 2000}, session=session)
        spread.notes.insert_one({"_id": "t"}, session=session)
    sink = MemorySink()
    run_engine(cfg, sink, offsets)
    markers = [orjson.loads(r.value) for r in sink.topic("srv.transaction") if r.value is not None]
    assert [m["status"] for m in markers] == ["BEGIN", "END"]
    assert markers[1]["event_count"] == 3
    ids = {v["transaction"]["id"] for v in sink.values() if v.get("transaction")}
    assert ids == {markers[0]["id"]}


def test_incremental_snapshot_of_a_sharded_collection(sharded: ShardedDeployment, spread: Database) -> None:
    spread.orders.insert_many([{"_id": i} for i in range(0, 3000, 50)])
    signals = f"{spread.name}.signals"
    cfg = engine_config(sharded.uri, spread.name, **{"signal.data.collection": signals, "incremental.snapshot.chunk.size": 7})
    sink = MemorySink()
    streaming = Streaming()
    engine = Background(Engine(cfg, sink, MemoryOffsetStore(), progress=streaming)).start()
    try:
        wait_for(streaming.started.is_set)
        spread.signals.insert_one({"type": "execute-snapshot", "data": {"data-collections": [f"{spread.name}\\.orders"]}})
        wait_for(lambda: "COMPLETED" in kinds(sink, "Incremental Snapshot"))  # type: ignore[arg-type]
    finally:
        engine.stop()
    reads = [r for r in sink.data(f"{spread.name}.orders") if r.op == "r"]
    assert len(reads) == 60 and len({r.key for r in reads}) == 60


def test_history_lost_on_one_shard_is_detected_through_mongos(sharded: ShardedDeployment, spread: Database) -> None:
    if sharded.emulated is None:
        pytest.skip("needs the emulator's fault injection (truncating a shard's oplog)")
    spread.orders.insert_many([{"_id": 1}, {"_id": 2000}])
    cfg = make_config(sharded.uri, spread.name)
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)
    spread.orders.insert_many([{"_id": 2}, {"_id": 3000}])
    second = sharded.shards[1]
    direct: MongoClient = MongoClient(sharded.shard_host(second))
    now = direct.admin.command("hello")["$clusterTime"]["clusterTime"]
    # the shard forgets everything before its latest entry (never that one, as mongod keeps it, nor
    # what it has yet to write: a snapshot taken now must find its start in the oplog)
    direct.admin.command("mongocdcTruncateOplog", 1, before=now)
    direct.close()
    with pytest.raises(HistoryLostError):
        run_engine(cfg, MemorySink(), offsets)
    sink = MemorySink()
    summary = run_engine(make_config(sharded.uri, spread.name, **{"snapshot.mode": "when_needed"}), sink, offsets)
    assert summary.snapshot_performed and summary.snapshot_documents == 4


def test_a_snapshot_whose_start_is_already_outside_a_shards_oplog_is_named() -> None:
    """A shard that holds no oplog entry at or after the current cluster time (its oplog emptied past
    it): the snapshot cannot pin a start to stream from, and says so instead of a raw driver error.
    On a cluster of its own: no other test's stream could open on that shard for the next minute."""
    if os.environ.get(SHARDED_URI_ENV):
        pytest.skip("starts its own emulated cluster to empty a shard's oplog past now")
    layout = {"collections": {"shop.orders": {"key": {"_id": 1}, "chunks": [{"max": 100, "shard": "shard0"}, {"shard": "shard1"}]}}}
    with EmulatedShardedCluster(layout=layout) as cluster:
        client: MongoClient = MongoClient(cluster.uri)
        client.shop.orders.insert_many([{"_id": 1}, {"_id": 500}])
        deployment = ShardedDeployment(cluster.uri, client, cluster)
        direct: MongoClient = MongoClient(deployment.shard_host(deployment.shards[1]))
        now = direct.admin.command("hello")["$clusterTime"]["clusterTime"]
        direct.admin.command("mongocdcTruncateOplog", 1, before=Timestamp(now.time + 60, 0))
        direct.close()
        with pytest.raises(HistoryLostError, match="cannot start the snapshot: a change stream opened at the current"):
            run_engine(make_config(cluster.uri, "shop"), MemorySink(), MemoryOffsetStore())
        client.close()


def test_least_privileged_user_through_a_mongos_with_access_control(tmp_path: Path) -> None:
    if os.environ.get(SHARDED_URI_ENV):
        pytest.skip("starts its own emulated cluster with --auth")
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"users": [
        {"user": "boss", "pwd": "boss-pw", "roles": ["root"]},
        {"user": "cdc", "pwd": "cdc-pw", "roles": ["readAnyDatabase", {"role": "read", "db": "config"},
                                                   {"role": "read", "db": "local"}]},
        {"user": "narrow", "pwd": "narrow-pw", "roles": [{"role": "read", "db": "shop"}]},
    ]}))  # fmt: skip
    layout = {"collections": {"shop.orders": {"key": {"_id": 1}, "chunks": [{"max": 100, "shard": "shard0"}, {"shard": "shard1"}]}}}
    with EmulatedShardedCluster(layout=layout, auth=True, users_file=str(users)) as cluster:
        boss: MongoClient = MongoClient(with_user(cluster.uri, "boss", "boss-pw"))
        boss.shop.orders.insert_many([{"_id": 1}, {"_id": 500}])
        anonymous: MongoClient = MongoClient(cluster.uri, serverSelectionTimeoutMS=5000)
        with pytest.raises(OperationFailure, match="requires authentication"):
            anonymous.shop.orders.find_one()
        cfg = make_config(cluster.uri, "shop", **{"mongodb.user": "cdc", "mongodb.password": "cdc-pw"})
        sink = MemorySink()
        assert run_engine(cfg, sink, MemoryOffsetStore()).snapshot_documents == 2
        # each shard's oplog window, read from the shard with the connector's mongodb.user / mongodb.password
        windows = oplog_windows(cfg)
        assert sorted(windows.windows) == ["shard0", "shard1"] and not windows.unreadable
        narrow = make_config(cluster.uri, "shop", **{"mongodb.user": "narrow", "mongodb.password": "narrow-pw"})
        with pytest.raises(PrivilegeError, match="allChangesForCluster"):
            run_engine(narrow, MemorySink(), MemoryOffsetStore(), max_events=1)
        refused = oplog_windows(narrow)  # no read on config.shards: said, not raised
        assert not refused.windows and list(refused.unreadable) == ["cluster"]
        boss.close()
        anonymous.close()


def test_tls_through_mongos(tmp_path: Path) -> None:
    if os.environ.get(SHARDED_URI_ENV):
        pytest.skip("starts its own emulated cluster serving TLS")
    pki = make_pki(str(tmp_path / "pki"))
    with EmulatedShardedCluster(tls_certificate_key_file=pki.server_file) as cluster:
        uri = f"{cluster.uri}?tlsCAFile={pki.ca_file}"
        admin: MongoClient = MongoClient(f"{uri}&tls=true", serverSelectionTimeoutMS=10_000)
        admin.shop.orders.insert_many([{"_id": i} for i in range(3)])
        sink = MemorySink()
        cfg = make_config(uri, "shop", **{"mongodb.ssl.enabled": "true"})
        assert run_engine(cfg, sink, MemoryOffsetStore()).snapshot_documents == 3
        windows = oplog_windows(cfg)  # the shards reached with the connector's TLS options
        assert sorted(windows.windows) == ["shard0", "shard1"] and not windows.unreadable
        plaintext = make_config(cluster.uri, "shop", **{"connect.max.attempts": 1, "errors.max.retries": 0,
                                                        "mongodb.server.selection.timeout.ms": 1500})  # fmt: skip
        with pytest.raises(ConnectError):
            run_engine(plaintext, MemorySink(), MemoryOffsetStore(), max_events=1)
        admin.close()
