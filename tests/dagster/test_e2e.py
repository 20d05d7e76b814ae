"""End to end: dagster-webserver and dagster-daemon as real processes, per-collection assets.

One module-scoped stack serves every test here, in order: the emulated replica set runs in this process
with its cluster clock started an hour in the past (``time_travel``), so the orders written into three
one-minute windows are history the moment the stack starts; then the clock rejoins real time and the
webserver and daemon load ``workspace.yaml`` (the project's MongoCdcComponent). The tests backfill one
collection's slices through GraphQL (one run), materialise one collection end to end in one launch,
insert signals with ObjectId, string and integer ``_id``s (one run each), run the reconciliation headless
(``mongocdc check``) while a writer writes (it passes) and after corrupting a row (it fails), and screenshot
the asset graph with headless Chromium. Emulator only (the clock); against a real MongoDB it is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from bson import ObjectId
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    MetadataChangedException,
)
from delta.tables import DeltaTable
from pymongo import MongoClient
from pyspark.sql import functions as F

from mongocdc_core.tables import spark_session
from mongocdc_dagster import local_stack
from mongocdc_dagster.partitions import floor_to
from tests.dagster.cdc_helpers import write_config
from tests.dagster.processes import stop, wait_for
from tests.dagster.time_travel import travelling_replica_set

# One stack per module: every test runs on the same xdist worker, in order (the later ones build on the earlier;
# tests/conftest.py keeps a file's tests on one worker).
pytestmark = [pytest.mark.slow, pytest.mark.daemon, pytest.mark.fault, pytest.mark.timeout(2400)]

BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
KEY_FMT = "%Y-%m-%d-%H:%M"


@dataclass
class Stack:
    uri: str
    db: str
    home: Path
    dagster_home: Path
    port: int
    config: Path
    windows: list[datetime]
    logs: list[Path]
    env: dict[str, str]

    def instance(self) -> DagsterInstance:
        return DagsterInstance.from_config(str(self.dagster_home))

    def client(self) -> MongoClient[dict[str, Any]]:
        return MongoClient(self.uri, serverSelectionTimeoutMS=10_000)

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/graphql", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            data: dict[str, Any] = json.loads(reply.read())
        assert "errors" not in data, data
        return data["data"]

    def runs(self, **tags: str) -> list[Any]:
        with self.instance() as instance:
            return list(instance.get_runs(filters=RunsFilter(tags=tags)))

    def key(self, coll: str, kind: str) -> dict[str, list[str]]:
        return {"path": [self.db, coll, kind]}

    def stop_instigators(self) -> None:
        """Stop the schedules and the table automation (the sensors for signals, discovery and the oplog run)."""
        repo = {"repositoryLocationName": "mongocdc", "repositoryName": "__repository__"}
        sensors = self.graphql("""query($r: RepositorySelector!) { sensorsOrError(repositorySelector: $r) {
            ... on Sensors { results { name sensorState { id } } } } }""", {"r": repo})["sensorsOrError"]["results"]
        for sensor in sensors:
            if sensor["name"] == "mongocdc_table_automation":
                self.graphql("mutation($id: String) { stopSensor(id: $id) { __typename } }",
                             {"id": sensor["sensorState"]["id"]})
        schedules = self.graphql("""query($r: RepositorySelector!) { schedulesOrError(repositorySelector: $r) {
            ... on Schedules { results { name scheduleState { id } } } } }""", {"r": repo})["schedulesOrError"]["results"]
        for schedule in schedules:
            self.graphql("mutation($id: String) { stopRunningSchedule(id: $id) { __typename } }",
                         {"id": schedule["scheduleState"]["id"]})


def _server_up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if os.environ.get("MONGOCDC_TEST_MONGODB_URI"):
        pytest.skip("the end-to-end test travels the emulator's clock")
    tmp = tmp_path_factory.mktemp("e2e")
    with travelling_replica_set(behind_s=3600) as (uri, clock):
        db = f"e2e_{uuid.uuid4().hex[:8]}"
        client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=10_000)
        first = floor_to(clock.now(), 60) + timedelta(minutes=1)
        clock.jump_to(first - timedelta(seconds=30))
        client[db].customers.insert_many([{"_id": i, "name": f"c{i}", "tier": i % 3} for i in range(30)])
        client[db].orders.insert_many([{"_id": i, "qty": i} for i in range(12)])
        client[db].create_collection("signals")
        windows = [first + timedelta(minutes=m) for m in range(3)]
        for minute, start in enumerate(windows):  # history: orders changes in three closed windows
            clock.jump_to(start + timedelta(seconds=10))
            client[db].orders.insert_many([{"_id": 100 * (minute + 1) + i, "qty": i} for i in range(minute + 2)])
            client[db].orders.update_one({"_id": minute}, {"$inc": {"qty": 1000}})
        clock.jump_to(datetime.now(UTC))  # from here on the cluster keeps real time
        client[db].orders.update_one({"_id": 11}, {"$set": {"qty": -11}})
        config = write_config(tmp / "connector.json", uri, db)
        dagster_home = local_stack.prepare_dagster_home(tmp / "dagster_home")
        port = local_stack_port()
        env = dict(os.environ, DAGSTER_HOME=str(dagster_home), MONGOCDC_CONFIG=str(config),
                   MONGOCDC_HOME=str(tmp / "home"), MONGOCDC_SLICE_GRANULARITY="1min",
                   MONGOCDC_SLICE_START=windows[0].isoformat(), MONGOCDC_SENSOR_INTERVAL="5",
                   # run workers load the definitions before the launch returns: slow on a busy 2-core machine
                   DAGSTER_GRPC_TIMEOUT_SECONDS="300")
        logs = [tmp / "webserver.log", tmp / "daemon.log"]
        processes: list[subprocess.Popen[bytes]] = []
        try:
            for log, command in zip(logs, [
                [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
                [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
            ], strict=True):
                with open(log, "wb") as out:
                    processes.append(subprocess.Popen(command, cwd=local_stack.REPO_ROOT, env=env, stdout=out,
                                                      stderr=subprocess.STDOUT, start_new_session=True))
            stack = Stack(uri, db, tmp / "home", dagster_home, port, config, windows, logs, env)
            wait_for("the webserver", lambda: _server_up(port), 120, logs)
            # each test launches what it shows; the schedules and the table automation would add runs (and
            # Spark JVMs) every minute, and refresh tables a test changes by hand
            stack.stop_instigators()
            yield stack
        finally:
            for process in processes:
                stop(process)
            client.close()


def local_stack_port() -> int:
    from mongocdc_devstack.fixture import free_port

    return free_port("127.0.0.1")


def _succeeded(runs: list[Any]) -> bool:
    failed = [r for r in runs if r.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)]
    assert not failed, f"runs failed: {[(r.run_id, r.tags) for r in failed]}"
    return bool(runs) and all(r.status == DagsterRunStatus.SUCCESS for r in runs)


_LAUNCH_BACKFILL = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
    __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message stack }
    ... on PartitionKeysNotFoundError { message } ... on InvalidSubsetError { message } } }"""


