"""Sensors, schedules and cross-window checks, evaluated with Dagster's test contexts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from bson import ObjectId, Timestamp
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    DagsterRunStatus,
    PartitionKeyRange,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorResult,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluation
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteRepositoryOrigin
from dagster._core.storage.tags import (
    MAX_RETRIES_TAG,
    MAX_RUNTIME_SECONDS_TAG,
    PARTITION_NAME_TAG,
    SCHEDULE_NAME_TAG,
    WILL_RETRY_TAG,
)
from dagster._core.test_utils import create_run_for_test, freeze_time
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from pymongo.database import Database
from sqlalchemy import Connection, Engine, event

from mongocdc_core.positions import Position
from mongocdc_core.source.errors import CdcError
from mongocdc_core.source.oplog import OplogWindow, OplogWindows
from mongocdc_dagster import retries
from mongocdc_dagster.assets.cdc import CdcAssets
from mongocdc_dagster.checks import build_gap_check
from mongocdc_dagster.gaps import MAX_REPAIRS, REPAIR_BACKOFF, judge
from mongocdc_dagster.landed_history import COVERS_FROM, PARTIAL
from mongocdc_dagster.resources import MongoCdcResource
from mongocdc_dagster.schedules import build_latest_window_schedule
from mongocdc_dagster.sensors import (
    TAG_SNAPSHOT_TYPE,
    build_discovery_sensor,
    build_oplog_window_sensor,
    build_signal_sensor,
    build_slice_gaps_sensor,
)
from tests.dagster.cdc_helpers import CdcEnv, make_env


def _evaluate(sensor: Any, instance: DagsterInstance, resource: MongoCdcResource, cursor: str | None = None) -> Any:
    context = build_sensor_context(instance=instance, cursor=cursor, resources={"mongocdc": resource})
    return sensor(context)


def _skip_text(result: Any) -> str:
    reason = result if isinstance(result, SkipReason) else result.skip_reason
    return str(reason.skip_message if isinstance(reason, SkipReason) else reason)


def test_discovery_says_in_words_what_changed_and_what_did_not(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    db.create_collection("alpha")
    env = make_env(tmp_path, mongo_uri, db, ["alpha"])
    sensor = build_discovery_sensor(30, env.state, env.cdc, {})
    same = _evaluate(sensor, instance, env.mongocdc)
    assert not same.dynamic_partitions_requests
    assert _skip_text(same) == (f"no change: MongoDB captures the same 1 collection(s) the definitions were built "
                                f"for ({env.ns('alpha')})")
    db.create_collection("beta")
    text = _skip_text(_evaluate(sensor, instance, env.mongocdc))
    assert f"1 captured collection(s) have no assets yet: {env.ns('beta')}; reload the code location" in text
    db.drop_collection("alpha")
    assert f"no longer captured: {env.ns('alpha')}" in _skip_text(_evaluate(sensor, instance, env.mongocdc))


def test_discovery_plans_the_ranges_of_a_ranged_collection_once(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    db.big.insert_many([{"_id": i} for i in range(300)])
    env = make_env(tmp_path, mongo_uri, db, ["big"], ranged={f"{db.name}.big": 100})
    sensor = build_discovery_sensor(30, env.state, env.cdc, dict(env.settings.ranged))
    result = _evaluate(sensor, instance, env.mongocdc)
    assert isinstance(result, SensorResult)
    (request,) = result.dynamic_partitions_requests
    assert len(request.partition_keys) >= 2 and all("-of-" in k for k in request.partition_keys)
    assert f"planned the snapshot ranges of {env.ns('big')}" in str(result.skip_reason)
    instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
    assert not _evaluate(sensor, instance, env.mongocdc).dynamic_partitions_requests  # planned once


# -- signals ----------------------------------------------------------------------------------------------


def _started(env: CdcEnv, instance: DagsterInstance) -> str:
    """The cursor of a signal sensor's first tick (which only notes where the signaling collection stands)."""
    result = _evaluate(build_signal_sensor(30, env.cdc), instance, env.mongocdc)
    assert isinstance(result, SensorResult) and "signals inserted from now on" in str(result.skip_reason)
    assert result.cursor is not None
    return result.cursor


