"""Stream slices per collection: single-run backfills, windows covered by a snapshot, and real gaps.

The multi-window tests use an emulator whose cluster clock runs in the past (``time_travel``), so
several closed windows hold events without waiting for them to close; they are marked ``fault``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import orjson
import pyarrow.parquet as pq
import pytest
from bson import Timestamp
from dagster import DagsterInstance, RunRequest, TimeWindow, build_schedule_context
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from pymongo import MongoClient
from pymongo.database import Database

from mongocdc_core.positions import Position
from mongocdc_dagster.assets.cdc import plan_window_read
from mongocdc_dagster.partitions import floor_to
from mongocdc_dagster.schedules import build_latest_window_schedule
from tests.dagster.cdc_helpers import (
    CdcEnv,
    checks_of,
    make_env,
    materialization_metadata,
    partition_metadata,
)
from tests.dagster.time_travel import TravelClock, travelling_replica_set

STABLE = ["key", "op", "position", "before", "after", "updated_fields", "removed_fields"]
T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def _window(minute: int) -> TimeWindow:
    return TimeWindow(T0 + timedelta(minutes=minute), T0 + timedelta(minutes=minute + 1))


def _ts(when: datetime, inc: int = 0) -> Timestamp:
    return Timestamp(int(when.timestamp()), inc)


def test_a_window_reads_from_its_start_while_the_oplog_holds_it() -> None:
    read = plan_window_read("k", _window(5), _ts(T0), [], landed_before=True)
    assert read.gap is None and read.start == _ts(T0 + timedelta(minutes=5)) and read.read_from() == "window start"


def test_a_window_whose_start_left_the_oplog_reads_from_a_snapshot_inside_it() -> None:
    snapshot = Position(int((T0 + timedelta(minutes=5, seconds=20)).timestamp()), 3)
    read = plan_window_read("k", _window(5), _ts(T0 + timedelta(minutes=5, seconds=10)), [snapshot], landed_before=False)
    assert read.gap is None and read.start == snapshot.timestamp and read.from_snapshot == snapshot
    assert "the snapshot position" in read.read_from() and "left the oplog" in read.read_from()


def test_a_window_before_the_snapshot_is_covered_and_empty() -> None:
    snapshot = Position(int((T0 + timedelta(minutes=9)).timestamp()), 1)
    read = plan_window_read("k", _window(5), _ts(T0 + timedelta(minutes=8)), [snapshot], landed_before=False)
    assert read.gap is None and read.start == read.end and "covers the window" in read.read_from()


def test_a_window_whose_start_left_the_oplog_reads_from_the_oldest_snapshot_the_oplog_holds() -> None:
    """A snapshot taken since (an incremental one, say) covers from later: reading from it would skip the
    changes made between the two snapshots; one the oplog no longer holds cannot be read from."""
    left = Position(int((T0 + timedelta(minutes=5, seconds=5)).timestamp()), 1)
    first = Position(int((T0 + timedelta(minutes=5, seconds=20)).timestamp()), 3)
    later = Position(int((T0 + timedelta(minutes=6, seconds=8)).timestamp()), 7)
    oplog_first = _ts(T0 + timedelta(minutes=5, seconds=10))
    read = plan_window_read("k", _window(5), oplog_first, [later, left, first], landed_before=True)
    assert read.gap is None and read.start == first.timestamp and read.from_snapshot == first
    after = plan_window_read("k", _window(5), oplog_first, [left, later], landed_before=True)
    assert after.gap is None and after.start == after.end and after.from_snapshot == later


@pytest.mark.parametrize(("snapshot_minute", "why"), [
    (None, "has no snapshot"),
    (3, "older than the window"),
    (5.2, "older than the oplog"),
])
def test_a_real_gap_says_why(snapshot_minute: float | None, why: str) -> None:
    snapshots = [] if snapshot_minute is None else [Position(int((T0 + timedelta(minutes=snapshot_minute)).timestamp()), 1)]
    read = plan_window_read("k", _window(5), _ts(T0 + timedelta(minutes=5, seconds=30)), snapshots, landed_before=True)
    assert read.gap is not None and "history lost" in read.gap and why in read.gap


def test_before_a_collections_capture_began_a_window_reads_from_the_oplogs_start() -> None:
    """No snapshot and no slice landed before the window (a fresh deployment): nothing was captured, so
    nothing can have been lost; the window reads what the oplog holds of it."""
    oplog_first = _ts(T0 + timedelta(minutes=5, seconds=30))
    read = plan_window_read("k", _window(5), oplog_first, [], landed_before=False)
    assert read.gap is None and read.before_capture and read.start == oplog_first
    assert "before the collection's capture began" in read.read_from()
    wholly_before = plan_window_read("k", _window(2), oplog_first, [], landed_before=False)
    assert wholly_before.gap is None and wholly_before.start == wholly_before.end  # nothing to read


# -- with an emulator whose clock runs in the past ------------------------------------------------------------


@pytest.fixture
def travel(tmp_path: Path) -> Iterator[tuple[MongoClient[Any], TravelClock, str]]:
    with travelling_replica_set(behind_s=3600) as (uri, clock):
        client: MongoClient[Any] = MongoClient(uri)
        yield client, clock, uri
        client.close()


def _env(tmp_path: Path, uri: str, client: MongoClient[Any], start: datetime) -> CdcEnv:
    db: Database[Any] = client["travel"]
    db.create_collection("signals")
    return make_env(tmp_path, uri, db, ["orders", "customers"], granularity="1min", start=start.isoformat())


def _write_windows(db: Database[Any], clock: TravelClock, first: datetime, count: int) -> None:
    """Writes into each of ``count`` windows from ``first``; then the clock passes the last one's end."""
    for minute in range(count):
        clock.jump_to(first + timedelta(minutes=minute, seconds=5))
        db.orders.insert_many([{"_id": f"{minute}-{i}", "qty": i} for i in range(minute + 2)])
        db.orders.update_one({"_id": f"{minute}-0"}, {"$inc": {"qty": 100}})
        db.customers.insert_one({"_id": minute, "name": f"c{minute}"})
    clock.jump_to(first + timedelta(minutes=count, seconds=5))
    db.other.insert_one({"_id": "after the last window"})  # the cluster time is now past every window