def test_backfill_of_one_collections_slices_through_graphql_is_one_run(stack: Stack) -> None:
    keys = [w.strftime(KEY_FMT) for w in stack.windows]
    launched = stack.graphql(_LAUNCH_BACKFILL, {"params": {
        "partitionNames": keys, "assetSelection": [stack.key("orders", "slices")]}})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill = launched["backfillId"]
    runs = wait_for("the backfill's run", lambda: (r if _succeeded(r := stack.runs(**{"dagster/backfill": backfill}))
                                                    else None), 600, stack.logs)
    assert len(runs) == 1  # BackfillPolicy.single_run: three windows, one change stream
    for minute, start in enumerate(stack.windows):
        path = stack.home / "landing" / "stream_slice" / f"{stack.db}.orders" / (start.strftime("%Y%m%dT%H%M%SZ") + ".parquet")
        ops = pq.read_table(path)["op"].to_pylist()
        assert (ops.count("c"), ops.count("u")) == (minute + 2, 1)


def test_one_launch_materialises_a_collection_end_to_end(stack: Stack) -> None:
    selection = [stack.key("orders", k) for k in ("snapshot", "slices", "changelog", "current_state")]
    launched = stack.graphql(
        """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
             __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message stack }
             ... on InvalidSubsetError { message } ... on RunConfigValidationInvalid { errors { message } } } }""",
        {"params": {"selector": {"repositoryLocationName": "mongocdc", "repositoryName": "__repository__",
                                 "jobName": "__ASSET_JOB", "assetSelection": selection},
                    "executionMetadata": {"tags": [{"key": "dagster/partition",
                                                    "value": stack.windows[-1].strftime(KEY_FMT)}]}}},
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]

    def done() -> Any:
        with stack.instance() as instance:
            run = instance.get_run_by_id(run_id)
        return run if run is not None and _succeeded([run]) else None

    wait_for("snapshot -> slices -> changelog -> current_state in one run", done, 900, stack.logs)
    with stack.instance() as instance:  # the run's own events: automation materialises other windows meanwhile
        materialized = {
            entry.dagster_event.asset_key: entry.asset_materialization
            for entry in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
            if entry.dagster_event is not None
        }
    for kind in ("snapshot", "slices", "changelog", "current_state"):
        assert _asset_key(stack, "orders", kind) in materialized, kind
    state = materialized[_asset_key(stack, "orders", "current_state")]
    assert state is not None and state.metadata["dagster/row_count"].value == 12 + 2 + 3 + 4


