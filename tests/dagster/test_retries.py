"""What happens after a CDC step or run fails: step retries for transient failures, run retries only for runs
that failed as a whole, never a retry of a step that said it may not be retried."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from dagster import (
    DagsterInstance,
    RetryPolicy,
    RunRequest,
    build_schedule_context,
    build_sensor_context,
    instance_for_test,
)
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.events import DagsterEvent, DagsterEventType, RunFailureReason
from dagster._core.events.log import EventLogEntry
from dagster._core.execution.retries import auto_reexecution_should_retry_run
from dagster._core.storage.dagster_run import DagsterRunStatus
from dagster._core.storage.tags import (
    MAX_RETRIES_TAG,
    MAX_RUNTIME_SECONDS_TAG,
    RUN_FAILURE_REASON_TAG,
    WILL_RETRY_TAG,
)
from dagster._core.test_utils import create_run_for_test
from dagster._daemon.monitoring.run_monitoring import check_run_timeout
from pymongo.database import Database
from pymongo.errors import AutoReconnect

from mongocdc_core.source.oplog import OplogWindow
from mongocdc_dagster.assets import cdc
from mongocdc_dagster.resources import MongoCdcResource
from mongocdc_dagster.schedules import build_latest_window_schedule
from mongocdc_dagster.translator import MongoCdcTranslator
from tests.dagster.cdc_helpers import CdcEnv, make_env


@pytest.fixture
def retrying_instance() -> Iterator[DagsterInstance]:
    """An instance with run retries on and no retries by default, as the project's dagster.yaml."""
    with instance_for_test(overrides={"run_retries": {"enabled": True, "max_retries": 0}}) as inst:
        yield inst


def _schedule_request(env: CdcEnv, instance: DagsterInstance) -> RunRequest:
    """The latest-window schedule's request for the window closed last."""
    schedule = build_latest_window_schedule(env.cdc)
    with build_schedule_context(instance=instance, scheduled_execution_time=datetime.now(UTC)) as context:
        (request,) = list(cast(Iterator[RunRequest], schedule(context)))
    return request


