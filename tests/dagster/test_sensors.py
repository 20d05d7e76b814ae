"""Sensors, schedule and cross-partition checks, evaluated with Dagster's test contexts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from bson import ObjectId, Timestamp
from dagster import (
    AssetCheckResult,
    AssetMaterialization,
    DagsterInstance,
    DagsterRunStatus,
    RunRequest,
    SensorResult,
    SkipReason,
    build_asset_check_context,
    build_schedule_context,
    build_sensor_context,
)
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteRepositoryOrigin
from dagster._core.test_utils import create_run_for_test
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from mongocdc_core.positions import Position
from mongocdc_core.source.oplog import OplogWindow
from mongocdc_dagster.checks import build_checks
from mongocdc_dagster.partitions import COLLECTIONS_PARTITIONS_NAME
from mongocdc_dagster.resources import MongoCdcResource
from mongocdc_dagster.schedules import build_latest_window_schedule
from mongocdc_dagster.sensors import (
    TAG_COLLECTION,
    TAG_SNAPSHOT_TYPE,
    build_discovery_sensor,
    build_oplog_window_sensor,
    build_signal_sensor,
)
from tests.dagster.cdc_helpers import CdcEnv, register


def _evaluate(sensor: Any, instance: DagsterInstance, resource: MongoCdcResource, cursor: str | None = None) -> Any:
    context = build_sensor_context(instance=instance, cursor=cursor, resources={"mongocdc": resource})
    return sensor(context)


def test_discovery_adds_and_removes_collection_partitions(cdc: CdcEnv, instance: DagsterInstance) -> None:
    cdc.db.create_collection("alpha")
    cdc.db.create_collection("beta")
    sensor = build_discovery_sensor(30)
    result = _evaluate(sensor, instance, cdc.mongocdc)
    assert isinstance(result, SensorResult)
    (add,) = result.dynamic_partitions_requests or []
    assert add.partition_keys == [cdc.ns("alpha"), cdc.ns("beta")]  # not the signaling collection
    instance.add_dynamic_partitions(COLLECTIONS_PARTITIONS_NAME, add.partition_keys)
    assert isinstance(_evaluate(sensor, instance, cdc.mongocdc), SkipReason)
    cdc.db.drop_collection("beta")
    (remove,) = _evaluate(sensor, instance, cdc.mongocdc).dynamic_partitions_requests
    assert remove.partition_keys == [cdc.ns("beta")]


def _started(cdc: CdcEnv, instance: DagsterInstance) -> str:
    """The cursor of a signal sensor's first tick (which only notes where the collection stands)."""
    result = _evaluate(build_signal_sensor(30, cdc.assets), instance, cdc.mongocdc)
    assert isinstance(result, SensorResult) and "predate the sensor" in str(result.skip_reason)
    assert result.cursor is not None
    return result.cursor


def test_signals_sent_before_the_sensor_started_are_not_replayed(cdc: CdcEnv, instance: DagsterInstance) -> None:
    cdc.db.create_collection("old")
    cdc.db.signals.insert_one({"_id": 5, "type": "execute-snapshot",
                               "data": {"data-collections": [".*"], "type": "blocking"}})
    cursor = _started(cdc, instance)
    again = _evaluate(build_signal_sensor(30, cdc.assets), instance, cdc.mongocdc, cursor=cursor)
    assert isinstance(again, SkipReason) and "no new signals" in (again.skip_message or "")