def _oplog_starts_at(client: MongoClient[Any], clock: TravelClock, when: datetime) -> Timestamp:
    """Purge the oplog up to a write made at ``when``, as if the server had started then; its time."""
    clock.jump_to(when)
    client["travel"].other.insert_one({"_id": "the oplog starts here"})
    start = client.local["oplog.rs"].find_one({"o._id": "the oplog starts here"})
    assert start is not None
    client.admin.command("mongocdcTruncateOplog", before=start["ts"])
    return cast(Timestamp, start["ts"])


def _wait_for_cluster_time(client: MongoClient[Any], when: datetime) -> None:
    deadline = time.monotonic() + 30
    while client.admin.command("ping")["$clusterTime"]["clusterTime"].time < when.timestamp():
        assert time.monotonic() < deadline, "the emulator's cluster time did not pass the last window"
        client.admin.command("ping")


@pytest.mark.fault
def test_a_backfill_of_many_windows_is_one_run_with_one_file_per_window(
        tmp_path: Path, travel: tuple[MongoClient[Any], TravelClock, str], instance: DagsterInstance) -> None:
    client, clock, uri = travel
    first = floor_to(clock.now(), 60) + timedelta(minutes=1)
    env = _env(tmp_path, uri, client, first)
    _write_windows(client["travel"], clock, first, 3)
    _wait_for_cluster_time(client, first + timedelta(minutes=3))
    keys = [(first + timedelta(minutes=m)).strftime("%Y-%m-%d-%H:%M") for m in range(3)]
    orders = env.key("orders", "slices")
    result = env.materialize(instance, [orders], tags={ASSET_PARTITION_RANGE_START_TAG: keys[0],
                                                       ASSET_PARTITION_RANGE_END_TAG: keys[-1]})
    assert result.success and checks_of(result) == {(orders.to_user_string(), "landing_envelopes"): True}
    assert len(instance.get_runs()) == 1  # one run, one change stream, three windows
    landed = instance.get_materialized_partitions(orders)
    assert landed == set(keys)
    per_window = {}
    for minute, key in enumerate(keys):
        meta = partition_metadata(instance, orders, key)
        assert meta["dagster/row_count"] == minute + 3 and meta["run_windows"] == 3  # inserts + one update
        assert meta["read_from"] == "window start"
        path = Path(meta["dagster/uri"])
        per_window[key] = pq.read_table(path).select(STABLE).to_pylist()
        ops = pq.read_table(path)["op"].to_pylist()
        assert ops.count("c") == minute + 2 and ops.count("u") == 1
    # each window alone lands the same records as the single run did
    for key in keys:
        assert env.materialize(instance, [orders], partition_key=key).success
        path = env.mongocdc.slice_path(env.ns("orders"), datetime.strptime(key, "%Y-%m-%d-%H:%M").replace(tzinfo=UTC))
        assert pq.read_table(path).select(STABLE).to_pylist() == per_window[key]
    # both collections of one window from one run (one change stream), each into its own file
    both = env.materialize(instance, [orders, env.key("customers", "slices")], partition_key=keys[1])
    assert both.success
    customers = pq.read_table(env.mongocdc.slice_path(env.ns("customers"), first + timedelta(minutes=1)))
    assert customers["op"].to_pylist() == ["c"] and set(customers["collection"].to_pylist()) == {env.ns("customers")}


