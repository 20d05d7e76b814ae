"""The driver of the standalone-cluster test (run as its own process: one SparkContext per process).

``python -m tests.tables.cluster_job <master> <landing> <out> <blocker dir> <bootstrap> <topic>`` builds
every collection of the landing zone (one folder per topic) under ``<out>/landing`` in one refresh cycle
(``refresh_collections``: several collections at once) and streams ``<topic>`` from Kafka into
``<out>/kafka``. The executors run Python with ``<blocker dir>`` on their path, whose ``sitecustomize``
makes mongocdc, pymongo, bson and orjson unimportable there: whatever the tables need on executors must
travel with the job. Spark's event log goes to ``<out>/events`` (uncompressed JSON lines), from which
the test reads which jobs ran when and which executors ran their tasks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import SparkSession

from mongocdc_core.tables import CollectionTables, landing_files, refresh_collections
from mongocdc_core.tables.session import spark_conf
from mongocdc_core.tables.streaming import StreamSettings, start_stream

BLOCKER = '''
import sys


class _NotOnExecutors:
    """Executors of the cluster test have no mongocdc (nor its dependencies) installed."""

    blocked = {"mongocdc_core", "mongocdc_dagster", "mongocdc_devstack", "tests", "bson", "pymongo", "orjson"}

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.blocked:
            raise ImportError(f"{name} is not installed on this executor")
        return None


sys.meta_path.insert(0, _NotOnExecutors())
'''


def collection_folders(landing: Path) -> list[Path]:
    """The landing folders of data topics (``<prefix>.<db>.<collection>``), not transaction metadata."""
    return [p for p in sorted(landing.iterdir()) if p.is_dir() and p.name.count(".") >= 2]


def session(master: str, blocker: str, events: str) -> SparkSession:
    builder = SparkSession.builder.master(master).appName("mongocdc-cluster-test")
    conf = spark_conf(local_tuning=False) | {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "768m",
        "spark.cores.max": "2",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": Path(events).resolve().as_uri(),
        "spark.eventLog.compress": "false",
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYTHONPATH": blocker,
        "spark.ui.enabled": "false",
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(master: str, landing: str, out: str, blocker: str, bootstrap: str, topic: str) -> None:
    Path(out, "events").mkdir(parents=True)
    spark = session(master, blocker, f"{out}/events")
    try:
        probe = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("importlib").util.find_spec("bson"))
        try:
            probe.collect()
            raise SystemExit("executors can import bson: the blocker is not in effect")
        except Exception as exc:  # noqa: BLE001 - the import must fail on the executor
            if "not installed on this executor" not in str(exc):
                raise
        work = [(CollectionTables.under(f"{out}/landing", folder.name.split(".", 1)[1]), landing_files([folder]))
                for folder in collection_folders(Path(landing))]  # fmt: skip
        failed = [done for done in refresh_collections(spark, work) if done.error is not None]
        if failed:
            raise SystemExit(f"refresh failed: {[(done.namespace, done.error) for done in failed]}")
        settings = StreamSettings(
            bootstrap_servers=bootstrap, topics=[topic], root=f"{out}/kafka",
            checkpoint_location=f"{out}/checkpoint", available_now=True,
        )
        query = start_stream(spark, settings)
        query.awaitTermination()
        if query.exception() is not None:
            raise SystemExit(f"stream failed: {query.exception()}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
