"""The demo's tables built on a Spark standalone cluster (a master and two workers on loopback) equal local mode.

The cluster's executors have no mongocdc installed (see ``cluster_job.py``); the Kafka -> Structured
Streaming path runs there too, against the real broker, and builds the same tables as the landing zone.
The refresh cycle's collections refresh concurrently on the cluster, shown by Spark's event log (facts,
not timings): a Spark job of one collection starts while another collection's job runs, and their tasks
run on the executors of both workers.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest
from bson.timestamp import Timestamp
from confluent_kafka import Producer
from pymongo import MongoClient
from pymongo.database import Database
from pyspark.sql import SparkSession

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.sinks.kafka import POSITION_HEADER
from mongocdc_core.sinks.parquet import ParquetSink
from mongocdc_core.tables import (
    CollectionTables,
    landing_files,
    read_current_state,
    refresh_changelog,
    refresh_current_state,
)
from mongocdc_devstack import inventory

from .cluster_job import BLOCKER, collection_folders
from .support import comparable
from .workload import Workload, converter, slice_records, snapshot_records, write_landing

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
_STARTUP_S = 300


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(log: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _STARTUP_S
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            raise AssertionError(f"{log.name} exited with {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"{log.name}: no {text!r} within {_STARTUP_S}s:\n{log.read_text(errors='replace')[-3000:]}")


@dataclass(frozen=True)
class Cluster:
    master: str
    #: the web UI port of each worker (its executors' log URLs point there: which worker ran an executor)
    worker_ports: tuple[int, ...]


@contextmanager
def standalone_cluster(home: Path, workers: int = 2) -> Iterator[Cluster]:
    """A master and ``workers`` workers of one core each, started with ``spark-class`` on 127.0.0.1."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    env = os.environ | {"SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "512m"}
    spark_class = str(spark_home / "bin" / "spark-class")
    port = _port()
    master_url = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        master_log = home / "master.log"
        master = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(_port())],
            stdout=master_log.open("wb"), stderr=subprocess.STDOUT, env=env,
        )
        processes.append(master)
        _wait_for(master_log, "I have been elected leader", master)
        ports = tuple(_port() for _ in range(workers))
        for n, ui_port in enumerate(ports):
            worker_log = home / f"worker-{n}.log"
            worker = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                 "--memory", "1g", "--webui-port", str(ui_port), "--work-dir", str(home / f"work-{n}"), master_url],
                stdout=worker_log.open("wb"), stderr=subprocess.STDOUT, env=env,
            )
            processes.append(worker)
            _wait_for(worker_log, "Successfully registered with master", worker)
        yield Cluster(master_url, ports)
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class _Job:
    collection: str
    pool: str | None
    overlapped: set[str]  # collections whose jobs started while this one ran


def _cycle_facts(events_dir: Path, collections: set[str]) -> tuple[dict[int, _Job], dict[str, int]]:
    """From the application's event log: the Spark jobs of the refresh cycle (run in a ``mongocdc-<n>``
    scheduler pool; the job group's description names the collection: ``changelog of <ns>``,
    ``current_state of <ns>``), each with the collections
    whose jobs started while it ran (in the log's order: the scheduler posts job starts and ends in the
    order they happen), and the number of those jobs' tasks per worker (an executor's log URL names its
    worker's web UI port)."""
    # Spark 4's event log: a folder per application, its events in numbered files
    files = sorted(events_dir.glob("eventlog_v2_*/events_*"), key=lambda p: int(p.name.split("_")[1]))
    assert files, f"no event log under {events_dir}"
    jobs: dict[int, _Job] = {}
    running: set[int] = set()
    stage_job: dict[int, int] = {}
    executor_port: dict[str, int] = {}
    tasks: dict[str, int] = {}
    for line in (line for path in files for line in path.read_text().splitlines()):
        event = json.loads(line)
        kind = event["Event"]
        if kind == "SparkListenerExecutorAdded":
            url = event["Executor Info"]["Log Urls"]["stdout"]
            executor_port[event["Executor ID"]] = int(urlparse(url).port or 0)
        elif kind == "SparkListenerJobStart":
            properties = event.get("Properties") or {}
            described, pool = properties.get("spark.job.description") or "", properties.get("spark.scheduler.pool")
            collection = described.split(" of ", 1)[1] if " of " in described else ""
            if collection not in collections or not (pool or "").startswith("mongocdc-"):
                continue  # not a job of the cycle (the Kafka stream's single collection runs in no pool)
            job = _Job(collection, pool, set())
            for other in running:
                jobs[other].overlapped.add(collection)
                job.overlapped.add(jobs[other].collection)
            jobs[event["Job ID"]] = job
            running.add(event["Job ID"])
            stage_job |= {stage: event["Job ID"] for stage in event["Stage IDs"]}
        elif kind == "SparkListenerJobEnd":
            running.discard(event["Job ID"])
        elif kind == "SparkListenerTaskEnd" and event["Stage ID"] in stage_job:
            port = str(executor_port[event["Task Info"]["Executor ID"]])
            tasks[port] = tasks.get(port, 0) + 1
    return jobs, tasks