@pytest.mark.fault
def test_windows_whose_start_left_the_oplog_read_from_the_snapshot_and_real_gaps_fail(
        tmp_path: Path, travel: tuple[MongoClient[Any], TravelClock, str], instance: DagsterInstance) -> None:
    client, clock, uri = travel
    first = floor_to(clock.now(), 60) + timedelta(minutes=1)
    env = _env(tmp_path, uri, client, first)
    db = client["travel"]
    clock.jump_to(first + timedelta(seconds=5))
    db.orders.insert_many([{"_id": i} for i in range(3)])  # window 0: will be purged from the oplog
    clock.jump_to(first + timedelta(minutes=1, seconds=5))
    db.orders.insert_one({"_id": "before the snapshot"})  # window 1, before the snapshot: purged too
    clock.jump_to(first + timedelta(minutes=1, seconds=20))
    assert env.materialize(instance, [env.key("orders", "snapshot")]).success
    snapshot = Position.parse(materialization_metadata(instance, env.key("orders", "snapshot"))["position_raw"])
    # customers' capture begins with window 0's slice (it has no snapshot)
    db.create_collection("customers")
    _wait_for_cluster_time(client, first + timedelta(minutes=1))
    assert env.materialize(instance, [env.key("customers", "slices")], partition_key=first.strftime("%Y-%m-%d-%H:%M")).success
    clock.jump_to(first + timedelta(minutes=1, seconds=40))
    db.orders.insert_one({"_id": "after the snapshot"})  # window 1, after the snapshot: kept
    db.customers.insert_one({"_id": "no snapshot"})
    # Purge up to the last change before the snapshot: the snapshot's position stays inside the oplog
    # (a change stream can start there), while both windows' starts have left it.
    kept = client.local["oplog.rs"].find_one({"o._id": "before the snapshot"})
    assert kept is not None and (kept["ts"].time, kept["ts"].inc) <= (snapshot.seconds, snapshot.increment)
    client.admin.command("mongocdcTruncateOplog", before=kept["ts"])
    clock.jump_to(first + timedelta(minutes=2, seconds=5))
    db.other.insert_one({"_id": "tick"})
    _wait_for_cluster_time(client, first + timedelta(minutes=2))
    keys = [(first + timedelta(minutes=m)).strftime("%Y-%m-%d-%H:%M") for m in range(2)]
    orders = env.key("orders", "slices")
    result = env.materialize(instance, [orders], tags={ASSET_PARTITION_RANGE_START_TAG: keys[0],
                                                       ASSET_PARTITION_RANGE_END_TAG: keys[1]})
    assert result.success
    covered = partition_metadata(instance, orders, keys[0])
    assert "covers the window" in covered["read_from"] and covered["dagster/row_count"] == 0
    meta = partition_metadata(instance, orders, keys[1])
    assert "the snapshot position" in meta["read_from"]
    assert Position.parse(meta["read_start_raw"]) == Position.from_timestamp(snapshot.timestamp)
    table = pq.read_table(Path(meta["dagster/uri"]))
    assert table["key"].to_pylist() == ['{"id":"\\"after the snapshot\\""}']
    # customers has no snapshot and its capture began before: its window 1 lost history, a clear failure
    failed = env.materialize(instance, [env.key("customers", "slices")], partition_key=keys[1], raise_on_error=False)
    assert not failed.success
    error = str([e for e in failed.all_events if e.is_step_failure][0].step_failure_data.error)
    assert "history lost" in error and "has no snapshot" in error
    assert not env.mongocdc.slice_path(env.ns("customers"), first + timedelta(minutes=1)).exists()


