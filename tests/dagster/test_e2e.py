"""End to end: dagster-webserver and dagster-daemon as real processes against an emulator process.

One module-scoped stack (temporary DAGSTER_HOME, MONGOCDC_HOME, one-minute slices starting at the first
minute inside the oplog) serves every test here: a snapshot backfill launched through the webserver's
GraphQL API, a signal the daemon's sensor turns into a run, a schedule tick landing a stream slice, and
the asset graph page rendered by headless Chromium.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pyarrow.parquet as pq
import pytest
from bson import ObjectId, Timestamp
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from pymongo import MongoClient

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_dagster import local_stack
from mongocdc_dagster.partitions import COLLECTIONS_PARTITIONS_NAME
from mongocdc_devstack.fixture import EmulatedReplicaSet, free_port
from tests.dagster.cdc_helpers import write_config

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, logs: list[Path]) -> T:
    """Poll `probe` until it returns something truthy; on timeout fail with the process logs' tails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(1.0)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{tails}")


@dataclass
class Stack:
    uri: str
    db: str
    home: Path
    dagster_home: Path
    port: int
    config: Path
    slice_start: datetime
    logs: list[Path]

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


def _server_up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a process this test started, with the children it spawned (its own session)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("e2e")
    real = os.environ.get("MONGOCDC_TEST_MONGODB_URI")
    emulator = None if real else EmulatedReplicaSet(in_process=False, noop_interval=1.0).start()
    uri = real or emulator.uri  # type: ignore[union-attr]
    db = f"e2e_{uuid.uuid4().hex[:8]}"
    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    client[db].customers.insert_many([{"_id": i, "name": f"c{i}", "tier": i % 3} for i in range(30)])
    client[db].orders.insert_many([{"_id": i, "qty": i} for i in range(12)])
    client[db].create_collection("signals")
    config = write_config(tmp / "connector.json", uri, db)
    first = datetime.fromtimestamp(api.oplog_window(ConnectorConfig.load(config)).first.time, UTC)
    # one-minute windows from the first whole minute inside the oplog (and after now)
    slice_start = (max(first, datetime.now(UTC)) + timedelta(minutes=1)).replace(second=0, microsecond=0)
    dagster_home = tmp / "dagster_home"
    dagster_home.mkdir()
    shutil.copyfile(local_stack.DAGSTER_YAML, dagster_home / "dagster.yaml")
    # Create the SQLite storage once, here: the webserver and the daemon migrating a fresh home at the same
    # moment can leave two alembic heads behind.
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        instance.get_runs(limit=1)
        instance.all_instigator_state()
    port = free_port()
    env = dict(os.environ, DAGSTER_HOME=str(dagster_home), MONGOCDC_CONFIG=str(config),
               MONGOCDC_HOME=str(tmp / "home"), MONGOCDC_SLICE_GRANULARITY="1min",
               MONGOCDC_SLICE_START=slice_start.isoformat(), MONGOCDC_SENSOR_INTERVAL="5")
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
        stack = Stack(uri, db, tmp / "home", dagster_home, port, config, slice_start, logs)
        wait_for("the webserver", lambda: _server_up(port), 120, logs)
        yield stack
    finally:
        for process in processes:
            _stop(process)
        client.drop_database(db)
        client.close()
        if emulator is not None:
            emulator.stop()


def _succeeded(stack: Stack, runs: list[Any]) -> bool:
    failed = [r for r in runs if r.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)]
    assert not failed, f"runs failed: {[(r.run_id, r.tags) for r in failed]}"
    return bool(runs) and all(r.status == DagsterRunStatus.SUCCESS for r in runs)


