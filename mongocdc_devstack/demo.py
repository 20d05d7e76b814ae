"""``make demo``: the main job on the local stack, end to end, with a proof at the end.

It starts the emulated replica set, seeds the inventory data set, runs the connector through its
snapshot and then streaming while a scripted workload changes the data (inserts, updates,
replaces, deletes and transactions), prints what each topic received, and replays the records to
show they rebuild exactly the documents now in the source. Finally Spark turns the Parquet landing
zone into each collection's changelog and current_state Delta tables, prints them, and reconciles
every current_state with its collection at the table's position.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from pymongo import MongoClient
from rich.console import Console
from rich.table import Table

from mongocdc_core.api import current_cluster_time
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine
from mongocdc_core.logs import command_logging
from mongocdc_core.offsets import FileOffsetStore
from mongocdc_core.replay import Replayer, differences
from mongocdc_core.run_command import progress_listener
from mongocdc_core.sinks.jsonl import JsonlSink
from mongocdc_core.sinks.parquet import ParquetSink
from mongocdc_core.sinks.tee import TeeSink
from mongocdc_devstack import inventory
from mongocdc_devstack.fixture import EmulatedReplicaSet

REPO = Path(__file__).resolve().parent.parent
TOPIC_PREFIX = "demo"


def connector_config(uri: str) -> dict[str, Any]:
    """The demo's connector, in Debezium's JSON form (also written next to the output)."""
    return {
        "name": "inventory-connector",
        "config": {
            "connector.class": "io.debezium.connector.mongodb.MongoDbConnector",
            "mongodb.connection.string": uri,
            "topic.prefix": TOPIC_PREFIX,
            "collection.include.list": r"inventory\..*",
            "provide.transaction.metadata": "true",
            "offset.flush.interval.ms": "1000",
        },
    }


def _topic_table(out: Path) -> tuple[Table, list[tuple[Any, Any]]]:
    """Per-topic record counts by operation, and every data record for the replay."""
    table = Table(title="records per topic")
    for column in ("topic", "records", "r", "c", "u", "d", "tombstones", "other"):
        table.add_column(column, justify="right" if column != "topic" else "left")
    data: list[tuple[Any, Any]] = []
    for path in sorted(out.glob("*.jsonl")):
        ops: Counter[str] = Counter()
        for line in path.read_bytes().splitlines():
            record = orjson.loads(line)
            value = record["value"]
            payload = value.get("payload", value) if isinstance(value, dict) else None
            if payload is None:
                ops["tombstones"] += 1
            elif "op" in payload:
                ops[payload["op"]] += 1
                data.append((record["key"], value))
            else:
                ops["other"] += 1
        table.add_row(path.stem, str(sum(ops.values())), *(str(ops[k]) for k in ("r", "c", "u", "d", "tombstones", "other")))
    return table, data


def _tables(console: Console, cfg: ConnectorConfig, landing: Path, root: Path) -> list[str]:
    """Build each collection's Delta tables from the landing zone, print them, and reconcile them with
    the source at the tables' position."""
    from mongocdc_core.tables import (
        CollectionTables,
        landing_files,
        print_tables,
        reconcile_at_position,
        refresh_changelog,
        refresh_current_state,
        spark_session,
    )
    from mongocdc_core.tables.session import ENV_SPARK_LOG

    console.rule("tables (PySpark + Delta Lake, one changelog and one current_state per collection)")
    # Spark's start-up warnings and its own log lines go to a file, not between the demo's lines
    spark_log = os.environ.setdefault(ENV_SPARK_LOG, str(root.parent / "spark.log"))
    console.print(f"Spark's own log: {spark_log}")
    spark = spark_session()
    try:
        tables = [CollectionTables.under(str(root), f"{inventory.DATABASE}.{name}") for name in inventory.COLLECTIONS]
        for t in tables:
            refresh_changelog(spark, t, landing_files([landing / f"{TOPIC_PREFIX}.{t.namespace}"]))
            refreshed = refresh_current_state(spark, t)
            console.print(f"{t.namespace}: {refreshed.row_count} rows at position {refreshed.position}")
        print_tables(spark, tables, limit=5, console=console)
        results = [reconcile_at_position(spark, t, cfg) for t in tables]
    finally:
        spark.stop()
    for item in results:
        colour = "green" if item.passed else "red"
        console.print(
            f"reconciliation {item.namespace} at {item.position} ({item.method}): table {item.table_rows} rows, "
            f"source {item.source_rows}: [{colour}]{item.summary()}[/{colour}]"
        )
    if all(item.passed for item in results):
        console.print("[bold green]each current_state equals its collection at the table's position[/bold green]")
        return []
    return [f"current_state of {r.namespace} differs at {key}" for r in results for key in r.mismatching_keys[:10]] + [
        f"current_state of {r.namespace}: {r.summary()}" for r in results if r.matches and not r.verified]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mongocdc demo", description=__doc__.splitlines()[0])
    parser.add_argument("--home", default=str(REPO / ".local" / "demo"), help="where the demo keeps its files")
    parser.add_argument("--steps", type=int, default=300, help="workload operations")
    parser.add_argument("--no-tables", action="store_true", help="skip the Spark tables and their reconciliation")
    args = parser.parse_args(argv)
    console = Console()
    # The run's warnings and progress on stderr: bars on a terminal, one line per event elsewhere.
    errors = Console(stderr=True)
    fmt, _ = command_logging("mongocdc demo", None, "WARNING", errors)
    logging.getLogger("mongocdc.progress").setLevel(logging.INFO)
    home = Path(args.home)
    shutil.rmtree(home, ignore_errors=True)
    out = home / "out"
    (home / "mongo").mkdir(parents=True)

    with EmulatedReplicaSet(in_process=False, dbpath=str(home / "mongo"), noop_interval=1.0) as rs:
        console.rule("mongocdc demo")
        console.print(f"emulated replica set (development stand-in for MongoDB 7.0) at {rs.uri}")
        client: MongoClient[Any] = MongoClient(rs.uri)
        sizes = inventory.seed(client)
        console.print(f"seeded {inventory.DATABASE}: {sizes}")
        config = connector_config(rs.uri)
        (home / "connector.json").write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))
        cfg = ConnectorConfig.from_dict(config)

        workload: dict[str, int] = {}

        def drive() -> None:
            time.sleep(0.5)  # let the snapshot begin: changes then land during and after it
            workload.update(inventory.run_workload(MongoClient(rs.uri), steps=args.steps, pause=lambda: time.sleep(0.005)))

        worker = threading.Thread(target=drive, name="workload")
        landing = home / "landing"
        sink = TeeSink([JsonlSink(out), ParquetSink(landing)])
        offsets = FileOffsetStore(home / "offsets.json")
        with progress_listener(errors, fmt) as progress:
            # Capture runs while the workload writes; once it is done, the run stops and a second one
            # resumes from the stored offsets up to a cluster time taken after the last write, so the
            # records hold every write by position, not by waiting for quiet.
            during = Engine(cfg, sink, offsets, progress=progress)
            failed: list[BaseException] = []

            def capture_while_writing() -> None:
                try:
                    during.run()
                except BaseException as exc:  # re-raised below, in the demo's own thread
                    failed.append(exc)

            capture = threading.Thread(target=capture_while_writing, name="capture")
            worker.start()
            capture.start()
            worker.join()
            stop_at = current_cluster_time(cfg)
            during.stop()
            capture.join()
            if failed:
                raise failed[0]
            engine = Engine(cfg, sink, offsets, progress=progress)
            summary = engine.run(stop_at=stop_at)
        sink.close()
        offsets.close()
        console.print(during.metrics.summary())
        console.print(engine.metrics.summary())
        console.print(f"workload: {workload}; captured up to cluster time {stop_at.time}:{stop_at.inc}, after its last write")

        table, records = _topic_table(out)
        console.print(table)
        replay = Replayer().apply_all(records)
        problems: list[str] = []
        for name in inventory.COLLECTIONS:
            source = list(client[inventory.DATABASE][name].find())
            rebuilt = replay.documents(f"{inventory.DATABASE}.{name}")
            diff = differences(source, rebuilt)
            state = "[green]identical[/green]" if not diff else "[red]DIFFERENT[/red]"
            console.print(f"replay of {inventory.DATABASE}.{name}: {len(rebuilt)} documents, source {len(source)}: {state}")
            problems += diff
        if not args.no_tables:
            problems += _tables(console, cfg, landing, home / "tables")
        client.close()
    console.print(f"records written to {out} (stopped: {summary.stopped_because})")
    if problems:
        console.print("\n".join(problems))
        return 1
    console.print("[bold green]replaying the change events rebuilds exactly the source collections[/bold green]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