def test_signals_sent_before_the_sensor_started_are_not_replayed(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    db.create_collection("old")
    env = make_env(tmp_path, mongo_uri, db, ["old"])
    db.signals.insert_one({"_id": 5, "type": "execute-snapshot", "data": {"data-collections": [".*"], "type": "blocking"}})
    cursor = _started(env, instance)
    again = _evaluate(build_signal_sensor(30, env.cdc), instance, env.mongocdc, cursor=cursor)
    assert "no new signals" in _skip_text(again) and not getattr(again, "run_requests", None)


def test_signals_with_objectid_string_and_integer_ids_each_launch_one_run(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    for name in ("customers", "customers_eu", "orders"):
        db.create_collection(name)
    env = make_env(tmp_path, mongo_uri, db, ["customers", "customers_eu", "orders"])
    sensor = build_signal_sensor(30, env.cdc)
    cursor = _started(env, instance)
    oid = ObjectId()
    # inserted in this order: by _id order the string and the integer would sort before the ObjectId
    db.signals.insert_one({"_id": oid, "type": "execute-snapshot", "data": {
        "data-collections": [f"{db.name}\\.customers.*"], "type": "blocking",
        "additional-conditions": [{"data-collection": f"{db.name}.customers_eu", "filter": '{"eu": true}'}]}})
    text_id = "zz-signal: ad hoc/1 (re-run of Bob's 4.2 load)"  # characters a definition tag could not hold
    db.signals.insert_one({"_id": text_id, "type": "execute-snapshot", "data": {"data-collections": [f"{db.name}.orders"]}})
    db.signals.insert_one({"_id": 7, "type": "execute-snapshot", "data": {"data-collections": [f"{db.name}.orders"],
                                                                          "type": "blocking"}})
    db.signals.insert_one({"_id": "api-1-open", "type": "snapshot-window-open", "data": {}})  # a watermark, not a request
    result = _evaluate(sensor, instance, env.mongocdc, cursor=cursor)
    assert isinstance(result, SensorResult)
    requests = result.run_requests or []
    assert len(requests) == 3 and len({r.run_key for r in requests}) == 3
    by_id = {r.tags["mongocdc/signal_id"]: r for r in requests}
    assert set(by_id) == {str(oid), text_id, "7"}  # each id as the user wrote it
    blocking = by_id[str(oid)]
    assert sorted(k.to_user_string() for k in blocking.asset_selection or []) == [
        f"{db.name}/customers/snapshot", f"{db.name}/customers_eu/snapshot"]
    assert blocking.run_config["ops"]["mongocdc_snapshot"]["config"] == {
        "filters": {env.ns("customers_eu"): '{"eu": true}'}, "signal_id": str(oid)}
    assert blocking.run_config["loggers"] == {"console": {}}  # the run's console lines in mongocdc's format
    incremental = by_id[text_id]  # the type defaults to incremental, as in Debezium
    assert incremental.asset_selection == [env.key("orders", "incremental_snapshot")]
    assert incremental.tags[TAG_SNAPSHOT_TYPE] == "incremental"
    stored = _queued_run(instance, [env.key("orders", "incremental_snapshot")], dict(incremental.tags))
    assert [r.run_id for r in instance.get_runs(filters=RunsFilter(tags={"mongocdc/signal_id": text_id}))] == [
        stored.run_id]  # the Runs page's tag filter finds the run by the id as inserted
    assert by_id["7"].asset_selection == [env.key("orders", "snapshot")]
    again = _evaluate(sensor, instance, env.mongocdc, cursor=result.cursor)
    assert "no new signals" in _skip_text(again) and not getattr(again, "run_requests", None)


def test_a_signal_for_a_collection_without_assets_is_held_until_a_reload_has_it(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    db.create_collection("known")
    env = make_env(tmp_path, mongo_uri, db, ["known"])
    cursor = _started(env, instance)
    db.signals.insert_one({"_id": "later", "type": "execute-snapshot",
                           "data": {"data-collections": [f"{db.name}.later"], "type": "blocking"}})
    first = _evaluate(build_signal_sensor(30, env.cdc), instance, env.mongocdc, cursor=cursor)
    assert not first.run_requests and f"held: it names {env.ns('later')}" in _skip_text(first)
    db.create_collection("later")  # now captured, but the loaded definitions do not have it
    second = _evaluate(build_signal_sensor(30, env.cdc), instance, env.mongocdc, cursor=first.cursor)
    assert not second.run_requests and "held" in _skip_text(second)
    reloaded = make_env(tmp_path, mongo_uri, db, ["known", "later"])  # what a reload of the code location builds
    third = _evaluate(build_signal_sensor(30, reloaded.cdc), instance, reloaded.mongocdc, cursor=second.cursor)
    (request,) = third.run_requests
    assert request.asset_selection == [reloaded.key("later", "snapshot")]
    fourth = _evaluate(build_signal_sensor(30, reloaded.cdc), instance, reloaded.mongocdc, cursor=third.cursor)
    assert not getattr(fourth, "run_requests", None)  # launched once, no longer held


def test_malformed_and_unsupported_signals_are_reported(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    env = make_env(tmp_path, mongo_uri, db, [])
    cursor = _started(env, instance)
    db.signals.insert_many([
        {"_id": 1, "type": "execute-snapshot", "data": {"data-collections": ["(unclosed"], "type": "blocking"}},
        {"_id": 2, "type": "execute-snapshot", "data": {"data-collections": [".*"]}},
        {"_id": 3, "type": "execute-snapshot", "data": "{not json"},
        {"_id": 4, "type": "log", "data": {"message": "hi"}},
    ])
    result = _evaluate(build_signal_sensor(30, env.cdc), instance, env.mongocdc, cursor=cursor)
    assert isinstance(result, SensorResult) and not result.run_requests
    reason = str(result.skip_reason)
    assert "malformed signal 1" in reason and "not a valid regular expression" in reason
    assert "signal 2 held: it matches no captured collection" in reason
    assert "malformed signal 3" in reason and "not valid JSON" in reason
    assert "signal 4 of type 'log' is not for Dagster" in reason


def _queued_run(instance: DagsterInstance, selection: list[AssetKey], tags: dict[str, str]) -> Any:
    origin = RemoteRepositoryOrigin(
        InProcessCodeLocationOrigin(LoadableTargetOrigin(python_file=__file__), location_name="test"), "repo"
    ).get_job_origin("snap")
    return create_run_for_test(instance, job_name="snap", status=DagsterRunStatus.QUEUED, tags=tags,
                               remote_job_origin=origin, asset_selection=frozenset(selection))


def test_stop_snapshot_cancels_matching_queued_runs(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    env = make_env(tmp_path, mongo_uri, db, ["big", "small"])
    doomed = _queued_run(instance, [env.key("big", "snapshot")], {TAG_SNAPSHOT_TYPE: "blocking"})
    spared = _queued_run(instance, [env.key("small", "snapshot")], {TAG_SNAPSHOT_TYPE: "blocking"})
    cursor = _started(env, instance)
    db.signals.insert_one({"type": "stop-snapshot", "data": {"data-collections": [env.ns("big")], "type": "BLOCKING"}})
    result = _evaluate(build_signal_sensor(30, env.cdc), instance, env.mongocdc, cursor=cursor)
    assert "cancelled 1 run" in _skip_text(result)
    assert instance.get_run_by_id(doomed.run_id).status == DagsterRunStatus.CANCELED  # type: ignore[union-attr]
    assert instance.get_run_by_id(spared.run_id).status == DagsterRunStatus.QUEUED  # type: ignore[union-attr]


# -- the oplog window, the schedule and the continuity check ------------------------------------------------


class FixedOplog(MongoCdcResource):
    """The real resource with a pinned oplog window, to place collections relative to its start."""

    first_s: int
    last_s: int
    unreadable: bool = False  # as during an outage

    def oplog_windows(self) -> OplogWindows:
        if self.unreadable:
            return OplogWindows({}, {"rs0": "connection refused"})
        first, last = Timestamp(self.first_s, 1), Timestamp(self.last_s, 1)
        return OplogWindows({"rs0": OplogWindow(first, last, 1000, 10_000, (self.last_s - self.first_s) / 3600)}, {})

    def oplog_window(self, cfg: Any = None) -> OplogWindow:
        window = self.oplog_windows().common
        if window is None:
            raise CdcError("the oplog window is unknown: rs0: connection refused")
        return window


def _launch(instance: DagsterInstance, request: RunRequest, status: DagsterRunStatus, **run: Any) -> str:
    """The run the daemon launches for ``request`` (with its partition tag), ended with ``status``."""
    tags = {**request.tags, **({PARTITION_NAME_TAG: request.partition_key} if request.partition_key else {})}
    return create_run_for_test(instance, job_name="__ASSET_JOB", status=status, tags=tags,
                               asset_selection=frozenset(request.asset_selection or ()), **run).run_id


def _windows_of(request: RunRequest) -> str:
    if request.partition_key:
        return request.partition_key
    assert request.partition_key_range is not None
    return f"{request.partition_key_range.start}...{request.partition_key_range.end}"


def _slice(instance: DagsterInstance, env: CdcEnv, coll: str, start: datetime) -> None:
    key = env.cdc.windows.key_containing(start)
    assert key is not None
    instance.report_runless_asset_event(AssetMaterialization(env.key(coll, "slices"), partition=key))


def _snapshot(instance: DagsterInstance, env: CdcEnv, coll: str, at: datetime, partial: bool = False) -> None:
    metadata = {COVERS_FROM: Position(int(at.timestamp()), 1).to_str(), PARTIAL: partial}
    instance.report_runless_asset_event(AssetMaterialization(env.key(coll, "snapshot"), metadata=metadata))


def test_oplog_sensor_resnapshots_only_after_a_real_gap(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    first = now - timedelta(hours=2)
    env = make_env(tmp_path, mongo_uri, db, ["safe", "fresh", "risky", "lost", "never"],
                   start=(now - timedelta(hours=4)).isoformat())
    for minutes in (3, 2):
        _slice(instance, env, "safe", now - timedelta(minutes=minutes))
    # a fresh deployment: snapshotted inside the oplog, no slice landed yet: nothing is lost
    _snapshot(instance, env, "fresh", now - timedelta(seconds=30))
    _snapshot(instance, env, "risky", first + timedelta(minutes=5))  # next window within 25% of the oplog start
    _snapshot(instance, env, "lost", first - timedelta(hours=1))  # a full snapshot, then nothing landed
    _snapshot(instance, env, "lost", now, partial=True)  # a filtered snapshot does not cover the collection
    resource = FixedOplog(config_path=env.mongocdc.config_path, home=env.mongocdc.home,
                          first_s=int(first.timestamp()), last_s=int(now.timestamp()))
    sensor = build_oplog_window_sensor(30, env.cdc)
    result = _evaluate(sensor, instance, resource)
    (request,) = result.run_requests
    assert request.asset_selection == [env.key("lost", "snapshot")]
    observed = {e.asset_key: {k: v.value for k, v in e.metadata.items()} for e in result.asset_events}
    assert observed[env.key("risky", "slices")]["at_risk"] is True
    assert observed[env.key("lost", "slices")]["history_lost"] is True
    assert 60 <= observed[env.key("safe", "slices")]["lag_s"] <= 180
    assert observed[env.key("fresh", "slices")]["history_lost"] is False


def test_windows_left_behind_are_landed_again_a_bounded_number_of_times_and_are_an_error_once_they_cannot_be(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """A slice run whose retries were used up left windows behind (the schedule went on after them): those the
    oplog still holds are requested again, in one run; after MAX_REPAIRS failed such runs, or once the oplog no
    longer holds a window, the collection's continuity check fails with ERROR severity, saying which windows,
    why, and how to recover; reported once, not on every tick."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    env = make_env(tmp_path, mongo_uri, db, ["holey", "lost", "whole"], start=(now - timedelta(hours=4)).isoformat())
    windows = env.cdc.windows

    def key(minutes_ago: int) -> str:
        found = windows.key_containing(now - timedelta(minutes=minutes_ago))
        assert found is not None
        return found

    _snapshot(instance, env, "holey", now - timedelta(minutes=12, seconds=-20))
    _snapshot(instance, env, "lost", now - timedelta(minutes=40, seconds=-20))
    _snapshot(instance, env, "whole", now - timedelta(minutes=5, seconds=-20))
    for minutes_ago in range(12, 1, -1):
        if minutes_ago not in (8, 7):
            _slice(instance, env, "holey", now - timedelta(minutes=minutes_ago))
    for minutes_ago in range(40, 1, -1):
        if minutes_ago != 35:  # before the oplog's start (30 minutes ago), and after the snapshot
            _slice(instance, env, "lost", now - timedelta(minutes=minutes_ago))
    for minutes_ago in range(5, 1, -1):
        _slice(instance, env, "whole", now - timedelta(minutes=minutes_ago))
    resource = FixedOplog(config_path=env.mongocdc.config_path, home=env.mongocdc.home,
                          first_s=int((now - timedelta(minutes=30)).timestamp()), last_s=int(now.timestamp()))
    sensor = build_slice_gaps_sensor(30, env.cdc)
    result = _evaluate(sensor, instance, resource)
    (request,) = result.run_requests  # holey's two windows, in one run; nothing for the others
    assert request.asset_selection == [env.key("holey", "slices")]
    assert request.partition_key_range == PartitionKeyRange(key(8), key(7))
    assert request.tags["mongocdc/reason"] == "gap" and MAX_RETRIES_TAG not in request.tags  # the sensor retries
    assert request.tags[MAX_RUNTIME_SECONDS_TAG] == str(retries.MIN_SLICE_RUNTIME_S)
    (lost,) = [e for e in result.asset_events if isinstance(e, AssetCheckEvaluation)]
    assert (lost.asset_key, lost.check_name) == (env.key("lost", "slices"), "no_gap_since_snapshot")
    assert not lost.passed and lost.severity == AssetCheckSeverity.ERROR
    assert key(35) in (lost.description or "") and "history lost" in (lost.description or "")
    assert "snapshot the collection again" in (lost.description or "")
    assert list(cast(dict[str, str], lost.metadata["lost_windows"].value)) == [key(35)]
    with build_sensor_context(instance=instance, resources={"mongocdc": resource}, definitions=env.defs) as context:
        (resolved,) = sensor.evaluate_tick(context).run_requests  # as the daemon resolves it against its target
    assert resolved.partition_key_range == request.partition_key_range
    again = _evaluate(sensor, instance, resource, result.cursor)  # its repair not launched here: requested again,
    assert [r.run_key for r in again.run_requests] == [request.run_key]  # with the same key (launched once)
    assert not [e for e in again.asset_events if isinstance(e, AssetCheckEvaluation)]  # the error is reported once
    # a repair run terminated (CANCELED) is no failed attempt, and does not block the next request's key
    _launch(instance, request, DagsterRunStatus.CANCELED)
    (request,) = _evaluate(sensor, instance, resource, result.cursor).run_requests
    assert request.run_key != again.run_requests[0].run_key and _windows_of(request) == f"{key(8)}...{key(7)}"
    # its repairs fail: each window is requested again after a pause, alone (one always failing does not sink
    # its neighbour), until it failed MAX_REPAIRS times; exactly one request at a time
    requested = [_windows_of(request)]
    while True:
        _launch(instance, request, DagsterRunStatus.FAILURE)
        ended = datetime.now(UTC)
        with freeze_time(ended + timedelta(seconds=30)):  # right after a failure: its windows wait
            assert not _evaluate(sensor, instance, resource, result.cursor).run_requests
        at = ended + REPAIR_BACKOFF * 2 ** MAX_REPAIRS
        with freeze_time(at):
            retry = _evaluate(sensor, instance, resource, result.cursor)
        if not retry.run_requests:
            break
        (request,) = retry.run_requests
        requested.append(_windows_of(request))
    assert requested == [f"{key(8)}...{key(7)}", key(8), key(8), key(7), key(7)]
    (holey,) = [e for e in retry.asset_events
                if isinstance(e, AssetCheckEvaluation) and e.asset_key == env.key("holey", "slices")]
    assert holey.severity == AssetCheckSeverity.ERROR and "given up" in (holey.description or "")
    assert sorted(cast(dict[str, str], holey.metadata["lost_windows"].value)) == [key(8), key(7)]
    with freeze_time(at):
        # the continuity check, run on its own schedule, says the same (whatever this MongoDB's oplog holds)
        evaluations = _run_checks(env, instance)
        checked = evaluations[env.key("holey", "slices")]
        assert not checked.passed and checked.severity == AssetCheckSeverity.ERROR
        assert sorted(cast(dict[str, str], checked.metadata["lost_windows"].value)) == [key(8), key(7)]
        assert evaluations[env.key("whole", "slices")].metadata["lost_count"].value == 0
        # fixed (a new snapshot covers the windows): the sensor says so at once, not at the next hourly check
        _snapshot(instance, env, "holey", at - timedelta(minutes=1))
        fixed = _evaluate(sensor, instance, resource, retry.cursor)
    (passing,) = [e for e in fixed.asset_events if isinstance(e, AssetCheckEvaluation)]
    assert passing.asset_key == env.key("holey", "slices") and passing.passed


def test_the_gap_sensor_reads_no_history_the_oplog_sensor_read_unchanged_and_sees_a_landing_at_once(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Both sensors judge every collection's landed history each tick: over hundreds of collections two full
    reads of them all per interval. A history unchanged since it was read is not read again (one query says
    so); one whose slices or snapshot landed since is, at once."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    env = make_env(tmp_path, mongo_uri, db, ["holey", "whole"], start=(now - timedelta(hours=4)).isoformat())
    for coll in ("holey", "whole"):
        _snapshot(instance, env, coll, now - timedelta(minutes=6, seconds=-20))
        for minutes_ago in (6, 5, 4, 3, 2):
            if coll == "whole" or minutes_ago != 5:
                _slice(instance, env, coll, now - timedelta(minutes=minutes_ago))
    reads: list[AssetKey] = []
    partitions = DagsterInstance.get_materialized_partitions

    def counted(self: DagsterInstance, asset_key: AssetKey, *args: Any, **kwargs: Any) -> set[str]:
        reads.append(asset_key)
        return partitions(self, asset_key, *args, **kwargs)

    monkeypatch.setattr(DagsterInstance, "get_materialized_partitions", counted)
    resource = FixedOplog(config_path=env.mongocdc.config_path, home=env.mongocdc.home,
                          first_s=int((now - timedelta(minutes=30)).timestamp()), last_s=int(now.timestamp()))
    oplog = _evaluate(build_oplog_window_sensor(30, env.cdc), instance, resource)
    assert oplog.skip_reason is not None and sorted(reads) == [env.key("holey", "slices"), env.key("whole", "slices")]
    gaps = build_slice_gaps_sensor(30, env.cdc)
    (request,) = _evaluate(gaps, instance, resource).run_requests
    assert request.partition_key == env.cdc.windows.key_containing(now - timedelta(minutes=5))
    assert len(reads) == 2, "the gap sensor read the histories the oplog sensor had just read"
    _slice(instance, env, "holey", now - timedelta(minutes=5))  # the window lands (a repair, a backfill)
    result = _evaluate(gaps, instance, resource)
    assert not result.run_requests and _skip_text(result) == "no window left behind"
    assert reads[2:] == [env.key("holey", "slices")]  # that collection's alone


def test_a_history_is_read_again_after_a_whole_instance_wipe_and_after_a_snapshot_lands(
        instance: DagsterInstance) -> None:
    """The cache of landed histories is keyed by what the instance says of each asset's latest landing. A wipe
    of the whole instance leaves no wipe time and SQLite hands out the same event ids again: as many landings
    after it gave an equal stamp and the history read before the wipe (an earlier version). A snapshot landing
    is read at once too."""
    from dagster import TimeWindowPartitionsDefinition

    from mongocdc_dagster.landed_history import HistorySource, collection_histories
    from mongocdc_dagster.partitions import SliceWindows

    definition = TimeWindowPartitionsDefinition(start=datetime(2026, 1, 1, tzinfo=UTC), fmt="%Y-%m-%d-%H:%M",
                                                cron_schedule="* * * * *", timezone="UTC")
    windows = SliceWindows(definition, 60, "* * * * *")
    slices, snapshot = AssetKey(["wiped", "c", "slices"]), AssetKey(["wiped", "c", "snapshot"])

    def land(*partitions: str) -> None:
        for partition in partitions:
            instance.report_runless_asset_event(AssetMaterialization(slices, partition=partition))

    def history() -> tuple[tuple[str, ...], Position | None]:
        read = collection_histories(instance, [HistorySource("wiped.c", (snapshot,), slices)], windows)["wiped.c"]
        return read.window_keys, read.snapshot

    land("2026-01-01-00:01", "2026-01-01-00:02")
    assert history() == (("2026-01-01-00:01", "2026-01-01-00:02"), None)
    instance.wipe()
    land("2026-01-01-00:03", "2026-01-01-00:04")  # as many landings: the same event ids
    assert history() == (("2026-01-01-00:03", "2026-01-01-00:04"), None)
    position = Position(1_767_225_900, 1)
    instance.report_runless_asset_event(AssetMaterialization(snapshot, metadata={COVERS_FROM: position.to_str()}))
    assert history() == (("2026-01-01-00:03", "2026-01-01-00:04"), position)


def test_a_sensor_tick_asks_the_storage_as_often_for_many_collections_as_for_few(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """Each tick of the oplog-window and gap sensors asks the instance whether any collection's history changed:
    one storage query for all of them, not one per collection (an earlier version asked once per collection: 84
    SQL statements a tick here with 12 collections, 14 with 2). Counted as the SQL statements the tick runs
    against the instance, with 2 collections and with 12, histories unchanged since the previous tick."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    names = [f"c{i}" for i in range(12)]
    env = make_env(tmp_path, mongo_uri, db, names, start=(now - timedelta(hours=4)).isoformat())
    few = make_env(tmp_path, mongo_uri, db, names[:2], start=(now - timedelta(hours=4)).isoformat())
    for coll in names:
        _snapshot(instance, env, coll, now - timedelta(minutes=6, seconds=-20))
        for minutes_ago in (6, 5, 4, 3, 2):
            _slice(instance, env, coll, now - timedelta(minutes=minutes_ago))
    resource = FixedOplog(config_path=env.mongocdc.config_path, home=env.mongocdc.home,
                          first_s=int((now - timedelta(minutes=30)).timestamp()), last_s=int(now.timestamp()))
    statements: list[str] = []

    def count(conn: Connection, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    def queries(build: Callable[[int, CdcAssets], SensorDefinition], cdc: CdcAssets) -> int:
        """The statements of one tick of ``build``'s sensor, after a first tick read every history."""
        sensor = build(30, cdc)
        _evaluate(sensor, instance, resource)
        statements.clear()
        event.listen(Engine, "before_cursor_execute", count)
        try:
            _evaluate(sensor, instance, resource)
        finally:
            event.remove(Engine, "before_cursor_execute", count)
        assert statements, "the tick asked the instance nothing: it was not counted"
        return len(statements)

    for build in (build_oplog_window_sensor, build_slice_gaps_sensor):
        assert queries(build, env.cdc) == queries(build, few.cdc), build.__name__


def test_a_failed_repair_awaiting_dagsters_retry_is_in_flight_and_its_retries_are_one_attempt(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """Were a repair run retried by Dagster (run retries copy its tags), the sensor requests nothing while that
    retry is due, and the run with its retries count as one attempt; a run of an older window size is left
    out, not a crash."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    env = make_env(tmp_path, mongo_uri, db, ["holey"], start=(now - timedelta(hours=4)).isoformat())
    _snapshot(instance, env, "holey", now - timedelta(minutes=6, seconds=-20))
    for minutes_ago in (6, 5, 3, 2):
        _slice(instance, env, "holey", now - timedelta(minutes=minutes_ago))
    resource = FixedOplog(config_path=env.mongocdc.config_path, home=env.mongocdc.home,
                          first_s=int((now - timedelta(minutes=30)).timestamp()), last_s=int(now.timestamp()))
    sensor = build_slice_gaps_sensor(30, env.cdc)
    (request,) = _evaluate(sensor, instance, resource).run_requests
    hourly = RunRequest(partition_key="2026-11-22-10", tags=request.tags, asset_selection=request.asset_selection)
    _launch(instance, hourly, DagsterRunStatus.FAILURE)  # from when the windows were hours: not these windows
    failed = _launch(instance, request, DagsterRunStatus.FAILURE)
    instance.add_run_tags(failed, {WILL_RETRY_TAG: "true"})  # as Dagster marks a run it will retry
    with freeze_time(datetime.now(UTC) + REPAIR_BACKOFF * 3):
        waiting = _evaluate(sensor, instance, resource)
    assert not waiting.run_requests and failed in _skip_text(waiting)
    _launch(instance, request, DagsterRunStatus.FAILURE, root_run_id=failed, parent_run_id=failed)  # its retry
    # one attempt: due again after one back-off (two attempts would wait twice as long)
    with freeze_time(datetime.now(UTC) + REPAIR_BACKOFF * 1.5):
        (again,) = _evaluate(sensor, instance, resource).run_requests
    assert again.partition_key == request.partition_key


def test_no_repair_is_requested_while_the_oplog_cannot_be_read(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """During an outage a repair would only fail and use its attempts up: none is requested, and nothing is
    judged (the windows are not told lost or landable) until the oplog can be read again."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    env = make_env(tmp_path, mongo_uri, db, ["holey"], start=(now - timedelta(hours=4)).isoformat())
    _snapshot(instance, env, "holey", now - timedelta(minutes=6, seconds=-20))
    for minutes_ago in (6, 5, 3, 2):
        _slice(instance, env, "holey", now - timedelta(minutes=minutes_ago))
    args = {"config_path": env.mongocdc.config_path, "home": env.mongocdc.home,
            "first_s": int((now - timedelta(minutes=30)).timestamp()), "last_s": int(now.timestamp())}
    sensor = build_slice_gaps_sensor(30, env.cdc)
    outage = sensor(build_sensor_context(instance=instance, resources={"mongocdc": FixedOplog(**args, unreadable=True)}))
    assert isinstance(outage, SkipReason) and "cannot be read" in _skip_text(outage)
    assert len(_evaluate(sensor, instance, FixedOplog(**args)).run_requests) == 1  # back: requested


def test_dropped_and_excluded_collections_are_never_in_a_repair_and_their_check_passes(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """A collection dropped (or, the definitions not reloaded yet, left out by the filters) has windows missing
    that will never land: no repair names it (it would fail or land nothing, every collection's windows with
    it), and a dropped one's continuity check passes."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    env = make_env(tmp_path, mongo_uri, db, ["holey", "gone", "excluded"], start=(now - timedelta(hours=4)).isoformat())
    for coll in ("holey", "gone", "excluded"):
        _snapshot(instance, env, coll, now - timedelta(minutes=6, seconds=-20))
        for minutes_ago in (6, 5, 3, 2):
            _slice(instance, env, coll, now - timedelta(minutes=minutes_ago))
    env.cdc.dropped[env.ns("gone")] = now - timedelta(minutes=1)
    config = Path(env.mongocdc.config_path)
    connector = orjson.loads(config.read_bytes())
    connector["config"]["collection.exclude.list"] = env.ns("excluded")
    config.write_bytes(orjson.dumps(connector))
    resource = FixedOplog(config_path=env.mongocdc.config_path, home=env.mongocdc.home,
                          first_s=int((now - timedelta(minutes=30)).timestamp()), last_s=int(now.timestamp()))
    (request,) = _evaluate(build_slice_gaps_sensor(30, env.cdc), instance, resource).run_requests
    assert request.asset_selection == [env.key("holey", "slices")]
    verdict = judge(env.cdc, env.cdc.histories(instance, [env.ns("gone")])[env.ns("gone")], now, None, [])
    assert verdict.passed and verdict.metadata["verdict"] == "dropped"


def test_schedule_lands_the_latest_closed_window_of_every_collection_in_one_run(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    env = make_env(tmp_path, mongo_uri, db, ["a", "b"])
    schedule = build_latest_window_schedule(env.cdc)
    tick = datetime(2026, 11, 22, 10, 31, tzinfo=UTC)
    with build_schedule_context(instance=instance, scheduled_execution_time=tick) as context:
        (request,) = list(cast(Iterator[RunRequest], schedule(context)))
    assert request.partition_key == "2026-11-22-10:30"
    assert set(request.asset_selection or ()) == {env.key("a", "slices"), env.key("b", "slices")}  # the run's Target
    assert request.run_config == {"loggers": {"console": {}}}  # the run's console lines in mongocdc's format
    # a run whose worker died with its code server ends (run monitoring), so the schedule goes on after it
    assert request.tags[MAX_RUNTIME_SECONDS_TAG] == str(retries.MIN_SLICE_RUNTIME_S)
    selection = schedule.target.job_def.selection  # type: ignore[union-attr]
    assert selection.resolve(env.defs.resolve_asset_graph()) == {env.key("a", "slices"), env.key("b", "slices")}


def test_schedule_waits_for_its_run_in_flight_then_lands_every_window_closed_meanwhile_in_one_run(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    """A deployment that is behind catches up rather than queues more: while the schedule's slice run is
    queued or running its ticks request none, and the first tick after it ends requests one run for every
    window closed since; its runs check the envelopes, not the continuity (that has its own schedule)."""
    env = make_env(tmp_path, mongo_uri, db, ["a", "b"])
    schedule = build_latest_window_schedule(env.cdc)
    slices = {env.key("a", "slices"), env.key("b", "slices")}

    def tick(minute: int) -> RunRequest | SkipReason:
        at = datetime(2026, 11, 22, 10, minute, tzinfo=UTC)
        with build_schedule_context(instance=instance, scheduled_execution_time=at) as context:
            (result,) = list(cast(Iterator[RunRequest | SkipReason], schedule(context)))
        return result

    def launch(request: RunRequest, status: DagsterRunStatus) -> str:  # as the daemon does, with its tags
        tags = {**request.tags, SCHEDULE_NAME_TAG: schedule.name}
        if request.partition_key:
            tags[PARTITION_NAME_TAG] = request.partition_key
        return create_run_for_test(instance, job_name="__ASSET_JOB", status=status, tags=tags,
                                   asset_selection=frozenset(request.asset_selection or ())).run_id

    first = tick(31)
    assert isinstance(first, RunRequest) and first.partition_key == "2026-11-22-10:30"
    assert first.tags[MAX_RETRIES_TAG] == "2"  # a failed slice run is run again (dagster.yaml's run_retries)
    assert set(first.asset_check_keys or ()) == {AssetCheckKey(k, "landing_envelopes") for k in slices}
    running = launch(first, DagsterRunStatus.STARTED)
    for minute in (32, 33, 34):
        waiting = tick(minute)
        assert isinstance(waiting, SkipReason) and running in str(waiting.skip_message), waiting
    instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.RUN_SUCCESS.value,
                                               job_name="__ASSET_JOB"), run_id=running)
    behind = tick(35)
    assert isinstance(behind, RunRequest) and behind.partition_key is None
    assert behind.partition_key_range == PartitionKeyRange("2026-11-22-10:31", "2026-11-22-10:34")
    assert set(behind.asset_selection or ()) == slices
    assert set(behind.asset_check_keys or ()) == {AssetCheckKey(k, "landing_envelopes") for k in slices}
    launch(behind, DagsterRunStatus.SUCCESS)
    caught_up = tick(36)  # the next run lands the one window that closed since
    assert isinstance(caught_up, RunRequest) and caught_up.partition_key == "2026-11-22-10:35"
    failed = launch(caught_up, DagsterRunStatus.FAILURE)
    instance.add_run_tags(failed, {WILL_RETRY_TAG: "true"})  # as Dagster marks a run it will retry
    retrying = tick(37)
    assert isinstance(retrying, SkipReason) and "to be retried" in str(retrying.skip_message), retrying
    launch(caught_up, DagsterRunStatus.SUCCESS)  # its retry (Dagster's copies the tags), which succeeds
    launch(first, DagsterRunStatus.SUCCESS)  # an old run re-executed from the UI: its windows, its tags
    going_on = tick(38)  # from the furthest window landed, not the re-executed run's
    assert isinstance(going_on, RunRequest), going_on
    assert going_on.partition_key_range == PartitionKeyRange("2026-11-22-10:36", "2026-11-22-10:37")


def test_continuity_check_finds_windows_missing_since_the_snapshot(
        tmp_path: Path, mongo_uri: str, db: Database[Any], instance: DagsterInstance) -> None:
    base = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=6)
    env = make_env(tmp_path, mongo_uri, db, ["holey", "whole", "behind"], start=(base - timedelta(hours=1)).isoformat())
    check = build_gap_check(env.cdc)
    assert check is not None
    for coll in ("holey", "whole", "behind"):
        _snapshot(instance, env, coll, base + timedelta(seconds=20))
    for minute in range(3):
        _slice(instance, env, "behind", base + timedelta(minutes=minute))
    for minute in range(7):  # through the window open now, so it is landed if it closes before the check runs
        _slice(instance, env, "whole", base + timedelta(minutes=minute))
        if minute != 2:
            _slice(instance, env, "holey", base + timedelta(minutes=minute))
    evaluations = _run_checks(env, instance)
    holey = evaluations[env.key("holey", "slices")]
    gap = (base + timedelta(minutes=2)).strftime("%Y-%m-%d-%H:%M")
    assert not holey.passed and gap in cast(list[str], holey.metadata["missing_windows"].value)
    assert gap in (holey.description or "")
    whole = evaluations[env.key("whole", "slices")]
    missing = cast(list[str], whole.metadata["missing_windows"].value)
    assert whole.passed
    # only windows after the last one landed may be missing: those that closed while the test ran (none
    # unless it ran past the next minute), never one the history holds
    last_landed = (base + timedelta(minutes=6)).strftime("%Y-%m-%d-%H:%M")
    assert all(key > last_landed for key in missing), missing
    # windows closed since the last landed one are the schedule's next run's: they pass (a healthy deployment
    # whose check runs on the tick a window closes), counted
    behind = evaluations[env.key("behind", "slices")]
    assert behind.passed and cast(int, behind.metadata["pending_count"].value) >= 3, behind.description
    assert "schedule's next run" in (behind.description or "")


def test_the_continuity_checks_run_hourly_beside_minute_windows_and_once_per_longer_window(
        tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    """A run of checks beside every one-minute slice run would double the deployment's runs (the soak's
    queue never drained); windows of an hour or more keep one check run per window."""
    schedules = {}
    for granularity in ("1min", "15min", "hourly", "daily"):
        (tmp_path / granularity).mkdir()
        env = make_env(tmp_path / granularity, mongo_uri, db, ["c"], granularity=granularity)
        schedules[granularity] = (env.defs.resolve_schedule_def("mongocdc_continuity").cron_schedule,
                                  env.defs.resolve_schedule_def("mongocdc_latest_window").cron_schedule)
    assert schedules["1min"] == ("0 * * * *", "* * * * *") and schedules["15min"][0] == "0 * * * *"
    assert schedules["hourly"] == ("0 * * * *", "0 * * * *") and schedules["daily"][0] == schedules["daily"][1]


def _run_checks(env: CdcEnv, instance: DagsterInstance) -> dict[AssetKey, AssetCheckEvaluation]:
    # with the run config the continuity schedule gives its runs (the console logger in mongocdc's format)
    schedule = env.defs.resolve_schedule_def("mongocdc_continuity")
    with build_schedule_context(instance=instance) as context:
        (request,) = schedule.evaluate_tick(context).run_requests or []
    result = env.defs.resolve_job_def("mongocdc_continuity_checks").execute_in_process(
        instance=instance, run_config=request.run_config)
    return {e.asset_key: e for e in result.get_asset_check_evaluations()}


def test_sensors_that_launch_runs_target_the_snapshot_assets(
        tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    env = make_env(tmp_path, mongo_uri, db, ["a"])
    sensors = {s.name: s for s in env.defs.sensors or []}
    graph = env.defs.resolve_asset_graph()
    for name, kinds in (("mongocdc_signals", ("snapshot", "incremental_snapshot")),
                        ("mongocdc_oplog_window", ("snapshot",)), ("mongocdc_slice_gaps", ("slices",))):
        (target,) = sensors[name].targets  # type: ignore[union-attr]
        assert target.job_def.selection.resolve(graph) == {env.key("a", k) for k in kinds}  # type: ignore[union-attr]