def test_discovery_then_snapshot_backfill_through_graphql(stack: Stack) -> None:
    expected = [f"{stack.db}.customers", f"{stack.db}.orders"]

    def partitions() -> list[str] | None:
        with stack.instance() as instance:
            keys = sorted(instance.get_dynamic_partitions(COLLECTIONS_PARTITIONS_NAME))
        return keys if keys == expected else None

    wait_for("the discovery sensor to register the collections", partitions, 90, stack.logs)
    launched = stack.graphql(
        """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
             __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message stack }
             ... on PartitionKeysNotFoundError { message } ... on InvalidSubsetError { message } } }""",
        {"params": {"partitionNames": expected, "assetSelection": [{"path": ["mongocdc", "snapshot"]}]}},
    )["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill = launched["backfillId"]

    def done() -> bool:
        runs = stack.runs(**{"dagster/backfill": backfill})
        return len(runs) == 2 and _succeeded(stack, runs)

    wait_for("the backfill runs", done, 150, stack.logs)
    for ns, count in ((expected[0], 30), (expected[1], 12)):
        table = pq.read_table(stack.home / "landing" / "snapshot" / ns / "snapshot.parquet")
        assert table.num_rows == count and set(table["op"].to_pylist()) == {"r"}


def _signal_sensor_started(stack: Stack) -> bool:
    """The signal sensor has ticked once (it ignores signals older than its first tick)."""
    with stack.instance() as instance:
        return any(state.name == "mongocdc_signals" and getattr(state.instigator_data, "cursor", None)
                   for state in instance.all_instigator_state())


def test_signals_launch_a_filtered_blocking_and_an_incremental_snapshot(stack: Stack) -> None:
    wait_for("the signal sensor's first tick", lambda: _signal_sensor_started(stack), 60, stack.logs)
    blocking, incremental = ObjectId(), ObjectId()
    with stack.client() as client:
        client[stack.db].signals.insert_many([
            {"_id": blocking, "type": "execute-snapshot", "data": {
                "data-collections": [f"{stack.db}\\.cust.*"], "type": "blocking",
                "additional-conditions": [{"data-collection": f"{stack.db}.customers", "filter": '{"tier": 1}'}]}},
            {"_id": incremental, "type": "execute-snapshot", "data": {"data-collections": [f"{stack.db}.orders"]}},
        ])

    def finished() -> list[Any] | None:
        runs = [r for s in (blocking, incremental) for r in stack.runs(**{"mongocdc/signal_id": str(s)})]
        return runs if len(runs) == 2 and _succeeded(stack, runs) else None

    runs = wait_for("the signal sensor's runs", finished, 150, stack.logs)
    assert sorted((r.tags["mongocdc/collection"], r.tags["mongocdc/snapshot_type"]) for r in runs) == [
        (f"{stack.db}.customers", "blocking"), (f"{stack.db}.orders", "incremental")]
    files = list((stack.home / "landing" / "snapshot" / f"{stack.db}.customers").glob("filtered-*.parquet"))
    assert len(files) == 1 and pq.read_table(files[0]).num_rows == 10
    ops = pq.read_table(stack.home / "landing" / "incremental_snapshot" / f"{stack.db}.orders" / "snapshot.parquet",
                        columns=["op"])["op"].to_pylist()
    assert ops.count("r") == 12


def test_schedule_lands_the_closed_window(stack: Stack) -> None:
    now = datetime.now(UTC)
    window_start = max(now.replace(second=0, microsecond=0), stack.slice_start)
    if window_start <= now and (now - window_start).total_seconds() > 50:
        window_start += timedelta(minutes=1)  # too late in this window for the writes: use the next one
    if window_start > now:
        time.sleep((window_start - now).total_seconds() + 0.5)
    with stack.client() as client:
        orders = client[stack.db].orders
        orders.insert_many([{"_id": 100 + i, "qty": i} for i in range(7)])
        orders.update_one({"_id": 1}, {"$inc": {"qty": 5}})
        orders.delete_one({"_id": 2})
    assert datetime.now(UTC) < window_start + timedelta(minutes=1), "the writes spilled into the next window"
    window_key = window_start.strftime("%Y-%m-%d-%H:%M")
    partitions = [f"{stack.db}.{c}|{window_key}" for c in ("customers", "orders")]

    def landed() -> list[Any] | None:
        runs = [r for p in partitions for r in stack.runs(**{"dagster/partition": p})]
        return runs if len(runs) == 2 and _succeeded(stack, runs) else None

    runs = wait_for("the schedule's stream slice runs", landed, 170, stack.logs)
    assert all(r.tags.get("dagster/schedule_name") == "mongocdc_latest_window" for r in runs)
    path = stack.home / "landing" / "stream_slice" / f"{stack.db}.orders" / (
        window_start.strftime("%Y%m%dT%H%M%SZ") + ".parquet")
    ops = pq.read_table(path)["op"].to_pylist()
    assert (ops.count("c"), ops.count("u"), ops.count("d"), ops.count(None)) == (7, 1, 1, 1)
    start = Timestamp(int(window_start.timestamp()), 0)
    end = Timestamp(int(window_start.timestamp()) + 60, 0)

    class Discard:
        def write(self, records: Any) -> None: ...
        def flush(self, timeout: float | None = None) -> None: ...
        def close(self) -> None: ...

    again = api.stream_window(ConnectorConfig.load(stack.config), f"{stack.db}.orders", start, end, Discard())
    assert again.counts == {"c": 7, "u": 1, "d": 1}  # the engine, called directly, agrees with the run
    with stack.instance() as instance:
        every = list(instance.get_runs())
    assert every and all(r.status == DagsterRunStatus.SUCCESS for r in every), [(r.run_id, r.status) for r in every]


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="chromium is not installed (apt-get install -y chromium); required when CI is set")
def test_asset_graph_page_shows_the_cdc_assets(stack: Stack, tmp_path: Path) -> None:
    assert CHROMIUM is not None, "CI is set but chromium is missing: apt-get install -y chromium"
    url = f"http://127.0.0.1:{stack.port}/asset-groups"  # the global asset lineage graph

    def dom() -> str | None:
        result = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chrome'}", "--virtual-time-budget=20000", "--dump-dom", url],
            capture_output=True, timeout=120, check=False,
        )
        text = result.stdout.decode(errors="replace")
        return text if "stream_slice" in text and "snapshot" in text else None

    page = wait_for("the asset graph to render the CDC assets", dom, 100, stack.logs)
    assert "Global asset lineage" in page