@pytest.mark.fault
def test_a_fresh_deployments_first_schedule_tick_before_any_snapshot_lands_its_window(
        tmp_path: Path, travel: tuple[MongoClient[Any], TravelClock, str], instance: DagsterInstance) -> None:
    """The oplog starts inside the first window (the server started then, as with a fresh ``make dev``) and
    no collection was snapshotted: nothing was captured before, so nothing was lost; the tick's run lands
    what the oplog holds of the window."""
    client, clock, uri = travel
    first = floor_to(clock.now(), 60) + timedelta(minutes=1)
    env = _env(tmp_path, uri, client, first)
    db = client["travel"]
    start = _oplog_starts_at(client, clock, first + timedelta(seconds=20))
    clock.jump_to(first + timedelta(seconds=30))
    db.orders.insert_one({"_id": "first"})
    db.create_collection("customers")  # a quiet collection
    clock.jump_to(first + timedelta(minutes=1, seconds=5))
    db.other.insert_one({"_id": "tick"})
    _wait_for_cluster_time(client, first + timedelta(minutes=1))
    schedule = build_latest_window_schedule(env.cdc)
    with build_schedule_context(instance=instance, scheduled_execution_time=first + timedelta(minutes=1)) as context:
        (request,) = list(cast(Iterator[RunRequest], schedule(context)))
    assert request.partition_key == first.strftime("%Y-%m-%d-%H:%M")
    slices = [env.key("orders", "slices"), env.key("customers", "slices")]
    result = env.materialize(instance, slices, partition_key=request.partition_key, tags=request.tags)
    assert result.success
    orders = partition_metadata(instance, slices[0], request.partition_key)
    assert "before the collection's capture began" in orders["read_from"] and orders["dagster/row_count"] == 1
    assert Position.parse(orders["read_start_raw"]).timestamp == start
    customers = partition_metadata(instance, slices[1], request.partition_key)
    assert customers["dagster/row_count"] == 0