def test_a_slice_run_whose_step_may_not_be_retried_is_not_run_again(
        tmp_path: Path, mongo_uri: str, db: Database[Any], retrying_instance: DagsterInstance,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that raises ``Failure(allow_retries=False)`` (here: a window whose history is lost) runs once, and
    its run is not retried either; the same run failing as a whole would be."""
    env = make_env(tmp_path, mongo_uri, db, ["a"])
    request = _schedule_request(env, retrying_instance)
    real = cdc.plan_window_read

    def lost(*args: Any, **kwargs: Any) -> cdc.WindowRead:
        return replace(real(*args, **kwargs), gap="history lost: the oplog starts after the window")

    monkeypatch.setattr(cdc, "plan_window_read", lost)
    result = env.materialize(retrying_instance, [env.key("a", "slices")], partition_key=request.partition_key,
                             tags=request.tags, raise_on_error=False)
    assert not result.success
    assert [e for e in result.all_events if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY] == []
    run = retrying_instance.get_run_by_id(result.run_id)
    assert run is not None and run.tags[RUN_FAILURE_REASON_TAG] == RunFailureReason.STEP_FAILURE.value
    assert run.tags[WILL_RETRY_TAG] == "false"  # Dagster's run retries leave it alone
    # the same run killed with its worker is run again
    assert auto_reexecution_should_retry_run(retrying_instance, run, RunFailureReason.UNEXPECTED_TERMINATION)


def test_a_transient_step_failure_is_retried_inside_its_run(
        tmp_path: Path, mongo_uri: str, db: Database[Any], retrying_instance: DagsterInstance,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """MongoDB unreachable for a moment (as during a step-down): the step's RetryPolicy runs it again in the
    same run (here without the pause), which lands the window."""
    monkeypatch.setattr(cdc, "STEP_RETRY_POLICY", RetryPolicy(max_retries=3, delay=0))
    env = make_env(tmp_path, mongo_uri, db, ["a"])
    request = _schedule_request(env, retrying_instance)
    real = MongoCdcResource.oplog_window
    calls: list[int] = []

    def once_unreachable(self: MongoCdcResource, *args: Any, **kwargs: Any) -> OplogWindow:
        calls.append(1)
        if len(calls) == 1:
            raise AutoReconnect("primary stepped down")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MongoCdcResource, "oplog_window", once_unreachable)
    key = env.key("a", "slices")
    result = env.materialize(retrying_instance, [key], partition_key=request.partition_key, tags=request.tags)
    assert result.success
    assert len([e for e in result.all_events if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY]) == 1
    assert retrying_instance.get_materialized_partitions(key) == {request.partition_key}
    assert len(calls) == 2


def test_a_terminated_run_stops_instead_of_retrying_its_step(
        tmp_path: Path, mongo_uri: str, db: Database[Any], retrying_instance: DagsterInstance,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Dagster turns a run's termination into an interrupt of its step, which a RetryPolicy would run again in
    the terminated run (as a stop-snapshot signal's cancellation would be ignored): the step ends, once."""
    monkeypatch.setattr(cdc, "STEP_RETRY_POLICY", RetryPolicy(max_retries=3, delay=0))
    env = make_env(tmp_path, mongo_uri, db, ["a"])
    request = _schedule_request(env, retrying_instance)
    calls: list[int] = []

    def terminated(self: MongoCdcResource, *args: Any, **kwargs: Any) -> OplogWindow:
        calls.append(1)
        (run,) = retrying_instance.get_runs()
        retrying_instance.report_run_canceling(run)  # as the run launcher's terminate does, then interrupts
        raise DagsterExecutionInterruptedError("terminated")

    monkeypatch.setattr(MongoCdcResource, "oplog_window", terminated)
    result = env.materialize(retrying_instance, [env.key("a", "slices")], partition_key=request.partition_key,
                             tags=request.tags, raise_on_error=False)
    assert not result.success and len(calls) == 1
    assert [e for e in result.all_events if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY] == []


def _orders(tmp_path: Path, uri: str, db: Database[Any], translator: MongoCdcTranslator | None = None) -> CdcEnv:
    db.orders.insert_many([{"_id": i} for i in range(3)])
    return make_env(tmp_path, uri, db, ["orders"], translator=translator)


def _refresh_request(env: CdcEnv, instance: DagsterInstance) -> RunRequest:
    """The table automation's request once the snapshot of ``orders`` landed."""
    (sensor,) = [s for s in env.defs.sensors if s.name.endswith("_table_automation")]
    first = sensor.evaluate_tick(build_sensor_context(instance=instance, definitions=env.defs))
    env.materialize(instance, [env.key("orders", "snapshot")])
    tick = sensor.evaluate_tick(build_sensor_context(instance=instance, definitions=env.defs, cursor=first.cursor))
    (request,) = tick.run_requests or []
    return request


def test_a_table_refresh_whose_worker_was_killed_is_run_again_one_whose_step_failed_is_not(
        tmp_path: Path, mongo_uri: str, db: Database[Any], retrying_instance: DagsterInstance) -> None:
    """The soak's killed run worker was a first table refresh: the changelog committed, current_state never did,
    and only the failed-refresh back-off (up to five minutes) would have requested it again. The automation's
    refreshes carry the run-retry tags now; a refresh failed by its step (an unreadable landing file) is left
    to that back-off."""
    env = _orders(tmp_path, mongo_uri, db)
    request = _refresh_request(env, retrying_instance)
    assert set(request.asset_selection or ()) == {env.key("orders", "changelog"), env.key("orders", "current_state")}
    assert request.tags[MAX_RETRIES_TAG] == "2"
    assert request.tags[MAX_RUNTIME_SECONDS_TAG] == str(6 * 3600)  # a refresh whose worker vanished ends

    (landing,) = [Path(f) for f in env.mongocdc.landing_files(env.ns("orders"))]
    landing.write_bytes(landing.read_bytes()[:100])  # torn: the tables step fails
    result = env.materialize(retrying_instance, list(request.asset_selection or ()), tags=request.tags,
                             raise_on_error=False)
    assert not result.success
    run = retrying_instance.get_run_by_id(result.run_id)
    assert run is not None and run.tags[RUN_FAILURE_REASON_TAG] == RunFailureReason.STEP_FAILURE.value
    assert run.tags[WILL_RETRY_TAG] == "false"
    assert auto_reexecution_should_retry_run(retrying_instance, run, RunFailureReason.UNEXPECTED_TERMINATION)


def test_a_table_refresh_whose_worker_vanished_fails_at_its_maximum_run_time_and_is_run_again(
        tmp_path: Path, mongo_uri: str, db: Database[Any], retrying_instance: DagsterInstance) -> None:
    """A refresh whose worker died with the code server that launched it stays STARTED, holding the tables' pool:
    the automation's runs carry the translator's maximum run time, past which run monitoring fails the run, and the
    run retries start it again (the daemon's check, called here on a run started that long ago)."""

    class Brief(MongoCdcTranslator):
        table_run_max_runtime_seconds = 1

    env = _orders(tmp_path, mongo_uri, db, Brief())
    request = _refresh_request(env, retrying_instance)
    assert request.tags[MAX_RUNTIME_SECONDS_TAG] == "1"
    run = create_run_for_test(retrying_instance, job_name="__ASSET_JOB", tags=request.tags)
    retrying_instance.handle_new_event(  # the worker started it, then vanished without a word
        EventLogEntry(error_info=None, level="DEBUG", user_message="", run_id=run.run_id, timestamp=time.time() - 60,
                      dagster_event=DagsterEvent(DagsterEventType.RUN_START.value, job_name="__ASSET_JOB")))
    record = retrying_instance.get_run_record_by_id(run.run_id)
    assert record is not None and record.dagster_run.status == DagsterRunStatus.STARTED
    check_run_timeout(retrying_instance, record, logging.getLogger("test"), default_timeout_seconds=0)
    ended = retrying_instance.get_run_by_id(run.run_id)
    assert ended is not None and ended.status == DagsterRunStatus.FAILURE
    assert auto_reexecution_should_retry_run(retrying_instance, ended, RunFailureReason.UNEXPECTED_TERMINATION)
