"""End to end: a window left behind is landed again by the gap sensor, run by a real dagster-daemon.

A stack of its own (the shared one of test_e2e.py holds the UI test, which a third collection and these runs
slowed past its timeout in CI): the emulated replica set runs in this process with its cluster clock an hour
in the past, so the changes written into three one-minute windows are history at once; the daemon loads
``workspace.yaml`` (the project's MongoCdcComponent) with its schedules stopped as a user stops them, so that
every run here is the test's or the gap sensor's. The first and third windows land in runs of this process; the
second never does. The daemon's ``mongocdc_slice_gaps`` sensor requests it, the run the daemon launches lands
exactly the oplog's events of it, and ``no_gap_since_snapshot`` passes. Emulator only (the clock).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from dagster import AssetRecordsFilter, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteRepositoryOrigin
from dagster._core.scheduler.instigation import InstigatorState, InstigatorStatus, ScheduleInstigatorData
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from pymongo import MongoClient

from mongocdc_dagster import local_stack
from mongocdc_dagster.gaps import GAP, GAP_CHECK, TAG_REASON
from mongocdc_dagster.partitions import floor_to
from tests.dagster.cdc_helpers import CdcEnv, make_env
from tests.dagster.processes import stop, wait_for
from tests.dagster.time_travel import travelling_replica_set

pytestmark = [pytest.mark.slow, pytest.mark.daemon, pytest.mark.fault, pytest.mark.timeout(900)]

BIN = Path(sys.executable).parent
KEY_FMT = "%Y-%m-%d-%H:%M"
#: The code location workspace.yaml names, and its repository (a definitions object's).
LOCATION, REPOSITORY = "mongocdc", "__repository__"


@dataclass
class Stack:
    uri: str
    env: CdcEnv
    dagster_home: Path
    windows: list[datetime]
    logs: list[Path]

    def instance(self) -> DagsterInstance:
        return DagsterInstance.from_config(str(self.dagster_home))


def _stop_schedules(instance: DagsterInstance, env: CdcEnv) -> None:
    """Store every schedule of the code location as stopped, as the UI's toggle does, before the daemon starts:
    the latest-window schedule would land the windows of now (and the gap sensor then request the hour between)."""
    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="mongocdc_dagster.definitions",
                                                                attribute="defs"), location_name=LOCATION)
    repository = RemoteRepositoryOrigin(location, REPOSITORY)
    for schedule in env.defs.schedules or []:
        instance.add_instigator_state(InstigatorState(
            repository.get_instigator_origin(schedule.name), InstigatorType.SCHEDULE, InstigatorStatus.STOPPED,
            ScheduleInstigatorData(schedule.cron_schedule)))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if os.environ.get("MONGOCDC_TEST_MONGODB_URI"):
        pytest.skip("the end-to-end test travels the emulator's clock")
    tmp = tmp_path_factory.mktemp("e2e_repair")
    with travelling_replica_set(behind_s=3600) as (uri, clock):
        client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=10_000)
        db = client[f"repair_{uuid.uuid4().hex[:8]}"]
        first = floor_to(clock.now(), 60) + timedelta(minutes=1)
        clock.jump_to(first - timedelta(seconds=30))
        db.create_collection("signals")
        db.create_collection("items")
        windows = [first + timedelta(minutes=m) for m in range(3)]
        for minute, start in enumerate(windows):  # each window inserts, updates and (after the first) deletes
            clock.jump_to(start + timedelta(seconds=10))
            db.items.insert_many([{"_id": f"w{minute}-{i}", "n": i} for i in range(3)])
            db.items.update_one({"_id": f"w{minute}-0"}, {"$set": {"n": -1}})
            if minute:
                db.items.delete_one({"_id": f"w{minute - 1}-2"})
        clock.jump_to(datetime.now(UTC))  # from here on the cluster keeps real time
        env = make_env(tmp, uri, db, ["items"], start=windows[0].isoformat(), tables=False)
        dagster_home = local_stack.prepare_dagster_home(tmp / "dagster_home")
        with DagsterInstance.from_config(str(dagster_home)) as instance:
            _stop_schedules(instance, env)
        daemon_env = dict(os.environ, DAGSTER_HOME=str(dagster_home), MONGOCDC_CONFIG=str(env.mongocdc.config_path),
                          MONGOCDC_HOME=str(env.settings.home), MONGOCDC_SLICE_GRANULARITY="1min",
                          MONGOCDC_SLICE_START=windows[0].isoformat(), MONGOCDC_SENSOR_INTERVAL="5",
                          MONGOCDC_TABLES_ENABLED="false",
                          # run workers load the definitions before the launch returns: slow on a busy machine
                          DAGSTER_GRPC_TIMEOUT_SECONDS="300")
        logs = [tmp / "daemon.log"]
        with open(logs[0], "wb") as out:
            daemon = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
                                      cwd=local_stack.REPO_ROOT, env=daemon_env, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield Stack(uri, env, dagster_home, windows, logs)
        finally:
            stop(daemon)
            client.close()


def _repairs(instance: DagsterInstance) -> list[DagsterRun]:
    return list(instance.get_runs(filters=RunsFilter(tags={TAG_REASON: GAP})))


def test_a_window_left_behind_is_landed_again_by_the_gap_sensor_through_the_daemon(stack: Stack) -> None:
    """items' first and third windows land (runs of this process, while the daemon starts), its second does not
    (its run never happened); the daemon's gap sensor requests that window, the run the daemon launches lands
    exactly the oplog's events of it, and the no-gap check passes."""
    env, (first, hole, third) = stack.env, stack.windows
    slices = env.key("items", "slices")
    with stack.instance() as instance:
        for window in (first, third):
            assert env.materialize(instance, [slices], partition_key=window.strftime(KEY_FMT)).success

        def repaired() -> list[DagsterRun] | None:
            runs = _repairs(instance)
            failed = [run.run_id for run in runs if run.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)]
            assert not failed, f"the repair runs {failed} failed"
            return runs if runs and all(run.status == DagsterRunStatus.SUCCESS for run in runs) else None

        (repair,) = wait_for("the gap sensor's repair of items' second window", repaired, 600, stack.logs)
        assert repair.tags["dagster/partition"] == hole.strftime(KEY_FMT)
        assert repair.tags["dagster/sensor_name"] == "mongocdc_slice_gaps"
        assert repair.asset_selection == {slices}
        (landed,) = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=slices, asset_partitions=[hole.strftime(KEY_FMT)]), limit=5).records
        assert landed.run_id == repair.run_id  # landed by the repair alone
        (check,) = env.defs.resolve_job_def("mongocdc_continuity_checks").execute_in_process(
            instance=instance).get_asset_check_evaluations()
    assert (check.check_name, check.passed) == (GAP_CHECK, True), check.description
    facts = {k: check.metadata[k].value for k in ("verdict", "windows_landed", "lost_count", "missing_count",
                                                  "pending_count")}
    # every window missing now closed after the third (the schedule's, stopped here): none behind it
    assert facts == {"verdict": "landed", "windows_landed": 3, "lost_count": 0,
                     "missing_count": facts["pending_count"], "pending_count": facts["pending_count"]}
    end = hole + timedelta(minutes=1)
    with MongoClient(stack.uri, serverSelectionTimeoutMS=10_000) as client:  # the window's oplog entries for items
        source = sorted(
            (entry["ts"].time, entry["ts"].inc, {"i": "c", "u": "u", "d": "d"}[entry["op"]],
             (entry["o2"] if entry["op"] == "u" else entry["o"])["_id"])
            for entry in client.local["oplog.rs"].find({"ns": env.ns("items"), "op": {"$in": ["i", "u", "d"]}})
            if hole.timestamp() <= entry["ts"].time < end.timestamp())
    assert sorted(op for _, _, op, _ in source) == ["c", "c", "c", "d", "u"]
    path = env.settings.home / "landing" / "stream_slice" / env.ns("items") / (hole.strftime("%Y%m%dT%H%M%SZ") + ".parquet")
    rows = pq.read_table(path, columns=["pos_seconds", "pos_increment", "op", "key"]).to_pylist()
    landed_events = sorted((row["pos_seconds"], row["pos_increment"], row["op"], json.loads(json.loads(row["key"])["id"]))
                           for row in rows if row["op"] is not None)
    assert landed_events == source
    # and Debezium's tombstone after the delete, at its position
    assert [(r["pos_seconds"], r["pos_increment"]) for r in rows if r["op"] is None] == [
        (seconds, inc) for seconds, inc, op, _ in source if op == "d"]