@pytest.mark.fault
def test_a_window_in_which_a_collection_was_dropped_lands_every_collection(
        tmp_path: Path, travel: tuple[MongoClient[Any], TravelClock, str], instance: DagsterInstance) -> None:
    """The schedule's run for a window still names a collection dropped in it (until the code location is
    reloaded): its changes up to the drop are in the window and land, and the other collections land too."""
    client, clock, uri = travel
    first = floor_to(clock.now(), 60) + timedelta(minutes=1)
    env = _env(tmp_path, uri, client, first)
    db = client["travel"]
    clock.jump_to(first + timedelta(seconds=5))
    db.orders.insert_one({"_id": "kept"})
    db.customers.insert_one({"_id": "before the drop"})
    clock.jump_to(first + timedelta(seconds=20))
    db.drop_collection("customers")
    clock.jump_to(first + timedelta(minutes=1, seconds=5))
    db.other.insert_one({"_id": "after the window"})
    _wait_for_cluster_time(client, first + timedelta(minutes=1))
    window = first.strftime("%Y-%m-%d-%H:%M")
    slices = [env.key("orders", "slices"), env.key("customers", "slices")]
    assert env.materialize(instance, slices, partition_key=window).success
    orders = pq.read_table(env.mongocdc.slice_path(env.ns("orders"), first))
    customers = pq.read_table(env.mongocdc.slice_path(env.ns("customers"), first))
    assert orders["op"].to_pylist() == ["c"] and customers["op"].to_pylist() == ["c"]
    assert partition_metadata(instance, slices[1], window)["dagster/row_count"] == 1
    # a collection the filters now exclude (the code location not reloaded yet) is skipped, with a warning,
    # and the others still land: one excluded collection does not fail every collection's run
    config = Path(env.mongocdc.config_path)
    connector = orjson.loads(config.read_bytes())
    connector["config"]["collection.exclude.list"] = env.ns("customers")
    config.write_bytes(orjson.dumps(connector))
    skipped = env.materialize(instance, slices, partition_key=window, raise_on_error=False)
    assert skipped.success
    assert [e.asset_key for e in skipped.get_asset_materialization_events()] == [slices[0]]
    warnings = [e.user_message for e in instance.all_logs(skipped.run_id) if "skipped" in e.user_message]
    assert warnings and env.ns("customers") in warnings[0] and "include/exclude" in warnings[0]


@pytest.mark.fault
def test_an_incremental_snapshot_taken_since_does_not_hide_the_changes_before_it(
        tmp_path: Path, travel: tuple[MongoClient[Any], TravelClock, str], instance: DagsterInstance) -> None:
    """A fresh deployment (the oplog starts inside the first window) snapshots a collection, then an ad hoc
    incremental snapshot of it runs before the window is landed: the window reads from the first snapshot's
    position, so the changes between the two snapshots land too (the soak lost two inserts this way)."""
    client, clock, uri = travel
    first = floor_to(clock.now(), 60) + timedelta(minutes=1)
    env = _env(tmp_path, uri, client, first)
    db = client["travel"]
    _oplog_starts_at(client, clock, first + timedelta(seconds=10))
    db.orders.insert_many([{"_id": i} for i in range(3)])
    clock.jump_to(first + timedelta(seconds=20))
    assert env.materialize(instance, [env.key("orders", "snapshot")]).success
    clock.jump_to(first + timedelta(seconds=30))
    db.orders.insert_one({"_id": "between the snapshots"})
    db.orders.update_one({"_id": 1}, {"$set": {"qty": 1}})
    clock.jump_to(first + timedelta(seconds=40))
    assert env.materialize(instance, [env.key("orders", "incremental_snapshot")]).success
    clock.jump_to(first + timedelta(seconds=50))
    db.orders.insert_one({"_id": "after both"})
    clock.jump_to(first + timedelta(minutes=1, seconds=5))
    db.other.insert_one({"_id": "tick"})
    _wait_for_cluster_time(client, first + timedelta(minutes=1))
    snapshot = Position.parse(materialization_metadata(instance, env.key("orders", "snapshot"))["position_raw"])
    later = Position.parse(materialization_metadata(instance, env.key("orders", "incremental_snapshot"))["covers_from_raw"])
    assert snapshot < later
    orders = env.key("orders", "slices")
    window = first.strftime("%Y-%m-%d-%H:%M")
    assert env.materialize(instance, [orders], partition_key=window).success
    meta = partition_metadata(instance, orders, window)
    assert "the snapshot position" in meta["read_from"]
    assert Position.parse(meta["read_start_raw"]) == Position.from_timestamp(snapshot.timestamp)
    table = pq.read_table(Path(meta["dagster/uri"]))
    assert sorted(zip(table["op"].to_pylist(), table["key"].to_pylist(), strict=True)) == [
        ("c", '{"id":"\\"after both\\""}'), ("c", '{"id":"\\"between the snapshots\\""}'), ("u", '{"id":"1"}')]