def _asset_key(stack: Stack, coll: str, kind: str) -> Any:
    from dagster import AssetKey

    return AssetKey([stack.db, coll, kind])


def _materialized(stack: Stack, coll: str, kind: str) -> bool:
    with stack.instance() as instance:
        return instance.get_latest_materialization_event(_asset_key(stack, coll, kind)) is not None


def _signal_sensor_started(stack: Stack) -> bool:
    """The signal sensor has ticked once (it ignores signals sent before its first tick)."""
    with stack.instance() as instance:
        return any(state.name == "mongocdc_signals" and getattr(state.instigator_data, "cursor", None)
                   for state in instance.all_instigator_state())


def _sensor_ticks(stack: Stack) -> int:
    with stack.instance() as instance:
        states = [s for s in instance.all_instigator_state() if s.name == "mongocdc_signals"]
        return len(instance.get_ticks(states[0].instigator_origin_id, states[0].selector_id, limit=1000))


def test_signals_with_objectid_string_and_integer_ids_each_launch_exactly_one_run(stack: Stack) -> None:
    wait_for("the signal sensor's first tick", lambda: _signal_sensor_started(stack), 60, stack.logs)
    ids: list[Any] = [ObjectId(), "string-signal", 42]
    with stack.client() as client:
        for signal_id in ids:  # in _id order the string and the integer sort before the ObjectId
            client[stack.db].signals.insert_one({"_id": signal_id, "type": "execute-snapshot", "data": {
                "data-collections": [f"{stack.db}.customers"], "type": "blocking"}})
    tags = [str(ids[0]), "string-signal", "42"]

    def finished() -> list[Any] | None:
        runs = [r for t in tags for r in stack.runs(**{"mongocdc/signal_id": t})]
        return runs if len(runs) == 3 and _succeeded(runs) else None

    runs = wait_for("one run per signal", finished, 900, stack.logs)
    ticks = _sensor_ticks(stack)
    wait_for("two more signal sensor ticks", lambda: _sensor_ticks(stack) >= ticks + 2, 300, stack.logs)
    assert sorted(len(stack.runs(**{"mongocdc/signal_id": t})) for t in tags) == [1, 1, 1]
    assert len({r.tags["mongocdc/signal_position"] for r in runs}) == 3