def test_signal_sensor_launches_one_run_per_signal_and_collection(cdc: CdcEnv, instance: DagsterInstance) -> None:
    for name in ("customers", "customers_eu", "orders"):
        cdc.db.create_collection(name)
    register(instance, cdc.ns("customers"))
    cursor = _started(cdc, instance)
    db = cdc.db.name
    signal_id = ObjectId()
    cdc.db.signals.insert_many([
        {"_id": signal_id, "type": "execute-snapshot", "data": {
            "data-collections": [f"{db}\\.customers.*"], "type": "blocking",
            "additional-conditions": [{"data-collection": f"{db}.customers_eu", "filter": '{"eu": true}'}]}},
        {"_id": ObjectId(), "type": "execute-snapshot", "data": {"data-collections": "not-a-list", "type": "blocking"}},
        {"_id": ObjectId(), "type": "log", "data": {"message": "hello"}},
        {"_id": ObjectId(), "type": "execute-snapshot", "data": {"data-collections": [f"{db}\\.orders"]}},
    ])
    # an incremental snapshot's chunk watermark (string _id) in the same collection is not a request
    cdc.db.signals.insert_one({"_id": "api-1-open", "type": "snapshot-window-open", "data": {}})
    sensor = build_signal_sensor(30, cdc.assets)
    result = _evaluate(sensor, instance, cdc.mongocdc, cursor=cursor)
    assert isinstance(result, SensorResult)
    requests = {str(r.partition_key): r for r in result.run_requests or []}
    assert sorted(requests) == [cdc.ns("customers"), cdc.ns("customers_eu"), cdc.ns("orders")]
    incremental = requests.pop(cdc.ns("orders"))  # the type defaults to incremental, as in Debezium
    assert incremental.asset_selection == [cdc.assets.incremental_snapshot_key]
    assert incremental.tags["mongocdc/snapshot_type"] == "incremental"
    assert all(r.asset_selection == [cdc.assets.snapshot_key] for r in requests.values())
    eu = requests[cdc.ns("customers_eu")]
    assert eu.run_key == f"{signal_id}:{cdc.ns('customers_eu')}"
    assert eu.run_config["ops"]["mongocdc_snapshot"]["config"] == {"filter": '{"eu": true}', "signal_id": str(signal_id)}
    assert requests[cdc.ns("customers")].run_config["ops"]["mongocdc_snapshot"]["config"]["filter"] is None
    # a matched collection that was not yet a partition is registered in the same tick
    (add,) = result.dynamic_partitions_requests or []
    assert add.partition_keys == [cdc.ns("customers_eu"), cdc.ns("orders")]
    again = _evaluate(sensor, instance, cdc.mongocdc, cursor=result.cursor)
    assert isinstance(again, SkipReason) and "no new signals" in (again.skip_message or "")


def test_malformed_and_unsupported_signals_become_skip_reasons(cdc: CdcEnv, instance: DagsterInstance) -> None:
    cursor = _started(cdc, instance)
    cdc.db.signals.insert_many([
        {"_id": 1, "type": "execute-snapshot", "data": {"data-collections": ["(unclosed"], "type": "blocking"}},
        {"_id": 2, "type": "execute-snapshot", "data": {"data-collections": [".*"]}},  # incremental by default
        {"_id": 3, "type": "execute-snapshot", "data": "{not json"},
    ])
    result = _evaluate(build_signal_sensor(30, cdc.assets), instance, cdc.mongocdc, cursor=cursor)
    assert isinstance(result, SensorResult) and not result.run_requests
    reason = str(result.skip_reason)
    assert "signal 1" in reason and "not a valid regular expression" in reason
    assert "signal 2 matches no captured collection" in reason
    assert "signal 3" in reason and "not valid JSON" in reason
    assert result.cursor is not None and "3" in result.cursor


def _queued_run(instance: DagsterInstance, tags: dict[str, str]) -> Any:
    origin = RemoteRepositoryOrigin(
        InProcessCodeLocationOrigin(LoadableTargetOrigin(python_file=__file__), location_name="test"), "repo"
    ).get_job_origin("snap")
    return create_run_for_test(instance, job_name="snap", status=DagsterRunStatus.QUEUED, tags=tags,
                               remote_job_origin=origin)


def test_stop_snapshot_cancels_matching_queued_runs(cdc: CdcEnv, instance: DagsterInstance) -> None:
    ns, other = cdc.ns("big"), cdc.ns("small")
    doomed = _queued_run(instance, {TAG_COLLECTION: ns, TAG_SNAPSHOT_TYPE: "blocking"})
    spared = _queued_run(instance, {TAG_COLLECTION: other, TAG_SNAPSHOT_TYPE: "blocking"})
    cursor = _started(cdc, instance)
    cdc.db.signals.insert_one({"type": "stop-snapshot", "data": {"data-collections": [ns], "type": "BLOCKING"}})
    result = _evaluate(build_signal_sensor(30, cdc.assets), instance, cdc.mongocdc, cursor=cursor)
    assert "cancelled 1 run" in str(result.skip_reason)
    assert instance.get_run_by_id(doomed.run_id).status == DagsterRunStatus.CANCELED  # type: ignore[union-attr]
    assert instance.get_run_by_id(spared.run_id).status == DagsterRunStatus.QUEUED  # type: ignore[union-attr]


class FixedOplog(MongoCdcResource):
    """The real resource with a pinned oplog window, to place collections relative to its start."""

    first_s: int
    last_s: int

    def oplog_window(self) -> OplogWindow:
        first, last = Timestamp(self.first_s, 1), Timestamp(self.last_s, 1)
        return OplogWindow(first, last, 1000, 10_000, (self.last_s - self.first_s) / 3600)


def _slice(instance: DagsterInstance, cdc: CdcEnv, ns: str, start: datetime) -> None:
    key = cdc.partitions.window_key_containing(start)
    assert key is not None
    instance.report_runless_asset_event(
        AssetMaterialization(cdc.assets.stream_slice_key, partition=str(cdc.partitions.slice_key(ns, key)))
    )