def _demo_landing(uri: str, database: str, landing: Path) -> None:
    """The demo's data and workload through the connector into a landing zone (one folder per topic)."""
    client: MongoClient = MongoClient(uri)
    inventory.seed(client, customers=30, products=20, orders=40, database=database)
    cfg = ConnectorConfig.from_dict({
        "mongodb.connection.string": uri, "topic.prefix": "demo", "database.include.list": database,
        "provide.transaction.metadata": "true",
    })
    t0 = api.current_cluster_time(cfg)
    for name in inventory.COLLECTIONS:
        sink = ParquetSink(landing)
        api.snapshot_collection(cfg, f"{database}.{name}", sink)
        sink.close()
    inventory.run_workload(client, steps=40, database=database)
    now = api.current_cluster_time(cfg)
    sink = ParquetSink(landing)
    api.stream_window(cfg, None, t0, Timestamp(now.time, now.inc + 1), sink)
    sink.close()
    client.close()


def test_tables_on_a_standalone_cluster_equal_local_mode(
    spark: SparkSession, tmp_path: Path, mongo_uri: str, fresh_db: Database, kafka_bootstrap: str
) -> None:
    landing = tmp_path / "landing"
    _demo_landing(mongo_uri, fresh_db.name, landing)
    # a collection captured without full documents: its updates are folded by the one Python function
    wl = Workload(random.Random(9), collections=("orders",), full_document=False)
    conv = converter("change_streams")
    wl.run(5)
    start = len(wl.events)
    wl.run(30)
    write_landing(landing / "dbz.shop.orders" / "a.parquet",
                  snapshot_records(conv, wl, "orders") + slice_records(conv, wl.events[start:]))

    # the Kafka path: the customers' landing rows as Kafka records, with their position header
    topic = f"demo.{fresh_db.name}.customers"
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for path in landing_files([landing / topic]):
        for row in pq.read_table(path, columns=["key", "value", "position"]).to_pylist():
            producer.produce(topic, key=row["key"], value=row["value"],
                             headers=[(POSITION_HEADER, row["position"].encode())])
    assert producer.flush(60) == 0

    local = tmp_path / "local"
    for folder in collection_folders(landing):
        tables = CollectionTables.under(str(local), folder.name.split(".", 1)[1])
        refresh_changelog(spark, tables, landing_files([folder]))
        refresh_current_state(spark, tables)

    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    out = tmp_path / "cluster"
    with standalone_cluster(tmp_path, workers=2) as cluster:
        done = subprocess.run(
            [sys.executable, "-m", "tests.tables.cluster_job", cluster.master, str(landing), str(out), str(blocker),
             kafka_bootstrap, topic],
            cwd=REPO, capture_output=True, text=True, timeout=3000,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]

    compared = 0
    for folder in collection_folders(landing):
        namespace = folder.name.split(".", 1)[1]
        expected = comparable(read_current_state(spark, CollectionTables.under(str(local), namespace).current_state))
        built = comparable(read_current_state(spark, CollectionTables.under(str(out / "landing"), namespace).current_state))
        assert built == expected, namespace
        assert expected
        compared += 1
    assert compared == 4

    # the cycle's collections refreshed concurrently, on both workers
    namespaces = {folder.name.split(".", 1)[1] for folder in collection_folders(landing)}
    jobs, tasks_per_worker = _cycle_facts(out / "events", namespaces)
    assert {job.collection for job in jobs.values()} == namespaces  # every collection's jobs are in the log
    overlapping = {job.collection for job in jobs.values() if job.overlapped - {job.collection}}
    assert len(overlapping) >= 2, "no Spark job of one collection started while another collection's job ran"
    assert len({job.pool for job in jobs.values()}) > 1  # each collection at once in a scheduler pool of its own
    assert set(tasks_per_worker) == {str(port) for port in cluster.worker_ports}, tasks_per_worker
    customers = CollectionTables.under(str(out / "kafka"), f"{fresh_db.name}.customers")
    local_customers = CollectionTables.under(str(local), f"{fresh_db.name}.customers")
    assert comparable(read_current_state(spark, customers.current_state)) == comparable(
        read_current_state(spark, local_customers.current_state)
    )