def _check(stack: Stack) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "mongocdc"), "check", "--collection", f"{stack.db}.orders"],
                          cwd=local_stack.REPO_ROOT, env=stack.env, capture_output=True, text=True, timeout=600,
                          check=False)


def test_reconciliation_passes_while_a_writer_writes_and_fails_on_a_corrupted_row(stack: Stack) -> None:
    wait_for("orders' current_state", lambda: _materialized(stack, "orders", "current_state"), 300, stack.logs)
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        with stack.client() as client:
            while not stop.is_set():
                n = written[0]
                client[stack.db].orders.insert_one({"_id": 10_000 + n, "qty": n})
                client[stack.db].orders.update_one({"_id": 10_000 + n // 2}, {"$inc": {"qty": 1}})
                written[0] += 1
                time.sleep(0.02)

    thread = threading.Thread(target=writer, name="writer")
    thread.start()
    try:
        passing = _check(stack)
    finally:
        stop.set()
        thread.join()
    assert written[0] > 10, "the writer did not write during the check"
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert f"PASS  {stack.db}/orders/current_state  matches_source  blocking" in passing.stdout

    table = str(stack.home / "tables" / f"{stack.db}__orders__current")
    for attempt in range(10):  # as a user's repair would: a refresh the automation started may commit first
        try:
            DeltaTable.forPath(spark_session("local[2]"), table).update(
                F.col("_id") == "5", {"__doc": F.parse_json(F.lit('{"_id": 5}'))}
            )
            break
        except (ConcurrentAppendException, ConcurrentDeleteReadException, MetadataChangedException):
            assert attempt < 9, "ten refreshes in a row committed before the corruption"
            time.sleep(2)
    failing = _check(stack)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    line = next(x for x in failing.stdout.splitlines() if x.startswith("FAIL"))
    assert f"{stack.db}/orders/current_state  matches_source  blocking" in line and "DIFFERS" in line


def _headless(flags: list[str], timeout: float) -> bytes | None:
    """One headless Chromium call in its own process group; None when it outlives `timeout`.

    Under a loaded CI machine a render of the Dagster UI sometimes never settles; the launcher's
    renderer and GPU children would keep the pipes open, so the whole group is killed and the caller retries.
    """
    process = subprocess.Popen(flags, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = process.communicate(timeout=timeout)
        return out
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return None


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="chromium is not installed (apt-get install -y chromium); required when CI is set")
def test_asset_graph_shows_each_collections_assets(stack: Stack, tmp_path: Path) -> None:
    assert CHROMIUM is not None, "CI is set but chromium is missing: apt-get install -y chromium"
    url = f"http://127.0.0.1:{stack.port}/asset-groups"  # the global asset lineage graph
    shot = tmp_path / "asset-graph.png"
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--window-size=1600,1000", f"--user-data-dir={tmp_path / 'chrome'}", "--virtual-time-budget=20000"]
    kinds = ("snapshot", "slices", "current_state")

    def dom() -> str | None:
        text = (_headless([*flags, "--dump-dom", url], 90) or b"").decode(errors="replace")
        shown = all(f"{stack.db}/{c}/{k}" in text or json.dumps([stack.db, c, k]) in text
                    for c in ("orders", "customers") for k in kinds)
        return text if shown else None

    def screenshot() -> bool:
        shot.unlink(missing_ok=True)
        _headless([*flags, f"--screenshot={shot}", url], 90)
        return shot.exists() and shot.stat().st_size > 10_000

    page = wait_for("the asset graph to render each collection's assets", dom, 300, stack.logs)
    assert "Global asset lineage" in page
    wait_for("a screenshot of the asset graph", screenshot, 300, stack.logs)
    shutil.copyfile(shot, stack.home.parent / "asset-graph.png")