def _snapshot(instance: DagsterInstance, cdc: CdcEnv, ns: str, at: datetime, filt: str | None = None) -> None:
    metadata = {"position": Position(int(at.timestamp()), 1).to_str(), "filter": filt}
    instance.report_runless_asset_event(AssetMaterialization(cdc.assets.snapshot_key, partition=ns, metadata=metadata))


def test_oplog_window_sensor_observes_warns_and_resnapshots_lost_history(cdc: CdcEnv, instance: DagsterInstance) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    first = now - timedelta(hours=2)
    safe, risky, lost = cdc.ns("safe"), cdc.ns("risky"), cdc.ns("lost")
    register(instance, safe, risky, lost)
    for minutes in (3, 2):
        _slice(instance, cdc, safe, now - timedelta(minutes=minutes))
    _snapshot(instance, cdc, risky, first + timedelta(minutes=5))  # next window within 25% of the oplog start
    _snapshot(instance, cdc, lost, first - timedelta(hours=1))  # a full snapshot, then nothing
    _snapshot(instance, cdc, lost, now, filt='{"x": 1}')  # a filtered snapshot does not reset the baseline
    resource = FixedOplog(config_path=cdc.mongocdc.config_path, home=cdc.mongocdc.home,
                          first_s=int(first.timestamp()), last_s=int(now.timestamp()))
    sensor = build_oplog_window_sensor(30, cdc.assets, cdc.partitions)
    result = _evaluate(sensor, instance, resource)
    (request,) = result.run_requests
    assert request.partition_key == lost and request.asset_selection == [cdc.assets.snapshot_key]
    (observation,) = result.asset_events
    meta = {k: v.value for k, v in observation.metadata.items()}
    assert meta["oplog_window_hours"] == 2.0 and meta["collections_at_risk"] == risky
    assert meta["collections_history_lost"] == lost
    assert 60 <= meta[f"lag_s/{safe}"] <= 180
    assert meta["oplog_growth_bytes_per_hour"] is None
    second = _evaluate(sensor, instance, resource, cursor=result.cursor)
    assert second.asset_events[0].metadata["oplog_growth_bytes_per_hour"].value == 0.0


def test_schedule_requests_the_latest_closed_window_of_every_collection(cdc: CdcEnv, instance: DagsterInstance) -> None:
    register(instance, cdc.ns("a"), cdc.ns("b"))
    schedule = build_latest_window_schedule(cdc.assets, cdc.partitions, "* * * * *")
    tick = datetime(2026, 11, 22, 10, 31, tzinfo=UTC)
    with build_schedule_context(instance=instance, scheduled_execution_time=tick) as context:
        requests = list(cast(Iterator[RunRequest], schedule(context)))
    keys = sorted(str(r.partition_key) for r in requests)
    assert keys == [f"{cdc.ns('a')}|2026-11-22-10:30", f"{cdc.ns('b')}|2026-11-22-10:30"]


def _run_check(check: Any, instance: DagsterInstance) -> AssetCheckResult:
    result = check(build_asset_check_context(instance=instance))
    assert isinstance(result, AssetCheckResult)
    return result


def test_gap_and_freshness_checks(cdc: CdcEnv, instance: DagsterInstance) -> None:
    no_gap, fresh = build_checks(cdc.assets, cdc.partitions)
    holey, whole = cdc.ns("holey"), cdc.ns("whole")
    register(instance, holey, whole)
    base = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=30)
    _snapshot(instance, cdc, holey, base + timedelta(seconds=20))
    for minute in (0, 1, 3):
        _slice(instance, cdc, holey, base + timedelta(minutes=minute))
    _snapshot(instance, cdc, whole, base + timedelta(minutes=40))  # newer than its slices: no gap counted
    _slice(instance, cdc, whole, base)
    gap = _run_check(no_gap, instance)
    assert not gap.passed
    assert (base + timedelta(minutes=2)).strftime("%Y-%m-%d-%H:%M") in str(gap.metadata["missing_windows"].value)
    assert whole not in str(gap.metadata["missing_windows"].value)
    freshness = _run_check(fresh, instance)
    assert not freshness.passed and holey in str(freshness.metadata["stale"].value)
    _slice(instance, cdc, holey, base + timedelta(minutes=2))
    assert _run_check(no_gap, instance).passed
    for ns in (holey, whole):
        _slice(instance, cdc, ns, datetime.now(UTC) - timedelta(minutes=1))
    assert _run_check(fresh, instance).passed
    assert not _run_check(no_gap, instance).passed  # jumped ahead: a gap again
